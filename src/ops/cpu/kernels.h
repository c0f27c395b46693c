/* kernels.h - the table of per-ISA kernel bodies (internal to src/ops/cpu).
 *
 * src/ops/cpu/kern/ is compiled once per path; each compilation defines one table
 * dt_cpu_kernels_<path>. The CPU backend's operations (backend_cpu.c) call dt_cpu_kernels_get().
 * Argument conventions are those of ops.h.
 */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "ops/cpu/isa.h"
#include "ops/ops.h"

typedef struct dt_cpu_kernels {
    dt_isa isa;
    void (*encoder_forward)(float *out, const int32_t *tokens, const float *wte, int row0,
                            int rows, int N, int C);
    void (*encoder_backward)(float *dwte, int row0, int rows, const float *dout,
                             const int32_t *tokens, int N, int C);
    void (*pos_forward)(float *out, const float *wpe, int B, int T, int C);
    void (*pos_backward)(float *dwpe, const float *dout, int B, int T, int C);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
    /* dbias (OC) += column sums of dout (N,OC). */
    void (*bias_backward)(float *dbias, const float *dout, int N, int OC);
    /* op: the products' operand type (dt_dtype: DT_F32, or DT_BF16 / DT_F16 rounding) */
    void (*attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int NH,
                              int NKV, int hs, int causal, int op);
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int NH,
                               int NKV, int hs, int causal, int op);
    void (*attention_block_forward)(float *out, int ldo, float *lse, int ldl, const float *q, int ldq,
                                    const float *kv, int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal,
                                    int op);
    void (*attention_block_backward)(float *dq, int lddq, float *dkv, int lddkv, const float *dout,
                                     const float *out, int ldo, const float *lse, int ldl, const float *q, int ldq,
                                     const float *kv, int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal,
                                     int op);
    void (*attention_merge)(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb,
                            int ldlb, int T, int NH, int hs);
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N,
                            int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C);
    void (*rope_forward)(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale);
    void (*rope_backward)(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale);
    void (*rope_forward_at)(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
    void (*rope_backward_at)(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
    void (*swiglu_forward)(float *out, const float *inp, int N, int F);
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, int N, int F);
    void (*gelu_forward)(float *out, const float *inp, int N);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, int N);
    void (*residual_forward)(float *out, const float *a, const float *b, int N);
    void (*crossentropy_forward)(float *losses, float *lse, const float *logits,
                                 const int32_t *targets, int N, int V, int Vp);
    void (*crossentropy_backward)(float *dlogits, const float *logits, const float *lse,
                                  const int32_t *targets, float dloss, int N, int V, int Vp);
    /* y = exp(x - shift), returns the sum (the vectorised exp; y may be NULL). */
    float (*exp_sum)(float *y, const float *x, float shift, int n);
    /* One AdamW step over n elements (serial: the caller, optim_ops.c, parallelises). */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n,
                  const dt_adamw_step *s);
    /* Sum of squares of n floats in double, 8 lanes (element i in lane i % 8) added in a
     * fixed tree: the same bits on every path. */
    double (*sumsq)(const float *x, size_t n);
    /* fp32 <-> bf16 / IEEE fp16 (ops.h dt_f32_to_bf16 ...): the same bits on every path. */
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
    size_t (*count_nonfinite)(const float *x, size_t n);
    /* dst (n) = NF4 elements [i0, i0 + n): code[index] * fmaf(qabsmax[b], step[b / 256],
     * offset) for element i of block b = i / 64 (serial; the same bits on every path). */
    void (*nf4_dequant)(float *dst, const uint8_t *codes, const int8_t *qabsmax,
                        const float *step, float offset, const float *code, size_t i0,
                        size_t n);
} dt_cpu_kernels;

extern const dt_cpu_kernels dt_cpu_kernels_scalar;
#if defined(__x86_64__)
extern const dt_cpu_kernels dt_cpu_kernels_avx2;
extern const dt_cpu_kernels dt_cpu_kernels_avx512;
#elif defined(__aarch64__)
extern const dt_cpu_kernels dt_cpu_kernels_neon;
#endif

