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

static const char *const target_names[DT_LORA_NTARGETS] = {"q", "k", "v", "o", "gate", "up", "down"};
/* Salt of the adapters' init seed: their streams differ from the base's for any seed. */
#define LORA_SEED_SALT 0x4c6f52412d414441ULL
/* Salt of the dropout masks' streams. */
#define LORA_DROP_SALT 0x4c6f524144726f70ULL

/* QLoRA's NF4 tensors: one per (LAYER matmul tensor, layer), in one buffer. */
struct dt_lora_nf4 {
    int qid[DT_MODEL_MAX_TENSORS]; /* index of a base tensor among the quantized ones (-1: fp32) */
    int nq, L;
    size_t rows[DT_MODEL_MAX_TENSORS], cols[DT_MODEL_MAX_TENSORS]; /* shapes by base id */
    dt_nf4 *t;                     /* (nq x L) */
    void *buf;
    size_t bytes;
};
typedef struct dt_lora_nf4 nf4_store;

/* Quantized under NF4: the LAYER matmul tensors (embeddings, norms and the lm_head stay fp32). */
static int quantized(const dt_tensor_info *t, const dt_lora_cfg *lora) {
    return lora->nf4 && t->group == DT_PG_LAYER && t->matmul;
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
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.targets: unknown target '%.*s' (known: q, k, v, o, gate, up, down)",
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

/* The family's sites that lora selects, in target order. */
static int selected_sites(const dt_model_config *c, const dt_lora_cfg *lora, dt_lora_site *out) {
    const dt_model_family *f = dt_model_family_of(c);
    dt_lora_site all[DT_LORA_MAX_SITES];
    int n = f && f->lora_sites ? f->lora_sites(c, all) : 0, k = 0;
    for (int t = 0; t < DT_LORA_NTARGETS; t++)
        for (int i = 0; i < n; i++)
            if ((int)all[i].target == t && (lora->targets >> t & 1u)) out[k++] = all[i];
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
        if (!has)
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.targets: %s has no '%s' projection", f->name, target_names[t]);
    }
    return DT_OK;
}

static int adapter_table(const dt_model_config *c, const dt_lora_cfg *lora, dt_tensor_info *out) {
    dt_tensor_info base[DT_MODEL_MAX_TENSORS];
    dt_model_tensors(c, base);
    dt_lora_site s[DT_LORA_MAX_SITES];
    int ns = selected_sites(c, lora, s), n = 0;
    const size_t r = (size_t)lora->rank;
    for (int i = 0; i < ns; i++) {
        size_t in = base[s[i].id].cols;
        out[n++] = (dt_tensor_info){s[i].name_a, s[i].ext_a, DT_PG_LAYER, DT_ELEM_F32, r, in, 0, DT_INIT_NORMAL,
                                    (float)(1.0 / sqrt((double)in)), 1, 0, 0, 0, 0, 0, 0, 0, 0, .split = 0};
        out[n++] = (dt_tensor_info){s[i].name_b, s[i].ext_b, DT_PG_LAYER, DT_ELEM_F32, s[i].rows, r, 0, DT_INIT_ZEROS,
                                    0.0f, 1, 0, 0, 0, 0, 0, 0, 0, 0, .split = 0};
    }
    return n;
}

dt_status dt_lora_adapters_init(dt_ctx *ctx, dt_params *ps, const dt_model_config *c, const dt_lora_cfg *lora,
                                dt_alloc *alloc, int slabs) {
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = adapter_table(c, lora, t);
    DT_CHECK(dt_params_init(ctx, ps, t, n, c->n_layer, alloc, slabs));
    ps->seed_salt = LORA_SEED_SALT;
    return DT_OK;
}


dt_status dt_lora_base_init(dt_ctx *ctx, dt_params *base, const dt_model_config *c, const dt_lora_cfg *lora,
                            dt_alloc *alloc, int slabs) {
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(c, t);
    size_t cap = dt_params_table_unit_max(t, n); /* the full layout's: the vocabulary chunks stay its */
    for (int i = 0; i < n; i++)
        if (quantized(&t[i], lora)) t[i].rows = t[i].file_rows = 0; /* held as NF4 outside the slab */
    return dt_params_init_cap(ctx, base, t, n, c->n_layer, alloc, slabs, cap);
}

