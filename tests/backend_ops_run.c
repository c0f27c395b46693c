/* The runners of tests/test_backend_ops.c's op cases and their input builders (backend_ops.h). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_ops.h"
#include "ops/cpu/isa.h"

uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* bytes of the backend's memory holding a copy of host (NULL: zeroed). */
void *put(run *r, const void *host, size_t bytes) {
    assert_true(r->nbuf < MAX_BUF);
    void *p = r->be->mem->alloc(bytes ? bytes : 1);
    assert_non_null(p);
    if (host) r->be->copy(p, host, bytes);
    else r->be->fill(p, 0, bytes);
    r->buf[r->nbuf] = p, r->bytes[r->nbuf++] = bytes ? bytes : 1;
    return p;
}
/* n floats ~ U(-scale, scale) + shift, deterministic in (seed, i). */
float *uni(run *r, size_t n, float scale, float shift, uint64_t seed) {
    float *h = tu_malloc(n * 4 + 4);
    tu_fill_uniform(h, n, scale, seed);
    for (size_t i = 0; i < n; i++) h[i] += shift;
    float *p = put(r, h, n * 4);
    free(h);
    return p;
}
/* n floats of one value: a sentinel in outputs that are overwritten (an element left
 * unwritten stays 1e6 and fails the comparison). */
float *val(run *r, size_t n, float v) {
    float *h = tu_malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) h[i] = v;
    float *p = put(r, h, n * 4);
    free(h);
    return p;
}
/* n values ~ U(-scale, scale) rounded to dt (bf16 / fp16), by the reference's exact narrowing. */
uint16_t *uni_lp(run *r, dt_dtype dt, size_t n, float scale, uint64_t seed) {
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
float *bits32(run *r, size_t n, uint64_t seed) {
    static const uint32_t edge[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00001, 0xffa00000,
                                    0x7f800001, 0x00000001, 0x00008000, 0x00018000, 0x3f808000, 0x3f818000,
                                    0x33000000, 0x33c00000, 0x387fe000, 0x477ff000, 0x477fefff, 0x7f7fffff};
    uint32_t *u = tu_malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) u[i] = i % 4 == 3 ? edge[(i / 4) % (sizeof edge / 4)] : (uint32_t)splitmix(&seed);
    float *p = put(r, u, n * 4);
    free(u);
    return p;
}
int32_t *ints(run *r, const int32_t *h, size_t n) { return put(r, h, n * 4); }

/* Names an output: n elements of `elem` bytes (4: float, compared with the case's
 * tolerances unless it is exact; 2: uint16, always bit for bit; 1: bytes, bit for bit). */
