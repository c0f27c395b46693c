/* The LLaMA kernels of ops.h (RMSNorm, RoPE, SwiGLU; attention with GQA is in
 * test_attention.c; each fast kernel against the float64 reference backend for RMSNorm and
 * SwiGLU: test_backend_ops.c): RoPE against its naive double reference on every ISA path,
 * each reference backward against central finite differences of the reference
 * forward, and the bitwise claims of the kernel files: RoPE and SwiGLU give the same bits on
 * every path, RMSNorm the same bits run to run on each path. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/rope.h"
#include "ops/cpu/isa.h"
#include "ops/ops.h"
#include "ops/ops_ref.h"
#include "testutil.h"

#define FD_TOL 1e-6   /* reference backward vs finite differences (double) */

/* Bitwise comparison that names the kernel and the first differing element. */
static void assert_same_bits(const float *a, const float *b, size_t n, const char *what) {
    if (memcmp(a, b, n * sizeof(float)) == 0) return;
    size_t first = n, count = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)) != 0) {
            if (first == n) first = i;
            count++;
        }
    fail_msg("%s: %zu of %zu elements differ in their bits, first at %zu (%.9g vs %.9g)", what,
             count, n, first, first < n ? a[first] : 0.0, first < n ? b[first] : 0.0);
}

/* ---------------------------------------------------------------- rmsnorm */
typedef struct { int N, C; double eps; double *x, *w, *g, *out, *rstd; } rms_case;

static double rms_loss(void *ud) {
    rms_case *c = ud;
    dt_ref_rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->N, c->C, c->eps);
    return tu_dot(c->out, c->g, (size_t)c->N * c->C);
}

/* The fast kernel against the float64 reference backend, every shape and path:
 * tests/test_backend_ops.c. Here the reference's backward against finite differences. */
static void test_rmsnorm_reference(void **state) {
    (void)state;
    static const int shapes[][2] = {{1, 7}, {7, 13}, {5, 33}};
    for (size_t s = 0; s < 3; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t nc = (size_t)N * C;
        rms_case c = {N, C, s % 2 ? 1e-6 : 1e-5, tu_malloc(nc * 8), tu_malloc(C * 8), tu_malloc(nc * 8),
                      tu_malloc(nc * 8), tu_malloc(N * 8)};
        tu_fill_uniform_d(c.x, nc, 2.0, 1);
        tu_fill_uniform_d(c.w, C, 1.0, 2);
        for (int i = 0; i < C; i++) c.w[i] += 1.0; /* gains around 1, as trained */
        tu_fill_uniform_d(c.g, nc, 1.0, 3);
        double *rdx = tu_malloc(nc * 8), *rdw = tu_malloc(C * 8);
        printf("rmsnorm N=%d C=%d eps=%g\n", N, C, c.eps);
        rms_loss(&c);
        dt_ref_rmsnorm_backward(rdx, rdw, c.g, c.x, c.w, c.rstd, N, C);
        tu_report("ref dinp vs finite differences", tu_fd_rel_err(c.x, nc, rms_loss, &c, rdx), FD_TOL);
        tu_report("ref dw vs finite differences", tu_fd_rel_err(c.w, C, rms_loss, &c, rdw), FD_TOL);
        free(c.x); free(c.w); free(c.g); free(c.out); free(c.rstd); free(rdx); free(rdw);
    }
}

/* rmsnorm.c: row sums in a fixed lane order, dw by thread-owned channel ranges: two runs
 * on fresh buffers give the same bits (on each path; paths differ from each other). */
static void rmsnorm_run(float *res, int N, int C) {
    size_t nc = (size_t)N * C;
    float *x = tu_malloc(nc * 4), *w = tu_malloc(C * 4), *g = tu_malloc(nc * 4);
    tu_fill_uniform(x, nc, 2.0f, 71);
    tu_fill_uniform(w, C, 1.0f, 72);
    tu_fill_uniform(g, nc, 1.0f, 73);
    /* res: out (nc) | rstd (N) | dinp (nc) | dw (C) */
    float *out = res, *rstd = out + nc, *dx = rstd + N, *dw = dx + nc;
    tu_fill_uniform(dx, nc, 1.0f, 74);
    tu_fill_uniform(dw, C, 1.0f, 75);
    dt_rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    dt_rmsnorm_backward(dx, dw, g, x, w, rstd, N, C);
    free(x); free(w); free(g);
}

