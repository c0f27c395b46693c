/* GPT-2: presets, the parameter table (gpt2_params.h), forward, backward. */
#include "model/gpt2/gpt2.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/timer.h"
#include "core/trace.h"
#include "model/family_impl.h"
#include "model/hf_json.h"
#include "model/rope.h"
#include "ops/ops.h"

/* ------------------------------------------------------------------ config */

typedef struct preset {
    const char *name;
    int n_layer, d_model, n_head, vocab, context; /* context: the maximum sequence length */
} preset;

static const preset presets[] = {
    {"gpt2-tiny", 2, 64, 4, 256, 64},
    {"bench-small", 6, 384, 6, 50257, 1024},
    {"gpt2", 12, 768, 12, 50257, 1024},
    {"gpt2-medium", 24, 1024, 16, 50257, 1024},
    {"gpt2-large", 36, 1280, 20, 50257, 1024},
    {"gpt2-xl", 48, 1600, 25, 50257, 1024},
};
static const char *const preset_names[] = {"gpt2-tiny",  "bench-small", "gpt2",   "gpt2-medium",
                                           "gpt2-large", "gpt2-xl",     NULL};

static void gpt2_preset(const char *name, dt_model_config *out) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) {
            out->n_layer = presets[i].n_layer;
            out->d_model = presets[i].d_model;
            out->n_head = presets[i].n_head;
            out->vocab = presets[i].vocab;
            out->context = presets[i].context;
        }
}

static dt_status gpt2_validate(dt_ctx *ctx, dt_model_config *c) {
    DT_CHECK(dt_model_refuse_vision(ctx, c, "gpt2"));
    DT_CHECK(dt_model_refuse_experts(ctx, c, "gpt2"));
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
    /* The fixed parts of the architecture: a key set to anything else is refused. */
    if (c->n_kv_head && c->n_kv_head != c->n_head)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_kv_head: gpt2 has no grouped-query attention "
                       "(n_kv_head must equal n_head=%d, got %d)", c->n_head, c->n_kv_head);
    if (c->d_ff && c->d_ff != 4 * c->d_model)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.d_ff: gpt2's MLP is 4 x d_model = %d (got %d)",
                       4 * c->d_model, c->d_ff);
    if (c->untied)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.untied_embeddings: gpt2's lm_head is tied to wte");
    if (c->rope_theta != 0.0f)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.rope_theta: gpt2 has learned positions, not rotary");
    DT_CHECK(dt_rope_refuse(ctx, c, "gpt2 has learned positions, not rotary"));
    if (c->norm_eps != 0.0f && c->norm_eps != 1e-5f)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.norm_eps: gpt2's LayerNorm uses 1e-5 (got %g)",
                       (double)c->norm_eps);
    c->n_kv_head = c->n_head;
    c->d_ff = 4 * c->d_model;
    c->norm_eps = 1e-5f;
    c->vocab_padded = (c->vocab + 127) / 128 * 128;
    return DT_OK;
}

static int gpt2_tensors(const dt_model_config *c, dt_tensor_info *out) {
    const float resid_std = 0.02f / sqrtf(2.0f * (float)c->n_layer);
    const float std_NORMAL = 0.02f, std_RESID = resid_std, std_ONES = 0.0f, std_ZEROS = 0.0f;
    const dt_init_kind init_NORMAL = DT_INIT_NORMAL, init_RESID = DT_INIT_NORMAL,
                       init_ONES = DT_INIT_ONES, init_ZEROS = DT_INIT_ZEROS;
    int n = 0;
#define DT_X_ROW(id, group, rows, cols, init, decay, name, hf, tr)                                 \
    out[n++] = (dt_tensor_info){name, hf, DT_PG_##group, DT_ELEM_F32, (size_t)(rows),              \
                                (size_t)(cols), 0, init_##init, std_##init, decay, tr, 0, 0, 0, 0, 0, 0, 0, .split = 0};
    DT_GPT2_PARAMS(DT_X_ROW)
#undef DT_X_ROW
    out[DT_GPT2_P_WTE].file_rows = (size_t)c->vocab; /* files hold no vocabulary padding */
    out[DT_GPT2_P_WTE].vocab = 1;
    static const int mm[] = {DT_GPT2_P_WTE, DT_GPT2_P_QKVW, DT_GPT2_P_ATTPROJW, DT_GPT2_P_FCW, DT_GPT2_P_FCPROJW};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) out[mm[i]].matmul = 1;
    /* the split column (params.h; tensor parallelism): q|k|v head-wise, fc by columns, both
     * output projections by rows of their input, the tied embedding by vocabulary rows */
    out[DT_GPT2_P_WTE].split = out[DT_GPT2_P_FCW].split = out[DT_GPT2_P_FCB].split = DT_SPLIT_OUT;
    out[DT_GPT2_P_QKVW].split = out[DT_GPT2_P_QKVB].split = DT_SPLIT_OUT;
    out[DT_GPT2_P_QKVW].sections = out[DT_GPT2_P_QKVB].sections = 3;
    out[DT_GPT2_P_ATTPROJW].split = out[DT_GPT2_P_FCPROJW].split = DT_SPLIT_IN;
    /* sub-layer units (params.h): [ln_1, attention] [ln_2, fc] [fc_proj] */
    out[DT_GPT2_P_LN2W].unit_start = out[DT_GPT2_P_FCPROJW].unit_start = 1;
    return n;
}

