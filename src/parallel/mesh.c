/* The process mesh (mesh.h): coordinates and member lists, pure arithmetic. */
#include "parallel/mesh.h"

#include <stddef.h>
#include <stdlib.h>

dt_status dt_mesh_init(dt_ctx *ctx, dt_mesh *m, int world, int rank, int tp, int cp, int pp, int ep) {
    static const char *const key[4] = {"parallel.tp", "parallel.cp", "parallel.pp", "parallel.ep"};
    const int deg[4] = {tp, cp, pp, ep};
    for (int i = 0; i < 4; i++)
        if (deg[i] < 1 || deg[i] > DT_MESH_MAX_WORLD)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s must be in [1, %d] (got %d)", key[i], DT_MESH_MAX_WORLD, deg[i]);
    if (world < 1 || rank < 0 || rank >= world)
        return dt_fail(ctx, DT_ERR_CONFIG, "mesh: rank %d of a world of %d ranks", rank, world);
    /* 64 bits: three degrees up to 2^20 each would overflow an int */
    long long prod = (long long)tp * cp * pp;
    if (world % prod != 0)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "parallel.tp=%d x parallel.cp=%d x parallel.pp=%d = %lld does not divide the %d ranks "
                       "(ranks = tp x cp x dp x pp)", tp, cp, pp, prod, world);
    int dp = (int)(world / prod);
    if (dp % ep != 0)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "parallel.ep=%d does not divide the data-parallel size %d (%d ranks / (parallel.tp=%d x "
                       "parallel.cp=%d x parallel.pp=%d)); expert parallelism splits the data-parallel ranks",
                       ep, dp, world, tp, cp, pp);
    m->world = world;
    m->rank = rank;
    m->size[DT_AXIS_TP] = tp;
    m->size[DT_AXIS_CP] = cp;
    m->size[DT_AXIS_DP] = dp;
    m->size[DT_AXIS_PP] = pp;
    m->ep = ep;
    dt_mesh_coords(m, rank, m->coord);
    return DT_OK;
}

int dt_mesh_is_dp_only(const dt_mesh *m) {
    return m->size[DT_AXIS_TP] == 1 && m->size[DT_AXIS_CP] == 1 && m->size[DT_AXIS_PP] == 1 && m->ep == 1;
}

void dt_mesh_coords(const dt_mesh *m, int rank, int coord[DT_AXIS_N]) {
    for (int a = 0; a < DT_AXIS_N; a++) { /* tp fastest */
        coord[a] = rank % m->size[a];
        rank /= m->size[a];
    }
}

int dt_mesh_rank_at(const dt_mesh *m, const int coord[DT_AXIS_N]) {
    int r = 0;
    for (int a = DT_AXIS_N - 1; a >= 0; a--) r = r * m->size[a] + coord[a];
    return r;
}

/* Whether rank coordinates x lie in the group of kind k of the rank at coordinates me. */
static int same_group(const dt_mesh *m, dt_mesh_group_kind k, const int *me, const int *x) {
    int t = x[DT_AXIS_TP] == me[DT_AXIS_TP], c = x[DT_AXIS_CP] == me[DT_AXIS_CP];
    int d = x[DT_AXIS_DP] == me[DT_AXIS_DP], p = x[DT_AXIS_PP] == me[DT_AXIS_PP];
    switch (k) {
    case DT_MESH_TP: return c && d && p;
    case DT_MESH_CP: return t && d && p;
    case DT_MESH_DP: return t && c && p;
    case DT_MESH_PP: return t && c && d;
    case DT_MESH_EP: return t && c && p && x[DT_AXIS_DP] / m->ep == me[DT_AXIS_DP] / m->ep;
    case DT_MESH_EDP: return t && c && p && x[DT_AXIS_DP] % m->ep == me[DT_AXIS_DP] % m->ep;
    case DT_MESH_DPCP: return t && p;
    default: return 0;
    }
}

int dt_mesh_group_size(const dt_mesh *m, dt_mesh_group_kind k) {
    switch (k) {
    case DT_MESH_TP: return m->size[DT_AXIS_TP];
    case DT_MESH_CP: return m->size[DT_AXIS_CP];
    case DT_MESH_DP: return m->size[DT_AXIS_DP];
    case DT_MESH_PP: return m->size[DT_AXIS_PP];
    case DT_MESH_EP: return m->ep;
    case DT_MESH_EDP: return m->size[DT_AXIS_DP] / m->ep;
    case DT_MESH_DPCP: return m->size[DT_AXIS_DP] * m->size[DT_AXIS_CP];
    default: return 0;
    }
}

/* The group's order is ascending world rank: within a group that is its own axes in the mesh's
 * order, tp fastest (a DP×CP group: cp, then dp). */
int dt_mesh_group(const dt_mesh *m, dt_mesh_group_kind k, int *ranks) {
    int n = 0, x[DT_AXIS_N];
    for (int r = 0; r < m->world; r++) {
        dt_mesh_coords(m, r, x);
        if (same_group(m, k, m->coord, x)) ranks[n++] = r;
    }
    return n;
}

int dt_mesh_group_rank(const dt_mesh *m, dt_mesh_group_kind k) {
    int i = 0, x[DT_AXIS_N];
    for (int r = 0; r < m->rank; r++) {
        dt_mesh_coords(m, r, x);
        i += same_group(m, k, m->coord, x);
    }
    return i;
}

const char *dt_mesh_group_name(dt_mesh_group_kind k) {
    static const char *const names[DT_MESH_NGROUPS] = {"tp", "cp", "dp", "pp", "ep", "edp", "dpcp"};
    return (unsigned)k < DT_MESH_NGROUPS ? names[k] : "?";
}

int dt_mesh_hybrid(const dt_mesh *m, const int *node, int *shard, int *shard_n, int *cross, int *cross_n) {
    int n = dt_mesh_group_size(m, DT_MESH_DP), *dp = malloc((size_t)n * 3 * sizeof *dp);
    *shard_n = *cross_n = 0;
    if (!dp) return -1;
    int *pos = dp + n, *on = dp + 2 * (size_t)n; /* dp[i]'s position among its node's members; their count */
    dt_mesh_group(m, DT_MESH_DP, dp);
    int me = 0;
    for (int i = 0; i < n; i++) {
        pos[i] = on[i] = 0;
        for (int q = 0; q < n; q++)
            if (node[dp[q]] == node[dp[i]]) pos[i] += q < i, on[i]++;
        if (dp[i] == m->rank) me = i;
        if (node[dp[i]] == node[m->rank]) shard[(*shard_n)++] = dp[i];
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        bad |= on[i] != on[me];
        if (pos[i] == pos[me]) cross[(*cross_n)++] = dp[i];
    }
    free(dp);
    return bad ? -1 : 0;
}
