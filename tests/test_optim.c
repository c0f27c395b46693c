/* optim: AdamW against a hand-written double-precision step, the three LR schedules at
 * their corner steps, the deterministic sum of squares, the clipping coefficient; the
 * parallel layer's elementwise operations (ops.h dt_add_f32, dt_scale_f32) against loops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "optim/optim.h"
#include "testutil.h"

static void adamw_cases(void) {
    enum { N = 37 };
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double pd[N], md[N] = {0}, vd[N] = {0};
    tu_fill_uniform(p, N, 1.0f, 1);
    tu_to_double(pd, p, N);
    dt_adamw opt = {0.9f, 0.95f, 1e-8f, 0.1f};
    /* Two segments: decayed [0, 20), not decayed [20, 37). */
    dt_param_segment segs[2] = {{0, 20, 1}, {20, 17, 0}};
    for (int t = 1; t <= 5; t++) {
        tu_fill_uniform(g, N, 0.5f, (uint64_t)(10 + t));
        float lr = 1e-2f * (float)t;
        /* Steps 2 and 4 clip: the fused scale must equal scaling the gradient first. */
        float gs = t % 2 == 0 ? 0.5f : 1.0f;
        dt_adamw_update(&opt, p, g, m, v, segs, 2, lr, t, gs);
        for (int i = 0; i < N; i++) g[i] *= gs;
        for (int i = 0; i < N; i++) {
            double wd = i < 20 ? 0.1 : 0.0;
            pd[i] *= 1.0 - (double)lr * wd;
            md[i] = 0.9 * md[i] + 0.1 * g[i];
            vd[i] = 0.95 * vd[i] + 0.05 * (double)g[i] * g[i];
            double mh = md[i] / (1 - pow(0.9, t)), vh = sqrt(vd[i]) / sqrt(1 - pow(0.95, t));
            pd[i] -= (double)lr * mh / (vh + 1e-8);
        }
    }
    /* Normwise 1e-6, and each element to 1e-6 of itself + 1e-7: fp32 rounds each of the 5
     * updates (at most lr = 0.05 here) to ~1e-8, which near-zero parameters keep. */
    tu_assert_close("adamw 5 steps", p, pd, N, 1e-6, 1e-7);
}

static void test_adamw_matches_definition(void **state) {
    (void)state;
    tu_each_isa(adamw_cases);
}

/* AdamW by age (Top-K's sparse sums, parallel.compression_adam: age) against the rule in
 * double: over 12 steps element i receives a gradient only every (i % 4) + 1 steps (zeros in
 * between, as Top-K leaves them), so ages 1..4 and the catch-up of a steps are exercised; the
 * ages are exact counts. Then every element receiving every step: dt_adamw_update's result. */
static void test_adamw_aged_matches_definition(void **state) {
    (void)state;
    enum { N = 41 };
    float p[N], g[N], m[N], v[N], age[N], p2[N], m2[N], v2[N];
    double pd[N], md[N], vd[N], ad[N];
    tu_fill_uniform(p, N, 1.0f, 3);
    tu_fill_uniform(m, N, 0.01f, 4);
    tu_fill_uniform(v, N, 0.01f, 5);
    for (int i = 0; i < N; i++) v[i] = v[i] * v[i], age[i] = 1.0f;
    tu_to_double(pd, p, N);
    tu_to_double(md, m, N);
    tu_to_double(vd, v, N);
    tu_to_double(ad, age, N);
    dt_adamw opt = {0.9f, 0.95f, 1e-8f, 0.1f};
    dt_param_segment segs[2] = {{0, 25, 1}, {25, 16, 0}};
    for (int t = 51; t <= 62; t++) {
        tu_fill_uniform(g, N, 0.5f, (uint64_t)(100 + t));
        for (int i = 0; i < N; i++)
            if (t % (i % 4 + 1)) g[i] = i % 2 ? -0.0f : 0.0f; /* nothing arrived */
        float lr = 2e-3f, gs = t % 3 == 0 ? 0.5f : 1.0f;
        dt_adamw_update_aged(&opt, p, g, m, v, age, segs, 2, lr, t, gs);
        for (int i = 0; i < N; i++) {
            double x = (double)g[i] * gs, shrink = 1.0 - (double)lr * (i < 25 ? 0.1 : 0.0);
            pd[i] *= shrink;
            if (x == 0.0) {
                ad[i] += 1;
                continue;
            }
            double a = ad[i], d1 = pow(0.9, a), d2 = pow(0.95, a);
            md[i] = d1 * md[i] + (1 - d1) * x / a;
            vd[i] = d2 * vd[i] + (1 - d2) * x * x / a;
            double mh = md[i] / (1 - pow(0.9, t)), vh = sqrt(vd[i]) / sqrt(1 - pow(0.95, t));
            pd[i] -= a * (double)lr * mh / (vh + 1e-8);
            ad[i] = 1;
        }
        for (int i = 0; i < N; i++) assert_true(age[i] == (float)ad[i]);
    }
    /* atols as in adamw_cases: fp32 rounding of 12 updates of at most age 4 x lr 2e-3
     * (params); of m's terms, (1 - beta1) g / age with |g| <= 0.5 (~3e-9 each); of v's,
     * (1 - beta2) g^2 / age (~1e-10 each), which elements near zero keep. */
    printf("adamw by age, 12 sparse steps:\n");
    tu_assert_close("params", p, pd, N, 1e-6, 1e-7);
    tu_assert_close("m", m, md, N, 1e-5, 1e-8);
    tu_assert_close("v", v, vd, N, 1e-5, 1e-9);
    /* every element receives: ages stay 1 and the result is the dense rule's */
    memcpy(p2, p, sizeof p);
    memcpy(m2, m, sizeof m);
    memcpy(v2, v, sizeof v);
    for (int i = 0; i < N; i++) age[i] = 1.0f;
    tu_fill_uniform(g, N, 0.5f, 999);
    for (int i = 0; i < N; i++) g[i] += g[i] >= 0 ? 0.01f : -0.01f; /* no zero */
    dt_adamw_update_aged(&opt, p, g, m, v, age, segs, 2, 1e-3f, 70, 0.8f);
    dt_adamw_update(&opt, p2, g, m2, v2, segs, 2, 1e-3f, 70, 0.8f);
    for (int i = 0; i < N; i++) assert_true(age[i] == 1.0f);
    /* Element by element (a NaN anywhere fails: fmax, used here before, dropped it): rtol
     * 1e-6 with atols of 1e-12 (params near zero) and 1e-18 (m near zero), the bounds this
     * check had; the two rules give the same bits here. */
    double p2d[N], m2d[N];
    tu_to_double(p2d, p2, N);
    tu_to_double(m2d, m2, N);
    printf("adamw by age with every age 1 vs dt_adamw_update:\n");
    tu_assert_close("params", p, p2d, N, 1e-6, 1e-12);
    tu_assert_close("m", m, m2d, N, 1e-6, 1e-18);
}

