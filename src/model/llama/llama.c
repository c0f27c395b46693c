/* LLaMA: presets, the parameter table (llama_params.h), forward, backward. */
#include "model/llama/llama.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace.h"
#include "model/family_impl.h"
#include "model/hf_json.h"
#include "model/llama/llama_impl.h"
#include "model/llama/moe.h"
#include "model/rope.h"
#include "ops/ops.h"

/* ------------------------------------------------------------------ config */

/* Head sizes up to twice this: the RoPE frequencies live in the family's state. */
#define DT_LLAMA_ROPE_PAIRS 1024

typedef struct preset {
    const char *name;
    int n_layer, d_model, n_head, n_kv_head, d_ff, vocab, context, untied;
    float rope_theta, norm_eps;
    int llama3; /* Llama 3.2's rope_scaling: llama3, factor 32, low 1, high 4, original 8192 */
    int n_experts, experts_topk, expert_d_ff; /* mixture of experts (moe.h) */
} preset;

/* The last three are the published shapes (config.json of TinyLlama-1.1B, Llama-3.2-1B and
 * Mistral-7B-v0.1) for memory planning and the batch finder. dtrain does not implement
 * Mistral's sliding window: mistral-7b's context is its 4096-token window (what the HF import
 * derives too), and up to that length the model computes what the original does. */
static const preset presets[] = {
    {"llama-tiny", 2, 64, 4, 2, 176, 256, 64, 1, 10000.0f, 1e-5f, 0, 0, 0, 0},
    {"llama-100m", 12, 768, 12, 4, 2048, 32000, 1024, 0, 10000.0f, 1e-5f, 0, 0, 0, 0},
    {"tinyllama-1.1b", 22, 2048, 32, 4, 5632, 32000, 2048, 1, 10000.0f, 1e-5f, 0, 0, 0, 0},
    {"llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, 0, 500000.0f, 1e-5f, 1, 0, 0, 0},
    {"mistral-7b", 32, 4096, 32, 8, 14336, 32000, 4096, 1, 10000.0f, 1e-5f, 0, 0, 0, 0},
    /* mixture of experts: a tiny one for tests, and Mixtral-8x7B-v0.1's config.json (46.7 B
     * parameters; its context is max_position_embeddings, no sliding window) */
    {"mixtral-tiny", 2, 64, 4, 2, 0, 256, 64, 1, 10000.0f, 1e-5f, 0, 4, 2, 128},
    {"mixtral-8x7b", 32, 4096, 32, 8, 0, 32000, 32768, 1, 1e6f, 1e-5f, 0, 8, 2, 14336},
};
static const char *const preset_names[] = {"llama-tiny", "llama-100m", "tinyllama-1.1b", "llama-3.2-1b",
                                           "mistral-7b", "mixtral-tiny", "mixtral-8x7b", NULL};

static void llama_preset(const char *name, dt_model_config *out) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) {
            const preset *p = &presets[i];
            out->n_layer = p->n_layer, out->d_model = p->d_model, out->n_head = p->n_head;
            out->n_kv_head = p->n_kv_head, out->d_ff = p->d_ff, out->vocab = p->vocab;
            out->context = p->context, out->untied = p->untied;
            out->rope_theta = p->rope_theta, out->norm_eps = p->norm_eps;
            out->n_experts = p->n_experts, out->experts_topk = p->experts_topk;
            out->expert_d_ff = p->expert_d_ff;
            if (p->llama3) {
                out->rope_scaling = DT_ROPE_LLAMA3, out->rope_factor = 32.0f;
                out->rope_low_freq_factor = 1.0f, out->rope_high_freq_factor = 4.0f;
                out->rope_original_context = 8192;
            }
        }
}

/* Mixture of experts (moe.h): the expert keys, and d_ff 0 (a d_ff given without expert_d_ff
 * is the experts' width, as Mixtral's intermediate_size). */
static dt_status validate_experts(dt_ctx *ctx, dt_model_config *c) {
    if (c->n_experts == 0) {
        if (c->experts_topk || c->expert_d_ff)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: needs model.n_experts > 0 (a dense llama has no experts)",
                           c->experts_topk ? "model.experts_topk" : "model.expert_d_ff");
        return DT_OK;
    }
    if (c->n_experts < 1 || c->n_experts > DT_MOE_MAX_EXPERTS)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_experts must be in [0, %d] (got %d)", DT_MOE_MAX_EXPERTS,
                       c->n_experts);
    if (c->experts_topk < 1 || c->experts_topk > c->n_experts)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.experts_topk must be in [1, model.n_experts=%d] (got %d)",
                       c->n_experts, c->experts_topk);
    if (c->expert_d_ff == 0) c->expert_d_ff = c->d_ff;
    else if (c->d_ff != 0 && c->d_ff != c->expert_d_ff)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.d_ff (%d) differs from model.expert_d_ff (%d): a model with "
                       "experts has no dense MLP", c->d_ff, c->expert_d_ff);
    if (c->expert_d_ff < 1 || c->expert_d_ff > (1 << 20))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.expert_d_ff must be in [1, 1048576] (got %d)", c->expert_d_ff);
    c->d_ff = 0;
    return DT_OK;
}

static dt_status llama_validate(dt_ctx *ctx, dt_model_config *c) {
    DT_CHECK(dt_model_refuse_vision(ctx, c, "llama"));
    if (c->n_layer < 1 || c->n_layer > 1024)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_layer must be in [1, 1024] (got %d)", c->n_layer);
    if (c->d_model < 2 || c->d_model > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.d_model must be in [2, 65536] (got %d)", c->d_model);
    if (c->n_head < 1 || c->n_head > c->d_model)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_head must be in [1, d_model=%d] (got %d)",
                       c->d_model, c->n_head);
    if (c->d_model % c->n_head != 0 || (c->d_model / c->n_head) % 2 != 0)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "model.n_head (%d) must divide model.d_model (%d) into heads of even size "
                       "(rotary embeddings rotate pairs)", c->n_head, c->d_model);
    if (c->d_model / c->n_head > 2 * DT_LLAMA_ROPE_PAIRS)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.n_head (%d): heads of %d exceed the largest head size %d",
                       c->n_head, c->d_model / c->n_head, 2 * DT_LLAMA_ROPE_PAIRS);
    if (c->n_kv_head == 0) c->n_kv_head = c->n_head;
    if (c->n_kv_head < 1 || c->n_kv_head > c->n_head || c->n_head % c->n_kv_head != 0)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "model.n_kv_head must divide model.n_head=%d (1 = multi-query; got %d)",
                       c->n_head, c->n_kv_head);
    DT_CHECK(validate_experts(ctx, c));
    if (c->d_ff == 0 && !c->n_experts) c->d_ff = (8 * c->d_model / 3 + 63) / 64 * 64; /* LLaMA's 8/3 d_model */
    if (!c->n_experts && (c->d_ff < 1 || c->d_ff > (1 << 20)))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.d_ff must be in [1, 1048576] (got %d)", c->d_ff);
    if (c->vocab < 1 || c->vocab > (1 << 24))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.vocab_size must be in [1, 16777216] (got %d)", c->vocab);
    if (c->context < 1 || c->context > (1 << 20))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.context must be in [1, 1048576] (got %d)", c->context);
    if (c->untied != 0 && c->untied != 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.untied_embeddings must be true or false");
    if (c->rope_theta == 0.0f) c->rope_theta = 10000.0f;
    if (!(c->rope_theta > 1.0f && c->rope_theta < 1e12f))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.rope_theta must be in (1, 1e12) (got %g)",
                       (double)c->rope_theta);
    DT_CHECK(dt_rope_validate(ctx, c));
    if (c->norm_eps == 0.0f) c->norm_eps = 1e-5f;
    if (!(c->norm_eps > 0.0f && c->norm_eps < 1.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.norm_eps must be in (0, 1) (got %g)",
                       (double)c->norm_eps);
    c->vocab_padded = (c->vocab + 127) / 128 * 128;
    return DT_OK;
}

