/* One list of operation cases for every backend (docs/BACKENDS.md), after ggml's
 * test-backend-ops: each case of k_cases (an operation of the dt_backend table, a shape with
 * odd sizes among them, a dtype, a variant flag, its tolerances) runs on the float64
 * reference backend "ref" once and on every other registered backend (the CPU backend on
 * every ISA path this CPU supports), from the same deterministic inputs, and each output is
 * compared with the reference's: elementwise |got - ref| <= atol + rtol |ref| and normwise
 * max |got - ref| / max |ref| <= rtol (tests/testutil.h tu_compare: NaN or Inf fails), or
 * bit for bit where the tolerances are 0 0 (conversions, copies, NF4 bytes). A failure names
 * the operation, its shape, dtype, variant, backend and path.
 *
 * Every operation of the table has an entry in k_ops (a compile-time count ties it to
 * backend.h: an operation added there without one stops this file compiling) and at least one
 * case (test_every_op_has_a_case). Adding a case is one line of k_cases; adding an
 * operation is one k_ops entry, one runner and its lines.
 *
 * Inputs and outputs live in the backend's memory (be->mem) and move through be->copy, so a
 * device backend is tested as it is registered. Gradient checks of the references against
 * finite differences stay in test_ops*.c, test_attention.c and test_nf4.c. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/backend.h"
#include "ops/cpu/isa.h"
#include "testutil.h"

/* ---------------------------------------------------------------- the operations */
typedef struct { const char *name; size_t off; } op_slot;
#define SLOT(m) {#m, offsetof(dt_backend, m)}
static const op_slot k_ops[] = {
    SLOT(encoder_forward), SLOT(encoder_backward), SLOT(pos_forward), SLOT(pos_backward),
    SLOT(layernorm_forward), SLOT(layernorm_backward), SLOT(matmul_forward), SLOT(matmul_backward),
    SLOT(matmul_forward_ld), SLOT(matmul_backward_ld), SLOT(attention_forward), SLOT(attention_backward),
    SLOT(rmsnorm_forward), SLOT(rmsnorm_backward), SLOT(rope_forward), SLOT(rope_backward),
    SLOT(swiglu_forward), SLOT(swiglu_backward), SLOT(gelu_forward), SLOT(gelu_backward),
    SLOT(residual_forward), SLOT(crossentropy_forward), SLOT(crossentropy_backward), SLOT(exp_sum),
    SLOT(f32_to_bf16), SLOT(bf16_to_f32), SLOT(f32_to_f16), SLOT(f16_to_f32), SLOT(count_nonfinite_f32),
    SLOT(matmul_forward_lp), SLOT(matmul_backward_lp), SLOT(matmul_forward_ld_lp), SLOT(matmul_backward_ld_lp),
    SLOT(matmul_forward_nf4), SLOT(matmul_backward_nf4), SLOT(matmul_forward_nf4_lp), SLOT(matmul_backward_nf4_lp),
    SLOT(nf4_quantize), SLOT(nf4_dequantize), SLOT(matmul_peak_gflops), SLOT(matmul_peak_gflops_lp),
    SLOT(lowp_gemm_native), SLOT(matmul_lowp_cache_clear), SLOT(nf4_panel_bytes), SLOT(ops_serial_thread),
};
#define N_OPS (sizeof k_ops / sizeof k_ops[0])
/* Every member after `sync` is an operation (a function pointer): their number is fixed by
 * the struct's size. */
#define FIRST_OP offsetof(dt_backend, encoder_forward)
_Static_assert((sizeof(dt_backend) - FIRST_OP) / sizeof(void (*)(void)) == N_OPS,
               "dt_backend (src/ops/backend.h) has an operation without an entry in k_ops of "
               "tests/test_backend_ops.c: add it there and give it cases in k_cases");

/* ---------------------------------------------------------------- cases */
typedef struct op_case op_case;
typedef struct run run;
typedef void (*run_fn)(run *r);

struct op_case {
    const char *op;    /* the dt_backend member */
    run_fn fn;         /* builds the inputs, calls the operation, names the outputs */
    const char *dims;  /* the names of d[] for messages, comma separated */
    int d[6];
    dt_dtype dt;       /* the operand type where the op takes one */
    int flag;          /* the variant: F_* below, meaning per runner */
    double rtol, atol; /* 0 0: bit for bit */
};

enum { F_BIAS = 1, F_ACC = 2, F_CAUSAL = 4, F_INPLACE = 8, F_NODINP = 16, F_NODW = 32, F_MASK = 64, F_SCALE = 128, F_NOY = 256,
       F_NAN = 512, F_EPS6 = 1024 };

/* One run of a case on one backend: its buffers (the backend's memory) and outputs. */
enum { MAX_BUF = 24, MAX_OUT = 6 };
typedef struct { const char *name; const void *dev; size_t bytes; int elem; double rtol, atol; } out_spec;
struct run {
    const op_case *c;
    const dt_backend *be;
    void *buf[MAX_BUF];
    size_t bytes[MAX_BUF];
    int nbuf;
    out_spec out[MAX_OUT];
    int nout;
    char err[256]; /* a property a query operation broke */
};

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* bytes of the backend's memory holding a copy of host (NULL: zeroed). */
static void *put(run *r, const void *host, size_t bytes) {
    assert_true(r->nbuf < MAX_BUF);
    void *p = r->be->mem->alloc(bytes ? bytes : 1);
    assert_non_null(p);
    if (host) r->be->copy(p, host, bytes);
    else r->be->fill(p, 0, bytes);
    r->buf[r->nbuf] = p, r->bytes[r->nbuf++] = bytes ? bytes : 1;
    return p;
}
/* n floats ~ U(-scale, scale) + shift, deterministic in (seed, i). */
static float *uni(run *r, size_t n, float scale, float shift, uint64_t seed) {
    float *h = tu_malloc(n * 4 + 4);
    tu_fill_uniform(h, n, scale, seed);
    for (size_t i = 0; i < n; i++) h[i] += shift;
    float *p = put(r, h, n * 4);
    free(h);
    return p;
}
/* n floats of one value: a sentinel in outputs that are overwritten (an element left
 * unwritten stays 1e6 and fails the comparison). */
