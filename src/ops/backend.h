/* backend.h - the compute backend seam (ARCHITECTURE decision 73): a table of every operation
 * a training step needs (ops.h), with the memory it runs on. The public functions of ops.h call
 * the active backend's entries, so model/, parallel/, optim/ and ckpt/ reach compute and
 * device memory only through it; a new backend (docs/BACKENDS.md) is one folder that fills
 * this table and registers it.
 *
 *   if (dt_backend_init(&ctx) != DT_OK) fail;     // DTRAIN_BACKEND, else "cpu"
 *   const dt_backend *be = dt_backend_active();   // be->name
 *   for (int i = 0; i < dt_backend_count(); i++) test(dt_backend_at(i));
 *
 * One backend is active per process (as one device per rank); switching it (tests) is done
 * between whole models, never while memory of the previous one is live. */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"
#include "ops/ops.h"

typedef struct dt_backend {
    const char *name;
    /* Memory: what dt_alloc allocates from when this backend is active (its owner name is
     * this backend's), and bulk copies and fills of tensor memory (byte counts). */
    const dt_mem_ops *mem;
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*fill)(void *dst, int byte, size_t bytes);
    /* Waits for the work issued so far (a synchronous backend: nothing to wait for). */
    void (*sync)(void);
    /* The operations, with ops.h's contracts (each documented there under its dt_ name). */
    void (*encoder_forward)(float *out, const int32_t *tokens, const float *wte, int row0, int rows, int N, int C);
    void (*encoder_backward)(float *dwte, int row0, int rows, const float *dout, const int32_t *tokens, int N, int C);
    void (*pos_forward)(float *out, const float *wpe, int B, int T, int C);
    void (*pos_backward)(float *dwpe, const float *dout, int B, int T, int C);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w, const float *mean, const float *rstd, int N, int C);
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC);
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N, int C, int OC);
    void (*matmul_forward_ld)(float *out, int ldo, const float *inp, const float *w, int N, int C, int OC);
    void (*matmul_backward_ld)(float *dinp, int accumulate, float *dw, const float *dout, int ldd, const float *inp, const float *w, int N, int C, int OC);
    void (*attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs, int causal, dt_dtype op);
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int B, int T, int NH, int NKV, int hs, int causal, dt_dtype op);
    void (*attention_block_forward)(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *kv, int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op);
    void (*attention_block_backward)(float *dq, int lddq, float *dkv, int lddkv, const float *dout, const float *out, int ldo, const float *lse, int ldl, const float *q, int ldq, const float *kv, int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op);
    void (*attention_merge)(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb, int ldlb, int T, int NH, int hs);
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd, int N, int C);
    void (*rope_forward)(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale);
    void (*rope_backward)(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale);
    void (*rope_forward_at)(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
    void (*rope_backward_at)(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale);
    void (*swiglu_forward)(float *out, const float *inp, int N, int F);
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, int N, int F);
    void (*gelu_forward)(float *out, const float *inp, int N);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, int N);
    void (*residual_forward)(float *out, const float *a, const float *b, int N);
    void (*crossentropy_forward)(float *losses, float *lse, const float *logits, const int32_t *targets, int N, int V, int Vp);
    void (*crossentropy_backward)(float *dlogits, const float *logits, const float *lse, const int32_t *targets, float dloss, int N, int V, int Vp);
    float (*exp_sum)(float *y, const float *x, float shift, int n);
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
    size_t (*count_nonfinite_f32)(const float *x, size_t n);
    void (*matmul_forward_lp)(dt_dtype dt, float *out, const uint16_t *inp, const uint16_t *w, const float *bias, int N, int C, int OC);
    void (*matmul_backward_lp)(dt_dtype dt, float *dinp, float *dw, float *dbias, const float *dout, uint16_t *dout_lp, const uint16_t *inp, const uint16_t *w, int N, int C, int OC);
    void (*matmul_forward_ld_lp)(dt_dtype dt, float *out, int ldo, const uint16_t *inp, const uint16_t *w, int N, int C, int OC);
    void (*matmul_backward_ld_lp)(dt_dtype dt, float *dinp, int accumulate, float *dw, const uint16_t *dout_lp, int ldd, const uint16_t *inp, const uint16_t *w, int N, int C, int OC);
    void (*matmul_forward_nf4)(float *out, const float *inp, const dt_nf4 *w, const float *bias, int N, int C, int OC);
    void (*matmul_backward_nf4)(float *dinp, int accumulate, const float *dout, const dt_nf4 *w, int N, int C, int OC);
    void (*matmul_forward_nf4_lp)(dt_dtype dt, float *out, const uint16_t *inp, const dt_nf4 *w, const float *bias, int N, int C, int OC);
    void (*matmul_backward_nf4_lp)(dt_dtype dt, float *dinp, int accumulate, const uint16_t *dout_lp, const dt_nf4 *w, int N, int C, int OC);
    dt_status (*nf4_quantize)(dt_ctx *ctx, const char *name, dt_nf4 *t, const float *w, size_t n);
    void (*nf4_dequantize)(float *dst, const dt_nf4 *t, size_t i0, size_t n);
    double (*matmul_peak_gflops)(int n, int reps, double *best);
    double (*matmul_peak_gflops_lp)(dt_dtype dt, int n, int reps, double *best);
    int (*lowp_gemm_native)(dt_dtype dt);
    void (*matmul_lowp_cache_clear)(void);
    size_t (*nf4_panel_bytes)(void);
    void (*ops_serial_thread)(void);
    /* Operations of the parallel and optimizer layers (ops.h: dt_adamw_chunked ...) follow. */
    /* parallel/ and optim/ operations */
    void (*adamw_chunked)(float *params, const float *grads, float *m, float *v, size_t n, const dt_adamw_step *s);
    void (*adamw_aged)(float *params, const float *grads, float *m, float *v, float *age, size_t n, const dt_adamw_step *s);
    double (*sumsq_chunked)(const float *x, size_t n);
    void (*add_f32)(float *a, const float *x, size_t n);
    void (*scale_f32)(float *x, float factor, size_t n);
    /* model/ operations */
    void (*patchify)(float *patches, const int32_t *pix, int B, int CH, int S, int p);
    void (*cls_pos_forward)(float *out, const float *cls, const float *pe, const float *pos, int r0, int rows, int T, int C);
    void (*cls_pos_backward)(float *dpos, float *dcls, float *dpe, const float *dout, int B, int T, int C);
    void (*crossentropy_backward_blocks)(float *dlogits, const float *lse, const int32_t *targets, float dloss, int N, int ld, int nb, int Vl, long col0, int V);
    void (*f32_to_lowp_rows_inplace)(dt_dtype dt, float *x, int N, int ld);
    void (*lowrank_down_forward)(float *u, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d);
    void (*lowrank_up_forward)(float *out, int ldo, const float *u, const float *B, float s, int N, int rows, int r);
    void (*lowrank_up_backward)(float *dB, float *du, const float *dout, int ldd, const float *u, const float *B, float s, int N, int rows, int r);
    void (*lowrank_down_backward)(float *dA, float *dinp, const float *du, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d);
    void (*fill_normal)(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t i0, uint64_t drawn, float std);
    void (*fill_f32)(float *dst, float v, size_t n);
    void (*lowrank_merge)(float *W, const float *A, const float *B, float s, int rows, int C, int r);
} dt_backend;