static int llama_tensors(const dt_model_config *c, dt_tensor_info *out) {
    const size_t hs = (size_t)(c->d_model / c->n_head);
    const size_t q = (size_t)c->n_head * hs, kv = (size_t)c->n_kv_head * hs;
    int n = 0;
#define DT_X_ROW(id, group, rows, cols, decay, name)                                           \
    out[n++] = (dt_tensor_info){name, name, DT_PG_##group, DT_ELEM_F32, (size_t)(rows),        \
                                (size_t)(cols), 0, (rows) == 1 ? DT_INIT_ONES : DT_INIT_NORMAL, \
                                0.02f, decay, 0, 0, 0, 0, 0, 0, 0, 0, .split = 0};
    DT_LLAMA_PARAMS(DT_X_ROW)
#undef DT_X_ROW
    (void)q, (void)kv;
    out[DT_LLAMA_P_EMBED].file_rows = (size_t)c->vocab; /* files hold no vocabulary padding */
    out[DT_LLAMA_P_LM_HEAD].file_rows = (size_t)c->vocab;
    out[DT_LLAMA_P_EMBED].vocab = 1;
    out[DT_LLAMA_P_LM_HEAD].vocab = 1;
    /* q|k|v and gate|up are adjacent rows read as one (QW x C) and one (2F x C) matrix. */
    static const int mm[] = {DT_LLAMA_P_EMBED, DT_LLAMA_P_LM_HEAD, DT_LLAMA_P_WQ, DT_LLAMA_P_WK, DT_LLAMA_P_WV,
                             DT_LLAMA_P_WO, DT_LLAMA_P_WGATE, DT_LLAMA_P_WUP, DT_LLAMA_P_WDOWN};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) out[mm[i]].matmul = 1;
    /* the split column (params.h; tensor parallelism): q, k, v by heads (key/value heads
     * across ranks), gate and up by columns, o and down by rows of their input, the
     * embedding and an untied head by vocabulary rows */
    static const int col[] = {DT_LLAMA_P_EMBED, DT_LLAMA_P_LM_HEAD, DT_LLAMA_P_WQ, DT_LLAMA_P_WK, DT_LLAMA_P_WV,
                              DT_LLAMA_P_WGATE, DT_LLAMA_P_WUP};
    for (size_t i = 0; i < sizeof col / sizeof col[0]; i++) out[col[i]].split = DT_SPLIT_OUT;
    out[DT_LLAMA_P_WO].split = out[DT_LLAMA_P_WDOWN].split = DT_SPLIT_IN;
    /* sub-layer units (params.h): [input norm, attention] [post-attention norm, gate|up] [down] */
    out[DT_LLAMA_P_LN2].unit_start = out[DT_LLAMA_P_WDOWN].unit_start = 1;
    if (c->n_experts) return dt_moe_tensors(c, out);
    return c->untied ? n : n - 1; /* LM_HEAD is the last row */
}

/* Parameters of one layer (no padding anywhere inside a layer); with experts, `experts` of
 * them (all: the parameters; experts_topk: those a token uses). */
static double layer_params_of(const dt_model_config *c, int experts) {
    double C = c->d_model, hs = (double)(c->d_model / c->n_head);
    double q = c->n_head * hs, kv = c->n_kv_head * hs, F = c->d_ff;
    double mlp = c->n_experts ? (double)c->n_experts * C + (double)experts * 3 * C * c->expert_d_ff : 3 * C * F;
    return C * (q + 2 * kv) + q * C + mlp + 2 * C;
}
static double layer_params(const dt_model_config *c) { return layer_params_of(c, c->n_experts); }

static size_t llama_num_params(const dt_model_config *c) {
    double C = c->d_model, V = c->vocab;
    return (size_t)(V * C * (c->untied ? 2 : 1) + c->n_layer * layer_params(c) + C);
}

/* 6 N per token, N = layers + final norm + the lm_head matmul (the embedding lookup does no
 * matmul), plus attention 12 L T d (PaLM; grouped kv heads do not reduce it). */
static double llama_flops_per_token(const dt_model_config *c, int T) {
    double C = c->d_model, L = c->n_layer;
    double n = L * layer_params_of(c, c->experts_topk) + C + (double)c->vocab * C; /* active */
    return 6.0 * n + 12.0 * L * (double)T * C;
}

/* ------------------------------------------------------------------ layout */

typedef struct dt_llama_acts {
    float *encoded;                  /* (B,T,C) */
    /* Per layer (slots: family_impl.h): recomputed class */
    float *ln1, *rstd1;              /* (B,T,C), (B,T) */
    float *atty;                     /* (B,T,C) */
    float *qkv;                      /* (B,T,QW) after rotary, QW = (NH + 2 NKV) hs */
    float *att_lse;                  /* (B,NH,T) */
    float *ln2, *rstd2;              /* (B,T,C), (B,T) */
    float *hmid;                     /* (B,T,F) silu(gate) up */
    uint16_t *ln1h, *attyh, *ln2h, *hmidh; /* mixed precision: 16-bit ln1, atty, ln2, hmid
                                             (then ln1, ln2, hmid hold nothing) */
    /* what selective keeps: gate|up in every precision; res2 in fp32 (under mixed
       precision of the recomputed class: res2_class) */
    float *res2;                     /* (B,T,C) the residual after the attention block */
    float *gu;                       /* (B,T,2F) gate | up */
    /* layer outputs */
    float *res3;                     /* (L,B,T,C) */
    float *lnf, *rstdf;              /* (B,T,C), (B,T) */
    uint16_t *lnfh;                  /* mixed precision: 16-bit lnf (lnf holds nothing) */
    float *logits;                   /* (B,T,Vp); dlogits after backward. Fused loss: one
                                        block of rows (model.h) */
    float *losses, *ce_lse;          /* (B,T) */
    float *dres;                     /* (B,T,C) residual-stream gradient */
    float *dbtc;                     /* (B,T,C) scratch gradient */
    float *dbig;                     /* (B,T,max(QW,2F)) scratch gradient: dqkv, dgu */
    float *dmid;                     /* (B,T,F) scratch gradient */
    float *tpx;                      /* (B,T,C) tensor parallelism's blocks test mode: a shard's
                                        partial sum (family_impl.h) */
    float *tpstat;                   /* (2 B T) tensor parallelism: the loss's row statistics */
    float *spa, *spb;                /* (B,T,C) sequence parallelism: gathered rows, partial sums */
    float *sptmp;                    /* (2 C) sequence parallelism: a norm's gradient sums */
    uint16_t *spah;                  /* (B,T,C) sequence parallelism, mixed precision: a norm output's
                                        16-bit copy, every row */
    uint16_t *dlp;                   /* (B,T,max(QW,2F)) mixed precision: narrowed gradients */
    int32_t *inputs, *targets;       /* (B,T) copies kept for the backward */
    float rope_inv[DT_LLAMA_ROPE_PAIRS]; /* the RoPE frequencies (hs/2 of them), computed at bind */
    float rope_scale;                /* and the cos/sin scale (model/rope.h) */
    dt_moe_acts moe;                 /* with experts (moe.h; then gu, hmid, dmid are empty) */
    float *cps;                      /* context parallelism: the ring attention's scratch (model/cp.h) */
} dt_llama_acts;

