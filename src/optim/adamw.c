#include <math.h>

#include "ops/cpu/kernels.h"
#include "optim/optim.h"

#define DT_ADAMW_CHUNK 16384 /* elements per OpenMP work item */

void dt_adamw_update(const dt_adamw *opt, float *params, const float *grads, float *m, float *v,
                     const dt_param_segment *segs, int nsegs, float lr, long t, float gscale) {
    const dt_cpu_kernels *k = dt_cpu_kernels_get();
    dt_adamw_step st = {.b1 = opt->beta1, .b2 = opt->beta2, .eps = opt->eps, .gscale = gscale};
    /* Bias corrections in double, as torch computes them in Python floats. */
    st.step_size = (float)((double)lr / (1.0 - pow(opt->beta1, (double)t)));
    st.bc2_sqrt = (float)sqrt(1.0 - pow(opt->beta2, (double)t));
    for (int s = 0; s < nsegs; s++) {
        dt_adamw_step ss = st;
        ss.shrink = segs[s].decay ? 1.0f - lr * opt->weight_decay : 1.0f;
        const size_t off = segs[s].offset, n = segs[s].len;
        /* Elementwise: any split gives the same bits. */
#pragma omp parallel for schedule(static)
        for (size_t c = 0; c < n; c += DT_ADAMW_CHUNK) {
            size_t len = n - c < DT_ADAMW_CHUNK ? n - c : DT_ADAMW_CHUNK;
            k->adamw(params + off + c, grads + off + c, m + off + c, v + off + c, len, &ss);
        }
    }
}

void dt_adamw_update_aged(const dt_adamw *opt, float *params, const float *grads, float *m, float *v,
                          float *age, const dt_param_segment *segs, int nsegs, float lr, long t, float gscale) {
    const float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    const float step_size = (float)((double)lr / (1.0 - pow(opt->beta1, (double)t)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(opt->beta2, (double)t));
    for (int s = 0; s < nsegs; s++) {
        const float shrink = segs[s].decay ? 1.0f - lr * opt->weight_decay : 1.0f;
        const size_t off = segs[s].offset, n = segs[s].len;
#pragma omp parallel for schedule(static)
        for (size_t c = 0; c < n; c += DT_ADAMW_CHUNK) {
            size_t end = n - c < DT_ADAMW_CHUNK ? n : c + DT_ADAMW_CHUNK;
            for (size_t i = off + c; i < off + end; i++) {
                const float g = grads[i] * gscale;
                if (g == 0.0f) { /* nothing arrived */
                    params[i] *= shrink;
                    age[i] += 1.0f;
                    continue;
                }
                const float a = age[i], d1 = powf(b1, a), d2 = powf(b2, a);
                m[i] = d1 * m[i] + (1.0f - d1) * (g / a);
                v[i] = d2 * v[i] + (1.0f - d2) * (g * g / a);
                params[i] = params[i] * shrink - a * step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
                age[i] = 1.0f;
            }
        }
    }
}
