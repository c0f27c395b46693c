/* GPT-2: presets, parameter layout from the table in gpt2_params.h, init, forward, backward. */
#include "model/gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/timer.h"
#include "core/trace.h"
#include "ops/ops.h"

const char *const dt_op_kind_names[DT_OP_NKINDS] = {
    "encoder", "layernorm", "matmul", "attention", "gelu", "residual", "lm_head", "softmax_ce"};

/* ------------------------------------------------------------------ config */

typedef struct preset {
    const char *name;
    dt_gpt2_config cfg;
} preset;

/* context is each preset's maximum sequence length. */
static const preset presets[] = {
    {"gpt2-tiny", {2, 64, 4, 256, 0, 64}},
    {"bench-small", {6, 384, 6, 50257, 0, 1024}},
    {"gpt2", {12, 768, 12, 50257, 0, 1024}},
    {"gpt2-medium", {24, 1024, 16, 50257, 0, 1024}},
    {"gpt2-large", {36, 1280, 20, 50257, 0, 1024}},
    {"gpt2-xl", {48, 1600, 25, 50257, 0, 1024}},
};
const char *const dt_gpt2_preset_names[] = {"gpt2-tiny",  "bench-small", "gpt2",   "gpt2-medium",
                                            "gpt2-large", "gpt2-xl",     NULL};

dt_status dt_gpt2_config_preset(dt_ctx *ctx, const char *name, dt_gpt2_config *out) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i].cfg;
            return dt_gpt2_config_validate(ctx, out);
        }
    return dt_fail(ctx, DT_ERR_CONFIG,
                   "model.preset: unknown preset '%s' (known: gpt2-tiny, bench-small, gpt2, "
                   "gpt2-medium, gpt2-large, gpt2-xl)",
                   name);
}

dt_status dt_gpt2_config_validate(dt_ctx *ctx, dt_gpt2_config *c) {
    /* Upper bounds keep every size computation far from overflow. */
    if (c->n_layer < 1 || c->n_layer > 1024)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_layer must be in [1, 1024] (got %d)",
                       c->n_layer);
    if (c->d_model < 1 || c->d_model > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.d_model must be in [1, 65536] (got %d)",
                       c->d_model);
    if (c->n_head < 1 || c->n_head > c->d_model)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_head must be in [1, d_model=%d] (got %d)",
                       c->d_model, c->n_head);
    if (c->d_model % c->n_head != 0)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "model.n_head (%d) must divide model.d_model (%d)", c->n_head,
                       c->d_model);
    if (c->vocab < 1 || c->vocab > (1 << 24))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.vocab_size must be in [1, 16777216] (got %d)",
                       c->vocab);
    if (c->context < 1 || c->context > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.context must be in [1, 65536] (got %d)",
                       c->context);
    c->vocab_padded = (c->vocab + 127) / 128 * 128;
    return DT_OK;
}

/* ------------------------------------------------------------------ layout */

typedef struct dt_gpt2_acts {
    float *encoded;                       /* (B,T,C) */
    float *ln1, *ln1_mean, *ln1_rstd;     /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *qkv;                           /* (L,B,T,3C) */
    float *atty;                          /* (L,B,T,C) */
    float *att_lse;                       /* (L,B,NH,T) */
    float *res2;                          /* (L,B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd;     /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *fch, *fch_gelu;                /* (L,B,T,4C) */
    float *res3;                          /* (L,B,T,C) */
    float *lnf, *lnf_mean, *lnf_rstd;     /* (B,T,C), (B,T), (B,T) */
    float *logits;                        /* (B,T,Vp); dlogits after backward */
    float *losses, *ce_lse;               /* (B,T) */
    float *dres;                          /* (B,T,C) residual-stream gradient */
    float *dbtc;                          /* (B,T,C) scratch gradient */
    float *dbig;                          /* (B,T,4C) scratch gradient (also dqkv) */
    int32_t *inputs, *targets;            /* (B,T) copies kept for the backward */
} dt_gpt2_acts;

