/* Kernels of ops.h beside the op-case list: every fast kernel against the float64 reference
 * backend is tests/test_backend_ops.c (every shape, dtype and ISA path); here each naive
 * double reference backward against central finite differences of the reference forward, and
 * the properties that list does not check (bit-identical chunked embedding calls and in-place
 * cross-entropy, the vectorised exp's accuracy and its same bits on every path, determinism
 * per path). Attention is in test_attention.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "ops/ops_ref.h"
#include "testutil.h"

#define FD_TOL 1e-6   /* reference backward vs finite differences (double) */

/* ---------------------------------------------------------------- layernorm */
typedef struct { int N, C; double *x, *w, *b, *g, *out, *mean, *rstd; } ln_case;

static double ln_loss(void *ud) {
    ln_case *c = ud;
    dt_ref_layernorm_forward(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C);
    return tu_dot(c->out, c->g, (size_t)c->N * c->C);
}

static void test_layernorm_reference(void **state) {
    (void)state;
    int shapes[][2] = {{7, 13}, {5, 33}};
    for (int s = 0; s < 2; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t nc = (size_t)N * C;
        ln_case c = {N, C, tu_malloc(nc * 8), tu_malloc(C * 8), tu_malloc(C * 8),
                     tu_malloc(nc * 8), tu_malloc(nc * 8), tu_malloc(N * 8), tu_malloc(N * 8)};
        tu_fill_uniform_d(c.x, nc, 2.0, 1);
        for (size_t i = 0; i < nc; i++) c.x[i] += 3.0; /* an offset tests the variance pass */
        tu_fill_uniform_d(c.w, C, 1.0, 2);
        tu_fill_uniform_d(c.b, C, 1.0, 3);
        tu_fill_uniform_d(c.g, nc, 1.0, 4);
        double *rdx = tu_malloc(nc * 8), *rdw = tu_malloc(C * 8), *rdb = tu_malloc(C * 8);
        printf("layernorm N=%d C=%d\n", N, C);
        ln_loss(&c);
        dt_ref_layernorm_backward(rdx, rdw, rdb, c.g, c.x, c.w, c.mean, c.rstd, N, C);
        tu_report("ref dinp vs finite differences", tu_fd_rel_err(c.x, nc, ln_loss, &c, rdx), FD_TOL);
        tu_report("ref dw vs finite differences", tu_fd_rel_err(c.w, C, ln_loss, &c, rdw), FD_TOL);
        tu_report("ref db vs finite differences", tu_fd_rel_err(c.b, C, ln_loss, &c, rdb), FD_TOL);
        free(c.x); free(c.w); free(c.b); free(c.g); free(c.out); free(c.mean); free(c.rstd);
        free(rdx); free(rdw); free(rdb);
    }
}

/* ---------------------------------------------------------------- matmul */
typedef struct { int N, C, OC; double *x, *w, *bias, *g, *out; } mm_case;

static double mm_loss(void *ud) {
    mm_case *c = ud;
    dt_ref_matmul_forward(c->out, c->x, c->w, c->bias, c->N, c->C, c->OC);
    return tu_dot(c->out, c->g, (size_t)c->N * c->OC);
}

static void test_matmul_reference(void **state) {
    (void)state;
    int N = 5, C = 7, OC = 3;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    mm_case c = {N, C, OC, tu_malloc(nx * 8), tu_malloc(nw * 8), tu_malloc(OC * 8),
                 tu_malloc(no * 8), tu_malloc(no * 8)};
    tu_fill_uniform_d(c.x, nx, 1.0, 11);
    tu_fill_uniform_d(c.w, nw, 0.5, 12);
    tu_fill_uniform_d(c.bias, OC, 1.0, 13);
    tu_fill_uniform_d(c.g, no, 1.0, 14);
    double *rdx = tu_malloc(nx * 8), *rdw = tu_malloc(nw * 8), *rdb = tu_malloc(OC * 8);
    printf("matmul N=%d C=%d OC=%d\n", N, C, OC);
    mm_loss(&c);
    dt_ref_matmul_backward(rdx, rdw, rdb, c.g, c.x, c.w, N, C, OC);
    tu_report("ref dinp vs finite differences", tu_fd_rel_err(c.x, nx, mm_loss, &c, rdx), FD_TOL);
    tu_report("ref dw vs finite differences", tu_fd_rel_err(c.w, nw, mm_loss, &c, rdw), FD_TOL);
    tu_report("ref dbias vs finite differences", tu_fd_rel_err(c.bias, OC, mm_loss, &c, rdb), FD_TOL);
    free(c.x); free(c.w); free(c.bias); free(c.g); free(c.out); free(rdx); free(rdw); free(rdb);
}