/* 1 on a thread marked by dt_ops_serial_thread (ops.h): its conversions open no OpenMP team. */
extern _Thread_local int dt_cpu_serial;

/* matmul.c: median (and best, when non-NULL) GFLOP/s of run(arg), an n x n x n GEMM, over
 * `reps` timed runs after a warm-up run (the fp32 and 16-bit peak measurements). */
double dt_gemm_rate(void (*run)(void *), void *arg, int n, int reps, double *best);

/* The active table (chosen by dt_isa_init / dt_isa_use, else the best path). */
const dt_cpu_kernels *dt_cpu_kernels_get(void);

/* The fp32 GEMM of matmul.c, C = op(A) op(B) + beta C (row-major, op 'N' or 'T'): oneDNN's
 * sgemm, or the fixed-order loops under DTRAIN_MATMUL=ref. Shared with matmul_lowp.c. */
void dt_sgemm(char ta, char tb, long M, long N, long K, const float *A, long lda,
              const float *B, long ldb, float beta, float *C, long ldc);

/* matmul_lowp.c's 16-bit GEMM (native oneDNN, the widened fallback, or the reference loops
 * under DTRAIN_MATMUL=ref): C (f32) = op(A) op(B) + beta C, beta 0 or 1 (nf4.c's panels). */
void dt_gemm_lowp(dt_dtype dt, char ta, char tb, long M, long N, long K, const uint16_t *A,
                  long lda, const uint16_t *B, long ldb, float beta, float *C, long ldc);

/* Inside src/ops/cpu/kern: names of this path's functions. */
#define DT_KPASTE2(a, b) a##_##b
#define DT_KPASTE(a, b) DT_KPASTE2(a, b)

/* The CPU backend's operations (backend_cpu.c's table; ops.h documents each under its dt_
 * name). */
