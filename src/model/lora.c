/* LoRA: the adapter store, the frozen base, the adapters' forward and backward (lora.h). */
#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/rng.h"
#include "model/family_impl.h"
#include "ops/ops.h"

static const char *const target_names[DT_LORA_NTARGETS] = {"q", "k", "v", "o", "gate", "up", "down", "w1", "w2", "w3"};
/* Salt of the adapters' init seed: their streams differ from the base's for any seed. */
#define LORA_SEED_SALT 0x4c6f52412d414441ULL

/* QLoRA's NF4 tensors: one per (LAYER matmul tensor, layer, shard held), in one buffer. */
struct dt_lora_nf4 {
    int qid[DT_MODEL_MAX_TENSORS]; /* index of a base tensor among the quantized ones (-1: fp32) */
    int nq, L, nt;                 /* nt: NF4 tensors (each quantized tensor's L x shards held) */
    int first[DT_MODEL_MAX_TENSORS], nb[DT_MODEL_MAX_TENSORS]; /* by base id: its first in t, shards held */
    size_t rows[DT_MODEL_MAX_TENSORS], cols[DT_MODEL_MAX_TENSORS]; /* one shard's shape by base id */
    dt_nf4 *t;                     /* (layer, shard) of each quantized tensor in turn */
    void *buf;
    size_t bytes;
};
typedef struct dt_lora_nf4 nf4_store;

/* Quantized under NF4: the LAYER matmul tensors (embeddings, norms and the lm_head stay fp32). */
static int quantized(const dt_tensor_info *t, const dt_lora_cfg *lora) {
    return lora->nf4 && t->group == DT_PG_LAYER && t->matmul && t->rows > 0; /* not another EP rank's expert */
}

const char *dt_lora_target_name(int t) { return t >= 0 && t < DT_LORA_NTARGETS ? target_names[t] : NULL; }

dt_status dt_lora_parse_targets(dt_ctx *ctx, const char *list, unsigned *out) {
    *out = 0;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && (*p == ' ')) p++, n--;
        while (n && p[n - 1] == ' ') n--;
        int found = -1;
        for (int t = 0; t < DT_LORA_NTARGETS; t++)
            if (strlen(target_names[t]) == n && !strncmp(target_names[t], p, n)) found = t;
        if (found < 0)
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.targets: unknown target '%.*s' (known: q, k, v, o, gate, up, down; w1, w2, w3 "
                           "for a mixture of experts' experts)",
                           (int)n, p);
        *out |= 1u << found;
        if (!e) break;
        p = e + 1;
    }
    if (!*out) return dt_fail(ctx, DT_ERR_CONFIG, "lora.targets: empty (name at least one of q, k, v, o, gate, up, down)");
    return DT_OK;
}

void dt_lora_targets_str(unsigned bits, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int t = 0; t < DT_LORA_NTARGETS; t++)
        if ((bits >> t & 1u) && len < n - 1)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "," : "", target_names[t]);
}

/* The family's sites that lora selects: the dense targets' in target order, then the experts'
 * in the family's order (expert by expert: each expert's adapters adjacent in the store, so an
 * expert-parallel rank's experts are one run of every layer; decision 90). */
static int selected_sites(const dt_model_config *c, const dt_lora_cfg *lora, dt_lora_site *out) {
    const dt_model_family *f = dt_model_family_of(c);
    dt_lora_site all[DT_LORA_MAX_SITES];
    int n = f && f->lora_sites ? f->lora_sites(c, all) : 0, k = 0;
    for (int t = 0; t < DT_LORA_NDENSE; t++)
        for (int i = 0; i < n; i++)
            if ((int)all[i].target == t && (lora->targets >> t & 1u)) out[k++] = all[i];
    for (int i = 0; i < n; i++)
        if (dt_lora_expert_target((int)all[i].target) && (lora->targets >> all[i].target & 1u)) out[k++] = all[i];
    return k;
}

