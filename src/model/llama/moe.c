/* The mixture-of-experts MLP of the LLaMA family (moe.h): routing, experts, losses. */
#include "model/llama/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/family_impl.h"
#include "ops/ops.h"

void dt_moe_layout(dt_moe_acts *a, float *base, size_t *off, const dt_model_config *c, const dt_model_opts *o,
                   int B, int T) {
    /* L slots: the stage's layers that keep their MoE state, and one shared by those that
     * recompute it */
    const int SL = dt_stage_layers(c, o);
    const size_t L = dt_act_slot(o, SL, DT_ACT_SEL, SL), BT = (size_t)B * T, E = c->n_experts,
                 k = c->experts_topk;
    /* tensor parallelism (decision 91): gate|up, h and their gradients hold the shards' columns */
    const size_t C = c->d_model, Fe = dt_moe_ff_held(c, o), R = BT * k; /* expert rows per layer */
    const size_t RR = dt_moe_expert_rows(c, o, BT); /* the rows of gu and h (expert parallelism: received) */
    const size_t H = o && o->compute != DT_F32, F32 = !H; /* mixed precision: 16-bit h, xe, xr (moe.h) */
    a->probs = dt_act_take(base, off, L * BT * E);
    a->lse = dt_act_take(base, off, L * BT);
    a->sel = (int32_t *)dt_act_take(base, off, L * BT * k);
    a->w = dt_act_take(base, off, L * BT * k);
    a->pos = (int32_t *)dt_act_take(base, off, L * BT * k);
    a->rows = (int32_t *)dt_act_take(base, off, L * R);
    a->off = (int32_t *)dt_act_take(base, off, L * (E + 1));
    a->gu = dt_act_take(base, off, L * RR * 2 * Fe);
    a->h = dt_act_take(base, off, F32 * L * RR * Fe);
    a->hh = dt_act_take16(base, off, H * L * RR * Fe);
    a->y = dt_act_take(base, off, L * R * C);
    a->xe = dt_act_take(base, off, F32 * BT * C);
    a->xh = dt_act_take16(base, off, H * BT * C);
    a->dy = dt_act_take(base, off, BT * C);
    a->dx = dt_act_take(base, off, BT * C);
    a->dh = dt_act_take(base, off, BT * Fe);
    a->dgu = dt_act_take(base, off, BT * 2 * Fe);
    a->logit = dt_act_take(base, off, BT * E);
    a->dw = dt_act_take(base, off, BT * k);
    a->cand = dt_act_take(base, off, BT * 2);
    a->count = (double *)dt_act_take(base, off, dt_moe_stage_floats(c)); /* 64-byte aligned */
    a->psum = a->count ? a->count + E : NULL;
    a->zsum = a->count ? a->count + 2 * E : NULL;
    a->auxl = a->count ? a->count + 2 * E + 1 : NULL;
    a->xr = a->sx = a->ox = a->ox2 = NULL;
    a->xrh = NULL;
    a->rc = NULL;
    if (o && o->ep > 1) { /* expert parallelism (moe_ep.c) */
        a->xr = dt_act_take(base, off, F32 * L * RR * C);
        a->xrh = dt_act_take16(base, off, H * L * RR * C);
        a->rc = (int32_t *)dt_act_take(base, off, L * (size_t)E);
        a->sx = dt_act_take(base, off, R * C);
        a->ox = dt_act_take(base, off, RR * C);
        a->ox2 = dt_act_take(base, off, RR * C);
    }
}

size_t dt_moe_expert_rows(const dt_model_config *c, const dt_model_opts *o, size_t BT) {
    const size_t k = (size_t)c->experts_topk;
    if (!o || o->ep <= 1) return BT * k;
    const size_t per = (size_t)(c->n_experts / o->ep);
    return (size_t)o->ep * BT * (k < per ? k : per);
}

