/* The float64 reference backend "ref" (backend.h; docs/BACKENDS.md): every operation takes
 * ops.h's float / uint16 arguments, widens them to double, computes from the definitions
 * (the naive references of ops_ref.h where they exist, plain loops here where they don't)
 * and rounds the results to float once at the end. Slow, serial, and the same bits on any
 * machine: the oracle tests/test_backend_ops.c checks every other backend and ISA path
 * against. The conversions and NF4's dequantization are exact bit operations in the
 * contract, written here as scalar formulas; everything else differs from an exact result
 * only by the final rounding (and, for 16-bit attention, by the rounding of the operands
 * alone: the kernels' rounding of intermediate probabilities is not modelled). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/backend.h"
#include "ops/ops_ref.h"
#include "ops/ref/backend_ref_impl.h"

/* ------------------------------------------------------------------ host memory, its own */

static void *ref_alloc(size_t bytes) {
    size_t rounded = (bytes + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, DT_ALIGN, rounded ? rounded : DT_ALIGN) != 0 || p == NULL) return NULL;
    memset(p, 0, rounded ? rounded : DT_ALIGN);
    return p;
}
static void ref_free(void *p, size_t bytes) { (void)bytes, free(p); }
static const dt_mem_ops ref_mem = {"ref", ref_alloc, ref_free};

static void ref_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}
static void ref_fill(void *dst, int byte, size_t bytes) {
    if (bytes) memset(dst, byte, bytes);
}
static void ref_sync(void) {}

/* ------------------------------------------------------------------ widening helpers */

static double *dalloc(size_t n) {
    double *p = calloc(n ? n : 1, sizeof(double));
    DT_ASSERT(p != NULL); /* out of memory inside an operation: nothing to hand back */
    return p;
}
/* A double copy of x (n); NULL for NULL. */
static double *wid(const float *x, size_t n) {
    if (!x) return NULL;
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static void nar(float *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}
static void nar_free(float *dst, double *src, size_t n) {
    if (dst) nar(dst, src, n);
    free(src);
}

/* ------------------------------------------------------------------ conversions (exact) */

static uint32_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static float bitsf(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Rounds |x| to p significant bits at exponent max(ilogb, emin) with rint (ties to even),
 * past the format's max to Inf, then encodes: ops.h's contract written from the format's
 * definition. */
static uint16_t narrow1(int bf, float x) {
    uint32_t u = fbits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(x)) return bf ? (uint16_t)((u >> 16) | 0x40) : (uint16_t)(sign | 0x7e00 | ((u >> 13) & 0x3ff));
    uint16_t inf = bf ? 0x7f80 : 0x7c00;
    if (isinf(x)) return sign | inf;
    double ax = fabs((double)x);
    if (ax == 0.0) return sign;
    int p = bf ? 8 : 11, emin = bf ? -126 : -14;
    double maxf = bf ? ldexp(255.0, 120) : 65504.0;
    int e = ilogb(ax);
    if (e < emin) e = emin;
    double q = ldexp(rint(ldexp(ax, p - 1 - e)), e - (p - 1));
    if (q > maxf) return sign | inf;
    if (bf) return (uint16_t)(sign | (fbits((float)q) >> 16)); /* q is exact in fp32 */
    if (q < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)ldexp(q, 24));
    int qe = ilogb(q);
    return (uint16_t)(sign | ((qe + 15) << 10) | ((uint16_t)ldexp(q, 10 - qe) - 1024));
}

static float widen1(int bf, uint16_t h) {
    if (bf) return bitsf((uint32_t)h << 16);
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31) return bitsf(((uint32_t)s << 31) | 0x7f800000u | ((uint32_t)m << 13)); /* payload kept */
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)(s ? -v : v); /* exact; keeps -0 */
}

static void ref_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = narrow1(1, src[i]);
}
static void ref_bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = widen1(1, src[i]);
}
static void ref_f32_to_f16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = narrow1(0, src[i]);
}
static void ref_f16_to_f32(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = widen1(0, src[i]);
}
static size_t ref_count_nonfinite_f32(const float *x, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += !isfinite(x[i]);
    return c;
}
static void ref_ops_serial_thread(void) {} /* serial already */

/* A 16-bit operand (dt DT_BF16 or DT_F16) in double, exactly. */
static double *wid_lp(dt_dtype dt, const uint16_t *x, size_t n) {
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = widen1(dt == DT_BF16, x[i]);
    return d;
}
/* x rounded to dt (DT_F32: unchanged), in double. */
static double round_to(dt_dtype dt, double x) {
    if (dt == DT_F32) return x;
    return widen1(dt == DT_BF16, narrow1(dt == DT_BF16, (float)x));
}

/* ------------------------------------------------------------------ embeddings */