/* Lays the activation views over `base` (NULL: just count). Returns floats used. */
static size_t layout_acts(dt_gpt2_acts *a, float *base, const dt_gpt2_config *c, int B, int T) {
    size_t L = c->n_layer, C = c->d_model, NH = c->n_head, BT = (size_t)B * T;
    size_t off = 0;
#define TAKE_INTO(ptr, n)                                                                    \
    do {                                                                                     \
        (ptr) = base ? base + off : NULL;                                                    \
        off += ((n) + 15) / 16 * 16; /* 64-byte aligned views */                             \
    } while (0)
#define TAKE(field, n) TAKE_INTO(a->field, n)
    TAKE(encoded, BT * C);
    TAKE(ln1, L * BT * C);
    TAKE(ln1_mean, L * BT);
    TAKE(ln1_rstd, L * BT);
    TAKE(qkv, L * BT * 3 * C);
    TAKE(atty, L * BT * C);
    TAKE(att_lse, L * BT * NH);
    TAKE(res2, L * BT * C);
    TAKE(ln2, L * BT * C);
    TAKE(ln2_mean, L * BT);
    TAKE(ln2_rstd, L * BT);
    TAKE(fch, L * BT * 4 * C);
    TAKE(fch_gelu, L * BT * 4 * C);
    TAKE(res3, L * BT * C);
    TAKE(lnf, BT * C);
    TAKE(lnf_mean, BT);
    TAKE(lnf_rstd, BT);
    TAKE(logits, BT * (size_t)c->vocab_padded);
    TAKE(losses, BT);
    TAKE(ce_lse, BT);
    TAKE(dres, BT * C);
    TAKE(dbtc, BT * C);
    TAKE(dbig, BT * 4 * C);
    float *ids = NULL;
    TAKE_INTO(ids, 2 * BT);
    a->inputs = (int32_t *)ids;
    a->targets = ids ? (int32_t *)ids + BT : NULL;
#undef TAKE
#undef TAKE_INTO
    return off;
}

size_t dt_gpt2_act_floats(const dt_gpt2_config *c, int B, int T) {
    dt_gpt2_acts a;
    return layout_acts(&a, NULL, c, B, T);
}

static void layout_params(dt_gpt2 *m) {
    const dt_gpt2_config *c = &m->cfg;
    static const struct {
        const char *name;
        dt_param_group group;
        dt_init_kind init;
        int decay;
    } meta[DT_GPT2_NPARAMS] = {
#define DT_X_META(id, group, rows, cols, init, decay, name) {name, group, init, decay},
        DT_GPT2_PARAMS(DT_X_META)
#undef DT_X_META
    };
    size_t rows[DT_GPT2_NPARAMS] = {
#define DT_X_ROWS(id, group, rows, cols, init, decay, name) (size_t)(rows),
        DT_GPT2_PARAMS(DT_X_ROWS)
#undef DT_X_ROWS
    };
    size_t cols[DT_GPT2_NPARAMS] = {
#define DT_X_COLS(id, group, rows, cols, init, decay, name) (size_t)(cols),
        DT_GPT2_PARAMS(DT_X_COLS)
#undef DT_X_COLS
    };
    /* Three passes place PRE, then one layer block, then POST, in table order. */
    size_t off = 0, layer_floats = 0;
    for (int g = DT_PG_PRE; g <= DT_PG_POST; g++) {
        if (g == DT_PG_LAYER) m->layers_offset = off;
        for (int i = 0; i < DT_GPT2_NPARAMS; i++) {
            if ((int)meta[i].group != g) continue;
            dt_tensor_info *t = &m->tensors[i];
            t->name = meta[i].name;
            t->group = meta[i].group;
            t->init = meta[i].init;
            t->decay = meta[i].decay;
            t->rows = rows[i];
            t->cols = cols[i];
            t->offset = off;
            t->stride = 0;
            off += t->rows * t->cols;
        }
        if (g == DT_PG_LAYER) {
            layer_floats = off - m->layers_offset;
            off = m->layers_offset + layer_floats * (size_t)c->n_layer;
        }
    }
    for (int i = 0; i < DT_GPT2_NPARAMS; i++)
        if (m->tensors[i].group == DT_PG_LAYER) m->tensors[i].stride = layer_floats;
    m->layer_floats = layer_floats;
    m->n_params = off;
}

