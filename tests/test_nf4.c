/* NF4 (ops.h "NF4"): the code book against the published one, the layout and its size
 * formula, quantization against the double reference and its error bounds, dequantization on
 * every ISA path bitwise against the scalar one, and the linear layers with an NF4 weight
 * against a double reference computed on the dequantized weight.
 *
 * Error bounds. With the exact block absmax a, an element's index is that of the code value
 * nearest to x = w / a, so |x - code| <= h, h = half the largest gap between adjacent code
 * values. Dequantization uses a' = q step + offset instead of a, |a' - a| <= step / 2 (q is
 * a rounded integer), so |w - code a'| <= h a + |code| |a - a'| <= h a + |a - a'|, plus fp32
 * rounding (of w / a, the scale and the product: 2^-22 (a + |a'|) covers them).
 * GEMMs: as tests/test_ops_lowp.c, |err| <= (K + 2) 2^-22 (sum_k |a_k b_k| + |c0|). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/rng.h"
#include "core/status.h"
#include "ops/cpu/isa.h"
#include "ops/ops.h"
#include "ops/ops_ref.h"
#include "testutil.h"

/* The published NF4 code book: bitsandbytes, bitsandbytes/functional.py, get_4bit_type("nf4")
 * (the same float32 values as its CUDA dDequantizeNF4), as printed there. */
static const double k_published[16] = {
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
};

/* Element i's 4-bit index in t. */
static unsigned nib(const dt_nf4 *t, size_t i) {
    return i % 2 == 0 ? t->codes[i / 2] >> 4 : t->codes[i / 2] & 15u;
}

/* An NF4 tensor of n elements in a fresh buffer (free t->offset). */
static dt_nf4 nf4_new(size_t n) {
    dt_nf4 t;
    dt_nf4_bind(&t, tu_malloc(dt_nf4_bytes(n) + 1), n);
    return t;
}

static void nf4_quantize_ok(dt_nf4 *t, const float *w, size_t n) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (dt_nf4_quantize(&ctx, "test", t, w, n) != DT_OK) fail_msg("%s", ctx.err);
}

/* Weights like a layer's: normal values whose scale changes from block to block (0.02 to
 * 0.08), with an outlier block (x 20) every 97 blocks, so the double quantization's groups
 * have spread-out absmaxes. */
static void fill_weights(float *w, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        size_t b = i / DT_NF4_BLOCK;
        float s = 0.02f * (1.0f + 3.0f * dt_rng_uniform(seed, 2, b));
        if (b % 97 == 13) s *= 20.0f;
        w[i] = s * dt_rng_normal(seed, 1, i);
    }
}

/* ================================================================ the code book */

static void test_codebook(void **state) {
    (void)state;
    double d[16];
    dt_nf4_codebook_derive(d);
    const float *c = dt_nf4_codebook();
    double worst = 0.0;
    for (int k = 0; k < 16; k++) {
        worst = tu_worse(worst, fabs(d[k] - k_published[k]));
        if (c[k] != (float)d[k]) fail_msg("code[%d] = %.9g is not the derived %.17g in fp32", k, c[k], d[k]);
        if (k && !(d[k] > d[k - 1])) fail_msg("code book not ascending at %d", k);
    }
    /* ~1 float ulp near 0.7: the published values come from float32 probabilities */
    printf("  derived vs published (bitsandbytes): max |diff| %.3g (tolerance 1.2e-7)\n", worst);
    if (!(worst <= 1.2e-7)) fail_msg("derived code book differs from the published one");
    /* exact zero, asymmetric: 7 negative and 8 positive values, normalized to [-1, 1] */
    assert_true(d[7] == 0.0 && c[7] == 0.0f);
    assert_true(d[0] == -1.0 && d[15] == 1.0 && c[0] == -1.0f && c[15] == 1.0f);
    assert_true(d[6] < 0.0 && d[8] > 0.0);
    /* half the largest gap: between -1 and -0.6961928 (the negative half has one value less) */
    double h = 0.0;
    for (int k = 0; k < 15; k++) h = fmax(h, 0.5 * (k_published[k + 1] - k_published[k]));
    printf("  half the largest gap: %.9f\n", dt_nf4_half_gap());
    assert_true(fabs(dt_nf4_half_gap() - h) < 1e-7);
    assert_true(fabs(h - 0.5 * (1.0 - 0.6961928009986877)) < 1e-12);
}

