/* ops.h - CPU kernels of the transformer layer sets (GPT-2, LLaMA, ViT), each a
 * _forward/_backward pair.
 *
 * Argument order: outputs, saved activations, inputs, weights, sizes. Shapes are row-major.
 * Kernels are OpenMP-parallel, run on the ISA path chosen at start-up (ops/cpu/isa.h), and are
 * deterministic for a given path and thread count: no floating-point
 * reductions whose order depends on scheduling (no `omp reduction` on floats, no atomics).
 * Gradient conventions:
 *   - weight/bias gradients always accumulate (+=), so micro-steps add up;
 *   - dinp of layernorm accumulates (+=): its input is the residual stream, whose gradient is
 *     a single buffer summed in place by the model;
 *   - every other dinp is overwritten (=): in GPT-2 those inputs have exactly one consumer.
 * Naive double-precision references of every kernel are in ops_ref.h.
 */
#ifndef DT_OPS_H
#define DT_OPS_H

#include <stdint.h>

/* Token embedding over a chunk of the vocabulary: for every position n < N whose token lies
 * in [row0, row0 + rows), out (N,C) row n = wte[token - row0]; other rows are untouched.
 * wte holds the chunk's rows (rows, C). Called once per chunk it fills every row. */
void dt_encoder_forward(float *out, const int32_t *tokens, const float *wte, int row0, int rows,
                        int N, int C);
/* dwte (rows,C) += scatter of dout by token, for the tokens in [row0, row0 + rows); each
 * element sums its positions in ascending order. */
void dt_encoder_backward(float *dwte, int row0, int rows, const float *dout, const int32_t *tokens,
                         int N, int C);
/* Learned positions: out (B,T,C) += wpe[t]; wpe (maxT,C). */
void dt_pos_forward(float *out, const float *wpe, int B, int T, int C);
/* dwpe (maxT,C) += sum over b of dout[b,t], b ascending. */
void dt_pos_backward(float *dwpe, const float *dout, int B, int T, int C);

/* out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) saved. eps = 1e-5. */
void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C);
/* dinp (N,C) +=, dw (C) +=, db (C) +=. */
void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C);

/* out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC); bias may be NULL. oneDNN sgemm. */
void dt_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                       int C, int OC);
/* dinp (N,C) = dout @ w (overwritten; may be NULL to skip); dw (OC,C) += dout^T @ inp;
 * dbias (OC) += column sums of dout (may be NULL). */
void dt_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, int N, int C, int OC);

/* The same on a column block of a wider matrix (a vocabulary chunk of the lm_head): out rows
 * have stride ldo, out (N, OC of ldo) = inp (N,C) @ w (OC,C)^T. */
void dt_matmul_forward_ld(float *out, int ldo, const float *inp, const float *w, int N, int C,
                          int OC);
/* dout rows have stride ldd. dinp (N,C) = dout @ w, or += with `accumulate` (NULL: skipped);
 * dw (OC,C) += dout^T @ inp (NULL: skipped). */
void dt_matmul_backward_ld(float *dinp, int accumulate, float *dw, const float *dout, int ldd,
                           const float *inp, const float *w, int N, int C, int OC);

/* Measured fp32 GEMM rate (GFLOP/s, median of `reps` n x n x n runs; *best gets the best
 * run when non-NULL): the peak that MFU is reported against. */
double dt_matmul_peak_gflops(int n, int reps, double *best);

/* Multi-head self-attention with grouped-query heads, causal or bidirectional (causal = 0:
 * every position sees every other, as in ViT). qkv (B,T,(NH+2 NKV) hs) rows hold NH query
 * heads | NKV key heads | NKV value heads, hs floats each; query head h uses kv head
 * h / (NH/NKV) (NKV = NH: plain multi-head; NKV = 1: multi-query). out (B,T,NH hs) =
 * softmax(q k^T / sqrt(hs)) v, computed in tiles (flash-style) without storing a (T,T) score
 * matrix; lse (B,NH,T) = log-sum-exp of each score row, saved. */
void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH,
                          int NKV, int hs, int causal);
/* dqkv (B,T,(NH+2 NKV) hs) = gradient w.r.t. qkv (overwritten). Recomputes scores tile by
 * tile; dK and dV of a kv head sum its query heads in ascending order. */
void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int NH, int NKV, int hs,
                           int causal);

/* RMSNorm (LLaMA): out (N,C) = inp * rstd * w, rstd (N) = 1/sqrt(mean(inp^2) + eps), saved. */
void dt_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                        float eps);
/* dinp (N,C) += (it is the residual stream, as for layernorm), dw (C) +=. */
void dt_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                         const float *w, const float *rstd, int N, int C);

/* Rotary position embedding (Hugging Face's rotate-half convention), in place on the q and k
 * heads of a packed qkv buffer laid out as for attention: for each head x of position t,
 * x[i] <- x[i] cos(t f_i) - x[i + hs/2] sin(t f_i), x[i + hs/2] <- x[i + hs/2] cos + x[i] sin,
 * f_i = theta^(-2i/hs), i < hs/2. v heads are untouched. hs must be even. */
void dt_rope_forward(float *qkv, int B, int T, int NH, int NKV, int hs, float theta);
/* The backward: the inverse rotation of the q and k slices of dqkv, in place. */
void dt_rope_backward(float *dqkv, int B, int T, int NH, int NKV, int hs, float theta);

/* SwiGLU: inp (N,2F) rows hold gate | up; out (N,F) = silu(gate) * up. */
void dt_swiglu_forward(float *out, const float *inp, int N, int F);
/* dinp (N,2F) = d gate | d up (overwritten). */
void dt_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F);

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void dt_gelu_forward(float *out, const float *inp, int N);
/* dinp (N) = dout * gelu'(inp) (overwritten; may alias dout). */
void dt_gelu_backward(float *dinp, const float *inp, const float *dout, int N);

/* out = a + b, elementwise over N (out may alias a or b). Its backward is the identity: the
 * model accumulates the residual gradient in one buffer. */
void dt_residual_forward(float *out, const float *a, const float *b, int N);

/* Fused softmax + cross-entropy over the first V of Vp columns (the rest is vocabulary
 * padding, excluded). logits (N,Vp), targets (N) in [0,V).
 * losses (N) = logsumexp(row) - row[target]; lse (N) saved. */
void dt_crossentropy_forward(float *losses, float *lse, const float *logits,
                             const int32_t *targets, int N, int V, int Vp);
/* dlogits (N,Vp) = (softmax(row) - onehot(target)) * dloss, padded columns = 0.
 * dlogits may alias logits (in-place). */
void dt_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, float dloss, int N, int V, int Vp);

/* y[i] = exp(x[i] - shift) for i < n with the kernels' vectorised exp (max relative error
 * ~2e-7; exp(x < -87.3) = 0); returns the sum of y in a fixed order. y may alias x or be
 * NULL. */
float dt_exp_sum(float *y, const float *x, float shift, int n);

#endif
