/* Low-precision kernels of ops.h: the bf16 / fp16 conversions (every path, bitwise) and the
 * GEMMs with 16-bit operands (native oneDNN, the fp32 fallback, the reference loops).
 *
 * Conversions: widening exhaustively against the format's definition; narrowing on edge
 * cases and 2^24 random bit patterns, the scalar path against an independent double-precision
 * rounding (rint on a scaled value), every other path bit for bit against the scalar one.
 *
 * GEMMs: against a double reference computed on the already-rounded operands. A product of two
 * bf16 (8-bit significands) or two fp16 (11-bit) numbers is exact in fp32 (24 bits), so the
 * only error is fp32 accumulation: recursive summation of K terms plus an initial value errs
 * by at most ~(K+1) 2^-24 sum |terms|; blocked / FMA / vdpbf16ps orders are no worse. We allow
 *     |err| <= (K + 2) 2^-22 (sum_k |a_k b_k| + |c0|) + 1e-30
 * (4x the bound; 1e-30 covers vdpbf16ps flushing fp32 subnormal partial results). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/isa.h"
#include "ops/backend.h"
#include "ops/ops.h"
#include "testutil.h"

/* ================================================================ conversions */

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

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The value of an fp16 bit pattern from the format's definition (NaN: NAN). */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* Independent narrowing: the float64 reference backend's (src/ops/ref/backend_ref.c: round
 * |x| to p significant bits at exponent max(ilogb, emin) with rint (ties to even), overflow
 * past the format's max to Inf, then encode; NaN: the documented quiet NaN, sign and top
 * payload bits kept), itself checked on spot values below. */
static uint16_t ref_narrow(dt_dtype dt, float x) {
    uint16_t h;
    if (dt == DT_BF16) dt_backend_ref.f32_to_bf16(&h, &x, 1);
    else dt_backend_ref.f32_to_f16(&h, &x, 1);
    return h;
}

static void widen_cases(void) {
    uint16_t *h = tu_malloc(65536 * 2);
    float *f = tu_malloc(65536 * 4);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    /* 65536 elements: the threaded block path; then an odd count at an odd offset (tails) */
    dt_bf16_to_f32(f, h, 65536);
    for (int i = 0; i < 65536; i++) assert_int_equal(fbits(f[i]), (uint32_t)i << 16);
    dt_bf16_to_f32(f + 3, h + 5, 1001);
    for (int i = 0; i < 1001; i++) assert_int_equal(fbits(f[3 + i]), (uint32_t)(i + 5) << 16);
    dt_f16_to_f32(f, h, 65536);
    for (int i = 0; i < 65536; i++) {
        double v = f16_value((uint16_t)i);
        uint32_t want = isnan(v) ? ((uint32_t)(i & 0x8000) << 16) | 0x7f800000u | ((uint32_t)(i & 0x3ff) << 13)
                                 : fbits((float)v); /* exact: keeps -0 */
        if (fbits(f[i]) != want) fail_msg("f16 %04x -> %08x, want %08x", i, fbits(f[i]), want);
    }
    float *g = tu_malloc(1001 * 4);
    dt_f16_to_f32(g, h + 7, 1001);
    assert_memory_equal(g, f + 7, 1001 * 4);
    printf("  widening: all 65536 bf16 and fp16 patterns exact\n");
    free(g);
    free(h);
    free(f);
}

static void test_widen_exhaustive(void **state) {
    (void)state;
    tu_each_isa(widen_cases);
}

/* The edge cases as bit patterns, each also negated. */
static const uint32_t k_edges[] = {
    0x00000000, 0x00000001, 0x00000002, 0x00400000, 0x007fffff, 0x00800000, /* f32 subn. */
    0x00008000, 0x00018000, 0x00017fff, 0x00008001,                          /* bf16 ties */
    0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, 0x3f80ffff,             /* ties near 1 */
    0x7f7f0000, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff, 0x7f800000,             /* bf16 top */
    0x33000000, 0x33000001, 0x32ffffff, 0x33800000, 0x33c00000, 0x34200000, /* 2^-25.. */
    0x387fc000, 0x387fe000, 0x387fffff, 0x38800000, 0x38801000, 0x38803000, /* 2^-14 */
    0x3f801000, 0x3f803000, 0x3f800fff, 0x3f801001,                         /* f16 ties */
    0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x47800000, 0x7f7fffff, /* 65504.. */
    0x7f800001, 0x7fa00000, 0x7fbfffff, 0x7fc00000, 0x7fc00001, 0x7fffffff, /* NaN */
    0x7f802000, 0x7f801fff,                                                 /* low payload */
};

