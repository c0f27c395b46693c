/* The process mesh (parallel/mesh.h): rank order tp fastest, then cp, dp, pp; every group's
 * member list for several shapes, checked against lists written out by hand and against the
 * defining property (the members are exactly the ranks whose other coordinates agree); the
 * refusals naming the keys; and the configuration keys parallel.tp/cp/pp/ep (refused until
 * built, after the divisibility checks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/mesh.h"
#include "train/keys.h"
#include "testutil.h"

static void expect_group(const dt_mesh *m, dt_mesh_group_kind k, const int *want, int n) {
    int got[64];
    assert_int_equal(dt_mesh_group_size(m, k), n);
    assert_int_equal(dt_mesh_group(m, k, got), n);
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) fail_msg("rank %d group %s: member %d is %d, want %d", m->rank, dt_mesh_group_name(k), i, got[i], want[i]);
    }
    int idx = -1;
    for (int i = 0; i < n; i++)
        if (want[i] == m->rank) idx = i;
    assert_int_equal(dt_mesh_group_rank(m, k), idx);
}

/* world 16 = tp2 cp2 dp2 pp2: rank = t + 2 c + 4 d + 8 p. */
static void test_16_ranks_by_hand(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_mesh m;
    assert_int_equal(dt_mesh_init(&ctx, &m, 16, 13, 2, 2, 2, 1), DT_OK); /* 13 = 1 + 2*0 + 4*1 + 8*1 */
    assert_int_equal(m.size[DT_AXIS_DP], 2);
    int want_c[4] = {1, 0, 1, 1};
    for (int a = 0; a < DT_AXIS_N; a++) assert_int_equal(m.coord[a], want_c[a]);
    assert_int_equal(dt_mesh_rank_at(&m, m.coord), 13);
    expect_group(&m, DT_MESH_TP, (int[]){12, 13}, 2);
    expect_group(&m, DT_MESH_CP, (int[]){13, 15}, 2);
    expect_group(&m, DT_MESH_DP, (int[]){9, 13}, 2);
    expect_group(&m, DT_MESH_PP, (int[]){5, 13}, 2);
    expect_group(&m, DT_MESH_DPCP, (int[]){9, 11, 13, 15}, 4);
    expect_group(&m, DT_MESH_EP, (int[]){13}, 1);
    expect_group(&m, DT_MESH_EDP, (int[]){9, 13}, 2);
    assert_false(dt_mesh_is_dp_only(&m));
}

/* ep 2 of dp 4 (world 8 = tp2 dp4): the EP groups are pairs of consecutive dp indices, the
 * expert-data-parallel groups the dp indices of equal parity. */
static void test_ep_folds_into_dp(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_mesh m;
    assert_int_equal(dt_mesh_init(&ctx, &m, 8, 6, 2, 1, 1, 2), DT_OK); /* 6: t 0, d 3 */
    assert_int_equal(m.size[DT_AXIS_DP], 4);
    expect_group(&m, DT_MESH_TP, (int[]){6, 7}, 2);
    expect_group(&m, DT_MESH_DP, (int[]){0, 2, 4, 6}, 4);
    expect_group(&m, DT_MESH_EP, (int[]){4, 6}, 2);
    expect_group(&m, DT_MESH_EDP, (int[]){2, 6}, 2);
    expect_group(&m, DT_MESH_DPCP, (int[]){0, 2, 4, 6}, 4);
    expect_group(&m, DT_MESH_PP, (int[]){6}, 1);
}

/* Plain data parallelism: the DP group is the world in order, every other group one rank. */
static void test_dp_only_is_the_world(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_mesh m;
    assert_int_equal(dt_mesh_init(&ctx, &m, 3, 2, 1, 1, 1, 1), DT_OK);
    assert_true(dt_mesh_is_dp_only(&m));
    expect_group(&m, DT_MESH_DP, (int[]){0, 1, 2}, 3);
    expect_group(&m, DT_MESH_DPCP, (int[]){0, 1, 2}, 3);
    expect_group(&m, DT_MESH_EDP, (int[]){0, 1, 2}, 3);
    for (int k = DT_MESH_TP; k < DT_MESH_NGROUPS; k++)
        if (k != DT_MESH_DP && k != DT_MESH_DPCP && k != DT_MESH_EDP) expect_group(&m, k, (int[]){2}, 1);
}

/* Every rank of several shapes: each group is exactly the ranks agreeing on the other
 * coordinates, the groups of one kind partition the world, and the TP group is consecutive. */
