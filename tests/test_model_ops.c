/* The model layer's operations of ops.h ("model/ operations", ARCHITECTURE decision 73) on
 * every registered backend and ISA path, against naive references: the low-rank adapter
 * products with and without dropout (double references, fp32 and bf16 inputs), the block-wise
 * cross-entropy backward (double reference), and bit for bit the narrowing in place, the
 * RNG fills, patchify and the class-token/position embedding with its backward. Shapes cross
 * every block of the CPU kernels (64 columns, 16 ranks, 8 rows) with ragged tails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/backend.h"
#include "ops/ops.h"
#include "testutil.h"

#define TOL 2e-5 /* fp32 sums of <= 150 products against double */

/* ---------------------------------------------------------------- low-rank adapter */
enum { LN = 37, LC = 150, LR = 20, LROWS = 19, LDO = 23 };

/* x (LN, LC) as the op reads it: fp32, or bf16 widened; then drop(x) by the public mask. */
static void ref_dropped_x(double *xd, const float *xf, const uint16_t *xh, const dt_dropout *d) {
    for (int n = 0; n < LN; n++) {
        uint64_t key = d->on ? dt_dropout_row_key(d, n) : 0;
        for (int c = 0; c < LC; c++) {
            float v = xf[(size_t)n * LC + c];
            if (xh) dt_bf16_to_f32(&v, xh + (size_t)n * LC + c, 1);
            double x = v;
            if (d->on) x = dt_dropout_kept(d, key, c) ? (double)(float)(v * d->inv) : 0.0;
            xd[(size_t)n * LC + c] = x;
        }
    }
}

