/* The trainer's process-mesh groups (trainer_impl.h dt_trainer_mesh_groups): tensor, data,
 * context, expert, pipeline and model-parallel groups split from the mesh, and hybrid
 * sharding's groups. */
#include <stdlib.h>
#include <string.h>

#include "parallel/mesh.h"
#include "train/trainer_impl.h"

/* Hybrid sharding over the data-parallel ranks (parallel/mesh.h dt_mesh_hybrid): every rank
 * learns every rank's node (the lowest world rank on it), checks that each DP group spreads
 * evenly over its nodes, the same on all (one verdict for the world, so no rank splits alone),
 * and splits its node's part of its DP group and its place's replicas across nodes. */
static dt_status hybrid_groups(dt_ctx *ctx, dt_trainer *tr, const dt_mesh *mesh, dt_parallel_cfg *pc) {
    dt_comm *comm = tr->comm;
    const int W = mesh->world;
    int64_t mine = mesh->rank, v[3];
    int64_t *all = malloc((size_t)W * sizeof *all);
    int *node = malloc((size_t)W * 3 * sizeof *node);
    if (!all || !node) {
        free(all), free(node);
        return dt_fail(ctx, DT_ERR_NOMEM, "mesh: out of memory");
    }
    int *shard = node + W, *cross = node + 2 * (size_t)W, ns = 0, nc = 0;
    dt_status st = dt_comm_allreduce(ctx, comm, DT_GROUP_NODE, &mine, 1, DT_I64, DT_MIN);
    if (st == DT_OK) st = dt_comm_allgather_words(ctx, comm, DT_GROUP_WORLD, &mine, 1, all);
    for (int r = 0; r < W && st == DT_OK; r++) node[r] = (int)all[r];
    int bad = st == DT_OK ? dt_mesh_hybrid(mesh, node, shard, &ns, cross, &nc) : -1;
    v[0] = bad ? 1 : 0, v[1] = ns, v[2] = -(int64_t)ns; /* any failure; the largest and smallest shard group */
    if (st == DT_OK) st = dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, v, 3, DT_I64, DT_MAX);
    if (st == DT_OK && (v[0] || v[1] != -v[2]))
        st = dt_fail(ctx, DT_ERR_CONFIG,
                     "parallel.hybrid with parallel.tp=%d: every node must hold the same number of each "
                     "data-parallel group's ranks (%d ranks on %d node(s); this rank's group has %d on its node)",
                     pc->tp, W, dt_comm_num_nodes(comm), ns);
    if (st == DT_OK) st = dt_comm_group_split(ctx, comm, shard, ns, &pc->node_group);
    if (st == DT_OK) st = dt_comm_group_split(ctx, comm, cross, nc, &pc->cross_group);
    free(all), free(node);
    return st;
}

/* The process mesh of a tensor-, context-, pipeline- or expert-parallel run (parallel/mesh.h):
 * the TP group (consecutive ranks), the data-parallel group, the CP and DP x CP groups, the EP
 * and EDP groups, the PP group (the stages, tp x dp apart) and the model-parallel group (the
 * tp x pp ranks holding one model together, for checkpoints; under expert parallelism, pp = 1,
 * the EP group, each EP rank's TP group in turn), split once (hybrid sharding: its shard and replica groups too); the model
 * holds the shard of its TP rank, the layers of its stage and the experts of its EP rank. */