static void rmsnorm_determinism_cases(void) {
    const int shapes[][2] = {{64, 1003}, {3, 4096}, {1, 13}};
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t n = 2 * (size_t)N * C + N + C;
        float *a = tu_malloc(n * 4), *b = tu_malloc(n * 4);
        rmsnorm_run(a, N, C);
        rmsnorm_run(b, N, C);
        printf("rmsnorm N=%d C=%d: two runs\n", N, C);
        assert_same_bits(a, b, n, "rmsnorm run to run");
        for (size_t i = 0; i < n; i++) assert_true(isfinite(a[i]));
        free(a); free(b);
    }
}

static void test_rmsnorm_is_deterministic_per_path(void **state) {
    (void)state;
    tu_each_isa(rmsnorm_determinism_cases);
}

/* ---------------------------------------------------------------- rope */
typedef struct { int B, T, NH, NKV, hs; float theta; } rope_shape;

#define ROPE_W(s) ((size_t)((s).NH + 2 * (s).NKV) * (s).hs)   /* floats of one qkv row */
#define ROPE_N(s) ((size_t)(s).B * (s).T * ROPE_W(s))

/* The plain frequencies of shape s: the kernel's (float32, HF's) and the reference's (double). */
static float g_inv[1024];
static double g_invd[1024];
static const float *finv(rope_shape s) {
    dt_rope_inv_freq(g_inv, s.hs, s.theta);
    return g_inv;
}
static const double *dinv(rope_shape s) {
    dt_ref_rope_inv_freq(g_invd, s.hs, (double)s.theta);
    return g_invd;
}

/* hs/2 = 1, 6, 10, 17, 32, 40, 64: below, at and around every vector width, with tails;
 * GQA (NKV < NH) and MQA (NKV = 1); T = 1 (angle 0 only). */
static const rope_shape k_rope_shapes[] = {
    {1, 1, 1, 1, 2, 10000.0f},  {2, 7, 4, 4, 12, 10000.0f},  {1, 37, 6, 2, 20, 10000.0f},
    {1, 19, 3, 3, 34, 10000.0f}, {2, 33, 8, 1, 64, 500000.0f}, {1, 50, 6, 3, 80, 500000.0f},
    {2, 64, 4, 2, 128, 500000.0f}, {1, 1, 4, 1, 16, 10000.0f},
};
#define N_ROPE (sizeof k_rope_shapes / sizeof k_rope_shapes[0])

/* Tolerance against the double reference, a function of T. By design (rope.c) the kernel
 * rounds the angle t f_i to float32 as Hugging Face does; relative to the exact angle
 * (<= t) that costs: fl(2i/hs) in the exponent, e ln(theta) 2^-24 relative on f_i, at most
 * 0.37 t 2^-24 absolute on the angle (max of u e^-u); (float)pow and 1/x, 2^-24 each;
 * the product t f_i, half an ulp <= t 2^-24. |d angle| <= 3.4 t 2^-24 rad moves an output
 * pair by |d angle| |(lo, hi)|, and max|ref| >= max|x| / sqrt(2), so the relative error is
 * at most ~6.8 t 2^-24 (plus a few 2^-24 for fp32 cos/sin and the rotation): 7 (T-1) 2^-24
 * + 2e-6, 1.7e-3 at T = 4096. Measured there: 2.5e-4 (theta 5e5), 2.0e-4 (theta 1e4), and
 * 3.7e-6 at T = 64 (tol 2.8e-5). The tight check against the float32-angle definition is in
 * rope_long_cases; a sign, index or position error is O(1) and fails both. */
static double rope_tol(int T) { return 2e-6 + 7.0 * (T > 1 ? T - 1 : 0) * 0x1p-24; }

/* Every v head of every row of a equals that of b, bitwise. */
static void assert_v_untouched(const float *a, const float *b, rope_shape s, const char *what) {
    const size_t W = ROPE_W(s), v0 = (size_t)(s.NH + s.NKV) * s.hs, nv = (size_t)s.NKV * s.hs;
    for (size_t r = 0; r < (size_t)s.B * s.T; r++)
        if (memcmp(a + r * W + v0, b + r * W + v0, nv * sizeof(float)) != 0)
            fail_msg("%s: v heads of row %zu changed", what, r);
}

