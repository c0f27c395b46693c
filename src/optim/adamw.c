#include <math.h>

#include "ops/ops.h"
#include "optim/optim.h"

/* The step's scalars; the segment's shrink is set per segment. */
static dt_adamw_step step_scalars(const dt_adamw *opt, float lr, long t, float gscale) {
    dt_adamw_step st = {.b1 = opt->beta1, .b2 = opt->beta2, .eps = opt->eps, .gscale = gscale};
    /* Bias corrections in double, as torch computes them in Python floats. */
    st.step_size = (float)((double)lr / (1.0 - pow(opt->beta1, (double)t)));
    st.bc2_sqrt = (float)sqrt(1.0 - pow(opt->beta2, (double)t));
    return st;
}

void dt_adamw_update(const dt_adamw *opt, float *params, const float *grads, float *m, float *v,
                     const dt_param_segment *segs, int nsegs, float lr, long t, float gscale) {
    const dt_adamw_step st = step_scalars(opt, lr, t, gscale);
    for (int s = 0; s < nsegs; s++) {
        dt_adamw_step ss = st;
        ss.shrink = segs[s].decay ? 1.0f - lr * opt->weight_decay : 1.0f;
        const size_t off = segs[s].offset;
        dt_adamw_chunked(params + off, grads + off, m + off, v + off, segs[s].len, &ss);
    }
}

void dt_adamw_update_aged(const dt_adamw *opt, float *params, const float *grads, float *m, float *v,
                          float *age, const dt_param_segment *segs, int nsegs, float lr, long t, float gscale) {
    const dt_adamw_step st = step_scalars(opt, lr, t, gscale);
    for (int s = 0; s < nsegs; s++) {
        dt_adamw_step ss = st;
        ss.shrink = segs[s].decay ? 1.0f - lr * opt->weight_decay : 1.0f;
        const size_t off = segs[s].offset;
        dt_adamw_aged(params + off, grads + off, m + off, v + off, age + off, segs[s].len, &ss);
    }
}