static float *val(run *r, size_t n, float v) {
    float *h = tu_malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) h[i] = v;
    float *p = put(r, h, n * 4);
    free(h);
    return p;
}
/* n values ~ U(-scale, scale) rounded to dt (bf16 / fp16), by the reference's exact narrowing. */
static uint16_t *uni_lp(run *r, dt_dtype dt, size_t n, float scale, uint64_t seed) {
    float *h = tu_malloc(n * 4 + 4);
    uint16_t *l = tu_malloc(n * 2 + 2);
    tu_fill_uniform(h, n, scale, seed);
    if (dt == DT_BF16) dt_backend_ref.f32_to_bf16(l, h, n);
    else dt_backend_ref.f32_to_f16(l, h, n);
    uint16_t *p = put(r, l, n * 2);
    free(h), free(l);
    return p;
}
/* n random 32-bit patterns (every 4th one an edge: +-0, +-Inf, NaNs, subnormals, ties). */
static float *bits32(run *r, size_t n, uint64_t seed) {
    static const uint32_t edge[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00001, 0xffa00000,
                                    0x7f800001, 0x00000001, 0x00008000, 0x00018000, 0x3f808000, 0x3f818000,
                                    0x33000000, 0x33c00000, 0x387fe000, 0x477ff000, 0x477fefff, 0x7f7fffff};
    uint32_t *u = tu_malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) u[i] = i % 4 == 3 ? edge[(i / 4) % (sizeof edge / 4)] : (uint32_t)splitmix(&seed);
    float *p = put(r, u, n * 4);
    free(u);
    return p;
}
static int32_t *ints(run *r, const int32_t *h, size_t n) { return put(r, h, n * 4); }

/* Names an output: n elements of `elem` bytes (4: float, compared with the case's
 * tolerances unless it is exact; 2: uint16, always bit for bit; 1: bytes, bit for bit). */
static void out_t(run *r, const char *name, const void *dev, size_t n, int elem, double rtol, double atol) {
    assert_true(r->nout < MAX_OUT);
    r->out[r->nout++] = (out_spec){name, dev, n * elem, elem, rtol, atol};
}
static void out(run *r, const char *name, const void *dev, size_t n) { out_t(r, name, dev, n, 4, r->c->rtol, r->c->atol); }
static void out_exact(run *r, const char *name, const void *dev, size_t n, int elem) { out_t(r, name, dev, n, elem, 0, 0); }
/* A scalar result (a returned value) as an output. */
static void out_scalar(run *r, const char *name, double v, int exact) {
    float f = (float)v;
    float *p = put(r, &f, 4);
    out_t(r, name, p, 1, 4, exact ? 0 : r->c->rtol, exact ? 0 : r->c->atol);
}

#define D(i) (r->c->d[i])
#define FL(f) (r->c->flag & (f))
#define BE (r->be)

/* ---------------------------------------------------------------- runners, by family
 * Each builds the same inputs from the case alone (so every backend sees them), calls the
 * operation on r->be, and names its outputs. Saved activations a backward takes come from the
 * reference backend's forward. */

/* N, C, V, row0, rows: tokens (n 7 + 3) % V, the chunk [row0, row0 + rows) of the table. */
static int32_t *tokens(run *r, int N, int V) {
    int32_t *t = tu_malloc(N * 4 + 4);
    for (int n = 0; n < N; n++) t[n] = (n * 7 + 3) % V;
    int32_t *p = ints(r, t, N);
    free(t);
    return p;
}
static void run_encoder(run *r) {
    int N = D(0), C = D(1), V = D(2), row0 = D(3), rows = D(4);
    int32_t *tok = tokens(r, N, V);
    if (!strcmp(r->c->op, "encoder_forward")) {
        float *o = val(r, (size_t)N * C, 1e6f), *wte = uni(r, (size_t)rows * C, 1, 0, 31);
        BE->encoder_forward(o, tok, wte, row0, rows, N, C);
        out(r, "out", o, (size_t)N * C);
    } else {
        float *dw = uni(r, (size_t)rows * C, 1, 0, 32), *g = uni(r, (size_t)N * C, 1, 0, 33);
        BE->encoder_backward(dw, row0, rows, g, tok, N, C);
        out(r, "dwte (accumulated)", dw, (size_t)rows * C);
    }
}
/* B, T, C */
static void run_pos(run *r) {
    int B = D(0), T = D(1), C = D(2);
    size_t n = (size_t)B * T * C;
    if (!strcmp(r->c->op, "pos_forward")) {
        float *o = uni(r, n, 1, 0, 34), *wpe = uni(r, (size_t)T * C, 1, 0, 35);
        BE->pos_forward(o, wpe, B, T, C);
        out(r, "out (accumulated)", o, n);
    } else {
        float *dw = uni(r, (size_t)T * C, 1, 0, 36), *g = uni(r, n, 1, 0, 37);
        BE->pos_backward(dw, g, B, T, C);
        out(r, "dwpe (accumulated)", dw, (size_t)T * C);
    }
}
/* N, C: inputs U(-2,2) + 3 (an offset tests the variance pass) */
static void run_layernorm(run *r) {
    int N = D(0), C = D(1);
    size_t nc = (size_t)N * C;
    float *x = uni(r, nc, 2, 3, 1), *w = uni(r, C, 1, 0, 2), *b = uni(r, C, 1, 0, 3);
    float *o = val(r, nc, 1e6f), *m = val(r, N, 1e6f), *s = val(r, N, 1e6f);
    if (!strcmp(r->c->op, "layernorm_forward")) {
        BE->layernorm_forward(o, m, s, x, w, b, N, C);
        out(r, "out", o, nc), out(r, "mean", m, N), out(r, "rstd", s, N);
        return;
    }
    dt_backend_ref.layernorm_forward(o, m, s, x, w, b, N, C);
    float *g = uni(r, nc, 1, 0, 4), *dx = uni(r, nc, 1, 0, 5), *dw = uni(r, C, 1, 0, 6), *db = uni(r, C, 1, 0, 7);
    BE->layernorm_backward(dx, dw, db, g, x, w, m, s, N, C);
    out(r, "dinp (accumulated)", dx, nc), out(r, "dw (accumulated)", dw, C), out(r, "db (accumulated)", db, C);
}
/* N, C: gains around 1 (as trained); eps 1e-5 (LLaMA 1/2) or, F_EPS6, 1e-6 (LLaMA 3). */
static void run_rmsnorm(run *r) {
    int N = D(0), C = D(1);
    size_t nc = (size_t)N * C;
    const float eps = FL(F_EPS6) ? 1e-6f : 1e-5f;
    float *x = uni(r, nc, 2, 0.5f, 1), *w = uni(r, C, 1, 1, 2), *o = val(r, nc, 1e6f), *s = val(r, N, 1e6f);
    if (!strcmp(r->c->op, "rmsnorm_forward")) {
        BE->rmsnorm_forward(o, s, x, w, N, C, eps);
        out(r, "out", o, nc), out(r, "rstd", s, N);
        return;
    }
    dt_backend_ref.rmsnorm_forward(o, s, x, w, N, C, eps);
    float *g = uni(r, nc, 1, 0, 4), *dx = uni(r, nc, 1, 0, 5), *dw = uni(r, C, 1, 0, 6);
    BE->rmsnorm_backward(dx, dw, g, x, w, s, N, C);
    out(r, "dinp (accumulated)", dx, nc), out(r, "dw (accumulated)", dw, C);
}

