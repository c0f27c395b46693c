/* The CPU backend's kernels (backend_cpu.c lists them): each call goes to the active ISA path's
 * table (isa.h). */
#include <math.h>

#include "core/status.h"
#include "ops/cpu/kernels.h"
#include "ops/ops.h"

void dt_cpu_encoder_forward(float *out, const int32_t *tokens, const float *wte, int row0, int rows,
                        int N, int C) {
    dt_cpu_kernels_get()->encoder_forward(out, tokens, wte, row0, rows, N, C);
}

void dt_cpu_encoder_backward(float *dwte, int row0, int rows, const float *dout, const int32_t *tokens,
                         int N, int C) {
    dt_cpu_kernels_get()->encoder_backward(dwte, row0, rows, dout, tokens, N, C);
}

void dt_cpu_pos_forward(float *out, const float *wpe, int B, int T, int C) {
    dt_cpu_kernels_get()->pos_forward(out, wpe, B, T, C);
}

void dt_cpu_pos_backward(float *dwpe, const float *dout, int B, int T, int C) {
    dt_cpu_kernels_get()->pos_backward(dwpe, dout, B, T, C);
}

void dt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C) {
    dt_cpu_kernels_get()->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}

void dt_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C) {
    dt_cpu_kernels_get()->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void dt_cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH,
                          int NKV, int hs, int causal, dt_dtype op) {
    DT_ASSERT(op == DT_F32 || op == DT_BF16 || op == DT_F16);
    dt_cpu_kernels_get()->attention_forward(out, lse, qkv, B, T, NH, NKV, hs, causal, (int)op);
}

void dt_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int NH, int NKV, int hs,
                           int causal, dt_dtype op) {
    DT_ASSERT(op == DT_F32 || op == DT_BF16 || op == DT_F16);
    dt_cpu_kernels_get()->attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hs,
                                             causal, (int)op);
}

void dt_cpu_attention_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *kv,
                                    int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op) {
    DT_ASSERT(op == DT_F32 || op == DT_BF16 || op == DT_F16);
    dt_cpu_kernels_get()->attention_block_forward(out, ldo, lse, ldl, q, ldq, kv, ldkv, Tq, Tk, NH, NKV, hs, causal, (int)op);
}

void dt_cpu_attention_block_backward(float *dq, int lddq, float *dkv, int lddkv, const float *dout, const float *out,
                                     int ldo, const float *lse, int ldl, const float *q, int ldq, const float *kv,
                                     int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op) {
    DT_ASSERT(op == DT_F32 || op == DT_BF16 || op == DT_F16);
    dt_cpu_kernels_get()->attention_block_backward(dq, lddq, dkv, lddkv, dout, out, ldo, lse, ldl, q, ldq, kv, ldkv, Tq, Tk,
                                                   NH, NKV, hs, causal, (int)op);
}

void dt_cpu_attention_merge(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb, int ldlb,
                            int T, int NH, int hs) {
    dt_cpu_kernels_get()->attention_merge(out, ldo, lse, ldl, ob, ldob, lb, ldlb, T, NH, hs);
}

void dt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                        float eps) {
    dt_cpu_kernels_get()->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
}

void dt_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                         const float *w, const float *rstd, int N, int C) {
    dt_cpu_kernels_get()->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
}

void dt_cpu_rope_forward(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale) {
    dt_cpu_kernels_get()->rope_forward(qkv, B, T, NH, NKV, hs, inv_freq, scale);
}

void dt_cpu_rope_forward_at(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq,
                            float scale) {
    dt_cpu_kernels_get()->rope_forward_at(qkv, B, T, pos0, NH, NKV, hs, inv_freq, scale);
}

void dt_cpu_rope_backward_at(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq,
                             float scale) {
    dt_cpu_kernels_get()->rope_backward_at(dqkv, B, T, pos0, NH, NKV, hs, inv_freq, scale);
}

void dt_cpu_rope_backward(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq,
                      float scale) {
    dt_cpu_kernels_get()->rope_backward(dqkv, B, T, NH, NKV, hs, inv_freq, scale);
}


void dt_cpu_swiglu_forward(float *out, const float *inp, int N, int F) {
    dt_cpu_kernels_get()->swiglu_forward(out, inp, N, F);
}

void dt_cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F) {
    dt_cpu_kernels_get()->swiglu_backward(dinp, inp, dout, N, F);
}

void dt_cpu_gelu_forward(float *out, const float *inp, int N) {
    dt_cpu_kernels_get()->gelu_forward(out, inp, N);
}

void dt_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
    dt_cpu_kernels_get()->gelu_backward(dinp, inp, dout, N);
}

void dt_cpu_residual_forward(float *out, const float *a, const float *b, int N) {
    dt_cpu_kernels_get()->residual_forward(out, a, b, N);
}

void dt_cpu_crossentropy_forward(float *losses, float *lse, const float *logits,
                             const int32_t *targets, int N, int V, int Vp) {
    dt_cpu_kernels_get()->crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
}

void dt_cpu_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, float dloss, int N, int V, int Vp) {
    dt_cpu_kernels_get()->crossentropy_backward(dlogits, logits, lse, targets, dloss, N, V, Vp);
}

float dt_cpu_exp_sum(float *y, const float *x, float shift, int n) {
    return dt_cpu_kernels_get()->exp_sum(y, x, shift, n);
}


void dt_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    dt_cpu_kernels_get()->f32_to_bf16(dst, src, n);
}

void dt_cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
    dt_cpu_kernels_get()->bf16_to_f32(dst, src, n);
}

void dt_cpu_f32_to_f16(uint16_t *dst, const float *src, size_t n) {
    dt_cpu_kernels_get()->f32_to_f16(dst, src, n);
}

void dt_cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n) {
    dt_cpu_kernels_get()->f16_to_f32(dst, src, n);
}

size_t dt_cpu_count_nonfinite_f32(const float *x, size_t n) {
    return dt_cpu_kernels_get()->count_nonfinite(x, n);
}


_Thread_local int dt_cpu_serial;

void dt_cpu_ops_serial_thread(void) { dt_cpu_serial = 1; }