dt_status dt_lora_validate(dt_ctx *ctx, const dt_model_config *c, const dt_lora_cfg *lora) {
    if (lora->rank < 0 || lora->rank > 1024)
        return dt_fail(ctx, DT_ERR_CONFIG, "lora.rank must be in [0, 1024] (0 = off; got %d)", lora->rank);
    if (lora->rank == 0) {
        if (lora->nf4)
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.base_dtype: nf4 needs a LoRA run (lora.rank > 0): only a frozen "
                           "base can be quantized");
        return DT_OK;
    }
    if (!(lora->alpha >= 0.0f && lora->alpha <= 1e6f))
        return dt_fail(ctx, DT_ERR_CONFIG, "lora.alpha must be in [0, 1e6] (0 = rank; got %g)", (double)lora->alpha);
    if (!(lora->dropout >= 0.0f && lora->dropout < 1.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "lora.dropout must be in [0, 1) (got %g)", (double)lora->dropout);
    const dt_model_family *f = dt_model_family_of(c);
    if (!f || !f->lora_sites)
        return dt_fail(ctx, DT_ERR_CONFIG, "lora.rank: the %s family has no LoRA support (gpt2 and llama have)",
                       f ? f->name : c->family);
    if (!lora->targets)
        return dt_fail(ctx, DT_ERR_CONFIG, "lora.targets: empty (name at least one of q, k, v, o, gate, up, down)");
    dt_lora_site all[DT_LORA_MAX_SITES];
    int n = f->lora_sites(c, all);
    for (int t = 0; t < DT_LORA_NTARGETS; t++) {
        if (!(lora->targets >> t & 1u)) continue;
        int has = 0;
        for (int i = 0; i < n; i++) has |= (int)all[i].target == t;
        if (!has && c->n_experts > 0 && (t == DT_LORA_GATE || t == DT_LORA_UP || t == DT_LORA_DOWN))
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.targets: '%s' names a dense MLP projection; with model.n_experts=%d "
                           "name the experts' w1 (gate), w3 (up), w2 (down), as PEFT names Mixtral's (each expert its "
                           "own adapters; the router block_sparse_moe.gate stays frozen)", target_names[t], c->n_experts);
        if (!has && dt_lora_expert_target(t))
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.targets: '%s' adapts a mixture of experts' experts; this %s has "
                           "none (model.n_experts=0: name gate, up, down)", target_names[t], f->name);
        if (!has)
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.targets: %s has no '%s' projection", f->name, target_names[t]);
        if (lora->dropout > 0.0f && dt_lora_expert_target(t))
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.dropout=%g with lora.targets naming %s: dropout on the experts' "
                           "adapters is not built (their rows are gathered by expert; use lora.dropout=0)",
                           (double)lora->dropout, target_names[t]);
    }
    return DT_OK;
}

/* The adapter table (o: tensor parallelism, NULL: none): A and B of every selected site, split
 * like their base (lora.h dt_lora_tp_check): a column-parallel base's B by output rows (one
 * section per base section it covers), a row-parallel base's A by input columns. */
static int adapter_table(const dt_model_config *c, const dt_lora_cfg *lora, const dt_model_opts *o,
                         dt_tensor_info *out) {
    dt_tensor_info base[DT_MODEL_MAX_TENSORS];
    dt_model_tensors(c, base);
    dt_lora_site s[DT_LORA_MAX_SITES];
    int ns = selected_sites(c, lora, s), n = 0;
    const size_t r = (size_t)lora->rank;
    for (int i = 0; i < ns; i++) {
        const dt_tensor_info *bt = &base[s[i].id];
        size_t in = bt->cols, sec = bt->rows / (size_t)(bt->sections > 1 ? bt->sections : 1);
        int sa = bt->split == DT_SPLIT_IN ? DT_SPLIT_IN : DT_SPLIT_NONE;
        int sb = bt->split == DT_SPLIT_OUT ? DT_SPLIT_OUT : DT_SPLIT_NONE;
        out[n++] = (dt_tensor_info){s[i].name_a, s[i].ext_a, DT_PG_LAYER, DT_ELEM_F32, r, in, 0, DT_INIT_NORMAL,
                                    (float)(1.0 / sqrt((double)in)), 1, 0, 0, 0, 0, 0, 0, 0, 0, .split = sa};
        out[n++] = (dt_tensor_info){s[i].name_b, s[i].ext_b, DT_PG_LAYER, DT_ELEM_F32, s[i].rows, r, 0, DT_INIT_ZEROS,
                                    0.0f, 1, 0, 0, 0, 0, 0, 0, 0, 0, .split = sb,
                                    .sections = sb ? (int)(s[i].rows / sec) : 0};
        /* an expert's adapters are the expert's: an expert-parallel rank holds its experts'
         * only (model.c dt_model_stage_table's rule for the base; decision 90) */
        out[n - 2].expert = out[n - 1].expert = bt->expert;
        /* each expert's adapters are a unit of their own, as the expert's weights are (the
         * region expert parallelism keeps apart is whole units: decision 90) */
        out[n - 2].unit_start = bt->expert && (n == 2 || out[n - 3].expert != bt->expert);
        if (bt->expert && o && o->ep > 1 && (bt->expert - 1) / (c->n_experts / o->ep) != o->ep_rank)
            out[n - 2].rows = out[n - 2].file_rows = out[n - 1].rows = out[n - 1].file_rows = 0;
    }
    dt_params_table_tp(out, n, dt_tp_size(o), dt_tp_local(o), dt_tp_first(o));
    return n;
}

/* A pipeline stage's store (model.h pp_l0/pp_l1; decision 74): its layers (of every chunk) and
 * their place among the model's. */
