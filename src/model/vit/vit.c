/* ViT: presets, the parameter table (vit_params.h), forward, backward. */
#include "model/vit/vit.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/trace.h"
#include "model/family_impl.h"
#include "model/rope.h"
#include "ops/ops.h"

/* ------------------------------------------------------------------ config */

typedef struct preset {
    const char *name;
    int image_size, patch_size, channels, n_classes, n_layer, d_model, n_head, d_ff;
} preset;

/* vit-b16 is ViT-Base/16 at 224 x 224 x 3 with 1000 classes (86.6M parameters), for planning. */
static const preset presets[] = {
    {"vit-tiny", 8, 4, 1, 10, 2, 32, 4, 64},
    {"vit-fashion", 28, 4, 1, 10, 6, 128, 4, 256},
    {"vit-b16", 224, 16, 3, 1000, 12, 768, 12, 3072},
};
static const char *const preset_names[] = {"vit-tiny", "vit-fashion", "vit-b16", NULL};

static void vit_preset(const char *name, dt_model_config *out) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) {
            const preset *p = &presets[i];
            out->image_size = p->image_size, out->patch_size = p->patch_size;
            out->channels = p->channels, out->n_classes = p->n_classes, out->n_layer = p->n_layer;
            out->d_model = p->d_model, out->n_head = p->n_head, out->d_ff = p->d_ff;
        }
}

/* Patches per image, and the sequence the blocks see (patches + the class token). */
static int n_patches(const dt_model_config *c) {
    int g = c->image_size / c->patch_size;
    return g * g;
}