static size_t gpt2_num_params(const dt_model_config *c) {
    size_t C = c->d_model, L = c->n_layer;
    return (size_t)c->vocab * C + (size_t)c->context * C + L * (12 * C * C + 13 * C) + 2 * C;
}

static double gpt2_flops_per_token(const dt_model_config *c, int T) {
    double C = c->d_model, L = c->n_layer;
    double n = L * (12.0 * C * C + 13.0 * C) + 2.0 * C + (double)c->vocab * C;
    return 6.0 * n + 12.0 * L * (double)T * C;
}

/* ------------------------------------------------------------------ layout */

typedef struct dt_gpt2_acts {
    float *encoded;                       /* (B,T,C) */
    /* Per layer (slots: family_impl.h): recomputed class */
    float *ln1, *ln1_mean, *ln1_rstd;     /* (B,T,C), (B,T), (B,T) */
    float *ln2, *ln2_mean, *ln2_rstd;     /* (B,T,C), (B,T), (B,T) */
    float *fch_gelu;                      /* (B,T,4C) */
    uint16_t *ln1h, *attyh, *ln2h, *fchgh; /* mixed precision: 16-bit ln1, atty, ln2, fch_gelu
                                             (then ln1, ln2, fch_gelu hold nothing) */
    /* what selective keeps: qkv in every precision; fch in fp32; atty, att_lse, res2 under
       mixed precision (otherwise of the recomputed class: att_class, fch_class) */
    float *qkv;                           /* (B,T,3C) */
    float *atty;                          /* (B,T,C) */
    float *att_lse;                       /* (B,NH,T) */
    float *res2;                          /* (B,T,C) the residual after the attention block */
    float *fch;                           /* (B,T,4C) */
    /* layer outputs */
    float *res3;                          /* (L,B,T,C) */
    float *lnf, *lnf_mean, *lnf_rstd;     /* (B,T,C), (B,T), (B,T) */
    uint16_t *lnfh;                       /* mixed precision: 16-bit lnf (lnf holds nothing) */
    float *logits;                        /* (B,T,Vp); dlogits after backward. Fused loss:
                                             one block of rows (model.h) */
    float *losses, *ce_lse;               /* (B,T) */
    float *dres;                          /* (B,T,C) residual-stream gradient */
    float *dbtc;                          /* (B,T,C) scratch gradient */
    float *dbig;                          /* (B,T,4C) scratch gradient (also dqkv); in the
                                             forward, the fp32 output of a 16-bit activation */
    uint16_t *dlp;                        /* (B,T,4C) mixed precision: narrowed gradients */
    float *tpx;                           /* (B,T,C) tensor parallelism's blocks test mode: a
                                             shard's partial sum (family_impl.h) */
    float *tpstat;                        /* (2 B T) tensor parallelism: the loss's row statistics */
    float *spa, *spb;                     /* (B,T,C) sequence parallelism: gathered rows, partial sums */
    float *sptmp;                         /* sequence parallelism: max(4 C, 2 T C) gradient sums */
    uint16_t *spah;                       /* (B,T,C) sequence parallelism under mixed precision:
                                             a norm output's 16-bit copy, every row */
    int32_t *inputs, *targets;            /* (B,T) copies kept for the backward */
    float *cps;                           /* context parallelism: the ring attention's scratch (model/cp.h) */
} dt_gpt2_acts;

/* Classes (family_impl.h) of the attention's outputs (atty, att_lse, res2) and of fch. Under
 * mixed precision ln1, ln2 and fch_gelu are 16-bit, so dropping them saves less than in fp32
 * and selective must drop more to save 40%: it drops fch (4C fp32) and keeps the attention's
 * outputs (2C + NH), recomputing the fc matmul (4 C^2 per token) instead of the attention and
 * the output projection (C^2 + the attention); in fp32 it keeps fch (ARCHITECTURE 37, 52). */
static int att_class(const dt_model_opts *o) { return o->compute != DT_F32 ? DT_ACT_SEL : DT_ACT_RECOMP; }
static int fch_class(const dt_model_opts *o) { return o->compute != DT_F32 ? DT_ACT_RECOMP : DT_ACT_SEL; }

/* Tensor parallelism (family_impl.h): the shards held (nb of k) and their widths. */
typedef struct tp_dims {
    int k, nb;    /* shards of a split tensor; held by this process */
    int Cl, NHl;  /* attention width and heads per shard */
    int Fl;       /* MLP width per shard (4 C / k) */
    int Vl;       /* padded vocabulary per shard */
} tp_dims;

static tp_dims dims_of(const dt_model_config *c, const dt_model_opts *o) {
    tp_dims d;
    d.k = dt_tp_size(o), d.nb = dt_tp_local(o);
    d.Cl = c->d_model / d.k, d.NHl = c->n_head / d.k, d.Fl = 4 * c->d_model / d.k;
    d.Vl = dt_model_vocab_padded(c, o) / d.k;
    return d;
}

/* Lays the activation views over `base` (NULL: just count). Returns floats used. Split
 * activations (q|k|v, the attention output, the MLP's) hold nb shard blocks each. */