size_t dt_moe_ep_segment(const dt_model_config *c, const dt_model_opts *o, int store_layers) {
    /* under LoRA the experts' trainable tensors are their adapters (decision 90) */
    const size_t per = o && o->lora.rank > 0 ? dt_lora_expert_floats(c, &o->lora)
                                             : 3 * dt_moe_ff_held(c, o) * (size_t)c->d_model;
    return (size_t)store_layers * (size_t)dt_moe_local(c, o) * per;
}

size_t dt_moe_ep_offset(const dt_model *m) {
    const int first = dt_moe_first(&m->cfg, &m->opts);
    const dt_params *ps = &m->ps;
    if (!m->lora) return ps->tensors[DT_LLAMA_MOE_W1(first)].offset - ps->layers_offset;
    for (int i = 0; i < m->n_sites; i++)
        if (ps->tensors[m->site_a[i]].expert == first + 1) return ps->tensors[m->site_a[i]].offset - ps->layers_offset;
    return 0; /* no expert adapters: an empty region */
}

size_t dt_moe_stage_floats(const dt_model_config *c) {
    return c->n_experts ? (2 * (size_t)c->n_experts + 2) * sizeof(double) / sizeof(float) : 0;
}

void dt_moe_begin(dt_model *m, dt_moe_acts *a) {
    if (dt_stage_first(&m->opts)) dt_fill(a->count, 0, dt_moe_stage_floats(&m->cfg) * sizeof(float));
    m->moe_dropped = 0;
}

/* Router row: probabilities p (E) and logsumexp of logits x; the k largest (ties: the lower
 * index) into sel, their renormalised weights into w. */
static float route_row(const float *x, int E, int k, float *p, int32_t *sel, float *w) {
    float mx = x[0];
    for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
    double s = 0.0;
    for (int e = 0; e < E; e++) s += exp((double)(x[e] - mx));
    for (int e = 0; e < E; e++) p[e] = (float)(exp((double)(x[e] - mx)) / s);
    unsigned taken = 0; /* E <= 16 */
    double sum = 0.0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!(taken >> e & 1u) && (best < 0 || p[e] > p[best])) best = e; /* strict: lower index wins */
        taken |= 1u << best;
        sel[j] = best;
        sum += p[best];
    }
    for (int j = 0; j < k; j++) w[j] = (float)(p[sel[j]] / sum);
    return (float)(mx + log(s));
}

/* Capacity: the larger weight first, then the lower token index. */
static int cand_cmp(const void *pa, const void *pb) {
    const float *x = pa, *y = pb;
    if (x[0] != y[0]) return x[0] > y[0] ? -1 : 1;
    int32_t rx, ry;
    memcpy(&rx, &x[1], sizeof rx);
    memcpy(&ry, &y[1], sizeof ry);
    return rx < ry ? -1 : rx > ry;
}

/* Layer l's state: its slot of each per-layer buffer (family_impl.h: class DT_ACT_SEL, kept
 * unless the layer is fully recomputed). */
typedef dt_moe_views moe_views;

static moe_views views_of(const dt_model *m, const dt_moe_acts *a, int l) {
    const dt_model_config *c = &m->cfg;
    const size_t s = dt_act_slot(&m->opts, dt_stage_layers(c, &m->opts), DT_ACT_SEL, l), BT = (size_t)m->B * m->T;
    const size_t E = c->n_experts, R = BT * c->experts_topk, Fe = dt_moe_ff_held(c, &m->opts);
    const size_t RR = dt_moe_expert_rows(c, &m->opts, BT);
    moe_views v = {a->probs + s * BT * E, a->lse + s * BT,          a->w + s * R,
                   a->gu + s * RR * 2 * Fe, a->h + s * RR * Fe,      a->y + s * R * c->d_model,
                   a->xr ? a->xr + s * RR * c->d_model : NULL,
                   a->sel + s * R,         a->pos + s * R,           a->rows + s * R,
                   a->off + s * (E + 1),   a->rc ? a->rc + s * E : NULL,
                   a->hh ? a->hh + s * RR * Fe : NULL, a->xrh ? a->xrh + s * RR * c->d_model : NULL};
    return v;
}

