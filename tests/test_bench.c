/* bench: statistics on known vectors, the FLOP and MFU count against a hand computation,
 * the loss hash, the price table (costs by hand; bad files refused naming file:line and
 * key), sweep points, and the trace recorder's no-op and nesting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/prices.h"
#include "bench/sweep.h"
#include "comm/comm_fit.h"
#include "core/timer.h"
#include "core/trace.h"
#include "testutil.h"

static void test_stats_known_vectors(void **state) {
    (void)state;
    dt_stats s;
    const double a[] = {2, 4, 4, 4, 5, 5, 7, 9}; /* mean 5, sum of squares 32: sample std sqrt(32/7) */
    dt_stats_of(&s, a, 8);
    assert_true(fabs(s.mean - 5.0) < 1e-12);
    assert_true(fabs(s.std - sqrt(32.0 / 7.0)) < 1e-12);
    assert_true(s.min == 2 && s.max == 9);
    assert_true(s.median == 4.5); /* even count: mean of the middle two (4, 5) */
    const double b[] = {3, 1, 2}; /* unsorted, odd count */
    dt_stats_of(&s, b, 3);
    assert_true(s.median == 2 && s.min == 1 && s.max == 3 && fabs(s.mean - 2) < 1e-15 && fabs(s.std - 1) < 1e-15);
    const double c[] = {7.5};
    dt_stats_of(&s, c, 1); /* one value: std 0, not NaN */
    assert_true(s.mean == 7.5 && s.std == 0 && s.median == 7.5);
    dt_stats_of(&s, c, 0);
    assert_true(s.mean == 0 && s.std == 0 && s.max == 0);
    assert_true(dt_median(a, 8) == 4.5);
}

/* gpt2-tiny-like: L = 2, d = 64, V = 256, T = 64.
 *   per layer 12 d^2 + 13 d = 12*4096 + 832 = 49984;  x 2 layers = 99968
 *   + ln_f 2 d = 128                                              = 100096
 *   + lm_head V d = 256*64 = 16384                    N           = 116480
 *   6 N = 698880;  12 L T d = 12*2*64*64 = 98304;     FLOP/token  = 797184
 * A step of B=4 x T=64 = 256 tokens per rank in 0.1 s: 2560 tokens/s per rank,
 *   797184 * 2560 = 2040791040 FLOP/s; against a 10 GFLOP/s peak: MFU = 0.204079104. */
static void test_flops_and_mfu_by_hand(void **state) {
    (void)state;
    dt_model_config c = {.n_layer = 2, .d_model = 64, .n_head = 4, .vocab = 256, .context = 64};
    assert_true(dt_model_flops_per_token(&c, 64) == 797184.0);
    assert_true(fabs(dt_bench_mfu(797184.0, 2560.0, 10.0) - 0.204079104) < 1e-12);
    assert_true(dt_bench_mfu(797184.0, 2560.0, 0.0) == 0.0);
}

static void test_loss_hash(void **state) {
    (void)state;
    float a[3] = {1.5f, 2.25f, 3.0f}, b[3] = {1.5f, 2.25f, 3.0f};
    assert_true(dt_bench_loss_hash(a, 3) == dt_bench_loss_hash(b, 3));
    b[2] = nextafterf(3.0f, 4.0f); /* one ulp changes the hash */
    assert_true(dt_bench_loss_hash(a, 3) != dt_bench_loss_hash(b, 3));
    assert_true(dt_bench_loss_hash(a, 0) == 1469598103934665603ULL); /* FNV offset basis */
}

