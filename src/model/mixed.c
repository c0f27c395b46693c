/* The families' linear layers in either precision (family_impl.h, model.h): fp32 operands,
 * or 16-bit operands with fp32 results under mixed precision; under LoRA a frozen base
 * weight (fp32 or NF4) plus the adapters (model/lora.h). */
#include "model/family_impl.h"
#include "model/lora.h"
#include "ops/ops.h"


void dt_fam_narrow(dt_model *m, uint16_t *h, const float *f, size_t n) {
    if (dt_lowp(m)) dt_to_lowp(m->opts.compute, h, f, n);
}

/* QLoRA: the matmul over base tensors id, id + 1, ... (adjacent rows, each its own NF4
 * tensor), one GEMM each into a column block of out through the scratch. */
static void nf4_forward(dt_model *m, float *out, dt_mmin x, int id, int l, const float *bias, int N, int C,
                        int OC) {
    int col = 0;
    for (int t = id; col < OC; t++) {
        const dt_nf4 *q = dt_lora_nf4(m, t, l);
        DT_ASSERT(q != NULL);
        int rows = (int)(q->n / (size_t)C);
        float *dst = rows == OC ? out : m->lora_mm;
        if (dt_lowp(m))
            dt_matmul_forward_nf4_lp(m->opts.compute, dst, x.h, q, bias ? bias + col : NULL, N, C, rows);
        else
            dt_matmul_forward_nf4(dst, x.f, q, bias ? bias + col : NULL, N, C, rows);
        if (dst != out)
            for (int n = 0; n < N; n++)
                dt_copy(out + (size_t)n * OC + col, dst + (size_t)n * rows, (size_t)rows * sizeof(float));
        col += rows;
    }
}

static void nf4_backward(dt_model *m, float *dinp, int id, int l, const float *dout, int N, int C, int OC) {
    int col = 0;
    for (int t = id; col < OC; t++) {
        const dt_nf4 *q = dt_lora_nf4(m, t, l);
        int rows = (int)(q->n / (size_t)C);
        const float *g = dout;
        if (rows != OC) {
            for (int n = 0; n < N; n++)
                dt_copy(m->lora_mm + (size_t)n * rows, dout + (size_t)n * OC + col, (size_t)rows * sizeof(float));
            g = m->lora_mm;
        }
        if (dt_lowp(m)) {
            dt_to_lowp(m->opts.compute, m->lp_scratch, g, (size_t)N * rows);
            dt_matmul_backward_nf4_lp(m->opts.compute, dinp, col > 0, m->lp_scratch, q, N, C, rows);
        } else {
            dt_matmul_backward_nf4(dinp, col > 0, g, q, N, C, rows);
        }
        col += rows;
    }
}

void dt_fam_mm_forward(dt_model *m, float *out, dt_mmin x, int id, int l, const float *bias, int N, int C,
                       int OC) {
    dt_params *w = dt_model_weights(m);
    if (m->lora && dt_lora_nf4(m, id, l))
        nf4_forward(m, out, x, id, l, bias, N, C, OC);
    else if (!dt_lowp(m))
        dt_matmul_forward(out, x.f, dt_params_unit_tensor(w, w->unit_params, id, dt_fam_layer(m, l)), bias, N, C, OC);
    else
        dt_matmul_forward_lp(m->opts.compute, out, x.h, dt_model_lp_tensor(m, id, l), bias, N, C, OC);
    if (m->lora) dt_lora_mm_forward(m, out, dt_lowp(m) ? NULL : x.f, dt_lowp(m) ? x.h : NULL, id, l, N, C, OC);
}

/* LoRA: the frozen base's input gradient dinp (N,C) = dout W (fp32 or NF4; NULL: none). */
static void lora_base_dinp(dt_model *m, float *dinp, int id, int l, const float *dout, int N, int C, int OC) {
    dt_params *w = dt_model_weights(m);
    if (!dinp) {
    } else if (dt_lora_nf4(m, id, l)) {
        nf4_backward(m, dinp, id, l, dout, N, C, OC);
    } else if (!dt_lowp(m)) {
        dt_matmul_backward_ld(dinp, 0, NULL, dout, OC, NULL, dt_params_unit_tensor(w, w->unit_params, id, dt_fam_layer(m, l)), N,
                              C, OC);
    } else {
        dt_to_lowp(m->opts.compute, m->lp_scratch, dout, (size_t)N * OC);
        dt_matmul_backward_ld_lp(m->opts.compute, dinp, 0, NULL, m->lp_scratch, OC, NULL, dt_model_lp_tensor(m, id, l), N,
                                 C, OC);
    }
}