/* Layer l's routing: probs, lse, sel, w; then the expert rows, capacity applied. A recompute
 * (activation checkpointing) forms the same again without adding to the micro-batch's totals. */
static void route(dt_model *m, dt_moe_acts *a, const moe_views *v, int l, int BT, int recompute) {
    const dt_model_config *c = &m->cfg;
    const int E = c->n_experts, k = c->experts_topk;
    const size_t R = (size_t)BT * k;
    float *probs = v->probs, *lse = v->lse, *w = v->w;
    int32_t *sel = v->sel, *pos = v->pos, *rows = v->rows, *off = v->off;
    int cnt[DT_MOE_MAX_EXPERTS] = {0};
    double lp[DT_MOE_MAX_EXPERTS] = {0}; /* this layer's probability sums (the layer-wise loss) */
    for (int t = 0; t < BT; t++) {
        lse[t] = route_row(a->logit + (size_t)t * E, E, k, probs + (size_t)t * E, sel + (size_t)t * k, w + (size_t)t * k);
        for (int j = 0; j < k; j++) cnt[sel[(size_t)t * k + j]]++;
        if (recompute) continue;
        *a->zsum += (double)lse[t] * lse[t];
        for (int e = 0; e < E; e++) a->psum[e] += probs[(size_t)t * E + e], lp[e] += probs[(size_t)t * E + e];
    }
    if (!recompute) {
        for (int e = 0; e < E; e++) a->count[e] += cnt[e];
        double s = 0.0; /* Megatron-Core's aux_loss of this layer: E / (k T^2) sum_e c_e P_e */
        for (int e = 0; e < E; e++) s += (double)cnt[e] * lp[e];
        *a->auxl += s * E / ((double)k * BT * BT);
    }
    /* the expert load, by the model's layer (decision 86); a TP group routes alike: its first
     * shard's holder counts (decision 91) */
    if (m->moe_load && !recompute && dt_tp_first(&m->opts) == 0) {
        int64_t *ld = m->moe_load + (size_t)dt_params_layer(&m->ps, m->chunk_l0 + l) * E;
        for (int e = 0; e < E; e++) ld[e] += cnt[e];
    }
    /* candidates, expert by expert, tokens ascending */
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
    int fill[DT_MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++) fill[e] = off[e];
    for (size_t r = 0; r < R; r++) {
        pos[r] = 0;
        rows[fill[sel[r]]++] = (int32_t)r;
    }
    if (m->moe_capacity > 0.0f) {
        const long cap = (long)ceil((double)m->moe_capacity * BT * k / E);
        for (int e = 0; e < E; e++) {
            if (cnt[e] <= cap) continue;
            for (int i = 0; i < cnt[e]; i++) {
                int32_t r = rows[off[e] + i];
                a->cand[2 * i] = w[r];
                memcpy(&a->cand[2 * i + 1], &r, sizeof r);
            }
            qsort(a->cand, (size_t)cnt[e], 2 * sizeof(float), cand_cmp);
            for (int i = (int)cap; i < cnt[e]; i++) {
                int32_t r;
                memcpy(&r, &a->cand[2 * i + 1], sizeof r);
                pos[r] = -1;
            }
            if (!recompute) m->moe_dropped += cnt[e] - cap;
        }
        /* compact the kept rows, keeping each expert's token order */
        int n = 0;
        for (int e = 0; e < E; e++) {
            int lo = off[e], hi = off[e + 1];
            off[e] = n;
            for (int i = lo; i < hi; i++)
                if (pos[rows[i]] >= 0) rows[n++] = rows[i];
        }
        off[E] = n;
    }
    for (int i = 0; i < off[E]; i++) pos[rows[i]] = i;
}

