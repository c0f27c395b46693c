/* Expert parallelism of the mixture-of-experts MLP (moe.h; ARCHITECTURE decision 85).
 *
 * The ep ranks of an EP group hold E / ep consecutive experts each. Every rank routes its own
 * tokens as without expert parallelism (moe.c: the router, its losses and the capacity are
 * the source rank's), then
 *   forward:  the per-expert row counts and the rows (expert by expert, tokens ascending: the
 *             order of moe.c's expert rows) go to each expert's owner (all-to-all); the owner
 *             runs, for each local expert and each source rank in rank order, the GEMMs over
 *             that source's rows - exactly the GEMMs the source runs without expert
 *             parallelism - and sends the outputs back into the source's expert rows;
 *   backward: the routing-weighted output gradients go to the owners, which run each source's
 *             GEMMs again (input gradients, and the weight gradients into the source's own
 *             segment of model.h dt_model.ep_grads), and send the input gradients back; the
 *             source adds them into dln2 in moe.c's order (experts descending, rows ascending).
 * So every row sees the arithmetic it sees at ep = 1, and each expert's weight gradient per
 * source rank is bitwise the one that source forms alone; the trainer sums the segments in
 * data-parallel rank order (train/ep.c). Under mixed precision the rows travel as the 16-bit
 * values the GEMMs read (the norm's copy) and the owner keeps them (xrh) and its SwiGLU outputs
 * (hh) in 16 bits: the GEMMs are dt_fam_mm_forward's and dt_matmul_backward_lp's as at ep = 1.
 *
 * With tensor parallelism (decision 91) the EP group is the data-parallel ranks at one TP rank:
 * TP rank t of a source sends its rows (the same on every TP rank: they route alike) to TP rank
 * t of the owner, which holds shard t of its experts and runs on each source's rows the calls
 * moe.c runs at ep 1 under tensor parallelism - the column- and row-parallel GEMMs shard by
 * shard, the outputs' and input gradients' shard partials summed in shard order and over the
 * TP group - with each shard's weight gradients in its place of the source's segment (the
 * store's layout: w1's, w3's, w2's shards in turn). */
#include <string.h>

#include "model/family_impl.h"
#include "model/llama/moe.h"
#include "ops/ops.h"

/* The layer's exchange: sc/sd (rows to, and where from, each owner), rn/rd (rows from each
 * source, and where they land); rows of local expert j from source s start at row
 * base[s * El + j] of the received block. */
typedef struct ep_plan {
    size_t sc[DT_MOE_MAX_EXPERTS], sd[DT_MOE_MAX_EXPERTS], rn[DT_MOE_MAX_EXPERTS], rd[DT_MOE_MAX_EXPERTS];
    size_t base[DT_MOE_MAX_EXPERTS * DT_MOE_MAX_EXPERTS];
} ep_plan;

static int a2a(dt_model *m, const void *send, const size_t *sc, const size_t *sd, void *recv, const size_t *rc,
               const size_t *rd, size_t esize) {
    if (m->ep_failed) return 1;
    if (m->ep_ops.alltoallv(m->ep_ops.ud, send, sc, sd, recv, rc, rd, esize)) m->ep_failed = 1;
    return m->ep_failed;
}

static void plan_of(const dt_model *m, const dt_moe_views *v, ep_plan *p) {
    const int P = m->opts.ep, El = m->cfg.n_experts / P;
    for (int d = 0; d < P; d++) {
        p->sd[d] = (size_t)v->off[d * El];
        p->sc[d] = (size_t)(v->off[(d + 1) * El] - v->off[d * El]);
    }
    size_t at = 0;
    for (int s = 0; s < P; s++) {
        p->rd[s] = at;
        for (int j = 0; j < El; j++) p->base[s * El + j] = at, at += (size_t)v->rc[s * El + j];
        p->rn[s] = at - p->rd[s];
    }
}

/* counts and displacements in rows -> in elements of `width` */
static void scaled(const size_t *x, size_t *out, int P, size_t width) {
    for (int i = 0; i < P; i++) out[i] = x[i] * width;
}