/* Class (family_impl.h) of res2, the attention block's output. Under mixed precision the norm
 * outputs and hmid are 16-bit, so dropping them saves less than in fp32 and selective must
 * drop more to save 40%: it drops res2 too and recomputes the output projection (C^2 per
 * token) besides q|k|v; in fp32 it keeps res2 (ARCHITECTURE 37, 52). */
static int res2_class(const dt_model_opts *o) { return o->compute != DT_F32 ? DT_ACT_RECOMP : DT_ACT_SEL; }

/* Tensor parallelism (family_impl.h): shards held (nb of k) and the per-shard widths: query
 * and key/value heads, q|k|v, the attention output, the MLP and the vocabulary. */
typedef struct tp_dims {
    int k, nb, NHl, NKVl, QWl, Ql, Fl, Vl;
} tp_dims;

static tp_dims dims_of(const dt_model_config *c, const dt_model_opts *o) {
    tp_dims d;
    const int hs = c->d_model / c->n_head;
    d.k = dt_tp_size(o), d.nb = dt_tp_local(o);
    d.NHl = c->n_head / d.k, d.NKVl = c->n_kv_head / d.k;
    d.QWl = (d.NHl + 2 * d.NKVl) * hs, d.Ql = d.NHl * hs, d.Fl = c->d_ff / d.k;
    d.Vl = dt_model_vocab_padded(c, o) / d.k;
    return d;
}

static size_t layout_acts(dt_llama_acts *a, float *base, const dt_model_config *c,
                          const dt_model_opts *o, int B, int T) {
    const tp_dims d = dims_of(c, o);
    size_t C = c->d_model, BT = (size_t)B * T, nb = (size_t)d.nb;
    size_t NH = nb * d.NHl, F = nb * d.Fl, QW = nb * d.QWl, A = nb * d.Ql;
    size_t big = QW > 2 * F ? QW : 2 * F, call = (size_t)(d.QWl > 2 * d.Fl ? d.QWl : 2 * d.Fl);
    big = big > C ? big : C, call = call > C ? call : C; /* a shard's projection; the norms' fp32 */
    if (c->n_experts) { /* a GEMM's narrowed dout (moe.h): an expert's gate|up, the router's */
        const size_t Fe2 = 2 * (size_t)c->expert_d_ff, E = (size_t)c->n_experts;
        call = call > Fe2 ? call : Fe2, call = call > E ? call : E;
    }
    int L = dt_stage_layers(c, o);
    const size_t LAST = (size_t)dt_stage_last(c, o); /* a pipeline stage that runs the head */
    size_t R = dt_act_slot(o, L, DT_ACT_RECOMP, L), M = dt_act_slot(o, L, DT_ACT_SEL, L);
    size_t R2 = dt_act_slot(o, L, res2_class(o), L);
    size_t H = o->compute != DT_F32, F32 = !H; /* 16-bit copies, fp32-only buffers */
    /* sequence parallelism: the residual stream and the norms hold this process's token rows */
    const size_t SP = o->sp != 0, RW = SP ? BT / (size_t)d.k * nb : BT;
    size_t off = 0;
#define TAKE(field, n) (a->field = dt_act_take(base, &off, (n)))
#define TAKE16(field, n) (a->field = dt_act_take16(base, &off, (n)))
    TAKE(encoded, RW * C);
    TAKE(ln1, F32 * R * RW * C);
    TAKE(rstd1, R * RW);
    TAKE(qkv, R * BT * QW);
    TAKE(atty, R * BT * A);
    TAKE(att_lse, R * BT * NH);
    TAKE(res2, R2 * RW * C);
    TAKE(ln2, F32 * R * RW * C);
    TAKE(rstd2, R * RW);
    TAKE(gu, M * BT * 2 * F);
    TAKE(hmid, F32 * R * BT * F);
    TAKE16(ln1h, H * R * RW * C);
    TAKE16(attyh, H * R * BT * A);
    TAKE16(ln2h, H * R * RW * C);
    TAKE16(hmidh, H * R * BT * F);
    TAKE(res3, (size_t)L * RW * C);
    TAKE(lnf, LAST * F32 * BT * C); /* sequence parallelism: gathered for the head */
    TAKE16(lnfh, LAST * H * BT * C);
    TAKE(rstdf, LAST * RW);
    TAKE(logits, LAST * (size_t)dt_model_logit_rows(o, (int)BT) * nb * d.Vl);
    TAKE(losses, LAST * BT);
    TAKE(ce_lse, LAST * BT);
    TAKE(dres, RW * C);
    TAKE(dbtc, BT * C);
    TAKE(dbig, BT * big);
    TAKE(dmid, BT * F);
    TAKE16(dlp, H * BT * call);
    TAKE(tpx, (d.nb > 1) * BT * C);
    TAKE(tpstat, LAST * (d.k > 1) * 2 * BT); /* the vocabulary-parallel loss's row statistics */
    TAKE(spa, SP * BT * C); /* sequence parallelism: gathered rows, partial sums, norm sums */
    TAKE(spb, SP * BT * C);
    TAKE(sptmp, SP * 2 * C);
    TAKE16(spah, SP * H * BT * C); /* a norm output's 16-bit copy, every row (mixed precision) */
    TAKE(cps, o->cp > 1 ? dt_cp_scratch_floats(B, T, d.NHl, d.NKVl, C / c->n_head, o->cp, o->cp_all_gather) : 0);
    float *ids = dt_act_take(base, &off, 2 * BT);
    a->inputs = (int32_t *)ids;
    a->targets = ids ? (int32_t *)ids + BT : NULL;
    if (c->n_experts) dt_moe_layout(&a->moe, base, &off, c, o, B, T);
#undef TAKE
#undef TAKE16
    return off;
}

static size_t llama_act_floats(const dt_model_config *c, const dt_model_opts *o, int B, int T) {
    dt_llama_acts a;
    return layout_acts(&a, NULL, c, o, B, T);
}

