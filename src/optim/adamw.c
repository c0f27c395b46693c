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