void dt_moe_ep_forward(dt_model *m, dt_moe_acts *a, const dt_moe_views *v, int l, const float *ln2,
                       const uint16_t *ln2h, int next) {
    const dt_model_config *c = &m->cfg;
    const int C = c->d_model, E = c->n_experts, k = c->experts_topk;
    const int Fe = c->expert_d_ff, Fl = Fe / dt_tp_size(&m->opts), nb = dt_tp_local(&m->opts), Fh = nb * Fl;
    const int P = m->opts.ep, me = m->opts.ep_rank, El = E / P, e0 = dt_moe_first(c, &m->opts);
    double *pf = m->prof.fwd;
    const int lp = dt_lowp(m);
    const size_t es = lp ? sizeof(uint16_t) : sizeof(float); /* a row's element: what the GEMM reads */
    /* each owner's row counts of its experts */
    int32_t cnt[DT_MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++) cnt[e] = v->off[e + 1] - v->off[e];
    size_t ec[DT_MOE_MAX_EXPERTS], ed[DT_MOE_MAX_EXPERTS];
    for (int d = 0; d < P; d++) ec[d] = (size_t)El, ed[d] = (size_t)d * El;
    if (a2a(m, cnt, ec, ed, v->rc, ec, ed, sizeof(int32_t))) return;
    ep_plan p;
    plan_of(m, v, &p);
    /* the rows, in expert order, to their owners */
    for (int i = 0; i < v->off[E]; i++) {
        const size_t t = (size_t)(v->rows[i] / k);
        if (lp) dt_copy((uint16_t *)a->sx + (size_t)i * C, ln2h + t * C, (size_t)C * es);
        else dt_copy(a->sx + (size_t)i * C, ln2 + t * C, (size_t)C * es);
    }
    size_t sc[DT_MOE_MAX_EXPERTS], sd[DT_MOE_MAX_EXPERTS], rn[DT_MOE_MAX_EXPERTS], rd[DT_MOE_MAX_EXPERTS];
    scaled(p.sc, sc, P, C), scaled(p.sd, sd, P, C), scaled(p.rn, rn, P, C), scaled(p.rd, rd, P, C);
    if (a2a(m, a->sx, sc, sd, lp ? (void *)v->xrh : (void *)v->xr, rn, rd, es)) return;
    for (int d = 0; d < P; d++)
        if (d != me) m->ep_rows_sent += (long)p.sc[d];
    /* each local expert, each source's rows in rank order: that source's own GEMMs */
    for (int j = 0; j < El; j++) {
        const int e = e0 + j;
        dt_unit_need(m, dt_fam_unit(m, DT_LLAMA_MOE_W1(e), l), j + 1 < El ? dt_fam_unit(m, DT_LLAMA_MOE_W1(e + 1), l) : next);
        for (int s = 0; s < P; s++) {
            const int n = v->rc[s * El + j];
            if (n == 0) continue;
            const size_t b = p.base[s * El + j];
            if (dt_tp_size(&m->opts) > 1) { /* decision 91: fp32 (16-bit with tp refused) */
                float *gue = v->gu + b * 2 * Fh, *he = v->h + b * Fh, *ye = a->ox + b * C;
                const int ids[2] = {DT_LLAMA_MOE_W1(e), DT_LLAMA_MOE_W3(e)};
                DT_PROF_TO(m, pf, DT_OP_MATMUL,
                           dt_tp_cols_forward(m, gue, (dt_mmin){v->xr + b * C, NULL}, ids, 2, l, n, C, 2 * Fl));
                for (int q = 0; q < nb; q++)
                    DT_PROF_TO(m, pf, DT_OP_SWIGLU,
                               dt_swiglu_forward(he + (size_t)q * n * Fl, gue + (size_t)q * n * 2 * Fl, n, Fl));
                DT_PROF_TO(m, pf, DT_OP_MATMUL,
                           dt_tp_row_forward(m, ye, (dt_mmin){he, NULL}, DT_LLAMA_MOE_W2(e), l, NULL, n, Fl, C, m->tp_scratch));
            } else {
                float *gue = v->gu + b * 2 * Fe, *ye = a->ox + b * C;
                float *he = lp ? a->dh : v->h + b * Fe; /* mixed precision: kept in hh only (moe.c) */
                uint16_t *hhe = lp ? v->hh + b * Fe : NULL;
                const dt_mmin x = lp ? (dt_mmin){NULL, v->xrh + b * C} : (dt_mmin){v->xr + b * C, NULL};
                DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_fam_mm_forward(m, gue, x, DT_LLAMA_MOE_W1(e), l, NULL, n, C, 2 * Fe));
                DT_PROF_TO(m, pf, DT_OP_SWIGLU, dt_swiglu_forward(he, gue, n, Fe));
                dt_fam_narrow(m, hhe, he, (size_t)n * Fe);
                DT_PROF_TO(m, pf, DT_OP_MATMUL,
                           dt_fam_mm_forward(m, ye, (dt_mmin){he, hhe}, DT_LLAMA_MOE_W2(e), l, NULL, n, Fe, C));
            }
        }
    }
    /* the outputs back into the source's expert rows */
    (void)a2a(m, a->ox, rn, rd, v->y, sc, sd, sizeof(float));
}