static void narrow_check_ref(dt_dtype dt, const float *x, const uint16_t *got, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint16_t want = ref_narrow(dt, x[i]);
        if (got[i] != want)
            fail_msg("%s: %08x (%a) -> %04x, want %04x", dt_dtype_name(dt), fbits(x[i]),
                     (double)x[i], got[i], want);
    }
}

static void narrow_edge_cases(void) {
    size_t ne = sizeof k_edges / sizeof k_edges[0];
    float *x = tu_malloc(2 * ne * 4);
    uint16_t *y = tu_malloc(2 * ne * 2);
    for (size_t i = 0; i < ne; i++) {
        x[2 * i] = bitsf(k_edges[i]);
        x[2 * i + 1] = bitsf(k_edges[i] | 0x80000000u);
    }
    for (int d = 0; d < 2; d++) {
        dt_dtype dt = d ? DT_F16 : DT_BF16;
        dt_to_lowp(dt, y, x, 2 * ne);
        narrow_check_ref(dt, x, y, 2 * ne);
        for (size_t i = 0; i < 2 * ne; i++) { /* one element at a time: the scalar tails */
            uint16_t one;
            dt_to_lowp(dt, &one, x + i, 1);
            assert_int_equal(one, y[i]);
        }
    }
    /* Spot values written out, so the reference itself is checked too. */
    static const struct { uint32_t x; uint16_t bf, f16; } spot[] = {
        {0x3f808000, 0x3f80, 0x3c04}, /* 1 + 2^-8: bf16 tie, to even (down); exact in fp16 */
        {0x3f818000, 0x3f82, 0x3c0c}, /* 1 + 3 2^-8: bf16 tie, to even (up) */
        {0x477ff000, 0x4780, 0x7c00}, /* 65520: fp16 overflows */
        {0x477fefff, 0x4780, 0x7bff}, /* just below: 65504 */
        {0x33000000, 0x3300, 0x0000}, /* 2^-25: tie between 0 and 2^-24, to even */
        {0x33000001, 0x3300, 0x0001}, /* above it: the smallest subnormal */
        {0x33c00000, 0x33c0, 0x0002}, /* 3 2^-25: tie between 1 and 2 ulps, to even */
        {0x387fe000, 0x3880, 0x0400}, /* rounds up into the smallest normal */
        {0x00000001, 0x0000, 0x0000}, /* f32 subnormal: rounds, never flushed to nonzero */
        {0x00008000, 0x0000, 0x0000}, /* bf16 subnormal tie: to even 0 */
        {0x00018000, 0x0002, 0x0000}, /* bf16 subnormal tie: to even 2 */
        {0x7f7fffff, 0x7f80, 0x7c00}, /* FLT_MAX */
        {0x7f800001, 0x7fc0, 0x7e00}, /* sNaN, low payload: quieted */
        {0xffa00000, 0xffe0, 0xff00}, /* -sNaN, payload 0x200000: top bits kept */
        {0x7fc00001, 0x7fc0, 0x7e00},
        {0xff800000, 0xff80, 0xfc00},
    };
    for (size_t i = 0; i < sizeof spot / sizeof spot[0]; i++) {
        float v = bitsf(spot[i].x);
        uint16_t b, h;
        dt_f32_to_bf16(&b, &v, 1);
        dt_f32_to_f16(&h, &v, 1);
        if (b != spot[i].bf || h != spot[i].f16)
            fail_msg("%08x -> bf16 %04x fp16 %04x, want %04x %04x", spot[i].x, b, h,
                     spot[i].bf, spot[i].f16);
        assert_int_equal(ref_narrow(DT_BF16, v), spot[i].bf);
        assert_int_equal(ref_narrow(DT_F16, v), spot[i].f16);
    }
    printf("  narrowing: %zu edge cases and %zu spot values\n", 2 * ne, sizeof spot / sizeof spot[0]);
    free(x);
    free(y);
}

static void test_narrow_edges(void **state) {
    (void)state;
    tu_each_isa(narrow_edge_cases);
}