static int store_layers(const dt_model_config *c, const dt_model_opts *o) {
    return dt_stage_chunks(o) * dt_stage_layers(c, o);
}
static void store_map(dt_params *ps, const dt_model_config *c, const dt_model_opts *o) {
    ps->layer0 = dt_store_g0(o);
    if (dt_stage_chunks(o) > 1) ps->lchunk = dt_stage_layers(c, o), ps->lstride = o->pp_stride;
}

dt_status dt_lora_adapters_init(dt_ctx *ctx, dt_params *ps, const dt_model_config *c, const dt_model_opts *o,
                                dt_alloc *alloc, int slabs) {
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = adapter_table(c, &o->lora, o, t); /* layer tensors only: every stage has its layers' */
    DT_CHECK(dt_params_init(ctx, ps, t, n, store_layers(c, o), alloc, slabs));
    ps->seed_salt = LORA_SEED_SALT;
    store_map(ps, c, o);
    return DT_OK;
}

/* The family table as the base store holds it: cut to o's shards (the vocabulary padded for
 * them), a pipeline stage's tensors only (model.h dt_model_stage_table: its layer range was
 * checked by the model's own table). */
static int base_table(const dt_model_config *c, const dt_model_opts *o, dt_tensor_info *t) {
    int n = dt_model_tensors_tp(c, o, t);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    (void)dt_model_stage_table(&ctx, c, o, t, n);
    return n;
}

dt_status dt_lora_base_init(dt_ctx *ctx, dt_params *base, const dt_model_config *c, const dt_model_opts *o,
                            dt_alloc *alloc, int slabs) {
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = base_table(c, o, t);
    size_t cap = dt_params_table_unit_max(t, n); /* the full layout's: the vocabulary chunks stay its */
    for (int i = 0; i < n; i++)
        if (quantized(&t[i], &o->lora)) /* held as NF4 outside the slab: an empty tensor keeping its unit (an
                                           expert's too: params.c leaves out only another EP rank's) */
            t[i].rows = t[i].file_rows = 0, t[i].expert = 0;
    DT_CHECK(dt_params_init_cap(ctx, base, t, n, store_layers(c, o), alloc, slabs, cap));
    store_map(base, c, o);
    return DT_OK;
}

dt_status dt_lora_tp_check(dt_ctx *ctx, const dt_model_config *c, const dt_model_opts *o) {
    const int k = dt_tp_size(o);
    if (k <= 1 || !o->lora.nf4) return DT_OK;
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(c, t);
    for (int i = 0; i < n; i++) {
        if (!quantized(&t[i], &o->lora) || !t[i].split) continue;
        /* a shard's slice of the unsplit tensor, read flat: whole NF4 blocks, so its blocks (and
         * absmaxes) are the unsplit tensor's own (only their double quantization is the shard's) */
        size_t S = t[i].sections > 1 ? (size_t)t[i].sections : 1;
        size_t run = t[i].split == DT_SPLIT_IN ? t[i].cols / (size_t)k : t[i].rows / S / (size_t)k * t[i].cols;
        if (run % DT_NF4_BLOCK) {
            char name[160];
            snprintf(name, sizeof name, t[i].name, 0);
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.base_dtype=nf4 with parallel.tp=%d: a shard of %s is runs of %zu "
                           "elements, not whole NF4 blocks of %d (each shard is quantized alone); choose a parallel.tp "
                           "or model width whose shards are multiples of %d elements", k, name, run, DT_NF4_BLOCK,
                           DT_NF4_BLOCK);
        }
    }
    return DT_OK;
}

size_t dt_lora_num_params(const dt_model_config *c, const dt_lora_cfg *lora) {
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = adapter_table(c, lora, NULL, t);
    size_t s = 0;
    for (int i = 0; i < n; i++) s += t[i].rows * t[i].cols;
    return s * (size_t)c->n_layer;
}

size_t dt_lora_expert_floats(const dt_model_config *c, const dt_lora_cfg *lora) {
    if (!lora || lora->rank <= 0 || c->n_experts <= 0) return 0;
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = adapter_table(c, lora, NULL, t);
    size_t s = 0;
    for (int i = 0; i < n; i++) s += t[i].expert ? t[i].rows * t[i].cols : 0;
    return s / (size_t)c->n_experts;
}

double dt_lora_flops_per_token(const dt_model_config *c, const dt_lora_cfg *lora, int T) {
    double f = dt_model_flops_per_token(c, T);
    if (!lora || lora->rank <= 0) return f;
    /* flops at T = 0 are the 6 N part (the attention term grows with T); a token passes
     * through experts_topk of the n_experts experts' adapters */
    const double ex = (double)dt_lora_expert_floats(c, lora) * (double)c->n_experts * (double)c->n_layer;
    const double act = c->n_experts > 0 ? ex * (double)c->experts_topk / (double)c->n_experts : 0.0;
    return f - dt_model_flops_per_token(c, 0) / 3.0 + 6.0 * ((double)dt_lora_num_params(c, lora) - ex + act);
}

