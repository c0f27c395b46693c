/* GELU, tanh form, with tanh(u) = 1 - 2 / (exp(2u) + 1) on the vectorised exp of vmath.h.
 * The AVX-512 path handles tails with masks, so every element goes through the same
 * instructions; the scalar path (no AVX-512) evaluates the same formula. */
#include <math.h>

#include "ops/cpu/vmath.h"
#include "ops/ops.h"

#define DT_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define DT_GELU_A 0.044715f
#define DT_CHUNK 4096 /* elements per OpenMP work item */

#ifdef __AVX512F__
static inline __m512 tanh_ps(__m512 u) {
    /* Clamp keeps exp(2u) finite; tanh(+-9) == +-1 in fp32. */
    u = _mm512_min_ps(_mm512_max_ps(u, _mm512_set1_ps(-9.0f)), _mm512_set1_ps(9.0f));
    __m512 e = dt_exp_ps(_mm512_add_ps(u, u));
    __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
}

static inline __m512 inner_ps(__m512 x) { /* K (x + A x^3) */
    __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    return _mm512_mul_ps(_mm512_set1_ps(DT_GELU_K),
                         _mm512_fmadd_ps(_mm512_set1_ps(DT_GELU_A), x3, x));
}
#else
static inline float tanh_s(float u) {
    u = u > 9.0f ? 9.0f : (u < -9.0f ? -9.0f : u);
    return 1.0f - 2.0f / (dt_expf(2.0f * u) + 1.0f);
}
#endif

void dt_gelu_forward(float *out, const float *inp, int N) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < N; c += DT_CHUNK) {
        int end = c + DT_CHUNK < N ? c + DT_CHUNK : N;
#ifdef __AVX512F__
        for (int i = c; i < end; i += 16) {
            __mmask16 m = end - i >= 16 ? 0xffff : (__mmask16)((1u << (end - i)) - 1u);
            __m512 x = _mm512_maskz_loadu_ps(m, inp + i);
            __m512 th = tanh_ps(inner_ps(x));
            __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x),
                                     _mm512_add_ps(_mm512_set1_ps(1.0f), th));
            _mm512_mask_storeu_ps(out + i, m, y);
        }
#else
        for (int i = c; i < end; i++) {
            float x = inp[i];
            out[i] = 0.5f * x * (1.0f + tanh_s(DT_GELU_K * fmaf(DT_GELU_A, x * x * x, x)));
        }
#endif
    }
}

void dt_gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < N; c += DT_CHUNK) {
        int end = c + DT_CHUNK < N ? c + DT_CHUNK : N;
#ifdef __AVX512F__
        const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
        for (int i = c; i < end; i += 16) {
            __mmask16 m = end - i >= 16 ? 0xffff : (__mmask16)((1u << (end - i)) - 1u);
            __m512 x = _mm512_maskz_loadu_ps(m, inp + i);
            __m512 th = tanh_ps(inner_ps(x));
            __m512 sech2 = _mm512_fnmadd_ps(th, th, one);
            /* du/dx = K (1 + 3A x^2) */
            __m512 du = _mm512_mul_ps(
                _mm512_set1_ps(DT_GELU_K),
                _mm512_fmadd_ps(_mm512_set1_ps(3.0f * DT_GELU_A), _mm512_mul_ps(x, x), one));
            __m512 g = _mm512_add_ps(_mm512_mul_ps(half, _mm512_add_ps(one, th)),
                                     _mm512_mul_ps(_mm512_mul_ps(half, x),
                                                   _mm512_mul_ps(sech2, du)));
            __m512 d = _mm512_maskz_loadu_ps(m, dout + i);
            _mm512_mask_storeu_ps(dinp + i, m, _mm512_mul_ps(d, g));
        }
#else
        for (int i = c; i < end; i++) {
            float x = inp[i];
            float th = tanh_s(DT_GELU_K * fmaf(DT_GELU_A, x * x * x, x));
            float sech2 = 1.0f - th * th;
            float du = DT_GELU_K * (1.0f + 3.0f * DT_GELU_A * x * x);
            dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
        }
#endif
    }
}