void dt_moe_forward(dt_model *m, dt_moe_acts *a, int l, const float *ln2, const uint16_t *ln2h, const float *res2,
                    float *out, int next) {
    const dt_model_config *c = &m->cfg;
    const int BT = m->B * m->T, C = c->d_model, E = c->n_experts, k = c->experts_topk, Fe = c->expert_d_ff;
    const int Fl = Fe / dt_tp_size(&m->opts), nb = dt_tp_local(&m->opts), Fh = nb * Fl; /* decision 91 */
    const int recompute = out == NULL;
    double *pf = recompute ? m->prof.bwd : m->prof.fwd;
    const moe_views v = views_of(m, a, l);
    DT_PROF_TO(m, pf, DT_OP_MATMUL,
               dt_fam_mm_forward(m, a->logit, (dt_mmin){ln2, ln2h}, DT_LLAMA_MOE_ROUTER, l, NULL, BT, C, E));
    route(m, a, &v, l, BT, recompute);
    const int32_t *rows = v.rows, *off = v.off, *pos = v.pos;
    float *gu = v.gu, *h = v.h, *y = v.y;
    const int lp = dt_lowp(m);
    if (m->opts.ep > 1) dt_moe_ep_forward(m, a, &v, l, ln2, ln2h, next); /* the experts of the EP group */
    for (int e = 0; e < E && m->opts.ep <= 1; e++) {
        dt_unit_need(m, dt_fam_unit(m, DT_LLAMA_MOE_W1(e), l),
                     e + 1 < E ? dt_fam_unit(m, DT_LLAMA_MOE_W1(e + 1), l) : next);
        const int n = off[e + 1] - off[e];
        if (n == 0) continue;
        if (dt_tp_size(&m->opts) > 1) { /* decision 91: fp32 (16-bit with tp refused) */
            for (int i = 0; i < n; i++)
                dt_copy(a->xe + (size_t)i * C, ln2 + (size_t)(rows[off[e] + i] / k) * C, (size_t)C * sizeof(float));
            float *gue = gu + (size_t)off[e] * 2 * Fh, *he = h + (size_t)off[e] * Fh, *ye = y + (size_t)off[e] * C;
            /* w1 (gate) and w3 (up) are adjacent rows: one (2Fe x C) projection; under tensor
             * parallelism (decision 91) the dense MLP's column- and row-parallel GEMMs over the
             * expert's n rows, shard j's gate|up and h in the j-th (n, 2Fl) and (n, Fl) blocks, the
             * output summed over the shards and the TP group */
            const int ids[2] = {DT_LLAMA_MOE_W1(e), DT_LLAMA_MOE_W3(e)};
            DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_tp_cols_forward(m, gue, (dt_mmin){a->xe, NULL}, ids, 2, l, n, C, 2 * Fl));
            for (int j = 0; j < nb; j++)
                DT_PROF_TO(m, pf, DT_OP_SWIGLU,
                           dt_swiglu_forward(he + (size_t)j * n * Fl, gue + (size_t)j * n * 2 * Fl, n, Fl));
            DT_PROF_TO(m, pf, DT_OP_MATMUL,
                       dt_tp_row_forward(m, ye, (dt_mmin){he, NULL}, DT_LLAMA_MOE_W2(e), l, NULL, n, Fl, C, m->tp_scratch));
        } else {
            for (int i = 0; i < n; i++) { /* mixed precision: the rows of the norm's 16-bit copy */
                const size_t t = (size_t)(rows[off[e] + i] / k);
                if (lp) dt_copy(a->xh + (size_t)i * C, ln2h + t * C, (size_t)C * sizeof(uint16_t));
                else dt_copy(a->xe + (size_t)i * C, ln2 + t * C, (size_t)C * sizeof(float));
            }
            float *gue = gu + (size_t)off[e] * 2 * Fe, *ye = y + (size_t)off[e] * C;
            float *he = lp ? a->dh : h + (size_t)off[e] * Fe; /* mixed precision: kept in hh only */
            uint16_t *hhe = lp ? v.hh + (size_t)off[e] * Fe : NULL;
            /* w1 (gate) and w3 (up) are adjacent rows: one (2Fe x C) projection */
            DT_PROF_TO(m, pf, DT_OP_MATMUL,
                       dt_fam_mm_forward(m, gue, (dt_mmin){a->xe, a->xh}, DT_LLAMA_MOE_W1(e), l, NULL, n, C, 2 * Fe));
            DT_PROF_TO(m, pf, DT_OP_SWIGLU, dt_swiglu_forward(he, gue, n, Fe));
            dt_fam_narrow(m, hhe, he, (size_t)n * Fe);
            DT_PROF_TO(m, pf, DT_OP_MATMUL,
                       dt_fam_mm_forward(m, ye, (dt_mmin){he, hhe}, DT_LLAMA_MOE_W2(e), l, NULL, n, Fe, C));
        }
    }
    if (recompute) return;
    /* out = res2 + the weighted outputs, each token's choices in slot order */
    const float *w = v.w;
    for (int t = 0; t < BT; t++) {
        float *o = out + (size_t)t * C;
        const float *r = res2 + (size_t)t * C;
        for (int i = 0; i < C; i++) o[i] = r[i];
        for (int j = 0; j < k; j++) {
            const int32_t p = pos[(size_t)t * k + j];
            if (p < 0) continue;
            const float wj = w[(size_t)t * k + j], *yr = y + (size_t)p * C;
            for (int i = 0; i < C; i++) o[i] += wj * yr[i];
        }
    }
}