static void ref_encoder_forward(float *out, const int32_t *tokens, const float *wte, int row0, int rows, int N, int C) {
    for (int n = 0; n < N; n++)
        if (tokens[n] >= row0 && tokens[n] < row0 + rows)
            for (int i = 0; i < C; i++) out[(size_t)n * C + i] = wte[(size_t)(tokens[n] - row0) * C + i];
}

static void ref_encoder_backward(float *dwte, int row0, int rows, const float *dout, const int32_t *tokens, int N, int C) {
    double *acc = wid(dwte, (size_t)rows * C);
    for (int n = 0; n < N; n++)
        if (tokens[n] >= row0 && tokens[n] < row0 + rows)
            for (int i = 0; i < C; i++) acc[(size_t)(tokens[n] - row0) * C + i] += dout[(size_t)n * C + i];
    nar_free(dwte, acc, (size_t)rows * C);
}

static void ref_pos_forward(float *out, const float *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++) {
                size_t o = ((size_t)b * T + t) * C + i;
                out[o] = (float)((double)out[o] + wpe[(size_t)t * C + i]);
            }
}

static void ref_pos_backward(float *dwpe, const float *dout, int B, int T, int C) {
    double *acc = wid(dwpe, (size_t)T * C);
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < (size_t)T * C; i++) acc[i] += dout[(size_t)b * T * C + i];
    nar_free(dwpe, acc, (size_t)T * C);
}

/* ------------------------------------------------------------------ norms */

static void ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N, int C) {
    size_t nc = (size_t)N * C;
    double *x = wid(inp, nc), *wd = wid(w, C), *bd = wid(b, C), *o = dalloc(nc), *m = dalloc(N), *s = dalloc(N);
    dt_ref_layernorm_forward(o, m, s, x, wd, bd, N, C);
    nar_free(out, o, nc), nar_free(mean, m, N), nar_free(rstd, s, N);
    free(x), free(wd), free(bd);
}

static void ref_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                                   const float *mean, const float *rstd, int N, int C) {
    size_t nc = (size_t)N * C;
    double *dx = wid(dinp, nc), *dwd = wid(dw, C), *dbd = wid(db, C), *g = wid(dout, nc), *x = wid(inp, nc),
           *wd = wid(w, C), *m = wid(mean, N), *s = wid(rstd, N);
    dt_ref_layernorm_backward(dx, dwd, dbd, g, x, wd, m, s, N, C);
    nar_free(dinp, dx, nc), nar_free(dw, dwd, C), nar_free(db, dbd, C);
    free(g), free(x), free(wd), free(m), free(s);
}

static void ref_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    size_t nc = (size_t)N * C;
    double *x = wid(inp, nc), *wd = wid(w, C), *o = dalloc(nc), *s = dalloc(N);
    dt_ref_rmsnorm_forward(o, s, x, wd, N, C, eps);
    nar_free(out, o, nc), nar_free(rstd, s, N);
    free(x), free(wd);
}

static void ref_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                                 int N, int C) {
    size_t nc = (size_t)N * C;
    double *dx = wid(dinp, nc), *dwd = wid(dw, C), *g = wid(dout, nc), *x = wid(inp, nc), *wd = wid(w, C), *s = wid(rstd, N);
    dt_ref_rmsnorm_backward(dx, dwd, g, x, wd, s, N, C);
    nar_free(dinp, dx, nc), nar_free(dw, dwd, C);
    free(g), free(x), free(wd), free(s);
}

/* ------------------------------------------------------------------ fp32 GEMMs */

/* out (N, OC of ldo) (= or += with acc) = A (N,C) @ W (OC,C)^T + bias; all double. */
static void gemm_nt(double *out, long ldo, int acc, const double *A, const double *W, const double *bias, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int i = 0; i < C; i++) s += A[(size_t)n * C + i] * W[(size_t)o * C + i];
            out[n * ldo + o] = acc ? out[n * ldo + o] + s : s;
        }
}
/* dinp (N,C) (= or += with acc) = D (N, OC of ldd) @ W (OC,C). */
static void gemm_nn(double *dinp, int acc, const double *D, long ldd, const double *W, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            double s = 0.0;
            for (int o = 0; o < OC; o++) s += D[n * ldd + o] * W[(size_t)o * C + i];
            dinp[(size_t)n * C + i] = acc ? dinp[(size_t)n * C + i] + s : s;
        }
}
/* dw (OC,C) += D (N, OC of ldd)^T @ A (N,C). */
static void gemm_tn(double *dw, const double *D, long ldd, const double *A, int N, int C, int OC) {
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < C; i++) {
            double s = 0.0;
            for (int n = 0; n < N; n++) s += D[n * ldd + o] * A[(size_t)n * C + i];
            dw[(size_t)o * C + i] += s;
        }
}
/* A strided (rows, cols of ld) float block in double, dense. */
static double *wid_ld(const float *x, long ld, int rows, int cols) {
    double *d = dalloc((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) d[(size_t)r * cols + c] = x[r * ld + c];
    return d;
}
static void nar_ld(float *dst, long ld, const double *src, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[r * ld + c] = (float)src[(size_t)r * cols + c];
}

static void ref_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    double *x = wid(inp, (size_t)N * C), *wd = wid(w, (size_t)OC * C), *bd = wid(bias, OC), *o = dalloc((size_t)N * OC);
    gemm_nt(o, OC, 0, x, wd, bd, N, C, OC);
    nar_free(out, o, (size_t)N * OC);
    free(x), free(wd), free(bd);
}