static void test_prices(void **state) {
    (void)state;
    char dir[256];
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "bench"), 0);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_price_table t;
    const char *ok = tu_write_file(dir, "ok.yaml",
                                "date: \"2024-06-01\"\ninstances:\n  a: {on_demand: 3.6, spot: 1.8}\n  b: {on_demand: 7.2, spot: null}\n");
    assert_int_equal(dt_prices_load(&ctx, ok, &t), DT_OK);
    assert_int_equal(t.n, 2);
    /* 1000 samples/s, 100000 tokens/s, 2 nodes, 3.6e9 tokens to train:
     *   $/s = 3.6 x 2 / 3600 = 0.002;  per 1K samples: 0.002;  per 1B tokens: 0.002 x 1e4 = 20
     *   hours = 3.6e9 / 1e5 / 3600 = 10;  on-demand 10 x 7.2 = 72;  spot 10 x 3.6 = 36 */
    dt_cost_input in = {1000, 100000, 2, 3.6e9};
    cJSON *rows;
    assert_int_equal(dt_prices_cost(&ctx, &t, "a", &in, &rows), DT_OK);
    assert_int_equal(cJSON_GetArraySize(rows), 1);
    cJSON *r = cJSON_GetArrayItem(rows, 0);
    assert_true(fabs(cJSON_GetObjectItem(r, "usd_per_1k_samples")->valuedouble - 0.002) < 1e-12);
    assert_true(fabs(cJSON_GetObjectItem(r, "usd_per_1b_tokens")->valuedouble - 20) < 1e-9);
    assert_true(fabs(cJSON_GetObjectItem(r, "hours_to_train")->valuedouble - 10) < 1e-12);
    assert_true(fabs(cJSON_GetObjectItem(r, "usd_to_train")->valuedouble - 72) < 1e-9);
    assert_true(fabs(cJSON_GetObjectItem(r, "spot_usd_to_train")->valuedouble - 36) < 1e-9);
    cJSON_Delete(rows);
    assert_int_equal(dt_prices_cost(&ctx, &t, "all", &in, &rows), DT_OK);
    assert_int_equal(cJSON_GetArraySize(rows), 2);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 1), "spot_usd_to_train")));
    cJSON_Delete(rows);
    assert_int_equal(dt_prices_cost(&ctx, &t, "zz", &in, &rows), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "known: a, b"));
    dt_prices_free(&t);

    static const struct {
        const char *text, *want;
    } bad[] = {
        {"instances:\n  a: {on_demand: -1}\n", "bad.yaml:2: instances.a.on_demand must be a price"},
        {"instances:\n  a: {on_demand: 1}\n  b:\n    spto: 2\n", "bad.yaml:4: instances.b.spto: unknown key"},
        {"instances:\n  a: {spot: 1}\n", "bad.yaml:2: instances.a.on_demand is missing"},
        {"instances:\n  a: {on_demand: 1}\n  a: {on_demand: 2}\n", "bad.yaml:3: instances.a is listed twice"},
        {"date: 1\nprice: 3\n", "bad.yaml:2: price: unknown key"},
        {"instances: [1, 2\n", "bad.yaml:2: YAML syntax error"},
        {"instances: {}\n", "instances: no instance listed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = tu_write_file(dir, "bad.yaml", bad[i].text);
        assert_int_equal(dt_prices_load(&ctx, p, &t), DT_ERR_CONFIG);
        if (!strstr(ctx.err, bad[i].want)) fail_msg("case %zu: got '%s', want '%s'", i, ctx.err, bad[i].want);
        assert_null(strchr(ctx.err, '\n'));
    }
    /* The shipped table loads. */
    assert_int_equal(dt_prices_load(&ctx, DT_SOURCE_DIR "/configs/prices.yaml", &t), DT_OK);
    assert_true(t.n >= 6);
    dt_prices_free(&t);
    tu_rmtree(dir);
}