float *dt_gpt2_tensor(const dt_gpt2 *m, float *base, dt_gpt2_param_id id, int layer) {
    const dt_tensor_info *t = &m->tensors[id];
    return base + t->offset + (t->group == DT_PG_LAYER ? (size_t)layer * t->stride : 0);
}

void dt_gpt2_tensor_name(const dt_gpt2 *m, dt_gpt2_param_id id, int layer, char *buf, size_t n) {
    if (m->tensors[id].group == DT_PG_LAYER)
        snprintf(buf, n, m->tensors[id].name, layer);
    else
        snprintf(buf, n, "%s", m->tensors[id].name);
}

size_t dt_gpt2_num_params(const dt_gpt2_config *c) {
    size_t C = c->d_model, L = c->n_layer;
    return (size_t)c->vocab * C + (size_t)c->context * C + L * (12 * C * C + 13 * C) + 2 * C;
}

double dt_gpt2_flops_per_token(const dt_gpt2_config *c, int T) {
    double C = c->d_model, L = c->n_layer;
    double n = L * (12.0 * C * C + 13.0 * C) + 2.0 * C + (double)c->vocab * C;
    return 6.0 * n + 12.0 * L * (double)T * C;
}

dt_status dt_gpt2_param_segments(dt_ctx *ctx, const dt_gpt2 *m, dt_param_segment **out, int *n) {
    /* Walk the slab in memory order: PRE tensors, layer blocks, POST tensors. */
    int cap = DT_GPT2_NPARAMS * (m->cfg.n_layer + 1), cnt = 0;
    dt_param_segment *s = malloc((size_t)cap * sizeof *s);
    if (!s) return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate optimizer segments");
    for (int g = DT_PG_PRE; g <= DT_PG_POST; g++) {
        int copies = g == DT_PG_LAYER ? m->cfg.n_layer : 1;
        for (int l = 0; l < copies; l++)
            for (int i = 0; i < DT_GPT2_NPARAMS; i++) {
                const dt_tensor_info *t = &m->tensors[i];
                if ((int)t->group != g) continue;
                size_t off = t->offset + (g == DT_PG_LAYER ? (size_t)l * t->stride : 0);
                size_t len = t->rows * t->cols;
                if (cnt > 0 && s[cnt - 1].decay == t->decay &&
                    s[cnt - 1].offset + s[cnt - 1].len == off)
                    s[cnt - 1].len += len; /* merge neighbours of equal decay */
                else
                    s[cnt++] = (dt_param_segment){off, len, t->decay};
            }
    }
    *out = s;
    *n = cnt;
    return DT_OK;
}

/* ------------------------------------------------------------------ lifetime */

dt_status dt_gpt2_init(dt_ctx *ctx, dt_gpt2 *m, const dt_gpt2_config *cfg, dt_alloc *alloc,
                       int B, int T) {
    return dt_gpt2_init_unsharded(ctx, m, cfg, alloc, B, T, DT_GPT2_SLAB_PARAMS | DT_GPT2_SLAB_GRADS);
}