/* N, C, OC (, ld for the _ld variants: out / dout rows of that stride, the block at column
 * ld - OC). F_BIAS: a bias; F_ACC: dinp accumulates; F_NODINP / F_NODW: that one skipped. */
static void run_matmul(run *r) {
    int N = D(0), C = D(1), OC = D(2), ld = D(3) ? D(3) : OC, off = ld - OC;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * ld;
    /* matmul_lowp_cache_clear's case: the cache cleared (run_query), then forward_lp */
    const char *op = !strcmp(r->c->op, "matmul_lowp_cache_clear") ? "matmul_forward_lp" : r->c->op;
    int lp = strstr(op, "_lp") != NULL, fwd = strstr(op, "forward") != NULL, isld = strstr(op, "_ld") != NULL;
    dt_dtype dt = r->c->dt;
    float *x = uni(r, nx, 1, 0, 11), *w = uni(r, nw, 0.5f, 0, 12), *bias = FL(F_BIAS) ? uni(r, OC, 1, 0, 13) : NULL;
    uint16_t *xl = lp ? uni_lp(r, dt, nx, 1, 11) : NULL, *wl = lp ? uni_lp(r, dt, nw, 0.5f, 12) : NULL;
    if (fwd) {
        float *o = val(r, no, 1e6f);
        if (!isld && !lp) BE->matmul_forward(o, x, w, bias, N, C, OC);
        else if (!isld) BE->matmul_forward_lp(dt, o, xl, wl, bias, N, C, OC);
        else if (!lp) BE->matmul_forward_ld(o + off, ld, x, w, N, C, OC);
        else BE->matmul_forward_ld_lp(dt, o + off, ld, xl, wl, N, C, OC);
        out(r, "out", o, no);
        return;
    }
    float *g = uni(r, no, 1, 0, 14), *dx = FL(F_NODINP) ? NULL : FL(F_ACC) ? uni(r, nx, 1, 0, 15) : val(r, nx, 1e6f);
    float *dw = FL(F_NODW) ? NULL : uni(r, nw, 1, 0, 16), *db = FL(F_BIAS) ? uni(r, OC, 1, 0, 17) : NULL;
    uint16_t *gl = lp ? uni_lp(r, dt, no, 1, 14) : NULL, *scratch = lp ? put(r, NULL, no * 2) : NULL;
    if (!isld && !lp) BE->matmul_backward(dx, dw, db, g, x, w, N, C, OC);
    else if (!isld) BE->matmul_backward_lp(dt, dx, dw, db, g, scratch, xl, wl, N, C, OC);
    else if (!lp) BE->matmul_backward_ld(dx, FL(F_ACC) != 0, dw, g + off, ld, x, w, N, C, OC);
    else BE->matmul_backward_ld_lp(dt, dx, FL(F_ACC) != 0, dw, gl + off, ld, xl, wl, N, C, OC);
    if (dx) out(r, FL(F_ACC) ? "dinp (accumulated)" : "dinp", dx, nx);
    if (dw) out(r, "dw (accumulated)", dw, nw);
    if (db) out(r, "dbias (accumulated)", db, OC);
    if (scratch) out_exact(r, "dout_lp (the narrowed dout)", scratch, no, 2);
}

/* N, C, OC: the weight quantized on the host by the reference, copied into the backend. */
static dt_nf4 nf4_weight(run *r, size_t n, uint64_t seed) {
    float *w = tu_malloc(n * 4 + 4);
    tu_fill_uniform(w, n, 0.5f, seed);
    void *h = tu_malloc(dt_nf4_bytes(n));
    dt_nf4 t;
    dt_nf4_bind(&t, h, n);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_backend_ref.nf4_quantize(&ctx, "w", &t, w, n), DT_OK);
    dt_nf4_bind(&t, put(r, h, dt_nf4_bytes(n)), n);
    free(w), free(h);
    return t;
}
static void run_nf4_matmul(run *r) {
    int N = D(0), C = D(1), OC = D(2);
    size_t nx = (size_t)N * C, no = (size_t)N * OC;
    dt_dtype dt = r->c->dt;
    int lp = strstr(r->c->op, "_lp") != NULL;
    dt_nf4 t = nf4_weight(r, (size_t)OC * C, 21);
    if (strstr(r->c->op, "forward") || !strcmp(r->c->op, "nf4_panel_bytes")) {
        float *o = val(r, no, 1e6f), *bias = FL(F_BIAS) ? uni(r, OC, 1, 0, 23) : NULL;
        if (lp) BE->matmul_forward_nf4_lp(dt, o, uni_lp(r, dt, nx, 1, 22), &t, bias, N, C, OC);
        else BE->matmul_forward_nf4(o, uni(r, nx, 1, 0, 22), &t, bias, N, C, OC);
        out(r, "out", o, no);
        if (!strcmp(r->c->op, "nf4_panel_bytes")) { /* the panels stay bounded */
            size_t pb = BE->nf4_panel_bytes(), cap = DT_NF4_PANEL * 6 + (size_t)C * 6 + (size_t)OC * 6;
            if (pb > cap) snprintf(r->err, sizeof r->err, "nf4_panel_bytes %zu > %zu", pb, cap);
        }
        return;
    }
    float *dx = FL(F_ACC) ? uni(r, nx, 1, 0, 25) : val(r, nx, 1e6f);
    if (lp) BE->matmul_backward_nf4_lp(dt, dx, FL(F_ACC) != 0, uni_lp(r, dt, no, 1, 24), &t, N, C, OC);
    else BE->matmul_backward_nf4(dx, FL(F_ACC) != 0, uni(r, no, 1, 0, 24), &t, N, C, OC);
    out(r, FL(F_ACC) ? "dinp (accumulated)" : "dinp", dx, nx);
}
/* n (, i0, count for dequantize); F_NAN: a NaN in the weight, refused. */
static void run_nf4(run *r) {
    size_t n = (size_t)D(0);
    if (!strcmp(r->c->op, "nf4_dequantize")) {
        dt_nf4 t = nf4_weight(r, n, 26);
        float *o = val(r, (size_t)D(2), 1e6f);
        BE->nf4_dequantize(o, &t, (size_t)D(1), (size_t)D(2));
        out(r, "out", o, (size_t)D(2));
        return;
    }
    float *w = uni(r, n, 0.5f, 0, 27);
    if (FL(F_NAN)) {
        float nan = NAN;
        BE->copy(w + n / 3, &nan, 4);
    }
    void *buf = put(r, NULL, dt_nf4_bytes(n));
    dt_nf4 t;
    dt_nf4_bind(&t, buf, n);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_status st = BE->nf4_quantize(&ctx, "w", &t, w, n);
    out_scalar(r, "status", st, 1);
    if (st == DT_OK) out_exact(r, "quantized bytes", buf, dt_nf4_bytes(n), 1);
}