size_t dt_lora_num_params(const dt_model_config *c, const dt_lora_cfg *lora) {
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = adapter_table(c, lora, t);
    size_t s = 0;
    for (int i = 0; i < n; i++) s += t[i].rows * t[i].cols;
    return s * (size_t)c->n_layer;
}

double dt_lora_flops_per_token(const dt_model_config *c, const dt_lora_cfg *lora, int T) {
    double f = dt_model_flops_per_token(c, T);
    if (!lora || lora->rank <= 0) return f;
    /* flops at T = 0 are the 6 N part (the attention term grows with T) */
    return f - dt_model_flops_per_token(c, 0) / 3.0 + 6.0 * (double)dt_lora_num_params(c, lora);
}

/* The adapters' activations at base (NULL: only count); returns their floats. */
static size_t lora_acts(const dt_model_config *c, const dt_lora_cfg *lora, int B, int T, float *base, float **u,
                        float **du, float **mm) {
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
    return off;
}

size_t dt_lora_act_floats(const dt_model_config *c, const dt_lora_cfg *lora, int B, int T) {
    float *u, *du, *mm;
    return lora_acts(c, lora, B, T, NULL, &u, &du, &mm);
}

void dt_lora_bind(dt_model *m, float *base) {
    lora_acts(&m->cfg, &m->opts.lora, m->B, m->T, base, &m->lora_u, &m->lora_du, &m->lora_mm);
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

static size_t nf4_bytes_of(const dt_tensor_info *t, int n, int L, const dt_lora_cfg *lora) {
    size_t b = 0;
    for (int i = 0; i < n; i++)
        if (quantized(&t[i], lora)) b += (size_t)L * ((dt_nf4_bytes(t[i].rows * t[i].cols) + 63) / 64 * 64);
    return b;
}

void dt_lora_plan(const dt_model_config *c, const dt_lora_cfg *lora, size_t bytes[DT_MEM_NKINDS]) {
    if (!lora || lora->rank <= 0) return;
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(c, t);
    size_t f32 = 0;
    for (int i = 0; i < n; i++)
        if (!quantized(&t[i], lora)) f32 += t[i].rows * t[i].cols * (t[i].group == DT_PG_LAYER ? (size_t)c->n_layer : 1);
    bytes[DT_MEM_PARAMS] += f32 * sizeof(float) + nf4_bytes_of(t, n, c->n_layer, lora);
    bytes[DT_MEM_OTHER] += sink_layout(t, n, NULL) * sizeof(float);
    if (lora->nf4) {
        int nq = 0;
        for (int i = 0; i < n; i++) nq += quantized(&t[i], lora);
        bytes[DT_MEM_OTHER] += sizeof(nf4_store) + (size_t)nq * c->n_layer * sizeof(dt_nf4);
    }
}

/* ------------------------------------------------------------------ the model */

dt_status dt_lora_model_init(dt_ctx *ctx, dt_model *m, dt_alloc *alloc, int slabs) {
    const dt_lora_cfg *lora = &m->opts.lora;
    DT_CHECK(dt_lora_validate(ctx, &m->cfg, lora));
    m->lora = 1;
    m->lora_open = -1;
    m->lora_scale = (lora->alpha > 0.0f ? lora->alpha : (float)lora->rank) / (float)lora->rank;
    DT_CHECK(dt_lora_base_init(ctx, &m->base, &m->cfg, lora, alloc, DT_SLAB_PARAMS));
    DT_CHECK(dt_lora_adapters_init(ctx, &m->ps, &m->cfg, lora, alloc, slabs));
    m->n_sites = selected_sites(&m->cfg, lora, m->sites);
    for (int i = 0; i < m->n_sites; i++) m->site_a[i] = 2 * i;
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(&m->cfg, t);
    m->lora_sink_len = sink_layout(t, n, m->lora_sink_off);
    DT_CHECK(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, m->lora_sink_len * sizeof(float), (void **)&m->lora_sink));
    if (!lora->nf4) return DT_OK;
    const int L = m->cfg.n_layer;
    nf4_store *q;
    int nq = 0;
    for (int i = 0; i < n; i++) nq += quantized(&t[i], lora);
    size_t meta = sizeof(nf4_store) + (size_t)nq * L * sizeof(dt_nf4);
    DT_CHECK(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, meta, (void **)&q));
    memset(q, 0, meta);
    m->lora_q = q;
    q->t = (dt_nf4 *)(q + 1);
    q->L = L;
    q->bytes = nf4_bytes_of(t, n, L, lora);
    DT_CHECK(dt_alloc_get(ctx, alloc, DT_MEM_PARAMS, q->bytes, &q->buf));
    memset(q->buf, 0, q->bytes);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        q->qid[i] = -1;
        q->rows[i] = t[i].rows, q->cols[i] = t[i].cols;
        if (!quantized(&t[i], lora)) continue;
        q->qid[i] = q->nq++;
        size_t e = t[i].rows * t[i].cols;
        for (int l = 0; l < L; l++) {
            dt_nf4_bind(&q->t[(size_t)q->qid[i] * L + l], (char *)q->buf + off, e);
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
        dt_alloc_put(a, DT_MEM_OTHER, q, sizeof(nf4_store) + (size_t)q->nq * q->L * sizeof(dt_nf4));
    }
    if (m->lora_sink) dt_alloc_put(a, DT_MEM_OTHER, m->lora_sink, m->lora_sink_len * sizeof(float));
    dt_params_free(&m->base);
}