/* Tensor parallelism: one source's n rows of a local expert (received at row b), shard by shard
 * as tp.c's dt_tp_row_backward and cols_backward_partial run them (w1 at the expert's store
 * place: its w3 and w2 follow, each nb shards), the weight gradients into the segment `seg`
 * laid out as the store, the input gradient's shard partials added in shard order into ox2. */
static void shards_backward(dt_model *m, dt_moe_acts *a, const dt_moe_views *v, const float *w1, float *seg, size_t b,
                            int n) {
    const dt_model_config *c = &m->cfg;
    const int C = c->d_model, Fl = c->expert_d_ff / dt_tp_size(&m->opts), nb = dt_tp_local(&m->opts), Fh = nb * Fl;
    const size_t T = (size_t)Fh * C, S = (size_t)Fl * C; /* a tensor, a shard */
    const float *w3 = w1 + T, *w2 = w1 + 2 * T, *dy = a->ox + b * C, *x = v->xr + b * C;
    const float *gu = v->gu + b * 2 * Fh, *h = v->h + b * Fh;
    float *dx = a->ox2 + b * C;
    for (int q = 0; q < nb; q++) { /* w2, row-parallel: its shard's input gradient and dW */
        DT_PROF(m, bwd, DT_OP_MATMUL,
                dt_matmul_backward(a->dh + (size_t)q * n * Fl, seg + 2 * T + q * S, NULL, dy, h + (size_t)q * n * Fl,
                                   w2 + q * S, n, Fl, C));
        DT_PROF(m, bwd, DT_OP_SWIGLU, dt_swiglu_backward(a->dgu + (size_t)q * n * 2 * Fl, gu + (size_t)q * n * 2 * Fl,
                                                         a->dh + (size_t)q * n * Fl, n, Fl));
    }
    for (int q = 0; q < nb; q++) { /* w1 | w3, column-parallel: shard q's partial input gradient */
        float *dst = q > 0 ? m->tp_scratch : dx;
        const float *d = a->dgu + (size_t)q * n * 2 * Fl;
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_matmul_backward_ld(dst, 0, seg + q * S, d, 2 * Fl, x, w1 + q * S, n, C, Fl));
        DT_PROF(m, bwd, DT_OP_MATMUL,
                dt_matmul_backward_ld(dst, 1, seg + T + q * S, d + Fl, 2 * Fl, x, w3 + q * S, n, C, Fl));
        if (q > 0) dt_tp_add(dx, m->tp_scratch, (size_t)n * C);
    }
}