/* B, T, NH, NKV, hs; dt: the operand type; F_CAUSAL. */
static void run_attention(run *r) {
    int B = D(0), T = D(1), NH = D(2), NKV = D(3), hs = D(4), causal = FL(F_CAUSAL) != 0;
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * hs, no = (size_t)B * T * NH * hs, nl = (size_t)B * NH * T;
    float *qkv = uni(r, nq, 1.5f, 0, 61), *o = val(r, no, 1e6f), *lse = val(r, nl, 1e6f);
    if (!strcmp(r->c->op, "attention_forward")) {
        BE->attention_forward(o, lse, qkv, B, T, NH, NKV, hs, causal, r->c->dt);
        out(r, "out", o, no), out(r, "lse", lse, nl);
        return;
    }
    dt_backend_ref.attention_forward(o, lse, qkv, B, T, NH, NKV, hs, causal, r->c->dt);
    float *g = uni(r, no, 1, 0, 62), *dq = val(r, nq, 1e6f);
    BE->attention_backward(dq, g, qkv, o, lse, B, T, NH, NKV, hs, causal, r->c->dt);
    out(r, "dqkv", dq, nq);
}
/* B, T, NH, NKV, hs; F_SCALE: YaRN's attention factor 1.25. */
static void run_rope(run *r) {
    int B = D(0), T = D(1), NH = D(2), NKV = D(3), hs = D(4);
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * hs;
    float inv[256];
    dt_rope_inv_freq(inv, hs, 10000.0f);
    float *x = uni(r, nq, 1, 0, 63), *f = put(r, inv, (size_t)hs / 2 * 4);
    if (!strcmp(r->c->op, "rope_forward")) BE->rope_forward(x, B, T, NH, NKV, hs, f, FL(F_SCALE) ? 1.25f : 1.0f);
    else BE->rope_backward(x, B, T, NH, NKV, hs, f, FL(F_SCALE) ? 1.25f : 1.0f);
    out(r, "qkv (in place)", x, nq);
}
/* N, F, gate: the gate halves ~ U(-gate, gate) (120: exp(-g) overflows or underflows in fp32
 * and silu saturates), the up halves U(-2, 2). */
static void run_swiglu(run *r) {
    int N = D(0), F = D(1);
    float *h = tu_malloc((size_t)N * 2 * F * 4);
    tu_fill_uniform(h, (size_t)N * 2 * F, 2, 64);
    for (int n = 0; n < N; n++) tu_fill_uniform(h + (size_t)n * 2 * F, F, (float)D(2), 66 + n);
    float *x = put(r, h, (size_t)N * 2 * F * 4);
    free(h);
    if (!strcmp(r->c->op, "swiglu_forward")) {
        float *o = val(r, (size_t)N * F, 1e6f);
        BE->swiglu_forward(o, x, N, F);
        out(r, "out", o, (size_t)N * F);
    } else {
        float *dx = val(r, (size_t)N * 2 * F, 1e6f);
        BE->swiglu_backward(dx, x, uni(r, (size_t)N * F, 1, 0, 65), N, F);
        out(r, "dinp", dx, (size_t)N * 2 * F);
    }
}
/* N: inputs U(-6, 6) (the saturated tails); F_INPLACE: dinp aliases dout. */
static void run_gelu(run *r) {
    int N = D(0);
    float *x = uni(r, N, 6, 0, 21), *o = val(r, N, 1e6f);
    if (!strcmp(r->c->op, "gelu_forward")) {
        BE->gelu_forward(o, x, N);
        out(r, "out", o, N);
    } else {
        float *g = uni(r, N, 1, 0, 22), *dx = FL(F_INPLACE) ? g : o;
        BE->gelu_backward(dx, x, g, N);
        out(r, FL(F_INPLACE) ? "dinp (in dout)" : "dinp", dx, N);
    }
}
/* N; F_INPLACE: out is a. */
static void run_residual(run *r) {
    int N = D(0);
    float *a = uni(r, N, 1, 0, 41), *b = uni(r, N, 1, 0, 42), *o = FL(F_INPLACE) ? a : val(r, N, 1e6f);
    BE->residual_forward(o, a, b, N);
    out(r, "out", o, N);
}
/* N, V, Vp: logits U(-8, 8), the padding 1e4 (must be ignored); F_MASK: every 3rd target -1;
 * F_INPLACE: dlogits is logits. */
static void run_crossentropy(run *r) {
    int N = D(0), V = D(1), Vp = D(2);
    size_t n = (size_t)N * Vp;
    int32_t *th = tu_malloc(N * 4 + 4);
    for (int i = 0; i < N; i++) th[i] = FL(F_MASK) && i % 3 == 1 ? -1 : (int32_t)((i * 7919L + 3) % V);
    int32_t *tgt = ints(r, th, N);
    free(th);
    float *h = tu_malloc(n * 4);
    tu_fill_uniform(h, n, 8, 51);
    for (int i = 0; i < N; i++)
        for (int v = V; v < Vp; v++) h[(size_t)i * Vp + v] = 1e4f;
    float *x = put(r, h, n * 4), *loss = val(r, N, 1e6f), *lse = val(r, N, 1e6f);
    free(h);
    if (!strcmp(r->c->op, "crossentropy_forward")) {
        BE->crossentropy_forward(loss, lse, x, tgt, N, V, Vp);
        out(r, "losses", loss, N), out(r, "lse", lse, N);
        return;
    }
    dt_backend_ref.crossentropy_forward(loss, lse, x, tgt, N, V, Vp);
    float *dx = FL(F_INPLACE) ? x : val(r, n, 1e6f);
    BE->crossentropy_backward(dx, x, lse, tgt, 0.37f, N, V, Vp);
    out(r, "dlogits", dx, n);
}
/* n: x from -100 to 10 (below -87.3 the kernels flush to 0: within atol), shift 2.5;
 * F_NOY: y NULL. */