#define NRAND ((size_t)1 << 24)
#define NRAND_ODD (NRAND + 13) /* a partial block and a partial vector at the end */
static float *g_rand;          /* NRAND_ODD + 1 random bit patterns */
static uint16_t *g_scalar[2];  /* the scalar path's narrowing of g_rand + 1 */
static size_t g_nonfinite;

static void narrow_random_cases(void) {
    uint16_t *y = tu_malloc(NRAND_ODD * 2);
    const float *x = g_rand + 1; /* not 64-byte aligned */
    for (int d = 0; d < 2; d++) {
        dt_dtype dt = d ? DT_F16 : DT_BF16;
        dt_to_lowp(dt, y, x, NRAND_ODD);
        if (!g_scalar[d]) {
            assert_int_equal(dt_isa_active(), DT_ISA_SCALAR); /* tu_each_isa runs it first */
            narrow_check_ref(dt, x, y, NRAND_ODD);
            g_scalar[d] = y;
            y = tu_malloc(NRAND_ODD * 2);
        } else {
            for (size_t i = 0; i < NRAND_ODD; i++)
                if (y[i] != g_scalar[d][i])
                    fail_msg("%s %s: %08x -> %04x, scalar %04x", dt_isa_name(dt_isa_active()),
                             dt_dtype_name(dt), fbits(x[i]), y[i], g_scalar[d][i]);
        }
    }
    assert_int_equal(dt_count_nonfinite_f32(x, NRAND_ODD), g_nonfinite);
    size_t few = 0; /* the short, serial count */
    for (int i = 5; i < 22; i++) few += !isfinite(x[i]);
    assert_int_equal(dt_count_nonfinite_f32(x + 5, 17), few);
    printf("  narrowing: %zu random patterns %s\n", NRAND_ODD,
           dt_isa_active() == DT_ISA_SCALAR ? "match the double reference" : "match scalar bitwise");
    free(y);
}

static void test_narrow_random(void **state) {
    (void)state;
    g_rand = tu_malloc((NRAND_ODD + 1) * 4);
    uint64_t s = 42;
    uint32_t *u = (uint32_t *)g_rand;
    for (size_t i = 0; i < NRAND_ODD + 1; i++) u[i] = (uint32_t)splitmix(&s);
    g_nonfinite = 0;
    for (size_t i = 1; i < NRAND_ODD + 1; i++) g_nonfinite += !isfinite(g_rand[i]);
    assert_true(g_nonfinite > 10000); /* 1/256 of random patterns */
    tu_each_isa(narrow_random_cases);
    free(g_scalar[0]);
    free(g_scalar[1]);
    g_scalar[0] = g_scalar[1] = NULL;
    free(g_rand);
}

/* ================================================================ GEMMs */

/* lp (n) = uniform values of `scale` narrowed to dt; d = the same, widened, in double. */
static void fill_lp(dt_dtype dt, uint16_t *lp, double *d, size_t n, float scale, uint64_t seed) {
    float *f = tu_malloc(n * 4);
    tu_fill_uniform(f, n, scale, seed);
    dt_to_lowp(dt, lp, f, n);
    dt_from_lowp(dt, f, lp, n);
    tu_to_double(d, f, n);
    free(f);
}

/* out (M,N of ldo) = c0 + op(A) op(B) in double, mag = |c0| + sum |a b|; element (i,k) of
 * op(A) is A[i*ai + k*ak], (k,j) of op(B) is B[k*bk + j*bj]. c0 may be NULL. */
static void ref_gemm(double *out, double *mag, const double *c0, int M, int N, int K,
                     const double *A, long ai, long ak, const double *B, long bk, long bj) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = c0 ? c0[(size_t)i * N + j] : 0.0, m = fabs(s);
            for (int k = 0; k < K; k++) {
                double p = A[i * ai + k * ak] * B[k * bk + j * bj];
                s += p;
                m += fabs(p);
            }
            out[(size_t)i * N + j] = s;
            mag[(size_t)i * N + j] = m;
        }
}

/* Largest |got - ref| / bound over n elements (got rows of stride ldg, ref dense rows of
 * `cols`); INFINITY on a non-finite value. */
static double err_ratio(const float *got, long ldg, const double *ref, const double *mag,
                        int rows, int cols, int K) {
    double worst = 0.0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double g = got[i * ldg + j], r = ref[(size_t)i * cols + j];
            if (!isfinite(g) || !isfinite(r)) return INFINITY;
            double bound = (K + 2) * ldexp(mag[(size_t)i * cols + j], -22) + 1e-30;
            worst = tu_worse(worst, fabs(g - r) / bound);
        }
    return worst;
}

