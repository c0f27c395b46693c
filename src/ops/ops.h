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

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/status.h"

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
 * matrix; lse (B,NH,T) = log-sum-exp of each score row, saved.
 * op: the operand type of the products (mixed precision). DT_F32: fp32. DT_BF16 / DT_F16: every
 * product takes operands rounded to that type (nearest even) with fp32 sums, as a 16-bit
 * flash kernel multiplies: q, k, v, and the unnormalised probabilities exp(s - running max)
 * before P V; the softmax statistics, the scaling and the output stay fp32. */
void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH,
                          int NKV, int hs, int causal, dt_dtype op);
/* dqkv (B,T,(NH+2 NKV) hs) = gradient w.r.t. qkv (overwritten). Recomputes scores tile by
 * tile; dK and dV of a kv head sum its query heads in ascending order. op as above: q, k, v
 * and dO rounded, P = exp(s - lse) rounded for dV += P^T dO, dS (formed in fp32 from the
 * unrounded P) rounded for dK and dQ; D = rowsum(dO O) from the rounded dO. */
void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int NH, int NKV, int hs,
                           int causal, dt_dtype op);

/* Context parallelism's ring attention (decision 83), one sequence at a time: the Tq query
 * rows q (stride ldq floats; query head h at q + h hs) against a block of Tk key/value rows kv
 * (stride ldkv; key head g at kv + g hs, value head g at kv + (NKV + g) hs), which may be
 * another rank's. causal = 1: a block on the diagonal (Tq == Tk, row i sees keys 0..i); 0: every
 * key of the block. out (stride ldo, head h at out + h hs) = the block's softmax(q k^T /
 * sqrt(hs)) v, lse (head h's row i at lse[h ldl + i]) its log-sum-exp; op as for
 * dt_attention_forward (the same tiles and roundings). */
void dt_attention_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *kv,
                                int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op);
/* The block's share of the gradient, given the rows' merged (final) out and lse: dq (stride
 * lddq, laid out as q) += and dkv (stride lddkv, laid out as kv) +=; dout has out's stride ldo.
 * P = exp(S - lse) and D = rowsum(dO O) as dt_attention_backward, so the blocks' shares add up
 * to the whole attention's gradient. */
void dt_attention_block_backward(float *dq, int lddq, float *dkv, int lddkv, const float *dout, const float *out, int ldo,
                                 const float *lse, int ldl, const float *q, int ldq, const float *kv, int ldkv, int Tq,
                                 int Tk, int NH, int NKV, int hs, int causal, dt_dtype op);
/* Merges a block's (ob, lb) into the running (out, lse) of T rows and NH heads (strides as
 * above): lse' = log(e^lse + e^lb), out' = out e^(lse - lse') + ob e^(lb - lse'); a row whose
 * lb is -inf is left alone, one whose lse is -inf takes the block's. */
void dt_attention_merge(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb, int ldlb,
                        int T, int NH, int hs);

/* RMSNorm (LLaMA): out (N,C) = inp * rstd * w, rstd (N) = 1/sqrt(mean(inp^2) + eps), saved. */
void dt_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                        float eps);
/* dinp (N,C) += (it is the residual stream, as for layernorm), dw (C) +=. */
void dt_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                         const float *w, const float *rstd, int N, int C);

/* Rotary position embedding (Hugging Face's rotate-half convention), in place on the q and k
 * heads of a packed qkv buffer laid out as for attention: for each head x of position t,
 * x[i] <- x[i] c - x[i + hs/2] s, x[i + hs/2] <- x[i + hs/2] c + x[i] s with
 * c = scale cos(t f_i), s = scale sin(t f_i), i < hs/2, the frequencies f = inv_freq (hs/2
 * floats: dt_rope_inv_freq's theta^(-2i/hs), or a scaled rule's, model/rope.h) and scale 1
 * but for YaRN's attention factor. v heads are untouched. hs must be even. */
void dt_rope_forward(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq,
                     float scale);
/* The backward: the transposed rotation of the q and k slices of dqkv, in place. */
void dt_rope_backward(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq,
                      float scale);
/* As dt_rope_forward / dt_rope_backward for positions pos0 .. pos0 + T - 1 of each of the B
 * sequences (context parallelism: a chunk of the sequence; the angles fl(t f_i) are those of
 * position t in the whole sequence, the same bits). */