static size_t layout_acts(dt_gpt2_acts *a, float *base, const dt_model_config *c,
                          const dt_model_opts *o, int B, int T) {
    size_t C = c->d_model, BT = (size_t)B * T;
    const tp_dims d = dims_of(c, o);
    const size_t Q = (size_t)d.nb * 3 * d.Cl, A = (size_t)d.nb * d.Cl, NHS = (size_t)d.nb * d.NHl,
                 F = (size_t)d.nb * d.Fl, V = (size_t)d.nb * d.Vl;
    const size_t BIG = F > C ? F : C, LP = (size_t)d.Fl > C ? (size_t)d.Fl : C;
    int L = dt_stage_layers(c, o);
    const size_t LAST = (size_t)dt_stage_last(c, o); /* a pipeline stage that runs the head */
    size_t R = dt_act_slot(o, L, DT_ACT_RECOMP, L), M = dt_act_slot(o, L, DT_ACT_SEL, L);
    size_t RA = dt_act_slot(o, L, att_class(o), L), RF = dt_act_slot(o, L, fch_class(o), L);
    size_t H = o->compute != DT_F32, F32 = !H; /* 16-bit copies, fp32-only buffers */
    /* sequence parallelism: the residual stream and the norms hold this process's token rows */
    const size_t SP = o->sp != 0, RW = SP ? BT / (size_t)d.k * (size_t)d.nb : BT;
    size_t off = 0;
#define TAKE(field, n) (a->field = dt_act_take(base, &off, (n)))
#define TAKE16(field, n) (a->field = dt_act_take16(base, &off, (n)))
    TAKE(encoded, RW * C);
    TAKE(ln1, F32 * R * RW * C);
    TAKE(ln1_mean, R * RW);
    TAKE(ln1_rstd, R * RW);
    TAKE(qkv, M * BT * Q);
    TAKE(atty, RA * BT * A);
    TAKE(att_lse, RA * BT * NHS);
    TAKE(res2, RA * RW * C);
    TAKE(ln2, F32 * R * RW * C);
    TAKE(ln2_mean, R * RW);
    TAKE(ln2_rstd, R * RW);
    TAKE(fch, RF * BT * F);
    TAKE(fch_gelu, F32 * R * BT * F);
    TAKE16(ln1h, H * R * RW * C);
    TAKE16(attyh, H * R * BT * A);
    TAKE16(ln2h, H * R * RW * C);
    TAKE16(fchgh, H * R * BT * F);
    TAKE(res3, (size_t)L * RW * C);
    TAKE(lnf, LAST * F32 * BT * C); /* sequence parallelism: gathered for the head */
    TAKE16(lnfh, LAST * H * BT * C);
    TAKE(lnf_mean, LAST * RW);
    TAKE(lnf_rstd, LAST * RW);
    TAKE(logits, LAST * (size_t)dt_model_logit_rows(o, (int)BT) * V);
    TAKE(losses, LAST * BT);
    TAKE(ce_lse, LAST * BT);
    TAKE(dres, RW * C);
    TAKE(dbtc, BT * C);
    TAKE(dbig, BT * BIG);
    TAKE16(dlp, H * BT * LP);
    TAKE(tpx, (d.nb > 1) * BT * C); /* the blocks test mode's partial sums */
    TAKE(tpstat, LAST * (d.k > 1) * 2 * BT); /* the vocabulary-parallel loss's row statistics */
    /* sequence parallelism: two gathered (all rows) working buffers, and the scratch of the
     * norms' and positions' gradient sums */
    TAKE(spa, SP * BT * C);
    TAKE(spb, SP * BT * C);
    TAKE16(spah, SP * H * BT * C); /* the gathered 16-bit copy (mixed precision) */
    TAKE(sptmp, SP * (4 * C > 2 * (size_t)T * C ? 4 * C : 2 * (size_t)T * C));
    TAKE(cps, o->cp > 1 ? dt_cp_scratch_floats(B, T, d.NHl, d.NHl, C / c->n_head, o->cp, o->cp_all_gather) : 0);
    float *ids = dt_act_take(base, &off, 2 * BT);
    a->inputs = (int32_t *)ids;
    a->targets = ids ? (int32_t *)ids + BT : NULL;
#undef TAKE
#undef TAKE16
    return off;
}

static size_t gpt2_act_floats(const dt_model_config *c, const dt_model_opts *o, int B, int T) {
    dt_gpt2_acts a;
    return layout_acts(&a, NULL, c, o, B, T);
}

static void gpt2_bind(dt_model *m) {
    dt_gpt2_acts *a = m->impl;
    layout_acts(a, m->acts, &m->cfg, &m->opts, m->B, m->T);
    m->lp_scratch = a->dlp;
    m->tp_scratch = a->tpx;
    m->tp_stat = a->tpstat;
}

/* Pipeline stage buffers (model.h dt_model_stage_buf): the input is `encoded`, the output the
 * last layer's res3; both gradients pass through dres. */
static float *gpt2_stage_buf(dt_model *m, dt_stage_buf which) {
    dt_gpt2_acts *a = m->impl;
    return dt_fam_stage_buf(m, which, a->encoded, a->res3, a->dres, m->B * m->T);
}

static const float *gpt2_logits(const dt_model *m) { return ((const dt_gpt2_acts *)m->impl)->logits; }

/* ------------------------------------------------------------------ forward / backward */