/* dinp (= or +=, skipped when NULL), dw += (skipped when NULL), dbias += column sums (NULL:
 * skipped), from dout (N, OC of ldd) and inp, w in double. */
static void backward_d(float *dinp, int acc, float *dw, float *dbias, const double *D, long ldd, const double *x,
                       const double *wd, int N, int C, int OC) {
    if (dinp) {
        double *dx = acc ? wid(dinp, (size_t)N * C) : dalloc((size_t)N * C);
        gemm_nn(dx, acc, D, ldd, wd, N, C, OC);
        nar_free(dinp, dx, (size_t)N * C);
    }
    if (dw) {
        double *dwd = wid(dw, (size_t)OC * C);
        gemm_tn(dwd, D, ldd, x, N, C, OC);
        nar_free(dw, dwd, (size_t)OC * C);
    }
    if (dbias) {
        for (int o = 0; o < OC; o++) {
            double s = dbias[o];
            for (int n = 0; n < N; n++) s += D[n * ldd + o];
            dbias[o] = (float)s;
        }
    }
}

static void ref_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N,
                                int C, int OC) {
    double *D = wid(dout, (size_t)N * OC), *x = wid(inp, (size_t)N * C), *wd = wid(w, (size_t)OC * C);
    backward_d(dinp, 0, dw, dbias, D, OC, x, wd, N, C, OC);
    free(D), free(x), free(wd);
}

static void ref_matmul_forward_ld(float *out, int ldo, const float *inp, const float *w, int N, int C, int OC) {
    double *x = wid(inp, (size_t)N * C), *wd = wid(w, (size_t)OC * C), *o = dalloc((size_t)N * OC);
    gemm_nt(o, OC, 0, x, wd, NULL, N, C, OC);
    nar_ld(out, ldo, o, N, OC);
    free(x), free(wd), free(o);
}

static void ref_matmul_backward_ld(float *dinp, int accumulate, float *dw, const float *dout, int ldd, const float *inp,
                                   const float *w, int N, int C, int OC) {
    double *D = wid_ld(dout, ldd, N, OC), *x = wid(inp, (size_t)N * C), *wd = wid(w, (size_t)OC * C);
    backward_d(dinp, accumulate, dw, NULL, D, OC, x, wd, N, C, OC);
    free(D), free(x), free(wd);
}

/* ------------------------------------------------------------------ 16-bit GEMMs */

static void ref_matmul_forward_lp(dt_dtype dt, float *out, const uint16_t *inp, const uint16_t *w, const float *bias, int N,
                                  int C, int OC) {
    double *x = wid_lp(dt, inp, (size_t)N * C), *wd = wid_lp(dt, w, (size_t)OC * C), *bd = wid(bias, OC),
           *o = dalloc((size_t)N * OC);
    gemm_nt(o, OC, 0, x, wd, bd, N, C, OC);
    nar_free(out, o, (size_t)N * OC);
    free(x), free(wd), free(bd);
}

static void ref_to_lowp(dt_dtype dt, uint16_t *dst, const float *src, size_t n) {
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    for (size_t i = 0; i < n; i++) dst[i] = narrow1(dt == DT_BF16, src[i]);
}

static void ref_matmul_backward_lp(dt_dtype dt, float *dinp, float *dw, float *dbias, const float *dout, uint16_t *dout_lp,
                                   const uint16_t *inp, const uint16_t *w, int N, int C, int OC) {
    const size_t no = (size_t)N * OC;
    ref_to_lowp(dt, dout_lp, dout, no);
    double *D = wid_lp(dt, dout_lp, no), *x = wid_lp(dt, inp, (size_t)N * C), *wd = wid_lp(dt, w, (size_t)OC * C);
    backward_d(dinp, 0, dw, NULL, D, OC, x, wd, N, C, OC);
    if (dbias) { /* from the fp32 dout */
        double *Df = wid(dout, no);
        backward_d(NULL, 0, NULL, dbias, Df, OC, x, wd, N, C, OC);
        free(Df);
    }
    free(D), free(x), free(wd);
}