static void rope_check(rope_shape s, uint64_t seed) {
    const size_t n = ROPE_N(s);
    float *x = tu_malloc(n * 4), *y = tu_malloc(n * 4), *d = tu_malloc(n * 4),
          *dy = tu_malloc(n * 4);
    double *yd = tu_malloc(n * 8), *dd = tu_malloc(n * 8);
    tu_fill_uniform(x, n, 1.0f, seed);
    tu_fill_uniform(d, n, 1.0f, seed + 1);
    const double tol = rope_tol(s.T);
    printf("rope B=%d T=%d NH=%d NKV=%d hs=%d theta=%g\n", s.B, s.T, s.NH, s.NKV, s.hs,
           (double)s.theta);

    memcpy(y, x, n * 4);
    dt_rope_forward(y, s.B, s.T, s.NH, s.NKV, s.hs, finv(s), 1.0f);
    tu_to_double(yd, x, n);
    dt_ref_rope_forward(yd, s.B, s.T, s.NH, s.NKV, s.hs, dinv(s), 1.0);
    tu_report("forward", tu_rel_err(y, yd, n), tol);
    assert_v_untouched(y, x, s, "rope forward");

    memcpy(dy, d, n * 4);
    dt_rope_backward(dy, s.B, s.T, s.NH, s.NKV, s.hs, finv(s), 1.0f);
    tu_to_double(dd, d, n);
    dt_ref_rope_backward(dd, s.B, s.T, s.NH, s.NKV, s.hs, dinv(s), 1.0);
    tu_report("backward", tu_rel_err(dy, dd, n), tol);
    assert_v_untouched(dy, d, s, "rope backward");

    /* The backward undoes the forward up to fp32 rounding (same table, sin negated). */
    dt_rope_backward(y, s.B, s.T, s.NH, s.NKV, s.hs, finv(s), 1.0f);
    tu_to_double(yd, x, n);
    tu_report("backward(forward(x)) vs x", tu_rel_err(y, yd, n), 1e-6);
    free(x); free(y); free(d); free(dy); free(yd); free(dd);
}

static void rope_cases(void) {
    for (size_t k = 0; k < N_ROPE; k++) rope_check(k_rope_shapes[k], 80 + 2 * k);
}

static void test_rope(void **state) {
    (void)state;
    tu_each_isa(rope_cases);
}

/* T = 4096 (a LLaMA-3 context) with both common thetas: against the double reference at
 * rope_tol(4096), and much tighter against a double rotation by the float32 angles of
 * Hugging Face's LlamaRotaryEmbedding (the kernel's stated definition, rope.c): there only
 * the fp32 cos/sin and the rotation round: 2e-6 (measured 9.5e-8 on every path). */
static void rope_long_cases(void) {
    const float thetas[2] = {500000.0f, 10000.0f};
    for (int k = 0; k < 2; k++) {
        const rope_shape s = {1, 4096, 4, 1, 128, thetas[k]};
        rope_check(s, 90 + k);

        const size_t n = ROPE_N(s), W = ROPE_W(s);
        const int h2 = s.hs / 2;
        float *x = tu_malloc(n * 4), *inv = tu_malloc(h2 * 4);
        double *hf = tu_malloc(n * 8);
        tu_fill_uniform(x, n, 1.0f, 95 + k);
        tu_to_double(hf, x, n);
        for (int i = 0; i < h2; i++)
            inv[i] = 1.0f / (float)pow((double)s.theta, (double)((float)(2 * i) / (float)s.hs));
        for (int t = 0; t < s.T; t++)
            for (int h = 0; h < s.NH + s.NKV; h++) {
                double *r = hf + (size_t)t * W + (size_t)h * s.hs;
                for (int i = 0; i < h2; i++) {
                    const double a = (double)((float)t * inv[i]), c = cos(a), sn = sin(a);
                    const double lo = r[i], hi = r[i + h2];
                    r[i] = lo * c - hi * sn;
                    r[i + h2] = hi * c + lo * sn;
                }
            }
        dt_rope_forward(x, s.B, s.T, s.NH, s.NKV, s.hs, finv(s), 1.0f);
        tu_report("forward vs HF float32 angles", tu_rel_err(x, hf, n), 2e-6);
        free(x); free(inv); free(hf);
    }
}