const dt_nf4 *dt_lora_nf4(const dt_model *m, int id, int l) {
    const nf4_store *q = m->lora_q;
    if (!q || q->qid[id] < 0) return NULL;
    return &q->t[(size_t)q->qid[id] * q->L + l];
}

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

/* One copy (id, l) of a base tensor of e floats: q its NF4 tensor, or NULL and dst its place
 * in the fp32 slab; full is the family table's flat layout (offsets, names). */
typedef dt_status (*base_copy_fn)(dt_ctx *ctx, const dt_params *full, int id, int l, dt_nf4 *q, float *dst,
                                  size_t e, const void *ud);

/* Calls fill on every copy of every base tensor in the table's order; stops at the first error. */
static dt_status walk_base(dt_ctx *ctx, dt_model *m, base_copy_fn fill, const void *ud) {
    dt_alloc a;
    dt_params full;
    DT_CHECK(full_layout(ctx, m, &a, &full));
    dt_status st = DT_OK;
    for (int id = 0; id < full.n_tensors && st == DT_OK; id++) {
        size_t e = full.tensors[id].rows * full.tensors[id].cols;
        for (int l = 0; l < dt_params_copies(&full, id) && st == DT_OK; l++) {
            dt_nf4 *q = (dt_nf4 *)dt_lora_nf4(m, id, l);
            float *dst = q ? NULL : dt_params_tensor(&m->base, m->base.params, id, l);
            st = fill(ctx, &full, id, l, q, dst, e, ud);
        }
    }
    dt_params_free(&full);
    return st;
}

/* Quantizes one copy from its fp32 values; errors name the tensor. */
static dt_status quantize_copy(dt_ctx *ctx, const dt_params *full, int id, int l, dt_nf4 *q, const float *w,
                               size_t e) {
    char name[160];
    dt_params_name(full, id, l, name, sizeof name);
    return dt_nf4_quantize(ctx, name, q, w, e);
}

/* dt_lora_set_base's copy: ud is the flat fp32 source. */
static dt_status copy_from_full(dt_ctx *ctx, const dt_params *full, int id, int l, dt_nf4 *q, float *dst,
                                size_t e, const void *ud) {
    const float *from = dt_params_tensor(full, (float *)ud, id, l);
    if (q) return quantize_copy(ctx, full, id, l, q, from, e);
    memcpy(dst, from, e * sizeof(float));
    return DT_OK;
}

/* dt_lora_init_base's copy under NF4: ud is the seed. A quantized tensor is drawn alone (its
 * fp32 values never all at once), the rest into the slab: the values of the fp32 base of the
 * same seed. */
