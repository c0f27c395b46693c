/* Pipeline stage boundaries (parallel/pp_split.h; ARCHITECTURE decision 76): the rule against
 * a brute force over every contiguous split, hand-worked splits (uniform layers balanced, the
 * head's stage lighter under a large vocabulary, one layer a stage when pp = L), the stage
 * costs adding up to the family's FLOPs plus the lookup and loss terms, the explicit
 * parallel.pp_layers (accepted and refused, as a key in text and YAML), and the planner cutting
 * the same stages as the trainer (gpt2 124M, llama-3.2-1b, tinyllama at pp 2, 4, 8). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pp_split.h"
#include "plan/plan.h"
#include "plan/plan_impl.h"
#include "train/config_yaml.h"
#include "train/keys.h"
#include "testutil.h"

static void expect_first(const int *first, const int *want, int pp, const char *what) {
    for (int s = 0; s <= pp; s++)
        if (first[s] != want[s]) {
            char got[256] = "", exp[256] = "";
            for (int i = 0; i <= pp; i++) {
                snprintf(got + strlen(got), sizeof got - strlen(got), " %d", first[i]);
                snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %d", want[i]);
            }
            fail_msg("%s: boundaries%s, want%s", what, got, exp);
        }
}

static dt_model_config preset(const char *name) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    assert_int_equal(dt_model_preset(&ctx, name, &c), DT_OK);
    assert_int_equal(dt_model_config_validate(&ctx, &c), DT_OK);
    return c;
}

/* The rule's order by brute force: every composition of L into pp parts >= 1, ranked by
 * (max cost within 1e-9, sum of squares, layers of the last stage, then counts from stage 0). */
static int better(const dt_pp_costs *k, int pp, const int *a, const int *b) {
    double ma = 0, mb = 0;
    long sa = 0, sb = 0;
    int fa[DT_PP_MAX + 1], fb[DT_PP_MAX + 1];
    fa[0] = fb[0] = 0;
    for (int s = 0; s < pp; s++) fa[s + 1] = fa[s] + a[s], fb[s + 1] = fb[s] + b[s];
    for (int s = 0; s < pp; s++) {
        ma = fmax(ma, dt_pp_costs_stage(k, pp, fa, s)), mb = fmax(mb, dt_pp_costs_stage(k, pp, fb, s));
        sa += (long)a[s] * a[s], sb += (long)b[s] * b[s];
    }
    if (ma < mb * (1 - 1e-9)) return 1;
    if (mb < ma * (1 - 1e-9)) return 0;
    if (sa != sb) return sa < sb;
    if (a[pp - 1] != b[pp - 1]) return a[pp - 1] < b[pp - 1];
    for (int s = 0; s < pp; s++)
        if (a[s] != b[s]) return a[s] < b[s];
    return 0;
}

static void brute(const dt_pp_costs *k, int L, int pp, int *best_first) {
    int cur[DT_PP_MAX], best[DT_PP_MAX];
    for (int s = 0; s < pp; s++) cur[s] = 1;
    cur[pp - 1] = L - (pp - 1);
    int have = 0;
    for (;;) { /* every composition: odometer over the first pp - 1 parts */
        int rest = L;
        for (int s = 0; s < pp - 1; s++) rest -= cur[s];
        if (rest >= 1) {
            cur[pp - 1] = rest;
            if (!have || better(k, pp, cur, best)) memcpy(best, cur, sizeof cur), have = 1;
        }
        int s = pp - 2;
        while (s >= 0 && ++cur[s] > L) cur[s--] = 1;
        if (s < 0) break;
    }
    best_first[0] = 0;
    for (int s = 0; s < pp; s++) best_first[s + 1] = best_first[s] + best[s];
}

static void test_rule_is_the_brute_force_optimum(void **state) {
    (void)state;
    /* costs in units of a layer: uniform; a heavy head; a heavy embedding; both; a head of
     * exactly two layers (ties at the bound) */
    const dt_pp_costs ks[] = {{0, 1, 0}, {0.01, 1, 4.46}, {2.5, 1, 0.3}, {1.7, 1, 2.2}, {0, 1, 2}, {0.5, 1, 0.5}};
    int checked = 0;
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (int L = 1; L <= 11; L++)
            for (int pp = 1; pp <= 5 && pp <= L; pp++) {
                int got[DT_PP_MAX + 1], want[DT_PP_MAX + 1];
                dt_pp_split_costs(&ks[i], L, pp, got);
                brute(&ks[i], L, pp, want);
                char what[96];
                snprintf(what, sizeof what, "costs %zu, L %d, pp %d", i, L, pp);
                expect_first(got, want, pp, what);
                checked++;
            }
    assert_true(checked > 200);
}