static dt_status vit_validate(dt_ctx *ctx, dt_model_config *c) {
    DT_CHECK(dt_model_refuse_experts(ctx, c, "vit"));
    if (c->n_layer < 1 || c->n_layer > 1024)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_layer must be in [1, 1024] (got %d)", c->n_layer);
    if (c->d_model < 1 || c->d_model > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.d_model must be in [1, 65536] (got %d)", c->d_model);
    if (c->n_head < 1 || c->n_head > c->d_model || c->d_model % c->n_head != 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_head (%d) must divide model.d_model (%d)", c->n_head,
                       c->d_model);
    if (c->image_size < 1 || c->image_size > 4096)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.image_size must be in [1, 4096] (got %d)", c->image_size);
    if (c->patch_size < 1 || c->patch_size > c->image_size || c->image_size % c->patch_size != 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.patch_size (%d) must divide model.image_size (%d)",
                       c->patch_size, c->image_size);
    if (c->channels == 0) c->channels = 1;
    if (c->channels < 1 || c->channels > 16)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.channels must be in [1, 16] (got %d)", c->channels);
    if (n_patches(c) > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.patch_size: %d patches per image (more than 65536)", n_patches(c));
    if (c->n_classes < 2 || c->n_classes > (1 << 20))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_classes must be in [2, 1048576] (got %d)", c->n_classes);
    if (c->d_ff == 0) c->d_ff = 4 * c->d_model;
    if (c->d_ff < 1 || c->d_ff > (1 << 20))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.d_ff must be in [1, 1048576] (got %d)", c->d_ff);
    /* Fixed parts: what another family would set is refused. */
    if (c->n_kv_head && c->n_kv_head != c->n_head)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_kv_head: vit has no grouped-query attention");
    if (c->untied) return dt_fail(ctx, DT_ERR_CONFIG, "model.untied_embeddings: vit has no token embedding");
    if (c->rope_theta != 0.0f) return dt_fail(ctx, DT_ERR_CONFIG, "model.rope_theta: vit has learned positions");
    DT_CHECK(dt_rope_refuse(ctx, c, "vit has learned positions"));
    if (c->norm_eps != 0.0f && c->norm_eps != 1e-5f)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.norm_eps: vit's LayerNorm uses 1e-5 (got %g)", (double)c->norm_eps);
    /* The inputs are pixel values (the "vocabulary" 0..255) and an image is one sample. */
    const int P = c->channels * c->image_size * c->image_size;
    if (c->vocab && c->vocab != 256)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.vocab_size: vit reads 8-bit pixels (256 values; got %d)", c->vocab);
    if (c->context && c->context != P)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.context: a vit sample is one image of %d values (got %d)", P,
                       c->context);
    c->n_kv_head = c->n_head;
    c->norm_eps = 1e-5f;
    c->vocab = c->vocab_padded = 256;
    c->context = P;
    return DT_OK;
}

static int vit_tensors(const dt_model_config *c, dt_tensor_info *out) {
    const size_t K = (size_t)c->channels * c->patch_size * c->patch_size;
    const size_t T = (size_t)n_patches(c) + 1;
    int n = 0;
#define DT_X_ROW(id, group, rows, cols, init, decay, name)                                     \
    out[n++] = (dt_tensor_info){name, name, DT_PG_##group, DT_ELEM_F32, (size_t)(rows),        \
                                (size_t)(cols), 0, DT_INIT_##init, 0.02f, decay, 0, 0, 0, 0, 0, 0, 0, 0, .split = 0};
    DT_VIT_PARAMS(DT_X_ROW)
#undef DT_X_ROW
    (void)K, (void)T;
    static const int mm[] = {DT_VIT_P_PATCHW, DT_VIT_P_QKVW, DT_VIT_P_PROJW, DT_VIT_P_FC1W, DT_VIT_P_FC2W, DT_VIT_P_HEADW};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) out[mm[i]].matmul = 1;
    /* the split column (params.h; tensor parallelism): q|k|v head-wise and fc1 by columns,
     * proj and fc2 by rows of their input; the rest replicated */
    out[DT_VIT_P_QKVW].split = out[DT_VIT_P_QKVB].split = DT_SPLIT_OUT;
    out[DT_VIT_P_QKVW].sections = out[DT_VIT_P_QKVB].sections = 3;
    out[DT_VIT_P_FC1W].split = out[DT_VIT_P_FC1B].split = DT_SPLIT_OUT;
    out[DT_VIT_P_PROJW].split = out[DT_VIT_P_FC2W].split = DT_SPLIT_IN;
    /* sub-layer units (params.h): [norm1, attention] [norm2, fc1] [fc2] */
    out[DT_VIT_P_LN2W].unit_start = out[DT_VIT_P_FC2W].unit_start = 1;
    return n;
}

static double layer_params(const dt_model_config *c) {
    double C = c->d_model, F = c->d_ff;
    return 4.0 * C * C + 2.0 * C * F + 9.0 * C + F;
}

static size_t vit_num_params(const dt_model_config *c) {
    double C = c->d_model, K = (double)c->channels * c->patch_size * c->patch_size;
    double T = n_patches(c) + 1;
    return (size_t)(C * K + C + C + T * C + c->n_layer * layer_params(c) + 2 * C +
                    (double)c->n_classes * (C + 1));
}

/* The trainer counts "tokens" = pixels (its sequence is the image): FLOPs per pixel =
 * FLOPs per image / pixels. Per image: 6 x (patch embedding x patches + blocks x (patches+1)
 * + head) plus attention 12 L T^2 d (PaLM convention, T = patches + 1). */
static double vit_flops_per_token(const dt_model_config *c, int T_pixels) {
    (void)T_pixels;
    double C = c->d_model, L = c->n_layer, Np = n_patches(c), T = Np + 1;
    double K = (double)c->channels * c->patch_size * c->patch_size;
    double per_image = 6.0 * (K * C * Np + L * layer_params(c) * T + C * c->n_classes) +
                       12.0 * L * T * T * C;
    return per_image / (double)c->context;
}

/* ------------------------------------------------------------------ layout */

typedef struct dt_vit_acts {
    float *patches;                  /* (B,Np,K) pixel / 255 */
    uint16_t *patchesh;              /* mixed precision: its 16-bit copy */
    float *pe;                       /* (B,Np,C) patch embeddings */
    float *encoded;                  /* (B,T,C) [cls | patches] + pos */
    /* Per layer (slots: family_impl.h): recomputed class */
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B,T) x 2 */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C), (B,T) x 2 */
    float *fch_gelu;                 /* (B,T,F) */
    uint16_t *ln1h, *attyh, *ln2h, *fchgh; /* mixed precision: 16-bit ln1, atty, ln2, fch_gelu
                                             (then ln1, ln2, fch_gelu hold nothing) */
    /* what selective keeps: fch in every precision; qkv in fp32; atty, att_lse, res2 under
       mixed precision (each otherwise of the recomputed class: qkv_class, att_class) */
    float *qkv;                      /* (B,T,3C) */
    float *atty;                     /* (B,T,C) */
    float *att_lse;                  /* (B,NH,T) */
    float *res2;                     /* (B,T,C) the residual after the attention block */
    float *fch;                      /* (B,T,F) */
    /* layer outputs */
    float *res3;                     /* (L,B,T,C) */
    float *clsx;                     /* (B,C) the last block's class token */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,C), (B), (B) */
    uint16_t *lnfh;                  /* mixed precision: 16-bit lnf (lnf holds nothing) */
    float *logits;                   /* (B,n_classes); dlogits after backward */
    float *losses, *ce_lse;          /* (B) */
    float *dres;                     /* (B,T,C) residual-stream gradient */
    float *dbtc;                     /* (B,T,C) scratch gradient */
    float *dbig;                     /* (B,T,max(3C,F)) scratch gradient */
    float *dcls;                     /* (B,C) x 2: d lnf, d clsx */
    float *tpx;                      /* (B,T,C) tensor parallelism's blocks test mode: a shard's
                                        partial sum (family_impl.h) */
    uint16_t *dlp;                   /* mixed precision: narrowed gradients, max(B T big, B NC) */
    float *spa, *spb;                /* (B,T,C) sequence parallelism: gathered rows, partial sums */
    float *sptmp;                    /* (4 C) sequence parallelism: a norm's gradient sums */
    uint16_t *spah;                  /* (B,T,C) sequence parallelism, mixed precision: a norm
                                        output's 16-bit copy, every row */
    int32_t *labels;                 /* (B) the targets of the last forward */
} dt_vit_acts;