static void test_rope_long_context(void **state) {
    (void)state;
    tu_each_isa(rope_long_cases);
}

typedef struct { rope_shape s; double *x, *g, *work; } rope_case;

static double rope_loss(void *ud) {
    rope_case *c = ud;
    const size_t n = ROPE_N(c->s);
    memcpy(c->work, c->x, n * 8);
    dt_ref_rope_forward(c->work, c->s.B, c->s.T, c->s.NH, c->s.NKV, c->s.hs, dinv(c->s), 1.0);
    return tu_dot(c->work, c->g, n);
}

/* The reference: backward vs finite differences (the loss covers v too: its gradient is G,
 * which the backward leaves in place), and backward(forward(x)) == x in double. */
static void test_rope_reference(void **state) {
    (void)state;
    const rope_shape fd_shapes[] = {{1, 5, 4, 2, 6, 10000.0f}, {2, 3, 3, 1, 10, 500000.0f},
                                    {1, 4, 2, 2, 4, 10000.0f}};
    for (int k = 0; k < 3; k++) {
        rope_shape s = fd_shapes[k];
        const size_t n = ROPE_N(s);
        rope_case c = {s, tu_malloc(n * 8), tu_malloc(n * 8), tu_malloc(n * 8)};
        double *dx = tu_malloc(n * 8);
        tu_fill_uniform_d(c.x, n, 1.0, 101 + k);
        tu_fill_uniform_d(c.g, n, 1.0, 111 + k);
        memcpy(dx, c.g, n * 8);
        dt_ref_rope_backward(dx, s.B, s.T, s.NH, s.NKV, s.hs, dinv(s), 1.0);
        printf("rope reference B=%d T=%d NH=%d NKV=%d hs=%d\n", s.B, s.T, s.NH, s.NKV, s.hs);
        tu_report("ref backward vs finite differences", tu_fd_rel_err(c.x, n, rope_loss, &c, dx), FD_TOL);
        free(c.x); free(c.g); free(c.work); free(dx);
    }
    const rope_shape rt_shapes[] = {{1, 4096, 4, 1, 128, 500000.0f}, {2, 37, 6, 2, 20, 10000.0f}};
    for (int k = 0; k < 2; k++) {
        rope_shape s = rt_shapes[k];
        const size_t n = ROPE_N(s);
        double *x = tu_malloc(n * 8), *y = tu_malloc(n * 8);
        tu_fill_uniform_d(x, n, 1.0, 121 + k);
        memcpy(y, x, n * 8);
        dt_ref_rope_forward(y, s.B, s.T, s.NH, s.NKV, s.hs, dinv(s), 1.0);
        double moved = tu_rel_err_dd(y, x, n); /* the forward did rotate */
        dt_ref_rope_backward(y, s.B, s.T, s.NH, s.NKV, s.hs, dinv(s), 1.0);
        printf("rope reference round trip T=%d hs=%d: forward moved x by %.2f\n", s.T, s.hs, moved);
        assert_true(moved > 0.1);
        tu_report("ref backward(forward(x)) vs x", tu_rel_err_dd(y, x, n), 1e-12);
        free(x); free(y);
    }
}

/* Scaled frequencies (model/rope.h's llama3 and yarn; yarn's cos/sin scale is not 1): the
 * kernel with the table rounded to float against the reference with the double table, at
 * the plain tolerance (scaled frequencies are smaller: so are the angles and their rounding);
 * the backward is the transposed rotation, so backward(forward(x)) = scale^2 x. */
