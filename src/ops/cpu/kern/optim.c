/* Optimizer kernels: the AdamW update and the gradient sum of squares.
 *
 * Both must give the same bits on every path: in DDP every rank updates its own full copy
 * of the weights, and ranks on different CPUs must stay identical. AdamW is elementwise
 * with IEEE operations only (no FMA: the scalar path has none to match), and the sum of
 * squares keeps 8 double lanes whatever the vector width (a float times a float is exact
 * in double, so lanes add exact products in the same order everywhere). */
#include <math.h>

#include "ops/cpu/kern/kern.h"

static inline vf adamw_v(vf *pp, vf g, vf *mp, vf *vp, const dt_adamw_step *s) {
    vf gi = vf_mul(g, vf_set1(s->gscale)); /* x * 1.0f == x: no clipping costs nothing */
    vf mi = vf_add(vf_mul(vf_set1(s->b1), *mp), vf_mul(vf_set1(1.0f - s->b1), gi));
    vf vi = vf_add(vf_mul(vf_set1(s->b2), *vp),
                   vf_mul(vf_mul(vf_set1(1.0f - s->b2), gi), gi));
    *mp = mi;
    *vp = vi;
    vf denom = vf_add(vf_div(vf_sqrt(vi), vf_set1(s->bc2_sqrt)), vf_set1(s->eps));
    return vf_sub(vf_mul(*pp, vf_set1(s->shrink)),
                  vf_div(vf_mul(vf_set1(s->step_size), mi), denom));
}

void DT_K(adamw)(float *p, const float *g, float *m, float *v, size_t n,
                 const dt_adamw_step *s) {
    size_t i = 0;
    for (; i + VW <= n; i += VW) {
        vf pi = vf_load(p + i), mi = vf_load(m + i), vi = vf_load(v + i);
        vf_store(p + i, adamw_v(&pi, vf_load(g + i), &mi, &vi, s));
        vf_store(m + i, mi);
        vf_store(v + i, vi);
    }
    if (i < n) {
        const int r = (int)(n - i);
        vf pi = vf_load_n(p + i, r), mi = vf_load_n(m + i, r), vi = vf_load_n(v + i, r);
        vf_store_n(p + i, adamw_v(&pi, vf_load_n(g + i, r), &mi, &vi, s), r);
        vf_store_n(m + i, mi, r);
        vf_store_n(v + i, vi, r);
    }
}

double DT_K(sumsq)(const float *x, size_t n) {
    double lane[8];
    size_t i = 0;
#if DT_ISA_ID == DT_ISA_ID_AVX512
    __m512d acc = _mm512_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(d, d));
    }
    _mm512_storeu_pd(lane, acc);
#elif DT_ISA_ID == DT_ISA_ID_AVX2
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        __m256d d0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        __m256d d1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(d0, d0));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(d1, d1));
    }
    _mm256_storeu_pd(lane, a0);
    _mm256_storeu_pd(lane + 4, a1);
#elif DT_ISA_ID == DT_ISA_ID_NEON
    float64x2_t a[4] = {vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0)};
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 4; k++) {
            float64x2_t d = vcvt_f64_f32(vld1_f32(x + i + 2 * k));
            a[k] = vaddq_f64(a[k], vmulq_f64(d, d));
        }
    }
    for (int k = 0; k < 4; k++) vst1q_f64(lane + 2 * k, a[k]);
#else
    for (int k = 0; k < 8; k++) lane[k] = 0.0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) lane[k] += (double)x[i + k] * (double)x[i + k];
#endif
    for (int k = 0; i < n; i++, k++) lane[k] += (double)x[i] * (double)x[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}
