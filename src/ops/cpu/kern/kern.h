/* kern.h - prototypes of one ISA path's kernel bodies (the .c files of src/ops/cpu/kern,
 * compiled once per path with -DDT_ISA_ID=... -DDT_ISA_SFX=<path>; see simd.h). DT_K(name) is
 * the path's name of a kernel: dt_k_<name>_<path>. */
#ifndef DT_KERN_H
#define DT_KERN_H

#include "ops/cpu/kernels.h"
#include "ops/cpu/simd.h"

#define DT_K(name) DT_KPASTE(dt_k_##name, DT_ISA_SFX)

void DT_K(encoder_forward)(float *out, const int32_t *tokens, const float *wte, int row0,
                           int rows, int N, int C);
void DT_K(encoder_backward)(float *dwte, int row0, int rows, const float *dout,
                            const int32_t *tokens, int N, int C);
void DT_K(pos_forward)(float *out, const float *wpe, int B, int T, int C);
void DT_K(pos_backward)(float *dwpe, const float *dout, int B, int T, int C);
void DT_K(layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                             const float *w, const float *b, int N, int C);
void DT_K(layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int N, int C);
void DT_K(bias_backward)(float *dbias, const float *dout, int N, int OC);
void DT_K(attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int NH,
                             int NKV, int hs, int causal, int op);
void DT_K(attention_backward)(float *dqkv, const float *dout, const float *qkv,
                              const float *out, const float *lse, int B, int T, int NH,
                              int NKV, int hs, int causal, int op);
void DT_K(attention_block_forward)(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *kv,
                                   int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, int op);
void DT_K(attention_block_backward)(float *dq, int lddq, float *dkv, int lddkv, const float *dout, const float *out,
                                    int ldo, const float *lse, int ldl, const float *q, int ldq, const float *kv,
                                    int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, int op);
void DT_K(attention_merge)(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb, int ldlb,
                           int T, int NH, int hs);
void DT_K(rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N,
                           int C, float eps);
void DT_K(rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp,
                            const float *w, const float *rstd, int N, int C);
void DT_K(rope_forward)(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale);
void DT_K(rope_backward)(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale);
void DT_K(rope_forward_at)(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
void DT_K(rope_backward_at)(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
void DT_K(swiglu_forward)(float *out, const float *inp, int N, int F);
void DT_K(swiglu_backward)(float *dinp, const float *inp, const float *dout, int N, int F);
void DT_K(gelu_forward)(float *out, const float *inp, int N);
void DT_K(gelu_backward)(float *dinp, const float *inp, const float *dout, int N);
void DT_K(residual_forward)(float *out, const float *a, const float *b, int N);
void DT_K(crossentropy_forward)(float *losses, float *lse, const float *logits,
                                const int32_t *targets, int N, int V, int Vp);
void DT_K(crossentropy_backward)(float *dlogits, const float *logits, const float *lse,
                                 const int32_t *targets, float dloss, int N, int V, int Vp);
float DT_K(exp_sum)(float *y, const float *x, float shift, int n);
void DT_K(adamw)(float *p, const float *g, float *m, float *v, size_t n,
                 const dt_adamw_step *s);
double DT_K(sumsq)(const float *x, size_t n);
void DT_K(f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
void DT_K(bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
void DT_K(f32_to_f16)(uint16_t *dst, const float *src, size_t n);
void DT_K(f16_to_f32)(float *dst, const uint16_t *src, size_t n);
size_t DT_K(count_nonfinite)(const float *x, size_t n);
void DT_K(nf4_dequant)(float *dst, const uint8_t *codes, const int8_t *qabsmax,
                       const float *step, float offset, const float *code, size_t i0,
                       size_t n);

/* Columns [c0, c1) of C owned by this OpenMP thread (deterministic reductions: a thread
 * owns a channel range and walks rows in order). */
void DT_K(thread_range)(int C, int *c0, int *c1);

#endif
