/* NF4 weights (ops.h "NF4"): the code book, the layout, quantization, dequantization and the
 * linear layers whose frozen weight is NF4.
 *
 * Quantization runs once per tensor (when a base model is loaded), so it is plain C with
 * OpenMP over groups of 256 blocks; dequantization is a per-ISA kernel (kern/nf4.c). The
 * matmuls dequantize the weight panel by panel into the calling thread's buffers and hand
 * each panel to the GEMM that runs the dense layers (matmul.c's sgemm, or matmul_lowp.c's
 * 16-bit GEMM), splitting only the output dimension, never K. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/kernels.h"
#include "ops/ops.h"

/* bitsandbytes' offset, the outermost quantile's probability (the published code book was
 * made with it; it is the mean of 1 - 1/(2 15) and 1 - 1/(2 16) to 7 digits). */
#define NF4_DELTA 0.9677083

/* ------------------------------------------------------------------ the code book */

static double norm_cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

/* The standard normal quantile of p in (0, 1), by bisection on the CDF: slow (16 values,
 * once) but obviously right, to the last bits of a double. */
static double norm_ppf(double p) {
    double lo = -40.0, hi = 40.0;
    for (int it = 0; it < 200 && hi - lo > 0.0; it++) {
        double mid = 0.5 * (lo + hi);
        if (mid == lo || mid == hi) break;
        if (norm_cdf(mid) < p) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void dt_nf4_codebook_derive(double code[16]) {
    int k = 0;
    /* Positive half: 8 quantiles at linspace(delta, 1/2, 9) without its last point (1/2,
     * whose quantile is the 0 added below); negative half: 7 from linspace(delta, 1/2, 8). */
    for (int i = 0; i < 8; i++) code[k++] = norm_ppf(NF4_DELTA + (0.5 - NF4_DELTA) * i / 8.0);
    for (int i = 0; i < 7; i++) code[k++] = -norm_ppf(NF4_DELTA + (0.5 - NF4_DELTA) * i / 7.0);
    code[k++] = 0.0;
    qsort(code, 16, sizeof code[0], cmp_dbl);
    double top = code[15];
    for (int i = 0; i < 16; i++) code[i] /= top;
}

static struct {
    pthread_once_t once;
    float code[16]; /* 64-byte table for the vector lookups */
    float mid[15];  /* decision points between adjacent code values */
    double half_gap;
} g_nf4 = {.once = PTHREAD_ONCE_INIT};

static void nf4_init(void) {
    double c[16];
    dt_nf4_codebook_derive(c);
    for (int i = 0; i < 16; i++) g_nf4.code[i] = (float)c[i];
    g_nf4.half_gap = 0.0;
    for (int i = 0; i < 15; i++) {
        g_nf4.mid[i] = (g_nf4.code[i] + g_nf4.code[i + 1]) * 0.5f;
        double gap = 0.5 * ((double)g_nf4.code[i + 1] - g_nf4.code[i]);
        if (gap > g_nf4.half_gap) g_nf4.half_gap = gap;
    }
}

const float *dt_nf4_codebook(void) {
    pthread_once(&g_nf4.once, nf4_init);
    return g_nf4.code;
}

double dt_nf4_half_gap(void) {
    pthread_once(&g_nf4.once, nf4_init);
    return g_nf4.half_gap;
}

/* ------------------------------------------------------------------ layout */

size_t dt_nf4_blocks(size_t n) { return (n + DT_NF4_BLOCK - 1) / DT_NF4_BLOCK; }

size_t dt_nf4_groups(size_t n) { return (dt_nf4_blocks(n) + DT_NF4_GROUP - 1) / DT_NF4_GROUP; }

size_t dt_nf4_bytes(size_t n) {
    return sizeof(float) * (1 + dt_nf4_groups(n)) + dt_nf4_blocks(n) + (n + 1) / 2;
}

void dt_nf4_bind(dt_nf4 *t, void *buf, size_t n) {
    DT_ASSERT(((uintptr_t)buf & 3u) == 0);
    char *p = buf;
    t->n = n;
    t->offset = (float *)p;
    t->step = (float *)(p + sizeof(float));
    p += sizeof(float) * (1 + dt_nf4_groups(n));
    t->qabsmax = (int8_t *)p;
    t->codes = (uint8_t *)(p + dt_nf4_blocks(n));
}

/* ------------------------------------------------------------------ quantization */

static float block_absmax(const float *w, size_t n, size_t b) {
    size_t i0 = b * DT_NF4_BLOCK, i1 = i0 + DT_NF4_BLOCK < n ? i0 + DT_NF4_BLOCK : n;
    float m = 0.0f;
    for (size_t i = i0; i < i1; i++) m = fabsf(w[i]) > m ? fabsf(w[i]) : m;
    return m;
}

/* The index of the code value nearest to x in [-1, 1]: how many decision points lie below
 * it (x on a decision point goes to the lower value). */
static inline unsigned nearest_index(float x) {
    unsigned k = 0;
    for (int i = 0; i < 15; i++) k += x > g_nf4.mid[i];
    return k;
}

dt_status dt_cpu_nf4_quantize(dt_ctx *ctx, const char *name, dt_nf4 *t, const float *w, size_t n) {
    DT_ASSERT(t->n == n);
    pthread_once(&g_nf4.once, nf4_init);
    size_t bad = dt_cpu_count_nonfinite_f32(w, n);
    if (bad)
        return dt_fail(ctx, DT_ERR_NUMERIC,
                       "nf4: tensor %s has %zu NaN/Inf values of %zu; cannot quantize it", name,
                       bad, n);
    const size_t nb = dt_nf4_blocks(n);
    const long ng = (long)dt_nf4_groups(n);
    /* The mean of the block absmaxes: each group's sum (in double, block order) rounded to
     * fp32 into its step slot, then the group sums in order: independent of the threads. */
#pragma omp parallel for schedule(static)
    for (long g = 0; g < ng; g++) {
        size_t b1 = ((size_t)g + 1) * DT_NF4_GROUP < nb ? ((size_t)g + 1) * DT_NF4_GROUP : nb;
        double s = 0.0;
        for (size_t b = (size_t)g * DT_NF4_GROUP; b < b1; b++) s += block_absmax(w, n, b);
        t->step[g] = (float)s;
    }
    double sum = 0.0;
    for (long g = 0; g < ng; g++) sum += t->step[g];
    const float offset = nb ? (float)(sum / (double)nb) : 0.0f;
    *t->offset = offset;

#pragma omp parallel for schedule(static)
    for (long g = 0; g < ng; g++) {
        size_t b0 = (size_t)g * DT_NF4_GROUP, b1 = b0 + DT_NF4_GROUP < nb ? b0 + DT_NF4_GROUP : nb;
        float amax[DT_NF4_GROUP];
        double dev = 0.0;
        for (size_t b = b0; b < b1; b++) {
            amax[b - b0] = block_absmax(w, n, b);
            double d = fabs((double)amax[b - b0] - offset);
            dev = d > dev ? d : dev;
        }
        /* The absmaxes, second level: symmetric int8 around the mean, step = max dev / 127. */
        const float step = (float)(dev / 127.0);
        t->step[g] = step;
        for (size_t b = b0; b < b1; b++) {
            double q = step > 0.0f ? nearbyint(((double)amax[b - b0] - offset) / step) : 0.0;
            t->qabsmax[b] = (int8_t)(q > 127.0 ? 127 : q < -127.0 ? -127 : q);
            /* The elements, first level: with the exact absmax (as the paper quantizes; the
             * double quantization error adds to it on dequantization). */
            const float a = amax[b - b0];
            size_t i0 = b * DT_NF4_BLOCK, i1 = i0 + DT_NF4_BLOCK < n ? i0 + DT_NF4_BLOCK : n;
            for (size_t i = i0; i < i1; i += 2) {
                unsigned hi = nearest_index(a > 0.0f ? w[i] / a : 0.0f);
                unsigned lo = i + 1 < i1 ? nearest_index(a > 0.0f ? w[i + 1] / a : 0.0f) : 0u;
                t->codes[i / 2] = (uint8_t)(hi << 4 | lo);
            }
        }
    }
    return DT_OK;
}

/* ------------------------------------------------------------------ dequantization */

#define NF4_CHUNK 16384    /* elements per OpenMP work item */
#define NF4_PAR_MIN 65536  /* below this, the calling thread alone */

void dt_cpu_nf4_dequantize(float *dst, const dt_nf4 *t, size_t i0, size_t n) {
    DT_ASSERT(i0 <= t->n && n <= t->n - i0);
    const dt_cpu_kernels *k = dt_cpu_kernels_get();
    const float *code = dt_nf4_codebook();
    if (n < NF4_PAR_MIN || dt_cpu_serial) {
        k->nf4_dequant(dst, t->codes, t->qabsmax, t->step, *t->offset, code, i0, n);
        return;
    }
    long nc = (long)((n + NF4_CHUNK - 1) / NF4_CHUNK);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < nc; c++) {
        size_t a = (size_t)c * NF4_CHUNK, m = n - a < NF4_CHUNK ? n - a : NF4_CHUNK;
        k->nf4_dequant(dst + a, t->codes, t->qabsmax, t->step, *t->offset, code, i0 + a, m);
    }
}

/* dst (rows, cols) dense = columns [c0, c0 + cols) of rows [0, rows) of t read as a
 * (rows, ld) matrix. */
static void dequant_cols(float *dst, const dt_nf4 *t, long rows, long ld, long c0, long cols) {
    if (cols == ld) {
        dt_cpu_nf4_dequantize(dst, t, 0, (size_t)rows * (size_t)ld);
        return;
    }
    const dt_cpu_kernels *k = dt_cpu_kernels_get();
    const float *code = dt_nf4_codebook();
#pragma omp parallel for schedule(static) if (!dt_cpu_serial)
    for (long r = 0; r < rows; r++)
        k->nf4_dequant(dst + (size_t)r * cols, t->codes, t->qabsmax, t->step, *t->offset, code,
                       (size_t)r * ld + c0, (size_t)cols);
}

/* ------------------------------------------------------------------ panels and matmuls */

/* The calling thread's panels: fp32 (0) and its 16-bit copy (1), kept between calls. */
static __thread void *g_panel[2];
static __thread size_t g_panel_cap[2];

static void *panel(int which, size_t bytes) {
    if (bytes > g_panel_cap[which]) {
        free(g_panel[which]);
        g_panel_cap[which] = (bytes + 4095) / 4096 * 4096;
        g_panel[which] = aligned_alloc(64, g_panel_cap[which]);
        DT_ASSERT(g_panel[which] != NULL); /* out of memory inside a GEMM: nothing to hand back */
    }
    return g_panel[which];
}

size_t dt_cpu_nf4_panel_bytes(void) { return g_panel_cap[0] + g_panel_cap[1]; }

/* Rows of w (OC,C) per forward panel: whole rows, at most DT_NF4_PANEL floats (one row at
 * least). */
static long panel_rows(int C, int OC) {
    long r = (long)(DT_NF4_PANEL / (size_t)C);
    return r < 1 ? 1 : r > OC ? OC : r;
}

/* Columns of w per backward panel (all OC rows): a multiple of the block size when that fits,
 * so most rows' slices start on a block. */
static long panel_cols(int C, int OC) {
    long c = (long)(DT_NF4_PANEL / (size_t)OC);
    if (c >= DT_NF4_BLOCK) c -= c % DT_NF4_BLOCK;
    return c < 1 ? 1 : c > C ? C : c;
}

static float prefill_bias(float *out, const float *bias, int N, int OC) {
    if (!bias) return 0.0f;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    return 1.0f;
}

/* out (N,OC) = inp @ deq(w)^T: panels of whole rows of w, each GEMM over the whole K = C. lp:
 * 0 for fp32 operands (inp is float), else the 16-bit dtype (inp is uint16_t). */
static void forward_nf4(dt_dtype lp, float *out, const void *inp, const dt_nf4 *w,
                        const float *bias, int N, int C, int OC) {
    DT_ASSERT(N >= 0 && C > 0 && OC >= 0 && w->n == (size_t)OC * (size_t)C);
    if (N == 0 || OC == 0) return;
    const float beta = prefill_bias(out, bias, N, OC);
    const long rb = panel_rows(C, OC);
    float *p = panel(0, (size_t)rb * C * sizeof(float));
    uint16_t *q = lp != DT_F32 ? panel(1, (size_t)rb * C * sizeof(uint16_t)) : NULL;
    for (long o0 = 0; o0 < OC; o0 += rb) {
        long m = OC - o0 < rb ? OC - o0 : rb;
        dt_cpu_nf4_dequantize(p, w, (size_t)o0 * C, (size_t)m * C);
        if (lp == DT_F32) {
            dt_sgemm('N', 'T', N, m, C, inp, C, p, C, beta, out + o0, OC);
        } else {
            dt_to_lowp(lp, q, p, (size_t)m * C);
            dt_gemm_lowp(lp, 'N', 'T', N, m, C, inp, C, q, C, beta, out + o0, OC);
        }
    }
}

/* dinp (N,C) (+)= dout @ deq(w): panels of columns of w (all OC rows), each GEMM over the
 * whole K = OC. */
static void backward_nf4(dt_dtype lp, float *dinp, int accumulate, const void *dout,
                         const dt_nf4 *w, int N, int C, int OC) {
    DT_ASSERT(N >= 0 && C > 0 && OC > 0 && w->n == (size_t)OC * (size_t)C);
    if (N == 0) return;
    const float beta = accumulate ? 1.0f : 0.0f;
    const long cb = panel_cols(C, OC);
    float *p = panel(0, (size_t)cb * OC * sizeof(float));
    uint16_t *q = lp != DT_F32 ? panel(1, (size_t)cb * OC * sizeof(uint16_t)) : NULL;
    for (long c0 = 0; c0 < C; c0 += cb) {
        long m = C - c0 < cb ? C - c0 : cb;
        dequant_cols(p, w, OC, C, c0, m);
        if (lp == DT_F32) {
            dt_sgemm('N', 'N', N, m, OC, dout, OC, p, m, beta, dinp + c0, C);
        } else {
            dt_to_lowp(lp, q, p, (size_t)m * OC);
            dt_gemm_lowp(lp, 'N', 'N', N, m, OC, dout, OC, q, m, beta, dinp + c0, C);
        }
    }
}

void dt_cpu_matmul_forward_nf4(float *out, const float *inp, const dt_nf4 *w, const float *bias,
                           int N, int C, int OC) {
    forward_nf4(DT_F32, out, inp, w, bias, N, C, OC);
}

void dt_cpu_matmul_backward_nf4(float *dinp, int accumulate, const float *dout, const dt_nf4 *w,
                            int N, int C, int OC) {
    backward_nf4(DT_F32, dinp, accumulate, dout, w, N, C, OC);
}

void dt_cpu_matmul_forward_nf4_lp(dt_dtype dt, float *out, const uint16_t *inp, const dt_nf4 *w,
                              const float *bias, int N, int C, int OC) {
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    forward_nf4(dt, out, inp, w, bias, N, C, OC);
}

void dt_cpu_matmul_backward_nf4_lp(dt_dtype dt, float *dinp, int accumulate,
                               const uint16_t *dout_lp, const dt_nf4 *w, int N, int C, int OC) {
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    backward_nf4(dt, dinp, accumulate, dout_lp, w, N, C, OC);
}