/* The active backend (never NULL; "cpu" until dt_backend_use / dt_backend_init). */
extern const dt_backend *dt_backend_cur;
static inline const dt_backend *dt_backend_active(void) { return dt_backend_cur; }

/* The registered backends: "cpu" first, then "ref" (the float64 reference), then any added. */
int dt_backend_count(void);
const dt_backend *dt_backend_at(int i);
/* By name; NULL when none is registered under it. */
const dt_backend *dt_backend_find(const char *name);
/* Adds a backend (a name not yet taken; at most 8): DT_ERR_CONFIG naming it otherwise. */
dt_status dt_backend_register(dt_ctx *ctx, const dt_backend *be);
/* Makes the backend named `name` active, and its memory what dt_alloc_init gives from now on;
 * an unknown name is refused in one line listing the registered ones. */
dt_status dt_backend_use(dt_ctx *ctx, const char *name);
/* dt_backend_use(DTRAIN_BACKEND) when that variable is set and not empty. */
dt_status dt_backend_init(dt_ctx *ctx);

/* The built-in backends. */
extern const dt_backend dt_backend_cpu;
/* The float64 reference (src/ops/ref/backend_ref.c): every operation widened to double and
 * rounded once at the end; serial and slow, the oracle of tests/test_backend_ops.c. */
extern const dt_backend dt_backend_ref;

#endif