static void lowrank_case(const dt_dropout *d, int bf16) {
    const size_t nx = (size_t)LN * LC;
    float *x = tu_malloc(nx * 4), *A = tu_malloc((size_t)LR * LC * 4), *B = tu_malloc((size_t)LROWS * LR * 4);
    float *u = tu_malloc((size_t)LN * LR * 4), *out = tu_malloc((size_t)LN * LDO * 4), *dout = tu_malloc((size_t)LN * LDO * 4);
    float *dA = tu_malloc((size_t)LR * LC * 4), *dB = tu_malloc((size_t)LROWS * LR * 4), *du = tu_malloc((size_t)LN * LR * 4);
    float *dinp = tu_malloc(nx * 4);
    uint16_t *xh = bf16 ? tu_malloc(nx * 2) : NULL;
    tu_fill_uniform(x, nx, 1.0f, 11);
    tu_fill_uniform(A, (size_t)LR * LC, 0.5f, 12);
    tu_fill_uniform(B, (size_t)LROWS * LR, 0.5f, 13);
    tu_fill_uniform(out, (size_t)LN * LDO, 1.0f, 14); /* accumulated into */
    tu_fill_uniform(dout, (size_t)LN * LDO, 1.0f, 15);
    tu_fill_uniform(dA, (size_t)LR * LC, 1.0f, 16);
    tu_fill_uniform(dB, (size_t)LROWS * LR, 1.0f, 17);
    tu_fill_uniform(dinp, nx, 1.0f, 18);
    if (xh) dt_f32_to_bf16(xh, x, nx);
    const float s = 1.75f;
    double *xd = tu_malloc(nx * 8), *ru = tu_malloc((size_t)LN * LR * 8), *rout = tu_malloc((size_t)LN * LDO * 8);
    double *rdA = tu_malloc((size_t)LR * LC * 8), *rdB = tu_malloc((size_t)LROWS * LR * 8);
    double *rdu = tu_malloc((size_t)LN * LR * 8), *rdinp = tu_malloc(nx * 8);
    ref_dropped_x(xd, x, xh, d);
    tu_to_double(rout, out, (size_t)LN * LDO);
    tu_to_double(rdA, dA, (size_t)LR * LC);
    tu_to_double(rdB, dB, (size_t)LROWS * LR);
    tu_to_double(rdinp, dinp, nx);
    for (int n = 0; n < LN; n++)
        for (int k = 0; k < LR; k++) {
            double a = 0;
            for (int c = 0; c < LC; c++) a += xd[(size_t)n * LC + c] * A[(size_t)k * LC + c];
            ru[(size_t)n * LR + k] = a;
        }
    for (int n = 0; n < LN; n++)
        for (int j = 0; j < LROWS; j++) {
            double a = 0;
            for (int k = 0; k < LR; k++) a += ru[(size_t)n * LR + k] * B[(size_t)j * LR + k];
            rout[(size_t)n * LDO + j] += s * a;
        }
    for (int j = 0; j < LROWS; j++)
        for (int k = 0; k < LR; k++) {
            double a = 0;
            for (int n = 0; n < LN; n++) a += dout[(size_t)n * LDO + j] * ru[(size_t)n * LR + k];
            rdB[(size_t)j * LR + k] += s * a;
        }
    for (int n = 0; n < LN; n++)
        for (int k = 0; k < LR; k++) {
            double a = 0;
            for (int j = 0; j < LROWS; j++) a += dout[(size_t)n * LDO + j] * B[(size_t)j * LR + k];
            rdu[(size_t)n * LR + k] = s * a;
        }
    for (int k = 0; k < LR; k++)
        for (int c = 0; c < LC; c++) {
            double a = 0;
            for (int n = 0; n < LN; n++) a += rdu[(size_t)n * LR + k] * xd[(size_t)n * LC + c];
            rdA[(size_t)k * LC + c] += a;
        }
    for (int n = 0; n < LN; n++) {
        uint64_t key = d->on ? dt_dropout_row_key(d, n) : 0;
        for (int c = 0; c < LC; c++) {
            double a = 0;
            for (int k = 0; k < LR; k++) a += rdu[(size_t)n * LR + k] * A[(size_t)k * LC + c];
            if (d->on) a = dt_dropout_kept(d, key, c) ? a * d->inv : 0.0;
            rdinp[(size_t)n * LC + c] += a;
        }
    }
    dt_lowrank_down_forward(u, x, xh, DT_BF16, A, LN, LC, LR, d);
    dt_lowrank_up_forward(out, LDO, u, B, s, LN, LROWS, LR);
    dt_lowrank_up_backward(dB, du, dout, LDO, u, B, s, LN, LROWS, LR);
    dt_lowrank_down_backward(dA, dinp, du, x, xh, DT_BF16, A, LN, LC, LR, d);
    printf("lowrank dropout=%d bf16=%d\n", d->on, bf16);
    tu_assert_close("u", u, ru, (size_t)LN * LR, TOL, 1e-5);
    tu_assert_close("out (accumulated)", out, rout, (size_t)LN * LDO, TOL, 1e-5);
    tu_assert_close("dB (accumulated)", dB, rdB, (size_t)LROWS * LR, TOL, 1e-5);
    tu_assert_close("du", du, rdu, (size_t)LN * LR, TOL, 1e-5);
    tu_assert_close("dA (accumulated)", dA, rdA, (size_t)LR * LC, TOL, 1e-5);
    tu_assert_close("dinp (accumulated)", dinp, rdinp, nx, TOL, 1e-5);
    /* dinp NULL: skipped, dA the same bits */
    float *dA2 = tu_malloc((size_t)LR * LC * 4);
    tu_fill_uniform(dA2, (size_t)LR * LC, 1.0f, 16);
    dt_lowrank_down_backward(dA2, NULL, du, x, xh, DT_BF16, A, LN, LC, LR, d);
    assert_memory_equal(dA2, dA, (size_t)LR * LC * 4);
    free(x), free(A), free(B), free(u), free(out), free(dout), free(dA), free(dB), free(du), free(dinp), free(xh);
    free(xd), free(ru), free(rout), free(rdA), free(rdB), free(rdu), free(rdinp), free(dA2);
}

