/* The backend registry and the public functions of ops.h: each is the active backend's entry
 * (backend.h); the helpers that are not operations (conversions by dtype, RoPE's inverse
 * frequencies) are plain host code here. */
#include "ops/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const dt_backend *dt_backend_cur = &dt_backend_cpu;

enum { MAX_BACKENDS = 8 };
static const dt_backend *g_registry[MAX_BACKENDS] = {&dt_backend_cpu, &dt_backend_ref};
static int g_count = 2;

int dt_backend_count(void) { return g_count; }

const dt_backend *dt_backend_at(int i) { return i >= 0 && i < g_count ? g_registry[i] : NULL; }

const dt_backend *dt_backend_find(const char *name) {
    for (int i = 0; i < g_count; i++)
        if (!strcmp(g_registry[i]->name, name)) return g_registry[i];
    return NULL;
}

dt_status dt_backend_register(dt_ctx *ctx, const dt_backend *be) {
    if (dt_backend_find(be->name)) return dt_fail(ctx, DT_ERR_CONFIG, "backend %s: already registered", be->name);
    if (g_count == MAX_BACKENDS)
        return dt_fail(ctx, DT_ERR_CONFIG, "backend %s: no room (at most %d backends)", be->name, MAX_BACKENDS);
    g_registry[g_count++] = be;
    return DT_OK;
}