static void report_ratio(const char *what, double r) {
    printf("    %-44s err/bound %.3f\n", what, r);
    if (!(r <= 1.0)) fail_msg("%s: error %.3f x the accumulation bound", what, r);
}

typedef struct { int N, C, OC; } mm_shape;
static const mm_shape k_shapes[] = {{7, 13, 5}, {1, 1, 1}, {64, 96, 288}, {37, 50, 130},
                                    {130, 200, 70}};
#define NSHAPES (sizeof k_shapes / sizeof k_shapes[0])
/* The first path's forward outputs (scalar: the fallback), to compare engines. */
static float *g_first_out[2][NSHAPES];

static void gemm_shape(dt_dtype dt, int si) {
    int N = k_shapes[si].N, C = k_shapes[si].C, OC = k_shapes[si].OC;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    uint16_t *x = tu_malloc(nx * 2), *w = tu_malloc(nw * 2), *dlp = tu_malloc(no * 2);
    double *xd = tu_malloc(nx * 8), *wd = tu_malloc(nw * 8), *dd = tu_malloc(no * 8);
    float *bias = tu_malloc(OC * 4), *dout = tu_malloc(no * 4), *out = tu_malloc(no * 4);
    float *dx = tu_malloc(nx * 4), *dw = tu_malloc(nw * 4), *db = tu_malloc(OC * 4);
    double *ref = tu_malloc((nx > nw ? (nx > no ? nx : no) : (nw > no ? nw : no)) * 8);
    double *mag = tu_malloc((nx > nw ? (nx > no ? nx : no) : (nw > no ? nw : no)) * 8);
    double *c0 = tu_malloc((nw > no ? nw : no) * 8);
    fill_lp(dt, x, xd, nx, 1.0f, 31);
    fill_lp(dt, w, wd, nw, 0.5f, 32);
    tu_fill_uniform(bias, OC, 1.0f, 33);
    tu_fill_uniform(dout, no, 1.0f, 34);
    printf("  %s N=%d C=%d OC=%d (%s)\n", dt_dtype_name(dt), N, C, OC,
           dt_lowp_gemm_native(dt) ? "native" : "fp32 fallback");

    /* forward, bias */
    for (size_t i = 0; i < no; i++) out[i] = 1e6f;
    dt_matmul_forward_lp(dt, out, x, w, bias, N, C, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) c0[(size_t)n * OC + o] = bias[o];
    ref_gemm(ref, mag, c0, N, OC, C, xd, C, 1, wd, 1, C);
    report_ratio("forward (bias)", err_ratio(out, OC, ref, mag, N, OC, C));
    if (!g_first_out[dt == DT_F16][si]) {
        g_first_out[dt == DT_F16][si] = tu_malloc(no * 4);
        memcpy(g_first_out[dt == DT_F16][si], out, no * 4);
    } else { /* another engine (native here, the fallback first): both within the bound */
        const float *o1 = g_first_out[dt == DT_F16][si];
        double worst = 0.0;
        for (size_t i = 0; i < no; i++)
            worst = tu_worse(worst, fabs((double)out[i] - o1[i]) /
                                        (2.0 * ((C + 2) * ldexp(mag[i], -22) + 1e-30)));
        report_ratio("forward vs the first path's engine", worst);
    }
    float *again = tu_malloc(no * 4);
    dt_matmul_forward_lp(dt, again, x, w, bias, N, C, OC);
    assert_memory_equal(again, out, no * 4); /* deterministic */

    /* forward, no bias, dirty output */
    for (size_t i = 0; i < no; i++) out[i] = 1e6f;
    dt_matmul_forward_lp(dt, out, x, w, NULL, N, C, OC);
    ref_gemm(ref, mag, NULL, N, OC, C, xd, C, 1, wd, 1, C);
    report_ratio("forward (no bias, dirty output)", err_ratio(out, OC, ref, mag, N, OC, C));

    /* backward: dout narrowed into dout_lp, dinp overwritten, dw and dbias accumulate */
    tu_fill_uniform(dx, nx, 1e6f, 35);
    tu_fill_uniform(dw, nw, 1.0f, 36);
    tu_fill_uniform(db, OC, 1.0f, 37);
    float *dw0 = tu_malloc(nw * 4), *db0 = tu_malloc(OC * 4);
    memcpy(dw0, dw, nw * 4);
    memcpy(db0, db, OC * 4);
    dt_matmul_backward_lp(dt, dx, dw, db, dout, dlp, x, w, N, C, OC);
    uint16_t *dlp_want = tu_malloc(no * 2);
    dt_to_lowp(dt, dlp_want, dout, no);
    assert_memory_equal(dlp, dlp_want, no * 2);
    {
        float *f = tu_malloc(no * 4);
        dt_from_lowp(dt, f, dlp, no);
        tu_to_double(dd, f, no);
        free(f);
    }
    ref_gemm(ref, mag, NULL, N, C, OC, dd, OC, 1, wd, C, 1);
    report_ratio("backward dinp", err_ratio(dx, C, ref, mag, N, C, OC));
    tu_to_double(c0, dw0, nw);
    ref_gemm(ref, mag, c0, OC, C, N, dd, 1, OC, xd, C, 1);
    report_ratio("backward dw (accumulated)", err_ratio(dw, C, ref, mag, OC, C, N));
    {
        double *dout_d = tu_malloc(no * 8), *ones = tu_malloc((size_t)N * 8);
        for (int n = 0; n < N; n++) ones[n] = 1.0;
        tu_to_double(dout_d, dout, no);
        tu_to_double(c0, db0, OC);
        ref_gemm(ref, mag, c0, 1, OC, N, ones, 0, 1, dout_d, OC, 1); /* fp32 dout, summed */
        report_ratio("backward dbias (fp32 dout, accumulated)", err_ratio(db, OC, ref, mag, 1, OC, N));
        free(dout_d);
        free(ones);
    }
    float *dx2 = tu_malloc(nx * 4), *dw2 = tu_malloc(nw * 4), *db2 = tu_malloc(OC * 4);
    memcpy(dw2, dw0, nw * 4);
    memcpy(db2, db0, OC * 4);
    dt_matmul_backward_lp(dt, dx2, dw2, db2, dout, dlp, x, w, N, C, OC);
    assert_memory_equal(dx2, dx, nx * 4); /* deterministic */
    assert_memory_equal(dw2, dw, nw * 4);
    assert_memory_equal(db2, db, OC * 4);
    /* NULL dinp and dbias: dw alone */
    memcpy(dw2, dw0, nw * 4);
    dt_matmul_backward_lp(dt, NULL, dw2, NULL, dout, dlp, x, w, N, C, OC);
    assert_memory_equal(dw2, dw, nw * 4);

    /* Column blocks with leading dimensions, last block first: out (ldo = OC > block),
     * dout_lp rows of stride ldd = OC; dinp summed over blocks (the first overwrites). */
    int bs = (OC + 2) / 3, nblocks = (OC + bs - 1) / bs;
    for (size_t i = 0; i < no; i++) out[i] = 1e6f;
    tu_fill_uniform(dx2, nx, 1e6f, 38);
    memcpy(dw2, dw0, nw * 4);
    for (int o0 = (OC - 1) / bs * bs, first = 1; o0 >= 0; o0 -= bs, first = 0) {
        int n = OC - o0 < bs ? OC - o0 : bs;
        dt_matmul_forward_ld_lp(dt, out + o0, OC, x, w + (size_t)o0 * C, N, C, n);
        dt_matmul_backward_ld_lp(dt, dx2, !first, dw2 + (size_t)o0 * C, dlp + o0, OC, x,
                                 w + (size_t)o0 * C, N, C, n);
    }
    ref_gemm(ref, mag, NULL, N, OC, C, xd, C, 1, wd, 1, C);
    report_ratio("forward in column blocks (ldo)", err_ratio(out, OC, ref, mag, N, OC, C));
    ref_gemm(ref, mag, NULL, N, C, OC, dd, OC, 1, wd, C, 1);
    report_ratio("backward dinp summed over blocks (ldd)",
                 err_ratio(dx2, C, ref, mag, N, C, OC + nblocks));
    tu_to_double(c0, dw0, nw);
    ref_gemm(ref, mag, c0, OC, C, N, dd, 1, OC, xd, C, 1);
    report_ratio("backward dw per block (ldd, accumulated)", err_ratio(dw2, C, ref, mag, OC, C, N));

    free(x); free(w); free(dlp); free(xd); free(wd); free(dd); free(bias); free(dout);
    free(out); free(dx); free(dw); free(db); free(ref); free(mag); free(c0); free(again);
    free(dw0); free(db0); free(dlp_want); free(dx2); free(dw2); free(db2);
}