/* AdamW and the sum of squares give the same bits on every kernel path: DDP ranks on CPUs
 * with different paths keep identical weights (the clip coefficient comes from the sum). */
#define XP_N 100003
static float *g_first;    /* the first path's params, m, v after 3 steps */
static double g_first_ss[4];

static void cross_path_cases(void) {
    float *p = tu_malloc(3 * XP_N * 4), *g = tu_malloc(XP_N * 4);
    float *m = p + XP_N, *v = p + 2 * XP_N;
    tu_fill_uniform(p, XP_N, 1.0f, 7);
    dt_adamw opt = {0.9f, 0.95f, 1e-8f, 0.1f};
    dt_param_segment segs[2] = {{0, 50001, 1}, {50001, XP_N - 50001, 0}};
    for (int t = 1; t <= 3; t++) {
        tu_fill_uniform(g, XP_N, 0.01f, (uint64_t)(20 + t));
        dt_adamw_update(&opt, p, g, m, v, segs, 2, 3e-3f, t, t == 2 ? 0.7f : 1.0f);
    }
    const size_t lens[4] = {1, 7, 8, XP_N};
    double ss[4];
    for (int k = 0; k < 4; k++) ss[k] = dt_sumsq(g, lens[k]);
    if (!g_first) {
        g_first = tu_malloc(3 * XP_N * 4);
        memcpy(g_first, p, 3 * XP_N * 4);
        memcpy(g_first_ss, ss, sizeof ss);
    } else {
        assert_memory_equal(p, g_first, 3 * XP_N * 4);
        assert_memory_equal(ss, g_first_ss, sizeof ss);
    }
    free(p);
    free(g);
}

static void test_adamw_and_sumsq_same_bits_on_every_path(void **state) {
    (void)state;
    tu_each_isa(cross_path_cases);
    free(g_first);
    g_first = NULL;
}

static void test_schedules(void **state) {
    (void)state;
    dt_lr_schedule c = {DT_SCHED_CONSTANT, 1e-3f, 1e-4f, 10, 100};
    assert_true(dt_lr_at(&c, 0) == 1e-3f && dt_lr_at(&c, 500) == 1e-3f);
    dt_lr_schedule s = {DT_SCHED_COSINE, 1e-3f, 1e-4f, 10, 110};
    assert_true(fabsf(dt_lr_at(&s, 0) - 1e-4f) < 1e-9f);   /* (0+1)/10 of peak */
    assert_true(fabsf(dt_lr_at(&s, 9) - 1e-3f) < 1e-9f);   /* end of warm-up */
    assert_true(fabsf(dt_lr_at(&s, 10) - 1e-3f) < 1e-9f);  /* cosine starts at peak */
    assert_true(fabsf(dt_lr_at(&s, 60) - 5.5e-4f) < 1e-8f); /* half way: mean of peak and min */
    assert_true(dt_lr_at(&s, 110) == 1e-4f && dt_lr_at(&s, 1000) == 1e-4f);
    dt_lr_schedule l = {DT_SCHED_LINEAR, 1e-3f, 0.0f, 0, 100};
    assert_true(fabsf(dt_lr_at(&l, 0) - 1e-3f) < 1e-9f);
    assert_true(fabsf(dt_lr_at(&l, 25) - 7.5e-4f) < 1e-8f);
    for (long k = 1; k < 100; k++) assert_true(dt_lr_at(&l, k) < dt_lr_at(&l, k - 1));
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_sched_kind kind;
    assert_int_equal(dt_lr_schedule_parse(&ctx, "linear", &kind), DT_OK);
    assert_int_equal(kind, DT_SCHED_LINEAR);
    assert_int_equal(dt_lr_schedule_parse(&ctx, "cosin", &kind), DT_ERR_CONFIG);
}