/* ---------------------------------------------------------------- gelu */
typedef struct { int N; double *x, *g, *out; } gelu_case;

static double gelu_loss(void *ud) {
    gelu_case *c = ud;
    dt_ref_gelu_forward(c->out, c->x, c->N);
    return tu_dot(c->out, c->g, c->N);
}

static void test_gelu_reference(void **state) {
    (void)state;
    int N = 17;
    gelu_case c = {N, tu_malloc(N * 8), tu_malloc(N * 8), tu_malloc(N * 8)};
    tu_fill_uniform_d(c.x, N, 6.0, 21); /* covers the saturated tails */
    tu_fill_uniform_d(c.g, N, 1.0, 22);
    double *rdx = tu_malloc(N * 8);
    printf("gelu N=%d\n", N);
    dt_ref_gelu_backward(rdx, c.x, c.g, N);
    tu_report("ref backward vs finite differences", tu_fd_rel_err(c.x, N, gelu_loss, &c, rdx), FD_TOL);
    free(c.x); free(c.g); free(c.out); free(rdx);
}

/* ---------------------------------------------------------------- encoder */
typedef struct { int B, T, C; const int32_t *tok; double *wte, *wpe, *g, *out; } enc_case;

static double enc_loss(void *ud) {
    enc_case *c = ud;
    dt_ref_encoder_forward(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return tu_dot(c->out, c->g, (size_t)c->B * c->T * c->C);
}

enum { ENC_B = 3, ENC_T = 9, ENC_C = 21, ENC_V = 11 };

static void test_encoder_reference(void **state) {
    (void)state;
    int B = ENC_B, T = ENC_T, C = ENC_C, V = ENC_V;
    size_t n = (size_t)B * T * C;
    int32_t tok[ENC_B * ENC_T];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 7) % V; /* repeated tokens exercise the scatter */
    enc_case c = {B, T, C, tok, tu_malloc(V * C * 8), tu_malloc(T * C * 8), tu_malloc(n * 8), tu_malloc(n * 8)};
    tu_fill_uniform_d(c.wte, V * C, 1.0, 31);
    tu_fill_uniform_d(c.wpe, T * C, 1.0, 32);
    tu_fill_uniform_d(c.g, n, 1.0, 33);
    double *rdwte = tu_malloc(V * C * 8), *rdwpe = tu_malloc(T * C * 8);
    printf("encoder B=%d T=%d C=%d V=%d\n", B, T, C, V);
    dt_ref_encoder_backward(rdwte, rdwpe, c.g, tok, B, T, C);
    tu_report("ref dwte vs finite differences", tu_fd_rel_err(c.wte, V * C, enc_loss, &c, rdwte), FD_TOL);
    tu_report("ref dwpe vs finite differences", tu_fd_rel_err(c.wpe, T * C, enc_loss, &c, rdwpe), FD_TOL);
    free(c.wte); free(c.wpe); free(c.g); free(c.out); free(rdwte); free(rdwpe);
}

/* Vocabulary chunks (ZeRO-3 gathers the embedding chunk by chunk): rows [0,4), [4,8), [8,V)
 * called one by one give the bits of one call over all rows, on every path. */
static void encoder_chunk_cases(void) {
    int B = ENC_B, T = ENC_T, C = ENC_C, V = ENC_V;
    size_t n = (size_t)B * T * C;
    int32_t tok[ENC_B * ENC_T];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 7) % V;
    float *wte = tu_malloc(V * C * 4), *g = tu_malloc(n * 4), *out = tu_malloc(n * 4),
          *dwte = tu_malloc(V * C * 4), *out2 = tu_malloc(n * 4), *dwte2 = tu_malloc(V * C * 4);
    tu_fill_uniform(wte, V * C, 1.0f, 31);
    tu_fill_uniform(g, n, 1.0f, 33);
    dt_encoder_forward(out, tok, wte, 0, V, B * T, C);
    dt_encoder_backward(dwte, 0, V, g, tok, B * T, C);
    for (int r0 = 0; r0 < V; r0 += 4) {
        int rows = V - r0 < 4 ? V - r0 : 4;
        dt_encoder_forward(out2, tok, wte + (size_t)r0 * C, r0, rows, B * T, C);
        dt_encoder_backward(dwte2 + (size_t)r0 * C, r0, rows, g, tok, B * T, C);
    }
    assert_memory_equal(out2, out, n * 4);
    assert_memory_equal(dwte2, dwte, (size_t)V * C * 4);
    printf("  chunked rows: same bits as one call\n");
    free(wte); free(g); free(out); free(dwte); free(out2); free(dwte2);
}