static void test_sweep_points(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_sweep sw;
    memset(&sw, 0, sizeof sw);
    assert_int_equal(dt_sweep_add_axis(&ctx, &sw, "world=1,2"), DT_OK);
    assert_int_equal(dt_sweep_add_axis(&ctx, &sw, "strategy=ddp,zero1,zero3"), DT_OK);
    assert_int_equal(dt_sweep_count(&sw), 6);
    char id[128];
    dt_sweep_point_id(&sw, 4, id, sizeof id); /* last axis fastest: (world 2, zero1) */
    assert_string_equal(id, "world2-strategyzero1");
    assert_int_equal(dt_sweep_world(&sw, 4), 2);
    char *argv[8];
    char store[DT_SWEEP_MAX_AXES][128];
    int n = 0;
    dt_sweep_point_args(&sw, 4, argv, &n, store);
    assert_int_equal(n, 2);
    assert_string_equal(argv[1], "parallel.strategy=zero1");
    /* Efficiency: tokens/s(W) / (W x tokens/s(1)) against the same strategy at world 1. */
    cJSON *pts[6];
    double tps[6] = {100, 90, 80, 150, 171, 120};
    for (int i = 0; i < 6; i++) {
        pts[i] = cJSON_Parse("{\"parallel\":{\"fixed_global_batch\":false},\"summary\":{\"tokens_per_s\":{}},\"sweep\":{}}");
        cJSON_AddNumberToObject(cJSON_GetObjectItem(cJSON_GetObjectItem(pts[i], "summary"), "tokens_per_s"), "mean", tps[i]);
    }
    dt_sweep_efficiency(&sw, pts, 6);
    const cJSON *s4 = cJSON_GetObjectItem(pts[4], "sweep");
    assert_true(fabs(cJSON_GetObjectItem(s4, "weak_efficiency")->valuedouble - 171.0 / (2 * 90)) < 1e-12);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(s4, "strong_efficiency")));
    assert_string_equal(cJSON_GetObjectItem(s4, "reference")->valuestring, "world1-strategyzero1");
    for (int i = 0; i < 6; i++) cJSON_Delete(pts[i]);
    assert_int_equal(dt_sweep_add_axis(&ctx, &sw, "world=0"), DT_ERR_CONFIG);
    assert_int_equal(dt_sweep_add_axis(&ctx, &sw, "strategy=ddp"), DT_ERR_CONFIG); /* twice */
    assert_int_equal(dt_sweep_add_axis(&ctx, &sw, "nonsense=1"), DT_ERR_CONFIG);
    assert_int_equal(dt_sweep_add_axis(&ctx, &sw, "model.n_layer=2,4"), DT_OK);
}

/* The alpha-beta fit: rows made from known lines (two size ranges) come back exactly, the
 * prediction error is zero on them, a noisy row shows in max_rel_err, a negative intercept is
 * refitted through the origin, the file round-trips, a bad file is refused naming the key, and
 * the bucket rule is 9 alpha / beta within [1, 64] MiB. */
static cJSON *row(const char *op, double bytes, double us) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "op", op);
    cJSON_AddNumberToObject(r, "bytes", bytes);
    cJSON_AddNumberToObject(r, "time_us", us);
    return r;
}

/* f saved and loaded back keeps every line (op, group, alpha and beta within cJSON's 15
 * digits); a file holding bad_json is refused naming bad_key. */
static void fit_file_roundtrip(const dt_comm_fit *f, const char *bad_json, const char *bad_key) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char dir[256], path[300]; /* in a tu_mkdtemp directory: removed at exit if a check fails */
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "commfit"), 0);
    snprintf(path, sizeof path, "%s/fit.json", dir);
    assert_int_equal(dt_comm_fit_save(&ctx, path, f), DT_OK);
    dt_comm_fit back;
    assert_int_equal(dt_comm_fit_load(&ctx, path, &back), DT_OK);
    assert_int_equal(back.n, f->n);
    for (int k = 0; k < f->n; k++) {
        assert_string_equal(back.line[k].op, f->line[k].op);
        assert_string_equal(back.line[k].group, f->line[k].group);
        assert_true(fabs(back.line[k].alpha_us - f->line[k].alpha_us) <= 1e-12 * (1 + f->line[k].alpha_us));
        assert_true(fabs(back.line[k].beta_us_per_b - f->line[k].beta_us_per_b) <= 1e-12 * f->line[k].beta_us_per_b);
    }
    FILE *w = fopen(path, "w");
    fputs(bad_json, w);
    fclose(w);
    assert_int_equal(dt_comm_fit_load(&ctx, path, &back), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, bad_key));
    tu_rmtree(dir);
}