static void test_groups_partition_the_world(void **state) {
    (void)state;
    static const int shapes[][5] = {/* world tp cp pp ep */
                                    {16, 2, 2, 2, 1}, {24, 2, 1, 3, 2}, {12, 3, 2, 1, 1}, {8, 1, 1, 1, 4},
                                    {32, 4, 1, 2, 4}, {6, 1, 3, 1, 1},  {5, 1, 1, 5, 1}};
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int *sh = shapes[s];
        int W = sh[0];
        for (int k = 0; k < DT_MESH_NGROUPS; k++) {
            int seen[64] = {0}, gsize = 0;
            for (int r = 0; r < W; r++) {
                dt_mesh m;
                assert_int_equal(dt_mesh_init(&ctx, &m, W, r, sh[1], sh[2], sh[3], sh[4]), DT_OK);
                int g[64], x[DT_AXIS_N], n = dt_mesh_group(&m, k, g);
                assert_int_equal(n, dt_mesh_group_size(&m, k));
                assert_int_equal(g[dt_mesh_group_rank(&m, k)], r);
                for (int i = 0; i < n; i++) {
                    if (i > 0) assert_true(g[i] > g[i - 1]);
                    dt_mesh_coords(&m, g[i], x);
                    if (k == DT_MESH_TP) assert_int_equal(g[i], g[0] + i); /* consecutive */
                    if (k != DT_MESH_TP && k != DT_MESH_DPCP) assert_int_equal(x[DT_AXIS_TP], m.coord[DT_AXIS_TP]);
                    if (k != DT_MESH_PP) assert_int_equal(x[DT_AXIS_PP], m.coord[DT_AXIS_PP]);
                    if (k == DT_MESH_EP) assert_int_equal(x[DT_AXIS_DP] / m.ep, m.coord[DT_AXIS_DP] / m.ep);
                    if (k == DT_MESH_EDP) assert_int_equal(x[DT_AXIS_DP] % m.ep, m.coord[DT_AXIS_DP] % m.ep);
                    if (g[i] == r) continue;
                    /* membership is mutual: the member's own group of kind k is this one */
                    dt_mesh o;
                    int og[64];
                    assert_int_equal(dt_mesh_init(&ctx, &o, W, g[i], sh[1], sh[2], sh[3], sh[4]), DT_OK);
                    assert_int_equal(dt_mesh_group(&o, k, og), n);
                    assert_memory_equal(og, g, (size_t)n * sizeof(int));
                }
                seen[g[0]]++; /* each group counted once per member, named by its first rank */
                gsize = n;
            }
            int total = 0; /* the groups of one kind partition the world */
            for (int r = 0; r < W; r++) {
                assert_true(seen[r] == 0 || seen[r] == gsize);
                total += seen[r];
            }
            assert_int_equal(total, W);
        }
    }
}

static void expect_refusal(int world, int tp, int cp, int pp, int ep, const char *a, const char *b) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_mesh m;
    assert_int_equal(dt_mesh_init(&ctx, &m, world, 0, tp, cp, pp, ep), DT_ERR_CONFIG);
    if (!strstr(ctx.err, a) || (b && !strstr(ctx.err, b))) fail_msg("refusal '%s' lacks '%s' / '%s'", ctx.err, a, b ? b : "");
    assert_null(strchr(ctx.err, '\n'));
}

static void test_refusals_name_the_keys(void **state) {
    (void)state;
    expect_refusal(8, 3, 1, 1, 1, "parallel.tp=3 x parallel.cp=1 x parallel.pp=1 = 3 does not divide the 8 ranks", NULL);
    expect_refusal(16, 2, 2, 3, 1, "parallel.pp=3", "= 12 does not divide the 16 ranks");
    expect_refusal(8, 2, 1, 1, 3, "parallel.ep=3 does not divide the data-parallel size 4", "parallel.tp=2");
    expect_refusal(8, 0, 1, 1, 1, "parallel.tp must be in [1,", "(got 0)");
    expect_refusal(8, 1, 1, 1, -2, "parallel.ep must be in [1,", "(got -2)");
}

/* The keys: default 1 (a mesh of plain data parallelism); tp > 1 runs (tensor parallelism),
 * cp, pp, ep > 1 refused with one line naming the key once the world is applied, after the
 * divisibility check. */
static void expect_list(const char *what, int rank, const int *got, int n, const int *want, int wn) {
    if (n != wn) fail_msg("rank %d %s: %d members, want %d", rank, what, n, wn);
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) fail_msg("rank %d %s: member %d is %d, want %d", rank, what, i, got[i], want[i]);
}

/* Hybrid sharding over the data-parallel group: world 16 = tp2 x dp8 on 4 nodes of 4 ranks,
 * by hand for rank 13 (t 1, node 3); for every rank, the shard and replica groups are made of
 * its DP group's ranks and each kind partitions the world; nodes holding unequal numbers of a
 * DP group's ranks are refused; nodes that are not consecutive ranks work too. */
