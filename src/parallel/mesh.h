/* mesh.h - the process mesh: how the world's ranks split into tensor (tp), context (cp), data
 * (dp) and pipeline (pp) parallel groups, with expert parallelism (ep) folded into data
 * parallelism as Megatron-Core does. The planner models the same layout (plan/plan.h
 * dt_plan_layout: gpus = dp tp pp cp, ep divides dp).
 *
 * Rank order: tp fastest, then cp, then dp, then pp:
 *
 *   rank = t + tp (c + cp (d + dp p))        t < tp, c < cp, d < dp, p < pp
 *
 * so a TP group is tp consecutive ranks (inside a node whenever tp divides the ranks per node:
 * its all-reduces, on the critical path of every layer, stay on the fastest link), a CP group
 * is the next level out, and the data-parallel replicas of a pipeline stage are strided by
 * tp cp. An EP group is ep consecutive dp indices (same t, c, p): the ranks that split one
 * layer's experts between them; the expert-data-parallel group (EDP) is the ranks with the same
 * t, c, p and the same d mod ep: the ranks that hold the same experts. The DP×CP group (same t
 * and p) is the one dense gradients are reduced over once context parallelism splits the
 * sequence.
 *
 * A mesh is a pure value: no communication (comm.h dt_comm_group_split turns its member lists
 * into groups). With tp = cp = pp = ep = 1 every rank is its own TP/CP/PP/EP group and the DP
 * group is the world, in world order.
 *
 *   dt_mesh m; DT_CHECK(dt_mesh_init(ctx, &m, world, rank, tp, cp, pp, ep));
 *   int ranks[DT_MESH_MAX]; int n = dt_mesh_group(&m, DT_MESH_TP, ranks);
 */
#ifndef DT_MESH_H
#define DT_MESH_H

#include "core/status.h"

/* The mesh's axes, fastest first (the coordinates of a rank). */
typedef enum dt_mesh_axis { DT_AXIS_TP, DT_AXIS_CP, DT_AXIS_DP, DT_AXIS_PP, DT_AXIS_N } dt_mesh_axis;

/* The groups a rank belongs to. */
typedef enum dt_mesh_group_kind {
    DT_MESH_TP,   /* same c, d, p */
    DT_MESH_CP,   /* same t, d, p */
    DT_MESH_DP,   /* same t, c, p */
    DT_MESH_PP,   /* same t, c, d */
    DT_MESH_EP,   /* same t, c, p and d / ep */
    DT_MESH_EDP,  /* same t, c, p and d % ep */
    DT_MESH_DPCP, /* same t, p */
    DT_MESH_NGROUPS
} dt_mesh_group_kind;

/* The most ranks a mesh holds (member lists are sized by the caller with the group's size). */
#define DT_MESH_MAX_WORLD (1 << 20)

typedef struct dt_mesh {
    int world, rank;
    int size[DT_AXIS_N];  /* tp, cp, dp, pp */
    int ep;               /* divides size[DT_AXIS_DP] */
    int coord[DT_AXIS_N]; /* this rank's t, c, d, p */
} dt_mesh;

/* Builds the mesh of `world` ranks seen from `rank`: dp = world / (tp cp pp). Fails (one line
 * naming the keys parallel.tp / cp / pp / ep and their values) when a degree is < 1, when
 * tp cp pp does not divide world, or when ep does not divide dp. */
dt_status dt_mesh_init(dt_ctx *ctx, dt_mesh *m, int world, int rank, int tp, int cp, int pp, int ep);
/* Whether the mesh is plain data parallelism (tp = cp = pp = ep = 1). */
int dt_mesh_is_dp_only(const dt_mesh *m);
/* The coordinates of any rank, and the rank at coordinates. */
void dt_mesh_coords(const dt_mesh *m, int rank, int coord[DT_AXIS_N]);
int dt_mesh_rank_at(const dt_mesh *m, const int coord[DT_AXIS_N]);
/* The size of this rank's group of a kind, and its index in it. */
int dt_mesh_group_size(const dt_mesh *m, dt_mesh_group_kind k);
int dt_mesh_group_rank(const dt_mesh *m, dt_mesh_group_kind k);
/* The world ranks of this rank's group of kind k, ascending (= group-rank order), into ranks
 * (dt_mesh_group_size entries); returns their number. */
int dt_mesh_group(const dt_mesh *m, dt_mesh_group_kind k, int *ranks);
/* Hybrid sharding over the data-parallel group (parallel.hybrid under a process mesh): given
 * node[r], the node of every world rank r (any id, equal for ranks that share a node), the
 * shard group is the ranks of this rank's DP group on its node, and the replica group the ranks
 * of its DP group at the same position in their node's part of it (one per node); both
 * ascending (= group-rank order), each list the same on all its members, so every TP position's
 * groups together partition the world (comm.h dt_comm_group_split). Returns 0, or -1 when the
 * nodes hold different numbers of this DP group's ranks (hybrid needs equal ones). */
int dt_mesh_hybrid(const dt_mesh *m, const int *node, int *shard, int *shard_n, int *cross, int *cross_n);
/* "tp", "cp", "dp", "pp", "ep", "edp", "dpcp". */
const char *dt_mesh_group_name(dt_mesh_group_kind k);

#endif