void dt_rope_forward_at(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
void dt_rope_backward_at(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
/* inv[0..hs/2) = plain RoPE's frequencies as Hugging Face's LlamaRotaryEmbedding computes them
 * in float32: fl(1 / fl(theta ^ fl(2i / hs))), the power evaluated in double. */
void dt_rope_inv_freq(float *inv, int hs, float theta);

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
 * padding, excluded). logits (N,Vp), targets (N) in [0,V), or negative: a row that is not
 * counted (loss mask), whose loss is 0 and whose dlogits row is 0.
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

/* ---------------------------------------------------------------- low precision
 * Mixed precision keeps fp32 master weights and gradients and feeds the GEMMs 16-bit copies:
 *
 *   dt_to_lowp(DT_BF16, w_lp, w, OC * C);   dt_to_lowp(DT_BF16, x_lp, x, N * C);
 *   dt_matmul_forward_lp(DT_BF16, out, x_lp, w_lp, bias, N, C, OC);
 *
 * Conversions give the same bits on every ISA path. */
/* dt_dtype (core/dtype.h): DT_F32, DT_BF16 and DT_F16 here. */

/* dst (n) = src rounded to bfloat16, to nearest with ties to even (f32 subnormals too: no
 * flushing); NaN gives a quiet NaN of the same sign, Inf stays Inf. */
void dt_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
/* dst (n) = src widened to fp32, exactly (NaN payloads carried bit for bit). */
void dt_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
/* dst (n) = src rounded to IEEE binary16, to nearest with ties to even, subnormals rounded
 * correctly; |x| >= 65520 gives Inf; NaN gives a quiet NaN (sign and top payload bits). */
void dt_f32_to_f16(uint16_t *dst, const float *src, size_t n);
/* dst (n) = src widened to fp32, exactly (NaN payloads carried bit for bit). */
void dt_f16_to_f32(float *dst, const uint16_t *src, size_t n);
/* Number of Inf and NaN among x (n) (tests and diagnostics; the trainer detects an fp16
 * overflow from the global gradient norm, which needs no extra pass). */
size_t dt_count_nonfinite_f32(const float *x, size_t n);
/* Marks the calling thread (the communication thread, which runs beside the compute
 * thread's OpenMP team): its conversions run on it alone instead of opening a second team
 * that would oversubscribe the cores. The bits are the same either way. */
void dt_ops_serial_thread(void);
/* The conversion of a 16-bit dtype (DT_BF16 or DT_F16; DT_F32 is a programming error). */
void dt_to_lowp(dt_dtype dt, uint16_t *dst, const float *src, size_t n);
void dt_from_lowp(dt_dtype dt, float *dst, const uint16_t *src, size_t n);

/* The linear layers with 16-bit operands (dt DT_BF16 or DT_F16) and fp32 results. Products
 * of two bf16 or two fp16 numbers are exact in fp32, so these differ from an exact result of
 * the rounded operands only by the fp32 accumulation. Three engines, chosen per call:
 *   - native: oneDNN's matmul on 16-bit dot-product instructions, when dt_lowp_gemm_native;
 *   - fallback: operands widened to fp32 scratch, then the fp32 sgemm (CPUs without such
 *     instructions, fp16 without avx512_fp16, and any forced lower path: DTRAIN_ISA=avx2);
 *   - DTRAIN_MATMUL=ref: widened, then the fp32 reference loops (the same bits on every CPU).
 * Deterministic for a given engine and thread count.
 *
 * out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC, fp32; may be NULL). */
void dt_matmul_forward_lp(dt_dtype dt, float *out, const uint16_t *inp, const uint16_t *w,
                          const float *bias, int N, int C, int OC);
/* dout (N,OC) fp32 is narrowed once into the caller's scratch dout_lp (N*OC), then
 * dinp (N,C) = dout_lp @ w (overwritten; NULL: skipped); dw (OC,C) += dout_lp^T @ inp
 * (fp32 accumulation; NULL: skipped); dbias (OC) += column sums of the fp32 dout (NULL:
 * skipped). */
void dt_matmul_backward_lp(dt_dtype dt, float *dinp, float *dw, float *dbias, const float *dout,
                           uint16_t *dout_lp, const uint16_t *inp, const uint16_t *w, int N,
                           int C, int OC);
/* Column blocks, as dt_matmul_forward_ld: out (N, OC of ldo) = inp (N,C) @ w (OC,C)^T. */
void dt_matmul_forward_ld_lp(dt_dtype dt, float *out, int ldo, const uint16_t *inp,
                             const uint16_t *w, int N, int C, int OC);
/* As dt_matmul_backward_ld with dout already narrowed: dout_lp rows have stride ldd.
 * dinp (N,C) = dout_lp @ w, or += with `accumulate` (NULL: skipped); dw (OC,C) +=
 * dout_lp^T @ inp (NULL: skipped). */
void dt_matmul_backward_ld_lp(dt_dtype dt, float *dinp, int accumulate, float *dw,
                              const uint16_t *dout_lp, int ldd, const uint16_t *inp,
                              const uint16_t *w, int N, int C, int OC);
/* 1 when dt's GEMMs run on native 16-bit instructions here (0: the fp32 fallback, so no
 * speed-up over fp32; the run banner then says the speed-up is not available on this CPU). Always 0
 * under DTRAIN_MATMUL=ref and on a forced lower path. */
int dt_lowp_gemm_native(dt_dtype dt);
/* The measured rate of dt's GEMM (native or fallback, never the reference loops), as
 * dt_matmul_peak_gflops: median GFLOP/s of `reps` n x n x n runs, *best the best run. */
double dt_matmul_peak_gflops_lp(dt_dtype dt, int n, int reps, double *best);
/* Frees the cached oneDNN primitives (tests, leak checkers); later calls recreate them.
 * Not concurrently with a low-precision matmul. */
void dt_matmul_lowp_cache_clear(void);

/* ---------------------------------------------------------------- NF4 (QLoRA's frozen base)
 * 4-bit NormalFloat weights (Dettmers et al. 2023): a tensor of n fp32 values, read flat in
 * row-major order, is cut into blocks of 64; each element stores the 4-bit index of the code
 * value (dt_nf4_codebook) nearest to w / absmax(block), two to a byte, element 2i in the
 * HIGH nibble of byte i and 2i+1 in the low one (bitsandbytes' order; a final odd element
 * leaves the low nibble 0). The block absmaxes are quantized again ("double quantization"):
 * minus their mean (one fp32 `offset` per tensor), as int8 with one fp32 step per group of
 * 256 blocks: q = round((absmax - offset) / step), step = max |absmax - offset| / 127 over the
 * group. A block's scale is then fmaf(q, step, offset) and element i dequantizes to
 * code[index] * scale, both in fp32: the same bits on every ISA path.
 *
 *   dt_nf4 t; void *buf = malloc(dt_nf4_bytes(OC * C));
 *   dt_nf4_bind(&t, buf, OC * C);
 *   if (dt_nf4_quantize(ctx, "q_proj", &t, w, OC * C) != DT_OK) fail;
 *   dt_matmul_forward_nf4(out, x, &t, NULL, N, C, OC);            // out = x W^T
 *
 * Size: dt_nf4_bytes(n) = 4 + 4 ceil(nb / 256) + nb + ceil(n / 2), nb = ceil(n / 64): for n a
 * multiple of 16384, 4 + 8/64 + 32/(64 256) = 4.126953125 bits per parameter, plus 32 bits
 * per tensor. */
#define DT_NF4_BLOCK 64  /* elements per absmax block */
#define DT_NF4_GROUP 256 /* blocks per double-quantization group */

/* Views into one buffer of dt_nf4_bytes(n) (dt_nf4_bind); the caller owns the buffer. */
typedef struct dt_nf4 {
    size_t n;          /* elements */
    float *offset;     /* (1) mean of the block absmaxes */
    float *step;       /* (ngroups) int8 step of each group of 256 blocks */
    int8_t *qabsmax;   /* (nblocks) the block absmaxes, double-quantized */
    uint8_t *codes;    /* (ceil(n/2)) 4-bit code indices, high nibble first */
} dt_nf4;

/* The 16 code values, ascending: code[7] = 0, code[0] = -1, code[15] = 1. Derived (once, in
 * double) from the normal quantile function as the paper describes, rounded to fp32. */
const float *dt_nf4_codebook(void);
/* The derivation in double: 8 quantiles of N(0,1) at linspace(delta, 1/2, 9)[:-1] for the
 * positive half, 7 at linspace(delta, 1/2, 8)[:-1] (negated) for the negative half, and 0,
 * sorted and divided by the largest; delta = 0.9677083, bitsandbytes' value (which is
 * (1 - 1/(2 15) + 1 - 1/(2 16)) / 2 to 7 digits). */
void dt_nf4_codebook_derive(double code[16]);
/* Blocks, groups and bytes of an n-element NF4 tensor (the size formula above). */
size_t dt_nf4_blocks(size_t n);
size_t dt_nf4_groups(size_t n);
size_t dt_nf4_bytes(size_t n);
/* Lays the views of an n-element tensor out in buf (dt_nf4_bytes(n), 4-byte aligned):
 * offset, steps, qabsmax, codes. */
void dt_nf4_bind(dt_nf4 *t, void *buf, size_t n);
/* Quantizes w (n = t->n) into t: each element to the nearest code value of w / absmax, with
 * the block's exact fp32 absmax (ties between two code values go to the lower one; an
 * all-zero block gives index 7). Fails (DT_ERR_NUMERIC, naming `name`) on NaN or Inf in w.
 * Deterministic; OpenMP over groups. */
dt_status dt_nf4_quantize(dt_ctx *ctx, const char *name, dt_nf4 *t, const float *w, size_t n);
/* dst (n) = elements [i0, i0 + n) of t dequantized (fp32; any i0, n within t). The same bits
 * on every ISA path and thread count. */
void dt_nf4_dequantize(float *dst, const dt_nf4 *t, size_t i0, size_t n);
/* Half the largest gap between adjacent code values: the quantization error bound per
 * element is that times the block absmax (before double quantization). */
double dt_nf4_half_gap(void);

/* Linear layers with a frozen NF4 weight w (OC,C) (a Linear weight as the parameter store
 * holds it, quantized flat). The weight is dequantized on the fly in bounded panels (at
 * most DT_NF4_PANEL floats, or one K-long row or column when K is larger) into a buffer of
 * the calling thread, and the panels go to the existing GEMMs: a weight larger than one
 * panel is never held whole in fp32. Every output element is one GEMM's sum over the whole K.
 * out (N,OC) = inp (N,C) @ deq(w)^T + bias (OC; may be NULL). */
#define DT_NF4_PANEL ((size_t)1 << 20)
void dt_matmul_forward_nf4(float *out, const float *inp, const dt_nf4 *w, const float *bias,
                           int N, int C, int OC);
/* dinp (N,C) = dout (N,OC) @ deq(w), or += with `accumulate` (the LoRA branch adds its
 * part). No weight gradient: the base is frozen. */
void dt_matmul_backward_nf4(float *dinp, int accumulate, const float *dout, const dt_nf4 *w,
                            int N, int C, int OC);
/* The same with 16-bit operands (dt DT_BF16 or DT_F16, as dt_matmul_forward_lp): each
 * panel is dequantized, then rounded to dt, so the GEMM multiplies the rounded weight;
 * inp and dout_lp are 16-bit, out and dinp fp32. */
void dt_matmul_forward_nf4_lp(dt_dtype dt, float *out, const uint16_t *inp, const dt_nf4 *w,
                              const float *bias, int N, int C, int OC);
void dt_matmul_backward_nf4_lp(dt_dtype dt, float *dinp, int accumulate,
                               const uint16_t *dout_lp, const dt_nf4 *w, int N, int C, int OC);
/* Bytes of the calling thread's NF4 panel buffers (grow-only, kept between calls, outside
 * the allocator like oneDNN's scratchpads): at most DT_NF4_PANEL floats plus their 16-bit
 * copy unless a K-long row or column is larger. */
size_t dt_nf4_panel_bytes(void);

/* ---- bulk memory of the active backend (backend.h): tensor copies and fills go through
 * these, never memcpy/memset, in model/, parallel/, optim/ (tests/check_backend_use.sh holds
 * that for the folders it names, with tests/memcpy_allowlist.txt's non-tensor uses). */
/* dst = src, `bytes` bytes (the ranges may overlap). */
void dt_copy(void *dst, const void *src, size_t bytes);
/* Every byte of dst = byte. */
void dt_fill(void *dst, int byte, size_t bytes);
/* Waits for the operations issued so far (the CPU backend: returns at once). */
void dt_sync(void);

/* ---- parallel/ and optim/ operations (elementwise over flat float ranges of the
 * parameter, gradient and optimizer-state vectors). */
/* Scalars of one AdamW step, computed once by the caller (optim/adamw.c): the betas, eps,
 * the weight-decay shrink (1 - lr wd, or 1), lr / (1 - b1^t), sqrt(1 - b2^t), and the
 * gradient scale (clipping and loss scale). */
typedef struct dt_adamw_step {
    float b1, b2, eps, shrink, step_size, bc2_sqrt, gscale;
} dt_adamw_step;
/* One AdamW step (optim.h dt_adamw_update's rule) over n elements of params, grads, m, v:
 * g = grads * gscale; m = b1 m + (1-b1) g; v = b2 v + ((1-b2) g) g;
 * params = params shrink - step_size m / (sqrt(v) / bc2_sqrt + eps), IEEE operations without
 * FMA. Elementwise: the same bits on every ISA path and thread count. */
void dt_adamw_chunked(float *params, const float *grads, float *m, float *v, size_t n,
                      const dt_adamw_step *s);
/* AdamW by age (optim.h dt_adamw_update_aged's rule) over n elements, with s's scalars:
 * g = grads * gscale; g == 0: params *= shrink, age += 1; otherwise a = age, d1 = b1^a,
 * d2 = b2^a (powf), m = d1 m + (1-d1) (g/a), v = d2 v + (1-d2) (g g / a),
 * params = params shrink - a step_size m / (sqrt(v) / bc2_sqrt + eps), age = 1.
 * Elementwise: the same bits whatever the thread count. */
void dt_adamw_aged(float *params, const float *grads, float *m, float *v, float *age, size_t n,
                   const dt_adamw_step *s);
/* Sum of squares of x (n) in double: chunks of 65536 floats, each summed in 8 double lanes
 * (element i in lane i % 8) added in a fixed tree, then the chunks' sums added in order.
 * The same bits on every ISA path and thread count (optim.h dt_sumsq). */
double dt_sumsq_chunked(const float *x, size_t n);
/* a (n) += x (n), elementwise. */
void dt_add_f32(float *a, const float *x, size_t n);
/* x (n) *= factor, elementwise. */
void dt_scale_f32(float *x, float factor, size_t n);
/* ---- model/ operations (ARCHITECTURE decision 73): the loops the model families and LoRA
 * ran themselves, each with the arithmetic and order of sums the model had. */

/* Images to patch rows: pix (B, CH, S, S) pixel values, p | S, g = S / p; patches
 * (B g g, CH p p): patches[b, gy g + gx, (ch p + py) p + px] = pix[b, ch, gy p + py,
 * gx p + px] / 255. */
void dt_patchify(float *patches, const int32_t *pix, int B, int CH, int S, int p);
/* A class token and learned positions before T - 1 patch embeddings per sequence: rows
 * [r0, r0 + rows) of the (B T) token rows (row b T + t) into out (rows, C):
 * out[i] = (t == 0 ? cls : pe[b (T - 1) + t - 1]) + pos[t]; pe (B (T - 1), C), pos (T, C). */
void dt_cls_pos_forward(float *out, const float *cls, const float *pe, const float *pos, int r0, int rows, int T,
                        int C);
/* Its backward from dout (B T, C) (every row): dpos (T, C) += dout[b, t] and dcls (C) +=
 * dout[b, 0], b ascending (each element of dpos one sum, dcls after dpos for each b); dpe
 * (B (T - 1), C) = dout's rows t > 0 (overwritten). */
void dt_cls_pos_backward(float *dpos, float *dcls, float *dpe, const float *dout, int B, int T, int C);

/* Cross-entropy backward over a window of the vocabulary's columns, in place: dlogits (N,
 * row stride ld) holds on entry the logits of canonical columns [col0, col0 + nb Vl) as nb
 * blocks of Vl (tensor-parallel shards), lse (N) the rows' log-sum-exp over the whole
 * vocabulary (V real columns). Each row becomes (softmax - onehot(target)) dloss over the
 * real columns of each block (< V: exp by dt_exp_sum's kernel block by block, then times
 * dloss; the target's column, when held, then minus dloss), 0 on a block's padding; a row
 * whose target is < 0 (not counted) becomes 0 over all ld floats. */
void dt_crossentropy_backward_blocks(float *dlogits, const float *lse, const int32_t *targets, float dloss, int N,
                                     int ld, int nb, int Vl, long col0, int V);
/* Narrows N rows of ld floats to dt (DT_BF16 or DT_F16, dt_to_lowp's rounding) in place: row
 * r's ld 16-bit values start at its own first byte, (uint16_t *)(x + r ld). */
void dt_f32_to_lowp_rows_inplace(dt_dtype dt, float *x, int N, int ld);

/* Inverted dropout on the input x (N, C) of a low-rank adapter, the masks drawn on the fly
 * from the counter RNG (core/rng.h) so that a backward regenerates its forward's: row n is
 * position n % T of sequence seq0 + n / T, with key
 *   dt_rng_u64(seed, stream, dt_rng_u64(seq0 + n / T, n % T, salt)),
 * and its feature c (feature coff + c of the layer's input: a row-parallel shard holds a
 * block of the columns) is kept, times inv (1 / (1 - p)), when the high 32 bits of
 * dt_rng_u64(key, coff + c, 0) reach thresh (p 2^32), and 0 otherwise. on = 0: no dropout
 * (the other fields unused). */
typedef struct dt_dropout {
    int on, T, coff;
    float inv;
    uint64_t thresh, seed, stream, seq0, salt;
} dt_dropout;
/* The key of row n (on != 0). */
static inline uint64_t dt_dropout_row_key(const dt_dropout *d, int n) {
    return dt_rng_u64(d->seed, d->stream, dt_rng_u64(d->seq0 + (uint64_t)(n / d->T), (uint64_t)(n % d->T), d->salt));
}
/* Whether feature c of the row of key `key` is kept. */
static inline int dt_dropout_kept(const dt_dropout *d, uint64_t key, int c) {
    return (dt_rng_u64(key, (uint64_t)(d->coff + c), 0) >> 32) >= d->thresh;
}

/* A low-rank adapter's (out += s drop(x) A^T B^T) four products. x is fp32 in xf, or when
 * xh != NULL 16-bit values of dtype xdt (widened exactly); A (r, C), B (rows, r). Every
 * output element is one sum in ascending order of its index, whatever the threads.
 * u (N, r) = drop(x) A^T (each a sum over c ascending). */
void dt_lowrank_down_forward(float *u, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N,
                             int C, int r, const dt_dropout *d);
/* out (N rows of stride ldo, columns [0, rows)) += s (u B^T): the sum over k, then scaled. */
void dt_lowrank_up_forward(float *out, int ldo, const float *u, const float *B, float s, int N, int rows, int r);
/* From dout (N rows of stride ldd, columns [0, rows)): dB (rows, r) += s (dout^T u) (the sum
 * over n, then scaled; dB NULL: skipped, u unread), and du (N, r) = s (dout B) (overwritten;
 * the sum over j, then scaled). */
void dt_lowrank_up_backward(float *dB, float *du, const float *dout, int ldd, const float *u, const float *B, float s,
                            int N, int rows, int r);
/* dA (r, C) += du^T drop(x) (a sum over n; dA NULL: skipped), and dinp (N, C) += the masked,
 * scaled (du A) (the sum over k formed apart, then added; dinp NULL: skipped). */
void dt_lowrank_down_backward(float *dA, float *dinp, const float *du, const float *xf, const uint16_t *xh,
                              dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d);

/* Parameter initialisation from the counter RNG: dst[k] = std dt_rng_normal(seed, stream,
 * i0 + k) when i0 + k < drawn, else 0, for k < n (the same values whatever the threads). */
void dt_fill_normal(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t i0, uint64_t drawn, float std);
/* dst[k] = v for k < n. */
void dt_fill_f32(float *dst, float v, size_t n);
/* A LoRA adapter folded into its base (ckpt lora_merge): W (rows, C) += s B (rows, r) A (r, C),
 * each element's sum over k in double, in k order, added to W in double and rounded once. */
void dt_lowrank_merge(float *W, const float *A, const float *B, float s, int rows, int C, int r);

#endif