#define P(id, l) dt_fam_param(m, DT_GPT2_P_##id, l)
#define G(id, l) dt_fam_grad(m, DT_GPT2_P_##id, l)
#define UNIT(id) (dt_model_weights(m)->tensors[DT_GPT2_P_##id].unit)
#define LAYER(l) DT_UNIT_LAYER(dt_model_weights(m), dt_fam_layer(m, l))
#define ID(id) DT_GPT2_P_##id
/* Layer l's unit holding tensor id (sub-layer units: family_impl.h). */
#define SUB(id, l) dt_fam_unit(m, DT_GPT2_P_##id, l)
/* The unit layer l's backward reads first. */
#define BWD_FIRST(l) dt_fam_bwd_first(m, l, SUB(LN1W, l), SUB(FCPROJW, l))
/* A matmul input of layer views v: fp32 and 16-bit copies (one of them used). */
#define MMIN(x) ((dt_mmin){v.x, v.x##h})

/* Views of layer l's saved activations (its slots). */
typedef struct layer_views {
    const float *resid;
    float *ln1, *ln1m, *ln1r, *qkv, *atty, *lse, *res2, *ln2, *ln2m, *ln2r, *fch, *fchg, *res3;
    uint16_t *ln1h, *attyh, *ln2h, *fchgh;
} layer_views;

static layer_views views(const dt_model *m, int l) {
    const dt_gpt2_acts *a = m->impl;
    const dt_model_config *c = &m->cfg;
    const tp_dims d = dims_of(c, &m->opts);
    const int L = dt_stage_layers(c, &m->opts);
    /* the residual stream and the norms: the token rows held (sequence parallelism) */
    size_t BT = (size_t)dt_sp_rows(m, m->B * m->T), btc = BT * c->d_model;
    size_t BTF = (size_t)m->B * m->T; /* every row: the split activations */
    size_t bta = BTF * (size_t)d.nb * d.Cl, btf = BTF * (size_t)d.nb * d.Fl; /* split widths */
    const dt_model_opts *o = &m->opts;
    size_t r = dt_act_slot(o, L, DT_ACT_RECOMP, l), k = dt_act_slot(o, L, DT_ACT_SEL, l);
    size_t ra = dt_act_slot(o, L, att_class(o), l), rf = dt_act_slot(o, L, fch_class(o), l);
    layer_views v;
    v.resid = l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * btc;
    v.ln1 = a->ln1 + r * btc, v.ln1m = a->ln1_mean + r * BT, v.ln1r = a->ln1_rstd + r * BT;
    v.qkv = a->qkv + k * bta * 3, v.atty = a->atty + ra * bta;
    v.lse = a->att_lse + ra * BTF * (size_t)d.nb * d.NHl, v.res2 = a->res2 + ra * btc;
    v.ln2 = a->ln2 + r * btc, v.ln2m = a->ln2_mean + r * BT, v.ln2r = a->ln2_rstd + r * BT;
    v.fch = a->fch + rf * btf, v.fchg = a->fch_gelu + r * btf, v.res3 = a->res3 + (size_t)l * btc;
    v.ln1h = a->ln1h + r * btc, v.attyh = a->attyh + r * bta, v.ln2h = a->ln2h + r * btc;
    v.fchgh = a->fchgh + r * btf;
    if (dt_lowp(m)) v.ln1 = v.ln2 = v.fchg = a->dbig; /* fp32 outputs go through the scratch */
    return v;
}

/* Layer l's forward, announcing its units in order (`next`: the unit read after the layer).
 * `recompute` (in the backward): only what the layer dropped, into its working slots (the
 * classes above); every mode keeps the layer output. Under tensor parallelism (family_impl.h)
 * q|k|v and the MLP's first projection are column-parallel (heads and MLP columns split), the
 * attention runs on the shard's heads, and the two output projections are row-parallel. Under
 * sequence parallelism the residual stream and the norms hold this process's token rows (RW of
 * BT): each norm's output is gathered for the column-parallel GEMM that reads it (in 16 bits
 * under mixed precision), each row-parallel GEMM's partial sums are reduce-scattered back to
 * the rows; the backward mirrors it, re-gathering the norm outputs it kept only for its rows. */