/* Classes (family_impl.h) of qkv and of the attention's outputs (atty, att_lse, res2). Under
 * mixed precision ln1, ln2 and fch_gelu are 16-bit, so dropping them saves less than in fp32
 * and selective must drop more to save 40%: it drops qkv (3C) and keeps the attention's
 * outputs (2C + NH), recomputing the q|k|v matmul (3 C^2 per token) instead of the attention
 * and the output projection (C^2 + the attention); in fp32 it keeps qkv. gpt2 recomputes its
 * fc matmul instead (gpt2.c: its logits block leaves it short of 40% this way). */
static int qkv_class(const dt_model_opts *o) { return o->compute != DT_F32 ? DT_ACT_RECOMP : DT_ACT_SEL; }
static int att_class(const dt_model_opts *o) { return o->compute != DT_F32 ? DT_ACT_SEL : DT_ACT_RECOMP; }

/* Tensor parallelism (family_impl.h): shards held (nb of k) and the per-shard widths. The
 * patch embedding, the class token, positions, norms and the classification head are
 * replicated. */
typedef struct tp_dims {
    int k, nb, Cl, NHl, Fl;
} tp_dims;

static tp_dims dims_of(const dt_model_config *c, const dt_model_opts *o) {
    tp_dims d;
    d.k = dt_tp_size(o), d.nb = dt_tp_local(o);
    d.Cl = c->d_model / d.k, d.NHl = c->n_head / d.k, d.Fl = c->d_ff / d.k;
    return d;
}

static size_t layout_acts(dt_vit_acts *a, float *base, const dt_model_config *c,
                          const dt_model_opts *o, int B) {
    const tp_dims d = dims_of(c, o);
    size_t L = (size_t)dt_stage_layers(c, o), C = c->d_model, Np = n_patches(c);
    /* a pipeline stage (model.h): the patch embedding's buffers on the first only, the head's on
     * the last only */
    const size_t FIRST = (size_t)dt_stage_first(o), LAST = (size_t)dt_stage_last(c, o);
    size_t NH = (size_t)d.nb * d.NHl, F = (size_t)d.nb * d.Fl, Q = (size_t)d.nb * 3 * d.Cl, A = (size_t)d.nb * d.Cl;
    size_t T = Np + 1, BT = (size_t)B * T, K = (size_t)c->channels * c->patch_size * c->patch_size;
    size_t big = Q > F ? Q : F;
    big = big > C ? big : C;
    size_t call = (size_t)3 * d.Cl > (size_t)d.Fl ? (size_t)3 * d.Cl : (size_t)d.Fl; /* one GEMM's output */
    call = call > C ? call : C;
    size_t R = dt_act_slot(o, (int)L, DT_ACT_RECOMP, (int)L), M = dt_act_slot(o, (int)L, DT_ACT_SEL, (int)L);
    size_t RA = dt_act_slot(o, (int)L, att_class(o), (int)L), RQ = dt_act_slot(o, (int)L, qkv_class(o), (int)L);
    size_t H = o->compute != DT_F32, F32 = !H; /* 16-bit copies, fp32-only buffers */
    size_t NC = (size_t)c->n_classes, dlp = BT * call > (size_t)B * NC ? BT * call : (size_t)B * NC;
    /* sequence parallelism: the residual stream and the norms hold this process's token rows */
    const size_t SP = o->sp != 0, RW = SP ? BT / (size_t)d.k * (size_t)d.nb : BT;
    size_t off = 0;
#define TAKE(field, n) (a->field = dt_act_take(base, &off, (n)))
#define TAKE16(field, n) (a->field = dt_act_take16(base, &off, (n)))
    TAKE(patches, FIRST * (size_t)B * Np * K);
    TAKE16(patchesh, FIRST * H * (size_t)B * Np * K);
    TAKE(pe, FIRST * (size_t)B * Np * C);
    TAKE(encoded, RW * C);
    TAKE(ln1, F32 * R * RW * C);
    TAKE(ln1_mean, R * RW);
    TAKE(ln1_rstd, R * RW);
    TAKE(qkv, RQ * BT * Q);
    TAKE(atty, RA * BT * A);
    TAKE(att_lse, RA * BT * NH);
    TAKE(res2, RA * RW * C);
    TAKE(ln2, F32 * R * RW * C);
    TAKE(ln2_mean, R * RW);
    TAKE(ln2_rstd, R * RW);
    TAKE(fch, M * BT * F);
    TAKE(fch_gelu, F32 * R * BT * F);
    TAKE16(ln1h, H * R * RW * C);
    TAKE16(attyh, H * R * BT * A);
    TAKE16(ln2h, H * R * RW * C);
    TAKE16(fchgh, H * R * BT * F);
    TAKE(res3, L * RW * C);
    TAKE(clsx, LAST * (size_t)B * C);
    TAKE(lnf, LAST * F32 * (size_t)B * C);
    TAKE16(lnfh, LAST * H * (size_t)B * C);
    TAKE(lnf_mean, LAST * (size_t)B);
    TAKE(lnf_rstd, LAST * (size_t)B);
    TAKE(logits, LAST * (size_t)B * c->n_classes);
    TAKE(losses, LAST * (size_t)B);
    TAKE(ce_lse, LAST * (size_t)B);
    TAKE(dres, RW * C);
    TAKE(dbtc, BT * C);
    TAKE(dbig, BT * big);
    TAKE(dcls, LAST * 2 * (size_t)B * C);
    TAKE16(dlp, H * dlp);
    TAKE(tpx, (d.nb > 1) * BT * C);
    TAKE(spa, SP * BT * C);
    TAKE(spb, SP * BT * C);
    TAKE(sptmp, SP * 4 * C);
    TAKE16(spah, SP * H * BT * C);
    float *ids = dt_act_take(base, &off, (size_t)B);
    a->labels = (int32_t *)ids;
#undef TAKE
    return off;
}