static void test_uniform_layers_balance(void **state) {
    (void)state;
    const dt_pp_costs u = {0, 1, 0};
    int f[DT_PP_MAX + 1];
    dt_pp_split_costs(&u, 12, 4, f);
    expect_first(f, (int[]){0, 3, 6, 9, 12}, 4, "12 on 4");
    /* 10 on 4: two stages of 3 in the middle, the first and last (embedding, head) get 2 */
    dt_pp_split_costs(&u, 10, 4, f);
    expect_first(f, (int[]){0, 2, 5, 8, 10}, 4, "10 on 4");
    /* a real model whose head and embedding are small next to a layer: gpt2 shapes with a
     * 256-token vocabulary split evenly */
    dt_model_config c = preset("gpt2");
    c.vocab = 256;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_model_config_validate(&ctx, &c), DT_OK);
    dt_pp_split(&c, 1024, 4, f);
    expect_first(f, (int[]){0, 3, 6, 9, 12}, 4, "gpt2 shapes, vocabulary 256, pp 4");
    dt_pp_split(&c, 1024, 3, f);
    expect_first(f, (int[]){0, 4, 8, 12}, 3, "gpt2 shapes, vocabulary 256, pp 3");
    dt_pp_split(&c, 1024, 1, f);
    expect_first(f, (int[]){0, 12}, 1, "pp 1");
}

static void test_large_vocabulary_lightens_the_head_stage(void **state) {
    (void)state;
    dt_model_config c = preset("gpt2"); /* 124M: V 50257, d 768, 12 layers */
    dt_pp_costs k;
    dt_pp_costs_of(&c, 1024, &k);
    /* by hand: a layer 6 (12 d^2 + 13 d) + 12 T d, the head 6 (V d + 2 d) + 5 V, the lookups
     * 2 x 3 d */
    const double d = 768, V = 50257, T = 1024;
    const double layer = 6 * (12 * d * d + 13 * d) + 12 * T * d, head = 6 * (V * d + 2 * d) + 5 * V;
    assert_true(fabs(k.layer - layer) <= 1e-9 * layer);
    assert_true(fabs(k.head - head) <= 1e-9 * head);
    assert_true(fabs(k.embed - 6 * d) <= 1e-6);
    assert_true(k.head > 4.4 * k.layer && k.head < 4.5 * k.layer); /* the head costs ~4.5 layers */
    int f[DT_PP_MAX + 1];
    /* pp 4: the last stage 1 layer + the head (the smallest bound any split reaches), the other
     * 11 as even as they go, earlier stages fewer */
    dt_pp_split(&c, 1024, 4, f);
    expect_first(f, (int[]){0, 3, 7, 11, 12}, 4, "gpt2 pp 4");
    /* pp 2: the last stage's head is worth ~4.5 layers: 8 + 4 (8.0 vs 8.46 layers) */
    dt_pp_split(&c, 1024, 2, f);
    expect_first(f, (int[]){0, 8, 12}, 2, "gpt2 pp 2");
    double c0 = dt_pp_stage_cost(&c, 1024, 2, f, 0), c1 = dt_pp_stage_cost(&c, 1024, 2, f, 1);
    assert_true(c1 > c0 && c1 < 9 * layer); /* the alternative 7 + 5 costs 9.46 layers */
    /* llama-3.2-1b (V 128256, d 2048, 16 layers): the last stage fewer layers than the others */
    dt_model_config l = preset("llama-3.2-1b");
    for (int pp = 2; pp <= 8; pp *= 2) {
        dt_pp_split(&l, 2048, pp, f);
        int last = f[pp] - f[pp - 1];
        for (int s = 0; s + 1 < pp; s++)
            if (f[s + 1] - f[s] <= last) fail_msg("llama-3.2-1b pp %d: stage %d has %d layers, the last %d", pp, s,
                                                  f[s + 1] - f[s], last);
    }
}

static void test_one_layer_a_stage(void **state) {
    (void)state;
    const char *names[] = {"gpt2", "llama-3.2-1b", "vit-b16", "gpt2-tiny"};
    for (int i = 0; i < 4; i++) {
        dt_model_config c = preset(names[i]);
        int L = c.n_layer, f[DT_PP_MAX + 1];
        dt_pp_split(&c, c.context < 1024 ? c.context : 1024, L, f);
        for (int s = 0; s < L; s++)
            if (f[s + 1] - f[s] != 1) fail_msg("%s pp = L = %d: stage %d has %d layers", names[i], L, s, f[s + 1] - f[s]);
        /* and every pp: contiguous, every stage >= 1 layer */
        for (int pp = 1; pp <= L; pp++) {
            dt_pp_split(&c, 256, pp, f);
            assert_int_equal(f[0], 0);
            assert_int_equal(f[pp], L);
            for (int s = 0; s < pp; s++)
                if (f[s + 1] - f[s] < 1) fail_msg("%s pp %d: stage %d empty", names[i], pp, s);
        }
    }
}

