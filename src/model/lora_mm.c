/* LoRA's adapter arithmetic (lora.h): the adapters of one base matmul, forward and backward,
 * whole or, under tensor parallelism, shard by shard (ARCHITECTURE decisions 49, 69). */
#include "model/lora.h"

#include "core/rng.h"
#include "model/family_impl.h"
#include "ops/ops.h"

/* Salt of the dropout masks' streams (a layer's are its dense sites': dropout is refused with
 * the experts' targets, lora.c dt_lora_validate). */
#define LORA_DROP_SALT 0x4c6f524144726f70ULL

uint64_t dt_lora_drop_key(uint64_t seed, uint64_t seq, int t, int l, int site) {
    uint64_t row = dt_rng_u64(seq, (uint64_t)(uint32_t)t, LORA_DROP_SALT);
    return dt_rng_u64(seed, LORA_DROP_SALT + (uint64_t)l * DT_LORA_NDENSE + (uint64_t)site, row);
}

/* Kept when the high 32 bits reach p 2^32: probability 1 - p (to 2^-32). */
static inline uint64_t drop_thresh(float p) { return (uint64_t)((double)p * 4294967296.0); }

int dt_lora_drop_keep(uint64_t key, int c, float p) { return (dt_rng_u64(key, (uint64_t)c, 0) >> 32) >= drop_thresh(p); }

/* The dropout of site `site`'s adapters of layer l in this forward or backward (ops.h
 * dt_dropout: the key of row n is dt_lora_drop_key's with the model's layer index - a pipeline
 * stage's layer l is the model's layer0 + l, so every stage draws pp 1's masks; on = 0: none);
 * coff: the layer input's feature index of x's column 0. */
static dt_dropout drop_of(const dt_model *m, int l, int site, int coff) {
    dt_dropout d = {0};
    if (!m->lora_drop_on) return d;
    const float p = m->opts.lora.dropout;
    d.on = 1, d.T = m->T, d.coff = coff, d.inv = 1.0f / (1.0f - p), d.thresh = drop_thresh(p);
    d.seed = m->lora_drop_seed, d.seq0 = m->lora_drop_seq0, d.salt = LORA_DROP_SALT;
    const int gl = dt_params_layer(&m->ps, dt_fam_layer(m, l)); /* the model's layer */
    d.stream = LORA_DROP_SALT + (uint64_t)gl * DT_LORA_NDENSE + (uint64_t)site;
    return d;
}

/* Whether base tensor t is split by tensor parallelism, and how (DT_SPLIT_*). */
static int split_of(const dt_model *m, int t) {
    const dt_tensor_info *ti = &m->base.tensors[t];
    return ti->tp_k > 1 ? ti->split : DT_SPLIT_NONE;
}

size_t dt_lora_shard_rows(const dt_model *m, int id) {
    const dt_tensor_info *t = &m->base.tensors[id];
    const dt_nf4 *q = dt_lora_nf4(m, id, 0);
    if (q && t->group == DT_PG_LAYER) return q->n / t->cols; /* the NF4 tensors have no rows in the slab */
    return split_of(m, id) ? t->shard_rows : t->rows;
}

/* Where site i writes in the output (N, OC) of the matmul over base tensors id, id + 1, ...
 * (adjacent matmul tensors of input width C, one shard of each under tensor parallelism),
 * and what it reads. */
typedef struct site_geo {
    int col, rows;      /* its column block of the output */
    int coff;           /* the layer input's feature index of x's column 0 (dropout masks) */
    const float *A, *B; /* this shard's A (r x C) and B (rows x r) */
    float *dA, *dB;     /* their gradients; NULL: the replicated one, formed as a contribution */
} site_geo;