static dt_status draw_from_seed(dt_ctx *ctx, const dt_params *full, int id, int l, dt_nf4 *q, float *dst,
                                size_t e, const void *ud) {
    uint64_t seed = *(const uint64_t *)ud;
    if (q && !(dst = malloc(e * sizeof(float))))
        return dt_fail(ctx, DT_ERR_NOMEM, "lora: out of memory quantizing the base");
    dt_params_init_range(full, seed, dst, dt_params_flat(full, id, l), e);
    if (!q) return DT_OK;
    dt_status st = quantize_copy(ctx, full, id, l, q, dst, e);
    free(dst);
    return st;
}

dt_status dt_lora_set_base(dt_ctx *ctx, dt_model *m, const float *src) {
    return walk_base(ctx, m, copy_from_full, src);
}

dt_status dt_lora_init_base(dt_ctx *ctx, dt_model *m, uint64_t seed) {
    if (!m->lora_q) {
        dt_params_init_range(&m->base, seed, m->base.params, 0, m->base.n_params);
        return DT_OK;
    }
    return walk_base(ctx, m, draw_from_seed, &seed);
}

uint64_t dt_lora_base_hash(const dt_model *m) {
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, m->base.params, m->base.n_params * sizeof(float));
    if (m->lora_q) XXH3_64bits_update(s, m->lora_q->buf, m->lora_q->bytes);
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

int dt_lora_unit(const dt_model *m, int u, int *first) {
    /* by index, not offset: an NF4 base's all-matmul units are empty, so their offsets are
     * the next unit's */
    const dt_params *b = &m->base;
    if (first) *first = 0;
    int k = u - b->n_pre_units;
    if (u < 0 || k < 0 || k >= b->n_layer * b->layer_units) return -1;
    if (first) *first = k % b->layer_units == 0;
    return DT_UNIT_LAYER(&m->ps, k / b->layer_units);
}

/* ------------------------------------------------------------------ adapter arithmetic */

/* Blocking of the adapter loops: columns of x widened at a time (mixed precision), ranks and
 * output rows per accumulator block. Each output element is still one sum in ascending order
 * of its index (c, j, n or k), whatever the blocks and threads. */
enum { XB = 64, KB = 16, JB = 8 };

uint64_t dt_lora_drop_key(uint64_t seed, uint64_t seq, int t, int l, int site) {
    uint64_t row = dt_rng_u64(seq, (uint64_t)(uint32_t)t, LORA_DROP_SALT);
    return dt_rng_u64(seed, LORA_DROP_SALT + (uint64_t)l * DT_LORA_MAX_SITES + (uint64_t)site, row);
}

/* Kept when the high 32 bits reach p 2^32: probability 1 - p (to 2^-32). */
static inline uint64_t drop_thresh(float p) { return (uint64_t)((double)p * 4294967296.0); }

static inline int kept(uint64_t key, int c, uint64_t thresh) {
    return (dt_rng_u64(key, (uint64_t)c, 0) >> 32) >= thresh;
}

int dt_lora_drop_keep(uint64_t key, int c, float p) { return kept(key, c, drop_thresh(p)); }

/* The dropout of one site's adapters in this forward or backward (on = 0: none). */
typedef struct drop_ctx {
    int on, T, l, site;
    float inv; /* 1 / (1 - p) */
    uint64_t thresh, seed, seq0;
} drop_ctx;

static drop_ctx drop_of(const dt_model *m, int l, int site) {
    drop_ctx d = {0};
    if (!m->lora_drop_on) return d;
    const float p = m->opts.lora.dropout;
    d = (drop_ctx){1, m->T, l, site, 1.0f / (1.0f - p), drop_thresh(p), m->lora_drop_seed, m->lora_drop_seq0};
    return d;
}

/* Row n's mask key (rows are sequences of T positions). */
static inline uint64_t drop_row(const drop_ctx *d, int n) {
    return d->on ? dt_lora_drop_key(d->seed, d->seq0 + (uint64_t)(n / d->T), n % d->T, d->l, d->site) : 0;
}