static void llama_bind(dt_model *m) {
    dt_llama_acts *a = m->impl;
    layout_acts(a, m->acts, &m->cfg, &m->opts, m->B, m->T);
    dt_rope_kernel_freqs(&m->cfg, m->cfg.d_model / m->cfg.n_head, a->rope_inv, &a->rope_scale);
    m->lp_scratch = a->dlp;
    m->tp_scratch = a->tpx;
    m->tp_stat = a->tpstat;
}

/* Pipeline stage buffers (model.h dt_model_stage_buf): the input is `encoded`, the output the
 * last layer's res3; both gradients pass through dres. */
static float *llama_stage_buf(dt_model *m, dt_stage_buf which) {
    dt_llama_acts *a = m->impl;
    return dt_fam_stage_buf(m, which, a->encoded, a->res3, a->dres, m->B * m->T);
}

static const float *llama_logits(const dt_model *m) { return ((const dt_llama_acts *)m->impl)->logits; }

const int32_t *dt_llama_moe_choices(const dt_model *m, int l) {
    const dt_model_config *c = &m->cfg;
    const int L = dt_stage_layers(c, &m->opts);
    if (m->fam != &dt_family_llama || !c->n_experts || l < 0 || l >= L) return NULL;
    return ((const dt_llama_acts *)m->impl)->moe.sel + dt_act_slot(&m->opts, L, DT_ACT_SEL, l) * m->B * m->T * c->experts_topk;
}

static float *llama_stage_extra(dt_model *m) { return (float *)((dt_llama_acts *)m->impl)->moe.count; }

/* ------------------------------------------------------------------ forward / backward */

#define P(id, l) dt_fam_param(m, DT_LLAMA_P_##id, l)
#define G(id, l) dt_fam_grad(m, DT_LLAMA_P_##id, l)
/* The final norm and the untied lm_head: after the experts' rows in a MoE table (moe.h). */
#define NORM_ID (m->cfg.n_experts ? DT_LLAMA_MOE_NORM(m->cfg.n_experts) : DT_LLAMA_P_NORM)
#define LMHEAD_ID (m->cfg.n_experts ? DT_LLAMA_MOE_HEAD(m->cfg.n_experts) : DT_LLAMA_P_LM_HEAD)
/* The lm_head: its own weights, or the token embedding's. */
#define HEAD_ID (m->cfg.untied ? LMHEAD_ID : DT_LLAMA_P_EMBED)
#define UNIT(id) (dt_model_weights(m)->tensors[DT_LLAMA_P_##id].unit)
#define NORM_UNIT (dt_model_weights(m)->tensors[NORM_ID].unit)
#define LAYER(l) DT_UNIT_LAYER(dt_model_weights(m), dt_fam_layer(m, l))
#define ID(id) DT_LLAMA_P_##id
/* Layer l's unit holding tensor id (sub-layer units: family_impl.h). */
#define SUB(id, l) dt_fam_unit(m, DT_LLAMA_P_##id, l)
/* The unit of layer l's MLP read first (after the post-attention norm's) and last. */
/* (a MoE layer: its first and last expert held; expert parallelism holds some: moe.h) */
#define MLP_FIRST(l) \
    (m->cfg.n_experts ? dt_fam_unit(m, DT_LLAMA_MOE_W1(dt_moe_first(&m->cfg, &m->opts)), l) : SUB(WDOWN, l))
#define MLP_LAST(l)                                                                                            \
    (m->cfg.n_experts                                                                                         \
         ? dt_fam_unit(m, DT_LLAMA_MOE_W1(dt_moe_first(&m->cfg, &m->opts) + dt_moe_local(&m->cfg, &m->opts) - 1), l) \
         : SUB(WDOWN, l))
/* The unit layer l's backward reads first. */
#define BWD_FIRST(l) dt_fam_bwd_first(m, l, SUB(LN1, l), MLP_LAST(l))
/* A matmul input of layer views v: fp32 and 16-bit copies (one of them used). */
#define MMIN(x) ((dt_mmin){v.x, v.x##h})

/* Views of layer l's saved activations (its slots). */
typedef struct layer_views {
    const float *resid;
    float *ln1, *rstd1, *qkv, *atty, *lse, *res2, *ln2, *rstd2, *gu, *hmid, *res3;
    uint16_t *ln1h, *attyh, *ln2h, *hmidh;
} layer_views;

static layer_views views(const dt_model *m, int l) {
    const dt_llama_acts *a = m->impl;
    const dt_model_config *c = &m->cfg;
    const int L = dt_stage_layers(c, &m->opts);
    const tp_dims d = dims_of(c, &m->opts);
    /* the residual stream and the norms: the token rows held (sequence parallelism) */
    size_t BT = (size_t)dt_sp_rows(m, m->B * m->T), btc = BT * c->d_model;
    size_t BTF = (size_t)m->B * m->T, F = (size_t)d.nb * d.Fl; /* every row: the split activations */
    size_t bta = BTF * (size_t)d.nb * d.Ql; /* the attention output held */
    size_t r = dt_act_slot(&m->opts, L, DT_ACT_RECOMP, l), k = dt_act_slot(&m->opts, L, DT_ACT_SEL, l);
    size_t r2 = dt_act_slot(&m->opts, L, res2_class(&m->opts), l);
    layer_views v;
    v.resid = l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * btc;
    v.ln1 = a->ln1 + r * btc, v.rstd1 = a->rstd1 + r * BT;
    v.qkv = a->qkv + r * BTF * (size_t)d.nb * d.QWl, v.atty = a->atty + r * bta;
    v.lse = a->att_lse + r * BTF * (size_t)d.nb * d.NHl, v.res2 = a->res2 + r2 * btc;
    v.ln2 = a->ln2 + r * btc, v.rstd2 = a->rstd2 + r * BT;
    v.gu = a->gu + k * BTF * 2 * F, v.hmid = a->hmid + r * BTF * F, v.res3 = a->res3 + (size_t)l * btc;
    v.ln1h = a->ln1h + r * btc, v.attyh = a->attyh + r * bta, v.ln2h = a->ln2h + r * btc;
    v.hmidh = a->hmidh + r * BTF * F;
    if (dt_lowp(m)) v.ln1 = v.ln2 = v.hmid = a->dbig; /* fp32 outputs go through the scratch */
    return v;
}

/* Layer l's forward, announcing its units in order (`next`: the unit read after the layer).
 * `recompute` (in the backward): only what the layer dropped, into its working slots (the
 * classes above); every mode keeps the layer output. */