dt_status dt_trainer_mesh_groups(dt_ctx *ctx, dt_trainer *tr, dt_model_opts *mo, dt_parallel_cfg *pc) {
    dt_comm *comm = tr->comm;
    dt_mesh mesh;
    const int pp = tr->cfg.pp > 1 && !tr->cfg.pp_blocks ? tr->cfg.pp : 1;
    const int cp = tr->cfg.cp > 1 ? tr->cfg.cp : 1, ep = tr->cfg.ep > 1 ? tr->cfg.ep : 1;
    DT_CHECK(dt_mesh_init(ctx, &mesh, dt_comm_size(comm, DT_GROUP_WORLD), dt_comm_rank(comm, DT_GROUP_WORLD),
                          pc->tp > 1 ? pc->tp : 1, cp, pp, ep));
    int *ranks = malloc((size_t)mesh.world * sizeof *ranks);
    if (!ranks) return dt_fail(ctx, DT_ERR_NOMEM, "mesh: out of memory");
    int n;
    dt_status st = DT_OK;
    if (pc->tp > 1) {
        n = dt_mesh_group(&mesh, DT_MESH_TP, ranks);
        st = dt_comm_group_split(ctx, comm, ranks, n, &tr->tp.group);
    }
    if (st == DT_OK) {
        n = dt_mesh_group(&mesh, DT_MESH_DP, ranks);
        st = dt_comm_group_split(ctx, comm, ranks, n, &tr->dp_group);
    }
    dt_group dpcp = tr->dp_group; /* the ranks a gradient is summed over: data and context parallel */
    if (st == DT_OK && cp > 1) {
        n = dt_mesh_group(&mesh, DT_MESH_CP, ranks);
        st = dt_comm_group_split(ctx, comm, ranks, n, &tr->cp.group);
        tr->cp.n = cp, tr->cp.rank = mesh.coord[DT_AXIS_CP];
        if (st == DT_OK) {
            n = dt_mesh_group(&mesh, DT_MESH_DPCP, ranks);
            st = dt_comm_group_split(ctx, comm, ranks, n, &dpcp);
        }
    }
    if (st == DT_OK && ep > 1) { /* the experts' groups (decision 85) */
        n = dt_mesh_group(&mesh, DT_MESH_EP, ranks);
        st = dt_comm_group_split(ctx, comm, ranks, n, &tr->ep.group);
        tr->ep.n = ep, tr->ep.rank = dt_mesh_group_rank(&mesh, DT_MESH_EP);
        if (st == DT_OK) {
            n = dt_mesh_group(&mesh, DT_MESH_EDP, ranks);
            st = dt_comm_group_split(ctx, comm, ranks, n, &tr->ep.edp);
            tr->ep.edp_n = n, tr->ep.edp_rank = dt_mesh_group_rank(&mesh, DT_MESH_EDP);
        }
        mo->ep = ep, mo->ep_rank = tr->ep.rank;
    }
    if (st == DT_OK && pp > 1) {
        n = dt_mesh_group(&mesh, DT_MESH_PP, ranks);
        st = dt_comm_group_split(ctx, comm, ranks, n, &tr->pp.group);
        tr->pp.n = pp, tr->pp.stage = mesh.coord[DT_AXIS_PP];
    }
    if (st == DT_OK) { /* same c and d: stage after stage, tp ranks each (ascending world ranks) */
        int c[DT_AXIS_N], k = 0;
        memcpy(c, mesh.coord, sizeof c);
        for (int p = 0; p < pp; p++)
            for (int t = 0; t < mesh.size[DT_AXIS_TP]; t++) c[DT_AXIS_PP] = p, c[DT_AXIS_TP] = t, ranks[k++] = dt_mesh_rank_at(&mesh, c);
        tr->mp_ranks = k;
        if (k > 1 && ep <= 1) st = dt_comm_group_split(ctx, comm, ranks, k, &tr->mp_group);
    }
    free(ranks);
    if (st == DT_OK && ep > 1 && pc->tp <= 1) { /* the ranks holding one whole model: the EP group (pp = 1) */
        tr->mp_ranks = ep;
        tr->mp_group = tr->ep.group;
    } else if (st == DT_OK && ep > 1) { /* and with tensor parallelism each EP rank's TP group, EP rank
                                        * after EP rank (decision 91; train/tp_ckpt.c) */
        int *mp = malloc((size_t)ep * (size_t)pc->tp * sizeof *mp), c[DT_AXIS_N], k = 0;
        if (!mp) return dt_fail(ctx, DT_ERR_NOMEM, "mesh: out of memory");
        memcpy(c, mesh.coord, sizeof c);
        const int d0 = mesh.coord[DT_AXIS_DP] / ep * ep; /* the EP group's first data-parallel index */
        for (int e = 0; e < ep; e++)
            for (int t = 0; t < pc->tp; t++) c[DT_AXIS_DP] = d0 + e, c[DT_AXIS_TP] = t, mp[k++] = dt_mesh_rank_at(&mesh, c);
        tr->mp_ranks = k;
        st = dt_comm_group_split(ctx, comm, mp, k, &tr->mp_group);
        free(mp);
    }
    if (st == DT_OK && pc->hybrid && pc->strategy != DT_STRAT_DDP) st = hybrid_groups(ctx, tr, &mesh, pc);
    DT_CHECK(st);
    tr->tp.comm = comm;
    dt_ctx_init(&tr->tp.ctx);
    tr->tp.ctx.rank = ctx->rank, tr->tp.ctx.world = ctx->world;
    mo->tp_first = pc->tp > 1 ? mesh.coord[DT_AXIS_TP] : 0;
    pc->dp_group = dpcp;
    if (cp > 1) {
        mo->cp = cp, mo->cp_rank = tr->cp.rank;
        tr->cp.comm = comm;
        dt_ctx_init(&tr->cp.ctx);
        tr->cp.ctx.rank = ctx->rank, tr->cp.ctx.world = ctx->world;
    }
    pc->tp_group = tr->tp.group;
    if (pp > 1) {
        mo->pp_l0 = tr->cfg.pp_first[tr->pp.stage];
        mo->pp_l1 = tr->cfg.pp_first[tr->pp.stage + 1];
        dt_pp_chunk_opts(&tr->cfg, mo);
    }
    return DT_OK;
}