static size_t vit_act_floats(const dt_model_config *c, const dt_model_opts *o, int B, int T) {
    (void)T;
    dt_vit_acts a;
    return layout_acts(&a, NULL, c, o, B);
}

static void vit_bind(dt_model *m) {
    dt_vit_acts *a = m->impl;
    layout_acts(a, m->acts, &m->cfg, &m->opts, m->B);
    m->lp_scratch = a->dlp;
    m->tp_scratch = a->tpx;
}

static const float *vit_logits(const dt_model *m) { return ((const dt_vit_acts *)m->impl)->logits; }

static int vit_correct(const dt_model *m) {
    const dt_vit_acts *a = m->impl;
    const int NC = m->cfg.n_classes;
    int right = 0;
    if (!dt_stage_last(&m->cfg, &m->opts)) return 0; /* a pipeline stage without the head */
    for (int b = 0; b < m->B; b++) {
        const float *row = a->logits + (size_t)b * NC;
        int best = 0;
        for (int k = 1; k < NC; k++)
            if (row[k] > row[best]) best = k;
        right += best == a->labels[b];
    }
    return right;
}

/* ------------------------------------------------------------------ forward / backward */

#define P(id, l) dt_params_unit_tensor(&m->ps, m->ps.unit_params, DT_VIT_P_##id, dt_fam_layer(m, l))
#define G(id, l) dt_params_unit_tensor(&m->ps, m->ps.unit_grads, DT_VIT_P_##id, dt_fam_layer(m, l))
#define UNIT(id) (m->ps.tensors[DT_VIT_P_##id].unit)
#define LAYER(l) DT_UNIT_LAYER(&m->ps, dt_fam_layer(m, l))
#define ID(id) DT_VIT_P_##id
/* Layer l's unit holding tensor id (sub-layer units: family_impl.h). */
#define SUB(id, l) dt_fam_unit(m, DT_VIT_P_##id, l)
/* The unit layer l's backward reads first. */
#define BWD_FIRST(l) dt_fam_bwd_first(m, l, SUB(LN1W, l), SUB(FC2W, l))
/* A matmul input of layer views v: fp32 and 16-bit copies (one of them used). */
#define MMIN(x) ((dt_mmin){v.x, v.x##h})

/* Views of layer l's saved activations (its slots). */
typedef struct layer_views {
    const float *resid;
    float *ln1, *ln1m, *ln1r, *qkv, *atty, *lse, *res2, *ln2, *ln2m, *ln2r, *fch, *fchg, *res3;
    uint16_t *ln1h, *attyh, *ln2h, *fchgh;
} layer_views;

static layer_views views(const dt_model *m, int l) {
    const dt_vit_acts *a = m->impl;
    const dt_model_config *c = &m->cfg;
    const int L = dt_stage_layers(c, &m->opts);
    const tp_dims d = dims_of(c, &m->opts);
    size_t BT = (size_t)m->B * (n_patches(c) + 1), F = (size_t)d.nb * d.Fl;
    /* the residual stream and the norms: the token rows held (sequence parallelism) */
    size_t RW = (size_t)dt_sp_rows(m, (int)BT), btc = RW * c->d_model;
    size_t bta = BT * (size_t)d.nb * d.Cl; /* the split attention width */
    const dt_model_opts *o = &m->opts;
    size_t r = dt_act_slot(o, L, DT_ACT_RECOMP, l), k = dt_act_slot(o, L, DT_ACT_SEL, l);
    size_t ra = dt_act_slot(o, L, att_class(o), l), rq = dt_act_slot(o, L, qkv_class(o), l);
    layer_views v;
    v.resid = l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * btc;
    v.ln1 = a->ln1 + r * btc, v.ln1m = a->ln1_mean + r * RW, v.ln1r = a->ln1_rstd + r * RW;
    v.qkv = a->qkv + rq * bta * 3, v.atty = a->atty + ra * bta;
    v.lse = a->att_lse + ra * BT * (size_t)d.nb * d.NHl, v.res2 = a->res2 + ra * btc;
    v.ln2 = a->ln2 + r * btc, v.ln2m = a->ln2_mean + r * RW, v.ln2r = a->ln2_rstd + r * RW;
    v.fch = a->fch + k * BT * F, v.fchg = a->fch_gelu + r * BT * F, v.res3 = a->res3 + (size_t)l * btc;
    v.ln1h = a->ln1h + r * btc, v.attyh = a->attyh + r * bta, v.ln2h = a->ln2h + r * btc;
    v.fchgh = a->fchgh + r * BT * F;
    if (dt_lowp(m)) v.ln1 = v.ln2 = v.fchg = a->dbig; /* fp32 outputs go through the scratch */
    return v;
}