static void block_forward(dt_model *m, int l, int recompute, int next) {
    const dt_model_config *c = &m->cfg;
    const dt_model_opts *o = &m->opts;
    const tp_dims d = dims_of(c, o);
    int B = m->B, T = m->T, C = c->d_model, NH = c->n_head, BT = B * T, RW = dt_sp_rows(m, BT);
    size_t rwc = (size_t)RW * C;
    layer_views v = views(m, l);
    const int qkv = dt_act_forms(o, l, recompute, DT_ACT_SEL), att = dt_act_forms(o, l, recompute, att_class(o));
    const int fch = dt_act_forms(o, l, recompute, fch_class(o));
    double *pf = recompute ? m->prof.bwd : m->prof.fwd;
    dt_gpt2_acts *a = m->impl;
    dt_unit_need(m, SUB(LN1W, l), SUB(LN2W, l));
    DT_PROF_TO(m, pf, DT_OP_LAYERNORM, dt_layernorm_forward(v.ln1, v.ln1m, v.ln1r, v.resid, P(LN1W, l), P(LN1B, l), RW, C));
    dt_fam_narrow(m, v.ln1h, v.ln1, rwc);
    if (qkv) {
        const dt_mmin x = dt_sp_col_input(m, MMIN(ln1), a->spa, a->spah, BT, C);
        DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_tp_col_forward(m, v.qkv, x, ID(QKVW), l, P(QKVB, l), BT, C, 3 * d.Cl));
    }
    if (att)
        for (int j = 0; j < d.nb; j++)
            DT_PROF_TO(m, pf, DT_OP_ATTENTION, dt_fam_attention_forward(m, v.atty + (size_t)j * BT * d.Cl,
                                                                        v.lse + (size_t)j * BT * d.NHl,
                                                                        v.qkv + (size_t)j * BT * 3 * d.Cl, B, T, d.NHl, d.NHl,
                                                                        C / NH, a->cps));
    dt_fam_narrow(m, v.attyh, v.atty, (size_t)BT * d.nb * d.Cl);
    if (att) {
        DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_sp_row_forward(m, v.res2, MMIN(atty), ID(ATTPROJW), l, P(ATTPROJB, l), BT, d.Cl, C,
                                                          a->spb, a->tpx));
        DT_PROF_TO(m, pf, DT_OP_RESIDUAL, dt_residual_forward(v.res2, v.res2, v.resid, (int)rwc));
    }
    dt_unit_need(m, SUB(LN2W, l), SUB(FCPROJW, l));
    DT_PROF_TO(m, pf, DT_OP_LAYERNORM, dt_layernorm_forward(v.ln2, v.ln2m, v.ln2r, v.res2, P(LN2W, l), P(LN2B, l), RW, C));
    dt_fam_narrow(m, v.ln2h, v.ln2, rwc);
    if (fch) {
        const dt_mmin x = dt_sp_col_input(m, MMIN(ln2), a->spa, a->spah, BT, C);
        DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_tp_col_forward(m, v.fch, x, ID(FCW), l, P(FCB, l), BT, C, d.Fl));
    }
    const size_t btf = (size_t)BT * d.nb * d.Fl;
    DT_PROF_TO(m, pf, DT_OP_GELU, dt_gelu_forward(v.fchg, v.fch, (int)btf));
    dt_fam_narrow(m, v.fchgh, v.fchg, btf);
    if (recompute) return;
    dt_unit_need(m, SUB(FCPROJW, l), next);
    DT_PROF(m, fwd, DT_OP_MATMUL, dt_sp_row_forward(m, v.res3, MMIN(fchg), ID(FCPROJW), l, P(FCPROJB, l), BT, d.Fl, C,
                                                    a->spb, a->tpx));
    DT_PROF(m, fwd, DT_OP_RESIDUAL, dt_residual_forward(v.res3, v.res3, v.res2, (int)rwc));
}

/* The embedding (vocabulary-parallel: summed over the group) and positions into `encoded`:
 * under sequence parallelism formed for every row (the vocabulary shards' sum) and kept for
 * the rows held. */
static void embed_forward(dt_model *m, const int32_t *inputs) {
    const dt_model_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->d_model, BT = B * T;
    dt_gpt2_acts *a = m->impl;
    if (!m->opts.sp) {
        dt_vocab_embed_forward(m, DT_GPT2_P_WTE, a->encoded, inputs, BT, UNIT(WPE));
        dt_unit_need(m, UNIT(WPE), LAYER(0));
        DT_PROF(m, fwd, DT_OP_ENCODER, dt_fam_pos(m, a->encoded, P(WPE, 0), B, T, C, 0));
        return;
    }
    dt_vocab_embed_forward(m, DT_GPT2_P_WTE, a->spa, inputs, BT, UNIT(WPE));
    dt_copy(a->encoded, a->spa + (size_t)dt_sp_row0(m, BT) * C, (size_t)dt_sp_rows(m, BT) * C * sizeof(float));
    dt_unit_need(m, UNIT(WPE), LAYER(0));
    DT_PROF(m, fwd, DT_OP_ENCODER, dt_sp_pos_forward(m, a->encoded, P(WPE, 0), BT, T, C));
}

/* The final norm of the rows held, every row of it (gathered under sequence parallelism) in
 * lnf / lnfh for the head. */
static void final_norm_forward(dt_model *m) {
    const dt_model_config *c = &m->cfg;
    int C = c->d_model, L = dt_stage_layers(c, &m->opts), BT = m->B * m->T, RW = dt_sp_rows(m, BT), r0 = dt_sp_row0(m, BT);
    dt_gpt2_acts *a = m->impl;
    const float *last = a->res3 + (size_t)(L - 1) * RW * C;
    dt_unit_need(m, UNIT(LNFW), UNIT(WTE));
    float *lnf = dt_lowp(m) ? a->dbig : a->lnf + (size_t)r0 * C; /* its place among every row */
    DT_PROF(m, fwd, DT_OP_LAYERNORM, dt_layernorm_forward(lnf, a->lnf_mean, a->lnf_rstd, last, P(LNFW, 0), P(LNFB, 0), RW, C));
    dt_fam_narrow(m, a->lnfh + (size_t)r0 * C, lnf, (size_t)RW * C);
    dt_sp_gather_norm(m, a->lnf, a->lnfh, lnf, BT, C);
}