static void gemm_cases(void) {
    /* A forced lower path must take the fallback; on the best path a CPU with AVX512_BF16
     * gets oneDNN's native bf16 GEMM exactly when its rule prefers it (isa.h: not on Intel
     * cores without AMX, unless DTRAIN_LOWP_GEMM=native), else the speed-up (or the
     * slow-down) goes unnoticed. */
    if (dt_isa_active() != dt_isa_best()) {
        assert_false(dt_lowp_gemm_native(DT_BF16));
        assert_false(dt_lowp_gemm_native(DT_F16));
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (dt_isa_active() == dt_isa_best() && __builtin_cpu_supports("avx512bf16"))
        assert_int_equal(dt_lowp_gemm_native(DT_BF16), dt_isa_lowp_native_preferred());
#endif
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < NSHAPES; s++) gemm_shape(d ? DT_F16 : DT_BF16, (int)s);
}

static void test_gemm(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    /* by the CPU's rule, then native forced (so the native engine is checked on every CPU that
     * has one, whatever the rule picks), each engine within the bound of the first */
    for (int forced = 0; forced < 2; forced++) {
        if (forced) setenv("DTRAIN_LOWP_GEMM", "native", 1);
        else unsetenv("DTRAIN_LOWP_GEMM");
        assert_int_equal(dt_isa_init(&ctx), DT_OK);
        printf("  DTRAIN_LOWP_GEMM=%s: native preferred %d\n", forced ? "native" : "(auto)", dt_isa_lowp_native_preferred());
        tu_each_isa(gemm_cases);
    }
    unsetenv("DTRAIN_LOWP_GEMM");
    assert_int_equal(dt_isa_init(&ctx), DT_OK);
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < NSHAPES; s++) {
            free(g_first_out[d][s]);
            g_first_out[d][s] = NULL;
        }
}