static void block_forward(dt_model *m, int l, int recompute, int next) {
    const dt_model_config *c = &m->cfg;
    const tp_dims d = dims_of(c, &m->opts);
    int B = m->B, T = m->T, C = c->d_model, NH = c->n_head;
    int BT = B * T, hs = C / NH, RW = dt_sp_rows(m, BT);
    const float eps = c->norm_eps;
    dt_llama_acts *a = m->impl;
    size_t rwc = (size_t)RW * C;
    layer_views v = views(m, l);
    const int res2 = dt_act_forms(&m->opts, l, recompute, res2_class(&m->opts));
    const int gu = dt_act_forms(&m->opts, l, recompute, DT_ACT_SEL);
    double *pf = recompute ? m->prof.bwd : m->prof.fwd;
    static const int qkv_ids[] = {DT_LLAMA_P_WQ, DT_LLAMA_P_WK, DT_LLAMA_P_WV}, gu_ids[] = {DT_LLAMA_P_WGATE, DT_LLAMA_P_WUP};
    dt_unit_need(m, SUB(LN1, l), SUB(LN2, l));
    DT_PROF_TO(m, pf, DT_OP_RMSNORM, dt_rmsnorm_forward(v.ln1, v.rstd1, v.resid, P(LN1, l), RW, C, eps));
    dt_fam_narrow(m, v.ln1h, v.ln1, rwc);
    /* q_proj, k_proj, v_proj are adjacent rows: one (QW x C) projection (tensor parallelism:
     * each shard's heads, column-parallel; the attention on the shard's heads; sequence
     * parallelism: the norm's rows gathered first, as gpt2.c). */
    dt_mmin x = dt_sp_col_input(m, MMIN(ln1), a->spa, a->spah, BT, C);
    DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_tp_cols_forward(m, v.qkv, x, qkv_ids, 3, l, BT, C, d.QWl));
    for (int j = 0; j < d.nb; j++) {
        float *qkv = v.qkv + (size_t)j * BT * d.QWl;
        DT_PROF_TO(m, pf, DT_OP_ROPE, dt_fam_rope(m, qkv, B, T, d.NHl, d.NKVl, hs, a->rope_inv, a->rope_scale, 0));
        DT_PROF_TO(m, pf, DT_OP_ATTENTION, dt_fam_attention_forward(m, v.atty + (size_t)j * BT * d.Ql, v.lse + (size_t)j * BT * d.NHl,
                                                                    qkv, B, T, d.NHl, d.NKVl, hs, a->cps));
    }
    dt_fam_narrow(m, v.attyh, v.atty, (size_t)BT * d.nb * d.Ql);
    if (res2) {
        DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_sp_row_forward(m, v.res2, MMIN(atty), ID(WO), l, NULL, BT, d.Ql, C, a->spb, a->tpx));
        DT_PROF_TO(m, pf, DT_OP_RESIDUAL, dt_residual_forward(v.res2, v.res2, v.resid, (int)rwc));
    }
    dt_unit_need(m, SUB(LN2, l), MLP_FIRST(l));
    DT_PROF_TO(m, pf, DT_OP_RMSNORM, dt_rmsnorm_forward(v.ln2, v.rstd2, v.res2, P(LN2, l), RW, C, eps));
    dt_fam_narrow(m, v.ln2h, v.ln2, rwc);
    if (c->n_experts) { /* its state is of class SEL; under mixed precision it reads ln2h (moe.h) */
        if (dt_act_forms(&m->opts, l, recompute, DT_ACT_SEL))
            dt_moe_forward(m, &((dt_llama_acts *)m->impl)->moe, l, v.ln2, dt_lowp(m) ? v.ln2h : NULL, v.res2,
                           recompute ? NULL : v.res3, next);
        return;
    }
    /* gate_proj, up_proj: one (2F x C) projection (per shard: its gate | up columns). */
    if (gu) {
        x = dt_sp_col_input(m, MMIN(ln2), a->spa, a->spah, BT, C);
        DT_PROF_TO(m, pf, DT_OP_MATMUL, dt_tp_cols_forward(m, v.gu, x, gu_ids, 2, l, BT, C, 2 * d.Fl));
    }
    for (int j = 0; j < d.nb; j++)
        DT_PROF_TO(m, pf, DT_OP_SWIGLU, dt_swiglu_forward(v.hmid + (size_t)j * BT * d.Fl, v.gu + (size_t)j * BT * 2 * d.Fl, BT, d.Fl));
    dt_fam_narrow(m, v.hmidh, v.hmid, (size_t)BT * d.nb * d.Fl);
    if (recompute) return;
    dt_unit_need(m, SUB(WDOWN, l), next);
    DT_PROF(m, fwd, DT_OP_MATMUL, dt_sp_row_forward(m, v.res3, MMIN(hmid), ID(WDOWN), l, NULL, BT, d.Fl, C, a->spb, a->tpx));
    DT_PROF(m, fwd, DT_OP_RESIDUAL, dt_residual_forward(v.res3, v.res3, v.res2, (int)rwc));
}

/* The final norm of the rows held, every row of it (gathered under sequence parallelism) in
 * lnf / lnfh for the head. */
static void final_norm_forward(dt_model *m) {
    const dt_model_config *c = &m->cfg;
    int C = c->d_model, L = dt_stage_layers(c, &m->opts), BT = m->B * m->T, RW = dt_sp_rows(m, BT), r0 = dt_sp_row0(m, BT);
    dt_llama_acts *a = m->impl;
    const float *last = a->res3 + (size_t)(L - 1) * RW * C;
    dt_unit_need(m, NORM_UNIT, dt_model_weights(m)->tensors[HEAD_ID].unit);
    float *lnf = dt_lowp(m) ? a->dbig : a->lnf + (size_t)r0 * C; /* its place among every row */
    DT_PROF(m, fwd, DT_OP_RMSNORM, dt_rmsnorm_forward(lnf, a->rstdf, last, dt_fam_param(m, NORM_ID, 0), RW, C, c->norm_eps));
    dt_fam_narrow(m, a->lnfh + (size_t)r0 * C, lnf, (size_t)RW * C);
    dt_sp_gather_norm(m, a->lnf, a->lnfh, lnf, BT, C);
}

static dt_status llama_forward(dt_ctx *ctx, dt_model *m, const int32_t *inputs,
                               const int32_t *targets, float *loss) {
    const dt_model_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->d_model, L = dt_stage_layers(c, &m->opts);
    int V = c->vocab, BT = B * T;
    /* a pipeline stage (model.h): the first embeds, the others start from DT_STAGE_IN; the last
     * runs the head, the others stop at their last layer's output (DT_STAGE_OUT) */
    const int first = dt_stage_first(&m->opts), last = dt_stage_last(c, &m->opts);
    dt_llama_acts *a = m->impl;
    DT_CHECK(dt_model_check_tokens(ctx, inputs, targets, BT, V));
    dt_copy(a->inputs, inputs, (size_t)BT * sizeof(int32_t));
    if (targets) dt_copy(a->targets, targets, (size_t)BT * sizeof(int32_t));
    m->has_targets = targets != NULL;
    if (c->n_experts) dt_moe_begin(m, &a->moe);
    if (!first) {
        /* the previous stage's output is in `encoded` already */
    } else if (!m->opts.sp) {
        dt_vocab_embed_forward(m, DT_LLAMA_P_EMBED, a->encoded, inputs, BT, LAYER(0));
    } else { /* every row (the vocabulary shards' sum), kept for the rows held */
        dt_vocab_embed_forward(m, DT_LLAMA_P_EMBED, a->spa, inputs, BT, LAYER(0));
        dt_copy(a->encoded, a->spa + (size_t)dt_sp_row0(m, BT) * C, (size_t)dt_sp_rows(m, BT) * C * sizeof(float));
    }
    for (int l = 0; l < L; l++) {
        double tl = dt_trace_begin();
        block_forward(m, l, 0, l + 1 < L ? LAYER(l + 1) : last ? NORM_UNIT : -1);
        dt_trace_end(tl, "fwd", "fwd layer %d", dt_params_layer(&m->ps, m->chunk_l0 + l));
    }
    if (!last) return DT_OK;
    final_norm_forward(m);
    dt_vocab_lm_forward(m, HEAD_ID, (dt_mmin){a->lnf, a->lnfh}, targets, a->logits, a->losses, a->ce_lse, a->dbtc);
    if (!targets) return DT_OK;
    m->last_loss = dt_model_mean_loss(a->losses, targets, BT); /* NaN/Inf: training.nonfinite decides */
    if (c->n_experts) { /* the router's losses (moe.h) */
        m->moe_ce = m->last_loss;
        m->last_loss = (float)((double)m->moe_ce + dt_moe_finish(m, &a->moe));
    }
    if (loss) *loss = m->last_loss;
    return DT_OK;
}