static int site_geo_of(dt_model *m, int i, int id, int l, int j, int OC, int C, int bwd, site_geo *g) {
    const dt_params *b = &m->base;
    const dt_lora_site *s = &m->sites[i];
    if (s->id < id) return 0;
    /* rows of the call before the site's tensor: the tensors from id up to it (adjacent) */
    size_t col = 0;
    for (int t = id; t < s->id; t++) {
        if (b->tensors[t].group != DT_PG_LAYER || !b->tensors[t].matmul || b->tensors[t].cols != (size_t)C) return 0;
        col += dt_lora_shard_rows(m, t);
    }
    const int sp = split_of(m, s->id), k = b->tensors[s->id].tp_k;
    size_t row0 = s->row0, rows = s->rows; /* a column-parallel shard holds 1/k of every section */
    if (sp == DT_SPLIT_OUT) row0 /= (size_t)k, rows /= (size_t)k;
    col += row0;
    if (col + rows > (size_t)OC) return 0;
    const size_t r = (size_t)m->opts.lora.rank;
    const int ia = m->site_a[i];
    g->col = (int)col, g->rows = (int)rows, g->coff = 0;
    g->A = dt_params_unit_tensor(&m->ps, m->ps.unit_params, ia, dt_fam_layer(m, l));
    g->B = dt_params_unit_tensor(&m->ps, m->ps.unit_params, ia + 1, dt_fam_layer(m, l));
    g->dA = bwd ? dt_params_unit_tensor(&m->ps, m->ps.unit_grads, ia, dt_fam_layer(m, l)) : NULL; /* a forward: no gradients */
    g->dB = bwd ? dt_params_unit_tensor(&m->ps, m->ps.unit_grads, ia + 1, dt_fam_layer(m, l)) : NULL;
    if (bwd && m->lora_seg && dt_lora_expert_target((int)s->target)) { /* a source's segment (model.h) */
        const size_t lo = m->ps.layers_offset + m->lora_seg_off;
        g->dA = m->lora_seg + (m->ps.tensors[ia].offset - lo);
        g->dB = m->lora_seg + (m->ps.tensors[ia + 1].offset - lo);
    }
    if (sp == DT_SPLIT_OUT) { /* B by output rows like the base, A replicated */
        g->B += (size_t)j * rows * r;
        if (g->dB) g->dB += (size_t)j * rows * r;
        g->dA = NULL;
    } else if (sp == DT_SPLIT_IN) { /* A by input columns like the base, B replicated */
        g->A += (size_t)j * r * (size_t)C;
        if (g->dA) g->dA += (size_t)j * r * (size_t)C;
        g->dB = NULL;
        g->coff = (dt_tp_first(&m->opts) + j) * C;
    }
    return 1;
}

/* out (N, OC) at the site's columns += s drop(x) A^T B^T. */
static void site_forward(dt_model *m, float *out, const float *xf, const uint16_t *xh, int N, int C, int OC,
                         const site_geo *g, const dt_dropout *d) {
    const int r = m->opts.lora.rank;
    dt_lowrank_down_forward(m->lora_u, xf, xh, m->opts.compute, g->A, N, C, r, d);
    dt_lowrank_up_forward(out + g->col, OC, m->lora_u, g->B, m->lora_scale, N, g->rows, r);
}

/* The site's backward: dB += s dout^T u, dA += du^T drop(x) (du = s dout B), dinp += du A
 * (masked, NULL: skipped), into dA and dB as given. u is recomputed: not kept from the
 * forward. */
static void site_backward(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh, int N,
                          int C, int OC, const site_geo *g, const dt_dropout *dr, float *dA, float *dB) {
    const int r = m->opts.lora.rank;
    dt_lowrank_down_forward(m->lora_u, xf, xh, m->opts.compute, g->A, N, C, r, dr);
    dt_lowrank_up_backward(dB, m->lora_du, dout + g->col, OC, m->lora_u, g->B, m->lora_scale, N, g->rows, r);
    dt_lowrank_down_backward(dA, dinp, m->lora_du, xf, xh, m->opts.compute, g->A, N, C, r, dr);
}

/* zb-h1's split of site_backward: B forms du and dinp (du needs only dout and B), W forms u,
 * dB, du again and dA - the same kernels on the same operands, so the same bits. */
static void site_weights(dt_model *m, const float *dout, const float *xf, const uint16_t *xh, int N, int C, int OC,
                         const site_geo *g, const dt_dropout *dr, float *dA, float *dB) {
    const int r = m->opts.lora.rank;
    dt_lowrank_down_forward(m->lora_u, xf, xh, m->opts.compute, g->A, N, C, r, dr);
    dt_lowrank_up_backward(dB, m->lora_du, dout + g->col, OC, m->lora_u, g->B, m->lora_scale, N, g->rows, r);
    dt_lowrank_down_backward(dA, NULL, m->lora_du, xf, xh, m->opts.compute, g->A, N, C, r, dr);
}

void dt_lora_mm_backward_defer(dt_model *m, float *dinp, const float *dout, const float *c, dt_mmin x, int id, int l,
                               int j, int N, int C, int OC) {
    const int r = m->opts.lora.rank;
    const float *xf = dt_lowp(m) ? NULL : x.f;
    const uint16_t *xh = dt_lowp(m) ? x.h : NULL;
    for (int i = 0; i < m->n_sites; i++) {
        site_geo g;
        if (!site_geo_of(m, i, id, l, j, OC, C, 1, &g)) continue;
        const dt_dropout dr = drop_of(m, l, i, g.coff);
        if (dinp) {
            dt_lowrank_up_backward(NULL, m->lora_du, dout + g.col, OC, NULL, g.B, m->lora_scale, N, g.rows, r);
            dt_lowrank_down_backward(NULL, dinp, m->lora_du, xf, xh, m->opts.compute, g.A, N, C, r, &dr);
        }
        dt_wdefer_item *it = dt_wdefer_gemm(m, m->site_a[i], l, 0, c, OC, 0, x, NULL, N, C, OC);
        it->site = i, it->bid = id, it->j = j;
        it->drop_on = m->lora_drop_on, it->drop_seed = m->lora_drop_seed, it->drop_seq0 = m->lora_drop_seq0;
    }
}