dt_status dt_gpt2_init_unsharded(dt_ctx *ctx, dt_gpt2 *m, const dt_gpt2_config *cfg,
                                 dt_alloc *alloc, int B, int T, int slabs) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    DT_CHECK(dt_gpt2_config_validate(ctx, &m->cfg));
    if (B < 1 || B > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.micro_batch must be in [1, 65536] (got %d)", B);
    if (T < 1 || T > m->cfg.context)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "training.seq_len must be in [1, model.context=%d] (got %d)",
                       m->cfg.context, T);
    m->B = B;
    m->T = T;
    m->alloc = alloc;
    layout_params(m);
    m->n_acts = dt_gpt2_act_floats(&m->cfg, B, T);
    dt_status st = DT_OK;
    m->n_units = m->cfg.n_layer + 2;
    size_t ub = (size_t)m->n_units * (2 * sizeof(size_t) + 2 * sizeof(float *));
    DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, ub, (void **)&m->unit_lo));
    m->unit_len = m->unit_lo + m->n_units;
    m->unit_params = (float **)(m->unit_len + m->n_units);
    m->unit_grads = m->unit_params + m->n_units;
    for (int u = 0; u < m->n_units; u++) {
        size_t lo = u == 0 ? 0 : u <= m->cfg.n_layer ? m->layers_offset + (size_t)(u - 1) * m->layer_floats
                                                      : m->layers_offset + m->layer_floats * (size_t)m->cfg.n_layer;
        size_t hi = u == 0 ? m->layers_offset : u <= m->cfg.n_layer ? lo + m->layer_floats : m->n_params;
        m->unit_lo[u] = lo;
        m->unit_len[u] = hi - lo;
    }
    if (slabs & DT_GPT2_SLAB_PARAMS)
        DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_PARAMS, m->n_params * sizeof(float),
                                   (void **)&m->params));
    if (slabs & DT_GPT2_SLAB_GRADS)
        DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_GRADS, m->n_params * sizeof(float),
                                   (void **)&m->grads));
    dt_gpt2_point_units(m);
    DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_ACTS, m->n_acts * sizeof(float),
                               (void **)&m->acts));
    DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, sizeof(dt_gpt2_acts), (void **)&m->a));
    layout_acts(m->a, m->acts, &m->cfg, B, T);
    return DT_OK;
fail:
    dt_gpt2_free(m);
    return st;
}

void dt_gpt2_point_units(dt_gpt2 *m) {
    for (int u = 0; u < m->n_units; u++) {
        m->unit_params[u] = m->params ? m->params + m->unit_lo[u] : NULL;
        m->unit_grads[u] = m->grads ? m->grads + m->unit_lo[u] : NULL;
    }
}

void dt_gpt2_free(dt_gpt2 *m) {
    if (!m->alloc) return;
    dt_alloc_put(m->alloc, DT_MEM_OTHER, m->unit_lo,
                 (size_t)m->n_units * (2 * sizeof(size_t) + 2 * sizeof(float *)));
    dt_alloc_put(m->alloc, DT_MEM_PARAMS, m->params, m->n_params * sizeof(float));
    dt_alloc_put(m->alloc, DT_MEM_GRADS, m->grads, m->n_params * sizeof(float));
    dt_alloc_put(m->alloc, DT_MEM_ACTS, m->acts, m->n_acts * sizeof(float));
    dt_alloc_put(m->alloc, DT_MEM_OTHER, m->a, sizeof(dt_gpt2_acts));
    memset(m, 0, sizeof *m);
}

void dt_gpt2_init_range(const dt_gpt2 *m, uint64_t seed, float *dst, size_t lo, size_t n) {
    const dt_gpt2_config *c = &m->cfg;
    float resid_std = 0.02f / sqrtf(2.0f * (float)c->n_layer);
    size_t hi = lo + n;
    for (int id = 0; id < DT_GPT2_NPARAMS; id++) {
        const dt_tensor_info *t = &m->tensors[id];
        int copies = t->group == DT_PG_LAYER ? c->n_layer : 1;
        for (int l = 0; l < copies; l++) {
            size_t base = t->offset + (t->group == DT_PG_LAYER ? (size_t)l * t->stride : 0);
            size_t len = t->rows * t->cols;
            /* Only real vocabulary rows are drawn; padding rows stay 0 (never read, zero grad). */
            size_t drawn = id == DT_GPT2_P_WTE ? (size_t)c->vocab * t->cols : len;
            size_t a = base > lo ? base : lo, z = base + len < hi ? base + len : hi;
            if (a >= z) continue;
            uint64_t stream = ((uint64_t)id << 32) | (uint64_t)l;
#pragma omp parallel for schedule(static)
            for (size_t e = a; e < z; e++) {
                size_t i = e - base;
                float v = 0.0f;
                switch (t->init) {
                case DT_INIT_NORMAL: v = i < drawn ? 0.02f * dt_rng_normal(seed, stream, i) : 0.0f; break;
                case DT_INIT_RESID: v = resid_std * dt_rng_normal(seed, stream, i); break;
                case DT_INIT_ONES: v = 1.0f; break;
                case DT_INIT_ZEROS: v = 0.0f; break;
                }
                dst[e - lo] = v;
            }
        }
    }
}