static void llama_backward(dt_model *m, float scale) {
    const dt_model_config *c = &m->cfg;
    const tp_dims d = dims_of(c, &m->opts);
    int B = m->B, T = m->T, C = c->d_model, NH = c->n_head, L = dt_stage_layers(c, &m->opts);
    int BT = B * T, hs = C / NH;
    static const int qkv_ids[] = {DT_LLAMA_P_WQ, DT_LLAMA_P_WK, DT_LLAMA_P_WV}, gu_ids[] = {DT_LLAMA_P_WGATE, DT_LLAMA_P_WUP};
    dt_llama_acts *a = m->impl;
    DT_ASSERT(m->has_targets); /* backward needs a forward with targets */
    m->has_targets = 0;        /* dlogits overwrite the logits: one backward per forward */
    const int RW = dt_sp_rows(m, BT), r0 = dt_sp_row0(m, BT);
    const size_t rwc = (size_t)RW * C;
    const float *dlogits = NULL;
    if (dt_stage_last(c, &m->opts)) {
        dlogits = dt_vocab_lm_backward(m, HEAD_ID, (dt_mmin){a->lnf, a->lnfh}, a->targets, a->logits, a->losses, a->ce_lse,
                                       a->dbtc, scale, NORM_UNIT);
        dt_fill(a->dres, 0, rwc * sizeof(float));
        const float *last = a->res3 + (size_t)(L - 1) * rwc;
        dt_unit_need(m, NORM_UNIT, BWD_FIRST(L - 1));
        dt_unit_grads_begin(m, NORM_UNIT);
        DT_PROF(m, bwd, DT_OP_RMSNORM, dt_sp_rmsnorm_backward(m, a->dres, dt_fam_grad(m, NORM_ID, 0), a->dbtc + (size_t)r0 * C,
                                                              last, dt_fam_param(m, NORM_ID, 0), a->rstdf, BT, C, a->sptmp));
        dt_unit_grads_end(m, NORM_UNIT);
    } /* else a pipeline stage's output gradient is in dres already (DT_STAGE_DOUT) */
    const int top = dt_act_top_recomputed(&m->opts, L);
    for (int l = L - 1; l >= 0; l--) {
        double tl = dt_trace_begin();
        if (dt_model_recomputes(&m->opts, l) && l != top) block_forward(m, l, 1, -1);
        layer_views v = views(m, l);
        const int u2 = SUB(WDOWN, l), u1 = SUB(LN2, l), u0 = SUB(LN1, l);
        if (c->n_experts) {
            /* dres holds d(res3); the residual passes it to res2 unchanged. */
            dt_moe_backward(m, &a->moe, l, v.ln2, dt_lowp(m) ? v.ln2h : NULL, a->dres, a->dbtc, scale, u0);
        } else {
            dt_unit_need(m, u2, u1);
            dt_unit_grads_begin(m, u2);
            /* dres holds d(res3); the residual passes it to res2 unchanged. */
            const float *dout = dt_sp_dout(m, a->dres, a->spa, BT, C); /* every row */
            DT_PROF(m, bwd, DT_OP_MATMUL, dt_tp_row_backward(m, a->dmid, ID(WDOWN), l, NULL, dout, MMIN(hmid), BT, d.Fl, C));
            dt_unit_grads_end(m, u2);
            for (int j = 0; j < d.nb; j++)
                DT_PROF(m, bwd, DT_OP_SWIGLU, dt_swiglu_backward(a->dbig + (size_t)j * BT * 2 * d.Fl, v.gu + (size_t)j * BT * 2 * d.Fl,
                                                                 a->dmid + (size_t)j * BT * d.Fl, BT, d.Fl));
            dt_unit_need(m, u1, u0);
            dt_unit_grads_begin(m, u1);
            const dt_mmin x = dt_sp_col_input(m, MMIN(ln2), a->spa, a->spah, BT, C); /* the gate|up input, every row */
            DT_PROF(m, bwd, DT_OP_MATMUL, dt_sp_cols_backward(m, a->dbtc, gu_ids, 2, l, a->dbig, x, BT, C, 2 * d.Fl, a->spb, a->tpx));
        }
        DT_PROF(m, bwd, DT_OP_RMSNORM, dt_sp_rmsnorm_backward(m, a->dres, G(LN2, l), a->dbtc, v.res2, P(LN2, l), v.rstd2, BT, C,
                                                              a->sptmp));
        dt_unit_grads_end(m, u1);
        dt_unit_need(m, u0, l > 0 ? BWD_FIRST(l - 1) : -1);
        dt_unit_grads_begin(m, u0);
        /* dres now holds d(res2); the residual passes it to resid unchanged. */
        const float *dout = dt_sp_dout(m, a->dres, a->spa, BT, C);
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_tp_row_backward(m, a->dbtc, ID(WO), l, NULL, dout, MMIN(atty), BT, d.Ql, C));
        for (int j = 0; j < d.nb; j++) {
            float *dqkv = a->dbig + (size_t)j * BT * d.QWl;
            DT_PROF(m, bwd, DT_OP_ATTENTION, dt_fam_attention_backward(m, dqkv, a->dbtc + (size_t)j * BT * d.Ql,
                                                                       v.qkv + (size_t)j * BT * d.QWl, v.atty + (size_t)j * BT * d.Ql,
                                                                       v.lse + (size_t)j * BT * d.NHl, B, T, d.NHl, d.NKVl, hs,
                                                                       a->cps));
            DT_PROF(m, bwd, DT_OP_ROPE, dt_fam_rope(m, dqkv, B, T, d.NHl, d.NKVl, hs, a->rope_inv, a->rope_scale, 1));
        }
        const dt_mmin x = dt_sp_col_input(m, MMIN(ln1), a->spa, a->spah, BT, C); /* the q|k|v input, every row */
        DT_PROF(m, bwd, DT_OP_MATMUL, dt_sp_cols_backward(m, a->dbtc, qkv_ids, 3, l, a->dbig, x, BT, C, d.QWl, a->spb, a->tpx));
        DT_PROF(m, bwd, DT_OP_RMSNORM, dt_sp_rmsnorm_backward(m, a->dres, G(LN1, l), a->dbtc, v.resid, P(LN1, l), v.rstd1, BT, C,
                                                              a->sptmp));
        dt_trace_end(tl, "bwd", "bwd layer %d", dt_params_layer(&m->ps, m->chunk_l0 + l));
        dt_unit_grads_end(m, u0);
    }
    if (!dt_stage_first(&m->opts)) { /* dres holds d(encoded): DT_STAGE_DIN */
        /* the last stage's copy of a tied embedding: the head's weight gradient (family_impl.h) */
        if (dlogits) dt_vocab_embed_backward(m, DT_LLAMA_P_EMBED, NULL, NULL, BT, dlogits, (dt_mmin){a->lnf, a->lnfh});
        return;
    }
    /* d(encoded) of every row (gathered): each rank's vocabulary rows */
    dt_vocab_embed_backward(m, DT_LLAMA_P_EMBED, dt_sp_dout(m, a->dres, a->spa, BT, C), a->inputs, BT, dlogits,
                            (dt_mmin){a->lnf, a->lnfh});
}