/* ================================================================ layout and size */

static void test_sizes(void **state) {
    (void)state;
    /* n, blocks, groups, bytes = 4 (offset) + 4 groups + blocks + ceil(n/2), by hand */
    static const size_t cases[][4] = {
        {1, 1, 1, 4 + 4 + 1 + 1},          {7, 1, 1, 4 + 4 + 1 + 4},
        {64, 1, 1, 4 + 4 + 1 + 32},        {65, 2, 1, 4 + 4 + 2 + 33},
        {16384, 256, 1, 4 + 4 + 256 + 8192}, {16385, 257, 2, 4 + 8 + 257 + 8193},
        {0, 0, 0, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = cases[i][0];
        assert_int_equal(dt_nf4_blocks(n), cases[i][1]);
        assert_int_equal(dt_nf4_groups(n), cases[i][2]);
        assert_int_equal(dt_nf4_bytes(n), cases[i][3]);
    }
    /* A 4096 x 4096 weight: exactly 4 + 8/64 + 32/(64 256) = 4.126953125 bits per
     * parameter, plus the tensor's 32-bit offset. */
    size_t n = (size_t)4096 * 4096;
    double bits = 8.0 * (double)dt_nf4_bytes(n) / (double)n;
    printf("  4096 x 4096: %zu bytes, %.9f bits per parameter\n", dt_nf4_bytes(n), bits);
    assert_true(8.0 * (double)dt_nf4_bytes(n) == 4.126953125 * (double)n + 32.0);
    assert_true(fabs(bits - 4.127) < 1e-4);
    /* The views tile the buffer in the documented order. */
    n = 16385;
    char *buf = tu_malloc(dt_nf4_bytes(n));
    dt_nf4 t;
    dt_nf4_bind(&t, buf, n);
    assert_true(t.n == n);
    assert_ptr_equal(t.offset, buf);
    assert_ptr_equal(t.step, buf + 4);
    assert_ptr_equal(t.qabsmax, buf + 4 + 4 * 2);
    assert_ptr_equal(t.codes, (uint8_t *)t.qabsmax + 257);
    assert_ptr_equal(t.codes + (n + 1) / 2, buf + dt_nf4_bytes(n));
    free(buf);
}

/* ================================================================ quantization */

/* Nibble order and exact points on a hand-made tensor: byte i holds element 2i high. */
static void test_nibble_order(void **state) {
    (void)state;
    const float *c = dt_nf4_codebook();
    float w[5] = {c[3], c[12], c[15], c[7], c[1]};
    dt_nf4 t = nf4_new(5);
    nf4_quantize_ok(&t, w, 5);
    assert_int_equal(t.codes[0], 0x3c);
    assert_int_equal(t.codes[1], 0xf7);
    assert_int_equal(t.codes[2], 0x10); /* odd n: the last low nibble is 0 */
    float d[5];
    dt_nf4_dequantize(d, &t, 0, 5);
    assert_memory_equal(d, w, sizeof w); /* absmax 1, one block: scale exactly 1 */
    free(t.offset);
}

/* Quantization against the reference and the error bounds, on one tensor of n elements. */
static void roundtrip(size_t n, uint64_t seed) {
    float *w = tu_malloc(n * 4), *deq = tu_malloc(n * 4);
    double *ref = tu_malloc(n * 8), *amax = tu_malloc((n / 64 + 1) * 8);
    uint8_t *idx = tu_malloc(n);
    fill_weights(w, n, seed);
    dt_nf4 t = nf4_new(n);
    nf4_quantize_ok(&t, w, n);
    dt_ref_nf4_quantize(idx, amax, w, n);
    dt_nf4_dequantize(deq, &t, 0, n);
    dt_ref_nf4_dequantize(ref, &t);
    double code[16];
    dt_nf4_codebook_derive(code);
    const double h = dt_nf4_half_gap();
    size_t ties = 0;
    double worst_q = 0.0, worst_dq = 0.0, worst_el = 0.0, worst_ref = 0.0, se = 0.0, sw = 0.0;
    for (size_t b = 0; b < dt_nf4_blocks(n); b++) {
        const double a = amax[b], step = t.step[b / DT_NF4_GROUP];
        const double a2 = (double)t.qabsmax[b] * step + *t.offset; /* dequantized absmax */
        assert_true(t.qabsmax[b] >= -127);
        /* double quantization: at most half a step off */
        worst_dq = tu_worse(worst_dq, fabs(a2 - a) / (0.5 * step * (1.0 + 1e-9) + 1e-12 * a + 1e-300));
        for (size_t i = b * 64; i < n && i < (b + 1) * 64; i++) {
            unsigned k = nib(&t, i);
            double x = a > 0.0 ? w[i] / a : 0.0;
            if (k != idx[i]) { /* only on a decision point, to within fp32 division */
                unsigned lo = k < idx[i] ? k : idx[i];
                if (abs((int)k - (int)idx[i]) != 1 ||
                    fabs(x - 0.5 * (code[lo] + code[lo + 1])) > 1e-6)
                    fail_msg("element %zu: index %u, nearest %u (x = %.9g)", i, k, idx[i], x);
                ties++;
            }
            worst_q = tu_worse(worst_q, fabs(x - code[k]) / (h + 1e-7));
            double bound = h * a + fabs(a2 - a) + ldexp(a + fabs(a2), -22) + 1e-300;
            worst_el = tu_worse(worst_el, fabs((double)w[i] - deq[i]) / bound);
            worst_ref = tu_worse(worst_ref, fabs(deq[i] - ref[i]) / (ldexp(fabs(ref[i]), -22) + 1e-300));
            se += (w[i] - (double)deq[i]) * (w[i] - (double)deq[i]);
            sw += (double)w[i] * w[i];
        }
    }
    if (n % 2) assert_int_equal(t.codes[n / 2] & 15u, 0);
#ifdef _OPENMP
    /* The same bytes on one thread (a base re-quantized at load must match) */
    int nthr = omp_get_max_threads();
    dt_nf4 t1 = nf4_new(n);
    omp_set_num_threads(1);
    nf4_quantize_ok(&t1, w, n);
    dt_nf4_dequantize((float *)ref, &t1, 0, n); /* fp32 into ref's storage */
    omp_set_num_threads(nthr);
    assert_memory_equal(t1.offset, t.offset, dt_nf4_bytes(n));
    assert_memory_equal((float *)ref, deq, n * 4);
    free(t1.offset);
#endif
    printf("  n=%-7zu blocks %-4zu groups %-2zu  rel rms err %.4f  worst/bound: index %.3f, "
           "absmax %.3f, element %.3f, vs ref %.3f; %zu decision-point ties\n",
           n, dt_nf4_blocks(n), dt_nf4_groups(n), sqrt(se / (sw + 1e-300)), worst_q, worst_dq,
           worst_el, worst_ref, ties);
    if (!(worst_q <= 1.0)) fail_msg("|w/absmax - code| above half the largest gap");
    if (!(worst_dq <= 1.0)) fail_msg("double-quantized absmax off by more than half a step");
    if (!(worst_el <= 1.0)) fail_msg("|w - dequantized| above h absmax + absmax error");
    if (!(worst_ref <= 1.0)) fail_msg("dequantize differs from the double reference");
    free(w); free(deq); free(ref); free(amax); free(idx); free(t.offset);
}

static void test_roundtrip(void **state) {
    (void)state;
    /* odd sizes: partial blocks (not a multiple of 64) and partial groups (of 256 blocks) */
    static const size_t ns[] = {1, 2, 63, 64, 65, 1001, 64 * 256, 64 * 256 * 2 + 64 * 3 + 17,
                                64 * 256 * 5 + 77};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) roundtrip(ns[i], 100 + i);
}

