/* Tensor parallelism inside a family's layer (family_impl.h; ARCHITECTURE decision 62):
 * Megatron's column- and row-parallel linear layers over the shards this process holds, and
 * the TP group's sums. A process holds one shard (a rank of a TP group) or all of them (the
 * blocks test mode); the partial sums are added shard by shard in shard order and then over
 * the group in rank order, so both add the same numbers in the same order. */
#include "model/family_impl.h"
#include "ops/ops.h"


/* Elements of one shard of tensor id as stored. */
static size_t shard_len(const dt_model *m, int id) { return dt_tensor_shard_len(&dt_model_weights(m)->tensors[id]); }

void dt_fam_mm_forward_sh(dt_model *m, float *out, dt_mmin x, int id, int l, int j, const float *bias, int N,
                          int C, int OC) {
    if (dt_tp_size(&m->opts) <= 1) {
        dt_fam_mm_forward(m, out, x, id, l, bias, N, C, OC);
        return;
    }
    if (m->lora) { /* the frozen base's shard, then its adapters' (lora.h) */
        dt_lora_base_forward_sh(m, out, OC, x, id, l, j, bias, N, C, OC);
        dt_lora_mm_forward_sh(m, out, dt_lowp(m) ? NULL : x.f, dt_lowp(m) ? x.h : NULL, id, l, j, N, C, OC);
        return;
    }
    dt_params *w = dt_model_weights(m);
    size_t off = (size_t)j * shard_len(m, id);
    if (!dt_lowp(m))
        dt_matmul_forward(out, x.f, dt_params_unit_tensor(w, w->unit_params, id, dt_fam_layer(m, l)) + off, bias, N, C, OC);
    else
        dt_matmul_forward_lp(m->opts.compute, out, x.h, dt_model_lp_tensor(m, id, l) + off, bias, N, C, OC);
}

/* Shard j's backward; c (zb-h1, m->wdefer): dout's deferred copy (dt_wdefer_dout), its dW and
 * dbias recorded for W and dinp formed alone (the whole backward's GEMM); NULL: all now. */
static void sh_backward(dt_model *m, float *dinp, int id, int l, int j, float *dbias, const float *dout, dt_mmin x,
                        int N, int C, int OC, const float *c) {
    if (dt_tp_size(&m->opts) <= 1) {
        dt_fam_mm_backward(m, dinp, id, l, dbias, dout, x, N, C, OC);
        return;
    }
    if (m->lora) { /* a frozen base: dinp only (no dW, no dbias), then the adapters */
        if (dinp) dt_lora_base_backward_sh(m, dinp, 0, id, l, j, dout, OC, N, C, OC);
        if (c) dt_lora_mm_backward_defer(m, dinp, dout, c, x, id, l, j, N, C, OC);
        else dt_lora_mm_backward_sh(m, dinp, dout, dt_lowp(m) ? NULL : x.f, dt_lowp(m) ? x.h : NULL, id, l, j, N, C, OC);
        return;
    }
    size_t off = (size_t)j * shard_len(m, id);
    if (c) {
        dt_wdefer_gemm(m, id, l, off, c, OC, 0, x, dbias, N, C, OC);
        if (!dinp) return;
        if (!dt_lowp(m)) {
            dt_matmul_backward_ld(dinp, 0, NULL, dout, OC, NULL,
                                  dt_params_unit_tensor(&m->ps, m->ps.unit_params, id, dt_fam_layer(m, l)) + off, N, C, OC);
        } else {
            dt_to_lowp(m->opts.compute, m->lp_scratch, dout, (size_t)N * OC);
            dt_matmul_backward_ld_lp(m->opts.compute, dinp, 0, NULL, m->lp_scratch, OC, NULL, dt_model_lp_tensor(m, id, l) + off,
                                     N, C, OC);
        }
        return;
    }
    float *dw = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, id, dt_fam_layer(m, l)) + off;
    if (!dt_lowp(m)) {
        dt_matmul_backward(dinp, dw, dbias, dout, x.f,
                           dinp ? dt_params_unit_tensor(&m->ps, m->ps.unit_params, id, dt_fam_layer(m, l)) + off : NULL, N, C, OC);
        return;
    }
    dt_matmul_backward_lp(m->opts.compute, dinp, dw, dbias, dout, m->lp_scratch, x.h,
                          dinp ? dt_model_lp_tensor(m, id, l) + off : NULL, N, C, OC);
}

/* zb-h1 under tensor parallelism: the copy of a split GEMM's dout (n floats: every shard's)
 * when its weight gradients wait for W, else NULL (one shard: dt_fam_mm_backward's own). */