void dt_gpt2_init_weights(dt_gpt2 *m, uint64_t seed) { dt_gpt2_init_range(m, seed, m->params, 0, m->n_params); }

int dt_gpt2_unit_of(const dt_gpt2 *m, dt_gpt2_param_id id, int layer, size_t *offset_in_unit) {
    const dt_tensor_info *t = &m->tensors[id];
    int u = t->group == DT_PG_PRE ? 0 : t->group == DT_PG_LAYER ? 1 + layer : m->cfg.n_layer + 1;
    size_t flat = t->offset + (t->group == DT_PG_LAYER ? (size_t)layer * t->stride : 0);
    *offset_in_unit = flat - m->unit_lo[u];
    return u;
}

/* Kernel-side access through the unit pointers. */
static inline float *unit_tensor(const dt_gpt2 *m, float *const *units, dt_gpt2_param_id id, int l) {
    size_t off;
    int u = dt_gpt2_unit_of(m, id, l, &off);
    return units[u] + off;
}

void dt_gpt2_zero_grad(dt_gpt2 *m) {
    for (int u = 0; u < m->n_units; u++) memset(m->unit_grads[u], 0, m->unit_len[u] * sizeof(float));
}

const float *dt_gpt2_logits(const dt_gpt2 *m) { return m->a->logits; }

/* ------------------------------------------------------------------ forward / backward */

/* Times `stmt` into prof.fwd/bwd[kind] when profiling is on. */
#define DT_PROF(m, dir, kind, stmt)                                                          \
    do {                                                                                     \
        double t0_ = (m)->profile ? dt_now() : 0.0;                                          \
        stmt;                                                                                \
        if ((m)->profile) (m)->prof.dir[kind] += dt_now() - t0_;                             \
    } while (0)

#define P(id, l) unit_tensor(m, m->unit_params, DT_GPT2_P_##id, l)
#define G(id, l) unit_tensor(m, m->unit_grads, DT_GPT2_P_##id, l)