static void ref_matmul_forward_ld_lp(dt_dtype dt, float *out, int ldo, const uint16_t *inp, const uint16_t *w, int N, int C,
                                     int OC) {
    double *x = wid_lp(dt, inp, (size_t)N * C), *wd = wid_lp(dt, w, (size_t)OC * C), *o = dalloc((size_t)N * OC);
    gemm_nt(o, OC, 0, x, wd, NULL, N, C, OC);
    nar_ld(out, ldo, o, N, OC);
    free(x), free(wd), free(o);
}

static void ref_matmul_backward_ld_lp(dt_dtype dt, float *dinp, int accumulate, float *dw, const uint16_t *dout_lp, int ldd,
                                      const uint16_t *inp, const uint16_t *w, int N, int C, int OC) {
    double *D = dalloc((size_t)N * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) D[(size_t)n * OC + o] = widen1(dt == DT_BF16, dout_lp[(size_t)n * ldd + o]);
    double *x = wid_lp(dt, inp, (size_t)N * C), *wd = wid_lp(dt, w, (size_t)OC * C);
    backward_d(dinp, accumulate, dw, NULL, D, OC, x, wd, N, C, OC);
    free(D), free(x), free(wd);
}

/* ------------------------------------------------------------------ NF4 */

/* ops.h's dequantization, element by element: scale = fmaf(q, step, offset), value =
 * code[index] * scale, both fp32 (the contract's bits). */
static void ref_nf4_dequantize(float *dst, const dt_nf4 *t, size_t i0, size_t n) {
    DT_ASSERT(i0 <= t->n && n <= t->n - i0);
    const float *code = dt_nf4_codebook();
    for (size_t j = 0; j < n; j++) {
        size_t i = i0 + j, b = i / DT_NF4_BLOCK;
        float scale = fmaf((float)t->qabsmax[b], t->step[b / DT_NF4_GROUP], *t->offset);
        int k = i % 2 == 0 ? t->codes[i / 2] >> 4 : t->codes[i / 2] & 15;
        dst[j] = code[k] * scale;
    }
}

/* ops.h's quantization: the indices and exact block absmaxes from dt_ref_nf4_quantize (nearest
 * code value by distance, in double), then the double quantization of the absmaxes as the
 * contract states it (offset: the mean of the absmaxes, each group's sum rounded to fp32 and
 * the group sums added in order; per group step = max |absmax - offset| / 127 in fp32;
 * q = nearbyint((absmax - offset) / step)). */
static dt_status ref_nf4_quantize(dt_ctx *ctx, const char *name, dt_nf4 *t, const float *w, size_t n) {
    DT_ASSERT(t->n == n);
    size_t bad = ref_count_nonfinite_f32(w, n);
    if (bad) return dt_fail(ctx, DT_ERR_NUMERIC, "nf4: tensor %s has %zu NaN/Inf values of %zu; cannot quantize it", name, bad, n);
    const size_t nb = dt_nf4_blocks(n), ng = dt_nf4_groups(n);
    uint8_t *idx = malloc(n ? n : 1);
    double *amax = dalloc(nb);
    DT_ASSERT(idx != NULL);
    dt_ref_nf4_quantize(idx, amax, w, n);
    double sum = 0.0;
    for (size_t g = 0; g < ng; g++) {
        double s = 0.0;
        for (size_t b = g * DT_NF4_GROUP; b < nb && b < (g + 1) * DT_NF4_GROUP; b++) s += amax[b];
        sum += (float)s;
    }
    const float offset = nb ? (float)(sum / (double)nb) : 0.0f;
    *t->offset = offset;
    for (size_t g = 0; g < ng; g++) {
        size_t b0 = g * DT_NF4_GROUP, b1 = b0 + DT_NF4_GROUP < nb ? b0 + DT_NF4_GROUP : nb;
        double dev = 0.0;
        for (size_t b = b0; b < b1; b++) dev = fmax(dev, fabs(amax[b] - offset));
        const float step = (float)(dev / 127.0);
        t->step[g] = step;
        for (size_t b = b0; b < b1; b++) {
            double q = step > 0.0f ? nearbyint((amax[b] - offset) / step) : 0.0;
            t->qabsmax[b] = (int8_t)(q > 127.0 ? 127 : q < -127.0 ? -127 : q);
        }
    }
    memset(t->codes, 0, (n + 1) / 2);
    for (size_t i = 0; i < n; i++) t->codes[i / 2] |= (uint8_t)(i % 2 == 0 ? idx[i] << 4 : idx[i]);
    free(idx), free(amax);
    return DT_OK;
}

/* The dequantized weight (OC,C), rounded to dt (DT_F32: as is), in double. */
static double *nf4_weight(dt_dtype dt, const dt_nf4 *w, size_t n) {
    float *f = malloc(n * sizeof(float) + 1);
    DT_ASSERT(f != NULL);
    ref_nf4_dequantize(f, w, 0, n);
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = round_to(dt, f[i]);
    free(f);
    return d;
}

