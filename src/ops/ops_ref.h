/* ops_ref.h - naive double-precision references of every kernel in ops.h.
 *
 * Straight loops, no tiling, no threads: the definition the fast kernels are tested against,
 * and themselves checked against central finite differences (tests/test_ops_*.c). Same
 * argument conventions as ops.h (dinp of layernorm accumulates; others overwrite; weight
 * gradients accumulate). The attention reference materialises the full (T,T) matrix.
 */
#ifndef DT_OPS_REF_H
#define DT_OPS_REF_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h"

void dt_ref_encoder_forward(double *out, const int32_t *tokens, const double *wte,
                            const double *wpe, int B, int T, int C);
void dt_ref_encoder_backward(double *dwte, double *dwpe, const double *dout,
                             const int32_t *tokens, int B, int T, int C);

void dt_ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp,
                              const double *w, const double *b, int N, int C);
void dt_ref_layernorm_backward(double *dinp, double *dw, double *db, const double *dout,
                               const double *inp, const double *w, const double *mean,
                               const double *rstd, int N, int C);

void dt_ref_matmul_forward(double *out, const double *inp, const double *w, const double *bias,
                           int N, int C, int OC);
void dt_ref_matmul_backward(double *dinp, double *dw, double *dbias, const double *dout,
                            const double *inp, const double *w, int N, int C, int OC);

void dt_ref_attention_forward(double *out, double *lse, const double *qkv, int B, int T, int NH,
                              int NKV, int hs, int causal);
void dt_ref_attention_backward(double *dqkv, const double *dout, const double *qkv,
                               const double *out, const double *lse, int B, int T, int NH,
                               int NKV, int hs, int causal);

void dt_ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *w,
                            int N, int C, double eps);
void dt_ref_rmsnorm_backward(double *dinp, double *dw, const double *dout, const double *inp,
                             const double *w, const double *rstd, int N, int C);

/* In place, as dt_rope_*; the angles are t * inv_freq[i] in double, cos and sin times scale. */
void dt_ref_rope_forward(double *qkv, int B, int T, int NH, int NKV, int hs, const double *inv_freq,
                         double scale);
void dt_ref_rope_backward(double *dqkv, int B, int T, int NH, int NKV, int hs, const double *inv_freq,
                          double scale);
/* inv[0..hs/2) = theta^(-2i/hs) in double. */
/* Positions pos0 .. pos0 + T - 1 (dt_rope_forward_at); backward: the transposed rotation. */
void dt_ref_rope_at(double *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const double *inv_freq, double scale,
                    int backward);
void dt_ref_rope_inv_freq(double *inv, int hs, double theta);

void dt_ref_swiglu_forward(double *out, const double *inp, int N, int F);
void dt_ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int N, int F);

void dt_ref_gelu_forward(double *out, const double *inp, int N);
void dt_ref_gelu_backward(double *dinp, const double *inp, const double *dout, int N);

void dt_ref_residual_forward(double *out, const double *a, const double *b, int N);

void dt_ref_crossentropy_forward(double *losses, double *lse, const double *logits,
                                 const int32_t *targets, int N, int V, int Vp);
void dt_ref_crossentropy_backward(double *dlogits, const double *logits, const double *lse,
                                  const int32_t *targets, double dloss, int N, int V, int Vp);

/* NF4 (ops.h), read from the definitions in double: idx (n) = for each element the index of
 * the code value (dt_nf4_codebook_derive, in double) nearest to w / absmax of its block of 64
 * (by distance, ties to the lower index; 7 in an all-zero block), absmax (nblocks) = the exact
 * block absmaxes. */
void dt_ref_nf4_quantize(uint8_t *idx, double *absmax, const float *w, size_t n);
/* out (n) = t dequantized: element i of block b = code[index] * (qabsmax[b] step[b / 256] +
 * offset), the index read from byte i / 2 (even i: high nibble), code in double. */
void dt_ref_nf4_dequantize(double *out, const dt_nf4 *t);

#endif