/* The adapters' activations at base (NULL: only count) under o; returns their floats. red_off
 * (NULL: not wanted): each site's offset into *red. */
static size_t lora_acts(const dt_model_config *c, const dt_model_opts *o, int B, int T, float *base, float **u,
                        float **du, float **mm, float **red, float **part, size_t *red_off) {
    const dt_lora_cfg *lora = o ? &o->lora : NULL;
    if (!lora || lora->rank <= 0) return 0;
    size_t off = 0, n = (size_t)B * T * (size_t)lora->rank, rows = 0;
    *u = dt_act_take(base, &off, n);  /* x A^T */
    *du = dt_act_take(base, &off, n); /* its gradient */
    if (lora->nf4) {
        dt_tensor_info t[DT_MODEL_MAX_TENSORS];
        int nt = dt_model_tensors(c, t);
        for (int i = 0; i < nt; i++)
            if (quantized(&t[i], lora) && t[i].rows > rows) rows = t[i].rows;
    }
    *mm = dt_act_take(base, &off, (size_t)B * T * rows); /* one NF4 GEMM of a fused call */
    /* tensor parallelism: the replicated adapters' gradient contributions (lora_mm.c) */
    size_t sum = 0, mx = 0;
    if (dt_tp_size(o) > 1) {
        dt_tensor_info t[DT_MODEL_MAX_TENSORS];
        int nt = adapter_table(c, lora, NULL, t);
        for (int i = 0; 2 * i + 1 < nt; i++) {
            const dt_tensor_info *rep = t[2 * i].split ? &t[2 * i + 1] : t[2 * i + 1].split ? &t[2 * i] : NULL;
            size_t e = rep ? (rep->rows * rep->cols + 15) / 16 * 16 : 0;
            if (red_off) red_off[i] = sum;
            sum += e, mx = e > mx ? e : mx;
        }
    }
    *red = dt_act_take(base, &off, sum);
    *part = dt_act_take(base, &off, mx);
    return off;
}

size_t dt_lora_act_floats(const dt_model_config *c, const dt_model_opts *o, int B, int T) {
    float *u, *du, *mm, *red, *part;
    return lora_acts(c, o, B, T, NULL, &u, &du, &mm, &red, &part, NULL);
}

void dt_lora_bind(dt_model *m, float *base) {
    lora_acts(&m->cfg, &m->opts, m->B, m->T, base, &m->lora_u, &m->lora_du, &m->lora_mm, &m->lora_red,
              &m->lora_red_part, m->lora_red_off);
}

/* Sink floats: one copy of every non-matmul tensor (norm weights and biases, gpt2's position
 * embedding), each at its own offset (a kernel may write two of them at once). */
static size_t sink_layout(const dt_tensor_info *t, int n, size_t *off) {
    size_t s = 0;
    for (int i = 0; i < n; i++) {
        if (off) off[i] = s;
        if (!t[i].matmul) s += (t[i].rows * t[i].cols + 15) / 16 * 16;
    }
    return s;
}

/* Shards of table row t held (1 when it is not split). */
static size_t shards_held(const dt_tensor_info *t) { return t->tp_k > 1 && t->split ? (size_t)t->tp_nb : 1; }

static size_t nf4_bytes_of(const dt_tensor_info *t, int n, int L, const dt_lora_cfg *lora) {
    size_t b = 0;
    for (int i = 0; i < n; i++)
        if (quantized(&t[i], lora))
            b += (size_t)L * shards_held(&t[i]) * ((dt_nf4_bytes(dt_tensor_shard_len(&t[i])) + 63) / 64 * 64);
    return b;
}

void dt_lora_plan(const dt_model_config *c, const dt_model_opts *o, size_t bytes[DT_MEM_NKINDS]) {
    const dt_lora_cfg *lora = o ? &o->lora : NULL;
    if (!lora || lora->rank <= 0) return;
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = base_table(c, o, t);
    size_t f32 = 0;
    const int L = store_layers(c, o); /* a pipeline stage's */
    for (int i = 0; i < n; i++)
        if (!quantized(&t[i], lora)) f32 += t[i].rows * t[i].cols * (t[i].group == DT_PG_LAYER ? (size_t)L : 1);
    bytes[DT_MEM_PARAMS] += f32 * sizeof(float) + nf4_bytes_of(t, n, L, lora);
    bytes[DT_MEM_OTHER] += sink_layout(t, n, NULL) * sizeof(float);
    if (lora->nf4) {
        int nq = 0;
        for (int i = 0; i < n; i++) nq += quantized(&t[i], lora) ? (int)shards_held(&t[i]) : 0;
        bytes[DT_MEM_OTHER] += sizeof(nf4_store) + (size_t)nq * L * sizeof(dt_nf4);
    }
}