static void run_exp_sum(run *r) {
    int n = D(0);
    float *h = tu_malloc(n * 4 + 4);
    for (int i = 0; i < n; i++) h[i] = -100.0f + 110.0f * (float)i / (float)(n > 1 ? n - 1 : 1);
    float *x = put(r, h, n * 4), *y = FL(F_NOY) ? NULL : val(r, n, 1e6f);
    free(h);
    double s = BE->exp_sum(y, x, 2.5f, n);
    if (y) out(r, "y", y, n);
    out_scalar(r, "sum", s, 0);
}
/* n; the narrowing from random bit patterns and edges, the widening from every pattern
 * (n = 65536) or the first n. */
static void run_convert(run *r) {
    size_t n = (size_t)D(0);
    const char *op = r->c->op;
    if (!strcmp(op, "count_nonfinite_f32")) {
        out_scalar(r, "count", (double)BE->count_nonfinite_f32(bits32(r, n, 71), n), 1);
    } else if (!strncmp(op, "f32_to", 6)) {
        float *x = bits32(r, n, 72);
        uint16_t *y = put(r, NULL, n * 2);
        if (!strcmp(op, "f32_to_bf16")) BE->f32_to_bf16(y, x, n);
        else BE->f32_to_f16(y, x, n);
        out_exact(r, "out", y, n, 2);
    } else {
        uint16_t *hh = tu_malloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) hh[i] = (uint16_t)(i * 40503u);
        uint16_t *x = put(r, hh, n * 2);
        float *y = val(r, n, 1e6f);
        free(hh);
        if (!strcmp(op, "bf16_to_f32")) BE->bf16_to_f32(y, x, n);
        else BE->f16_to_f32(y, x, n);
        out_exact(r, "out", y, n, 4);
    }
}

/* ops_serial_thread: a thread marked serial converts n (above the threaded size) to the bits
 * of the reference. Under qemu-user (no pthread_create) the marked thread is this one. */
typedef struct { run *r; } serial_arg;
static void *serial_body(void *p) {
    run *r = ((serial_arg *)p)->r;
    r->be->ops_serial_thread();
    size_t n = (size_t)D(0);
    float *x = bits32(r, n, 73);
    uint16_t *y = put(r, NULL, n * 4);
    r->be->f32_to_bf16(y, x, n);
    r->be->f32_to_f16(y + n, x, n);
    return NULL;
}
static void run_serial(run *r) {
    serial_arg a = {r};
#ifdef DT_TEST_QEMU
    serial_body(&a);
#else
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, serial_body, &a), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
#endif
    out_exact(r, "bf16 | fp16 out", r->buf[r->nbuf - 1], (size_t)D(0) * 2, 2);
}

/* The queries: no result to compare but properties every backend keeps, and for the cache a
 * 16-bit GEMM run after clearing it. */
static void run_query(run *r) {
    const char *op = r->c->op;
    if (!strcmp(op, "matmul_lowp_cache_clear")) {
        BE->matmul_lowp_cache_clear();
        run_matmul(r); /* the case is shaped as matmul_forward_lp's */
        return;
    }
    if (!strcmp(op, "lowp_gemm_native")) {
        int v = BE->lowp_gemm_native(r->c->dt);
        if (v != 0 && v != 1) snprintf(r->err, sizeof r->err, "lowp_gemm_native %d: not 0 or 1", v);
        return;
    }
    double best = -1;
    double med = !strcmp(op, "matmul_peak_gflops") ? BE->matmul_peak_gflops(D(0), 3, &best)
                                                   : BE->matmul_peak_gflops_lp(r->c->dt, D(0), 3, &best);
    if (!(med > 0 && isfinite(best) && best >= med))
        snprintf(r->err, sizeof r->err, "%s(%d): median %g, best %g: want 0 < median <= best", op, D(0), med, best);
}

/* ---------------------------------------------------------------- the list
 * Tolerances: fp32 results of long sums get rtol and atol ~1e-5 (the fp32 accumulation over
 * K terms of magnitude ~1, and the scalar path's serial sum of 50257 exponentials); elementwise
 * maps ~1e-6 (3e-6 for GELU's derivative of an fp32 tanh); copies, conversions and NF4 bytes are
 * bit for bit (0 0). 16-bit operands do not loosen the GEMMs (their products are exact in
 * fp32); 16-bit attention does (the kernels round the probabilities too, which the reference
 * does not model). */