static dt_status gpt2_forward(dt_ctx *ctx, dt_model *m, const int32_t *inputs, const int32_t *targets,
                          float *loss) {
    const dt_model_config *c = &m->cfg;
    int B = m->B, T = m->T, L = dt_stage_layers(c, &m->opts);
    int V = c->vocab, BT = B * T;
    /* a pipeline stage (model.h): the first embeds, the others start from DT_STAGE_IN; the last
     * runs the head (the tied embedding's copy), the others stop at DT_STAGE_OUT */
    const int last = dt_stage_last(c, &m->opts);
    dt_gpt2_acts *a = m->impl;
    DT_CHECK(dt_model_check_tokens(ctx, inputs, targets, BT, V));
    dt_copy(a->inputs, inputs, (size_t)BT * sizeof(int32_t));
    if (targets) dt_copy(a->targets, targets, (size_t)BT * sizeof(int32_t));
    m->has_targets = targets != NULL;
    if (dt_stage_first(&m->opts)) embed_forward(m, inputs);
    for (int l = 0; l < L; l++) {
        double tl = dt_trace_begin();
        block_forward(m, l, 0, l + 1 < L ? LAYER(l + 1) : last ? UNIT(LNFW) : -1);
        dt_trace_end(tl, "fwd", "fwd layer %d", dt_params_layer(&m->ps, m->chunk_l0 + l));
    }
    if (!last) return DT_OK;
    final_norm_forward(m);
    dt_vocab_lm_forward(m, DT_GPT2_P_WTE, (dt_mmin){a->lnf, a->lnfh}, targets, a->logits, a->losses, a->ce_lse, a->dbtc);
    if (!targets) return DT_OK;
    m->last_loss = dt_model_mean_loss(a->losses, targets, BT); /* NaN/Inf: training.nonfinite decides */
    if (loss) *loss = m->last_loss;
    return DT_OK;
}

static void gpt2_backward(dt_model *m, float scale) {
    const dt_model_config *c = &m->cfg;
    const tp_dims d = dims_of(c, &m->opts);
    int B = m->B, T = m->T, C = c->d_model, NH = c->n_head, L = dt_stage_layers(c, &m->opts);
    int BT = B * T;
    dt_gpt2_acts *a = m->impl;
    DT_ASSERT(m->has_targets); /* backward needs a forward with targets */
    m->has_targets = 0;        /* dlogits overwrite the logits: one backward per forward */
    const int RW = dt_sp_rows(m, BT), r0 = dt_sp_row0(m, BT);
    const size_t rwc = (size_t)RW * C;
    const float *dlogits = NULL;
    if (dt_stage_last(c, &m->opts)) {
        /* the tied head: dx now, its weight gradient with the embedding's (at the end) */
        dlogits = dt_vocab_lm_backward(m, DT_GPT2_P_WTE, (dt_mmin){a->lnf, a->lnfh}, a->targets, a->logits, a->losses,
                                       a->ce_lse, a->dbtc, scale, UNIT(LNFW));
        dt_fill(a->dres, 0, rwc * sizeof(float));
        const float *last = a->res3 + (size_t)(L - 1) * rwc;
        dt_unit_need(m, UNIT(LNFW), BWD_FIRST(L - 1));
        dt_unit_grads_begin(m, UNIT(LNFW));
        DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_sp_layernorm_backward(m, a->dres, G(LNFW, 0), G(LNFB, 0), a->dbtc + (size_t)r0 * C,
                                                                  last, P(LNFW, 0), a->lnf_mean, a->lnf_rstd, BT, C, a->sptmp));
        dt_unit_grads_end(m, UNIT(LNFW));
    } /* else a pipeline stage's output gradient is in dres already (DT_STAGE_DOUT) */
    const int top = dt_act_top_recomputed(&m->opts, L);
    const size_t btf = (size_t)BT * d.nb * d.Fl;
    for (int l = L - 1; l >= 0; l--) {
        double tl = dt_trace_begin();
        if (dt_model_recomputes(&m->opts, l) && l != top) block_forward(m, l, 1, -1);
        layer_views v = views(m, l);
        const int u2 = SUB(FCPROJW, l), u1 = SUB(LN2W, l), u0 = SUB(LN1W, l);
        dt_unit_need(m, u2, u1);
        dt_unit_grads_begin(m, u2);
        /* dres holds d(res3) (the rows held); the residual passes it to res2 unchanged. */
        const float *dout = dt_sp_dout(m, a->dres, a->spa, BT, C);
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_tp_row_backward(m, a->dbig, ID(FCPROJW), l, G(FCPROJB, l), dout, MMIN(fchg), BT, d.Fl, C));
        dt_unit_grads_end(m, u2);
        DT_PROF(m, bwd, DT_OP_GELU, dt_gelu_backward(a->dbig, v.fch, a->dbig, (int)btf));
        dt_unit_need(m, u1, u0);
        dt_unit_grads_begin(m, u1);
        dt_mmin x = dt_sp_col_input(m, MMIN(ln2), a->spa, a->spah, BT, C); /* the fc input, every row */
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_sp_col_backward(m, a->dbtc, ID(FCW), l, G(FCB, l), a->dbig, x, BT, C, d.Fl, a->spb, a->tpx));
        DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_sp_layernorm_backward(m, a->dres, G(LN2W, l), G(LN2B, l), a->dbtc, v.res2, P(LN2W, l),
                                                                  v.ln2m, v.ln2r, BT, C, a->sptmp));
        dt_unit_grads_end(m, u1);
        dt_unit_need(m, u0, l > 0 ? BWD_FIRST(l - 1) : -1);
        dt_unit_grads_begin(m, u0);
        /* dres now holds d(res2); the residual passes it to resid unchanged. */
        dout = dt_sp_dout(m, a->dres, a->spa, BT, C);
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_tp_row_backward(m, a->dbtc, ID(ATTPROJW), l, G(ATTPROJB, l), dout, MMIN(atty), BT, d.Cl, C));
        for (int j = 0; j < d.nb; j++)
            DT_PROF(m, bwd, DT_OP_ATTENTION, dt_fam_attention_backward(m, a->dbig + (size_t)j * BT * 3 * d.Cl,
                                                                       a->dbtc + (size_t)j * BT * d.Cl,
                                                                       v.qkv + (size_t)j * BT * 3 * d.Cl, v.atty + (size_t)j * BT * d.Cl,
                                                                       v.lse + (size_t)j * BT * d.NHl, B, T, d.NHl, d.NHl, C / NH,
                                                                       a->cps));
        x = dt_sp_col_input(m, MMIN(ln1), a->spa, a->spah, BT, C); /* the q|k|v input, every row */
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_sp_col_backward(m, a->dbtc, ID(QKVW), l, G(QKVB, l), a->dbig, x, BT, C, 3 * d.Cl, a->spb,
                                                         a->tpx));
        DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_sp_layernorm_backward(m, a->dres, G(LN1W, l), G(LN1B, l), a->dbtc, v.resid, P(LN1W, l),
                                                                  v.ln1m, v.ln1r, BT, C, a->sptmp));
        dt_trace_end(tl, "bwd", "bwd layer %d", dt_params_layer(&m->ps, m->chunk_l0 + l));
        dt_unit_grads_end(m, u0);
    }
    if (!dt_stage_first(&m->opts)) { /* dres holds d(encoded): DT_STAGE_DIN */
        /* the last stage's copy of the tied embedding: the head's weight gradient (family_impl.h) */
        if (dlogits) dt_vocab_embed_backward(m, DT_GPT2_P_WTE, NULL, NULL, BT, dlogits, (dt_mmin){a->lnf, a->lnfh});
        return;
    }
    /* Units end in decreasing order: wpe's, then wte's chunks from the last. */
    dt_unit_grads_begin(m, UNIT(WPE));
    if (m->opts.sp)
        DT_PROF(m, bwd, DT_OP_ENCODER, dt_sp_pos_backward(m, G(WPE, 0), a->dres, BT, T, C, a->sptmp));
    else
        DT_PROF(m, bwd, DT_OP_ENCODER, dt_fam_pos(m, a->dres, G(WPE, 0), B, T, C, 1));
    dt_unit_grads_end(m, UNIT(WPE));
    /* d(encoded) of every row (gathered): each rank's vocabulary rows */
    dt_vocab_embed_backward(m, DT_GPT2_P_WTE, dt_sp_dout(m, a->dres, a->spa, BT, C), a->inputs, BT, dlogits,
                            (dt_mmin){a->lnf, a->lnfh});
}