/* ------------------------------------------------------------------ the model */

dt_status dt_lora_model_init(dt_ctx *ctx, dt_model *m, dt_alloc *alloc, int slabs) {
    const dt_lora_cfg *lora = &m->opts.lora;
    DT_CHECK(dt_lora_validate(ctx, &m->cfg, lora));
    m->lora = 1;
    m->lora_open = -1;
    m->lora_scale = (lora->alpha > 0.0f ? lora->alpha : (float)lora->rank) / (float)lora->rank;
    DT_CHECK(dt_lora_base_init(ctx, &m->base, &m->cfg, &m->opts, alloc, DT_SLAB_PARAMS));
    DT_CHECK(dt_lora_adapters_init(ctx, &m->ps, &m->cfg, &m->opts, alloc, slabs));
    m->n_sites = selected_sites(&m->cfg, lora, m->sites);
    for (int i = 0; i < m->n_sites; i++) m->site_a[i] = 2 * i;
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = base_table(&m->cfg, &m->opts, t);
    m->lora_sink_len = sink_layout(t, n, m->lora_sink_off);
    DT_CHECK(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, m->lora_sink_len * sizeof(float), (void **)&m->lora_sink));
    if (!lora->nf4) return DT_OK;
    const int L = store_layers(&m->cfg, &m->opts);
    nf4_store *q;
    int nq = 0;
    for (int i = 0; i < n; i++) nq += quantized(&t[i], lora) ? (int)shards_held(&t[i]) : 0;
    size_t meta = sizeof(nf4_store) + (size_t)nq * L * sizeof(dt_nf4);
    DT_CHECK(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, meta, (void **)&q));
    memset(q, 0, meta);
    m->lora_q = q;
    q->t = (dt_nf4 *)(q + 1);
    q->L = L;
    q->bytes = nf4_bytes_of(t, n, L, lora);
    DT_CHECK(dt_alloc_get(ctx, alloc, DT_MEM_PARAMS, q->bytes, &q->buf));
    dt_fill(q->buf, 0, q->bytes);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        q->qid[i] = -1;
        q->nb[i] = (int)shards_held(&t[i]);
        q->rows[i] = t[i].rows / (size_t)q->nb[i], q->cols[i] = t[i].cols; /* one shard's */
        if (!quantized(&t[i], lora)) continue;
        q->qid[i] = q->nq++;
        q->first[i] = q->nt;
        size_t e = dt_tensor_shard_len(&t[i]);
        for (int c = 0; c < L * q->nb[i]; c++) {
            dt_nf4_bind(&q->t[q->nt++], (char *)q->buf + off, e);
            off += (dt_nf4_bytes(e) + 63) / 64 * 64;
        }
    }
    return DT_OK;
}

void dt_lora_model_free(dt_model *m) {
    if (!m->lora) return;
    dt_alloc *a = m->alloc;
    if (m->lora_q) {
        nf4_store *q = m->lora_q;
        dt_alloc_put(a, DT_MEM_PARAMS, q->buf, q->bytes);
        dt_alloc_put(a, DT_MEM_OTHER, q, sizeof(nf4_store) + (size_t)q->nt * sizeof(dt_nf4));
    }
    if (m->lora_sink) dt_alloc_put(a, DT_MEM_OTHER, m->lora_sink, m->lora_sink_len * sizeof(float));
    dt_params_free(&m->base);
}

const dt_nf4 *dt_lora_nf4_sh(const dt_model *m, int id, int l, int j) {
    const nf4_store *q = m->lora_q;
    if (!q || q->qid[id] < 0) return NULL;
    return &q->t[q->first[id] + l * q->nb[id] + j];
}

const dt_nf4 *dt_lora_nf4(const dt_model *m, int id, int l) { return dt_lora_nf4_sh(m, id, l, 0); }

size_t dt_lora_full_floats(const dt_model *m) {
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(&m->cfg, t);
    size_t s = 0;
    for (int i = 0; i < n; i++) s += t[i].rows * t[i].cols * (t[i].group == DT_PG_LAYER ? (size_t)m->cfg.n_layer : 1);
    return s;
}

/* The family table's layout (no slabs), for reading full copies. */
static dt_status full_layout(dt_ctx *ctx, const dt_model *m, dt_alloc *a, dt_params *full) {
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(&m->cfg, t);
    dt_alloc_init(a);
    return dt_params_init(ctx, full, t, n, m->cfg.n_layer, a, 0);
}