dt_status dt_gpt2_forward(dt_ctx *ctx, dt_gpt2 *m, const int32_t *inputs, const int32_t *targets,
                          float *loss) {
    const dt_gpt2_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->d_model, NH = c->n_head, L = c->n_layer;
    int V = c->vocab, Vp = c->vocab_padded, BT = B * T;
    size_t btc = (size_t)BT * C;
    dt_gpt2_acts *a = m->a;
    /* Token ids come from files: check them here rather than index out of bounds. */
    for (int i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return dt_fail(ctx, DT_ERR_FORMAT, "input token %d at position %d is outside [0, %d)",
                           inputs[i], i, V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            return dt_fail(ctx, DT_ERR_FORMAT, "target token %d at position %d is outside [0, %d)",
                           targets[i], i, V);
    }
    memcpy(a->inputs, inputs, (size_t)BT * sizeof(int32_t));
    if (targets) memcpy(a->targets, targets, (size_t)BT * sizeof(int32_t));
    m->has_targets = targets != NULL;
    DT_PROF(m, fwd, DT_OP_ENCODER, dt_encoder_forward(a->encoded, inputs, P(WTE, 0), P(WPE, 0), B, T, C));
    for (int l = 0; l < L; l++) {
        if (m->hooks.before_layer_forward) m->hooks.before_layer_forward(m->hooks.ud, l);
        double tl = dt_trace_begin();
        const float *resid = l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * btc;
        float *ln1 = a->ln1 + l * btc, *ln1m = a->ln1_mean + (size_t)l * BT,
              *ln1r = a->ln1_rstd + (size_t)l * BT;
        float *qkv = a->qkv + l * btc * 3, *atty = a->atty + l * btc;
        float *lse = a->att_lse + (size_t)l * BT * NH, *res2 = a->res2 + l * btc;
        float *ln2 = a->ln2 + l * btc, *ln2m = a->ln2_mean + (size_t)l * BT,
              *ln2r = a->ln2_rstd + (size_t)l * BT;
        float *fch = a->fch + l * btc * 4, *fchg = a->fch_gelu + l * btc * 4;
        float *res3 = a->res3 + l * btc;
        DT_PROF(m, fwd, DT_OP_LAYERNORM, dt_layernorm_forward(ln1, ln1m, ln1r, resid, P(LN1W, l), P(LN1B, l), BT, C));
        DT_PROF(m, fwd, DT_OP_MATMUL, dt_matmul_forward(qkv, ln1, P(QKVW, l), P(QKVB, l), BT, C, 3 * C));
        DT_PROF(m, fwd, DT_OP_ATTENTION, dt_attention_forward(atty, lse, qkv, B, T, C, NH));
        DT_PROF(m, fwd, DT_OP_MATMUL, dt_matmul_forward(res2, atty, P(ATTPROJW, l), P(ATTPROJB, l), BT, C, C));
        DT_PROF(m, fwd, DT_OP_RESIDUAL, dt_residual_forward(res2, res2, resid, (int)btc));
        DT_PROF(m, fwd, DT_OP_LAYERNORM, dt_layernorm_forward(ln2, ln2m, ln2r, res2, P(LN2W, l), P(LN2B, l), BT, C));
        DT_PROF(m, fwd, DT_OP_MATMUL, dt_matmul_forward(fch, ln2, P(FCW, l), P(FCB, l), BT, C, 4 * C));
        DT_PROF(m, fwd, DT_OP_GELU, dt_gelu_forward(fchg, fch, (int)(btc * 4)));
        DT_PROF(m, fwd, DT_OP_MATMUL, dt_matmul_forward(res3, fchg, P(FCPROJW, l), P(FCPROJB, l), BT, 4 * C, C));
        DT_PROF(m, fwd, DT_OP_RESIDUAL, dt_residual_forward(res3, res3, res2, (int)btc));
        dt_trace_end(tl, "fwd", "fwd layer %d", l);
        if (m->hooks.after_layer_forward) m->hooks.after_layer_forward(m->hooks.ud, l);
    }
    const float *last = a->res3 + (size_t)(L - 1) * btc;
    DT_PROF(m, fwd, DT_OP_LAYERNORM, dt_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, last, P(LNFW, 0), P(LNFB, 0), BT, C));
    DT_PROF(m, fwd, DT_OP_LMHEAD, dt_matmul_forward(a->logits, a->lnf, P(WTE, 0), NULL, BT, C, Vp));
    if (!targets) return DT_OK;
    DT_PROF(m, fwd, DT_OP_CROSSENTROPY, dt_crossentropy_forward(a->losses, a->ce_lse, a->logits, targets, BT, V, Vp));
    double sum = 0.0; /* fixed order: deterministic */
    for (int i = 0; i < BT; i++) sum += a->losses[i];
    m->last_loss = (float)(sum / BT); /* may be NaN/Inf: the trainer decides (training.nonfinite) */
    if (loss) *loss = m->last_loss;
    return DT_OK;
}