/* zb-h1's deferred douts (model.h defer_douts / defer_spans; every shard held, decision 84; a layer
 * that recomputes its forward defers nothing and frees only its output and layer 0's input,
 * the rest of it being the working slots the next recompute overwrites): a layer's backward
 * defers down's, gate|up's, o's and q|k|v's douts in that order (the head and the embedding
 * are vocabulary tensors, formed in the backward). Dead by then:
 * the layer's output res3 (read by the layer above's backward, or the final norm's), gate|up
 * once the SwiGLU's backward read it (before the 2nd dout), res2 and rstd2 once the
 * post-attention norm's did (before the 3rd), q|k|v, the log-sum-exp and (16-bit copies kept
 * for W) the fp32 attention output once the attention's did (before the 4th), rstd1 and the
 * embedding output after the layer. W reads ln1, atty, ln2, hmid (or their 16-bit copies).
 * A layer of experts (one shard, either precision) defers instead three blocks of B T k rows
 * (moe.c: each expert's dy, dgu and gathered input at its rows, 16-bit in the block's first half
 * under mixed precision), then the router's, o's and q|k|v's douts; its experts' gate|up and
 * outputs are dead after the blocks (W reads h, or hh), res2 and rstd2 before o's, q|k|v and the
 * log-sum-exp before q|k|v's. Under expert parallelism the experts' GEMMs stay in B (their
 * gradients go to the source ranks' segments): the router's, o's and q|k|v's douts only
 * (decision 89). */
static int llama_defer_douts(const dt_model *m, int l, size_t *n) {
    const tp_dims d = dims_of(&m->cfg, &m->opts);
    const size_t BT = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model, nb = (size_t)d.nb;
    if (l < 0 || l >= dt_stage_layers(&m->cfg, &m->opts) || dt_model_recomputes(&m->opts, l)) return 0;
    if (m->cfg.n_experts && m->opts.ep > 1) { /* expert parallelism: the experts' GEMMs stay in B (moe.c) */
        n[0] = BT * (size_t)m->cfg.n_experts, n[1] = BT * C, n[2] = BT * (size_t)d.QWl;
        return 3;
    }
    if (m->cfg.n_experts) { /* the experts' blocks (R rows: dy, dgu, the gathered input), the router's, o's, q|k|v's */
        const size_t R = BT * (size_t)m->cfg.experts_topk, Fe = (size_t)m->cfg.expert_d_ff;
        n[0] = R * C, n[1] = R * 2 * Fe, n[2] = R * C, n[3] = BT * (size_t)m->cfg.n_experts, n[4] = BT * C;
        n[5] = BT * (size_t)d.QWl;
        return 6;
    }
    /* every row (a row-parallel GEMM's dout is gathered under sequence parallelism), the shards held */
    n[0] = BT * C, n[1] = BT * 2 * nb * (size_t)d.Fl, n[2] = BT * C, n[3] = BT * nb * (size_t)d.QWl;
    return 4;
}

static int llama_defer_spans(const dt_model *m, int l, dt_act_span *out) {
    const dt_model_config *c = &m->cfg;
    const tp_dims d = dims_of(c, &m->opts);
    /* the split activations: every row, the shards held; the residual stream and the norms'
     * statistics: the rows held (RW, sequence parallelism) */
    const size_t nb = (size_t)d.nb, BT = (size_t)m->B * m->T, RW = (size_t)dt_sp_rows(m, m->B * m->T),
                 C = (size_t)c->d_model;
    layer_views v = {0};
    if (m->acts) v = views(m, l);
    int n = 0;
#define SPAN(ptr, len, at) (out[n++] = (dt_act_span){m->acts ? (float *)(ptr) : NULL, (len), (at)})
    if (dt_model_recomputes(&m->opts, l))
        return dt_fam_recomputed_spans(l, m->acts ? v.res3 : NULL, m->acts ? ((dt_llama_acts *)m->impl)->encoded : NULL, RW * C, out);
    if (c->n_experts) { /* one shard; the MoE state of the layer's slot (moe.h; mixed precision: W reads hh) */
        const size_t R = BT * (size_t)c->experts_topk, Fe = (size_t)c->expert_d_ff;
        const size_t s = dt_act_slot(&m->opts, dt_stage_layers(c, &m->opts), DT_ACT_SEL, l);
        const dt_moe_acts *e = m->acts ? &((dt_llama_acts *)m->impl)->moe : NULL;
        /* expert parallelism: no experts' blocks (the douts start at the router's), and the
         * experts' rows are left alone (their sizes are the received rows') */
        const int x = m->opts.ep > 1 ? 3 : 0;
        SPAN(v.res3, BT * C, 0);
        if (!x) {
            SPAN(e ? e->gu + s * R * 2 * Fe : NULL, R * 2 * Fe, 3); /* read by the SwiGLU's backward, y by */
            SPAN(e ? e->y + s * R * C : NULL, R * C, 3);            /* the weights' (W reads h) */
        }
        SPAN(v.res2, BT * C, 4 - x);
        SPAN(v.rstd2, BT, 4 - x);
        SPAN(v.qkv, BT * (size_t)d.QWl, 5 - x);
        SPAN(v.lse, BT * (size_t)d.NHl, 5 - x);
        SPAN(v.rstd1, BT, 6 - x);
        if (l == 0) SPAN(m->acts ? ((dt_llama_acts *)m->impl)->encoded : NULL, BT * C, 6 - x);
        return n;
    }
    SPAN(v.res3, RW * C, 0);
    SPAN(v.gu, BT * 2 * nb * (size_t)d.Fl, 1);
    SPAN(v.res2, RW * C, 2);
    SPAN(v.rstd2, RW, 2);
    SPAN(v.qkv, BT * nb * (size_t)d.QWl, 3);
    SPAN(v.lse, BT * nb * (size_t)d.NHl, 3);
    if (dt_lowp(m)) SPAN(v.atty, BT * nb * (size_t)d.Ql, 3);
    SPAN(v.rstd1, RW, 4);
    if (l == 0) SPAN(m->acts ? ((dt_llama_acts *)m->impl)->encoded : NULL, RW * C, 4);
#undef SPAN
    return n;
}