dt_status dt_lora_set_base_tensor(dt_ctx *ctx, dt_model *m, int id, int l, const float *w) {
    const dt_tensor_info *t = &m->base.tensors[id];
    const int tp = t->tp_k > 1 && t->split; /* the shards held: slices of the unsplit tensor */
    if (!dt_lora_nf4(m, id, l)) {
        float *dst = dt_params_tensor(&m->base, m->base.params, id, l);
        const size_t e = t->rows * t->cols;
        if (!tp) {
            dt_copy(dst, w, e * sizeof(float));
            return DT_OK;
        }
        for (size_t i = 0; i < e;) { /* runs of consecutive canonical indices */
            size_t gi;
            int sh;
            size_t run = dt_params_global_run(t, i, &gi, &sh);
            dt_copy(dst + i, w + gi, run * sizeof(float));
            i += run;
        }
        return DT_OK;
    }
    /* NF4: each shard held quantized alone from its slice (dt_lora_tp_check: whole blocks) */
    const nf4_store *q = m->lora_q;
    const size_t e = q->rows[id] * q->cols[id];
    float *buf = malloc(e * sizeof(float));
    if (!buf) return dt_fail(ctx, DT_ERR_NOMEM, "lora: out of memory quantizing the base");
    char name[200];
    dt_status st = DT_OK;
    for (int j = 0; j < q->nb[id] && st == DT_OK; j++) {
        size_t len = 0;
        dt_params_name(&m->base, id, l, name, sizeof name);
        if (tp) len = strlen(name), snprintf(name + len, sizeof name - len, " (tensor-parallel shard %d)", t->tp_first + j);
        for (size_t i = 0; i < e; i++) {
            int sh;
            buf[i] = tp ? w[dt_params_global_index(t, (size_t)j * e + i, &sh)] : w[i];
        }
        st = dt_nf4_quantize(ctx, name, (dt_nf4 *)dt_lora_nf4_sh(m, id, l, j), buf, e);
    }
    free(buf);
    return st;
}

/* The base store's layer holding the model's layer g of tensor id (a pipeline stage's), or -1:
 * the stage holds neither the layer nor, for a PRE or POST tensor, the tensor. */
int dt_lora_base_layer(const dt_model *m, int id, int g) {
    const dt_tensor_info *t = &m->base.tensors[id];
    if (t->group != DT_PG_LAYER) return dt_tensor_absent(t) && !dt_lora_nf4(m, id, 0) ? -1 : 0;
    return dt_params_local_layer(&m->base, g);
}

dt_status dt_lora_set_base(dt_ctx *ctx, dt_model *m, const float *src) {
    dt_alloc a;
    dt_params full;
    DT_CHECK(full_layout(ctx, m, &a, &full));
    dt_status st = DT_OK;
    for (int id = 0; id < full.n_tensors && st == DT_OK; id++)
        for (int l = 0; l < dt_params_copies(&full, id) && st == DT_OK; l++) {
            const int hl = dt_lora_base_layer(m, id, l); /* the full model's layer l: this stage's? */
            if (hl >= 0) st = dt_lora_set_base_tensor(ctx, m, id, hl, dt_params_tensor(&full, (float *)src, id, l));
        }
    dt_params_free(&full);
    return st;
}

/* The fp32 tensors drawn in place (a shard draws its canonical indices: the slice of the
 * unsplit initialisation); a quantized tensor drawn alone in its unsplit shape (its fp32
 * values never all at once), then quantized: the values of the fp32 base of the same seed. */
dt_status dt_lora_init_base(dt_ctx *ctx, dt_model *m, uint64_t seed) {
    dt_params_init_range(&m->base, seed, m->base.params, 0, m->base.n_params);
    if (!m->lora_q) return DT_OK;
    dt_alloc a;
    dt_params full;
    DT_CHECK(full_layout(ctx, m, &a, &full));
    dt_status st = DT_OK;
    for (int id = 0; id < full.n_tensors && st == DT_OK; id++) {
        if (!dt_lora_nf4(m, id, 0)) continue;
        size_t e = full.tensors[id].rows * full.tensors[id].cols;
        float *w = malloc(e * sizeof(float));
        if (!w) st = dt_fail(ctx, DT_ERR_NOMEM, "lora: out of memory quantizing the base");
        for (int l = 0; l < dt_params_copies(&full, id) && st == DT_OK; l++) {
            const int hl = dt_lora_base_layer(m, id, l);
            if (hl < 0) continue;
            dt_params_init_range(&full, seed, w, dt_params_flat(&full, id, l), e);
            st = dt_lora_set_base_tensor(ctx, m, id, hl, w);
        }
        free(w);
    }
    dt_params_free(&full);
    return st;
}

/* XXH3-64 of shard j's part of the base (tensor parallelism): every tensor in store order (a
 * replicated one whole), its NF4 tensors' bytes in their place. */