dt_status dt_backend_use(dt_ctx *ctx, const char *name) {
    const dt_backend *be = dt_backend_find(name);
    if (!be) {
        char list[256] = "";
        for (int i = 0; i < g_count; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", g_registry[i]->name);
        return dt_fail(ctx, DT_ERR_CONFIG, "DTRAIN_BACKEND=%s: no such backend (registered: %s)", name, list);
    }
    dt_backend_cur = be;
    dt_alloc_set_default(be->mem);
    return DT_OK;
}

dt_status dt_backend_init(dt_ctx *ctx) {
    const char *env = getenv("DTRAIN_BACKEND");
    return env && env[0] ? dt_backend_use(ctx, env) : DT_OK;
}

void dt_copy(void *dst, const void *src, size_t bytes) { dt_backend_cur->copy(dst, src, bytes); }
void dt_fill(void *dst, int byte, size_t bytes) { dt_backend_cur->fill(dst, byte, bytes); }
void dt_sync(void) { dt_backend_cur->sync(); }

void dt_encoder_forward(float *out, const int32_t *tokens, const float *wte, int row0, int rows, int N, int C) { dt_backend_cur->encoder_forward(out, tokens, wte, row0, rows, N, C); }
void dt_encoder_backward(float *dwte, int row0, int rows, const float *dout, const int32_t *tokens, int N, int C) { dt_backend_cur->encoder_backward(dwte, row0, rows, dout, tokens, N, C); }
void dt_pos_forward(float *out, const float *wpe, int B, int T, int C) { dt_backend_cur->pos_forward(out, wpe, B, T, C); }
void dt_pos_backward(float *dwpe, const float *dout, int B, int T, int C) { dt_backend_cur->pos_backward(dwpe, dout, B, T, C); }
void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N, int C) { dt_backend_cur->layernorm_forward(out, mean, rstd, inp, w, b, N, C); }
void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w, const float *mean, const float *rstd, int N, int C) { dt_backend_cur->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); }
void dt_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) { dt_backend_cur->matmul_forward(out, inp, w, bias, N, C, OC); }
void dt_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N, int C, int OC) { dt_backend_cur->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC); }
void dt_matmul_forward_ld(float *out, int ldo, const float *inp, const float *w, int N, int C, int OC) { dt_backend_cur->matmul_forward_ld(out, ldo, inp, w, N, C, OC); }
void dt_matmul_backward_ld(float *dinp, int accumulate, float *dw, const float *dout, int ldd, const float *inp, const float *w, int N, int C, int OC) { dt_backend_cur->matmul_backward_ld(dinp, accumulate, dw, dout, ldd, inp, w, N, C, OC); }
void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs, int causal, dt_dtype op) { dt_backend_cur->attention_forward(out, lse, qkv, B, T, NH, NKV, hs, causal, op); }
void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int B, int T, int NH, int NKV, int hs, int causal, dt_dtype op) { dt_backend_cur->attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hs, causal, op); }
void dt_attention_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *kv, int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op) { dt_backend_cur->attention_block_forward(out, ldo, lse, ldl, q, ldq, kv, ldkv, Tq, Tk, NH, NKV, hs, causal, op); }
void dt_attention_block_backward(float *dq, int lddq, float *dkv, int lddkv, const float *dout, const float *out, int ldo, const float *lse, int ldl, const float *q, int ldq, const float *kv, int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, dt_dtype op) { dt_backend_cur->attention_block_backward(dq, lddq, dkv, lddkv, dout, out, ldo, lse, ldl, q, ldq, kv, ldkv, Tq, Tk, NH, NKV, hs, causal, op); }
void dt_attention_merge(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb, int ldlb, int T, int NH, int hs) { dt_backend_cur->attention_merge(out, ldo, lse, ldl, ob, ldob, lb, ldlb, T, NH, hs); }
void dt_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) { dt_backend_cur->rmsnorm_forward(out, rstd, inp, w, N, C, eps); }
void dt_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd, int N, int C) { dt_backend_cur->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); }
void dt_rope_forward(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale) { dt_backend_cur->rope_forward(qkv, B, T, NH, NKV, hs, inv_freq, scale); }
void dt_rope_backward(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq, float scale) { dt_backend_cur->rope_backward(dqkv, B, T, NH, NKV, hs, inv_freq, scale); }
void dt_rope_forward_at(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale) { dt_backend_cur->rope_forward_at(qkv, B, T, pos0, NH, NKV, hs, inv_freq, scale); }
void dt_rope_backward_at(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq, float scale) { dt_backend_cur->rope_backward_at(dqkv, B, T, pos0, NH, NKV, hs, inv_freq, scale); }
void dt_swiglu_forward(float *out, const float *inp, int N, int F) { dt_backend_cur->swiglu_forward(out, inp, N, F); }
void dt_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F) { dt_backend_cur->swiglu_backward(dinp, inp, dout, N, F); }
void dt_gelu_forward(float *out, const float *inp, int N) { dt_backend_cur->gelu_forward(out, inp, N); }
void dt_gelu_backward(float *dinp, const float *inp, const float *dout, int N) { dt_backend_cur->gelu_backward(dinp, inp, dout, N); }
void dt_residual_forward(float *out, const float *a, const float *b, int N) { dt_backend_cur->residual_forward(out, a, b, N); }
void dt_crossentropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets, int N, int V, int Vp) { dt_backend_cur->crossentropy_forward(losses, lse, logits, targets, N, V, Vp); }
void dt_crossentropy_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets, float dloss, int N, int V, int Vp) { dt_backend_cur->crossentropy_backward(dlogits, logits, lse, targets, dloss, N, V, Vp); }
float dt_exp_sum(float *y, const float *x, float shift, int n) { return dt_backend_cur->exp_sum(y, x, shift, n); }
void dt_f32_to_bf16(uint16_t *dst, const float *src, size_t n) { dt_backend_cur->f32_to_bf16(dst, src, n); }
void dt_bf16_to_f32(float *dst, const uint16_t *src, size_t n) { dt_backend_cur->bf16_to_f32(dst, src, n); }
void dt_f32_to_f16(uint16_t *dst, const float *src, size_t n) { dt_backend_cur->f32_to_f16(dst, src, n); }
void dt_f16_to_f32(float *dst, const uint16_t *src, size_t n) { dt_backend_cur->f16_to_f32(dst, src, n); }
size_t dt_count_nonfinite_f32(const float *x, size_t n) { return dt_backend_cur->count_nonfinite_f32(x, n); }
void dt_matmul_forward_lp(dt_dtype dt, float *out, const uint16_t *inp, const uint16_t *w, const float *bias, int N, int C, int OC) { dt_backend_cur->matmul_forward_lp(dt, out, inp, w, bias, N, C, OC); }
void dt_matmul_backward_lp(dt_dtype dt, float *dinp, float *dw, float *dbias, const float *dout, uint16_t *dout_lp, const uint16_t *inp, const uint16_t *w, int N, int C, int OC) { dt_backend_cur->matmul_backward_lp(dt, dinp, dw, dbias, dout, dout_lp, inp, w, N, C, OC); }
void dt_matmul_forward_ld_lp(dt_dtype dt, float *out, int ldo, const uint16_t *inp, const uint16_t *w, int N, int C, int OC) { dt_backend_cur->matmul_forward_ld_lp(dt, out, ldo, inp, w, N, C, OC); }
void dt_matmul_backward_ld_lp(dt_dtype dt, float *dinp, int accumulate, float *dw, const uint16_t *dout_lp, int ldd, const uint16_t *inp, const uint16_t *w, int N, int C, int OC) { dt_backend_cur->matmul_backward_ld_lp(dt, dinp, accumulate, dw, dout_lp, ldd, inp, w, N, C, OC); }
void dt_matmul_forward_nf4(float *out, const float *inp, const dt_nf4 *w, const float *bias, int N, int C, int OC) { dt_backend_cur->matmul_forward_nf4(out, inp, w, bias, N, C, OC); }
void dt_matmul_backward_nf4(float *dinp, int accumulate, const float *dout, const dt_nf4 *w, int N, int C, int OC) { dt_backend_cur->matmul_backward_nf4(dinp, accumulate, dout, w, N, C, OC); }
void dt_matmul_forward_nf4_lp(dt_dtype dt, float *out, const uint16_t *inp, const dt_nf4 *w, const float *bias, int N, int C, int OC) { dt_backend_cur->matmul_forward_nf4_lp(dt, out, inp, w, bias, N, C, OC); }
void dt_matmul_backward_nf4_lp(dt_dtype dt, float *dinp, int accumulate, const uint16_t *dout_lp, const dt_nf4 *w, int N, int C, int OC) { dt_backend_cur->matmul_backward_nf4_lp(dt, dinp, accumulate, dout_lp, w, N, C, OC); }
dt_status dt_nf4_quantize(dt_ctx *ctx, const char *name, dt_nf4 *t, const float *w, size_t n) { return dt_backend_cur->nf4_quantize(ctx, name, t, w, n); }
void dt_nf4_dequantize(float *dst, const dt_nf4 *t, size_t i0, size_t n) { dt_backend_cur->nf4_dequantize(dst, t, i0, n); }
double dt_matmul_peak_gflops(int n, int reps, double *best) { return dt_backend_cur->matmul_peak_gflops(n, reps, best); }
double dt_matmul_peak_gflops_lp(dt_dtype dt, int n, int reps, double *best) { return dt_backend_cur->matmul_peak_gflops_lp(dt, n, reps, best); }
int dt_lowp_gemm_native(dt_dtype dt) { return dt_backend_cur->lowp_gemm_native(dt); }
void dt_matmul_lowp_cache_clear(void) { dt_backend_cur->matmul_lowp_cache_clear(); }
size_t dt_nf4_panel_bytes(void) { return dt_backend_cur->nf4_panel_bytes(); }
void dt_ops_serial_thread(void) { dt_backend_cur->ops_serial_thread(); }
/* parallel/ and optim/ operations */
void dt_adamw_chunked(float *params, const float *grads, float *m, float *v, size_t n, const dt_adamw_step *s) { dt_backend_cur->adamw_chunked(params, grads, m, v, n, s); }
void dt_adamw_aged(float *params, const float *grads, float *m, float *v, float *age, size_t n, const dt_adamw_step *s) { dt_backend_cur->adamw_aged(params, grads, m, v, age, n, s); }
double dt_sumsq_chunked(const float *x, size_t n) { return dt_backend_cur->sumsq_chunked(x, n); }
void dt_add_f32(float *a, const float *x, size_t n) { dt_backend_cur->add_f32(a, x, n); }
void dt_scale_f32(float *x, float factor, size_t n) { dt_backend_cur->scale_f32(x, factor, n); }