static const float *defer_copy(dt_model *m, int id, int l, const float *dout, size_t n) {
    if (dt_tp_size(&m->opts) <= 1 || !dt_wdefer_on(m, id, l)) return NULL;
    return dt_wdefer_dout(m, dout, n);
}

void dt_fam_mm_backward_sh(dt_model *m, float *dinp, int id, int l, int j, float *dbias, const float *dout,
                           dt_mmin x, int N, int C, int OC) {
    sh_backward(m, dinp, id, l, j, dbias, dout, x, N, C, OC, defer_copy(m, id, l, dout, (size_t)N * OC));
}

void dt_tp_add(float *acc, const float *part, size_t n) {
    dt_residual_forward(acc, acc, part, (int)n); /* acc + part, elementwise */
}

void dt_tp_sum(dt_model *m, float *x, size_t n) {
    if (m->tp_ops.sum && m->tp_ops.sum(m->tp_ops.ud, x, n)) m->tp_failed = 1;
}

void dt_tp_max(dt_model *m, float *x, size_t n) {
    if (m->tp_ops.max && m->tp_ops.max(m->tp_ops.ud, x, n)) m->tp_failed = 1;
}

void dt_tp_col_forward(dt_model *m, float *out, dt_mmin x, int id, int l, const float *bias, int N, int C,
                       int OCl) {
    for (int j = 0; j < dt_tp_local(&m->opts); j++)
        dt_fam_mm_forward_sh(m, out + (size_t)j * N * OCl, x, id, l, j, bias ? bias + (size_t)j * OCl : NULL, N, C,
                             OCl);
}

void dt_tp_col_backward(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                        int N, int C, int OCl, float *scratch) {
    const int nb = dt_tp_local(&m->opts);
    const float *c = defer_copy(m, id, l, dout, (size_t)nb * N * OCl);
    for (int j = 0; j < nb; j++) {
        float *dst = dinp && j > 0 ? scratch : dinp;
        sh_backward(m, dst, id, l, j, dbias ? dbias + (size_t)j * OCl : NULL, dout + (size_t)j * N * OCl, x, N, C, OCl,
                    c ? c + (size_t)j * N * OCl : NULL);
        if (dinp && j > 0) dt_tp_add(dinp, scratch, (size_t)N * C);
    }
    if (dinp && dt_tp_size(&m->opts) > 1) dt_tp_sum(m, dinp, (size_t)N * C);
}

void dt_tp_row_forward(dt_model *m, float *out, dt_mmin x, int id, int l, const float *bias, int N, int Cl,
                       int OC, float *scratch) {
    if (dt_tp_size(&m->opts) <= 1) { /* the plain layer, bias fused */
        dt_fam_mm_forward(m, out, x, id, l, bias, N, Cl, OC);
        return;
    }
    const int nb = dt_tp_local(&m->opts);
    for (int j = 0; j < nb; j++) {
        float *dst = j > 0 ? scratch : out;
        dt_fam_mm_forward_sh(m, dst, dt_mmin_shard(x, j, (size_t)N * Cl), id, l, j, NULL, N, Cl, OC);
        if (j > 0) dt_tp_add(out, scratch, (size_t)N * OC);
    }
    dt_tp_sum(m, out, (size_t)N * OC);
    if (bias) /* replicated: added once, after the sum */
        for (int n = 0; n < N; n++) {
            float *o = out + (size_t)n * OC;
            for (int c = 0; c < OC; c++) o[c] += bias[c];
        }
}

void dt_tp_row_backward(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                        int N, int Cl, int OC) {
    const float *c = defer_copy(m, id, l, dout, (size_t)N * OC); /* one dout for every shard */
    for (int j = 0; j < dt_tp_local(&m->opts); j++)
        sh_backward(m, dinp ? dinp + (size_t)j * N * Cl : NULL, id, l, j, j == 0 ? dbias : NULL, dout,
                    dt_mmin_shard(x, j, (size_t)N * Cl), N, Cl, OC, c);
}

/* Adjacent column-parallel tensors read as one projection (llama's q|k|v, gate|up): without
 * tensor parallelism the one GEMM over their adjacent rows, as before; with it, each shard's
 * block of out (N, sum of the tensors' shard widths) is formed tensor by tensor into its
 * column block (each tensor's shard is its own block of the store). */
