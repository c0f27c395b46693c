/* The runners of tests/test_backend_ops.c's cases of the model/ operations (backend_ops.h):
 * the vision embedding, the block-wise cross-entropy backward, the narrowing in place, the
 * low-rank adapter's four products (fp32 or 16-bit inputs, dropout on or off) and the
 * parameter fills. */
#include <stdlib.h>
#include <string.h>

#include "backend_ops.h"

/* B, CH, S, p: pixels 0..255 (every 7th one past them: the contract divides any value). */
void run_patchify(run *r) {
    int B = D(0), CH = D(1), S = D(2), p = D(3), g = S / p;
    size_t np = (size_t)B * CH * S * S, no = (size_t)B * g * g * CH * p * p;
    int32_t *h = tu_malloc(np * 4 + 4);
    uint64_t s = 101;
    for (size_t i = 0; i < np; i++)
        h[i] = i % 7 == 6 ? (int32_t)(splitmix(&s) % 200001) - 100000 : (int32_t)(splitmix(&s) % 256);
    int32_t *pix = ints(r, h, np);
    free(h);
    float *o = val(r, no, 1e6f);
    BE->patchify(o, pix, B, CH, S, p);
    out(r, "patches", o, no);
}

/* B, T, C (, r0, rows for the forward: a window of the B T token rows, as a pipeline stage or
 * a chunk of the batch takes). */
void run_cls_pos(run *r) {
    int B = D(0), T = D(1), C = D(2);
    size_t npe = (size_t)B * (T - 1) * C, nt = (size_t)T * C;
    if (!strcmp(r->c->op, "cls_pos_forward")) {
        int r0 = D(3), rows = D(4);
        float *cls = uni(r, C, 1, 0, 102), *pe = uni(r, npe, 1, 0, 103), *pos = uni(r, nt, 1, 0, 104);
        float *o = val(r, (size_t)rows * C, 1e6f);
        BE->cls_pos_forward(o, cls, pe, pos, r0, rows, T, C);
        out(r, "out", o, (size_t)rows * C);
        return;
    }
    float *g = uni(r, (size_t)B * T * C, 1, 0, 105), *dpos = uni(r, nt, 1, 0, 106), *dcls = uni(r, C, 1, 0, 107);
    float *dpe = val(r, npe, 1e6f);
    BE->cls_pos_backward(dpos, dcls, dpe, g, B, T, C);
    out(r, "dpos (accumulated)", dpos, nt), out(r, "dcls (accumulated)", dcls, C);
    out_exact(r, "dpe (dout's rows t > 0)", dpe, npe, 4);
}

/* N, ld, nb, Vl, col0, V: logits U(-4, 4), lse U(3, 5), dloss 0.37; targets in the window, out
 * of it (below and above), on its last real column and its first; F_MASK: every 4th -1. The
 * columns past the blocks (ld > nb Vl) keep their logits. */
void run_ce_blocks(run *r) {
    int N = D(0), ld = D(1), nb = D(2), Vl = D(3), col0 = D(4), V = D(5);
    const long win = (long)nb * Vl, hi = col0 + win < V ? col0 + win : V; /* real columns: [col0, hi) */
    int32_t *th = tu_malloc(N * 4 + 4);
    for (int n = 0; n < N; n++) {
        long t;
        switch (n % 6) {
        case 0: t = col0 + (n * 7919L) % (hi - col0); break;
        case 1: t = col0 > 0 ? (n * 31L) % col0 : (n * 13L) % V; break; /* below the window, or in it */
        case 2: t = hi < V ? hi + (n * 17L) % (V - hi) : col0; break;    /* above, or its first */
        case 3: t = hi - 1; break;
        case 4: t = col0; break;
        default: t = (n * 104729L) % V;
        }
        th[n] = FL(F_MASK) && n % 4 == 1 ? -1 : (int32_t)t;
    }
    int32_t *tgt = ints(r, th, N);
    free(th);
    float *x = uni(r, (size_t)N * ld, 4, 0, 111), *lse = uni(r, N, 1, 4, 112);
    BE->crossentropy_backward_blocks(x, lse, tgt, 0.37f, N, ld, nb, Vl, (long)col0, V);
    out(r, "dlogits (in place)", x, (size_t)N * ld);
}

/* N, ld; dt: bf16 or fp16. Random bit patterns and edges narrowed; each row's ld 16-bit
 * values (its first half) gathered for the comparison (the rest is no output). */