void out_t(run *r, const char *name, const void *dev, size_t n, int elem, double rtol, double atol) {
    assert_true(r->nout < MAX_OUT);
    r->out[r->nout++] = (out_spec){name, dev, n * elem, elem, rtol, atol};
}
void out(run *r, const char *name, const void *dev, size_t n) { out_t(r, name, dev, n, 4, r->c->rtol, r->c->atol); }
void out_exact(run *r, const char *name, const void *dev, size_t n, int elem) { out_t(r, name, dev, n, elem, 0, 0); }
/* A scalar result (a returned value) as an output. */
void out_scalar(run *r, const char *name, double v, int exact) {
    float f = (float)v;
    float *p = put(r, &f, 4);
    out_t(r, name, p, 1, 4, exact ? 0 : r->c->rtol, exact ? 0 : r->c->atol);
}

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
void run_encoder(run *r) {
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
void run_pos(run *r) {
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
void run_layernorm(run *r) {
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
void run_rmsnorm(run *r) {
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
void run_matmul(run *r) {
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
void run_nf4_matmul(run *r) {
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
void run_nf4(run *r) {
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
void run_attention(run *r) {
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
/* The ring's blocks (ops.h): Tq, Tk, NH, NKV, hs, with strides wider than the rows (q inside a
 * qkv row, kv rows padded by 3, out by 5, lse by 2) so a kernel that ignores a stride fails;
 * F_CAUSAL: a diagonal block (Tq = Tk). The backward's merged out and lse come from the
 * reference forward of the block; dq and dkv start non-zero (the op adds). attention_merge:
 * T = Tq rows, the running state from one block, the merged-in block's lse -inf on every 5th
 * row (a row it holds no key for) and the running -inf on every 7th. */
void run_attention_block(run *r) {
    int Tq = D(0), Tk = D(1), NH = D(2), NKV = D(3), hs = D(4), causal = FL(F_CAUSAL) != 0;
    const int ldq = (NH + 2 * NKV) * hs, ldkv = 2 * NKV * hs + 3, ldo = NH * hs + 5, ldl = Tq + 2;
    const size_t nq = (size_t)Tq * ldq, nkv = (size_t)Tk * ldkv, no = (size_t)Tq * ldo, nl = (size_t)NH * ldl;
    float *q = uni(r, nq, 1.5f, 0, 71), *kv = uni(r, nkv, 1.5f, 0, 72), *o = val(r, no, 1e6f), *lse = val(r, nl, 1e6f);
    if (!strcmp(r->c->op, "attention_block_forward")) {
        BE->attention_block_forward(o, ldo, lse, ldl, q, ldq, kv, ldkv, Tq, Tk, NH, NKV, hs, causal, r->c->dt);
        out(r, "out", o, no), out(r, "lse", lse, nl);
        return;
    }
    if (!strcmp(r->c->op, "attention_block_backward")) {
        dt_backend_ref.attention_block_forward(o, ldo, lse, ldl, q, ldq, kv, ldkv, Tq, Tk, NH, NKV, hs, causal, r->c->dt);
        float *g = uni(r, no, 1, 0, 73), *dq = uni(r, nq, 1, 0, 74), *dkv = uni(r, nkv, 1, 0, 75);
        BE->attention_block_backward(dq, ldq, dkv, ldkv, g, o, ldo, lse, ldl, q, ldq, kv, ldkv, Tq, Tk, NH, NKV, hs, causal,
                                     r->c->dt);
        out(r, "dq", dq, nq), out(r, "dkv", dkv, nkv);
        return;
    }
    float *ob = val(r, no, 1e6f), *lb = val(r, nl, 1e6f);
    dt_backend_ref.attention_block_forward(o, ldo, lse, ldl, q, ldq, kv, ldkv, Tq, Tk, NH, NKV, hs, 0, DT_F32);
    float *q2 = uni(r, nq, 1.5f, 0, 76);
    dt_backend_ref.attention_block_forward(ob, ldo, lb, ldl, q2, ldq, kv, ldkv, Tq, Tk, NH, NKV, hs, 0, DT_F32);
    float *hl = tu_malloc(nl * 4), *hb = tu_malloc(nl * 4);
    r->be->copy(hl, lse, nl * 4), r->be->copy(hb, lb, nl * 4);
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < Tq; t++) {
            if (t % 5 == 2) hb[(size_t)h * ldl + t] = -INFINITY;
            if (t % 7 == 3 && t % 5 != 2) hl[(size_t)h * ldl + t] = -INFINITY; /* never both: -inf stays */
        }
    r->be->copy(lse, hl, nl * 4), r->be->copy(lb, hb, nl * 4);
    free(hl), free(hb);
    BE->attention_merge(o, ldo, lse, ldl, ob, ldo, lb, ldl, Tq, NH, hs);
    out(r, "out", o, no), out(r, "lse", lse, nl);
}
/* B, T, NH, NKV, hs (and pos0 for the _at forms); F_SCALE: YaRN's attention factor 1.25. */
void run_rope(run *r) {
    int B = D(0), T = D(1), NH = D(2), NKV = D(3), hs = D(4);
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * hs;
    float inv[256];
    dt_rope_inv_freq(inv, hs, 10000.0f);
    float *x = uni(r, nq, 1, 0, 63), *f = put(r, inv, (size_t)hs / 2 * 4);
    const float sc = FL(F_SCALE) ? 1.25f : 1.0f;
    if (!strcmp(r->c->op, "rope_forward")) BE->rope_forward(x, B, T, NH, NKV, hs, f, sc);
    else if (!strcmp(r->c->op, "rope_backward")) BE->rope_backward(x, B, T, NH, NKV, hs, f, sc);
    else if (!strcmp(r->c->op, "rope_forward_at")) BE->rope_forward_at(x, B, T, D(5), NH, NKV, hs, f, sc);
    else BE->rope_backward_at(x, B, T, D(5), NH, NKV, hs, f, sc);
    out(r, "qkv (in place)", x, nq);
}
/* N, F, gate: the gate halves ~ U(-gate, gate) (120: exp(-g) overflows or underflows in fp32
 * and silu saturates), the up halves U(-2, 2). */
void run_swiglu(run *r) {
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
void run_gelu(run *r) {
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
void run_residual(run *r) {
    int N = D(0);
    float *a = uni(r, N, 1, 0, 41), *b = uni(r, N, 1, 0, 42), *o = FL(F_INPLACE) ? a : val(r, N, 1e6f);
    BE->residual_forward(o, a, b, N);
    out(r, "out", o, N);
}
/* N, V, Vp: logits U(-8, 8), the padding 1e4 (must be ignored); F_MASK: every 3rd target -1;
 * F_INPLACE: dlogits is logits. */
void run_crossentropy(run *r) {
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
void run_exp_sum(run *r) {
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
void run_convert(run *r) {
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
void run_serial(run *r) {
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
void run_query(run *r) {
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


/* ---- parallel/ and optim/ operations */

/* AdamW over n elements (chunked; F_MASK: the aged rule of Top-K, a third of the gradients zero
 * and ages 1..4). */
void run_adamw(run *r) {
    size_t n = (size_t)D(0);
    float *p = uni(r, n, 1, 0, 81), *g = uni(r, n, 0.1f, 0, 82), *m = uni(r, n, 0.01f, 0, 83);
    float *hv = tu_malloc(n * 4 + 4);
    tu_fill_uniform(hv, n, 1e-4f, 84);
    for (size_t i = 0; i < n; i++) hv[i] = hv[i] * hv[i]; /* second moments >= 0 */
    float *v = put(r, hv, n * 4);
    free(hv);
    const dt_adamw_step st = {0.9f, 0.95f, 1e-8f, 1.0f - 3e-4f * 0.1f, 3e-4f / (1.0f - 0.9f), sqrtf(1.0f - 0.95f), 0.5f};
    if (FL(F_MASK)) {
        float *hg = tu_malloc(n * 4 + 4), *ha = tu_malloc(n * 4 + 4);
        BE->copy(hg, g, n * 4);
        for (size_t i = 0; i < n; i++) {
            if (i % 3 == 1) hg[i] = 0.0f;
            ha[i] = (float)(1 + i % 4);
        }
        BE->copy(g, hg, n * 4);
        float *age = put(r, ha, n * 4);
        free(hg), free(ha);
        BE->adamw_aged(p, g, m, v, age, n, &st);
        out_exact(r, "age", age, n, 4);
    } else {
        BE->adamw_chunked(p, g, m, v, n, &st);
    }
    out(r, "params", p, n), out(r, "m", m, n), out(r, "v", v, n);
}
void run_sumsq(run *r) {
    size_t n = (size_t)D(0);
    out_scalar(r, "sumsq", BE->sumsq_chunked(uni(r, n, 3, 0, 91), n), 0);
}
/* a += x, x *= factor: sums and products of two floats are exact in double, so the reference's
 * single rounding is the fp32 operation's: bit for bit. */
void run_add_scale(run *r) {
    size_t n = (size_t)D(0);
    float *a = uni(r, n, 1, 0, 92), *x = uni(r, n, 1, 0, 93);
    if (FL(F_SCALE)) BE->scale_f32(a, -0.37f, n);
    else BE->add_f32(a, x, n);
    out(r, "out", a, n);
}