/* Hugging Face config.json -> config (src/ckpt/hf_import.c calls it by model_type). */
/* zb-h1's deferred douts (model.h defer_douts / defer_spans; every shard held, decision 84; a layer that recomputes
 * its forward defers nothing and frees only its output and layer 0's input, the rest of it
 * being the working slots the next recompute overwrites): a
 * layer's backward defers c_proj's (MLP), c_fc's, the attention c_proj's and c_attn's douts
 * in that order (the tied head and the embeddings: formed in the backward). Dead by then: the
 * layer's output res3 (read by the layer above's backward or the final norm's), fch once the
 * GELU's backward read it (before the 2nd dout), res2 and ln_2's statistics once ln_2's
 * backward did (before the 3rd), q|k|v, the log-sum-exp and (16-bit copies kept for W) the fp32
 * attention output once the attention's did (before the 4th), ln_1's statistics and the
 * embedding output after the layer. W reads ln1, atty, ln2, fch_gelu (or 16-bit copies). */
static int gpt2_defer_douts(const dt_model *m, int l, size_t *n) {
    const tp_dims d = dims_of(&m->cfg, &m->opts);
    const size_t BT = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model;
    const int L = dt_stage_layers(&m->cfg, &m->opts);
    if (l < 0 || l >= L || dt_model_recomputes(&m->opts, l)) return 0;
    const size_t nb = (size_t)d.nb; /* every row (gathered under sequence parallelism), the shards held */
    n[0] = BT * C, n[1] = BT * nb * (size_t)d.Fl, n[2] = BT * C, n[3] = BT * 3 * nb * (size_t)d.Cl;
    return 4;
}

static int gpt2_defer_spans(const dt_model *m, int l, dt_act_span *out) {
    const tp_dims d = dims_of(&m->cfg, &m->opts);
    /* the split activations: every row, the shards held; the residual stream and the norms'
     * statistics: the rows held (RW, sequence parallelism) */
    const size_t BT = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model, nb = (size_t)d.nb,
                 RW = (size_t)dt_sp_rows(m, (int)BT);
    layer_views v = {0};
    if (m->acts) v = views(m, l);
    int n = 0;
#define SPAN(ptr, len, at) (out[n++] = (dt_act_span){m->acts ? (float *)(ptr) : NULL, (len), (at)})
    if (dt_model_recomputes(&m->opts, l))
        return dt_fam_recomputed_spans(l, m->acts ? v.res3 : NULL, m->acts ? ((dt_gpt2_acts *)m->impl)->encoded : NULL, RW * C, out);
    SPAN(v.res3, RW * C, 0);
    SPAN(v.fch, BT * nb * (size_t)d.Fl, 1);
    SPAN(v.res2, RW * C, 2);
    SPAN(v.ln2m, RW, 2);
    SPAN(v.ln2r, RW, 2);
    SPAN(v.qkv, BT * 3 * nb * (size_t)d.Cl, 3);
    SPAN(v.lse, BT * nb * (size_t)d.NHl, 3);
    if (dt_lowp(m)) SPAN(v.atty, BT * nb * (size_t)d.Cl, 3);
    SPAN(v.ln1m, RW, 4);
    SPAN(v.ln1r, RW, 4);
    if (l == 0) SPAN(m->acts ? ((dt_gpt2_acts *)m->impl)->encoded : NULL, RW * C, 4);
#undef SPAN
    return n;
}