/* The router rows of the losses' totals: every layer's rows of the micro-batch's whole
 * sequences (context parallelism: each CP rank holds T / cp of them; decision 89). */
static double rows_total(const dt_model *m) {
    const int cp = m->cp_ring.n > 1 ? m->cp_ring.n : 1;
    return (double)m->cfg.n_layer * m->B * m->T * cp;
}

double dt_moe_finish(dt_model *m, dt_moe_acts *a) {
    const dt_model_config *c = &m->cfg;
    /* context parallelism: the totals of the whole sequences, summed over the CP group before
     * the losses are formed; the backward's gradients then read the same */
    if (m->cp_ring.n > 1 &&
        (!m->cp_ring.sum || m->cp_ring.sum(m->cp_ring.ud, a->count, dt_moe_stage_floats(c) * sizeof(float) / sizeof(double))))
        m->cp_failed = 1; /* a ring without the sum cannot form the sequence's losses */
    const double N = rows_total(m);
    double aux = 0.0;
    for (int e = 0; e < c->n_experts; e++) aux += (a->count[e] / N) * (a->psum[e] / N);
    aux *= c->n_experts;
    if (m->moe_aux_layer) aux = *a->auxl; /* summed over the layers as they were routed */
    m->moe_aux = (float)aux;
    m->moe_z = (float)(*a->zsum / N);
    return (double)m->moe_aux_coef * m->moe_aux + (double)m->moe_z_coef * m->moe_z;
}