static void test_comm_fit(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    cJSON *rows = cJSON_CreateArray();
    /* allreduce_ordered: small sizes 5 us + 1 us/KiB, large 40 us + 0.25 us/KiB */
    for (double b = 1024; b <= 32 * 1048576.0; b *= 2) {
        double us = b < DT_COMM_FIT_SPLIT ? 5 + b / 1024 : 40 + 0.25 * b / 1024;
        cJSON_AddItemToArray(rows, row("allreduce_ordered", b, us));
        cJSON_AddItemToArray(rows, row("allgather", b, 3 + 0.5 * b / 1024 * (b == 65536 ? 1.1 : 1.0)));
        cJSON_AddItemToArray(rows, row("broadcast", b, b / 1024.0 - (b >= 2048 ? 0.4 : 0.0))); /* negative intercept */
    }
    dt_comm_fit f;
    assert_int_equal(dt_comm_fit_rows(&ctx, rows, 2, 1, &f), DT_OK);
    assert_int_equal(f.n, 9); /* 3 ops x 3 ranges */
    const dt_comm_fit_line *s = dt_comm_fit_find(&f, "allreduce_ordered", 4096), *l = dt_comm_fit_find(&f, "allreduce_ordered", 4e6);
    assert_non_null(s);
    assert_non_null(l);
    assert_true(fabs(s->alpha_us - 5) < 1e-6 && fabs(s->beta_us_per_b - 1.0 / 1024) < 1e-12 && s->max_rel_err < 1e-9);
    assert_true(fabs(l->alpha_us - 40) < 1e-6 && fabs(l->beta_us_per_b - 0.25 / 1024) < 1e-12 && l->max_rel_err < 1e-9);
    assert_true(fabs(dt_comm_fit_predict_us(l, 4194304) - (40 + 1024)) < 1e-6);
    const dt_comm_fit_line *g = dt_comm_fit_find(&f, "allgather", 65536);
    assert_true(g->max_rel_err > 0.01 && g->max_rel_err < 0.2); /* the 10% outlier shows */
    const dt_comm_fit_line *bc = dt_comm_fit_find(&f, "broadcast", 4096);
    assert_true(bc->alpha_us >= 0 && bc->beta_us_per_b > 0);
    assert_null(dt_comm_fit_find(&f, "nope", 1));
    /* bucket: 9 x 40 us / (0.25 us/KiB) = 1440 KiB */
    assert_int_equal(dt_comm_fit_bucket_bytes(&f), (size_t)(9 * 40 / (0.25 / 1024)));
    fit_file_roundtrip(&f, "{\"schema\": \"dtrain-commfit/1\", \"lines\": [{\"op\": \"x\", \"min_bytes\": 1, "
                           "\"max_bytes\": 2, \"alpha_us\": -1, \"beta_us_per_byte\": 1}]}",
                       "lines[0].alpha_us");
    cJSON_Delete(rows);
}

/* Link levels fitted apart: rows of the node and cross groups give their own lines (found by
 * group, the world's line unchanged), a file keeps the group and refuses an unknown one, and
 * the hierarchical-or-flat choice follows the two world lines at the bucket size, only on the
 * layout the file was fitted on. */
static cJSON *grow(const char *group, const char *op, double bytes, double us) {
    cJSON *r = row(op, bytes, us);
    cJSON_AddStringToObject(r, "group", group);
    return r;
}