static uint64_t shard_hash(const dt_model *m, int j) {
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    const dt_params *b = &m->base;
    for (int id = 0; id < b->n_tensors; id++)
        for (int l = 0; l < dt_params_copies(b, id); l++) {
            const dt_tensor_info *t = &b->tensors[id];
            const dt_nf4 *q = dt_lora_nf4_sh(m, id, l, j);
            if (q) {
                XXH3_64bits_update(s, q->offset, dt_nf4_bytes(q->n)); /* the views lie in one buffer from offset */
                continue;
            }
            size_t len = dt_tensor_shard_len(t), off = t->tp_k > 1 && t->split ? (size_t)j * len : 0;
            XXH3_64bits_update(s, dt_params_tensor(b, b->params, id, l) + off, len * sizeof(float));
        }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

/* Expert parallelism: every EP rank's n values (ep x n <= DT_MOE_MAX_EXPERTS) in rank order
 * into all (a collective over m->ep_ops: its all-to-all sends each rank the same floats). */
static void ep_allgather_u64(dt_model *m, const uint64_t *v, int n, uint64_t *all) {
    const int P = m->opts.ep;
    float mine[2 * DT_MOE_MAX_EXPERTS], got[2 * DT_MOE_MAX_EXPERTS];
    size_t sc[DT_MOE_MAX_EXPERTS], sd[DT_MOE_MAX_EXPERTS], rc[DT_MOE_MAX_EXPERTS], rd[DT_MOE_MAX_EXPERTS];
    memcpy(mine, v, (size_t)n * sizeof *v);
    for (int d = 0; d < P; d++) sc[d] = rc[d] = 2 * (size_t)n, sd[d] = 0, rd[d] = 2 * (size_t)n * (size_t)d;
    if (!m->ep_ops.alltoallv || m->ep_ops.alltoallv(m->ep_ops.ud, mine, sc, sd, got, rc, rd, sizeof(float))) {
        m->ep_failed = 1;
        memset(got, 0, sizeof got);
    }
    memcpy(all, got, (size_t)P * (size_t)n * sizeof *all);
}

/* XXH3-64 of the base tensors of one expert (1 + its index; 0: the tensors of no expert), in
 * store order: an fp32 tensor's values, an NF4 one's bytes. */
static uint64_t part_hash(const dt_model *m, const dt_tensor_info *fam, int expert) {
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    const dt_params *b = &m->base;
    for (int id = 0; id < b->n_tensors; id++) {
        if (fam[id].expert != expert) continue; /* the family's (an NF4 base tensor's own is cleared) */
        for (int l = 0; l < dt_params_copies(b, id); l++) {
            const dt_nf4 *q = dt_lora_nf4(m, id, l);
            if (q) XXH3_64bits_update(s, q->offset, dt_nf4_bytes(q->n));
            else XXH3_64bits_update(s, dt_params_tensor(b, b->params, id, l), b->tensors[id].rows * b->tensors[id].cols * sizeof(float));
        }
    }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

/* A mixture of experts' base: the XXH3-64 of [the hash of the tensors of no expert, expert 0's,
 * ..., expert E-1's], each expert's formed by its owner (expert parallelism: gathered over the
 * EP group), so every ep and every rank agree (an NF4 expert is quantized whole: decision 90). */
static uint64_t moe_hash(dt_model *m) {
    const int E = m->cfg.n_experts, P = m->opts.ep > 1 ? m->opts.ep : 1, El = E / P, e0 = P > 1 ? m->opts.ep_rank * El : 0;
    uint64_t h[1 + DT_MOE_MAX_EXPERTS], mine[DT_MOE_MAX_EXPERTS];
    dt_tensor_info fam[DT_MODEL_MAX_TENSORS];
    dt_model_tensors(&m->cfg, fam);
    h[0] = part_hash(m, fam, 0);
    for (int j = 0; j < El; j++) mine[j] = part_hash(m, fam, e0 + j + 1);
    if (P > 1) ep_allgather_u64(m, mine, El, h + 1);
    else memcpy(h + 1, mine, (size_t)E * sizeof *mine);
    return XXH3_64bits(h, (size_t)(1 + E) * sizeof *h);
}

uint64_t dt_lora_base_hash(dt_model *m) {
    const int k = dt_tp_size(&m->opts);
    if (m->cfg.n_experts > 0 && k <= 1) return moe_hash(m);
    if (k > 1) {
        const int nb = dt_tp_local(&m->opts), first = dt_tp_first(&m->opts);
        float *hs = calloc(2 * (size_t)k, sizeof(float)); /* rank r's hash in floats 2r, 2r + 1 (bits) */
        if (!hs) return 0;
        for (int j = 0; j < nb; j++) {
            uint64_t h = shard_hash(m, j);
            memcpy(hs + 2 * (first + j), &h, sizeof h);
        }
        if (nb < k && m->tp_ops.allgather && m->tp_ops.allgather(m->tp_ops.ud, hs, 2)) m->tp_failed = 1;
        uint64_t h = XXH3_64bits(hs, 2 * (size_t)k * sizeof(float));
        free(hs);
        return h;
    }
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, m->base.params, m->base.n_params * sizeof(float));
    if (m->lora_q) XXH3_64bits_update(s, m->lora_q->buf, m->lora_q->bytes);
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Shard j's part of the fingerprint: its elements of every tensor (replicated ones: shard 0). */
static uint64_t shard_fingerprint(const dt_model *m, int j, int first) {
    const dt_params *b = &m->base;
    uint64_t sum = 0;
    for (int id = 0; id < b->n_tensors; id++) {
        const dt_tensor_info *t = &b->tensors[id];
        const int split = t->tp_k > 1 && t->split;
        if (!split && first + j != 0) continue;
        const size_t len = dt_tensor_shard_len(t), off = split ? (size_t)j * len : 0;
        /* the vocabulary's padding rows (their number depends on tp) are not the model */
        const size_t end = split ? t->g_file_rows * t->g_cols : t->file_rows * t->cols;
        /* a pipeline's: the model's layers; the last stage's copy of a tied embedding is the
         * first stage's tensor (counted there) */
        if (id == dt_model_tied_head(b->tensors, b->n_tensors) && !dt_store_first(&m->opts)) continue;
        /* expert parallelism: a tensor every EP rank holds is EP rank 0's, an expert its owner's */
        if (m->opts.ep > 1 && !t->expert && m->opts.ep_rank != 0) continue;
        for (int l = 0; l < dt_params_copies(b, id); l++) {
            const float *w = dt_params_tensor(b, b->params, id, l) + off;
            const int gl = t->group == DT_PG_LAYER ? dt_params_layer(b, l) : l;
            const uint64_t key = mix64(((uint64_t)id << 32) ^ (uint64_t)gl);
            for (size_t i = 0; i < len; i++) {
                int sh;
                const size_t gi = dt_params_global_index(t, off + i, &sh);
                if (gi >= end) continue;
                uint32_t bits;
                memcpy(&bits, &w[i], sizeof bits);
                sum += mix64(key ^ mix64(((uint64_t)gi << 32) ^ bits));
            }
        }
    }
    return sum;
}

uint64_t dt_lora_base_fingerprint(dt_model *m) {
    if (m->lora_q) return 0;
    const int k = dt_tp_size(&m->opts), nb = dt_tp_local(&m->opts), first = dt_tp_first(&m->opts);
    float hs[2 * 64] = {0}; /* shard r's part in floats 2r, 2r + 1 (bits; k <= 64: parallel.c) */
    for (int j = 0; j < nb; j++) {
        uint64_t h = shard_fingerprint(m, j, first);
        memcpy(hs + 2 * (first + j), &h, sizeof h);
    }
    if (nb < k && m->tp_ops.allgather && m->tp_ops.allgather(m->tp_ops.ud, hs, 2)) m->tp_failed = 1;
    uint64_t sum = 0;
    for (int r = 0; r < k; r++) {
        uint64_t h;
        memcpy(&h, hs + 2 * r, sizeof h);
        sum += h;
    }
    if (m->opts.ep > 1) { /* the EP group's parts (tp = 1 under expert parallelism) */
        uint64_t all[DT_MOE_MAX_EXPERTS];
        ep_allgather_u64(m, &sum, 1, all);
        sum = 0;
        for (int r = 0; r < m->opts.ep; r++) sum += all[r];
    }
    return sum ? sum : 1; /* 0 means "none" */
}

int dt_lora_unit(const dt_model *m, int u, int *first) {
    /* by index, not offset: an NF4 base's all-matmul units are empty, so their offsets are
     * the next unit's */
    const dt_params *b = &m->base;
    if (first) *first = 0;
    int k = u - b->n_pre_units;
    if (u < 0 || k < 0 || k >= b->n_layer * b->layer_units) return -1;
    const int l = k / b->layer_units;
    if (m->ps.layer_units > 1) { /* experts' adapters: each expert's unit maps to its adapters' */
        size_t off;
        for (int i = 0; i < m->n_sites; i++)
            if (m->ps.tensors[m->site_a[i]].expert && dt_params_unit_of(b, m->sites[i].id, l, &off) == u) {
                if (first) *first = 1;
                return dt_params_unit_of(&m->ps, m->site_a[i], l, &off);
            }
        if (m->n_sites && m->ps.tensors[m->site_a[0]].expert) return -1; /* no dense adapters */
    }
    if (first) *first = k % b->layer_units == 0;
    return DT_UNIT_LAYER(&m->ps, l);
}