void dt_tp_cols_forward(dt_model *m, float *out, dt_mmin x, const int *ids, int n, int l, int N, int C, int W) {
    const dt_params *w = dt_model_weights(m);
    if (dt_tp_size(&m->opts) <= 1) {
        dt_fam_mm_forward(m, out, x, ids[0], l, NULL, N, C, W);
        return;
    }
    for (int j = 0; j < dt_tp_local(&m->opts); j++) {
        float *o = out + (size_t)j * N * W;
        for (int t = 0, col = 0; t < n; t++) {
            size_t len = dt_tensor_shard_len(&w->tensors[ids[t]]), off = (size_t)j * len;
            int rows = (int)(len / (size_t)C);
            if (m->lora) { /* the frozen base (an NF4 tensor has no rows in the store) */
                rows = (int)dt_lora_shard_rows(m, ids[t]);
                dt_lora_base_forward_sh(m, o + col, W, x, ids[t], l, j, NULL, N, C, rows);
            } else if (!dt_lowp(m))
                dt_matmul_forward_ld(o + col, W, x.f, dt_params_unit_tensor(w, w->unit_params, ids[t], dt_fam_layer(m, l)) + off, N, C,
                                     rows);
            else
                dt_matmul_forward_ld_lp(m->opts.compute, o + col, W, x.h, dt_model_lp_tensor(m, ids[t], l) + off, N, C,
                                        rows);
            col += rows;
        }
        if (m->lora) dt_lora_mm_forward_sh(m, o, dt_lowp(m) ? NULL : x.f, dt_lowp(m) ? x.h : NULL, ids[0], l, j, N, C, W);
    }
}

/* The shards' partial input gradient summed in shard order into dinp (N, C), no group sum. */
static void cols_backward_partial(dt_model *m, float *dinp, const int *ids, int n, int l, const float *dout, dt_mmin x,
                                  int N, int C, int W, float *scratch) {
    const dt_params *w = dt_model_weights(m);
    const int nb = dt_tp_local(&m->opts);
    const float *cp = defer_copy(m, ids[0], l, dout, (size_t)nb * N * W); /* zb-h1: the dWs at W */
    for (int j = 0; j < nb; j++) {
        float *dst = j > 0 ? scratch : dinp;
        const float *d = dout + (size_t)j * N * W;
        if (dt_lowp(m) && !m->lora) dt_to_lowp(m->opts.compute, m->lp_scratch, d, (size_t)N * W);
        for (int t = 0, col = 0; t < n; t++) {
            size_t len = dt_tensor_shard_len(&w->tensors[ids[t]]), off = (size_t)j * len;
            int rows = (int)(len / (size_t)C);
            if (m->lora) { /* the frozen base's dinp, then (below) the adapters' part */
                rows = (int)dt_lora_shard_rows(m, ids[t]);
                dt_lora_base_backward_sh(m, dst, t > 0, ids[t], l, j, d + col, W, N, C, rows);
                col += rows;
                continue;
            }
            float *dw = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, ids[t], dt_fam_layer(m, l)) + off;
            if (cp) {
                dt_wdefer_gemm(m, ids[t], l, off, cp + (size_t)j * N * W + col, W, col, x, NULL, N, C, rows);
                dw = NULL;
            }
            if (!dt_lowp(m))
                dt_matmul_backward_ld(dst, t > 0, dw, d + col, W, x.f,
                                      dt_params_unit_tensor(w, w->unit_params, ids[t], dt_fam_layer(m, l)) + off, N, C, rows);
            else
                dt_matmul_backward_ld_lp(m->opts.compute, dst, t > 0, dw, m->lp_scratch + col, W, x.h,
                                         dt_model_lp_tensor(m, ids[t], l) + off, N, C, rows);
            col += rows;
        }
        if (m->lora && cp) dt_lora_mm_backward_defer(m, dst, d, cp + (size_t)j * N * W, x, ids[0], l, j, N, C, W);
        else if (m->lora) dt_lora_mm_backward_sh(m, dst, d, dt_lowp(m) ? NULL : x.f, dt_lowp(m) ? x.h : NULL, ids[0], l, j, N, C, W);
        if (j > 0) dt_tp_add(dinp, scratch, (size_t)N * C);
    }
}

void dt_tp_cols_backward(dt_model *m, float *dinp, const int *ids, int n, int l, const float *dout, dt_mmin x,
                         int N, int C, int W, float *scratch) {
    if (dt_tp_size(&m->opts) <= 1) {
        dt_fam_mm_backward(m, dinp, ids[0], l, NULL, dout, x, N, C, W);
        return;
    }
    cols_backward_partial(m, dinp, ids, n, l, dout, x, N, C, W, scratch);
    dt_tp_sum(m, dinp, (size_t)N * C);
}

/* ---- sequence parallelism (family_impl.h). Each helper is the plain tensor-parallel call
 * when sequence parallelism is off, so a family's layer is one code path for both. */