void dt_cpu_encoder_forward(float *out, const int32_t *tokens, const float *wte, int row0, int rows, int N, int C);
void dt_cpu_encoder_backward(float *dwte, int row0, int rows, const float *dout, const int32_t *tokens, int N, int C);
void dt_cpu_pos_forward(float *out, const float *wpe, int B, int T, int C);
void dt_cpu_pos_backward(float *dwpe, const float *dout, int B, int T, int C);
void dt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N, int C);
void dt_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w, const float *mean, const float *rstd, int N, int C);
void dt_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC);
void dt_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N, int C, int OC);
void dt_cpu_matmul_forward_ld(float *out, int ldo, const float *inp, const float *w, int N, int C, int OC);
void dt_cpu_matmul_backward_ld(float *dinp, int accumulate, float *dw, const float *dout, int ldd, const float *inp, const float *w, int N, int C, int OC);
void dt_cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs, int causal, dt_dtype op);
void dt_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int B, int T, int NH, int NKV, int hs, int causal, dt_dtype op);
void dt_cpu_attention_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *kv, int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op);
void dt_cpu_attention_block_backward(float *dq, int lddq, float *dkv, int lddkv, const float *dout, const float *out, int ldo, const float *lse, int ldl, const float *q, int ldq, const float *kv, int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op);
void dt_cpu_attention_merge(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb, int ldlb, int T, int NH, int hs);
void dt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void dt_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd, int N, int C);
void dt_cpu_rope_forward(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale);
void dt_cpu_rope_backward(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale);
void dt_cpu_rope_forward_at(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
void dt_cpu_rope_backward_at(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
void dt_cpu_swiglu_forward(float *out, const float *inp, int N, int F);
void dt_cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F);
void dt_cpu_gelu_forward(float *out, const float *inp, int N);
void dt_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int N);
void dt_cpu_residual_forward(float *out, const float *a, const float *b, int N);
void dt_cpu_crossentropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets, int N, int V, int Vp);
void dt_cpu_crossentropy_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets, float dloss, int N, int V, int Vp);
float dt_cpu_exp_sum(float *y, const float *x, float shift, int n);
void dt_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void dt_cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void dt_cpu_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void dt_cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n);
size_t dt_cpu_count_nonfinite_f32(const float *x, size_t n);
void dt_cpu_matmul_forward_lp(dt_dtype dt, float *out, const uint16_t *inp, const uint16_t *w, const float *bias, int N, int C, int OC);
void dt_cpu_matmul_backward_lp(dt_dtype dt, float *dinp, float *dw, float *dbias, const float *dout, uint16_t *dout_lp, const uint16_t *inp, const uint16_t *w, int N, int C, int OC);
void dt_cpu_matmul_forward_ld_lp(dt_dtype dt, float *out, int ldo, const uint16_t *inp, const uint16_t *w, int N, int C, int OC);
void dt_cpu_matmul_backward_ld_lp(dt_dtype dt, float *dinp, int accumulate, float *dw, const uint16_t *dout_lp, int ldd, const uint16_t *inp, const uint16_t *w, int N, int C, int OC);
void dt_cpu_matmul_forward_nf4(float *out, const float *inp, const dt_nf4 *w, const float *bias, int N, int C, int OC);
void dt_cpu_matmul_backward_nf4(float *dinp, int accumulate, const float *dout, const dt_nf4 *w, int N, int C, int OC);
void dt_cpu_matmul_forward_nf4_lp(dt_dtype dt, float *out, const uint16_t *inp, const dt_nf4 *w, const float *bias, int N, int C, int OC);
void dt_cpu_matmul_backward_nf4_lp(dt_dtype dt, float *dinp, int accumulate, const uint16_t *dout_lp, const dt_nf4 *w, int N, int C, int OC);
dt_status dt_cpu_nf4_quantize(dt_ctx *ctx, const char *name, dt_nf4 *t, const float *w, size_t n);
void dt_cpu_nf4_dequantize(float *dst, const dt_nf4 *t, size_t i0, size_t n);
double dt_cpu_matmul_peak_gflops(int n, int reps, double *best);
double dt_cpu_matmul_peak_gflops_lp(dt_dtype dt, int n, int reps, double *best);
int dt_cpu_lowp_gemm_native(dt_dtype dt);
void dt_cpu_matmul_lowp_cache_clear(void);
size_t dt_cpu_nf4_panel_bytes(void);
void dt_cpu_ops_serial_thread(void);
/* parallel/ and optim/ operations (optim_ops.c) */
void dt_cpu_adamw_chunked(float *params, const float *grads, float *m, float *v, size_t n, const dt_adamw_step *s);
void dt_cpu_adamw_aged(float *params, const float *grads, float *m, float *v, float *age, size_t n, const dt_adamw_step *s);
double dt_cpu_sumsq_chunked(const float *x, size_t n);
void dt_cpu_add_f32(float *a, const float *x, size_t n);
void dt_cpu_scale_f32(float *x, float factor, size_t n);

/* model/ operations (model_ops.c, lowrank_ops.c) */
void dt_cpu_patchify(float *patches, const int32_t *pix, int B, int CH, int S, int p);
void dt_cpu_cls_pos_forward(float *out, const float *cls, const float *pe, const float *pos, int r0, int rows, int T, int C);
void dt_cpu_cls_pos_backward(float *dpos, float *dcls, float *dpe, const float *dout, int B, int T, int C);
void dt_cpu_crossentropy_backward_blocks(float *dlogits, const float *lse, const int32_t *targets, float dloss, int N, int ld, int nb, int Vl, long col0, int V);
void dt_cpu_f32_to_lowp_rows_inplace(dt_dtype dt, float *x, int N, int ld);
void dt_cpu_lowrank_down_forward(float *u, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d);
void dt_cpu_lowrank_up_forward(float *out, int ldo, const float *u, const float *B, float s, int N, int rows, int r);
void dt_cpu_lowrank_up_backward(float *dB, float *du, const float *dout, int ldd, const float *u, const float *B, float s, int N, int rows, int r);
void dt_cpu_lowrank_down_backward(float *dA, float *dinp, const float *du, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d);
void dt_cpu_fill_normal(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t i0, uint64_t drawn, float std);
void dt_cpu_fill_f32(float *dst, float v, size_t n);
void dt_cpu_lowrank_merge(float *W, const float *A, const float *B, float s, int rows, int C, int r);

#endif