/* Code-book points times a common absmax come back bit for bit: the mean of equal absmaxes
 * is exact, every group's step is 0, so every block's scale is the absmax itself. */
static void test_exact_points(void **state) {
    (void)state;
    const size_t n = 64 * 256 * 2 + 100;
    const float a = 0.75f, *c = dt_nf4_codebook();
    float *w = tu_malloc(n * 4), *d = tu_malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        unsigned k = i % 64 == 0 ? (i / 64 % 2 ? 0u : 15u) /* each block reaches +-a */
                                 : (unsigned)(dt_rng_uniform(7, 3, i) * 16.0f) & 15u;
        w[i] = c[k] * a;
    }
    dt_nf4 t = nf4_new(n);
    nf4_quantize_ok(&t, w, n);
    assert_true(*t.offset == a);
    for (size_t g = 0; g < dt_nf4_groups(n); g++) assert_true(t.step[g] == 0.0f);
    for (size_t i = 0; i < n; i++)
        if (c[nib(&t, i)] * a != w[i]) fail_msg("element %zu: index %u", i, nib(&t, i));
    dt_nf4_dequantize(d, &t, 0, n);
    assert_memory_equal(d, w, n * 4);
    printf("  %zu code-book points reconstructed exactly\n", n);
    free(w); free(d); free(t.offset);
}