static void nf4_forward(dt_dtype dt, float *out, double *x, const dt_nf4 *w, const float *bias, int N, int C, int OC) {
    double *wd = nf4_weight(dt, w, (size_t)OC * C), *bd = wid(bias, OC), *o = dalloc((size_t)N * OC);
    gemm_nt(o, OC, 0, x, wd, bd, N, C, OC);
    nar_free(out, o, (size_t)N * OC);
    free(x), free(wd), free(bd);
}

static void nf4_backward(dt_dtype dt, float *dinp, int accumulate, double *D, const dt_nf4 *w, int N, int C, int OC) {
    double *wd = nf4_weight(dt, w, (size_t)OC * C);
    backward_d(dinp, accumulate, NULL, NULL, D, OC, NULL, wd, N, C, OC);
    free(D), free(wd);
}

static void ref_matmul_forward_nf4(float *out, const float *inp, const dt_nf4 *w, const float *bias, int N, int C, int OC) {
    nf4_forward(DT_F32, out, wid(inp, (size_t)N * C), w, bias, N, C, OC);
}
static void ref_matmul_backward_nf4(float *dinp, int accumulate, const float *dout, const dt_nf4 *w, int N, int C, int OC) {
    nf4_backward(DT_F32, dinp, accumulate, wid(dout, (size_t)N * OC), w, N, C, OC);
}
static void ref_matmul_forward_nf4_lp(dt_dtype dt, float *out, const uint16_t *inp, const dt_nf4 *w, const float *bias, int N,
                                      int C, int OC) {
    nf4_forward(dt, out, wid_lp(dt, inp, (size_t)N * C), w, bias, N, C, OC);
}
static void ref_matmul_backward_nf4_lp(dt_dtype dt, float *dinp, int accumulate, const uint16_t *dout_lp, const dt_nf4 *w,
                                       int N, int C, int OC) {
    nf4_backward(dt, dinp, accumulate, wid_lp(dt, dout_lp, (size_t)N * OC), w, N, C, OC);
}
static size_t ref_nf4_panel_bytes(void) { return 0; } /* no kept panels: scratch per call */

/* ------------------------------------------------------------------ attention */

/* The 16-bit operand types round q, k, v (and dO) before the double computation; the kernels'
 * rounding of the probabilities inside the tiles is not modelled (test tolerances cover it). */
static void ref_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs, int causal,
                                  dt_dtype op) {
    const size_t nq = (size_t)B * T * (NH + 2 * NKV) * hs, no = (size_t)B * T * NH * hs, nl = (size_t)B * NH * T;
    double *q = wid(qkv, nq), *o = dalloc(no), *l = dalloc(nl);
    for (size_t i = 0; i < nq; i++) q[i] = round_to(op, q[i]);
    dt_ref_attention_forward(o, l, q, B, T, NH, NKV, hs, causal);
    nar_free(out, o, no), nar_free(lse, l, nl);
    free(q);
}

static void ref_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int B,
                                   int T, int NH, int NKV, int hs, int causal, dt_dtype op) {
    (void)out, (void)lse; /* recomputed from qkv, in double */
    const size_t nq = (size_t)B * T * (NH + 2 * NKV) * hs, no = (size_t)B * T * NH * hs;
    double *q = wid(qkv, nq), *g = wid(dout, no), *dq = dalloc(nq);
    for (size_t i = 0; i < nq; i++) q[i] = round_to(op, q[i]);
    for (size_t i = 0; i < no; i++) g[i] = round_to(op, g[i]);
    dt_ref_attention_backward(dq, g, q, NULL, NULL, B, T, NH, NKV, hs, causal);
    nar_free(dqkv, dq, nq);
    free(q), free(g);
}

/* Blocks of the ring (ops.h): the definition, in double, over strided float rows; the
 * 16-bit operand types round q, k, v and dO first, as above. */
static double rd(dt_dtype op, float x) { return round_to(op, (double)x); }

static void ref_attention_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *kv,
                                        int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op) {
    const double scale = 1.0 / sqrt((double)hs);
    double *s = dalloc((size_t)Tk), *acc = dalloc((size_t)hs);
    for (int h = 0; h < NH; h++) {
        const int g = h / (NH / NKV);
        for (int i = 0; i < Tq; i++) {
            const int nk = causal ? i + 1 : Tk;
            double m = -INFINITY, sum = 0.0;
            for (int j = 0; j < nk; j++) {
                double d = 0.0;
                for (int x = 0; x < hs; x++)
                    d += rd(op, q[(size_t)i * ldq + (size_t)h * hs + x]) * rd(op, kv[(size_t)j * ldkv + (size_t)g * hs + x]);
                s[j] = d * scale;
                m = s[j] > m ? s[j] : m;
            }
            for (int j = 0; j < nk; j++) sum += exp(s[j] - m);
            for (int x = 0; x < hs; x++) acc[x] = 0.0;
            for (int j = 0; j < nk; j++) {
                const double p = exp(s[j] - m) / sum;
                for (int x = 0; x < hs; x++) acc[x] += p * rd(op, kv[(size_t)j * ldkv + (size_t)(NKV + g) * hs + x]);
            }
            for (int x = 0; x < hs; x++) out[(size_t)i * ldo + (size_t)h * hs + x] = (float)acc[x];
            lse[(size_t)h * ldl + i] = (float)(m + log(sum));
        }
    }
    free(s), free(acc);
}