void dt_sp_gather(dt_model *m, float *full, const float *loc, int N, int C) {
    const int k = dt_tp_size(&m->opts), nb = dt_tp_local(&m->opts);
    const size_t per = (size_t)N / (size_t)k * (size_t)C;
    float *mine = full + (size_t)dt_tp_first(&m->opts) * per;
    if (mine != loc) dt_copy(mine, loc, (size_t)nb * per * sizeof(float));
    if (nb < k && m->tp_ops.allgather && m->tp_ops.allgather(m->tp_ops.ud, full, per)) m->tp_failed = 1;
}

/* 16-bit rows gathered as pairs of values: the gather only moves bits. C is even: tp >= 2
 * divides the heads, and C is heads x head size. */
void dt_sp_gather16(dt_model *m, uint16_t *full, const uint16_t *loc, int N, int C) {
    DT_ASSERT(C % 2 == 0);
    dt_sp_gather(m, (float *)(void *)full, (const float *)(const void *)loc, N, C / 2);
}

dt_mmin dt_sp_col_input(dt_model *m, dt_mmin x, float *full, uint16_t *full16, int N, int C) {
    if (!m->opts.sp) return x;
    if (m->wdefer) { /* zb-h1: a GEMM deferred on these rows gathers them again at W (model.c) */
        m->wdefer->g_full = dt_lowp(m) ? (const void *)full16 : (const void *)full;
        m->wdefer->g_loc = dt_lowp(m) ? (const void *)x.h : (const void *)x.f;
    }
    if (dt_lowp(m)) {
        dt_sp_gather16(m, full16, x.h, N, C);
        return (dt_mmin){NULL, full16};
    }
    dt_sp_gather(m, full, x.f, N, C);
    return (dt_mmin){full, NULL};
}

void dt_sp_gather_norm(dt_model *m, float *full, uint16_t *full16, const float *loc, int N, int C) {
    if (!m->opts.sp) return;
    if (dt_lowp(m))
        dt_sp_gather16(m, full16, full16 + (size_t)dt_sp_row0(m, N) * C, N, C);
    else
        dt_sp_gather(m, full, loc, N, C);
}

const float *dt_sp_dout(dt_model *m, const float *loc, float *full, int N, int C) {
    if (!m->opts.sp) return loc;
    dt_sp_gather(m, full, loc, N, C);
    return full;
}

/* out_loc (held rows) from the partial sum in full: over the group in rank order (one rank
 * holding every shard: they are summed already, its rows are all). */
static void sp_scatter(dt_model *m, float *out_loc, const float *full, int N, int OC) {
    const int k = dt_tp_size(&m->opts), nb = dt_tp_local(&m->opts);
    const size_t per = (size_t)N / (size_t)k * (size_t)OC;
    if (nb == k) {
        if (out_loc != full) dt_copy(out_loc, full, (size_t)N * OC * sizeof(float));
        return;
    }
    if (m->tp_ops.reduce_scatter && m->tp_ops.reduce_scatter(m->tp_ops.ud, full, out_loc, per)) m->tp_failed = 1;
}

void dt_sp_row_forward(dt_model *m, float *out_loc, dt_mmin x, int id, int l, const float *bias, int N, int Cl, int OC,
                       float *full, float *scratch) {
    if (!m->opts.sp) {
        dt_tp_row_forward(m, out_loc, x, id, l, bias, N, Cl, OC, scratch);
        return;
    }
    const int nb = dt_tp_local(&m->opts);
    for (int j = 0; j < nb; j++) {
        float *dst = j > 0 ? scratch : full;
        dt_fam_mm_forward_sh(m, dst, dt_mmin_shard(x, j, (size_t)N * Cl), id, l, j, NULL, N, Cl, OC);
        if (j > 0) dt_tp_add(full, scratch, (size_t)N * OC);
    }
    sp_scatter(m, out_loc, full, N, OC);
    if (bias) /* replicated: added once, after the sum */
        for (int n = 0, R = dt_sp_rows(m, N); n < R; n++) {
            float *o = out_loc + (size_t)n * OC;
            for (int c = 0; c < OC; c++) o[c] += bias[c];
        }
}