static void lowrank_cases(void) {
    dt_dropout none = {0};
    dt_dropout d = {.on = 1, .T = 8, .coff = 5, .inv = 1.0f / (1.0f - 0.3f), .thresh = (uint64_t)(0.3 * 4294967296.0),
                    .seed = 7, .stream = 99, .seq0 = 3, .salt = 0x1234};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        lowrank_case(&none, bf16);
        lowrank_case(&d, bf16);
    }
    /* the mask: about p of the features dropped, and its key depends on the row's sequence
     * and position */
    long dropped = 0, n = 0;
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 1000; c++, n++) dropped += !dt_dropout_kept(&d, dt_dropout_row_key(&d, r), c);
    printf("dropout: %.4f of %ld dropped (p 0.3)\n", (double)dropped / (double)n, n);
    assert_true(fabs((double)dropped / (double)n - 0.3) < 0.01);
    assert_true(dt_dropout_row_key(&d, 0) != dt_dropout_row_key(&d, 1));
    assert_true(dt_dropout_row_key(&d, 1) != dt_dropout_row_key(&d, 9)); /* position 1 of the next sequence */
}

/* ---------------------------------------------------------------- cross-entropy blocks */
static void ce_blocks_cases(void) {
    enum { N = 9, NB = 3, VL = 70, LD = NB * VL + 4 };
    const long col0 = 140; /* blocks: canonical [140, 210), [210, 280), [280, 350) */
    const int V = 250;      /* real: 70, 40 and 0 columns */
    float *x = tu_malloc((size_t)N * LD * 4), *lse = tu_malloc(N * 4);
    int32_t targets[N] = {145, 230, -1, 209, 210, 0, 249, 139, 140}; /* 0, 139: not held */
    double *ref = tu_malloc((size_t)N * LD * 8);
    tu_fill_uniform(x, (size_t)N * LD, 3.0f, 21);
    tu_fill_uniform(lse, N, 1.0f, 22);
    const float dloss = 0.125f;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < LD; i++) {
            long col = col0 + i;
            double v = 0;
            if (targets[n] >= 0 && i < NB * VL) {
                if (col < V) v = exp((double)x[(size_t)n * LD + i] - lse[n]) * dloss;
                if (col == targets[n]) v -= dloss;
            } else if (targets[n] >= 0) {
                v = x[(size_t)n * LD + i]; /* past the blocks: untouched */
            }
            ref[(size_t)n * LD + i] = v;
        }
    dt_crossentropy_backward_blocks(x, lse, targets, dloss, N, LD, NB, VL, col0, V);
    printf("crossentropy_backward_blocks\n");
    tu_assert_close("dlogits", x, ref, (size_t)N * LD, 1e-6, 1e-7);
    free(x), free(lse), free(ref);
}

