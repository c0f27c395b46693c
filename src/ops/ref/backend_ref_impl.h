/* backend_ref_impl.h - the reference backend's operations defined outside backend_ref.c (its
 * table is there): those of the training layers (backend_ref_train.c). Internal to src/ops/ref. */
#ifndef DT_BACKEND_REF_IMPL_H
#define DT_BACKEND_REF_IMPL_H

#include "ops/ops.h"

/* parallel/ and optim/ operations */
void dt_ref_be_adamw_chunked(float *params, const float *grads, float *m, float *v, size_t n, const dt_adamw_step *s);
void dt_ref_be_adamw_aged(float *params, const float *grads, float *m, float *v, float *age, size_t n,
                          const dt_adamw_step *s);
double dt_ref_be_sumsq_chunked(const float *x, size_t n);
void dt_ref_be_add_f32(float *a, const float *x, size_t n);
void dt_ref_be_scale_f32(float *x, float factor, size_t n);

#endif
