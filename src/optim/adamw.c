#include <math.h>

#include "optim/optim.h"

void dt_adamw_update(const dt_adamw *opt, float *params, const float *grads, float *m, float *v,
                     const dt_param_segment *segs, int nsegs, float lr, long t, float gscale) {
    const float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    /* Bias corrections in double, as torch computes them in Python floats. */
    const float step_size = (float)((double)lr / (1.0 - pow(b1, (double)t)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)t));
    for (int s = 0; s < nsegs; s++) {
        const float shrink = segs[s].decay ? 1.0f - lr * opt->weight_decay : 1.0f;
        float *p = params + segs[s].offset, *ms = m + segs[s].offset, *vs = v + segs[s].offset;
        const float *g = grads + segs[s].offset;
        size_t n = segs[s].len;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gscale; /* x * 1.0f == x exactly: no clipping costs nothing */
            float mi = b1 * ms[i] + (1.0f - b1) * gi;
            float vi = b2 * vs[i] + (1.0f - b2) * gi * gi;
            ms[i] = mi;
            vs[i] = vi;
            float denom = sqrtf(vi) / bc2_sqrt + eps;
            p[i] = p[i] * shrink - step_size * mi / denom;
        }
    }
}