/* ---------------------------------------------------------------- bit-exact ones */
static void exact_cases(void) {
    /* narrowing in place: each row's 16-bit values at its start, those of dt_to_lowp */
    enum { RN = 5, RLD = 600 };
    float *rows = tu_malloc((size_t)RN * RLD * 4), *orig = tu_malloc((size_t)RN * RLD * 4);
    uint16_t *want = tu_malloc(RLD * 2);
    for (int dt = 0; dt < 2; dt++) {
        dt_dtype t = dt ? DT_F16 : DT_BF16;
        tu_fill_uniform(orig, (size_t)RN * RLD, 4.0f, 31);
        memcpy(rows, orig, (size_t)RN * RLD * 4);
        dt_f32_to_lowp_rows_inplace(t, rows, RN, RLD);
        for (int r = 0; r < RN; r++) {
            dt_to_lowp(t, want, orig + (size_t)r * RLD, RLD);
            assert_memory_equal((uint16_t *)(rows + (size_t)r * RLD), want, RLD * 2);
        }
    }
    /* RNG fills */
    enum { FN = 1000 };
    float *f = tu_malloc(FN * 4);
    dt_fill_normal(f, FN, 42, 7, 300, 900, 0.02f);
    for (int k = 0; k < FN; k++) {
        float w = k + 300 < 900 ? 0.02f * dt_rng_normal(42, 7, (uint64_t)k + 300) : 0.0f;
        assert_memory_equal(&f[k], &w, 4);
    }
    dt_fill_f32(f, 1.0f, FN - 1);
    for (int k = 0; k < FN - 1; k++) assert_true(f[k] == 1.0f);
    assert_true(f[FN - 1] == 0.0f); /* beyond n: untouched */
    /* patchify: (B, CH, S, S) -> (B g g, CH p p) / 255 */
    enum { B = 2, CH = 3, S = 12, P = 4, G = S / P, T = G * G + 1, C = 10 };
    int32_t *pix = tu_malloc((size_t)B * CH * S * S * 4);
    for (int i = 0; i < B * CH * S * S; i++) pix[i] = (i * 37 + 11) % 256;
    float *pt = tu_malloc((size_t)B * G * G * CH * P * P * 4);
    dt_patchify(pt, pix, B, CH, S, P);
    for (int b = 0; b < B; b++)
        for (int q = 0; q < G * G; q++)
            for (int ch = 0; ch < CH; ch++)
                for (int py = 0; py < P; py++)
                    for (int px = 0; px < P; px++) {
                        int gy = q / G, gx = q % G;
                        float w = (float)pix[((b * CH + ch) * S + gy * P + py) * S + gx * P + px] / 255.0f;
                        assert_memory_equal(&pt[((size_t)(b * G * G + q) * CH + ch) * P * P + py * P + px], &w, 4);
                    }
    /* class token + positions, forward for a window of rows, and the backward */
    float *cls = tu_malloc(C * 4), *pe = tu_malloc((size_t)B * (T - 1) * C * 4), *pos = tu_malloc((size_t)T * C * 4);
    float *enc = tu_malloc((size_t)B * T * C * 4);
    tu_fill_uniform(cls, C, 1.0f, 41);
    tu_fill_uniform(pe, (size_t)B * (T - 1) * C, 1.0f, 42);
    tu_fill_uniform(pos, (size_t)T * C, 1.0f, 43);
    const int r0 = 7, nrows = B * T - 9;
    dt_cls_pos_forward(enc, cls, pe, pos, r0, nrows, T, C);
    for (int i = 0; i < nrows; i++) {
        int b = (r0 + i) / T, t = (r0 + i) % T;
        for (int k = 0; k < C; k++) {
            float w = (t == 0 ? cls[k] : pe[((size_t)b * (T - 1) + t - 1) * C + k]) + pos[(size_t)t * C + k];
            assert_memory_equal(&enc[(size_t)i * C + k], &w, 4);
        }
    }
    float *dout = tu_malloc((size_t)B * T * C * 4), *dpos = tu_malloc((size_t)T * C * 4), *dcls = tu_malloc(C * 4);
    float *dpe = tu_malloc((size_t)B * (T - 1) * C * 4), *wpos = tu_malloc((size_t)T * C * 4), *wcls = tu_malloc(C * 4);
    tu_fill_uniform(dout, (size_t)B * T * C, 1.0f, 44);
    tu_fill_uniform(dpos, (size_t)T * C, 1.0f, 45);
    tu_fill_uniform(dcls, C, 1.0f, 46);
    memcpy(wpos, dpos, (size_t)T * C * 4);
    memcpy(wcls, dcls, C * 4);
    dt_cls_pos_backward(dpos, dcls, dpe, dout, B, T, C);
    for (int b = 0; b < B; b++) /* b ascending, as the contract says */
        for (int t = 0; t < T; t++)
            for (int k = 0; k < C; k++) {
                float g = dout[((size_t)b * T + t) * C + k];
                wpos[(size_t)t * C + k] += g;
                if (t == 0) wcls[k] += g;
                else assert_memory_equal(&dpe[((size_t)b * (T - 1) + t - 1) * C + k], &g, 4);
            }
    assert_memory_equal(dpos, wpos, (size_t)T * C * 4);
    assert_memory_equal(dcls, wcls, C * 4);
    free(rows), free(orig), free(want), free(f), free(pix), free(pt), free(cls), free(pe), free(pos), free(enc);
    free(dout), free(dpos), free(dcls), free(dpe), free(wpos), free(wcls);
}

static void all_cases(void) {
    lowrank_cases();
    ce_blocks_cases();
    exact_cases();
}

static void test_model_ops(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    for (int i = 0; i < dt_backend_count(); i++) {
        const dt_backend *be = dt_backend_at(i);
        printf("backend %s\n", be->name);
        assert_int_equal(dt_backend_use(&ctx, be->name), DT_OK);
        tu_each_isa(all_cases);
    }
    assert_int_equal(dt_backend_use(&ctx, "cpu"), DT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_model_ops)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