/* DTRAIN_MATMUL=ref: plain loops on widened operands, so every path gives the same bits. */
static float *g_ref_first;

static void ref_cases(void) {
    const int N = 37, C = 50, OC = 130;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    assert_false(dt_lowp_gemm_native(DT_BF16));
    uint16_t *x = tu_malloc(nx * 2), *w = tu_malloc(nw * 2), *dlp = tu_malloc(no * 2);
    double *xd = tu_malloc(nx * 8), *wd = tu_malloc(nw * 8), *ref = tu_malloc(no * 8),
           *mag = tu_malloc(no * 8);
    float *all = tu_malloc((no + nx + nw) * 4), *dout = tu_malloc(no * 4);
    fill_lp(DT_BF16, x, xd, nx, 1.0f, 41);
    fill_lp(DT_BF16, w, wd, nw, 0.5f, 42);
    tu_fill_uniform(dout, no, 1.0f, 43);
    dt_matmul_forward_lp(DT_BF16, all, x, w, NULL, N, C, OC);
    dt_matmul_backward_lp(DT_BF16, all + no, all + no + nx, NULL, dout, dlp, x, w, N, C, OC);
    ref_gemm(ref, mag, NULL, N, OC, C, xd, C, 1, wd, 1, C);
    report_ratio("reference loops: forward", err_ratio(all, OC, ref, mag, N, OC, C));
    if (!g_ref_first) {
        g_ref_first = all;
        all = NULL;
    } else {
        assert_memory_equal(all, g_ref_first, (no + nx + nw) * 4);
        printf("    reference loops: forward, dinp, dw bitwise equal to the first path\n");
    }
    free(x); free(w); free(dlp); free(xd); free(wd); free(ref); free(mag); free(all); free(dout);
}

/* The 16-bit engine rule, derived here from /proc/cpuinfo on its own: an Intel x86-64 core
 * without amx_bf16 widens (its AVX512_BF16 matmul measured at half the fp32 rate), any other
 * CPU takes the native engine; DTRAIN_LOWP_GEMM overrides and a bad value is refused. */