static void test_comm_fit_groups(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    cJSON *rows = cJSON_CreateArray();
    for (double b = 1 << 20; b <= 32 * 1048576.0; b *= 2) {
        cJSON_AddItemToArray(rows, row("allreduce_ordered", b, 100 + b / 1024));        /* hierarchical: 1 us/KiB */
        cJSON_AddItemToArray(rows, row("allreduce_ordered_flat", b, 10 + 3 * b / 1024)); /* flat: 3 us/KiB */
        cJSON_AddItemToArray(rows, grow("node", "allreduce_ordered", b, 2 + 0.1 * b / 1024));
        cJSON_AddItemToArray(rows, grow("cross", "allreduce_ordered", b, 50 + 2 * b / 1024));
    }
    dt_comm_fit f;
    assert_int_equal(dt_comm_fit_rows(&ctx, rows, 4, 2, &f), DT_OK);
    assert_int_equal(f.n, 4 * 2); /* 4 (group, op) x the 2 ranges the sizes span */
    const dt_comm_fit_line *w = dt_comm_fit_find(&f, "allreduce_ordered", 4e6);
    const dt_comm_fit_line *nd = dt_comm_fit_find_in(&f, "node", "allreduce_ordered", 4e6);
    const dt_comm_fit_line *cr = dt_comm_fit_find_in(&f, "cross", "allreduce_ordered", 4e6);
    assert_non_null(w), assert_non_null(nd), assert_non_null(cr);
    assert_string_equal(w->group, "world");
    assert_true(fabs(w->beta_us_per_b - 1.0 / 1024) < 1e-12);
    assert_true(fabs(nd->alpha_us - 2) < 1e-6 && fabs(nd->beta_us_per_b - 0.1 / 1024) < 1e-12);
    assert_true(fabs(cr->alpha_us - 50) < 1e-6 && fabs(cr->beta_us_per_b - 2.0 / 1024) < 1e-12);
    assert_null(dt_comm_fit_find_in(&f, "cross", "allgather", 4e6));
    /* 4 MiB bucket: hierarchical 100 + 4096 us, flat 10 + 12288 us */
    double h, fl;
    assert_int_equal(dt_comm_fit_prefers_hier(&f, 4, 2, 4194304, &h, &fl), 1);
    assert_true(fabs(h - 4196) < 1e-6 && fabs(fl - 12298) < 1e-6);
    /* 16 bytes: below every fitted size, the nearest lines: still 1 us vs 3 us per KiB */
    assert_int_equal(dt_comm_fit_prefers_hier(&f, 4, 2, 1048576, &h, &fl), 1);
    assert_int_equal(dt_comm_fit_prefers_hier(&f, 8, 2, 4194304, &h, &fl), -1); /* another layout */
    assert_int_equal(dt_comm_fit_prefers_hier(&f, 4, 1, 4194304, &h, &fl), -1);
    cJSON_Delete(rows);
    rows = cJSON_CreateArray(); /* a slow hierarchical chain (latency-bound), a fast flat one */
    for (double b = 1 << 20; b <= 4 * 1048576.0; b *= 2) {
        cJSON_AddItemToArray(rows, row("allreduce_ordered", b, 9000 + b / 1024));
        cJSON_AddItemToArray(rows, row("allreduce_ordered_flat", b, 10 + 2 * b / 1024));
    }
    dt_comm_fit g;
    assert_int_equal(dt_comm_fit_rows(&ctx, rows, 4, 2, &g), DT_OK);
    assert_int_equal(dt_comm_fit_prefers_hier(&g, 4, 2, 4194304, &h, &fl), 0);
    dt_comm_fit noflat = g;
    noflat.n = 0;
    for (int k = 0; k < g.n; k++)
        if (strcmp(g.line[k].op, "allreduce_ordered_flat")) noflat.line[noflat.n++] = g.line[k];
    assert_int_equal(dt_comm_fit_prefers_hier(&noflat, 4, 2, 4194304, &h, &fl), -1);
    cJSON_Delete(rows);
    rows = cJSON_CreateArray();
    cJSON_AddItemToArray(rows, grow("rack", "allreduce", 1024, 5));
    assert_int_equal(dt_comm_fit_rows(&ctx, rows, 4, 2, &g), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "group 'rack'"));
    cJSON_Delete(rows);
    /* the file keeps the groups; an unknown group is refused naming the key */
    fit_file_roundtrip(&f, "{\"schema\": \"dtrain-commfit/1\", \"lines\": [{\"op\": \"x\", \"group\": \"rack\", "
                           "\"min_bytes\": 1, \"max_bytes\": 2, \"alpha_us\": 1, \"beta_us_per_byte\": 1}]}",
                       "lines[0].group");
}

/* Every (group, op) `bench comm` times on several nodes (12 world rows, 5 node and 5 cross,
 * bench/comm_bench.c), over the default sizes of `plan --calibrate` (1 KiB to 64 MiB: the 3
 * ranges each), fit and round-trip through the file: 66 lines (the limit once held 64). */