static void sumsq_cases(void) {
    size_t n = 1000003; /* several chunks and a ragged end */
    float *x = tu_malloc(n * sizeof(float));
    tu_fill_uniform(x, n, 1.0f, 3);
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    double a = dt_sumsq(x, n), b = dt_sumsq(x, n);
    assert_true(a == b);
    assert_true(fabs(a - ref) / ref < 1e-12);
    assert_true(dt_clip_coef(0.5, 1.0f) == 1.0f);
    assert_true(fabsf(dt_clip_coef(4.0, 1.0f) - 0.25f) < 1e-6f);
    assert_true(dt_clip_coef(1e9, 0.0f) == 1.0f); /* disabled */
    for (size_t i = 0; i < n; i++) x[i] *= 0.5f;
    assert_true(fabs(dt_sumsq(x, n) - ref / 4) / ref < 1e-12);
    free(x);
}

static void test_sumsq_and_clip(void **state) {
    (void)state;
    tu_each_isa(sumsq_cases);
}

static void test_loss_scaler(void **state) {
    (void)state;
    /* Dynamic: an overflow skips and halves; `interval` finite steps in a row double; an
     * overflow restarts the count. */
    dt_loss_scaler s;
    dt_loss_scaler_init(&s, 65536.0f, 1, 3);
    assert_int_equal(dt_loss_scaler_update(&s, 1), 0);
    assert_int_equal(dt_loss_scaler_update(&s, 1), 0);
    assert_true(s.scale == 65536.0f && s.good == 2);
    assert_int_equal(dt_loss_scaler_update(&s, 0), 1); /* overflow: skip + back off */
    assert_true(s.scale == 32768.0f && s.good == 0 && s.overflows == 1);
    for (int i = 0; i < 2; i++) assert_int_equal(dt_loss_scaler_update(&s, 1), 0);
    assert_true(s.scale == 32768.0f); /* 2 of 3: not yet */
    assert_int_equal(dt_loss_scaler_update(&s, 1), 0);
    assert_true(s.scale == 65536.0f && s.good == 0); /* the growth interval */
    /* Bounded both ways. */
    for (int i = 0; i < 200; i++) dt_loss_scaler_update(&s, 0);
    assert_true(s.scale == DT_LOSS_SCALE_MIN && s.overflows == 201);
    dt_loss_scaler_init(&s, DT_LOSS_SCALE_MAX, 1, 1);
    dt_loss_scaler_update(&s, 1);
    assert_true(s.scale == DT_LOSS_SCALE_MAX);
    /* Static: never changes, overflows still skip. */
    dt_loss_scaler_init(&s, 128.0f, 0, 1);
    assert_int_equal(dt_loss_scaler_update(&s, 0), 1);
    assert_int_equal(dt_loss_scaler_update(&s, 1), 0);
    assert_true(s.scale == 128.0f && s.overflows == 1);
}

/* a += x and x *= f, as the loops they replace in parallel/ (gradient accumulation, the
 * Top-K residual's rescale): the same bits, a ragged length, n = 0 touching nothing. */
static void test_add_scale_match_loops(void **state) {
    (void)state;
    enum { N = 100003 };
    float *a = tu_malloc(N * 4), *b = tu_malloc(N * 4), *x = tu_malloc(N * 4);
    tu_fill_uniform(a, N, 3.0f, 11);
    tu_fill_uniform(x, N, 1e-3f, 12);
    memcpy(b, a, N * 4);
    dt_add_f32(b, x, N);
    for (size_t i = 0; i < N; i++) a[i] += x[i];
    assert_memory_equal(a, b, N * 4);
    dt_scale_f32(b, 0.3f, N);
    for (size_t i = 0; i < N; i++) a[i] *= 0.3f;
    assert_memory_equal(a, b, N * 4);
    for (size_t i = 0; i < N; i++) assert_true(isfinite(b[i]) && b[i] != 0.0f);
    b[0] = 7.0f;
    dt_add_f32(b, x, 0);
    dt_scale_f32(b, 0.5f, 0);
    assert_true(b[0] == 7.0f);
    free(a);
    free(b);
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_matches_definition),
        cmocka_unit_test(test_adamw_aged_matches_definition),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_sumsq_and_clip),
        cmocka_unit_test(test_loss_scaler),
        cmocka_unit_test(test_adamw_and_sumsq_same_bits_on_every_path),
        cmocka_unit_test(test_add_scale_match_loops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