static void test_stage_costs_sum_to_the_total(void **state) {
    (void)state;
    const char *names[] = {"gpt2", "gpt2-medium", "llama-3.2-1b", "tinyllama-1.1b", "vit-b16", "vit-fashion"};
    for (int i = 0; i < 6; i++) {
        dt_model_config c = preset(names[i]);
        const int T = c.context < 2048 ? c.context : 2048;
        const double C = c.d_model;
        double extra; /* the lookup and loss terms flops_per_token leaves out */
        if (!strcmp(c.family, "vit")) {
            double p = c.image_size / c.patch_size;
            extra = (3 * C * (p * p + 1) + 5.0 * c.n_classes) / c.context;
        } else
            extra = 3 * C * (!strcmp(c.family, "gpt2") ? 2 : 1) + 5.0 * c.vocab;
        const double total = dt_model_flops_per_token(&c, T) + extra;
        for (int pp = 1; pp <= 8 && pp <= c.n_layer; pp++) {
            int f[DT_PP_MAX + 1];
            dt_pp_split(&c, T, pp, f);
            double sum = 0;
            for (int s = 0; s < pp; s++) sum += dt_pp_stage_cost(&c, T, pp, f, s);
            if (!(fabs(sum - total) <= 1e-12 * total))
                fail_msg("%s pp %d: stage costs sum to %.17g, the total is %.17g", names[i], pp, sum, total);
        }
    }
}

static void test_explicit_counts(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    int f[DT_PP_MAX + 1];
    assert_int_equal(dt_pp_split_explicit(&ctx, (int[]){3, 4, 5}, 3, 3, 12, f), DT_OK);
    expect_first(f, (int[]){0, 3, 7, 12}, 3, "explicit 3, 4, 5");
    static const struct {
        int counts[4], n, pp, L;
        const char *msg;
    } bad[] = {
        {{3, 4, 5}, 3, 2, 12, "parallel.pp_layers [3, 4, 5]: 3 numbers for parallel.pp = 2 stages"},
        {{6, 0, 6}, 3, 3, 12, "parallel.pp_layers [6, 0, 6]: stage 1 has 0 layers (every stage needs >= 1)"},
        {{3, -1, 10}, 3, 3, 12, "parallel.pp_layers [3, -1, 10]: stage 1 has -1 layers"},
        {{3, 4}, 2, 2, 12, "parallel.pp_layers [3, 4]: the counts sum to 7, not model.n_layer = 12"},
        {{12}, 1, 65, 12, "parallel.pp_layers [12]: parallel.pp must be in [1, 64] (got 65)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctx.err[0] = 0;
        assert_int_equal(dt_pp_split_explicit(&ctx, bad[i].counts, bad[i].n, bad[i].pp, bad[i].L, f), DT_ERR_CONFIG);
        if (!strstr(ctx.err, bad[i].msg)) fail_msg("case %zu: '%s', want '%s'", i, ctx.err, bad[i].msg);
        assert_null(strchr(ctx.err, '\n'));
    }
}

/* The key: --set text and YAML lists, checked against parallel.pp and model.n_layer when the
 * configuration is finished, and given to the trainer as the stages' first layers once the world
 * is applied. */
static void test_key(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_run_cfg c;
    dt_run_cfg_defaults(&c);
    assert_int_equal(c.pp_layers.n, 0);
    assert_int_equal(dt_cfg_set(&ctx, &c, "model.n_layer", "5"), DT_OK);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp", "2"), DT_OK);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp_layers", "2,3"), DT_OK);
    assert_int_equal(c.pp_layers.n, 2);
    assert_int_equal(c.pp_layers.v[0], 2);
    assert_int_equal(c.pp_layers.v[1], 3);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_OK);
    assert_int_equal(dt_cfg_apply_world(&ctx, &c, 2), DT_OK);
    assert_int_equal(c.train.pp, 2);
    assert_int_equal(c.train.pp_first[0], 0);
    assert_int_equal(c.train.pp_first[1], 2);
    assert_int_equal(c.train.pp_first[2], 5);
    /* "[2, 3]" in text too; bad text refused naming the key */
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp_layers", "[1, 4]"), DT_OK);
    assert_int_equal(c.pp_layers.v[0] * 10 + c.pp_layers.v[1], 14);
    static const char *const bad_text[] = {"2,x", "2,,3", "2,3,", "[2, 3", "2 3", "[2]x"};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp_layers", bad_text[i]), DT_ERR_CONFIG);
        if (!strstr(ctx.err, "parallel.pp_layers: expected a comma list of integers")) fail_msg("%s: %s", bad_text[i], ctx.err);
    }
    /* a sum that is not the model's layers: refused when finished */
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp", "2"), DT_OK);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp_layers", "2,3"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_ERR_CONFIG); /* gpt2-tiny: 2 layers */
    assert_non_null(strstr(ctx.err, "parallel.pp_layers [2, 3]: the counts sum to 5, not model.n_layer = 2"));
    /* more stages than layers, without explicit counts */
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_set(&ctx, &c, "parallel.pp", "3"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "parallel.pp=3: more stages than layers (model.n_layer = 2)"));
    /* YAML: a list, read back from the printed configuration */
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_load_yaml_text(&ctx, &c, "t.yaml", "model:\n  n_layer: 5\nparallel:\n  pp: 2\n"
                                                                "  pp_layers: [2, 3]\n"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_OK);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dt_cfg_print(f, &c);
    fclose(f);
    assert_non_null(strstr(buf, "  pp_layers: [2, 3]\n"));
    dt_run_cfg back;
    dt_run_cfg_defaults(&back);
    assert_int_equal(dt_cfg_load_yaml_text(&ctx, &back, "back.yaml", buf), DT_OK);
    free(buf);
    assert_int_equal(back.pp_layers.n, 2);
    assert_int_equal(back.pp_layers.v[1], 3);
    /* a list where a single value belongs is still refused; a list of non-numbers too */
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_load_yaml_text(&ctx, &c, "t.yaml", "parallel:\n  pp: [2, 3]\n"), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "t.yaml:2: parallel.pp: expected a single value, got a list"));
    assert_int_equal(dt_cfg_load_yaml_text(&ctx, &c, "t.yaml", "parallel:\n  pp_layers: [2, [3]]\n"), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "parallel.pp_layers: expected a list of numbers"));
    assert_int_equal(dt_cfg_load_yaml_text(&ctx, &c, "t.yaml", "parallel:\n  pp_layers: [a, 3]\n"), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "t.yaml:2: parallel.pp_layers: expected a comma list of integers"));
    /* [] = the rule */
    assert_int_equal(dt_cfg_load_yaml_text(&ctx, &c, "t.yaml", "parallel:\n  pp_layers: []\n"), DT_OK);
    assert_int_equal(c.pp_layers.n, 0);
}