static void ref_attention_block_backward(float *dq, int lddq, float *dkv, int lddkv, const float *dout, const float *out,
                                         int ldo, const float *lse, int ldl, const float *q, int ldq, const float *kv,
                                         int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op) {
    const double scale = 1.0 / sqrt((double)hs);
    double *gq = dalloc((size_t)Tq * NH * hs), *gkv = dalloc((size_t)Tk * 2 * NKV * hs);
    for (int h = 0; h < NH; h++) {
        const int g = h / (NH / NKV);
        for (int i = 0; i < Tq; i++) {
            const int nk = causal ? i + 1 : Tk;
            const float *oi = out + (size_t)i * ldo + (size_t)h * hs, *di = dout + (size_t)i * ldo + (size_t)h * hs;
            double D = 0.0; /* rowsum(dO O) over the merged output: this block's share of the softmax */
            for (int x = 0; x < hs; x++) D += rd(op, di[x]) * (double)oi[x];
            for (int j = 0; j < nk; j++) {
                const float *kj = kv + (size_t)j * ldkv + (size_t)g * hs, *vj = kv + (size_t)j * ldkv + (size_t)(NKV + g) * hs;
                double sdot = 0.0, dp = 0.0;
                for (int x = 0; x < hs; x++) {
                    sdot += rd(op, q[(size_t)i * ldq + (size_t)h * hs + x]) * rd(op, kj[x]);
                    dp += rd(op, di[x]) * rd(op, vj[x]);
                }
                const double p = exp(sdot * scale - (double)lse[(size_t)h * ldl + i]), ds = p * (dp - D) * scale;
                for (int x = 0; x < hs; x++) {
                    gq[((size_t)i * NH + h) * hs + x] += ds * rd(op, kj[x]);
                    gkv[((size_t)j * 2 * NKV + g) * hs + x] += ds * rd(op, q[(size_t)i * ldq + (size_t)h * hs + x]);
                    gkv[((size_t)j * 2 * NKV + NKV + g) * hs + x] += p * rd(op, di[x]);
                }
            }
        }
    }
    for (int i = 0; i < Tq; i++)
        for (int c = 0; c < NH * hs; c++) dq[(size_t)i * lddq + c] += (float)gq[(size_t)i * NH * hs + c];
    for (int j = 0; j < Tk; j++)
        for (int c = 0; c < 2 * NKV * hs; c++) dkv[(size_t)j * lddkv + c] += (float)gkv[(size_t)j * 2 * NKV * hs + c];
    free(gq), free(gkv);
}

static void ref_attention_merge(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb,
                                int ldlb, int T, int NH, int hs) {
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < T; t++) {
            const double a = lse[(size_t)h * ldl + t], b = lb[(size_t)h * ldlb + t];
            if (b == -INFINITY) continue;
            float *o = out + (size_t)t * ldo + (size_t)h * hs;
            const float *x = ob + (size_t)t * ldob + (size_t)h * hs;
            const double l = a == -INFINITY ? b : (a > b ? a : b) + log(exp(a - (a > b ? a : b)) + exp(b - (a > b ? a : b)));
            const double wa = a == -INFINITY ? 0.0 : exp(a - l), wb = exp(b - l);
            for (int d = 0; d < hs; d++) o[d] = (float)(wa * o[d] + wb * x[d]);
            lse[(size_t)h * ldl + t] = (float)l;
        }
}

/* ------------------------------------------------------------------ RoPE, activations, loss */