/* All-zero blocks inside a tensor, an all-zero tail block, and an all-zero tensor. */
static void test_zero_blocks(void **state) {
    (void)state;
    const size_t n = 64 * 10 + 5;
    float *w = tu_malloc(n * 4), *d = tu_malloc(n * 4);
    fill_weights(w, n, 9);
    for (size_t i = 0; i < n; i++)
        if (i / 64 == 2 || i / 64 == 5 || i / 64 == 10) w[i] = i % 3 ? 0.0f : -0.0f;
    dt_nf4 t = nf4_new(n);
    nf4_quantize_ok(&t, w, n);
    dt_nf4_dequantize(d, &t, 0, n);
    for (size_t i = 0; i < n; i++) {
        if (w[i] != 0.0f) continue;
        assert_int_equal(nib(&t, i), 7);
        assert_true(d[i] == 0.0f);
    }
    assert_true(t.qabsmax[3] != 0 || t.qabsmax[4] != 0); /* the other blocks are not zero */
    free(w); free(d); free(t.offset);

    const size_t m = 100;
    float *z = tu_malloc(m * 4), *dz = tu_malloc(m * 4);
    dt_nf4 tz = nf4_new(m);
    nf4_quantize_ok(&tz, z, m);
    assert_true(*tz.offset == 0.0f && tz.step[0] == 0.0f);
    for (size_t i = 0; i < m / 2; i++) assert_int_equal(tz.codes[i], 0x77);
    dt_nf4_dequantize(dz, &tz, 0, m);
    for (size_t i = 0; i < m; i++) assert_true(dz[i] == 0.0f);
    free(z); free(dz); free(tz.offset);
}

/* NaN or Inf in the weights: one line naming the tensor, and nothing else happens. */
static void test_nonfinite(void **state) {
    (void)state;
    const size_t n = 300;
    float *w = tu_malloc(n * 4);
    fill_weights(w, n, 5);
    w[70] = NAN;
    w[200] = -INFINITY;
    dt_nf4 t = nf4_new(n);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_nf4_quantize(&ctx, "layers.0.attn.q_proj.weight", &t, w, n), DT_ERR_NUMERIC);
    printf("  %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "layers.0.attn.q_proj.weight"));
    assert_non_null(strstr(ctx.err, "2 NaN/Inf"));
    free(w); free(t.offset);
}