/* The planner cuts the stages the trainer does: dtrain's models through their config, and the
 * same shapes as a published model (the planner's own arithmetic, is_dtrain = 0). */
static void test_planner_agrees(void **state) {
    (void)state;
    const char *names[] = {"gpt2", "llama-3.2-1b", "tinyllama-1.1b"};
    const int T = 1024;
    for (int i = 0; i < 3; i++) {
        dt_model_config c = preset(names[i]);
        dt_plan_model pm;
        dt_plan_model_from_dtrain(&c, names[i], &pm);
        for (int own = 1; own >= 0; own--) {
            pm.is_dtrain = own;
            for (int pp = 2; pp <= 8; pp *= 2) {
                int f[DT_PP_MAX + 1], g[DT_PP_MAX + 1];
                dt_pp_split(&c, T, pp, f);
                dt_plan_pp_split(&pm, T, pp, g);
                char what[96];
                snprintf(what, sizeof what, "%s pp %d (%s)", names[i], pp, own ? "dtrain config" : "shape");
                expect_first(g, f, pp, what);
                /* the heaviest stage's layers, as the planner's time and memory terms use them */
                int heavy = 0;
                for (int s = 1; s < pp; s++)
                    if (dt_pp_stage_cost(&c, T, pp, f, s) > dt_pp_stage_cost(&c, T, pp, f, heavy) * (1 + 1e-9)) heavy = s;
                dt_plan_layout l = {1, 1, pp, 1, 1, DT_STRAT_DDP, 0};
                if ((int)dt_plan_stage_layers(&pm, &l, T) != f[heavy + 1] - f[heavy])
                    fail_msg("%s: the planner's heaviest stage has %g layers, dt_pp_split's %d", what,
                             dt_plan_stage_layers(&pm, &l, T), f[heavy + 1] - f[heavy]);
                dt_plan_stages st;
                dt_plan_stages_of(&pm, T, pp, &st);
                assert_true(st.u >= 1 && st.u < pp);
            }
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_is_the_brute_force_optimum),
        cmocka_unit_test(test_uniform_layers_balance),
        cmocka_unit_test(test_large_vocabulary_lightens_the_head_stage),
        cmocka_unit_test(test_one_layer_a_stage),
        cmocka_unit_test(test_stage_costs_sum_to_the_total),
        cmocka_unit_test(test_explicit_counts),
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_planner_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
