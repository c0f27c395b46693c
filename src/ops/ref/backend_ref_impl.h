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

/* model/ operations */
void dt_ref_be_patchify(float *patches, const int32_t *pix, int B, int CH, int S, int p);
void dt_ref_be_cls_pos_forward(float *out, const float *cls, const float *pe, const float *pos, int r0, int rows, int T,
                               int C);
void dt_ref_be_cls_pos_backward(float *dpos, float *dcls, float *dpe, const float *dout, int B, int T, int C);
void dt_ref_be_crossentropy_backward_blocks(float *dlogits, const float *lse, const int32_t *targets, float dloss, int N,
                                            int ld, int nb, int Vl, long col0, int V);
void dt_ref_be_f32_to_lowp_rows_inplace(dt_dtype dt, float *x, int N, int ld);
void dt_ref_be_lowrank_down_forward(float *u, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N,
                                    int C, int r, const dt_dropout *d);
void dt_ref_be_lowrank_up_forward(float *out, int ldo, const float *u, const float *B, float s, int N, int rows, int r);
void dt_ref_be_lowrank_up_backward(float *dB, float *du, const float *dout, int ldd, const float *u, const float *B,
                                   float s, int N, int rows, int r);
void dt_ref_be_lowrank_down_backward(float *dA, float *dinp, const float *du, const float *xf, const uint16_t *xh,
                                     dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d);
void dt_ref_be_fill_normal(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t i0, uint64_t drawn, float std);
void dt_ref_be_fill_f32(float *dst, float v, size_t n);
void dt_ref_be_lowrank_merge(float *W, const float *A, const float *B, float s, int rows, int C, int r);

#endif