void dt_fam_mm_backward(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                        int N, int C, int OC) {
    if (m->lora) { /* a frozen base: dinp only (no dW, no dbias), then the adapters */
        /* zb-h1: the adapters' dA and dB wait for W (lora.h), with this dout's copy */
        const float *c = dt_wdefer_on(m, id, l) ? dt_wdefer_dout(m, dout, (size_t)N * OC) : NULL;
        lora_base_dinp(m, dinp, id, l, dout, N, C, OC);
        if (c) dt_lora_mm_backward_defer(m, dinp, dout, c, x, id, l, 0, N, C, OC);
        else dt_lora_mm_backward(m, dinp, dout, dt_lowp(m) ? NULL : x.f, dt_lowp(m) ? x.h : NULL, id, l, N, C, OC);
        return;
    }
    /* W is read only for dinp (the patch embedding has none: its unit is not gathered). */
    float *dw = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, id, dt_fam_layer(m, l));
    /* zb-h1's input-gradient pass: dinp now, dW and dbias later (model.h) */
    if (dt_wdefer_on(m, id, l)) {
        dt_fam_mm_backward_kept(m, dinp, id, l, dbias, dt_wdefer_dout(m, dout, (size_t)N * OC), x, N, C, OC);
        return;
    }
    if (!dt_lowp(m)) {
        dt_matmul_backward(dinp, dw, dbias, dout, x.f,
                           dinp ? dt_params_unit_tensor(&m->ps, m->ps.unit_params, id, dt_fam_layer(m, l)) : NULL, N, C, OC);
        return;
    }
    dt_matmul_backward_lp(m->opts.compute, dinp, dw, dbias, dout, m->lp_scratch, x.h,
                          dinp ? dt_model_lp_tensor(m, id, l) : NULL, N, C, OC);
}

void dt_fam_mm_backward_kept(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                             int N, int C, int OC) {
    if (m->lora) { /* the frozen base's dinp; the adapters' dA, dB recorded for W on the kept dout */
        lora_base_dinp(m, dinp, id, l, dout, N, C, OC);
        dt_lora_mm_backward_defer(m, dinp, dout, dout, x, id, l, 0, N, C, OC);
        return;
    }
    dt_wdefer_gemm(m, id, l, 0, dout, OC, 0, x, dbias, N, C, OC);
    if (!dinp) return;
    if (!dt_lowp(m)) {
        dt_matmul_backward_ld(dinp, 0, NULL, dout, OC, x.f,
                              dt_params_unit_tensor(&m->ps, m->ps.unit_params, id, dt_fam_layer(m, l)), N, C, OC);
    } else { /* dt_matmul_backward_lp's dinp: the same narrowing, the same GEMM */
        dt_to_lowp(m->opts.compute, m->lp_scratch, dout, (size_t)N * OC);
        dt_matmul_backward_ld_lp(m->opts.compute, dinp, 0, NULL, m->lp_scratch, OC, x.h, dt_model_lp_tensor(m, id, l), N, C,
                                 OC);
    }
}

/* ---- zb-h1's deferred weight GEMMs (family_impl.h; model.h dt_wdefer) */

int dt_wdefer_on(const dt_model *m, int id, int l) {
    return m->wdefer && (dt_model_weights(m)->tensors[id].group != DT_PG_LAYER || !dt_model_recomputes(&m->opts, l));
}

float *dt_wdefer_dout(dt_model *m, const float *dout, size_t n) {
    dt_wdefer *d = m->wdefer;
    /* the plan's next place (model.c dt_model_defer_plan): a dout of this size */
    DT_ASSERT(d->nd < d->cap_douts && d->place[d->nd].n == n);
    const dt_wdefer_place *pl = &d->place[d->nd++];
    float *dst = d->buf + pl->off;
    if (pl->layer >= 0) {
        dt_act_span sp[DT_DEFER_MAX];
        DT_ASSERT(m->fam->defer_spans(m, pl->layer, sp) > pl->span);
        dst = sp[pl->span].p + pl->off;
    }
    if (dout) dt_copy(dst, dout, n * sizeof(float));
    return dst;
}