/* The experts' adapter names, [w1, w2, w3][A, B][expert]: dtrain's and PEFT's (Mixtral). */
#define MOE_LORA(e, w, ab) "model.layers.%d.block_sparse_moe.experts." #e "." w ".lora_" ab ".weight"
#define MOE_LORA_E(w, ab)                                                                          \
    {MOE_LORA(0, w, ab),  MOE_LORA(1, w, ab),  MOE_LORA(2, w, ab),  MOE_LORA(3, w, ab),  MOE_LORA(4, w, ab),  \
     MOE_LORA(5, w, ab),  MOE_LORA(6, w, ab),  MOE_LORA(7, w, ab),  MOE_LORA(8, w, ab),  MOE_LORA(9, w, ab),  \
     MOE_LORA(10, w, ab), MOE_LORA(11, w, ab), MOE_LORA(12, w, ab), MOE_LORA(13, w, ab), MOE_LORA(14, w, ab), \
     MOE_LORA(15, w, ab)}
#define MOE_LORA_W(w) {MOE_LORA_E(w, "A"), MOE_LORA_E(w, "B")}
static const char *const moe_lora[3][2][DT_MOE_MAX_EXPERTS] = {MOE_LORA_W("w1"), MOE_LORA_W("w2"), MOE_LORA_W("w3")};
#undef MOE_LORA
#define MOE_LORA(e, w, ab) "base_model.model.model.layers.%d.block_sparse_moe.experts." #e "." w ".lora_" ab ".weight"
static const char *const moe_lora_ext[3][2][DT_MOE_MAX_EXPERTS] = {MOE_LORA_W("w1"), MOE_LORA_W("w2"),
                                                                   MOE_LORA_W("w3")};
#undef MOE_LORA
#undef MOE_LORA_E
#undef MOE_LORA_W

/* LoRA sites: every projection is its own tensor (q|k|v and gate|up are read fused; the
 * adapters write their column blocks). Names are PEFT's. */
static int llama_lora_sites(const dt_model_config *c, dt_lora_site *out) {
#define SITE(t, id, rows, mod)                                                                  \
    (dt_lora_site){t, DT_LLAMA_P_##id, 0, (size_t)(rows), "model.layers.%d." mod ".lora_A.weight",  \
                   "model.layers.%d." mod ".lora_B.weight",                                     \
                   "base_model.model.model.layers.%d." mod ".lora_A.weight",                    \
                   "base_model.model.model.layers.%d." mod ".lora_B.weight"}
    const int hs = c->d_model / c->n_head, q = c->n_head * hs, kv = c->n_kv_head * hs;
    out[0] = SITE(DT_LORA_Q, WQ, q, "self_attn.q_proj");
    out[1] = SITE(DT_LORA_K, WK, kv, "self_attn.k_proj");
    out[2] = SITE(DT_LORA_V, WV, kv, "self_attn.v_proj");
    out[3] = SITE(DT_LORA_O, WO, c->d_model, "self_attn.o_proj");
    if (c->n_experts) { /* the experts' w1, w3, w2, expert by expert (table order; decision 90) */
        const size_t Fe = (size_t)c->expert_d_ff;
        for (int e = 0; e < c->n_experts; e++) {
            dt_lora_site *o = out + 4 + 3 * e;
            o[0] = (dt_lora_site){DT_LORA_W1, DT_LLAMA_MOE_W1(e), 0, Fe, moe_lora[0][0][e], moe_lora[0][1][e],
                                  moe_lora_ext[0][0][e], moe_lora_ext[0][1][e]};
            o[1] = (dt_lora_site){DT_LORA_W3, DT_LLAMA_MOE_W3(e), 0, Fe, moe_lora[2][0][e], moe_lora[2][1][e],
                                  moe_lora_ext[2][0][e], moe_lora_ext[2][1][e]};
            o[2] = (dt_lora_site){DT_LORA_W2, DT_LLAMA_MOE_W2(e), 0, (size_t)c->d_model, moe_lora[1][0][e],
                                  moe_lora[1][1][e], moe_lora_ext[1][0][e], moe_lora_ext[1][1][e]};
        }
        return 4 + 3 * c->n_experts;
    }
    out[4] = SITE(DT_LORA_GATE, WGATE, c->d_ff, "mlp.gate_proj");
    out[5] = SITE(DT_LORA_UP, WUP, c->d_ff, "mlp.up_proj");
    out[6] = SITE(DT_LORA_DOWN, WDOWN, c->d_model, "mlp.down_proj");
#undef SITE
    return 7;
}

static const char *const hf_types[] = {"llama", "mistral", "mixtral", NULL};
static const char *const file_fields[] = {"n_layer", "d_model",  "n_head",     "n_kv_head",
                                          "d_ff",    "vocab",    "context",    "untied",
                                          "rope_theta", "norm_eps", "rope_scaling", "rope_factor",
                                          "rope_low_freq_factor", "rope_high_freq_factor",
                                          "rope_original_context", "rope_beta_fast", "rope_beta_slow",
                                          "rope_attention_factor", "n_experts", "experts_topk",
                                          "expert_d_ff", NULL};

/* tp divides the query heads, the key/value heads (each rank whole groups) and the MLP width
 * (a mixture of experts: each expert's, decision 91; the other is 0) */
static const size_t tp_divides[] = {offsetof(dt_model_config, n_head), offsetof(dt_model_config, n_kv_head),
                                    offsetof(dt_model_config, d_ff), offsetof(dt_model_config, expert_d_ff), 0};

const dt_model_family dt_family_llama = {
    .name = "llama",
    .presets = preset_names,
    .preset = llama_preset,
    .validate = llama_validate,
    .tensors = llama_tensors,
    .act_floats = llama_act_floats,
    .impl_bytes = sizeof(dt_llama_acts),
    .bind = llama_bind,
    .forward = llama_forward,
    .backward = llama_backward,
    .logits = llama_logits,
    .num_params = llama_num_params,
    .flops_per_token = llama_flops_per_token,
    .file_format = "dtrain-llama",
    .file_fields = file_fields,
    .hf_architecture = "LlamaForCausalLM",
    .hf_model_type = "llama",
    .hf_config = dt_llama_hf_config,
    .hf_model_types = hf_types,
    .hf_read_config = dt_llama_hf_read,
    .lora_sites = llama_lora_sites,
    .hf_identity = dt_llama_hf_identity,
    .rotary = 1,
    .tp_divides = tp_divides,
    .sp = 1,
    .stage_buf = llama_stage_buf,
    .stage_extra_floats = dt_moe_stage_floats,
    .stage_extra = llama_stage_extra,
    .defer_douts = llama_defer_douts,
    .defer_spans = llama_defer_spans,
};