/* ================================================================ every ISA path */

#define ISA_N ((size_t)64 * 256 * 5 + 77) /* > 65536: the whole tensor dequantizes threaded */
static dt_nf4 g_isa_t;
static float *g_isa_scalar; /* the scalar path's full dequantization */

static void isa_cases(void) {
    /* ranges: odd starts, block and group boundaries, single elements, the tail */
    static const size_t r[][2] = {{0, ISA_N}, {1, 200}, {63, 2}, {64 * 256 - 3, 130},
                                  {ISA_N - 17, 17}, {ISA_N - 1, 1}, {5, 0}, {64, 64},
                                  {777, 16385}, {2, 14}, {3, 31}};
    float *full = tu_malloc(ISA_N * 4), *part = tu_malloc(ISA_N * 4);
    dt_nf4_dequantize(full, &g_isa_t, 0, ISA_N);
    if (!g_isa_scalar) {
        assert_int_equal(dt_isa_active(), DT_ISA_SCALAR); /* tu_each_isa runs it first */
        g_isa_scalar = full;
        full = tu_malloc(ISA_N * 4);
        memcpy(full, g_isa_scalar, ISA_N * 4);
    }
    assert_memory_equal(full, g_isa_scalar, ISA_N * 4);
    for (size_t k = 0; k < sizeof r / sizeof r[0]; k++) {
        dt_nf4_dequantize(part, &g_isa_t, r[k][0], r[k][1]);
        if (r[k][1] && memcmp(part, g_isa_scalar + r[k][0], r[k][1] * 4))
            fail_msg("%s: range [%zu, +%zu) differs from the scalar path",
                     dt_isa_name(dt_isa_active()), r[k][0], r[k][1]);
    }
    /* element by element: every position of a vector group as a start */
    for (size_t i = 0; i < 300; i++) {
        dt_nf4_dequantize(part, &g_isa_t, i, 1);
        assert_memory_equal(part, g_isa_scalar + i, 4);
    }
    printf("  %zu elements and %zu ranges bitwise equal to the scalar path\n", ISA_N,
           sizeof r / sizeof r[0] + 300);
    free(full);
    free(part);
}

static void test_isa_paths(void **state) {
    (void)state;
    float *w = tu_malloc(ISA_N * 4);
    fill_weights(w, ISA_N, 11);
    g_isa_t = nf4_new(ISA_N);
    nf4_quantize_ok(&g_isa_t, w, ISA_N);
    tu_each_isa(isa_cases);
    free(g_isa_scalar);
    g_isa_scalar = NULL;
    free(g_isa_t.offset);
    free(w);
}

/* ================================================================ matmuls */

/* Largest |got - ref| / ((K + 2) 2^-22 mag + 1e-30) over n; INFINITY on a non-finite value. */
static double err_ratio(const float *got, const double *ref, const double *mag, size_t n, int K) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i])) return INFINITY;
        worst = tu_worse(worst, fabs(got[i] - ref[i]) / ((K + 2) * ldexp(mag[i], -22) + 1e-30));
    }
    return worst;
}

static void report_ratio(const char *what, double r) {
    printf("    %-46s err/bound %.3f\n", what, r);
    if (!(r <= 1.0)) fail_msg("%s: error %.3f x the accumulation bound", what, r);
}

static void absd(double *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = fabs(src[i]);
}