#define E(op, fn, dims, ...) {op, fn, dims, __VA_ARGS__}
static const op_case k_cases[] = {
    E("encoder_forward", run_encoder, "N,C,V,row0,rows", {27, 21, 11, 0, 11}, DT_F32, 0, 0, 0),
    E("encoder_forward", run_encoder, "N,C,V,row0,rows", {64, 67, 50, 16, 9}, DT_F32, 0, 0, 0),
    E("encoder_backward", run_encoder, "N,C,V,row0,rows", {27, 21, 11, 0, 11}, DT_F32, 0, 1e-6, 1e-6),
    E("encoder_backward", run_encoder, "N,C,V,row0,rows", {64, 67, 50, 16, 9}, DT_F32, 0, 1e-6, 1e-6),
    E("pos_forward", run_pos, "B,T,C", {3, 9, 21}, DT_F32, 0, 0, 0),
    E("pos_backward", run_pos, "B,T,C", {3, 9, 21}, DT_F32, 0, 1e-6, 1e-6),
    E("pos_backward", run_pos, "B,T,C", {5, 33, 100}, DT_F32, 0, 1e-6, 1e-6),
    E("layernorm_forward", run_layernorm, "N,C", {7, 13}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_forward", run_layernorm, "N,C", {64, 768}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_forward", run_layernorm, "N,C", {33, 100}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_backward", run_layernorm, "N,C", {7, 13}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_backward", run_layernorm, "N,C", {64, 768}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_backward", run_layernorm, "N,C", {33, 100}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {1, 7}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {1, 4096}, DT_F32, F_EPS6, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {33, 100}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {64, 768}, DT_F32, F_EPS6, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {5, 1003}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_backward", run_rmsnorm, "N,C", {1, 7}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_backward", run_rmsnorm, "N,C", {7, 13}, DT_F32, F_EPS6, 1e-5, 1e-5),
    E("rmsnorm_backward", run_rmsnorm, "N,C", {64, 768}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_backward", run_rmsnorm, "N,C", {5, 1003}, DT_F32, F_EPS6, 1e-5, 1e-5),
    E("matmul_forward", run_matmul, "N,C,OC", {5, 7, 3}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward", run_matmul, "N,C,OC", {64, 96, 288}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward", run_matmul, "N,C,OC", {37, 50, 130}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward", run_matmul, "N,C,OC", {5, 7, 3}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_backward", run_matmul, "N,C,OC", {64, 96, 288}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_backward", run_matmul, "N,C,OC", {37, 50, 130}, DT_F32, F_NODINP, 1e-5, 1e-5),
    E("matmul_forward_ld", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_forward_ld", run_matmul, "N,C,OC,ld", {5, 7, 3, 3}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward_ld", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward_ld", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F32, F_ACC, 1e-5, 1e-5),
    E("matmul_backward_ld", run_matmul, "N,C,OC,ld", {64, 96, 100, 288}, DT_F32, F_ACC | F_NODW, 1e-5, 1e-5),
    E("matmul_backward_ld", run_matmul, "N,C,OC,ld", {64, 96, 100, 288}, DT_F32, F_NODINP, 1e-5, 1e-5),
    E("matmul_forward_lp", run_matmul, "N,C,OC", {7, 13, 5}, DT_BF16, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward_lp", run_matmul, "N,C,OC", {64, 96, 288}, DT_BF16, 0, 1e-5, 1e-5),
    E("matmul_forward_lp", run_matmul, "N,C,OC", {37, 50, 130}, DT_F16, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward_lp", run_matmul, "N,C,OC", {1, 1, 1}, DT_F16, 0, 1e-5, 1e-5),
    E("matmul_backward_lp", run_matmul, "N,C,OC", {7, 13, 5}, DT_BF16, F_BIAS, 1e-5, 1e-5),
    E("matmul_backward_lp", run_matmul, "N,C,OC", {130, 200, 70}, DT_BF16, 0, 1e-5, 1e-5),
    E("matmul_backward_lp", run_matmul, "N,C,OC", {37, 50, 130}, DT_F16, F_BIAS, 1e-5, 1e-5),
    E("matmul_backward_lp", run_matmul, "N,C,OC", {37, 50, 130}, DT_F16, F_NODINP | F_NODW, 1e-5, 1e-5),
    E("matmul_forward_ld_lp", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_BF16, 0, 1e-5, 1e-5),
    E("matmul_forward_ld_lp", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F16, 0, 1e-5, 1e-5),
    E("matmul_backward_ld_lp", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_BF16, F_ACC, 1e-5, 1e-5),
    E("matmul_backward_ld_lp", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F16, 0, 1e-5, 1e-5),
    E("matmul_backward_ld_lp", run_matmul, "N,C,OC,ld", {64, 96, 100, 288}, DT_BF16, F_NODINP, 1e-5, 1e-5),
    E("matmul_forward_nf4", run_nf4_matmul, "N,C,OC", {7, 13, 5}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward_nf4", run_nf4_matmul, "N,C,OC", {5, 4097, 600}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward_nf4", run_nf4_matmul, "N,C,OC", {33, 200, 70}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward_nf4", run_nf4_matmul, "N,C,OC", {5, 4097, 600}, DT_F32, F_ACC, 1e-5, 1e-5),
    E("matmul_forward_nf4_lp", run_nf4_matmul, "N,C,OC", {33, 200, 70}, DT_BF16, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward_nf4_lp", run_nf4_matmul, "N,C,OC", {4, 64, 3}, DT_F16, 0, 1e-5, 1e-5),
    E("matmul_backward_nf4_lp", run_nf4_matmul, "N,C,OC", {33, 200, 70}, DT_BF16, F_ACC, 1e-5, 1e-5),
    E("matmul_backward_nf4_lp", run_nf4_matmul, "N,C,OC", {7, 13, 5}, DT_F16, 0, 1e-5, 1e-5),
    E("nf4_quantize", run_nf4, "n", {64 * 256 * 2 + 77}, DT_F32, 0, 0, 0),
    E("nf4_quantize", run_nf4, "n", {13}, DT_F32, 0, 0, 0),
    E("nf4_quantize", run_nf4, "n", {1000}, DT_F32, F_NAN, 0, 0),
    E("nf4_dequantize", run_nf4, "n,i0,count", {64 * 256 * 5 + 77, 0, 64 * 256 * 5 + 77}, DT_F32, 0, 0, 0),
    E("nf4_dequantize", run_nf4, "n,i0,count", {1000, 13, 501}, DT_F32, 0, 0, 0),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {2, 29, 3, 3, 8}, DT_F32, F_CAUSAL, 1e-5, 1e-5),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {1, 100, 4, 2, 16}, DT_F32, F_CAUSAL, 1e-5, 1e-5),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {2, 17, 4, 1, 2}, DT_F32, 0, 1e-5, 1e-5),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {1, 70, 4, 4, 12}, DT_F32, 0, 1e-5, 1e-5),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {2, 29, 3, 3, 8}, DT_BF16, F_CAUSAL, 4e-3, 4e-3),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {1, 70, 4, 2, 16}, DT_F16, 0, 1e-3, 1e-3),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {2, 29, 3, 3, 8}, DT_F32, F_CAUSAL, 1e-4, 1e-5),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {1, 100, 4, 2, 16}, DT_F32, F_CAUSAL, 1e-4, 1e-5),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {2, 17, 4, 1, 2}, DT_F32, 0, 1e-4, 1e-5),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {2, 29, 3, 3, 8}, DT_BF16, F_CAUSAL, 5e-3, 5e-3),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {1, 70, 4, 2, 16}, DT_F16, 0, 1e-3, 1e-3),
    E("rope_forward", run_rope, "B,T,NH,NKV,hs", {2, 37, 4, 2, 16}, DT_F32, 0, 1e-5, 1e-5),
    E("rope_forward", run_rope, "B,T,NH,NKV,hs", {1, 9, 3, 1, 6}, DT_F32, F_SCALE, 1e-5, 1e-5),
    E("rope_backward", run_rope, "B,T,NH,NKV,hs", {2, 37, 4, 2, 16}, DT_F32, 0, 1e-5, 1e-5),
    E("rope_backward", run_rope, "B,T,NH,NKV,hs", {1, 9, 3, 1, 6}, DT_F32, F_SCALE, 1e-5, 1e-5),
    E("swiglu_forward", run_swiglu, "N,F,gate", {1, 1, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_forward", run_swiglu, "N,F,gate", {3, 13, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_forward", run_swiglu, "N,F,gate", {5, 2731, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_forward", run_swiglu, "N,F,gate", {2, 37, 120}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_backward", run_swiglu, "N,F,gate", {1, 7, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_backward", run_swiglu, "N,F,gate", {64, 1000, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_backward", run_swiglu, "N,F,gate", {2, 37, 120}, DT_F32, 0, 1e-6, 1e-6),
    E("gelu_forward", run_gelu, "N", {1}, DT_F32, 0, 1e-6, 1e-6),
    E("gelu_forward", run_gelu, "N", {100003}, DT_F32, 0, 1e-6, 1e-6),
    E("gelu_backward", run_gelu, "N", {17}, DT_F32, 0, 3e-6, 3e-6),
    E("gelu_backward", run_gelu, "N", {100003}, DT_F32, F_INPLACE, 3e-6, 3e-6),
    E("residual_forward", run_residual, "N", {1001}, DT_F32, 0, 0, 0),
    E("residual_forward", run_residual, "N", {1001}, DT_F32, F_INPLACE, 0, 0),
    E("crossentropy_forward", run_crossentropy, "N,V,Vp", {4, 10, 16}, DT_F32, 0, 1e-5, 1e-5),
    E("crossentropy_forward", run_crossentropy, "N,V,Vp", {8, 50257, 50304}, DT_F32, F_MASK, 1e-5, 1e-5),
    E("crossentropy_backward", run_crossentropy, "N,V,Vp", {5, 33, 33}, DT_F32, F_MASK, 1e-6, 1e-7),
    E("crossentropy_backward", run_crossentropy, "N,V,Vp", {8, 50257, 50304}, DT_F32, F_INPLACE, 1e-6, 1e-7),
    E("exp_sum", run_exp_sum, "n", {1}, DT_F32, 0, 1e-6, 1e-30),
    E("exp_sum", run_exp_sum, "n", {1001}, DT_F32, 0, 1e-6, 1e-30),
    E("exp_sum", run_exp_sum, "n", {50257}, DT_F32, F_NOY, 1e-6, 1e-30),
    E("f32_to_bf16", run_convert, "n", {100003}, DT_BF16, 0, 0, 0),
    E("f32_to_f16", run_convert, "n", {100003}, DT_F16, 0, 0, 0),
    E("f32_to_bf16", run_convert, "n", {7}, DT_BF16, 0, 0, 0),
    E("bf16_to_f32", run_convert, "n", {65536}, DT_BF16, 0, 0, 0),
    E("f16_to_f32", run_convert, "n", {65536}, DT_F16, 0, 0, 0),
    E("f16_to_f32", run_convert, "n", {1001}, DT_F16, 0, 0, 0),
    E("count_nonfinite_f32", run_convert, "n", {100003}, DT_F32, 0, 0, 0),
    E("count_nonfinite_f32", run_convert, "n", {17}, DT_F32, 0, 0, 0),
    E("ops_serial_thread", run_serial, "n", {(1 << 20) + 37}, DT_F32, 0, 0, 0),
    E("matmul_lowp_cache_clear", run_query, "N,C,OC", {37, 50, 130}, DT_BF16, 0, 1e-5, 1e-5),
    E("nf4_panel_bytes", run_nf4_matmul, "N,C,OC", {5, 4097, 600}, DT_F32, 0, 1e-5, 1e-5),
    E("lowp_gemm_native", run_query, "-", {0}, DT_BF16, 0, 0, 0),
    E("lowp_gemm_native", run_query, "-", {0}, DT_F16, 0, 0, 0),
    E("matmul_peak_gflops", run_query, "n", {64}, DT_F32, 0, 0, 0),
    E("matmul_peak_gflops_lp", run_query, "n", {64}, DT_BF16, 0, 0, 0),
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

/* ---------------------------------------------------------------- the driver */

static const char *dt_str(dt_dtype dt) { return dt == DT_F32 ? "fp32" : dt_dtype_name(dt); }

/* "matmul_forward N=7 C=13 OC=5 fp32 [bias]" */
static void case_name(char *s, size_t n, const op_case *c) {
    int l = snprintf(s, n, "%s", c->op);
    const char *p = c->dims;
    for (int i = 0; *p && *p != '-' && i < 6; i++) {
        const char *e = strchr(p, ',');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        l += snprintf(s + l, n - l, " %.*s=%d", (int)k, p, c->d[i]);
        p += k + (e != NULL);
    }
    l += snprintf(s + l, n - l, " %s", dt_str(c->dt));
    static const char *fl[] = {"bias", "accumulate", "causal", "in-place", "no-dinp", "no-dw", "masked", "scaled", "no-y", "nan", "eps=1e-6"};
    for (int i = 0; i < 11; i++)
        if (c->flag & (1 << i)) l += snprintf(s + l, n - l, " [%s]", fl[i]);
}

/* Host copies of a run's outputs. */
typedef struct { void *h[MAX_OUT]; out_spec o[MAX_OUT]; int n; char err[256]; } result;

static void result_free(result *res) {
    for (int i = 0; i < res->n; i++) free(res->h[i]);
    res->n = 0;
}

static void run_case(const op_case *c, const dt_backend *be, result *res) {
    run r = {.c = c, .be = be};
    c->fn(&r);
    be->sync();
    memset(res, 0, sizeof *res);
    for (int i = 0; i < r.nout; i++) {
        res->o[i] = r.out[i];
        res->h[i] = tu_malloc(r.out[i].bytes + 8);
        be->copy(res->h[i], r.out[i].dev, r.out[i].bytes);
    }
    res->n = r.nout;
    snprintf(res->err, sizeof res->err, "%s", r.err);
    for (int i = 0; i < r.nbuf; i++) be->mem->free(r.buf[i], r.bytes[i]);
}

/* Compares got with the reference; prints a line per output; returns the failures. */
static int compare(const op_case *c, const char *where, const result *got, const result *ref) {
    char name[160];
    case_name(name, sizeof name, c);
    int bad = 0;
    if (got->err[0]) {
        printf("FAIL %s on %s: %s\n", name, where, got->err);
        bad++;
    }
    if (got->n != ref->n) {
        printf("FAIL %s on %s: %d outputs, the reference %d\n", name, where, got->n, ref->n);
        return bad + 1;
    }
    for (int i = 0; i < got->n; i++) {
        const out_spec *o = &ref->o[i];
        size_t n = o->bytes / o->elem;
        if (o->elem != 4 || (o->rtol == 0 && o->atol == 0)) {
            if (memcmp(got->h[i], ref->h[i], o->bytes) == 0) continue;
            size_t k = 0; /* the first element that differs */
            while (k < n && !memcmp((char *)got->h[i] + k * o->elem, (char *)ref->h[i] + k * o->elem, o->elem)) k++;
            uint32_t a = 0, b = 0;
            memcpy(&a, (char *)got->h[i] + k * o->elem, o->elem), memcpy(&b, (char *)ref->h[i] + k * o->elem, o->elem);
            printf("FAIL %s on %s: %s not bit for bit: [%zu] %0*x, the reference %0*x\n", name, where, o->name, k,
                   o->elem * 2, a, o->elem * 2, b);
            bad++;
            continue;
        }
        double *want = tu_malloc(n * sizeof(double) + 8);
        tu_to_double(want, ref->h[i], n);
        tu_cmp r = tu_compare(got->h[i], want, n, o->rtol, o->atol);
        free(want);
        if (r.ok) continue;
        printf("FAIL %s on %s: %s: normwise %.3e (rtol %.0e), elementwise %.3f of atol %.0e + rtol |ref| "
               "(worst [%zu] %.9g, the reference %.9g)\n",
               name, where, o->name, r.norm, o->rtol, r.elem, o->atol, r.worst, r.got, r.want);
        bad++;
    }
    return bad;
}

/* Runs case c on every backend but the reference, and on the CPU backend on every ISA path of
 * this CPU; returns the failures. */
static int check_case(const op_case *c) {
    result ref, got;
    run_case(c, &dt_backend_ref, &ref);
    if (ref.err[0]) {
        char name[160];
        case_name(name, sizeof name, c);
        printf("FAIL %s on ref: %s\n", name, ref.err);
        result_free(&ref);
        return 1;
    }
    int bad = 0;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    for (int b = 0; b < dt_backend_count(); b++) {
        const dt_backend *be = dt_backend_at(b);
        if (be == &dt_backend_ref) continue;
        int cpu = be == &dt_backend_cpu;
        for (int isa = 0; isa < (cpu ? DT_ISA_COUNT : 1); isa++) {
            char where[64];
            if (cpu) {
                if (!dt_isa_supported((dt_isa)isa)) continue;
                if (dt_isa_use(&ctx, (dt_isa)isa) != DT_OK) fail_msg("%s", ctx.err);
                snprintf(where, sizeof where, "%s/%s", be->name, dt_isa_name((dt_isa)isa));
            } else {
                snprintf(where, sizeof where, "%s", be->name);
            }
            run_case(c, be, &got);
            bad += compare(c, where, &got, &ref);
            result_free(&got);
        }
    }
    if (dt_isa_use(&ctx, dt_isa_best()) != DT_OK) fail_msg("%s", ctx.err);
    result_free(&ref);
    return bad;
}

/* ---------------------------------------------------------------- tests */

static const op_slot *slot(const char *name) {
    for (size_t i = 0; i < N_OPS; i++)
        if (!strcmp(k_ops[i].name, name)) return &k_ops[i];
    return NULL;
}

/* k_ops names every member once (its offsets are the table's operation slots, each once), every
 * op has a case, every case names an op, and every registered backend fills every slot. */
static void test_every_op_has_a_case(void **state) {
    (void)state;
    int seen[N_OPS] = {0};
    for (size_t i = 0; i < N_OPS; i++) {
        size_t k = (k_ops[i].off - FIRST_OP) / sizeof(void (*)(void));
        assert_true(k_ops[i].off >= FIRST_OP && k < N_OPS);
        if (seen[k]++) fail_msg("k_ops: %s names a slot twice", k_ops[i].name);
    }
    int missing = 0;
    for (size_t i = 0; i < N_OPS; i++) {
        size_t n = 0;
        for (size_t j = 0; j < N_CASES; j++) n += !strcmp(k_cases[j].op, k_ops[i].name);
        if (!n) printf("FAIL %s: no case in k_cases\n", k_ops[i].name), missing++;
    }
    for (size_t j = 0; j < N_CASES; j++)
        if (!slot(k_cases[j].op)) printf("FAIL case %zu: %s is no operation of dt_backend\n", j, k_cases[j].op), missing++;
    for (int b = 0; b < dt_backend_count(); b++)
        for (size_t i = 0; i < N_OPS; i++) {
            void (*const *fn)(void) = (void (*const *)(void))((const char *)dt_backend_at(b) + k_ops[i].off);
            if (!*fn) printf("FAIL backend %s: no %s\n", dt_backend_at(b)->name, k_ops[i].name), missing++;
        }
    printf("%zu operations, %zu cases, %d backends\n", N_OPS, N_CASES, dt_backend_count());
    if (missing) fail_msg("%d operations without a case or an implementation", missing);
}

static void test_registry(void **state) {
    (void)state;
    assert_ptr_equal(dt_backend_find("cpu"), &dt_backend_cpu);
    assert_ptr_equal(dt_backend_find("ref"), &dt_backend_ref);
    assert_null(dt_backend_find("nope"));
    assert_string_equal(dt_backend_ref.mem->owner, "ref");
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(setenv("DTRAIN_BACKEND", "ref", 1), 0);
    assert_int_equal(dt_backend_init(&ctx), DT_OK);
    assert_ptr_equal(dt_backend_active(), &dt_backend_ref);
    dt_alloc a;
    dt_alloc_init(&a);
    assert_string_equal(a.mem->owner, "ref"); /* dt_alloc now gives the reference's memory */
    assert_int_equal(setenv("DTRAIN_BACKEND", "cuda9", 1), 0);
    assert_int_not_equal(dt_backend_init(&ctx), DT_OK);
    printf("refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "DTRAIN_BACKEND=cuda9"));
    assert_int_equal(dt_backend_use(&ctx, "cpu"), DT_OK);
    unsetenv("DTRAIN_BACKEND");
}

static void test_cases(void **state) {
    (void)state;
    int bad = 0;
    for (int b = 0; b < dt_backend_count(); b++) {
        const dt_backend *be = dt_backend_at(b);
        printf("backend %s%s", be->name, be == &dt_backend_ref ? " (the reference)\n" : be == &dt_backend_cpu ? ", paths:" : "\n");
        for (int isa = 0; be == &dt_backend_cpu && isa < DT_ISA_COUNT; isa++)
            if (dt_isa_built((dt_isa)isa))
                printf(" %s%s", dt_isa_name((dt_isa)isa), dt_isa_supported((dt_isa)isa) ? "" : " (NOT RUN: this CPU lacks it)");
        if (be == &dt_backend_cpu) printf("\n");
    }
    for (size_t j = 0; j < N_CASES; j++) {
        char name[160];
        case_name(name, sizeof name, &k_cases[j]);
        int b = check_case(&k_cases[j]);
        printf("%s %s\n", b ? "FAIL" : "ok  ", name);
        bad += b;
    }
    if (bad) fail_msg("%d comparisons outside their tolerances (FAIL lines above)", bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_has_a_case),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