void dt_sp_col_backward(dt_model *m, float *dinp_loc, int id, int l, float *dbias, const float *dout, dt_mmin x, int N,
                        int C, int OCl, float *full, float *scratch) {
    if (!m->opts.sp) {
        dt_tp_col_backward(m, dinp_loc, id, l, dbias, dout, x, N, C, OCl, scratch);
        return;
    }
    const int nb = dt_tp_local(&m->opts);
    const float *c = defer_copy(m, id, l, dout, (size_t)nb * N * OCl);
    for (int j = 0; j < nb; j++) {
        float *dst = j > 0 ? scratch : full;
        sh_backward(m, dst, id, l, j, dbias ? dbias + (size_t)j * OCl : NULL, dout + (size_t)j * N * OCl, x, N, C, OCl,
                    c ? c + (size_t)j * N * OCl : NULL);
        if (j > 0) dt_tp_add(full, scratch, (size_t)N * C);
    }
    sp_scatter(m, dinp_loc, full, N, C);
}

/* acc (n) = the parts of every shard of rows, summed in shard order and over the group; then
 * dst += acc. */
static void sp_param_sum(dt_model *m, float *dst, float *acc, size_t n) {
    dt_tp_sum(m, acc, n);
    for (size_t i = 0; i < n; i++) dst[i] += acc[i];
}

void dt_sp_layernorm_backward(dt_model *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                              const float *w, const float *mean, const float *rstd, int N, int C, float *tmp) {
    if (!m->opts.sp) {
        dt_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        return;
    }
    const int nb = dt_tp_local(&m->opts), Nl = N / dt_tp_size(&m->opts);
    float *acc = tmp, *part = tmp + 2 * (size_t)C;
    for (int j = 0; j < nb; j++) {
        const size_t r = (size_t)j * Nl;
        float *t = j == 0 ? acc : part;
        dt_fill(t, 0, 2 * (size_t)C * sizeof(float));
        dt_layernorm_backward(dinp + r * C, t, t + C, dout + r * C, inp + r * C, w, mean + r, rstd + r, Nl, C);
        if (j > 0) dt_tp_add(acc, part, 2 * (size_t)C);
    }
    dt_tp_sum(m, acc, 2 * (size_t)C);
    for (int c = 0; c < C; c++) dw[c] += acc[c], db[c] += acc[C + c];
}

void dt_sp_pos_forward(dt_model *m, float *out, const float *wpe, int N, int T, int C) {
    const int R = dt_sp_rows(m, N), r0 = dt_sp_row0(m, N);
    for (int i = 0; i < R; i++) {
        const float *p = wpe + (size_t)((r0 + i) % T) * C;
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] += p[c];
    }
}

void dt_sp_pos_backward(dt_model *m, float *dwpe, const float *dout, int N, int T, int C, float *tmp) {
    const int nb = dt_tp_local(&m->opts), Nl = N / dt_tp_size(&m->opts), r0 = dt_sp_row0(m, N);
    float *acc = tmp, *part = tmp + (size_t)T * C;
    for (int j = 0; j < nb; j++) {
        float *t = j == 0 ? acc : part;
        dt_fill(t, 0, (size_t)T * C * sizeof(float));
        for (int i = 0; i < Nl; i++) { /* rows ascending: each position sums its rows in order */
            const int row = j * Nl + i;
            const float *d = dout + (size_t)row * C;
            float *p = t + (size_t)((r0 + row) % T) * C;
            for (int c = 0; c < C; c++) p[c] += d[c];
        }
        if (j > 0) dt_tp_add(acc, part, (size_t)T * C);
    }
    sp_param_sum(m, dwpe, acc, (size_t)T * C);
}

void dt_sp_cols_backward(dt_model *m, float *dinp_loc, const int *ids, int n, int l, const float *dout, dt_mmin x,
                         int N, int C, int W, float *full, float *scratch) {
    if (!m->opts.sp) {
        dt_tp_cols_backward(m, dinp_loc, ids, n, l, dout, x, N, C, W, scratch);
        return;
    }
    cols_backward_partial(m, full, ids, n, l, dout, x, N, C, W, scratch);
    sp_scatter(m, dinp_loc, full, N, C);
}

void dt_sp_rmsnorm_backward(dt_model *m, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                            const float *rstd, int N, int C, float *tmp) {
    if (!m->opts.sp) {
        dt_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
        return;
    }
    const int nb = dt_tp_local(&m->opts), Nl = N / dt_tp_size(&m->opts);
    float *acc = tmp, *part = tmp + (size_t)C;
    for (int j = 0; j < nb; j++) {
        const size_t r = (size_t)j * Nl;
        float *t = j == 0 ? acc : part;
        dt_fill(t, 0, (size_t)C * sizeof(float));
        dt_rmsnorm_backward(dinp + r * C, t, dout + r * C, inp + r * C, w, rstd + r, Nl, C);
        if (j > 0) dt_tp_add(acc, part, (size_t)C);
    }
    sp_param_sum(m, dw, acc, (size_t)C);
}