/* Layer l's forward, announcing its units in order (`next`: the unit read after the layer).
 * `recompute` (in the backward): only what the layer dropped, into its working slots (the
 * classes above); every mode keeps the layer output. Sequence parallelism as gpt2.c: the
 * norms and the residual stream on the rows held, gathered before the column-parallel GEMMs,
 * reduce-scattered after the row-parallel ones. */
static void block_forward(dt_model *m, int l, int recompute, int next) {
    const dt_model_config *c = &m->cfg;
    const dt_model_opts *o = &m->opts;
    const int B = m->B, C = c->d_model, NH = c->n_head, T = n_patches(c) + 1, BT = B * T, RW = dt_sp_rows(m, BT);
    const size_t btc = (size_t)RW * C;
    const tp_dims d = dims_of(c, o);
    const int F = d.nb * d.Fl; /* the MLP width held */
    dt_vit_acts *a = m->impl;
    layer_views v = views(m, l);
    const int qkv = dt_act_forms(o, l, recompute, qkv_class(o)), att = dt_act_forms(o, l, recompute, att_class(o));
    const int fch = dt_act_forms(o, l, recompute, DT_ACT_SEL);
    double *pf = recompute ? m->prof.bwd : m->prof.fwd;
    dt_unit_need(m, SUB(LN1W, l), SUB(LN2W, l));
    DT_PROF_TO(m, pf, DT_OP_LAYERNORM, dt_layernorm_forward(v.ln1, v.ln1m, v.ln1r, v.resid, P(LN1W, l), P(LN1B, l), RW, C));
    dt_fam_narrow(m, v.ln1h, v.ln1, btc);
    if (qkv) {
        const dt_mmin x = dt_sp_col_input(m, MMIN(ln1), a->spa, a->spah, BT, C);
        DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_tp_col_forward(m, v.qkv, x, ID(QKVW), l, P(QKVB, l), BT, C, 3 * d.Cl));
    }
    if (att)
        for (int j = 0; j < d.nb; j++)
            DT_PROF_TO(m, pf, DT_OP_ATTENTION, dt_attention_forward(v.atty + (size_t)j * BT * d.Cl, v.lse + (size_t)j * BT * d.NHl,
                                                                    v.qkv + (size_t)j * BT * 3 * d.Cl, B, T, d.NHl, d.NHl,
                                                                    C / NH, 0, o->compute));
    dt_fam_narrow(m, v.attyh, v.atty, (size_t)BT * d.nb * d.Cl);
    if (att) {
        DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_sp_row_forward(m, v.res2, MMIN(atty), ID(PROJW), l, P(PROJB, l), BT, d.Cl, C, a->spb,
                                                          a->tpx));
        DT_PROF_TO(m, pf, DT_OP_RESIDUAL, dt_residual_forward(v.res2, v.res2, v.resid, (int)btc));
    }
    dt_unit_need(m, SUB(LN2W, l), SUB(FC2W, l));
    DT_PROF_TO(m, pf, DT_OP_LAYERNORM, dt_layernorm_forward(v.ln2, v.ln2m, v.ln2r, v.res2, P(LN2W, l), P(LN2B, l), RW, C));
    dt_fam_narrow(m, v.ln2h, v.ln2, btc);
    if (fch) {
        const dt_mmin x = dt_sp_col_input(m, MMIN(ln2), a->spa, a->spah, BT, C);
        DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_tp_col_forward(m, v.fch, x, ID(FC1W), l, P(FC1B, l), BT, C, d.Fl));
    }
    DT_PROF_TO(m, pf, DT_OP_GELU, dt_gelu_forward(v.fchg, v.fch, BT * F));
    dt_fam_narrow(m, v.fchgh, v.fchg, (size_t)BT * F);
    if (recompute) return;
    dt_unit_need(m, SUB(FC2W, l), next);
    DT_PROF(m, fwd, DT_OP_MATMUL, dt_sp_row_forward(m, v.res3, MMIN(fchg), ID(FC2W), l, P(FC2B, l), BT, d.Fl, C, a->spb, a->tpx));
    DT_PROF(m, fwd, DT_OP_RESIDUAL, dt_residual_forward(v.res3, v.res3, v.res2, (int)btc));
}