static void test_encoder_chunks(void **state) {
    (void)state;
    tu_each_isa(encoder_chunk_cases);
}

/* ---------------------------------------------------------------- cross-entropy */
typedef struct { int N, V, Vp; const int32_t *tgt; double *x, *loss, *lse, dloss; } ce_case;

static double ce_loss(void *ud) {
    ce_case *c = ud;
    dt_ref_crossentropy_forward(c->loss, c->lse, c->x, c->tgt, c->N, c->V, c->Vp);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += c->loss[n];
    return s * c->dloss;
}

static void test_crossentropy_reference(void **state) {
    (void)state;
    int N = 4, V = 10, Vp = 16;
    size_t n = (size_t)N * Vp;
    int32_t tgt[4];
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)((i * 7919L + 3) % V);
    ce_case c = {N, V, Vp, tgt, tu_malloc(n * 8), tu_malloc(N * 8), tu_malloc(N * 8), 0.37};
    tu_fill_uniform_d(c.x, n, 8.0, 51);
    double *rdx = tu_malloc(n * 8);
    printf("crossentropy N=%d V=%d Vp=%d\n", N, V, Vp);
    ce_loss(&c);
    dt_ref_crossentropy_backward(rdx, c.x, c.lse, tgt, c.dloss, N, V, Vp);
    tu_report("ref backward vs finite differences", tu_fd_rel_err(c.x, n, ce_loss, &c, rdx), FD_TOL);
    free(c.x); free(c.loss); free(c.lse); free(rdx);
}

/* dlogits written over the logits (in place) are the bits of the out-of-place call. */
static void crossentropy_inplace_cases(void) {
    int N = 5, V = 33, Vp = 40;
    size_t n = (size_t)N * Vp;
    int32_t tgt[5] = {3, -1, 32, 0, 7};
    float *x = tu_malloc(n * 4), *loss = tu_malloc(N * 4), *lse = tu_malloc(N * 4), *dx = tu_malloc(n * 4);
    tu_fill_uniform(x, n, 8.0f, 52);
    dt_crossentropy_forward(loss, lse, x, tgt, N, V, Vp);
    dt_crossentropy_backward(dx, x, lse, tgt, 0.37f, N, V, Vp);
    dt_crossentropy_backward(x, x, lse, tgt, 0.37f, N, V, Vp);
    assert_memory_equal(x, dx, n * 4);
    free(x); free(loss); free(lse); free(dx);
}

static void test_crossentropy_inplace(void **state) {
    (void)state;
    tu_each_isa(crossentropy_inplace_cases);
}

/* The vectorised exp against libm over the range softmax and GELU use, on every path; the
 * elementwise values are the same bits on every path (the sums differ only in order). */
#define VEXP_N 200001
static float *g_exp_first; /* the first path's values */

static void vexp_cases(void) {
    int n = VEXP_N;
    float *x = tu_malloc(n * 4), *y = tu_malloc(n * 4);
    for (int i = 0; i < n; i++) x[i] = -87.0f + 175.0f * (float)i / (float)(n - 1);
    dt_exp_sum(y, x, 0.0f, n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double r = exp((double)x[i]);
        worst = tu_worse(worst, fabs(y[i] - r) / r);
    }
    printf("vexp max rel err %.3e over [-87, 88]\n", worst);
    assert_true(worst < 5e-7);
    if (!g_exp_first) {
        g_exp_first = tu_malloc(n * 4);
        memcpy(g_exp_first, y, n * 4);
    } else {
        assert_memory_equal(y, g_exp_first, n * 4); /* same bits as the first path */
    }
    /* The returned sum, on a softmax-like range; odd lengths exercise the tails. */
    for (int m = 1; m <= 1001; m += 100) {
        double ref_sum = 0;
        for (int i = 0; i < m; i++) {
            x[i] = -10.0f + 12.0f * (float)i / (float)(m > 1 ? m - 1 : 1);
            ref_sum += exp((double)x[i] - 2.0);
        }
        float sum = dt_exp_sum(NULL, x, 2.0f, m);
        assert_true(fabs(sum - ref_sum) / ref_sum < 1e-6);
    }
    float neg[5] = {-INFINITY, -100.0f, -88.0f, NAN, 0.0f};
    assert_true(dt_exp_sum(neg, neg, 0.0f, 5) == 1.0f);
    assert_true(neg[0] == 0.0f && neg[1] == 0.0f && neg[2] == 0.0f && neg[3] == 0.0f &&
                neg[4] == 1.0f);
    free(x); free(y);
}

static void test_vexp_accuracy(void **state) {
    (void)state;
    tu_each_isa(vexp_cases);
    free(g_exp_first);
    g_exp_first = NULL;
}