void dt_moe_backward(dt_model *m, dt_moe_acts *a, int l, const float *ln2, const uint16_t *ln2h, const float *dout,
                     float *dln2, float scale, int next) {
    const dt_model_config *c = &m->cfg;
    const int BT = m->B * m->T, C = c->d_model, E = c->n_experts, k = c->experts_topk, Fe = c->expert_d_ff;
    const int Fl = Fe / dt_tp_size(&m->opts), nb = dt_tp_local(&m->opts), Fh = nb * Fl; /* decision 91 */
    const size_t R = (size_t)BT * k;
    const moe_views v = views_of(m, a, l);
    const int32_t *rows = v.rows, *off = v.off, *pos = v.pos, *sel = v.sel;
    const float *w = v.w, *probs = v.probs, *lse = v.lse, *gu = v.gu, *h = v.h, *y = v.y;
    const int lp = dt_lowp(m);
    /* the weights' gradients: dout . y of each kept choice */
    for (size_t r = 0; r < R; r++) {
        a->dw[r] = 0.0f;
        if (pos[r] < 0) continue;
        const float *d = dout + (r / k) * C, *yr = y + (size_t)pos[r] * C;
        float s = 0.0f;
        for (int i = 0; i < C; i++) s += d[i] * yr[i];
        a->dw[r] = s;
    }
    dt_fill(dln2, 0, (size_t)BT * C * sizeof(float));
    const int router_unit = dt_fam_unit(m, DT_LLAMA_MOE_ROUTER, l);
    /* zb-h1 (ARCHITECTURE decision 84): each expert's douts and gathered input formed straight
     * into three blocks of the plan (R rows each, expert e's at row off[e]), kept for W (expert
     * parallelism forms its experts' gradients in B, into the source ranks' segments: decision 89) */
    float *kdy = NULL, *kdgu = NULL, *kxe = NULL;
    if (m->opts.ep <= 1 && dt_wdefer_on(m, DT_LLAMA_MOE_W1(0), l)) {
        kdy = dt_wdefer_dout(m, NULL, R * C);
        kdgu = dt_wdefer_dout(m, NULL, R * 2 * Fe);
        kxe = dt_wdefer_dout(m, NULL, R * C);
    }
    if (m->opts.ep > 1) dt_moe_ep_backward(m, a, &v, l, dout, dln2, router_unit); /* the experts of the EP group */
    for (int e = m->opts.ep > 1 ? -1 : E - 1; e >= 0; e--) {
        const int u = dt_fam_unit(m, DT_LLAMA_MOE_W1(e), l);
        dt_unit_need(m, u, e > 0 ? dt_fam_unit(m, DT_LLAMA_MOE_W1(e - 1), l) : router_unit);
        dt_unit_grads_begin(m, u);
        const int n = off[e + 1] - off[e];
        if (n > 0) {
            float *ye = kdy ? kdy + (size_t)off[e] * C : a->dy;
            float *ge = kdgu ? kdgu + (size_t)off[e] * 2 * Fe : a->dgu;
            /* the gathered input: fp32, or mixed precision's 16-bit rows (zb-h1: in the first
             * half of the block, expert e's at row off[e]) */
            float *xe = lp ? NULL : kxe ? kxe + (size_t)off[e] * C : a->xe;
            uint16_t *xeh = !lp ? NULL : kxe ? (uint16_t *)kxe + (size_t)off[e] * C : a->xh;
            for (int i = 0; i < n; i++) {
                const int32_t r = rows[off[e] + i];
                const float wr = w[r], *d = dout + (size_t)(r / k) * C;
                float *dy = ye + (size_t)i * C;
                for (int q = 0; q < C; q++) dy[q] = wr * d[q];
                if (lp) dt_copy(xeh + (size_t)i * C, ln2h + (size_t)(r / k) * C, (size_t)C * sizeof(uint16_t));
                else dt_copy(xe + (size_t)i * C, ln2 + (size_t)(r / k) * C, (size_t)C * sizeof(float));
            }
            if (dt_tp_size(&m->opts) > 1) { /* the dense MLP's backward over the expert's rows, shard by shard
                                               (decision 91: fp32, no pipeline, so no zb-h1 blocks) */
                const float *gue = gu + (size_t)off[e] * 2 * Fh, *he = h + (size_t)off[e] * Fh;
                const int ids[2] = {DT_LLAMA_MOE_W1(e), DT_LLAMA_MOE_W3(e)};
                DT_PROF(m, bwd, DT_OP_MATMUL,
                        dt_tp_row_backward(m, a->dh, DT_LLAMA_MOE_W2(e), l, NULL, ye, (dt_mmin){he, NULL}, n, Fl, C));
                for (int j = 0; j < nb; j++)
                    DT_PROF(m, bwd, DT_OP_SWIGLU, dt_swiglu_backward(ge + (size_t)j * n * 2 * Fl, gue + (size_t)j * n * 2 * Fl,
                                                                     a->dh + (size_t)j * n * Fl, n, Fl));
                DT_PROF(m, bwd, DT_OP_MATMUL,
                        dt_tp_cols_backward(m, a->dx, ids, 2, l, ge, (dt_mmin){xe, NULL}, n, C, 2 * Fl, m->tp_scratch));
            } else {
                const float *gue = gu + (size_t)off[e] * 2 * Fe, *he = lp ? NULL : h + (size_t)off[e] * Fe;
                const uint16_t *hhe = lp ? v.hh + (size_t)off[e] * Fe : NULL;
                if (kdy)
                    DT_PROF(m, bwd, DT_OP_MATMUL,
                            dt_fam_mm_backward_kept(m, a->dh, DT_LLAMA_MOE_W2(e), l, NULL, ye, (dt_mmin){he, hhe}, n, Fe, C));
                else
                    DT_PROF(m, bwd, DT_OP_MATMUL,
                            dt_fam_mm_backward(m, a->dh, DT_LLAMA_MOE_W2(e), l, NULL, ye, (dt_mmin){he, hhe}, n, Fe, C));
                DT_PROF(m, bwd, DT_OP_SWIGLU, dt_swiglu_backward(ge, gue, a->dh, n, Fe));
                if (kdy)
                    DT_PROF(m, bwd, DT_OP_MATMUL,
                            dt_fam_mm_backward_kept(m, a->dx, DT_LLAMA_MOE_W1(e), l, NULL, ge, (dt_mmin){xe, xeh}, n, C, 2 * Fe));
                else
                    DT_PROF(m, bwd, DT_OP_MATMUL,
                            dt_fam_mm_backward(m, a->dx, DT_LLAMA_MOE_W1(e), l, NULL, ge, (dt_mmin){xe, xeh}, n, C, 2 * Fe));
            }
            for (int i = 0; i < n; i++) {
                float *d = dln2 + (size_t)(rows[off[e] + i] / k) * C;
                const float *dx = a->dx + (size_t)i * C;
                for (int q = 0; q < C; q++) d[q] += dx[q];
            }
        }
        dt_unit_grads_end(m, u);
    }
    /* router: d(logits) from the weights, the load-balancing loss and the z-loss */
    dt_unit_need(m, router_unit, next);
    dt_unit_grads_begin(m, router_unit);
    /* over the whole sequences' N rows (totals and N summed over the CP group); this rank's rows
     * are Nl of them: the gradient of each of its rows is cp times its share of the sequence's,
     * as its cross-entropy's is (a mean over its Nl rows), and the CP group's sum divided by cp
     * (the loss scale) gives the whole sequence's */
    const double Nl = (double)c->n_layer * BT, N = rows_total(m);
    const float zg = (float)(scale * (double)m->moe_z_coef * 2.0 / Nl);
    float aux_g[DT_MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++) aux_g[e] = (float)(scale * (double)m->moe_aux_coef * E * a->count[e] / (Nl * N));
    if (m->moe_aux_layer) { /* this layer's own choices (before any capacity drop), as in its forward */
        int cl[DT_MOE_MAX_EXPERTS] = {0};
        for (size_t r = 0; r < R; r++) cl[sel[r]]++;
        for (int e = 0; e < E; e++) aux_g[e] = (float)(scale * (double)m->moe_aux_coef * E * cl[e] / ((double)k * BT * BT));
    }
    for (int t = 0; t < BT; t++) {
        const float *p = probs + (size_t)t * E, *wt = w + (size_t)t * k, *dwt = a->dw + (size_t)t * k;
        const int32_t *st = sel + (size_t)t * k;
        float dp[DT_MOE_MAX_EXPERTS];
        for (int e = 0; e < E; e++) dp[e] = aux_g[e];
        float S = 0.0f, wdot = 0.0f;
        for (int j = 0; j < k; j++) S += p[st[j]], wdot += wt[j] * dwt[j];
        for (int j = 0; j < k; j++) dp[st[j]] += (dwt[j] - wdot) / S;
        float pdp = 0.0f;
        for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
        float *dl = a->logit + (size_t)t * E;
        for (int e = 0; e < E; e++) dl[e] = p[e] * (dp[e] - pdp) + zg * lse[t] * p[e];
    }
    DT_PROF(m, bwd, DT_OP_MATMUL,
            dt_fam_mm_backward(m, a->dx, DT_LLAMA_MOE_ROUTER, l, NULL, a->logit, (dt_mmin){ln2, ln2h}, BT, C, E));
    for (size_t i = 0; i < (size_t)BT * C; i++) dln2[i] += a->dx[i];
}