void dt_moe_ep_backward(dt_model *m, dt_moe_acts *a, const dt_moe_views *v, int l, const float *dout, float *dln2,
                        int router_unit) {
    const dt_model_config *c = &m->cfg;
    const int C = c->d_model, E = c->n_experts, k = c->experts_topk, Fe = c->expert_d_ff;
    const int tp = dt_tp_size(&m->opts), Fl = Fe / tp, nb = dt_tp_local(&m->opts), Fh = nb * Fl;
    const int P = m->opts.ep, El = E / P, e0 = dt_moe_first(c, &m->opts);
    const size_t X = 3 * (size_t)Fh * C, Ls = (size_t)m->ps.n_layer, ls = (size_t)dt_fam_layer(m, l);
    const int lp = dt_lowp(m);
    const dt_dtype dt = m->opts.compute;
    const size_t len = dt_moe_ep_segment(c, &m->opts, 1); /* a segment's floats per store layer */
    const size_t eo = m->lora ? dt_moe_ep_offset(m) : 0;  /* its first float's offset in a store layer */
    ep_plan p;
    plan_of(m, v, &p);
    size_t sc[DT_MOE_MAX_EXPERTS], sd[DT_MOE_MAX_EXPERTS], rn[DT_MOE_MAX_EXPERTS], rd[DT_MOE_MAX_EXPERTS];
    scaled(p.sc, sc, P, C), scaled(p.sd, sd, P, C), scaled(p.rn, rn, P, C), scaled(p.rd, rd, P, C);
    /* the routing-weighted output gradients of the expert rows, to their owners */
    for (int i = 0; i < v->off[E]; i++) {
        const int32_t r = v->rows[i];
        const float wr = v->w[r], *d = dout + (size_t)(r / k) * C;
        float *dy = a->sx + (size_t)i * C;
        for (int q = 0; q < C; q++) dy[q] = wr * d[q];
    }
    const int ok = !a2a(m, a->sx, sc, sd, a->ox, rn, rd, sizeof(float));
    for (int j = El - 1; j >= 0; j--) {
        const int e = e0 + j, u = dt_fam_unit(m, DT_LLAMA_MOE_W1(e), l);
        dt_unit_need(m, u, j > 0 ? dt_fam_unit(m, DT_LLAMA_MOE_W1(e - 1), l) : router_unit);
        dt_unit_grads_begin(m, u);
        const float *w1 = m->lora ? NULL : dt_params_unit_tensor(&m->ps, m->ps.unit_params, DT_LLAMA_MOE_W1(e), (int)ls);
        const float *w2 = m->lora ? NULL : dt_params_unit_tensor(&m->ps, m->ps.unit_params, DT_LLAMA_MOE_W2(e), (int)ls);
        /* mixed precision: the 16-bit copies dt_fam_mm_backward reads at ep = 1 (not with LoRA: fp32) */
        const uint16_t *w1h = lp ? dt_model_lp_tensor(m, DT_LLAMA_MOE_W1(e), l) : NULL;
        const uint16_t *w2h = lp ? dt_model_lp_tensor(m, DT_LLAMA_MOE_W2(e), l) : NULL;
        for (int s = 0; s < P && ok; s++) {
            const int n = v->rc[s * El + j];
            if (n == 0) continue;
            const size_t b = p.base[s * El + j];
            if (m->lora) { /* the frozen base's input gradients, the adapters' into source s's segment */
                m->lora_seg = m->ep_grads + ((size_t)s * Ls + ls) * len, m->lora_seg_off = eo;
                DT_PROF(m, bwd, DT_OP_MATMUL,
                        dt_fam_mm_backward(m, a->dh, DT_LLAMA_MOE_W2(e), l, NULL, a->ox + b * C,
                                           (dt_mmin){v->h + b * Fe, NULL}, n, Fe, C));
                DT_PROF(m, bwd, DT_OP_SWIGLU, dt_swiglu_backward(a->dgu, v->gu + b * 2 * Fe, a->dh, n, Fe));
                DT_PROF(m, bwd, DT_OP_MATMUL,
                        dt_fam_mm_backward(m, a->ox2 + b * C, DT_LLAMA_MOE_W1(e), l, NULL, a->dgu,
                                           (dt_mmin){v->xr + b * C, NULL}, n, C, 2 * Fe));
                m->lora_seg = NULL;
                continue;
            }
            /* source s's segment: this layer's local expert j, [w1 | w3 | w2] */
            float *seg = m->ep_grads + (((size_t)s * Ls + ls) * (size_t)El + (size_t)j) * X;
            if (tp > 1) {
                shards_backward(m, a, v, w1, seg, b, n);
                continue;
            }
            if (lp)
                DT_PROF(m, bwd, DT_OP_MATMUL,
                        dt_matmul_backward_lp(dt, a->dh, seg + 2 * (size_t)Fe * C, NULL, a->ox + b * C, m->lp_scratch,
                                              v->hh + b * Fe, w2h, n, Fe, C));
            else
                DT_PROF(m, bwd, DT_OP_MATMUL,
                        dt_matmul_backward(a->dh, seg + 2 * (size_t)Fe * C, NULL, a->ox + b * C, v->h + b * Fe, w2, n, Fe,
                                           C));
            DT_PROF(m, bwd, DT_OP_SWIGLU, dt_swiglu_backward(a->dgu, v->gu + b * 2 * Fe, a->dh, n, Fe));
            if (lp)
                DT_PROF(m, bwd, DT_OP_MATMUL,
                        dt_matmul_backward_lp(dt, a->ox2 + b * C, seg, NULL, a->dgu, m->lp_scratch, v->xrh + b * C, w1h, n,
                                              C, 2 * Fe));
            else
                DT_PROF(m, bwd, DT_OP_MATMUL,
                        dt_matmul_backward(a->ox2 + b * C, seg, NULL, a->dgu, v->xr + b * C, w1, n, C, 2 * Fe));
        }
        dt_unit_grads_end(m, u);
    }
    /* tensor parallelism: the input gradients' shard partials over the TP group (moe.c's
     * dt_tp_cols_backward sums each expert's alike, elementwise) */
    if (ok && tp > 1 && nb < tp) dt_tp_sum(m, a->ox2, (p.rd[P - 1] + p.rn[P - 1]) * (size_t)C);
    /* the input gradients back; added as moe.c adds them: experts descending, rows ascending */
    if (!ok || a2a(m, a->ox2, rn, rd, a->sx, sc, sd, sizeof(float))) return;
    for (int e = E - 1; e >= 0; e--)
        for (int i = v->off[e]; i < v->off[e + 1]; i++) {
            float *d = dln2 + (size_t)(v->rows[i] / k) * C;
            const float *dx = a->sx + (size_t)i * C;
            for (int q = 0; q < C; q++) d[q] += dx[q];
        }
}