void dt_lora_mm_weights(dt_model *m, const dt_wdefer_item *it) {
    const int on = m->lora_drop_on; /* the micro-batch's dropout masks, as at its backward */
    const uint64_t seed = m->lora_drop_seed, seq0 = m->lora_drop_seq0;
    m->lora_drop_on = it->drop_on, m->lora_drop_seed = it->drop_seed, m->lora_drop_seq0 = it->drop_seq0;
    const int i = it->site, j = it->j, l = it->fl, N = it->N, C = it->C, OC = it->OC;
    site_geo g;
    DT_ASSERT(site_geo_of(m, i, it->bid, l, j, OC, C, 1, &g));
    const dt_dropout dr = drop_of(m, l, i, g.coff);
    if (g.dA && g.dB) {
        site_weights(m, it->dout, it->x, it->xh, N, C, OC, &g, &dr, g.dA, g.dB);
    } else { /* a replicated adapter: as dt_lora_mm_backward_sh */
        const size_t r = (size_t)m->opts.lora.rank;
        const int rep_a = g.dA == NULL;
        const size_t n = rep_a ? r * (size_t)C : (size_t)g.rows * r;
        float *acc = m->lora_red + m->lora_red_off[i], *part = j == 0 ? acc : m->lora_red_part;
        dt_fill(part, 0, n * sizeof(float));
        site_weights(m, it->dout, it->x, it->xh, N, C, OC, &g, &dr, rep_a ? part : g.dA, rep_a ? g.dB : part);
        if (j > 0) dt_tp_add(acc, part, n);
        if (j == dt_tp_local(&m->opts) - 1) {
            dt_tp_sum(m, acc, n);
            float *dst = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, m->site_a[i] + !rep_a, dt_fam_layer(m, l));
            dt_tp_add(dst, acc, n);
        }
    }
    m->lora_drop_on = on, m->lora_drop_seed = seed, m->lora_drop_seq0 = seq0;
}

void dt_lora_mm_forward_sh(dt_model *m, float *out, const float *xf, const uint16_t *xh, int id, int l, int j,
                           int N, int C, int OC) {
    for (int i = 0; i < m->n_sites; i++) {
        site_geo g;
        if (!site_geo_of(m, i, id, l, j, OC, C, 0, &g)) continue;
        const dt_dropout d = drop_of(m, l, i, g.coff);
        site_forward(m, out, xf, xh, N, C, OC, &g, &d);
    }
}

void dt_lora_mm_forward(dt_model *m, float *out, const float *xf, const uint16_t *xh, int id, int l, int N,
                        int C, int OC) {
    dt_lora_mm_forward_sh(m, out, xf, xh, id, l, 0, N, C, OC);
}

void dt_lora_mm_backward_sh(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh,
                            int id, int l, int j, int N, int C, int OC) {
    const size_t r = (size_t)m->opts.lora.rank;
    for (int i = 0; i < m->n_sites; i++) {
        site_geo g;
        if (!site_geo_of(m, i, id, l, j, OC, C, 1, &g)) continue;
        const dt_dropout dr = drop_of(m, l, i, g.coff); /* the forward's masks, regenerated */
        if (g.dA && g.dB) {
            site_backward(m, dinp, dout, xf, xh, N, C, OC, &g, &dr, g.dA, g.dB);
            continue;
        }
        /* a replicated adapter's gradient from this shard's activations: its contribution
         * (from zero), added to the shards' sum in shard order; after the last shard held,
         * summed over the TP group and added to the gradient */
        const int rep_a = g.dA == NULL;
        const size_t n = rep_a ? r * (size_t)C : (size_t)g.rows * r;
        float *acc = m->lora_red + m->lora_red_off[i], *part = j == 0 ? acc : m->lora_red_part;
        dt_fill(part, 0, n * sizeof(float));
        site_backward(m, dinp, dout, xf, xh, N, C, OC, &g, &dr, rep_a ? part : g.dA, rep_a ? g.dB : part);
        if (j > 0) dt_tp_add(acc, part, n);
        if (j == dt_tp_local(&m->opts) - 1) {
            dt_tp_sum(m, acc, n);
            float *dst = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, m->site_a[i] + !rep_a, dt_fam_layer(m, l));
            dt_tp_add(dst, acc, n); /* dst += acc */
        }
    }
}

void dt_lora_mm_backward(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh,
                         int id, int l, int N, int C, int OC) {
    dt_lora_mm_backward_sh(m, dinp, dout, xf, xh, id, l, 0, N, C, OC);
}
