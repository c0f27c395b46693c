#include "ops/ops.h"
#include "optim/optim.h"

double dt_sumsq(const float *x, size_t n) { return dt_sumsq_chunked(x, n); }

float dt_clip_coef(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double coef = (double)max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}