static void rope_scaled_cases(void) {
    const dt_model_config cfgs[2] = {
        {.rope_theta = 10000.0f, .rope_scaling = DT_ROPE_LLAMA3, .rope_factor = 8.0f,
         .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f, .rope_original_context = 64},
        {.rope_theta = 10000.0f, .rope_scaling = DT_ROPE_YARN, .rope_factor = 4.0f,
         .rope_original_context = 64, .rope_beta_fast = 32.0f, .rope_beta_slow = 1.0f},
    };
    for (int k = 0; k < 2; k++) {
        const rope_shape s = {2, 300, 4, 2, 40, 10000.0f};
        const size_t n = ROPE_N(s);
        double invd[20];
        float inv[20], scale;
        const double md = dt_rope_freqs(&cfgs[k], s.hs, invd);
        dt_rope_kernel_freqs(&cfgs[k], s.hs, inv, &scale);
        printf("rope %s T=%d hs=%d: scale %.6f\n", dt_rope_scaling_names[cfgs[k].rope_scaling], s.T, s.hs, md);
        assert_true(k == 0 ? md == 1.0 : md > 1.13);
        assert_true(scale == (float)md);
        for (int i = 0; i < s.hs / 2; i++) assert_true(inv[i] == (float)invd[i]);
        float *x = tu_malloc(n * 4), *y = tu_malloc(n * 4);
        double *yd = tu_malloc(n * 8);
        tu_fill_uniform(x, n, 1.0f, 140 + k);
        memcpy(y, x, n * 4);
        dt_rope_forward(y, s.B, s.T, s.NH, s.NKV, s.hs, inv, scale);
        tu_to_double(yd, x, n);
        dt_ref_rope_forward(yd, s.B, s.T, s.NH, s.NKV, s.hs, invd, md);
        tu_report("scaled forward", tu_rel_err(y, yd, n), rope_tol(s.T));
        assert_v_untouched(y, x, s, "scaled rope forward");
        float *b = tu_malloc(n * 4);
        tu_fill_uniform(b, n, 1.0f, 150 + k);
        tu_to_double(yd, b, n);
        dt_rope_backward(b, s.B, s.T, s.NH, s.NKV, s.hs, inv, scale);
        dt_ref_rope_backward(yd, s.B, s.T, s.NH, s.NKV, s.hs, invd, md);
        tu_report("scaled backward", tu_rel_err(b, yd, n), rope_tol(s.T));
        /* backward(forward(x)) = scale^2 x on q and k, x on v */
        dt_rope_backward(y, s.B, s.T, s.NH, s.NKV, s.hs, inv, scale);
        tu_to_double(yd, x, n);
        const size_t W = ROPE_W(s), nqk = (size_t)(s.NH + s.NKV) * s.hs;
        for (size_t r = 0; r < (size_t)s.B * s.T; r++)
            for (size_t j = 0; j < nqk; j++) yd[r * W + j] *= md * md;
        tu_report("scaled backward(forward(x)) vs scale^2 x", tu_rel_err(y, yd, n), 1e-6);
        free(x); free(y); free(yd); free(b);
    }
}

static void test_rope_scaled(void **state) {
    (void)state;
    tu_each_isa(rope_scaled_cases);
}

/* ---------------------------------------------------------------- swiglu */
typedef struct { int N, F; double *x, *g, *out; } swiglu_case;

static double swiglu_loss(void *ud) {
    swiglu_case *c = ud;
    dt_ref_swiglu_forward(c->out, c->x, c->N, c->F);
    return tu_dot(c->out, c->g, (size_t)c->N * c->F);
}

/* The fast kernel against the float64 reference backend (gates up to +-120, where silu
 * saturates), every shape and path: tests/test_backend_ops.c. Here the reference's backward
 * against finite differences. */
static void test_swiglu_reference(void **state) {
    (void)state;
    static const int shapes[][3] = {{1, 1, 6}, {3, 13, 6}, {2, 7, 12}};
    for (size_t s = 0; s < 3; s++) {
        int N = shapes[s][0], F = shapes[s][1];
        size_t nf = (size_t)N * F, ni = 2 * nf;
        swiglu_case c = {N, F, tu_malloc(ni * 8), tu_malloc(nf * 8), tu_malloc(nf * 8)};
        tu_fill_uniform_d(c.x, ni, 2.0, 201);
        for (int n = 0; n < N; n++) tu_fill_uniform_d(c.x + (size_t)n * 2 * F, F, shapes[s][2], 202 + n);
        tu_fill_uniform_d(c.g, nf, 1.0, 203);
        double *rdx = tu_malloc(ni * 8);
        printf("swiglu N=%d F=%d gate scale %d\n", N, F, shapes[s][2]);
        dt_ref_swiglu_backward(rdx, c.x, c.g, N, F);
        tu_report("ref backward vs finite differences", tu_fd_rel_err(c.x, ni, swiglu_loss, &c, rdx), FD_TOL);
        free(c.x); free(c.g); free(c.out); free(rdx);
    }
}