static void test_lowp_rule(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    unsetenv("DTRAIN_LOWP_GEMM");
    assert_int_equal(dt_isa_init(&ctx), DT_OK);
#if defined(__x86_64__)
    FILE *f = fopen("/proc/cpuinfo", "r");
    assert_non_null(f);
    char line[8192];
    int intel = 0, amx = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "vendor_id", 9) && strstr(line, "GenuineIntel")) intel = 1;
        if (!strncmp(line, "flags", 5) && strstr(line, " amx_bf16")) amx = 1;
    }
    fclose(f);
    printf("  cpu: %s%s -> native 16-bit matmul preferred: %d\n", intel ? "Intel" : "not Intel",
           intel ? (amx ? " with AMX-BF16" : " without AMX-BF16") : "", dt_isa_lowp_native_preferred());
    assert_int_equal(dt_isa_lowp_native_preferred(), !intel || amx);
#else
    assert_int_equal(dt_isa_lowp_native_preferred(), 1);
#endif
    setenv("DTRAIN_LOWP_GEMM", "widened", 1);
    assert_int_equal(dt_isa_init(&ctx), DT_OK);
    assert_int_equal(dt_isa_lowp_native_preferred(), 0);
    assert_false(dt_lowp_gemm_native(DT_BF16));
    setenv("DTRAIN_LOWP_GEMM", "native", 1);
    assert_int_equal(dt_isa_init(&ctx), DT_OK);
    assert_int_equal(dt_isa_lowp_native_preferred(), 1);
    setenv("DTRAIN_LOWP_GEMM", "fast", 1);
    assert_int_equal(dt_isa_init(&ctx), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "DTRAIN_LOWP_GEMM=fast"));
    unsetenv("DTRAIN_LOWP_GEMM");
    assert_int_equal(dt_isa_init(&ctx), DT_OK);
}

static void test_gemm_reference_loops(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    setenv("DTRAIN_MATMUL", "ref", 1);
    unsetenv("DTRAIN_ISA");
    assert_int_equal(dt_isa_init(&ctx), DT_OK);
    assert_true(dt_isa_matmul_ref());
    tu_each_isa(ref_cases);
    free(g_ref_first);
    g_ref_first = NULL;
    unsetenv("DTRAIN_MATMUL");
    assert_int_equal(dt_isa_init(&ctx), DT_OK);
    assert_false(dt_isa_matmul_ref());
}

/* The widened fallback (fp16 always takes it with oneDNN 2.x; bf16 on CPUs without bf16 dot
 * products) works in panels of at most 4M floats per operand: with K = 150001 every GEMM of a
 * linear layer needs several blocks of C's rows or columns (forward 2 x 2, dinp and dW 2 column
 * blocks), each checked against the double reference. */
static void fallback_panels(void) {
    const int N = 37, C = 150001, OC = 29;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    uint16_t *x = tu_malloc(nx * 2), *w = tu_malloc(nw * 2), *dlp = tu_malloc(no * 2);
    double *xd = tu_malloc(nx * 8), *wd = tu_malloc(nw * 8), *dd = tu_malloc(no * 8);
    double *ref = tu_malloc(nx * 8), *mag = tu_malloc(nx * 8); /* nx >= nw, no */
    float *out = tu_malloc(no * 4), *dout = tu_malloc(no * 4), *dx = tu_malloc(nx * 4), *dw = tu_malloc(nw * 4);
    fill_lp(DT_F16, x, xd, nx, 1.0f, 51);
    fill_lp(DT_F16, w, wd, nw, 0.5f, 52);
    tu_fill_uniform(dout, no, 1.0f, 53);
    memset(dw, 0, nw * 4);
    dt_matmul_forward_lp(DT_F16, out, x, w, NULL, N, C, OC);
    dt_matmul_backward_lp(DT_F16, dx, dw, NULL, dout, dlp, x, w, N, C, OC);
    float *df = tu_malloc(no * 4);
    dt_from_lowp(DT_F16, df, dlp, no);
    tu_to_double(dd, df, no);
    ref_gemm(ref, mag, NULL, N, OC, C, xd, C, 1, wd, 1, C);
    report_ratio("fallback panels, K 150001: forward", err_ratio(out, OC, ref, mag, N, OC, C));
    ref_gemm(ref, mag, NULL, N, C, OC, dd, OC, 1, wd, C, 1);
    report_ratio("fallback panels: dinp", err_ratio(dx, C, ref, mag, N, C, OC));
    ref_gemm(ref, mag, NULL, OC, C, N, dd, 1, OC, xd, C, 1);
    report_ratio("fallback panels: dw", err_ratio(dw, C, ref, mag, OC, C, N));
    free(x); free(w); free(dlp); free(xd); free(wd); free(dd); free(ref); free(mag);
    free(out); free(dout); free(dx); free(dw); free(df);
}