/* x[n, c0 .. c0 + len) in fp32: a pointer into xf, or widened from xh into tmp; under
 * dropout drop(x) in tmp (key: drop_row of n). */
static inline const float *xseg(const dt_model *m, const float *xf, const uint16_t *xh, int n, int C, int c0,
                                int len, float *tmp, const drop_ctx *d, uint64_t key) {
    const float *x = xf + (size_t)n * C + c0;
    if (xh) {
        dt_from_lowp(m->opts.compute, tmp, xh + (size_t)n * C + c0, (size_t)len);
        x = tmp;
    }
    if (!d->on) return x;
    for (int c = 0; c < len; c++) tmp[c] = kept(key, c0 + c, d->thresh) ? x[c] * d->inv : 0.0f;
    return tmp;
}

/* u (N, r) = drop(x) A^T: each element one sum over c ascending. */
static void x_at(const dt_model *m, float *u, const float *xf, const uint16_t *xh, const float *A, int N, int C,
                 int r, const drop_ctx *d) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float tmp[XB];
        float *un = u + (size_t)n * r;
        const uint64_t key = drop_row(d, n);
        for (int k = 0; k < r; k++) un[k] = 0.0f;
        for (int c0 = 0; c0 < C; c0 += XB) {
            int len = C - c0 < XB ? C - c0 : XB;
            const float *xs = xseg(m, xf, xh, n, C, c0, len, tmp, d, key);
            for (int k = 0; k < r; k++) {
                const float *a = A + (size_t)k * C + c0;
                float acc = un[k];
                for (int c = 0; c < len; c++) acc += xs[c] * a[c];
                un[k] = acc;
            }
        }
    }
}

/* The sites of base matmul (id, OC rows from id's first): the tensor's flat range covers them. */
static int site_col(const dt_model *m, int i, int id, int OC, int C) {
    const dt_params *b = &m->base;
    const dt_lora_site *s = &m->sites[i];
    if (s->id < id) return -1;
    /* rows of the call before the site's tensor: the tensors from id up to it (adjacent) */
    size_t rows = 0;
    for (int t = id; t < s->id; t++) {
        if (b->tensors[t].group != DT_PG_LAYER || b->tensors[t].cols != (size_t)C) return -1;
        rows += m->lora_q ? m->lora_q->rows[t] : b->tensors[t].rows;
    }
    size_t col = rows + s->row0;
    return col + s->rows <= (size_t)OC ? (int)col : -1;
}

void dt_lora_mm_forward(dt_model *m, float *out, const float *xf, const uint16_t *xh, int id, int l, int N,
                        int C, int OC) {
    const int r = m->opts.lora.rank;
    const float s = m->lora_scale;
    for (int i = 0; i < m->n_sites; i++) {
        int col = site_col(m, i, id, OC, C);
        if (col < 0) continue;
        const float *A = dt_params_unit_tensor(&m->ps, m->ps.unit_params, m->site_a[i], l);
        const float *Bm = dt_params_unit_tensor(&m->ps, m->ps.unit_params, m->site_a[i] + 1, l);
        const int rows = (int)m->sites[i].rows;
        float *u = m->lora_u;
        const drop_ctx d = drop_of(m, l, i);
        x_at(m, u, xf, xh, A, N, C, r, &d);
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *un = u + (size_t)n * r;
            float *o = out + (size_t)n * OC + col;
            for (int j = 0; j < rows; j++) {
                const float *b = Bm + (size_t)j * r;
                float acc = 0.0f;
                for (int k = 0; k < r; k++) acc += un[k] * b[k];
                o[j] += s * acc;
            }
        }
    }
}

void dt_lora_mm_backward(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh,
                         int id, int l, int N, int C, int OC) {
    const int r = m->opts.lora.rank;
    const float s = m->lora_scale;
    for (int i = 0; i < m->n_sites; i++) {
        int col = site_col(m, i, id, OC, C);
        if (col < 0) continue;
        const float *A = dt_params_unit_tensor(&m->ps, m->ps.unit_params, m->site_a[i], l);
        const float *Bm = dt_params_unit_tensor(&m->ps, m->ps.unit_params, m->site_a[i] + 1, l);
        float *dA = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, m->site_a[i], l);
        float *dB = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, m->site_a[i] + 1, l);
        const int rows = (int)m->sites[i].rows;
        float *u = m->lora_u, *du = m->lora_du;
        const drop_ctx dr = drop_of(m, l, i); /* the forward's masks, regenerated */
        x_at(m, u, xf, xh, A, N, C, r, &dr); /* recomputed: not kept from the forward */
        /* dB[j, k] += s sum_n g[n, j] u[n, k]: JB output rows at a time (dout read by rows) */
        int nj = (rows + JB - 1) / JB;