/* ---------------------------------------------------------------- same bits on every path */
/* rope.c and swiglu.c: elementwise IEEE operations only (one FMA per rope output, the shared
 * vf_exp in swiglu), tails through the same operations, so the scalar path's output is
 * the bits of every other path. The scalar path runs first (tu_each_isa walks the paths in
 * id order) and its results are kept; later paths are compared to them. */
static float *g_first_bits;

/* Outputs of rope fwd/bwd and swiglu fwd/bwd on fixed inputs, into res (n floats). */
static size_t same_bits_run(float *res) {
    const rope_shape rs[2] = {{2, 33, 6, 2, 42, 500000.0f}, {1, 300, 4, 1, 128, 10000.0f}};
    const int sw[3][3] = {{7, 1003, 12}, {1, 5, 6}, {2, 37, 120}};
    size_t at = 0;
    for (int k = 0; k < 2; k++) {
        const rope_shape s = rs[k];
        const size_t n = ROPE_N(s);
        float *f = tu_malloc(n * 4), *b = tu_malloc(n * 4);
        tu_fill_uniform(f, n, 1.0f, 301 + k);
        tu_fill_uniform(b, n, 1.0f, 311 + k);
        dt_rope_forward(f, s.B, s.T, s.NH, s.NKV, s.hs, finv(s), 1.0f);
        dt_rope_backward(b, s.B, s.T, s.NH, s.NKV, s.hs, finv(s), 1.0f);
        if (res) memcpy(res + at, f, n * 4), memcpy(res + at + n, b, n * 4);
        at += 2 * n;
        free(f); free(b);
    }
    for (int k = 0; k < 3; k++) {
        const int N = sw[k][0], F = sw[k][1];
        const size_t nf = (size_t)N * F;
        float *x = tu_malloc(2 * nf * 4), *d = tu_malloc(nf * 4), *o = tu_malloc(nf * 4),
              *dx = tu_malloc(2 * nf * 4);
        tu_fill_uniform(x, 2 * nf, 2.0f, 321 + k);
        for (int n = 0; n < N; n++)
            tu_fill_uniform(x + (size_t)n * 2 * F, F, (float)sw[k][2], 331 + n);
        tu_fill_uniform(d, nf, 1.0f, 341 + k);
        dt_swiglu_forward(o, x, N, F);
        dt_swiglu_backward(dx, x, d, N, F);
        if (res) memcpy(res + at, o, nf * 4), memcpy(res + at + nf, dx, 2 * nf * 4);
        at += 3 * nf;
        free(x); free(d); free(o); free(dx);
    }
    return at;
}

static void same_bits_cases(void) {
    const size_t n = same_bits_run(NULL);
    float *res = tu_malloc(n * 4);
    same_bits_run(res);
    for (size_t i = 0; i < n; i++) assert_true(isfinite(res[i]));
    if (!g_first_bits) {
        assert_int_equal(dt_isa_active(), DT_ISA_SCALAR); /* the reference path */
        g_first_bits = res;
        return;
    }
    printf("  rope and swiglu: %zu values, same bits as the scalar path\n", n);
    assert_same_bits(res, g_first_bits, n, "rope/swiglu vs the scalar path");
    free(res);
}

static void test_rope_swiglu_same_bits_on_every_path(void **state) {
    (void)state;
    tu_each_isa(same_bits_cases);
    free(g_first_bits);
    g_first_bits = NULL;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_reference),
        cmocka_unit_test(test_rmsnorm_is_deterministic_per_path),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_long_context),
        cmocka_unit_test(test_rope_reference),
        cmocka_unit_test(test_rope_scaled),
        cmocka_unit_test(test_swiglu_reference),
        cmocka_unit_test(test_rope_swiglu_same_bits_on_every_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