static void test_gemm_fallback_panels(void **state) {
    (void)state;
    assert_false(dt_lowp_gemm_native(DT_F16)); /* this oneDNN has no CPU f16 matmul */
    fallback_panels();
}

/* More distinct problems than the primitive table holds (the rest run uncached), then the
 * table cleared and refilled: results stay right throughout. */
static void test_gemm_cache(void **state) {
    (void)state;
    const int C = 3, OC = 2, NMAX = 80;
    uint16_t *x = tu_malloc((size_t)NMAX * C * 2), *w = tu_malloc((size_t)OC * C * 2);
    double *xd = tu_malloc((size_t)NMAX * C * 8), *wd = tu_malloc((size_t)OC * C * 8);
    double *ref = tu_malloc((size_t)NMAX * OC * 8), *mag = tu_malloc((size_t)NMAX * OC * 8);
    float *out = tu_malloc((size_t)NMAX * OC * 4);
    fill_lp(DT_BF16, x, xd, (size_t)NMAX * C, 1.0f, 51);
    fill_lp(DT_BF16, w, wd, (size_t)OC * C, 1.0f, 52);
    double worst = 0.0;
    for (int round = 0; round < 2; round++) {
        for (int N = 1; N <= NMAX; N++) {
            dt_matmul_forward_lp(DT_BF16, out, x, w, NULL, N, C, OC);
            ref_gemm(ref, mag, NULL, N, OC, C, xd, C, 1, wd, 1, C);
            worst = tu_worse(worst, err_ratio(out, OC, ref, mag, N, OC, C));
        }
        dt_matmul_lowp_cache_clear();
    }
    printf("  %s bf16 GEMM\n", dt_lowp_gemm_native(DT_BF16) ? "native" : "fp32 fallback");
    report_ratio("80 shapes, twice, cache cleared between", worst);
    dt_matmul_lowp_cache_clear();
    free(x); free(w); free(xd); free(wd); free(ref); free(mag); free(out);
}

/* The rate helper runs and reports something plausible. */
static void test_peak_gflops(void **state) {
    (void)state;
    double best = 0.0;
    double med = dt_matmul_peak_gflops_lp(DT_BF16, 128, 3, &best);
    printf("  bf16 128^3: %.1f GFLOP/s median, %.1f best\n", med, best);
    assert_true(med > 0.0 && best >= med);
}

typedef struct serial_job {
    const float *src;
    uint16_t *dst;
    size_t n;
} serial_job;

static void *serial_thread(void *arg) {
    serial_job *j = arg;
    dt_ops_serial_thread();
    dt_f32_to_bf16(j->dst, j->src, j->n);
    dt_f32_to_f16(j->dst + j->n, j->src, j->n);
    return NULL;
}

static void test_serial_thread(void **state) {
    (void)state;
    /* A thread marked serial (the communication thread) converts on its own, to the same
     * bits as the threaded conversion of the caller's team. */
    const size_t n = (1u << 20) + 37;
    float *src = tu_malloc(n * sizeof(float));
    uint16_t *a = tu_malloc(2 * n * sizeof(uint16_t)), *b = tu_malloc(2 * n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) src[i] = (float)((double)i * 1.0000001e-3 - 400.0);
    dt_f32_to_bf16(a, src, n);
    dt_f32_to_f16(a + n, src, n);
    serial_job j = {src, b, n};
#ifdef DT_TEST_QEMU
    /* qemu-user 7.2 hangs in a guest's first pthread_create (tests/CMakeLists.txt): the
     * marked thread is this one, the last test to convert. */
    serial_thread(&j);
#else
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, serial_thread, &j), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
#endif
    assert_memory_equal(a, b, 2 * n * sizeof(uint16_t));
    free(src);
    free(a);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_widen_exhaustive),
        cmocka_unit_test(test_narrow_edges),
        cmocka_unit_test(test_narrow_random),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_lowp_rule),
        cmocka_unit_test(test_gemm_reference_loops),
        cmocka_unit_test(test_gemm_cache),
        cmocka_unit_test(test_gemm_fallback_panels),
        cmocka_unit_test(test_peak_gflops),
        cmocka_unit_test(test_serial_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