static dt_status gpt2_hf_read(dt_ctx *ctx, const dt_hf_json *j, dt_model_config *c) {
    int inner, tied;
    DT_CHECK(dt_hf_json_int(ctx, j, "n_embd", -1, &c->d_model));
    DT_CHECK(dt_hf_json_int(ctx, j, "n_layer", -1, &c->n_layer));
    DT_CHECK(dt_hf_json_int(ctx, j, "n_head", -1, &c->n_head));
    DT_CHECK(dt_hf_json_int(ctx, j, "vocab_size", -1, &c->vocab));
    DT_CHECK(dt_hf_json_int(ctx, j, "n_positions", 1024, &c->context));
    DT_CHECK(dt_hf_json_int(ctx, j, "n_inner", 0, &inner));
    if (inner && inner != 4 * c->d_model)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: n_inner %d is not supported (gpt2's MLP is 4 x n_embd)", j->path, inner);
    DT_CHECK(dt_hf_json_bool(ctx, j, "tie_word_embeddings", 1, &tied));
    if (!tied) return dt_fail(ctx, DT_ERR_CONFIG, "%s: tie_word_embeddings false is not supported for gpt2", j->path);
    static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
    DT_CHECK(dt_hf_json_want(ctx, j, "activation_function", gelu));
    float eps;
    DT_CHECK(dt_hf_json_float(ctx, j, "layer_norm_epsilon", 1e-5, &eps));
    if (eps != 1e-5f)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: layer_norm_epsilon %g is not supported (dtrain's gpt2 uses 1e-5)",
                       j->path, (double)eps);
    return DT_OK;
}

static int gpt2_hf_config(const dt_model_config *c, char *buf, size_t n) {
    return snprintf(buf, n,
                    "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n"
                    "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
                    "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
                    "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": true",
                    c->vocab, c->context, c->context, c->d_model, c->n_layer, c->n_head);
}

/* LoRA sites: q, k, v are row blocks of the fused c_attn; o = attn.c_proj, up = mlp.c_fc,
 * down = mlp.c_proj (no gate). PEFT adapts c_attn whole, so these have no PEFT names. */
static int gpt2_lora_sites(const dt_model_config *c, dt_lora_site *out) {
#define SITE(t, id, row0, rows, mod)                                                            \
    (dt_lora_site){t, DT_GPT2_P_##id, (size_t)(row0), (size_t)(rows), "h.%d." mod ".lora_A.weight", \
                   "h.%d." mod ".lora_B.weight", NULL, NULL}
    const size_t C = (size_t)c->d_model;
    out[0] = SITE(DT_LORA_Q, QKVW, 0, C, "attn.c_attn.q");
    out[1] = SITE(DT_LORA_K, QKVW, C, C, "attn.c_attn.k");
    out[2] = SITE(DT_LORA_V, QKVW, 2 * C, C, "attn.c_attn.v");
    out[3] = SITE(DT_LORA_O, ATTPROJW, 0, C, "attn.c_proj");
    out[4] = SITE(DT_LORA_UP, FCW, 0, 4 * C, "mlp.c_fc");
    out[5] = SITE(DT_LORA_DOWN, FCPROJW, 0, C, "mlp.c_proj");
#undef SITE
    return 6;
}

static const char *const hf_types[] = {"gpt2", NULL};
/* tp divides the heads (and so d_model and the MLP's 4 d_model) */
static const size_t tp_divides[] = {offsetof(dt_model_config, n_head), 0};
static const char *const file_fields[] = {"n_layer", "d_model", "n_head", "vocab", "context", NULL};

const dt_model_family dt_family_gpt2 = {
    .name = "gpt2",
    .presets = preset_names,
    .preset = gpt2_preset,
    .validate = gpt2_validate,
    .tensors = gpt2_tensors,
    .act_floats = gpt2_act_floats,
    .impl_bytes = sizeof(dt_gpt2_acts),
    .bind = gpt2_bind,
    .forward = gpt2_forward,
    .backward = gpt2_backward,
    .logits = gpt2_logits,
    .num_params = gpt2_num_params,
    .flops_per_token = gpt2_flops_per_token,
    .file_format = "dtrain-gpt2",
    .file_fields = file_fields,
    .hf_architecture = "GPT2LMHeadModel",
    .hf_model_type = "gpt2",
    .hf_config = gpt2_hf_config,
    .hf_model_types = hf_types,
    .hf_read_config = gpt2_hf_read,
    .lora_sites = gpt2_lora_sites,
    .tp_divides = tp_divides,
    .sp = 1,
    .stage_buf = gpt2_stage_buf,
    .defer_douts = gpt2_defer_douts,
    .defer_spans = gpt2_defer_spans,
};
