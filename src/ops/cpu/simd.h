/* simd.h - the vector vocabulary the CPU kernels are written in, one definition per ISA.
 *
 * The kernel sources under src/ops/cpu/kern/ are compiled once per ISA path with
 * DT_ISA_ID set (CMakeLists.txt: scalar with the baseline flags, avx2 with -mavx2 -mfma,
 * avx512 with -mavx512f/bw/dq/vl; neon on aarch64). This header is the only place that knows
 * which path a translation unit is: it maps `vf` (VW floats) and its operations onto the
 * intrinsics of that path, so each kernel is written once. DT_ISA_ID, not the compiler's
 * __AVX512F__ etc., selects the body: a -march=native build defines those everywhere, and
 * the avx2 path must stay AVX2 there.
 *
 * Numerics: every operation is the IEEE operation it names, and vf_fma is one rounding on
 * every path (FMA instructions, or fmaf on the scalar path). An elementwise kernel written
 * with these operations therefore gives the same bits on every path (AdamW relies on it);
 * reductions differ between paths only in the lane count (VW), which fixes their order.
 */
#ifndef DT_SIMD_H
#define DT_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/cpu/isa.h"

#ifndef DT_ISA_ID
#error "simd.h is for the per-ISA kernel sources (compiled with -DDT_ISA_ID=...)"
#endif

/* Constants of exp(x) = 2^n e^r, |r| <= ln2/2, degree-7 Taylor polynomial (max rel error
 * ~2e-7 against libm, tested). exp of x < DT_EXP_LO is 0 (so -INFINITY masks work, and NaN
 * gives 0 on every path); x > DT_EXP_HI is clamped. */
#define DT_EXP_LO (-87.33654f)
#define DT_EXP_HI (88.72283f)
#define DT_LOG2E 1.44269504088896341f
#define DT_LN2_HI 0.693145751953125f
#define DT_LN2_LO 1.428606765330187045e-06f
#define DT_EXP_C7 (1.0f / 5040.0f)
#define DT_EXP_C6 (1.0f / 720.0f)
#define DT_EXP_C5 (1.0f / 120.0f)
#define DT_EXP_C4 (1.0f / 24.0f)
#define DT_EXP_C3 (1.0f / 6.0f)
#define DT_EXP_C2 0.5f

/* ------------------------------------------------------------------ AVX-512 (16 lanes) */
#if DT_ISA_ID == DT_ISA_ID_AVX512
#include <immintrin.h>
#define VW 16
typedef __m512 vf;
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline __mmask16 vf_tail_mask(int n) { return (__mmask16)((1u << n) - 1u); }
/* First n < VW lanes from p, the rest 0; never reads past p + n. */
static inline vf vf_load_n(const float *p, int n) {
    return _mm512_maskz_loadu_ps(vf_tail_mask(n), p);
}
static inline void vf_store_n(float *p, vf v, int n) {
    _mm512_mask_storeu_ps(p, vf_tail_mask(n), v);
}
/* Lanes >= n set to 0. */
static inline vf vf_keep_n(vf v, int n) { return _mm512_maskz_mov_ps(vf_tail_mask(n), v); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_sqrt(vf a) { return _mm512_sqrt_ps(a); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }   /* a*b+c */
static inline vf vf_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); } /* c-a*b */
static inline vf vf_round(vf a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* 2^n for integral n in [-127, 128] (as floats), by building the exponent field. */
static inline vf vf_pow2i(vf n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
/* v where x >= lo, else 0 (NaN x gives 0). */
static inline vf vf_zero_unless_ge(vf v, vf x, vf lo) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), v);
}
static inline float vf_hsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline float vf_hmax(vf v) { return _mm512_reduce_max_ps(v); }

