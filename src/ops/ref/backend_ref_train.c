/* The reference backend's operations of the training layers (backend_ref_impl.h): each in
 * float64 from the float inputs, rounded to float once per stored value. */
#include <math.h>

#include "ops/ref/backend_ref_impl.h"

/* ---- parallel/ and optim/ operations */

void dt_ref_be_adamw_chunked(float *params, const float *grads, float *m, float *v, size_t n, const dt_adamw_step *s) {
    const double b1 = s->b1, b2 = s->b2;
    for (size_t i = 0; i < n; i++) {
        const double g = (double)grads[i] * s->gscale;
        const double mi = b1 * m[i] + (1.0 - b1) * g, vi = b2 * v[i] + (1.0 - b2) * g * g;
        m[i] = (float)mi, v[i] = (float)vi;
        params[i] = (float)((double)params[i] * s->shrink - (double)s->step_size * mi / (sqrt(vi) / s->bc2_sqrt + s->eps));
    }
}

void dt_ref_be_adamw_aged(float *params, const float *grads, float *m, float *v, float *age, size_t n,
                          const dt_adamw_step *s) {
    for (size_t i = 0; i < n; i++) {
        const double g = (double)grads[i] * s->gscale;
        if (g == 0.0) {
            params[i] = (float)((double)params[i] * s->shrink);
            age[i] += 1.0f;
            continue;
        }
        const double a = age[i], d1 = pow(s->b1, a), d2 = pow(s->b2, a);
        const double mi = d1 * m[i] + (1.0 - d1) * (g / a), vi = d2 * v[i] + (1.0 - d2) * (g * g / a);
        m[i] = (float)mi, v[i] = (float)vi;
        params[i] = (float)((double)params[i] * s->shrink - a * s->step_size * mi / (sqrt(vi) / s->bc2_sqrt + s->eps));
        age[i] = 1.0f;
    }
}

double dt_ref_be_sumsq_chunked(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void dt_ref_be_add_f32(float *a, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = (float)((double)a[i] + x[i]);
}

void dt_ref_be_scale_f32(float *x, float factor, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)x[i] * factor);
}