static void test_hybrid_groups(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_mesh m;
    int node[16], shard[16], cross[16], ns, nc;
    for (int r = 0; r < 16; r++) node[r] = 100 + r / 4;
    assert_int_equal(dt_mesh_init(&ctx, &m, 16, 13, 2, 1, 1, 1), DT_OK);
    assert_int_equal(dt_mesh_hybrid(&m, node, shard, &ns, cross, &nc), 0);
    expect_list("shard", 13, shard, ns, (int[]){13, 15}, 2);
    expect_list("replicas", 13, cross, nc, (int[]){1, 5, 9, 13}, 4);
    int in_shard[16] = {0}, in_cross[16] = {0};
    for (int r = 0; r < 16; r++) {
        assert_int_equal(dt_mesh_init(&ctx, &m, 16, r, 2, 1, 1, 1), DT_OK);
        assert_int_equal(dt_mesh_hybrid(&m, node, shard, &ns, cross, &nc), 0);
        assert_int_equal(ns, 2);
        assert_int_equal(nc, 4);
        for (int i = 0; i < ns; i++) {
            assert_int_equal(shard[i] % 2, r % 2); /* the same TP position */
            assert_int_equal(node[shard[i]], node[r]);
            in_shard[shard[i]] += shard[i] == r;
        }
        for (int i = 0; i < nc; i++) {
            assert_int_equal(cross[i] % 2, r % 2);
            assert_int_equal((cross[i] % 4) / 2, (r % 4) / 2); /* the same place on its node */
            if (i > 0) assert_true(node[cross[i]] != node[cross[i - 1]]);
            in_cross[cross[i]] += cross[i] == r;
        }
    }
    for (int r = 0; r < 16; r++) {
        assert_int_equal(in_shard[r], 1);
        assert_int_equal(in_cross[r], 1);
    }
    for (int r = 0; r < 16; r++) node[r] = r < 6 ? 0 : 1; /* t 0: 3 ranks on node 0, 5 on node 1 */
    assert_int_equal(dt_mesh_init(&ctx, &m, 16, 0, 2, 1, 1, 1), DT_OK);
    assert_int_equal(dt_mesh_hybrid(&m, node, shard, &ns, cross, &nc), -1);
    for (int r = 0; r < 8; r++) node[r] = r % 4; /* world 8 = tp2 x dp4, node = rank mod 4 */
    assert_int_equal(dt_mesh_init(&ctx, &m, 8, 0, 2, 1, 1, 1), DT_OK);
    assert_int_equal(dt_mesh_hybrid(&m, node, shard, &ns, cross, &nc), 0);
    expect_list("shard", 0, shard, ns, (int[]){0, 4}, 2);
    expect_list("replicas", 0, cross, nc, (int[]){0, 2}, 2);
}

static void test_keys_of_the_built_layouts(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_run_cfg c;
    dt_run_cfg_defaults(&c);
    assert_int_equal(c.tp + c.cp + c.pp + c.ep, 4);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_OK);
    assert_int_equal(dt_cfg_apply_world(&ctx, &c, 3), DT_OK);
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.tp", "2"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_OK); /* the world is not known yet */
    assert_int_equal(dt_cfg_apply_world(&ctx, &c, 3), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "parallel.tp=2 x parallel.cp=1 x parallel.pp=1 = 2 does not divide the 3 ranks"));
    /* tensor parallelism is built: tp 2 on 4 ranks is 2 data-parallel ranks */
    assert_int_equal(dt_cfg_apply_world(&ctx, &c, 4), DT_OK);
    assert_int_equal(c.train.model_opts.tp, 2);
    assert_int_equal(c.train.parallel.tp, 2);
    /* pipeline parallelism is built: pp 2 on 4 ranks is 2 data-parallel ranks of 2 stages */
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp", "2"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_OK);
    assert_int_equal(dt_cfg_apply_world(&ctx, &c, 4), DT_OK);
    assert_int_equal(c.train.pp, 2);
    /* context parallelism is built: cp 2 on 4 ranks is 2 data-parallel ranks of 2 CP ranks each */
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.cp", "2"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_OK);
    assert_int_equal(dt_cfg_apply_world(&ctx, &c, 4), DT_OK);
    assert_int_equal(c.train.cp, 2);
    assert_int_equal(c.train.model_opts.cp, 2);
    /* expert parallelism is built for a mixture of experts: a dense model is refused, naming the key */
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.ep", "2"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_ERR_CONFIG); /* before any world */
    if (!strstr(ctx.err, "parallel.ep=2 needs a mixture of experts")) fail_msg("%s", ctx.err);
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp", "0"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_ERR_CONFIG); /* refused before any world */
    assert_non_null(strstr(ctx.err, "parallel.pp must be in [1,"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_16_ranks_by_hand),
        cmocka_unit_test(test_ep_folds_into_dp),
        cmocka_unit_test(test_dp_only_is_the_world),
        cmocka_unit_test(test_groups_partition_the_world),
        cmocka_unit_test(test_refusals_name_the_keys),
        cmocka_unit_test(test_hybrid_groups),
        cmocka_unit_test(test_keys_of_the_built_layouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