/* -------------------------------------------------------------- AVX2 + FMA (8 lanes) */
#elif DT_ISA_ID == DT_ISA_ID_AVX2
#include <immintrin.h>
#define VW 8
typedef __m256 vf;
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline __m256i vf_tail_mask(int n) {
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - n));
}
static inline vf vf_load_n(const float *p, int n) {
    return _mm256_maskload_ps(p, vf_tail_mask(n)); /* masked lanes are not read */
}
static inline void vf_store_n(float *p, vf v, int n) {
    _mm256_maskstore_ps(p, vf_tail_mask(n), v);
}
static inline vf vf_keep_n(vf v, int n) {
    return _mm256_and_ps(v, _mm256_castsi256_ps(vf_tail_mask(n)));
}
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_sqrt(vf a) { return _mm256_sqrt_ps(a); }
static inline vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf vf_round(vf a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf vf_pow2i(vf n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vf vf_zero_unless_ge(vf v, vf x, vf lo) {
    return _mm256_and_ps(v, _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
}
static inline float vf_hsum(vf v) { /* (lo + hi), then pairs: a fixed tree */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float vf_hmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---------------------------------------------------------- aarch64 NEON (4 lanes) */
#elif DT_ISA_ID == DT_ISA_ID_NEON
#include <arm_neon.h>
#define VW 4
typedef float32x4_t vf;
static inline vf vf_zero(void) { return vdupq_n_f32(0.0f); }
static inline vf vf_set1(float x) { return vdupq_n_f32(x); }
static inline vf vf_load(const float *p) { return vld1q_f32(p); }
static inline void vf_store(float *p, vf v) { vst1q_f32(p, v); }
static inline vf vf_load_n(const float *p, int n) {
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(t, p, (size_t)n * sizeof(float));
    return vld1q_f32(t);
}
static inline void vf_store_n(float *p, vf v, int n) {
    float t[4];
    vst1q_f32(t, v);
    memcpy(p, t, (size_t)n * sizeof(float));
}
static inline vf vf_keep_n(vf v, int n) {
    static const uint32_t m[8] = {~0u, ~0u, ~0u, ~0u, 0, 0, 0, 0};
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), vld1q_u32(m + 4 - n)));
}
static inline vf vf_add(vf a, vf b) { return vaddq_f32(a, b); }
static inline vf vf_sub(vf a, vf b) { return vsubq_f32(a, b); }
static inline vf vf_mul(vf a, vf b) { return vmulq_f32(a, b); }
static inline vf vf_div(vf a, vf b) { return vdivq_f32(a, b); }
static inline vf vf_sqrt(vf a) { return vsqrtq_f32(a); }
/* minnum/maxnum semantics are not needed: callers never pass NaN where it matters, and
 * vminq/vmaxq propagate NaN like the x86 forms do for the first operand. */
static inline vf vf_min(vf a, vf b) { return vminq_f32(a, b); }
static inline vf vf_max(vf a, vf b) { return vmaxq_f32(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
static inline vf vf_fnma(vf a, vf b, vf c) { return vfmsq_f32(c, a, b); }
static inline vf vf_round(vf a) { return vrndnq_f32(a); }
static inline vf vf_pow2i(vf n) {
    return vreinterpretq_f32_s32(
        vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}
static inline vf vf_zero_unless_ge(vf v, vf x, vf lo) {
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), vcgeq_f32(x, lo)));
}
static inline float vf_hsum(vf v) { /* (a0 + a1) + (a2 + a3), written out: a fixed order */
    return (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 1)) +
           (vgetq_lane_f32(v, 2) + vgetq_lane_f32(v, 3));
}
static inline float vf_hmax(vf v) { return vmaxvq_f32(v); }