/* Not a kernel of the paths: the same values on all of them (double pow, IEEE division). */
void dt_rope_inv_freq(float *inv, int hs, float theta) {
    for (int i = 0; i < hs / 2; i++) {
        const float e = (float)(2 * i) / (float)hs;
        inv[i] = 1.0f / (float)pow((double)theta, (double)e);
    }
}

void dt_to_lowp(dt_dtype dt, uint16_t *dst, const float *src, size_t n) {
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    if (dt == DT_BF16) dt_f32_to_bf16(dst, src, n);
    else dt_f32_to_f16(dst, src, n);
}

void dt_from_lowp(dt_dtype dt, float *dst, const uint16_t *src, size_t n) {
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    if (dt == DT_BF16) dt_bf16_to_f32(dst, src, n);
    else dt_f16_to_f32(dst, src, n);
}

/* model/ operations */
void dt_patchify(float *patches, const int32_t *pix, int B, int CH, int S, int p) { dt_backend_cur->patchify(patches, pix, B, CH, S, p); }
void dt_cls_pos_forward(float *out, const float *cls, const float *pe, const float *pos, int r0, int rows, int T, int C) { dt_backend_cur->cls_pos_forward(out, cls, pe, pos, r0, rows, T, C); }
void dt_cls_pos_backward(float *dpos, float *dcls, float *dpe, const float *dout, int B, int T, int C) { dt_backend_cur->cls_pos_backward(dpos, dcls, dpe, dout, B, T, C); }
void dt_crossentropy_backward_blocks(float *dlogits, const float *lse, const int32_t *targets, float dloss, int N, int ld, int nb, int Vl, long col0, int V) { dt_backend_cur->crossentropy_backward_blocks(dlogits, lse, targets, dloss, N, ld, nb, Vl, col0, V); }
void dt_f32_to_lowp_rows_inplace(dt_dtype dt, float *x, int N, int ld) { dt_backend_cur->f32_to_lowp_rows_inplace(dt, x, N, ld); }
void dt_lowrank_down_forward(float *u, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d) { dt_backend_cur->lowrank_down_forward(u, xf, xh, xdt, A, N, C, r, d); }
void dt_lowrank_up_forward(float *out, int ldo, const float *u, const float *B, float s, int N, int rows, int r) { dt_backend_cur->lowrank_up_forward(out, ldo, u, B, s, N, rows, r); }
void dt_lowrank_up_backward(float *dB, float *du, const float *dout, int ldd, const float *u, const float *B, float s, int N, int rows, int r) { dt_backend_cur->lowrank_up_backward(dB, du, dout, ldd, u, B, s, N, rows, r); }
void dt_lowrank_down_backward(float *dA, float *dinp, const float *du, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d) { dt_backend_cur->lowrank_down_backward(dA, dinp, du, xf, xh, xdt, A, N, C, r, d); }
void dt_fill_normal(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t i0, uint64_t drawn, float std) { dt_backend_cur->fill_normal(dst, n, seed, stream, i0, drawn, std); }
void dt_fill_f32(float *dst, float v, size_t n) { dt_backend_cur->fill_f32(dst, v, n); }
void dt_lowrank_merge(float *W, const float *A, const float *B, float s, int rows, int C, int r) { dt_backend_cur->lowrank_merge(W, A, B, s, rows, C, r); }