#pragma omp parallel for schedule(static)
        for (int jb = 0; jb < nj; jb++) {
            int j0 = jb * JB, nr = rows - j0 < JB ? rows - j0 : JB;
            for (int k0 = 0; k0 < r; k0 += KB) {
                int nk = r - k0 < KB ? r - k0 : KB;
                float acc[JB * KB] = {0};
                for (int n = 0; n < N; n++) {
                    const float *g = dout + (size_t)n * OC + col + j0, *un = u + (size_t)n * r + k0;
                    for (int j = 0; j < nr; j++)
                        for (int k = 0; k < nk; k++) acc[j * KB + k] += g[j] * un[k];
                }
                for (int j = 0; j < nr; j++)
                    for (int k = 0; k < nk; k++) dB[(size_t)(j0 + j) * r + k0 + k] += s * acc[j * KB + k];
            }
        }
        /* du[n, k] = s sum_j g[n, j] B[j, k] */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * OC + col;
            float *dn = du + (size_t)n * r;
            for (int k = 0; k < r; k++) dn[k] = 0.0f;
            for (int j = 0; j < rows; j++) {
                const float gj = g[j], *b = Bm + (size_t)j * r;
                for (int k = 0; k < r; k++) dn[k] += gj * b[k];
            }
            for (int k = 0; k < r; k++) dn[k] *= s;
        }
        /* dA[k, c] += sum_n du[n, k] drop(x)[n, c]: blocks of XB columns x KB ranks, x widened once
         * per row and block */
        int nblk = (C + XB - 1) / XB;
#pragma omp parallel for schedule(static)
        for (int bi = 0; bi < nblk; bi++) {
            int c0 = bi * XB, len = C - c0 < XB ? C - c0 : XB;
            float tmp[XB];
            for (int k0 = 0; k0 < r; k0 += KB) {
                int nk = r - k0 < KB ? r - k0 : KB;
                float acc[KB * XB] = {0};
                for (int n = 0; n < N; n++) {
                    const float *xs = xseg(m, xf, xh, n, C, c0, len, tmp, &dr, drop_row(&dr, n));
                    const float *dn = du + (size_t)n * r + k0;
                    for (int k = 0; k < nk; k++) {
                        const float d = dn[k];
                        float *a = acc + k * XB;
                        for (int c = 0; c < len; c++) a[c] += d * xs[c];
                    }
                }
                for (int k = 0; k < nk; k++) {
                    float *da = dA + (size_t)(k0 + k) * C + c0;
                    for (int c = 0; c < len; c++) da[c] += acc[k * XB + c];
                }
            }
        }
        if (!dinp) continue;
        /* dinp[n, c] += sum_k du[n, k] A[k, c] (times mask / (1 - p) under dropout): the sum
         * formed apart, then added */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *dx = dinp + (size_t)n * C;
            const uint64_t key = drop_row(&dr, n);
            const float *dn = du + (size_t)n * r;
            for (int c0 = 0; c0 < C; c0 += XB) {
                int len = C - c0 < XB ? C - c0 : XB;
                float acc[XB] = {0};
                for (int k = 0; k < r; k++) {
                    const float dk = dn[k], *a = A + (size_t)k * C + c0;
                    for (int c = 0; c < len; c++) acc[c] += dk * a[c];
                }
                if (!dr.on)
                    for (int c = 0; c < len; c++) dx[c0 + c] += acc[c];
                else
                    for (int c = 0; c < len; c++)
                        if (kept(key, c0 + c, dr.thresh)) dx[c0 + c] += acc[c] * dr.inv;
            }
        }
    }
}