dt_wdefer_item *dt_wdefer_gemm(dt_model *m, int id, int l, size_t woff, const float *dout, int ld, int col, dt_mmin x,
                               float *dbias, int N, int C, int OC) {
    dt_wdefer *d = m->wdefer;
    DT_ASSERT(d->n < d->cap_items);
    size_t off;
    dt_wdefer_item *it = &d->items[d->n++];
    const int L = dt_fam_layer(m, l);
    DT_ASSERT(d->nd > 0);
    *it = (dt_wdefer_item){id, L, dt_params_unit_of(&m->ps, id, L, &off), woff, dout, ld, col, d->nd - 1,
                           dt_lowp(m) ? NULL : x.f, dt_lowp(m) ? x.h : NULL, NULL, -1, 0, N, C, OC, -1, id, l, 0, 0, 0, 0};
    const void *xp = it->xh ? (const void *)it->xh : (const void *)it->x;
    if (d->g_full && xp == d->g_full) it->gsrc = d->g_loc; /* a gathered input: gathered again at W */
    for (int u = 0; dbias && u < m->ps.n_units; u++) /* the bias's unit and place in it */
        if (dbias >= m->ps.unit_grads[u] && dbias < m->ps.unit_grads[u] + m->ps.unit_len[u])
            it->bias_unit = u, it->bias_off = (size_t)(dbias - m->ps.unit_grads[u]);
    DT_ASSERT(!dbias || it->bias_unit >= 0);
    return it;
}

/* ---- LoRA under tensor parallelism (family_impl.h): the frozen base's shard j */

void dt_lora_base_forward_sh(dt_model *m, float *out, int ld, dt_mmin x, int id, int l, int j, const float *bias,
                             int N, int C, int rows) {
    const dt_nf4 *q = dt_lora_nf4_sh(m, id, l, j);
    if (q) { /* its own NF4 tensor, into a contiguous block when out is wider */
        float *dst = ld == rows ? out : m->lora_mm;
        if (dt_lowp(m))
            dt_matmul_forward_nf4_lp(m->opts.compute, dst, x.h, q, bias, N, C, rows);
        else
            dt_matmul_forward_nf4(dst, x.f, q, bias, N, C, rows);
        if (dst != out)
            for (int n = 0; n < N; n++) dt_copy(out + (size_t)n * ld, dst + (size_t)n * rows, (size_t)rows * sizeof(float));
        return;
    }
    const size_t off = (size_t)j * rows * (size_t)C; /* the shard's block of the stored tensor */
    DT_ASSERT(ld == rows || !bias);
    if (!dt_lowp(m)) {
        const float *w = dt_params_unit_tensor(&m->base, m->base.unit_params, id, dt_fam_layer(m, l)) + off;
        if (ld == rows) dt_matmul_forward(out, x.f, w, bias, N, C, rows);
        else dt_matmul_forward_ld(out, ld, x.f, w, N, C, rows);
    } else {
        const uint16_t *w = dt_model_lp_tensor(m, id, l) + off;
        if (ld == rows) dt_matmul_forward_lp(m->opts.compute, out, x.h, w, bias, N, C, rows);
        else dt_matmul_forward_ld_lp(m->opts.compute, out, ld, x.h, w, N, C, rows);
    }
}

void dt_lora_base_backward_sh(dt_model *m, float *dinp, int accumulate, int id, int l, int j, const float *dout,
                              int ld, int N, int C, int rows) {
    const dt_nf4 *q = dt_lora_nf4_sh(m, id, l, j);
    const dt_dtype dt = m->opts.compute;
    if (dt_lowp(m)) /* dout's block narrowed, contiguous */
        for (int n = 0; n < N; n++) dt_to_lowp(dt, m->lp_scratch + (size_t)n * rows, dout + (size_t)n * ld, (size_t)rows);
    if (q) {
        if (dt_lowp(m)) {
            dt_matmul_backward_nf4_lp(dt, dinp, accumulate, m->lp_scratch, q, N, C, rows);
            return;
        }
        const float *g = dout;
        if (ld != rows) {
            for (int n = 0; n < N; n++)
                dt_copy(m->lora_mm + (size_t)n * rows, dout + (size_t)n * ld, (size_t)rows * sizeof(float));
            g = m->lora_mm;
        }
        dt_matmul_backward_nf4(dinp, accumulate, g, q, N, C, rows);
        return;
    }
    const size_t off = (size_t)j * rows * (size_t)C;
    if (!dt_lowp(m))
        dt_matmul_backward_ld(dinp, accumulate, NULL, dout, ld, NULL,
                              dt_params_unit_tensor(&m->base, m->base.unit_params, id, dt_fam_layer(m, l)) + off, N, C, rows);
    else
        dt_matmul_backward_ld_lp(dt, dinp, accumulate, NULL, m->lp_scratch, rows, NULL, dt_model_lp_tensor(m, id, l) + off,
                                 N, C, rows);
}
