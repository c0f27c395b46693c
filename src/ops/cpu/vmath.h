/* vmath.h - vectorised exp used by softmax, cross-entropy, GELU and attention.
 *
 * glibc's vector expf is only reachable under -ffast-math, which we do not use (it breaks
 * determinism), and scalar expf costs ~10 ns: over a 50k vocabulary that dominates a step.
 * This is a classic range reduction x = n ln2 + r, |r| <= ln2/2, with a degree-7 Taylor
 * polynomial in FMA Horner form: max relative error ~2e-7 (tested against libm). The scalar
 * and AVX-512 forms evaluate the same operations, so they give identical results.
 * exp of x < -87.3 returns 0 (so -INFINITY masks work); x > 88.7 is clamped.
 */
#ifndef DT_VMATH_H
#define DT_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

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

static inline float dt_expf(float x) {
    if (!(x >= DT_EXP_LO)) return 0.0f; /* NaN gives 0 here and in dt_exp_ps alike */
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
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#ifdef __AVX512F__
static inline __m512 dt_exp_ps(__m512 x) {
    __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(DT_EXP_LO), _CMP_GE_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(DT_EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(DT_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DT_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DT_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(DT_EXP_C7), r, _mm512_set1_ps(DT_EXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DT_EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DT_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DT_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(DT_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(bits));
}
#endif

/* y[i] = exp(x[i] - shift) for i < n; returns the sum of y in a fixed order
 * (16 lanes, then a fixed tree), so the result is deterministic. y may alias x, or be NULL
 * to compute the sum alone. */
static inline float dt_vexp_sum(float *y, const float *x, float shift, int n) {
#ifdef __AVX512F__
    __m512 acc = _mm512_setzero_ps();
    __m512 s = _mm512_set1_ps(shift);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = dt_exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
        if (y) _mm512_storeu_ps(y + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 e = dt_exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s));
        e = _mm512_maskz_mov_ps(m, e);
        if (y) _mm512_mask_storeu_ps(y + i, m, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        float e = dt_expf(x[i] - shift);
        if (y) y[i] = e;
        acc += e;
    }
    return acc;
#endif
}

/* max of x[0..n) (n >= 1). */
static inline float dt_vmax(const float *x, int n) {
#ifdef __AVX512F__
    __m512 m = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
    }
    return _mm512_reduce_max_ps(m);
#else
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
#endif
}

#endif