/* round-trip float values through dt (DT_F32: unchanged) into double */
static void rounded(dt_dtype dt, double *dst, uint16_t *lp, const float *src, size_t n) {
    float *f = tu_malloc(n * 4);
    memcpy(f, src, n * 4);
    if (dt != DT_F32) {
        dt_to_lowp(dt, lp, src, n);
        dt_from_lowp(dt, f, lp, n);
    }
    tu_to_double(dst, f, n);
    free(f);
}

typedef struct { int N, C, OC; } mm_shape;
/* C not a multiple of 64 (blocks straddle rows), tiny, and the panel case: forward panels of
 * 255 rows of 4097 (3 panels over OC = 600), backward panels of 1728 columns (3 over C). */
static const mm_shape k_shapes[] = {{7, 13, 5}, {1, 1, 1}, {4, 64, 3}, {33, 200, 70},
                                    {5, 4097, 600}};

static void matmul_shape(const mm_shape *s) {
    const int N = s->N, C = s->C, OC = s->OC;
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *w = tu_malloc(nw * 4), *wq = tu_malloc(nw * 4), *x = tu_malloc(nx * 4);
    float *bias = tu_malloc(OC * 4), *dout = tu_malloc(no * 4), *out = tu_malloc(no * 4);
    float *dx = tu_malloc(nx * 4), *dx0 = tu_malloc(nx * 4), *again = tu_malloc((nx > no ? nx : no) * 4);
    double *wd = tu_malloc(nw * 8), *xd = tu_malloc(nx * 8), *dd = tu_malloc(no * 8);
    double *bd = tu_malloc(OC * 8), *ref = tu_malloc((nx > no ? nx : no) * 8);
    double *mag = tu_malloc((nx > no ? nx : no) * 8), *aw = tu_malloc(nw * 8);
    double *ax = tu_malloc(nx * 8), *ad = tu_malloc(no * 8), *ab = tu_malloc(OC * 8);
    double *dwscratch = tu_malloc(nw * 8);
    uint16_t *xlp = tu_malloc(nx * 2), *dlp = tu_malloc(no * 2), *wlp = tu_malloc(nw * 2);
    fill_weights(w, nw, 21);
    tu_fill_uniform(x, nx, 1.0f, 22);
    tu_fill_uniform(bias, OC, 1.0f, 23);
    tu_fill_uniform(dout, no, 1.0f, 24);
    tu_fill_uniform(dx0, nx, 1.0f, 25);
    dt_nf4 t = nf4_new(nw);
    nf4_quantize_ok(&t, w, nw);
    dt_nf4_dequantize(wq, &t, 0, nw); /* the reference's weight (the test's full copy) */
    printf("  N=%d C=%d OC=%d (bf16 GEMM %s)\n", N, C, OC,
           dt_lowp_gemm_native(DT_BF16) ? "native" : "fp32 fallback");

    for (int d = 0; d < 3; d++) {
        dt_dtype dt = d == 0 ? DT_F32 : d == 1 ? DT_BF16 : DT_F16;
        const char *name = d == 0 ? "fp32" : dt_dtype_name(dt);
        char what[96];
        rounded(dt, wd, wlp, wq, nw); /* the lp GEMM multiplies the rounded dequantized weight */
        rounded(dt, xd, xlp, x, nx);
        rounded(dt, dd, dlp, dout, no);
        tu_to_double(bd, bias, OC);
        absd(aw, wd, nw); absd(ax, xd, nx); absd(ad, dd, no); absd(ab, bd, OC);

        /* forward with bias, dirty output */
        for (size_t i = 0; i < no; i++) out[i] = 1e6f;
        if (dt == DT_F32) dt_matmul_forward_nf4(out, x, &t, bias, N, C, OC);
        else dt_matmul_forward_nf4_lp(dt, out, xlp, &t, bias, N, C, OC);
        dt_ref_matmul_forward(ref, xd, wd, bd, N, C, OC);
        dt_ref_matmul_forward(mag, ax, aw, ab, N, C, OC);
        snprintf(what, sizeof what, "%s forward (bias)", name);
        report_ratio(what, err_ratio(out, ref, mag, no, C));
        /* deterministic */
        if (dt == DT_F32) dt_matmul_forward_nf4(again, x, &t, bias, N, C, OC);
        else dt_matmul_forward_nf4_lp(dt, again, xlp, &t, bias, N, C, OC);
        assert_memory_equal(again, out, no * 4);
        /* forward without bias */
        for (size_t i = 0; i < no; i++) out[i] = 1e6f;
        if (dt == DT_F32) dt_matmul_forward_nf4(out, x, &t, NULL, N, C, OC);
        else dt_matmul_forward_nf4_lp(dt, out, xlp, &t, NULL, N, C, OC);
        dt_ref_matmul_forward(ref, xd, wd, NULL, N, C, OC);
        dt_ref_matmul_forward(mag, ax, aw, NULL, N, C, OC);
        snprintf(what, sizeof what, "%s forward (no bias, dirty output)", name);
        report_ratio(what, err_ratio(out, ref, mag, no, C));

        /* backward: dinp overwritten (dirty), then accumulated onto dx0 */
        for (size_t i = 0; i < nx; i++) dx[i] = 1e6f;
        if (dt == DT_F32) dt_matmul_backward_nf4(dx, 0, dout, &t, N, C, OC);
        else dt_matmul_backward_nf4_lp(dt, dx, 0, dlp, &t, N, C, OC);
        dt_ref_matmul_backward(ref, dwscratch, NULL, dd, xd, wd, N, C, OC);
        dt_ref_matmul_backward(mag, dwscratch, NULL, ad, ax, aw, N, C, OC);
        snprintf(what, sizeof what, "%s backward dinp", name);
        report_ratio(what, err_ratio(dx, ref, mag, nx, OC));
        memcpy(again, dx0, nx * 4);
        if (dt == DT_F32) dt_matmul_backward_nf4(again, 1, dout, &t, N, C, OC);
        else dt_matmul_backward_nf4_lp(dt, again, 1, dlp, &t, N, C, OC);
        for (size_t i = 0; i < nx; i++) {
            ref[i] += dx0[i];
            mag[i] += fabs(dx0[i]);
        }
        snprintf(what, sizeof what, "%s backward dinp (accumulated)", name);
        report_ratio(what, err_ratio(again, ref, mag, nx, OC));
        if (dt == DT_F32) dt_matmul_backward_nf4(again, 0, dout, &t, N, C, OC);
        else dt_matmul_backward_nf4_lp(dt, again, 0, dlp, &t, N, C, OC);
        assert_memory_equal(again, dx, nx * 4); /* deterministic */
    }
    free(w); free(wq); free(x); free(bias); free(dout); free(out); free(dx); free(dx0);
    free(again); free(wd); free(xd); free(dd); free(bd); free(ref); free(mag); free(aw);
    free(ax); free(ad); free(ab); free(dwscratch); free(xlp); free(dlp); free(wlp);
    free(t.offset);
}

static void matmul_cases(void) {
    for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++) matmul_shape(&k_shapes[s]);
    /* The panels stayed bounded: never the 600 x 4097 weight in fp32 (9.8 MB), at most
     * DT_NF4_PANEL floats and their 16-bit copy. */
    size_t pb = dt_nf4_panel_bytes(), whole = (size_t)600 * 4097 * 4;
    printf("  panel buffers of this thread: %zu bytes (the weight in fp32: %zu)\n", pb, whole);
    assert_true(pb > 0 && pb <= DT_NF4_PANEL * (4 + 2) && pb < whole);
}

static void test_matmul(void **state) {
    (void)state;
    tu_each_isa(matmul_cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codebook),      cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_nibble_order),  cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_exact_points),  cmocka_unit_test(test_zero_blocks),
        cmocka_unit_test(test_nonfinite),     cmocka_unit_test(test_isa_paths),
        cmocka_unit_test(test_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