/* Same path + same thread count => the same bits: every kernel of ops.h run twice on
 * fresh outputs (attention: test_attention.c). */
static void run_all_kernels(float *out, size_t nout, int N, int C) {
    /* out holds, in order: ln out, mean, rstd, dinp, dw, db, gelu, dgelu, ce losses, lse,
     * dlogits, dwte, dwpe, dbias. Inputs are fixed by seed. */
    const int V = 257, Vp = 264, T = N / 2;
    size_t nc = (size_t)N * C, nv = (size_t)N * Vp;
    float *x = tu_malloc(nc * 4), *w = tu_malloc(C * 4), *g = tu_malloc(nc * 4);
    float *logits = tu_malloc(nv * 4);
    int32_t *tok = tu_malloc(N * 4);
    tu_fill_uniform(x, nc, 2.0f, 61);
    tu_fill_uniform(w, C, 1.0f, 62);
    tu_fill_uniform(g, nc, 1.0f, 63);
    tu_fill_uniform(logits, nv, 5.0f, 64);
    for (int i = 0; i < N; i++) tok[i] = (i * 31) % V;
    memset(out, 0, nout * 4);
    float *o = out;
    float *ln = o, *mean = (o += nc), *rstd = (o += N), *dinp = (o += N), *dw = (o += nc);
    float *db = (o += C), *ge = (o += C), *dge = (o += nc), *loss = (o += nc), *lse = (o += N);
    float *dlog = (o += N), *dwte = (o += nv), *dwpe = (o += (size_t)V * C), *dbias = (o += (size_t)T * C);
    assert_true((size_t)(dbias + C - out) <= nout);
    dt_layernorm_forward(ln, mean, rstd, x, w, w, N, C);
    dt_layernorm_backward(dinp, dw, db, g, x, w, mean, rstd, N, C);
    dt_gelu_forward(ge, x, (int)nc);
    dt_gelu_backward(dge, x, g, (int)nc);
    dt_crossentropy_forward(loss, lse, logits, tok, N, V, Vp);
    dt_crossentropy_backward(dlog, logits, lse, tok, 0.5f, N, V, Vp);
    dt_encoder_backward(dwte, 0, V, g, tok, 2 * T, C);
    dt_pos_backward(dwpe, g, 2, T, C);
    float *mw = tu_malloc((size_t)C * C * 4); /* the GEMM part is oneDNN's: not compared */
    dt_matmul_backward(NULL, mw, dbias, g, x, x, N, C, C);
    free(mw);
    free(x); free(w); free(g); free(logits); free(tok);
}

static void determinism_cases(void) {
    const int N = 64, C = 100;
    size_t nout = (size_t)N * C * 6 + (size_t)N * 264 + (size_t)257 * C + (size_t)N * 4 + 8 * C;
    float *a = tu_malloc(nout * 4), *b = tu_malloc(nout * 4);
    run_all_kernels(a, nout, N, C);
    run_all_kernels(b, nout, N, C);
    assert_memory_equal(a, b, nout * 4);
    for (size_t i = 0; i < nout; i++) assert_true(isfinite(a[i]));
    free(a); free(b);
}

static void test_kernels_are_deterministic_per_path(void **state) {
    (void)state;
    tu_each_isa(determinism_cases);
}

/* The error helper itself: a NaN anywhere (even followed by finite values) or an Inf is an
 * infinite error, so no comparison can pass on non-finite output. */
static void test_error_helper_sees_nan(void **state) {
    (void)state;
    float a[3] = {1.5f, NAN, 1.0f};
    double b[3] = {1, 1, 1};
    assert_true(isinf(tu_rel_err(a, b, 3)));
    a[1] = INFINITY;
    assert_true(isinf(tu_rel_err(a, b, 3)));
    a[1] = 1.0f;
    assert_true(fabs(tu_rel_err(a, b, 3) - 0.5) < 1e-12);
    b[2] = NAN;
    assert_true(isinf(tu_rel_err(a, b, 3)));
    assert_true(isinf(tu_worse(0.1, NAN)) && isinf(tu_worse(NAN, 0.1)));
    assert_true(tu_worse(0.1, 0.2) == 0.2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vexp_accuracy),          cmocka_unit_test(test_encoder_reference),
        cmocka_unit_test(test_encoder_chunks),         cmocka_unit_test(test_layernorm_reference),
        cmocka_unit_test(test_matmul_reference),       cmocka_unit_test(test_gelu_reference),
        cmocka_unit_test(test_crossentropy_reference), cmocka_unit_test(test_crossentropy_inplace),
        cmocka_unit_test(test_kernels_are_deterministic_per_path),
        cmocka_unit_test(test_error_helper_sees_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