void run_lowp_rows(run *r) {
    int N = D(0), ld = D(1);
    float *x = bits32(r, (size_t)N * ld, 113);
    uint16_t *h = put(r, NULL, (size_t)N * ld * 2);
    BE->f32_to_lowp_rows_inplace(r->c->dt, x, N, ld);
    for (int i = 0; i < N; i++) BE->copy(h + (size_t)i * ld, x + (size_t)i * ld, (size_t)ld * 2);
    out_exact(r, "rows (16-bit, in place)", h, (size_t)N * ld, 2);
}

/* The adapter's dropout of the cases (F_DROP): p 0.3 over sequences of T rows, the shard's
 * columns from 5. */
static dt_dropout case_dropout(run *r, int T) {
    dt_dropout d = {0};
    if (!FL(F_DROP)) return d;
    d = (dt_dropout){.on = 1, .T = T, .coff = 5, .inv = 1.0f / (1.0f - 0.3f), .thresh = (uint64_t)(0.3 * 4294967296.0),
                     .seed = 7, .stream = 99, .seq0 = 3, .salt = 0x1234};
    return d;
}

/* The down products: N, C, r, T; dt: x in fp32 (xf) or 16-bit (xh, with xf a sentinel the op
 * must not read); F_DROP: dropout; F_NODINP: dinp NULL. */
void run_lowrank_down(run *r) {
    int N = D(0), C = D(1), R = D(2);
    size_t nx = (size_t)N * C, na = (size_t)R * C, nu = (size_t)N * R;
    dt_dtype dt = r->c->dt;
    const dt_dropout d = case_dropout(r, D(3));
    float *xf = dt == DT_F32 ? uni(r, nx, 1, 0, 121) : val(r, nx, 1e6f), *A = uni(r, na, 0.5f, 0, 122);
    uint16_t *xh = dt == DT_F32 ? NULL : uni_lp(r, dt, nx, 1, 121);
    dt_dtype xdt = dt == DT_F32 ? DT_BF16 : dt; /* unused with xh NULL */
    if (!strcmp(r->c->op, "lowrank_down_forward")) {
        float *u = val(r, nu, 1e6f);
        BE->lowrank_down_forward(u, xf, xh, xdt, A, N, C, R, &d);
        out(r, "u", u, nu);
        return;
    }
    float *du = uni(r, nu, 1, 0, 123), *dA = uni(r, na, 1, 0, 124), *dx = FL(F_NODINP) ? NULL : uni(r, nx, 1, 0, 125);
    BE->lowrank_down_backward(dA, dx, du, xf, xh, xdt, A, N, C, R, &d);
    out(r, "dA (accumulated)", dA, na);
    if (dx) out(r, "dinp (accumulated)", dx, nx);
}

/* The up products: N, rows, r, ld (out / dout rows of that stride); scale 1.75. */
void run_lowrank_up(run *r) {
    int N = D(0), rows = D(1), R = D(2), ld = D(3);
    size_t no = (size_t)N * ld, nu = (size_t)N * R, nb = (size_t)rows * R;
    const float s = 1.75f;
    float *u = uni(r, nu, 1, 0, 131), *B = uni(r, nb, 0.5f, 0, 132);
    if (!strcmp(r->c->op, "lowrank_up_forward")) {
        float *o = uni(r, no, 1, 0, 133);
        BE->lowrank_up_forward(o, ld, u, B, s, N, rows, R);
        out(r, "out (accumulated)", o, no);
        return;
    }
    float *g = uni(r, no, 1, 0, 134), *dB = uni(r, nb, 1, 0, 135), *du = val(r, nu, 1e6f);
    BE->lowrank_up_backward(dB, du, g, ld, u, B, s, N, rows, R);
    out(r, "dB (accumulated)", dB, nb), out(r, "du", du, nu);
}

/* fill_normal: n, i0, drawn (std 0.02, seed 42, stream 7); fill_f32: n (v -0.37). One float
 * past n is a sentinel that must stay. */
void run_fill(run *r) {
    size_t n = (size_t)D(0);
    float *o = val(r, n + 1, 1e6f);
    if (!strcmp(r->c->op, "fill_normal")) BE->fill_normal(o, n, 42, 7, (uint64_t)D(1), (uint64_t)D(2), 0.02f);
    else BE->fill_f32(o, -0.37f, n);
    out(r, "dst (and the float past it)", o, n + 1);
}

void run_lowrank_merge(run *r) {
    const int rows = D(0), C = D(1), k = D(2);
    float *W = uni(r, (size_t)rows * C, 1, 0, 121), *A = uni(r, (size_t)k * C, 0.1f, 0, 122);
    float *B = uni(r, (size_t)rows * k, 0.1f, 0, 123);
    BE->lowrank_merge(W, A, B, 0.75f, rows, C, k);
    out(r, "W", W, (size_t)rows * C);
}