/* --------------------------------------------------------------- scalar (1 lane) */
#elif DT_ISA_ID == DT_ISA_ID_SCALAR
#define VW 1
typedef float vf;
static inline vf vf_zero(void) { return 0.0f; }
static inline vf vf_set1(float x) { return x; }
static inline vf vf_load(const float *p) { return *p; }
static inline void vf_store(float *p, vf v) { *p = v; }
/* With one lane a tail is never partial (n < VW means n == 0). */
static inline vf vf_load_n(const float *p, int n) { return n ? *p : 0.0f; }
static inline void vf_store_n(float *p, vf v, int n) {
    if (n) *p = v;
}
static inline vf vf_keep_n(vf v, int n) { return n ? v : 0.0f; }
static inline vf vf_add(vf a, vf b) { return a + b; }
static inline vf vf_sub(vf a, vf b) { return a - b; }
static inline vf vf_mul(vf a, vf b) { return a * b; }
static inline vf vf_div(vf a, vf b) { return a / b; }
static inline vf vf_sqrt(vf a) { return sqrtf(a); }
/* As x86 minps/maxps: the second operand when either is NaN. */
static inline vf vf_min(vf a, vf b) { return a < b ? a : b; }
static inline vf vf_max(vf a, vf b) { return a > b ? a : b; }
static inline vf vf_fma(vf a, vf b, vf c) { return fmaf(a, b, c); }
static inline vf vf_fnma(vf a, vf b, vf c) { return fmaf(-a, b, c); }
static inline vf vf_round(vf a) { return nearbyintf(a); }
static inline vf vf_pow2i(vf n) {
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline vf vf_zero_unless_ge(vf v, vf x, vf lo) { return x >= lo ? v : 0.0f; }
static inline float vf_hsum(vf v) { return v; }
static inline float vf_hmax(vf v) { return v; }

#else
#error "unknown DT_ISA_ID"
#endif

/* exp(x) lane by lane; the same operations on every path, so the same bits everywhere. */
static inline vf vf_exp(vf x) {
    vf ok_x = x;
    x = vf_min(x, vf_set1(DT_EXP_HI));
    vf n = vf_round(vf_mul(x, vf_set1(DT_LOG2E)));
    vf r = vf_fnma(n, vf_set1(DT_LN2_HI), x);
    r = vf_fnma(n, vf_set1(DT_LN2_LO), r);
    vf p = vf_fma(vf_set1(DT_EXP_C7), r, vf_set1(DT_EXP_C6));
    p = vf_fma(p, r, vf_set1(DT_EXP_C5));
    p = vf_fma(p, r, vf_set1(DT_EXP_C4));
    p = vf_fma(p, r, vf_set1(DT_EXP_C3));
    p = vf_fma(p, r, vf_set1(DT_EXP_C2));
    p = vf_fma(p, r, vf_set1(1.0f));
    p = vf_fma(p, r, vf_set1(1.0f));
    return vf_zero_unless_ge(vf_mul(p, vf_pow2i(n)), ok_x, vf_set1(DT_EXP_LO));
}

/* Scalar exp with the vector's exact operations (for single values inside kernels). */
static inline float dt_k_expf(float x) {
    if (!(x >= DT_EXP_LO)) return 0.0f;
    if (x > DT_EXP_HI) x = DT_EXP_HI;
    float n = nearbyintf(x * DT_LOG2E);
    float r = fmaf(-n, DT_LN2_HI, x);
    r = fmaf(-n, DT_LN2_LO, r);
    float p = fmaf(DT_EXP_C7, r, DT_EXP_C6);
    p = fmaf(p, r, DT_EXP_C5);
    p = fmaf(p, r, DT_EXP_C4);
    p = fmaf(p, r, DT_EXP_C3);
    p = fmaf(p, r, DT_EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* ------------------------------------------------------ row helpers on whole arrays */

/* y[i] = exp(x[i] - shift); returns the sum of y in a fixed order (VW lane sums, then
 * vf_hsum). y may alias x, or be NULL for the sum alone. */
static inline float vk_exp_sum(float *y, const float *x, float shift, int n) {
    vf acc = vf_zero(), s = vf_set1(shift);
    int i = 0;
    for (; i + VW <= n; i += VW) {
        vf e = vf_exp(vf_sub(vf_load(x + i), s));
        if (y) vf_store(y + i, e);
        acc = vf_add(acc, e);
    }
    if (i < n) {
        vf e = vf_keep_n(vf_exp(vf_sub(vf_load_n(x + i, n - i), s)), n - i);
        if (y) vf_store_n(y + i, e, n - i);
        acc = vf_add(acc, e);
    }
    return vf_hsum(acc);
}

/* max of x[0..n), n >= 1. */
static inline float vk_max(const float *x, int n) {
    vf m = vf_set1(x[0]);
    int i = 0;
    for (; i + VW <= n; i += VW) m = vf_max(m, vf_load(x + i));
    float r = vf_hmax(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r; /* the tail, exactly (no zero lanes) */
    return r;
}

/* dst[i] += src[i]. */
static inline void vk_acc(float *dst, const float *src, int n) {
    int i = 0;
    for (; i + VW <= n; i += VW) vf_store(dst + i, vf_add(vf_load(dst + i), vf_load(src + i)));
    if (i < n) vf_store_n(dst + i, vf_add(vf_load_n(dst + i, n - i), vf_load_n(src + i, n - i)), n - i);
}

/* dst[i] = a[i] + b[i] (dst may alias a or b). */
static inline void vk_add(float *dst, const float *a, const float *b, int n) {
    int i = 0;
    for (; i + VW <= n; i += VW) vf_store(dst + i, vf_add(vf_load(a + i), vf_load(b + i)));
    if (i < n) vf_store_n(dst + i, vf_add(vf_load_n(a + i, n - i), vf_load_n(b + i, n - i)), n - i);
}

/* x[i] *= s. */
static inline void vk_scale(float *x, float s, int n) {
    vf vs = vf_set1(s);
    int i = 0;
    for (; i + VW <= n; i += VW) vf_store(x + i, vf_mul(vf_load(x + i), vs));
    if (i < n) vf_store_n(x + i, vf_mul(vf_load_n(x + i, n - i), vs), n - i);
}

/* a . b in a fixed order (VW lanes of FMA, then vf_hsum). */
static inline float vk_dot(const float *a, const float *b, int n) {
    vf acc = vf_zero();
    int i = 0;
    for (; i + VW <= n; i += VW) acc = vf_fma(vf_load(a + i), vf_load(b + i), acc);
    if (i < n) acc = vf_fma(vf_load_n(a + i, n - i), vf_load_n(b + i, n - i), acc);
    return vf_hsum(acc);
}

/* sum of x in a fixed order. */
static inline float vk_sum(const float *x, int n) {
    vf acc = vf_zero();
    int i = 0;
    for (; i + VW <= n; i += VW) acc = vf_add(acc, vf_load(x + i));
    if (i < n) acc = vf_add(acc, vf_load_n(x + i, n - i));
    return vf_hsum(acc);
}

#endif