static void rope(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale, int backward) {
    const size_t n = (size_t)B * T * (NH + 2 * NKV) * hs;
    double *x = wid(qkv, n), *inv = wid(inv_freq, (size_t)hs / 2);
    if (backward) dt_ref_rope_backward(x, B, T, NH, NKV, hs, inv, scale);
    else dt_ref_rope_forward(x, B, T, NH, NKV, hs, inv, scale);
    nar_free(qkv, x, n);
    free(inv);
}
static void ref_rope_forward(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale) {
    rope(qkv, B, T, NH, NKV, hs, inv_freq, scale, 0);
}
static void ref_rope_backward(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale) {
    rope(dqkv, B, T, NH, NKV, hs, inv_freq, scale, 1);
}
static void rope_at(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale,
                    int backward) {
    const size_t n = (size_t)B * T * (NH + 2 * NKV) * hs;
    double *x = wid(qkv, n), *inv = wid(inv_freq, (size_t)hs / 2);
    dt_ref_rope_at(x, B, T, pos0, NH, NKV, hs, inv, scale, backward);
    nar_free(qkv, x, n);
    free(inv);
}
static void ref_rope_forward_at(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq,
                                float scale) {
    rope_at(qkv, B, T, pos0, NH, NKV, hs, inv_freq, scale, 0);
}
static void ref_rope_backward_at(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq,
                                 float scale) {
    rope_at(dqkv, B, T, pos0, NH, NKV, hs, inv_freq, scale, 1);
}

static void ref_swiglu_forward(float *out, const float *inp, int N, int F) {
    double *x = wid(inp, (size_t)N * 2 * F), *o = dalloc((size_t)N * F);
    dt_ref_swiglu_forward(o, x, N, F);
    nar_free(out, o, (size_t)N * F);
    free(x);
}
static void ref_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F) {
    double *x = wid(inp, (size_t)N * 2 * F), *g = wid(dout, (size_t)N * F), *dx = dalloc((size_t)N * 2 * F);
    dt_ref_swiglu_backward(dx, x, g, N, F);
    nar_free(dinp, dx, (size_t)N * 2 * F);
    free(x), free(g);
}

static void ref_gelu_forward(float *out, const float *inp, int N) {
    double *x = wid(inp, N), *o = dalloc(N);
    dt_ref_gelu_forward(o, x, N);
    nar_free(out, o, N);
    free(x);
}
static void ref_gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
    double *x = wid(inp, N), *g = wid(dout, N), *dx = dalloc(N); /* dinp may alias dout */
    dt_ref_gelu_backward(dx, x, g, N);
    nar_free(dinp, dx, N);
    free(x), free(g);
}

static void ref_residual_forward(float *out, const float *a, const float *b, int N) {
    for (int i = 0; i < N; i++) out[i] = (float)((double)a[i] + b[i]); /* out may alias a or b */
}

static void ref_crossentropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets, int N, int V, int Vp) {
    double *x = wid(logits, (size_t)N * Vp), *l = dalloc(N), *s = dalloc(N);
    dt_ref_crossentropy_forward(l, s, x, targets, N, V, Vp);
    nar_free(losses, l, N), nar_free(lse, s, N);
    free(x);
}
static void ref_crossentropy_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets, float dloss,
                                      int N, int V, int Vp) {
    double *x = wid(logits, (size_t)N * Vp), *s = wid(lse, N), *d = dalloc((size_t)N * Vp); /* may alias logits */
    dt_ref_crossentropy_backward(d, x, s, targets, dloss, N, V, Vp);
    nar_free(dlogits, d, (size_t)N * Vp);
    free(x), free(s);
}

/* exp in double (no flushing below -87.3: that is the kernels' approximation), the sum of
 * the double values in index order, each rounded once. */
static float ref_exp_sum(float *y, const float *x, float shift, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        double e = exp((double)x[i] - shift);
        s += e;
        if (y) y[i] = (float)e; /* y may alias x: x[i] is read first */
    }
    return (float)s;
}