static dt_status vit_forward(dt_ctx *ctx, dt_model *m, const int32_t *inputs, const int32_t *targets,
                             float *loss) {
    const dt_model_config *c = &m->cfg;
    const int B = m->B, C = c->d_model, L = dt_stage_layers(c, &m->opts);
    const int Np = n_patches(c), T = Np + 1, BT = B * T, NC = c->n_classes, Pix = c->context;
    const int first = dt_stage_first(&m->opts), last = dt_stage_last(c, &m->opts); /* a pipeline stage */
    const int K = c->channels * c->patch_size * c->patch_size;
    dt_vit_acts *a = m->impl;
    DT_ASSERT(m->T == Pix); /* a sample is one image */
    for (size_t i = 0; i < (size_t)B * Pix; i++)
        if (inputs[i] < 0 || inputs[i] > 255)
            return dt_fail(ctx, DT_ERR_FORMAT, "pixel value %d at position %zu is outside [0, 255]", inputs[i], i);
    for (int b = 0; targets && b < B; b++) {
        const int32_t y = targets[(size_t)b * Pix];
        if (y < 0 || y >= NC)
            return dt_fail(ctx, DT_ERR_FORMAT, "label %d of image %d is outside [0, %d)", y, b, NC);
        a->labels[b] = y;
    }
    m->has_targets = targets != NULL;
    /* the rows held (sequence parallelism: [r0, r0 + RW) of every row; the patch embedding,
     * replicated, is formed for every patch) */
    const int RW = dt_sp_rows(m, BT), r0 = dt_sp_row0(m, BT);
    if (first) { /* else the previous stage's output is in `encoded` already */
        DT_PROF(m, fwd, DT_OP_ENCODER, dt_patchify(a->patches, inputs, B, c->channels, c->image_size, c->patch_size));
        dt_unit_need(m, UNIT(PATCHW), LAYER(0));
        dt_fam_narrow(m, a->patchesh, a->patches, (size_t)B * Np * K);
        DT_PROF(m, fwd, DT_OP_MATMUL, dt_fam_mm_forward(m, a->pe, (dt_mmin){a->patches, a->patchesh}, ID(PATCHW), 0, P(PATCHB, 0), B * Np, K, C));
        dt_cls_pos_forward(a->encoded, P(CLS, 0), a->pe, P(POS, 0), r0, RW, T, C);
    }
    for (int l = 0; l < L; l++) {
        double tl = dt_trace_begin();
        block_forward(m, l, 0, l + 1 < L ? LAYER(l + 1) : last ? UNIT(LNFW) : -1);
        dt_trace_end(tl, "fwd", "fwd layer %d", dt_params_layer(&m->ps, m->chunk_l0 + l));
    }
    if (!last) return DT_OK;
    dt_unit_need(m, UNIT(LNFW), -1);
    /* the class tokens (sequence parallelism: from the gathered rows of the last layer) */
    const float *top = dt_sp_dout(m, a->res3 + (size_t)(L - 1) * RW * C, a->spa, BT, C);
    for (int b = 0; b < B; b++) dt_copy(a->clsx + (size_t)b * C, top + (size_t)b * T * C, (size_t)C * sizeof(float));
    float *lnf = dt_lowp(m) ? a->dbig : a->lnf;
    DT_PROF(m, fwd, DT_OP_LAYERNORM, dt_layernorm_forward(lnf, a->lnf_mean, a->lnf_rstd, a->clsx, P(LNFW, 0), P(LNFB, 0), B, C));
    dt_fam_narrow(m, a->lnfh, lnf, (size_t)B * C);
    DT_PROF(m, fwd, DT_OP_LMHEAD, dt_fam_mm_forward(m, a->logits, (dt_mmin){a->lnf, a->lnfh}, ID(HEADW), 0, P(HEADB, 0), B, C, NC));
    if (!targets) return DT_OK;
    DT_PROF(m, fwd, DT_OP_CROSSENTROPY, dt_crossentropy_forward(a->losses, a->ce_lse, a->logits, a->labels, B, NC, NC));
    m->last_loss = dt_model_mean_loss(a->losses, NULL, B); /* NaN/Inf: training.nonfinite decides */
    if (loss) *loss = m->last_loss;
    return DT_OK;
}