void dt_gpt2_backward(dt_gpt2 *m, float scale) {
    const dt_gpt2_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->d_model, NH = c->n_head, L = c->n_layer;
    int V = c->vocab, Vp = c->vocab_padded, BT = B * T;
    size_t btc = (size_t)BT * C;
    dt_gpt2_acts *a = m->a;
    DT_ASSERT(m->has_targets); /* backward needs a forward with targets */
    m->has_targets = 0;        /* dlogits overwrite the logits: one backward per forward */
    DT_PROF(m, bwd, DT_OP_CROSSENTROPY, dt_crossentropy_backward(a->logits, a->logits, a->ce_lse, a->targets, scale / (float)BT, BT, V, Vp));
    DT_PROF(m, bwd, DT_OP_LMHEAD, dt_matmul_backward(a->dbtc, G(WTE, 0), NULL, a->logits, a->lnf, P(WTE, 0), BT, C, Vp));
    memset(a->dres, 0, btc * sizeof(float));
    const float *last = a->res3 + (size_t)(L - 1) * btc;
    DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_layernorm_backward(a->dres, G(LNFW, 0), G(LNFB, 0), a->dbtc, last, P(LNFW, 0), a->lnf_mean, a->lnf_rstd, BT, C));
    for (int l = L - 1; l >= 0; l--) {
        const float *resid = l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * btc;
        float *ln1 = a->ln1 + l * btc, *ln1m = a->ln1_mean + (size_t)l * BT,
              *ln1r = a->ln1_rstd + (size_t)l * BT;
        float *qkv = a->qkv + l * btc * 3, *atty = a->atty + l * btc;
        float *lse = a->att_lse + (size_t)l * BT * NH, *res2 = a->res2 + l * btc;
        float *ln2 = a->ln2 + l * btc, *ln2m = a->ln2_mean + (size_t)l * BT,
              *ln2r = a->ln2_rstd + (size_t)l * BT;
        float *fch = a->fch + l * btc * 4, *fchg = a->fch_gelu + l * btc * 4;
        if (m->hooks.before_layer_backward) m->hooks.before_layer_backward(m->hooks.ud, l);
        double tl = dt_trace_begin();
        /* dres holds d(res3); the residual passes it to res2 unchanged. */
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_matmul_backward(a->dbig, G(FCPROJW, l), G(FCPROJB, l), a->dres, fchg, P(FCPROJW, l), BT, 4 * C, C));
        DT_PROF(m, bwd, DT_OP_GELU, dt_gelu_backward(a->dbig, fch, a->dbig, (int)(btc * 4)));
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_matmul_backward(a->dbtc, G(FCW, l), G(FCB, l), a->dbig, ln2, P(FCW, l), BT, C, 4 * C));
        DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_layernorm_backward(a->dres, G(LN2W, l), G(LN2B, l), a->dbtc, res2, P(LN2W, l), ln2m, ln2r, BT, C));
        /* dres now holds d(res2); the residual passes it to resid unchanged. */
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_matmul_backward(a->dbtc, G(ATTPROJW, l), G(ATTPROJB, l), a->dres, atty, P(ATTPROJW, l), BT, C, C));
        DT_PROF(m, bwd, DT_OP_ATTENTION, dt_attention_backward(a->dbig, a->dbtc, qkv, atty, lse, B, T, C, NH));
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_matmul_backward(a->dbtc, G(QKVW, l), G(QKVB, l), a->dbig, ln1, P(QKVW, l), BT, C, 3 * C));
        DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_layernorm_backward(a->dres, G(LN1W, l), G(LN1B, l), a->dbtc, resid, P(LN1W, l), ln1m, ln1r, BT, C));
        dt_trace_end(tl, "bwd", "bwd layer %d", l);
        if (m->hooks.after_layer_backward) m->hooks.after_layer_backward(m->hooks.ud, l);
    }
    DT_PROF(m, bwd, DT_OP_ENCODER, dt_encoder_backward(G(WTE, 0), G(WPE, 0), a->dres, a->inputs, B, T, C));
    if (m->hooks.after_embed_backward) m->hooks.after_embed_backward(m->hooks.ud);
}