/* ------------------------------------------------------------------ rates */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The rate of this backend's own GEMM loop (what MFU under DTRAIN_BACKEND=ref is relative
 * to), on at most a 256 cube: the naive loop runs a 2048 cube (the trainer's probe) in
 * tens of seconds and its rate does not grow with the size. Median of reps, best in *best. */
static double ref_matmul_peak_gflops(int n, int reps, double *best) {
    if (n > 256) n = 256;
    if (n < 1) n = 1;
    if (reps < 1) reps = 1;
    const size_t nn = (size_t)n * n;
    double *a = dalloc(nn), *b = dalloc(nn), *c = dalloc(nn), *r = dalloc(reps);
    for (size_t i = 0; i < nn; i++) a[i] = (double)(i % 7) - 3.0, b[i] = (double)(i % 5) - 2.0;
    for (int k = 0; k < reps; k++) {
        double t0 = now_s();
        gemm_nt(c, n, 0, a, b, NULL, n, n, n);
        double dt = now_s() - t0;
        r[k] = 2.0 * n * (double)nn / (dt > 1e-9 ? dt : 1e-9) / 1e9;
    }
    qsort(r, reps, sizeof *r, cmp_d);
    double med = r[reps / 2];
    if (best) *best = r[reps - 1];
    free(a), free(b), free(c), free(r);
    return med;
}
static double ref_matmul_peak_gflops_lp(dt_dtype dt, int n, int reps, double *best) {
    (void)dt; /* the 16-bit GEMMs are the same double loop on widened operands */
    return ref_matmul_peak_gflops(n, reps, best);
}
static int ref_lowp_gemm_native(dt_dtype dt) { return (void)dt, 0; }
static void ref_matmul_lowp_cache_clear(void) {} /* nothing cached */

const dt_backend dt_backend_ref = {
    .name = "ref",
    .mem = &ref_mem,
    .copy = ref_copy,
    .fill = ref_fill,
    .sync = ref_sync,
    .encoder_forward = ref_encoder_forward,
    .encoder_backward = ref_encoder_backward,
    .pos_forward = ref_pos_forward,
    .pos_backward = ref_pos_backward,
    .layernorm_forward = ref_layernorm_forward,
    .layernorm_backward = ref_layernorm_backward,
    .matmul_forward = ref_matmul_forward,
    .matmul_backward = ref_matmul_backward,
    .matmul_forward_ld = ref_matmul_forward_ld,
    .matmul_backward_ld = ref_matmul_backward_ld,
    .attention_forward = ref_attention_forward,
    .attention_backward = ref_attention_backward,
    .attention_block_forward = ref_attention_block_forward,
    .attention_block_backward = ref_attention_block_backward,
    .attention_merge = ref_attention_merge,
    .rmsnorm_forward = ref_rmsnorm_forward,
    .rmsnorm_backward = ref_rmsnorm_backward,
    .rope_forward = ref_rope_forward,
    .rope_backward = ref_rope_backward,
    .rope_forward_at = ref_rope_forward_at,
    .rope_backward_at = ref_rope_backward_at,
    .swiglu_forward = ref_swiglu_forward,
    .swiglu_backward = ref_swiglu_backward,
    .gelu_forward = ref_gelu_forward,
    .gelu_backward = ref_gelu_backward,
    .residual_forward = ref_residual_forward,
    .crossentropy_forward = ref_crossentropy_forward,
    .crossentropy_backward = ref_crossentropy_backward,
    .exp_sum = ref_exp_sum,
    .f32_to_bf16 = ref_f32_to_bf16,
    .bf16_to_f32 = ref_bf16_to_f32,
    .f32_to_f16 = ref_f32_to_f16,
    .f16_to_f32 = ref_f16_to_f32,
    .count_nonfinite_f32 = ref_count_nonfinite_f32,
    .matmul_forward_lp = ref_matmul_forward_lp,
    .matmul_backward_lp = ref_matmul_backward_lp,
    .matmul_forward_ld_lp = ref_matmul_forward_ld_lp,
    .matmul_backward_ld_lp = ref_matmul_backward_ld_lp,
    .matmul_forward_nf4 = ref_matmul_forward_nf4,
    .matmul_backward_nf4 = ref_matmul_backward_nf4,
    .matmul_forward_nf4_lp = ref_matmul_forward_nf4_lp,
    .matmul_backward_nf4_lp = ref_matmul_backward_nf4_lp,
    .nf4_quantize = ref_nf4_quantize,
    .nf4_dequantize = ref_nf4_dequantize,
    .matmul_peak_gflops = ref_matmul_peak_gflops,
    .matmul_peak_gflops_lp = ref_matmul_peak_gflops_lp,
    .lowp_gemm_native = ref_lowp_gemm_native,
    .matmul_lowp_cache_clear = ref_matmul_lowp_cache_clear,
    .nf4_panel_bytes = ref_nf4_panel_bytes,
    .ops_serial_thread = ref_ops_serial_thread,
    /* parallel/ and optim/ operations (backend_ref_train.c) */
    .adamw_chunked = dt_ref_be_adamw_chunked,
    .adamw_aged = dt_ref_be_adamw_aged,
    .sumsq_chunked = dt_ref_be_sumsq_chunked,
    .add_f32 = dt_ref_be_add_f32,
    .scale_f32 = dt_ref_be_scale_f32,
    /* model/ operations (backend_ref_train.c) */
    .patchify = dt_ref_be_patchify,
    .cls_pos_forward = dt_ref_be_cls_pos_forward,
    .cls_pos_backward = dt_ref_be_cls_pos_backward,
    .crossentropy_backward_blocks = dt_ref_be_crossentropy_backward_blocks,
    .f32_to_lowp_rows_inplace = dt_ref_be_f32_to_lowp_rows_inplace,
    .lowrank_down_forward = dt_ref_be_lowrank_down_forward,
    .lowrank_up_forward = dt_ref_be_lowrank_up_forward,
    .lowrank_up_backward = dt_ref_be_lowrank_up_backward,
    .lowrank_down_backward = dt_ref_be_lowrank_down_backward,
    .fill_normal = dt_ref_be_fill_normal,
    .fill_f32 = dt_ref_be_fill_f32,
    .lowrank_merge = dt_ref_be_lowrank_merge,
};