static void vit_backward(dt_model *m, float scale) {
    const dt_model_config *c = &m->cfg;
    const int B = m->B, C = c->d_model, NH = c->n_head, L = dt_stage_layers(c, &m->opts);
    const tp_dims d = dims_of(c, &m->opts);
    const int F = d.nb * d.Fl; /* the MLP width held */
    const int Np = n_patches(c), T = Np + 1, BT = B * T, NC = c->n_classes;
    const int K = c->channels * c->patch_size * c->patch_size;
    const int RW = dt_sp_rows(m, BT), r0 = dt_sp_row0(m, BT);
    const size_t btc = (size_t)RW * C;
    dt_vit_acts *a = m->impl;
    DT_ASSERT(m->has_targets); /* backward needs a forward with targets */
    m->has_targets = 0;
    if (dt_stage_last(c, &m->opts)) { /* else a pipeline stage's output gradient is in dres (DT_STAGE_DOUT) */
        float *dlnf = a->dcls, *dclsx = a->dcls + (size_t)B * C;
        DT_PROF(m, bwd, DT_OP_CROSSENTROPY, dt_crossentropy_backward(a->logits, a->logits, a->ce_lse, a->labels, scale / (float)B, B, NC, NC));
        dt_unit_need(m, UNIT(LNFW), BWD_FIRST(L - 1));
        dt_unit_grads_begin(m, UNIT(LNFW));
        DT_PROF(m, bwd, DT_OP_LMHEAD, dt_fam_mm_backward(m, dlnf, ID(HEADW), 0, G(HEADB, 0), a->logits, (dt_mmin){a->lnf, a->lnfh}, B, C, NC));
        dt_fill(dclsx, 0, (size_t)B * C * sizeof(float));
        DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_layernorm_backward(dclsx, G(LNFW, 0), G(LNFB, 0), dlnf, a->clsx, P(LNFW, 0), a->lnf_mean, a->lnf_rstd, B, C));
        /* Only the class token reaches the head: the rest of d(res3) starts at zero. */
        dt_fill(a->dres, 0, btc * sizeof(float));
        for (int b = 0; b < B; b++) /* the class tokens among the rows held */
            if (b * T >= r0 && b * T < r0 + RW)
                dt_copy(a->dres + (size_t)(b * T - r0) * C, dclsx + (size_t)b * C, (size_t)C * sizeof(float));
        dt_unit_grads_end(m, UNIT(LNFW));
    }
    const int top = dt_act_top_recomputed(&m->opts, L);
    for (int l = L - 1; l >= 0; l--) {
        double tl = dt_trace_begin();
        if (dt_model_recomputes(&m->opts, l) && l != top) block_forward(m, l, 1, -1);
        layer_views v = views(m, l);
        const int u2 = SUB(FC2W, l), u1 = SUB(LN2W, l), u0 = SUB(LN1W, l);
        dt_unit_need(m, u2, u1);
        dt_unit_grads_begin(m, u2);
        const float *dout = dt_sp_dout(m, a->dres, a->spa, BT, C); /* every row */
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_tp_row_backward(m, a->dbig, ID(FC2W), l, G(FC2B, l), dout, MMIN(fchg), BT, d.Fl, C));
        dt_unit_grads_end(m, u2);
        DT_PROF(m, bwd, DT_OP_GELU, dt_gelu_backward(a->dbig, v.fch, a->dbig, BT * F));
        dt_unit_need(m, u1, u0);
        dt_unit_grads_begin(m, u1);
        dt_mmin x = dt_sp_col_input(m, MMIN(ln2), a->spa, a->spah, BT, C); /* the fc1 input, every row */
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_sp_col_backward(m, a->dbtc, ID(FC1W), l, G(FC1B, l), a->dbig, x, BT, C, d.Fl, a->spb, a->tpx));
        DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_sp_layernorm_backward(m, a->dres, G(LN2W, l), G(LN2B, l), a->dbtc, v.res2, P(LN2W, l),
                                                                  v.ln2m, v.ln2r, BT, C, a->sptmp));
        dt_unit_grads_end(m, u1);
        dt_unit_need(m, u0, l > 0 ? BWD_FIRST(l - 1) : -1);
        dt_unit_grads_begin(m, u0);
        dout = dt_sp_dout(m, a->dres, a->spa, BT, C);
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_tp_row_backward(m, a->dbtc, ID(PROJW), l, G(PROJB, l), dout, MMIN(atty), BT, d.Cl, C));
        for (int j = 0; j < d.nb; j++)
            DT_PROF(m, bwd, DT_OP_ATTENTION, dt_attention_backward(a->dbig + (size_t)j * BT * 3 * d.Cl, a->dbtc + (size_t)j * BT * d.Cl,
                                                                   v.qkv + (size_t)j * BT * 3 * d.Cl, v.atty + (size_t)j * BT * d.Cl,
                                                                   v.lse + (size_t)j * BT * d.NHl, B, T, d.NHl, d.NHl, C / NH, 0,
                                                                   m->opts.compute));
        x = dt_sp_col_input(m, MMIN(ln1), a->spa, a->spah, BT, C); /* the q|k|v input, every row */
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_sp_col_backward(m, a->dbtc, ID(QKVW), l, G(QKVB, l), a->dbig, x, BT, C, 3 * d.Cl, a->spb,
                                                         a->tpx));
        DT_PROF(m, bwd, DT_OP_LAYERNORM, dt_sp_layernorm_backward(m, a->dres, G(LN1W, l), G(LN1B, l), a->dbtc, v.resid, P(LN1W, l),
                                                                  v.ln1m, v.ln1r, BT, C, a->sptmp));
        dt_trace_end(tl, "bwd", "bwd layer %d", dt_params_layer(&m->ps, m->chunk_l0 + l));
        dt_unit_grads_end(m, u0);
    }
    if (!dt_stage_first(&m->opts)) return; /* dres holds d(encoded): DT_STAGE_DIN */
    dt_unit_grads_begin(m, UNIT(PATCHW));
    /* dres = d(encoded): position and class-token gradients sum over the batch in order;
     * the patch rows go through the patch embedding. */
    float *dpos = G(POS, 0), *dcls_w = G(CLS, 0), *dpe = a->dbig;
    /* every row (sequence parallelism: gathered; the embedding's parameters are replicated and
     * every rank forms their gradients from every row, in the same order as one rank) */
    const float *denc = dt_sp_dout(m, a->dres, a->spa, BT, C);
    dt_cls_pos_backward(dpos, dcls_w, dpe, denc, B, T, C);
    DT_PROF(m, bwd, DT_OP_ENCODER, dt_fam_mm_backward(m, NULL, ID(PATCHW), 0, G(PATCHB, 0), dpe, (dt_mmin){a->patches, a->patchesh}, B * Np, K, C));
    dt_unit_grads_end(m, UNIT(PATCHW));
}