static void test_comm_fit_every_row(void **state) {
    (void)state;
    static const char *const world[] = {"allreduce", "allreduce_ordered", "allreduce_ordered_mpi",
                                        "allreduce_ordered_flat", "reduce_scatter", "reduce_scatter_ordered",
                                        "reduce_scatter_ordered_mpi", "allgather", "allgather_mpi", "broadcast",
                                        "pingpong", "alltoall"},
                             *node[] = {"allreduce_ordered", "reduce_scatter_ordered", "allgather", "pingpong", "alltoall"},
                             *cross[] = {"allreduce", "allreduce_ordered", "allgather", "pingpong", "alltoall"};
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    cJSON *rows = cJSON_CreateArray();
    for (double b = 1024; b <= 64 * 1048576.0; b *= 2) {
        for (int k = 0; k < 12; k++) cJSON_AddItemToArray(rows, row(world[k], b, 5 + b / 1024));
        for (int k = 0; k < 5; k++) {
            cJSON_AddItemToArray(rows, grow("node", node[k], b, 3 + b / 2048));
            cJSON_AddItemToArray(rows, grow("cross", cross[k], b, 50 + b / 512));
        }
    }
    dt_comm_fit f;
    if (dt_comm_fit_rows(&ctx, rows, 4, 2, &f) != DT_OK) fail_msg("%s", ctx.err);
    assert_int_equal(f.n, 22 * 3);
    const dt_comm_fit_line *a = dt_comm_fit_find_in(&f, "cross", "alltoall", 4e6);
    assert_non_null(a);
    assert_true(fabs(a->beta_us_per_b - 1.0 / 512) < 1e-12);
    fit_file_roundtrip(&f, "{\"schema\": \"dtrain-commfit/1\", \"lines\": [{\"op\": \"x\", \"min_bytes\": 1, "
                           "\"max_bytes\": 2, \"alpha_us\": -1, \"beta_us_per_byte\": 1}]}",
                       "lines[0].alpha_us");
    cJSON_Delete(rows);
}

static void test_trace_recorder(void **state) {
    (void)state;
    dt_trace_reset();
    double t = dt_trace_begin(); /* disabled: no clock read, nothing recorded */
    assert_true(t == 0.0);
    dt_trace_end(t, "x", "never");
    assert_int_equal(dt_trace_count(), 0);
    dt_trace_enable(dt_now());
    double outer = dt_trace_begin(), inner = dt_trace_begin();
    dt_trace_end(inner, "fwd", "inner \"quoted\" %d", 1);
    dt_trace_end(outer, "step", "outer");
    dt_trace_disable();
    dt_trace_end(dt_now(), "x", "after disable");
    assert_int_equal(dt_trace_count(), 2);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_trace_write_events(&ctx, f, 3), DT_OK);
    fclose(f);
    char *doc = malloc(len + 32);
    snprintf(doc, len + 32, "[%s]", text);
    cJSON *arr = cJSON_Parse(doc); /* valid JSON, escapes included */
    assert_non_null(arr);
    cJSON *in = cJSON_GetArrayItem(arr, cJSON_GetArraySize(arr) - 2), *out = cJSON_GetArrayItem(arr, cJSON_GetArraySize(arr) - 1);
    assert_string_equal(cJSON_GetObjectItem(in, "name")->valuestring, "inner \"quoted\" 1");
    assert_int_equal(cJSON_GetObjectItem(out, "pid")->valueint, 3);
    double its = cJSON_GetObjectItem(in, "ts")->valuedouble, ite = its + cJSON_GetObjectItem(in, "dur")->valuedouble;
    double ots = cJSON_GetObjectItem(out, "ts")->valuedouble, ote = ots + cJSON_GetObjectItem(out, "dur")->valuedouble;
    assert_true(ots <= its && ite <= ote + 1e-6); /* nested */
    cJSON_Delete(arr);
    free(doc);
    free(text);
    dt_trace_reset();
    assert_int_equal(dt_trace_count(), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_known_vectors), cmocka_unit_test(test_flops_and_mfu_by_hand),
        cmocka_unit_test(test_loss_hash),           cmocka_unit_test(test_prices),
        cmocka_unit_test(test_sweep_points),        cmocka_unit_test(test_trace_recorder),
        cmocka_unit_test(test_comm_fit),
        cmocka_unit_test(test_comm_fit_groups),
        cmocka_unit_test(test_comm_fit_every_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