/* Pipeline stage buffers (model.h dt_model_stage_buf): the input is `encoded`, the output the
 * last layer's res3; both gradients pass through dres. */
static float *vit_stage_buf(dt_model *m, dt_stage_buf which) {
    dt_vit_acts *a = m->impl;
    return dt_fam_stage_buf(m, which, a->encoded, a->res3, a->dres, m->B * (n_patches(&m->cfg) + 1));
}

/* zb-h1's deferred douts (model.h defer_douts / defer_spans; every shard held, decision 84; a layer that recomputes
 * its forward defers nothing and frees only its output and layer 0's input, the rest of it
 * being the working slots the next recompute overwrites): the
 * last stage's head defers its dout (B x classes) before any layer's activations die: the
 * fallback's; a layer's backward defers fc2's, fc1's, proj's and qkv's douts in that order,
 * the first stage's patch embedding its dout after the layers. Dead by then, as gpt2's: the
 * layer's output res3 (read by the layer above's backward; the head reads clsx), fch once the
 * GELU's backward read it, res2 and ln_2's statistics once ln_2's backward did, q|k|v, the
 * log-sum-exp and (16-bit copies kept for W) the fp32 attention output once the attention's
 * did, ln_1's statistics and the encoded rows after the layer. W reads ln1, atty, ln2,
 * fch_gelu, the patches (or 16-bit copies). */
static int vit_defer_douts(const dt_model *m, int l, size_t *n) {
    const tp_dims d = dims_of(&m->cfg, &m->opts);
    const size_t BT = (size_t)m->B * (n_patches(&m->cfg) + 1), C = (size_t)m->cfg.d_model;
    const int L = dt_stage_layers(&m->cfg, &m->opts);
    if (l == L) return dt_stage_last(&m->cfg, &m->opts) ? (n[0] = (size_t)m->B * m->cfg.n_classes, 1) : 0;
    if (l == -1) return dt_stage_first(&m->opts) ? (n[0] = (size_t)m->B * n_patches(&m->cfg) * C, 1) : 0;
    if (l < 0 || l >= L || dt_model_recomputes(&m->opts, l)) return 0;
    const size_t nb = (size_t)d.nb; /* every row (gathered under sequence parallelism), the shards held */
    n[0] = BT * C, n[1] = BT * nb * (size_t)d.Fl, n[2] = BT * C, n[3] = BT * 3 * nb * (size_t)d.Cl;
    return 4;
}

static int vit_defer_spans(const dt_model *m, int l, dt_act_span *out) {
    const tp_dims d = dims_of(&m->cfg, &m->opts);
    /* the split activations: every row, the shards held; the residual stream and the norms'
     * statistics: the rows held (RW, sequence parallelism) */
    const size_t BT = (size_t)m->B * (n_patches(&m->cfg) + 1), C = (size_t)m->cfg.d_model, nb = (size_t)d.nb,
                 RW = (size_t)dt_sp_rows(m, (int)BT);
    layer_views v = {0};
    if (m->acts) v = views(m, l);
    int n = 0;
#define SPAN(ptr, len, at) (out[n++] = (dt_act_span){m->acts ? (float *)(ptr) : NULL, (len), (at)})
    if (dt_model_recomputes(&m->opts, l))
        return dt_fam_recomputed_spans(l, m->acts ? v.res3 : NULL, m->acts ? ((dt_vit_acts *)m->impl)->encoded : NULL, RW * C, out);
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
    if (l == 0) SPAN(m->acts ? ((dt_vit_acts *)m->impl)->encoded : NULL, RW * C, 4);
#undef SPAN
    return n;
}

/* A micro-batch's token rows: B images of n_patches + 1 tokens (the class token). */
static int vit_token_rows(const dt_model_config *c, int B, int T) {
    (void)T;
    return B * (n_patches(c) + 1);
}

/* tp divides the heads (so d_model) and the MLP width */
static const size_t tp_divides[] = {offsetof(dt_model_config, n_head), offsetof(dt_model_config, d_ff), 0};
static const char *const file_fields[] = {"n_layer", "d_model",  "n_head",   "d_ff", "image_size",
                                          "patch_size", "channels", "n_classes", NULL};

const dt_model_family dt_family_vit = {
    .name = "vit",
    .presets = preset_names,
    .preset = vit_preset,
    .validate = vit_validate,
    .tensors = vit_tensors,
    .act_floats = vit_act_floats,
    .impl_bytes = sizeof(dt_vit_acts),
    .bind = vit_bind,
    .forward = vit_forward,
    .backward = vit_backward,
    .logits = vit_logits,
    .correct = vit_correct,
    .images = 1,
    .num_params = vit_num_params,
    .flops_per_token = vit_flops_per_token,
    .file_format = "dtrain-vit",
    .file_fields = file_fields,
    .tp_divides = tp_divides,
    .sp = 1,
    .token_rows = vit_token_rows,
    .stage_buf = vit_stage_buf,
    .defer_douts = vit_defer_douts,
    .defer_spans = vit_defer_spans,
    /* No Hugging Face export: HF's ViT stores the patch projection as a 4-D convolution
     * and names everything differently; not written until a test can load it. */
};
