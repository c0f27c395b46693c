/* The model interface: the family registry, config fields, and the wrappers every layer
 * above src/model calls. */
#include "model/model.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/family_impl.h"
#include "model/gpt2/gpt2.h"
#include "model/llama/llama.h"
#include "model/rope.h"
#include "model/vit/vit.h"
#include "ops/ops.h"

static size_t max_unit(const dt_params *ps);
static size_t window_len(const dt_params *ps, const dt_model_opts *o, int N);
static int head_tensor(const dt_params *ps);
static size_t lp_head_values(const dt_params *ps, int id, const dt_model_opts *o, int N);
static int head_tensor(const dt_params *ps);
static size_t lp_head_values(const dt_params *ps, int id, const dt_model_opts *o, int N);

const char *const dt_op_kind_names[DT_OP_NKINDS] = {
    "encoder", "layernorm", "matmul",     "attention", "gelu",  "residual",
    "lm_head", "softmax_ce", "rmsnorm", "rope",      "swiglu"};

const dt_model_family *const dt_model_families[] = {&dt_family_gpt2, &dt_family_llama, &dt_family_vit, NULL};

#define F(name, key, type, help) {#name, key, type, offsetof(dt_model_config, name), help, NULL, 0}
#define OPT(name, type, names, help) {#name, "model." #name, type, offsetof(dt_model_config, name), help, names, 1}
const dt_cfg_field dt_model_cfg_fields[] = {
    F(n_layer, "model.n_layer", DT_CFG_INT, "transformer blocks"),
    F(d_model, "model.d_model", DT_CFG_INT, "embedding width"),
    F(n_head, "model.n_head", DT_CFG_INT, "attention heads (must divide d_model)"),
    F(n_kv_head, "model.n_kv_head", DT_CFG_INT,
      "key/value heads, dividing n_head (llama: grouped-query attention, 1 = MQA; 0 = n_head)"),
    F(d_ff, "model.d_ff", DT_CFG_INT, "MLP width (llama's SwiGLU intermediate size; gpt2: 4 d_model; 0 = the family's default)"),
    F(vocab, "model.vocab_size", DT_CFG_INT, "vocabulary size (padded to 128 internally)"),
    F(context, "model.context", DT_CFG_INT, "maximum sequence length (learned positions: <= the preset's)"),
    F(untied, "model.untied_embeddings", DT_CFG_INT, "1: the lm_head has its own weights (llama); 0: tied to the token embedding"),
    F(rope_theta, "model.rope_theta", DT_CFG_FLOAT, "rotary embedding base (llama; 0 = 10000)"),
    F(norm_eps, "model.norm_eps", DT_CFG_FLOAT, "epsilon of the norms (0 = the family's default: gpt2 1e-5, llama 1e-5)"),
    F(image_size, "model.image_size", DT_CFG_INT, "vit: image side in pixels"),
    F(patch_size, "model.patch_size", DT_CFG_INT, "vit: patch side in pixels (divides image_size)"),
    F(channels, "model.channels", DT_CFG_INT, "vit: colour planes (0 = 1)"),
    F(n_classes, "model.n_classes", DT_CFG_INT, "vit: classes of the head"),
    OPT(rope_scaling, DT_CFG_INT, dt_rope_scaling_names, "llama: RoPE scaling rule (none, linear, llama3, yarn)"),
    OPT(rope_factor, DT_CFG_FLOAT, NULL, "llama: RoPE scaling factor (linear, llama3, yarn)"),
    OPT(rope_low_freq_factor, DT_CFG_FLOAT, NULL, "llama: llama3 scaling's low_freq_factor"),
    OPT(rope_high_freq_factor, DT_CFG_FLOAT, NULL, "llama: llama3 scaling's high_freq_factor"),
    OPT(rope_original_context, DT_CFG_INT, NULL, "llama: the context before RoPE scaling (llama3, yarn)"),
    OPT(rope_beta_fast, DT_CFG_FLOAT, NULL, "llama: yarn's beta_fast (0 = 32)"),
    OPT(rope_beta_slow, DT_CFG_FLOAT, NULL, "llama: yarn's beta_slow (0 = 1)"),
    OPT(rope_attention_factor, DT_CFG_FLOAT, NULL, "llama: yarn's cos/sin scale (0 = 0.1 ln(factor) + 1)"),
    OPT(n_experts, DT_CFG_INT, NULL, "llama: experts per layer (mixture of experts; 0 = a dense MLP)"),
    OPT(experts_topk, DT_CFG_INT, NULL, "llama: experts each token is routed to"),
    OPT(expert_d_ff, DT_CFG_INT, NULL, "llama: each expert's SwiGLU width"),
};
#undef F
#undef OPT
const int dt_model_cfg_nfields = (int)(sizeof dt_model_cfg_fields / sizeof dt_model_cfg_fields[0]);
_Static_assert(sizeof dt_model_cfg_fields / sizeof dt_model_cfg_fields[0] <= 32, "dt_run_cfg.model_set has 32 slots");

double dt_model_cfg_get(const dt_model_config *c, const dt_cfg_field *f) {
    const char *p = (const char *)c + f->offset;
    return f->type == DT_CFG_INT ? (double)*(const int *)p : (double)*(const float *)p;
}

void dt_model_cfg_set(dt_model_config *c, const dt_cfg_field *f, double v) {
    char *p = (char *)c + f->offset;
    if (f->type == DT_CFG_INT)
        *(int *)p = (int)v;
    else
        *(float *)p = (float)v;
}

const dt_model_family *dt_model_family_find(const char *name) {
    if (!name || !*name) name = "gpt2";
    for (int i = 0; dt_model_families[i]; i++)
        if (!strcmp(dt_model_families[i]->name, name)) return dt_model_families[i];
    return NULL;
}

const dt_model_family *dt_model_family_of(const dt_model_config *c) { return dt_model_family_find(c->family); }

const char *dt_model_preset_list(void) {
    static char buf[512];
    if (buf[0]) return buf;
    size_t len = 0;
    for (int i = 0; dt_model_families[i]; i++)
        for (int j = 0; dt_model_families[i]->presets[j]; j++)
            if (len < sizeof buf - 1) /* snprintf returns what it would have written */
                len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", len ? ", " : "",
                                        dt_model_families[i]->presets[j]);
    return buf;
}

dt_status dt_model_preset(dt_ctx *ctx, const char *name, dt_model_config *out) {
    for (int i = 0; dt_model_families[i]; i++)
        for (int j = 0; dt_model_families[i]->presets[j]; j++)
            if (!strcmp(dt_model_families[i]->presets[j], name)) {
                memset(out, 0, sizeof *out);
                snprintf(out->family, sizeof out->family, "%s", dt_model_families[i]->name);
                dt_model_families[i]->preset(name, out);
                return dt_model_config_validate(ctx, out);
            }
    return dt_fail(ctx, DT_ERR_CONFIG, "model.preset: unknown preset '%s' (known: %s)", name,
                   dt_model_preset_list());
}

dt_status dt_model_config_validate(dt_ctx *ctx, dt_model_config *c) {
    const dt_model_family *f = dt_model_family_of(c);
    if (!f) {
        char known[128];
        size_t len = 0;
        known[0] = 0;
        for (int i = 0; dt_model_families[i]; i++)
            if (len < sizeof known - 1)
                len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "",
                                        dt_model_families[i]->name);
        return dt_fail(ctx, DT_ERR_CONFIG, "model.family: unknown family '%s' (known: %s)", c->family, known);
    }
    snprintf(c->family, sizeof c->family, "%s", f->name);
    return f->validate(ctx, c);
}

size_t dt_model_num_params(const dt_model_config *c) { return dt_model_family_of(c)->num_params(c); }

double dt_model_flops_per_token(const dt_model_config *c, int T) {
    return dt_model_family_of(c)->flops_per_token(c, T);
}

int dt_model_tensors(const dt_model_config *c, dt_tensor_info *out) {
    int n = dt_model_family_of(c)->tensors(c, out);
    for (int i = 0; i < n; i++)
        if (!out[i].file_rows) out[i].file_rows = out[i].rows;
    return n;
}

int dt_model_vocab_padded(const dt_model_config *c, const dt_model_opts *o) {
    int k = dt_tp_size(o);
    if (k <= 1) return c->vocab_padded;
    long q = 128L * k;
    return (int)((c->vocab + q - 1) / q * q);
}

int dt_model_tensors_tp(const dt_model_config *c, const dt_model_opts *o, dt_tensor_info *out) {
    dt_model_config cc = *c;
    cc.vocab_padded = dt_model_vocab_padded(c, o);
    int n = dt_model_tensors(&cc, out);
    dt_params_table_tp(out, n, dt_tp_size(o), dt_tp_local(o), dt_tp_first(o));
    return n;
}

dt_status dt_model_tp_check(dt_ctx *ctx, const dt_model_config *c, const dt_model_opts *o) {
    const int k = dt_tp_size(o);
    if (k <= 1) {
        if (o && o->sp)
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.sequence_parallel needs parallel.tp >= 2 (it shards the "
                           "tensor-parallel ranks' token rows)");
        return DT_OK;
    }
    const dt_model_family *f = dt_model_family_of(c);
    if (!f || !f->tp_divides)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp=%d: tensor parallelism is not built for "
                       "the %s family (its table has no split column)", k, f ? f->name : c->family);
    if (c->n_experts && o->sp) /* decision 91: the experts' tensor parallelism runs on every token row */
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.sequence_parallel with model.n_experts=%d: sequence parallelism "
                       "of a mixture of experts is not built (tensor parallelism of its experts is)", c->n_experts);
    if (c->n_experts && o->compute != DT_F32) /* decisions 87 and 91 were built apart: not composed yet */
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp=%d with model.n_experts=%d and training.precision=%s: not built "
                       "(tensor parallelism of experts runs in fp32)", k, c->n_experts, o->compute == DT_BF16 ? "bf16" : "fp16");
    if (c->n_experts && (o->lora.rank > 0 || o->lora.nf4)) /* decisions 90 and 91 likewise */
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp=%d with model.n_experts=%d and lora.rank: not built (tensor "
                       "parallelism of experts runs without LoRA)", k, c->n_experts);
    if (o->sp && !f->sp)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.sequence_parallel: sequence parallelism is not built for "
                       "the %s family", f->name);
    if (o->tp_local != 0 && o->tp_local != 1 && o->tp_local != k)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp_blocks: a process holds 1 or all %d shards (got %d)", k,
                       o->tp_local);
    if (o->tp_first < 0 || o->tp_first + dt_tp_local(o) > k)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp=%d: shard %d is outside the group", k, o->tp_first);
    for (const size_t *d = f->tp_divides; *d; d++) {
        int v = *(const int *)((const char *)c + *d);
        const char *key = "model field";
        for (int i = 0; i < dt_model_cfg_nfields; i++)
            if (dt_model_cfg_fields[i].offset == *d) key = dt_model_cfg_fields[i].key;
        if (v % k)
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp=%d does not divide %s=%d (each tensor-parallel rank takes "
                           "an equal share)", k, key, v);
    }
    return dt_lora_tp_check(ctx, c, o); /* LoRA's adapters are cut like their base (decision 69) */
}

size_t dt_model_act_floats(const dt_model_config *c, int B, int T) {
    return dt_model_act_floats_opts(c, NULL, B, T);
}

size_t dt_model_act_floats_opts(const dt_model_config *c, const dt_model_opts *o, int B, int T) {
    static const dt_model_opts none = {DT_RECOMPUTE_NONE, 1, DT_F32, 0, 0, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const dt_model_opts *oo = o ? o : &none;
    size_t mx = 0;
    for (int k = 0; k < dt_stage_chunks(oo); k++) { /* an interleaved stage: its largest chunk's */
        dt_model_opts ok = *oo;
        if (dt_stage_chunks(oo) > 1) {
            const int n = oo->pp_l1 - oo->pp_l0;
            ok.pp_c = k, ok.pp_l0 = dt_store_g0(oo) + k * oo->pp_stride, ok.pp_l1 = ok.pp_l0 + n;
        }
        size_t f = dt_model_family_of(c)->act_floats(c, &ok, B, T) + dt_lora_act_floats(c, &ok, B, T);
        mx = f > mx ? f : mx;
    }
    return mx;
}

const char *dt_recompute_name(dt_recompute r) {
    return r == DT_RECOMPUTE_FULL ? "full" : r == DT_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

int dt_model_recomputes(const dt_model_opts *o, int l) {
    if (!o || o->recompute == DT_RECOMPUTE_NONE) return 0;
    /* the model's layer (a pipeline stage's local l is layer pp_l0 + l): the same layers
     * recompute whatever the stages */
    return (o->pp_l0 + l) % (o->recompute_every > 1 ? o->recompute_every : 1) == 0;
}

int dt_model_config_equal(const dt_model_config *a, const dt_model_config *b) {
    if (dt_model_family_of(a) != dt_model_family_of(b)) return 0;
    for (int i = 0; i < dt_model_cfg_nfields; i++)
        if (dt_model_cfg_get(a, &dt_model_cfg_fields[i]) != dt_model_cfg_get(b, &dt_model_cfg_fields[i]))
            return 0;
    return 1;
}

void dt_model_describe(const dt_model_config *c, char *buf, size_t n) {
    const dt_model_family *f = dt_model_family_of(c);
    size_t len = (size_t)snprintf(buf, n, "%s:", f ? f->name : c->family);
    for (int i = 0; f && f->file_fields[i] && len < n; i++)
        for (int k = 0; k < dt_model_cfg_nfields; k++) {
            const dt_cfg_field *fd = &dt_model_cfg_fields[k];
            const double v = dt_model_cfg_get(c, fd);
            if (strcmp(fd->name, f->file_fields[i]) || (fd->optional && v == 0.0) || len >= n - 1) continue;
            if (fd->names)
                len += (size_t)snprintf(buf + len, n - len, " %s %s", fd->name, fd->names[(int)v]);
            else
                len += (size_t)snprintf(buf + len, n - len, " %s %g", fd->name, v);
        }
}

dt_status dt_model_init(dt_ctx *ctx, dt_model *m, const dt_model_config *cfg, dt_alloc *alloc,
                        int B, int T, int slabs) {
    return dt_model_init_opts(ctx, m, cfg, NULL, alloc, B, T, slabs);
}

dt_status dt_model_init_opts(dt_ctx *ctx, dt_model *m, const dt_model_config *cfg,
                             const dt_model_opts *opts, dt_alloc *alloc, int B, int T, int slabs) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->opts = opts ? *opts : (dt_model_opts){DT_RECOMPUTE_NONE, 1, DT_F32, 0, 0, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (m->opts.recompute_every == 0) m->opts.recompute_every = 1;
    if (m->opts.compute != DT_F32 && m->opts.compute != DT_BF16 && m->opts.compute != DT_F16)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.precision must be fp32, bf16 or fp16");
    if (m->opts.head_rows < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "memory.fused_loss_rows must be >= 0 (got %d)", m->opts.head_rows);
    if (m->opts.recompute_every < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "memory.activation_checkpointing_every must be >= 1 (got %d)",
                       m->opts.recompute_every);
    DT_CHECK(dt_model_config_validate(ctx, &m->cfg));
    if (m->cfg.n_experts > 0) { /* ARCHITECTURE decision 63 (16-bit precision: 87; LoRA: 90) */
        if ((m->opts.lora.rank != 0 || m->opts.lora.nf4) && m->opts.compute != DT_F32)
            return dt_fail(ctx, DT_ERR_CONFIG, "lora.rank with model.n_experts > 0 and training.precision=%s: not built "
                           "(LoRA and QLoRA on a mixture of experts run in fp32)",
                           m->opts.compute == DT_BF16 ? "bf16" : "fp16");
    }
    if (B < 1 || B > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.micro_batch must be in [1, 65536] (got %d)", B);
    if (T < 1 || T > m->cfg.context)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.seq_len must be in [1, model.context=%d] (got %d)",
                       m->cfg.context, T);
    m->fam = dt_model_family_of(&m->cfg);
    m->B = B;
    m->T = T;
    m->alloc = alloc;
    DT_CHECK(dt_model_tp_check(ctx, &m->cfg, &m->opts));
    if (m->opts.sp && m->fam->token_rows && m->fam->token_rows(&m->cfg, B, T) % dt_tp_size(&m->opts))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.sequence_parallel: training.micro_batch=%d images x %d tokens "
                       "(patches and the class token) = %d token rows must divide among parallel.tp=%d ranks", B,
                       m->fam->token_rows(&m->cfg, 1, T), m->fam->token_rows(&m->cfg, B, T), dt_tp_size(&m->opts));
    if (m->opts.sp && !m->fam->token_rows && ((long)B * T) % dt_tp_size(&m->opts))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.sequence_parallel: training.micro_batch x training.seq_len = %ld "
                       "token rows must divide among parallel.tp=%d ranks", (long)B * T, dt_tp_size(&m->opts));
    m->cfg.vocab_padded = dt_model_vocab_padded(&m->cfg, &m->opts);
    dt_tensor_info table[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors_tp(&m->cfg, &m->opts, table);
    DT_CHECK(dt_model_stage_table(ctx, &m->cfg, &m->opts, table, n));
    dt_status st = DT_OK;
    const int chunks = dt_stage_chunks(&m->opts);
    if (m->opts.lora.rank != 0 || m->opts.lora.nf4)
        DT_CHECK_GOTO(dt_lora_model_init(ctx, m, alloc, slabs));
    else
        DT_CHECK_GOTO(dt_params_init(ctx, &m->ps, table, n, chunks * dt_stage_layers(&m->cfg, &m->opts), alloc, slabs));
    m->ps.layer0 = dt_store_g0(&m->opts);
    if (chunks > 1) m->ps.lchunk = dt_stage_layers(&m->cfg, &m->opts), m->ps.lstride = m->opts.pp_stride;
    if (chunks > 1) m->chunk_l0 = m->opts.pp_c * m->ps.lchunk;
    const size_t fam_acts = m->fam->act_floats(&m->cfg, &m->opts, B, T);
    m->n_acts = dt_model_act_floats_opts(&m->cfg, &m->opts, B, T); /* an interleaved stage: its largest chunk's */
    DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_ACTS, m->n_acts * sizeof(float), (void **)&m->acts));
    DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, m->fam->impl_bytes, &m->impl));
    m->lp_unit[0] = m->lp_unit[1] = -1;
    m->lp_head_epoch = -1;
    const dt_params *ws = dt_model_weights(m);
    m->head_id = head_tensor(ws);
    /* the fused loss forms the head's gradients outside the strategy's gradient windows (a
     * LoRA base's head has none) */
    DT_ASSERT(!m->opts.fused_loss || (slabs & DT_SLAB_GRADS) || m->head_id < 0 || m->lora);
    if (m->opts.compute != DT_F32 && ((slabs & DT_SLAB_PARAMS) || m->lora)) {
        size_t win = window_len(ws, &m->opts, B * T) * sizeof(uint16_t);
        for (int w = 0; w < 2; w++)
            DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_PARAMS, win, (void **)&m->lp_win[w]));
        m->lp_head_len = lp_head_values(ws, m->head_id, &m->opts, B * T);
        if (m->lp_head_len)
            DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_PARAMS, m->lp_head_len * sizeof(uint16_t),
                                       (void **)&m->lp_head));
    }
    m->fam->bind(m);
    if (m->lora) dt_lora_bind(m, m->acts + fam_acts);
    return DT_OK;
fail:
    dt_model_free(m);
    return st;
}

int dt_model_tied_head(const dt_tensor_info *table, int n) {
    int head = -1;
    for (int i = 0; i < n; i++)
        if (table[i].vocab && table[i].matmul) head = i;
    return head >= 0 && table[head].group == DT_PG_PRE ? head : -1;
}

dt_status dt_model_stage_table(dt_ctx *ctx, const dt_model_config *c, const dt_model_opts *o, dt_tensor_info *table,
                               int n) {
    if (o && o->ep > 1) { /* expert parallelism: the experts of this rank only (decision 85) */
        if (c->n_experts < o->ep || c->n_experts % o->ep || o->ep_rank < 0 || o->ep_rank >= o->ep)
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.ep=%d must divide model.n_experts=%d", o->ep, c->n_experts);
        const int per = c->n_experts / o->ep;
        for (int i = 0; i < n; i++)
            if (table[i].expert && (table[i].expert - 1) / per != o->ep_rank) table[i].rows = table[i].file_rows = 0;
    }
    if (!o || o->pp_l1 <= 0) return DT_OK;
    if (o->pp_l0 < 0 || o->pp_l0 >= o->pp_l1 || o->pp_l1 > c->n_layer)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp: a stage's layers [%d, %d) are not inside the model's %d",
                       o->pp_l0, o->pp_l1, c->n_layer);
    if (dt_stage_chunks(o) > 1 &&
        (o->pp_c < 0 || o->pp_c >= o->pp_v || o->pp_stride < o->pp_l1 - o->pp_l0 || dt_store_g0(o) < 0 ||
         dt_store_g0(o) + (o->pp_v - 1) * o->pp_stride + (o->pp_l1 - o->pp_l0) > c->n_layer))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_virtual: %d chunks of %d layers, %d apart, are not inside the "
                       "model's %d layers", o->pp_v, o->pp_l1 - o->pp_l0, o->pp_stride, c->n_layer);
    const int first = dt_store_first(o), last = dt_store_last(c, o); /* any of its chunks */
    const int head = dt_model_tied_head(table, n);
    for (int i = 0; i < n; i++) {
        dt_tensor_info *t = &table[i];
        /* the last stage holds a copy of a head tied to the embedding (decision 74) */
        if ((t->group == DT_PG_PRE && !first && !(i == head && last)) || (t->group == DT_PG_POST && !last))
            t->rows = t->file_rows = 0;
    }
    return DT_OK;
}

void dt_model_set_chunk(dt_model *m, int c) {
    dt_model_opts *o = &m->opts;
    DT_ASSERT(c >= 0 && c < dt_stage_chunks(o));
    const int n = o->pp_l1 - o->pp_l0, g0 = dt_store_g0(o);
    o->pp_c = c;
    o->pp_l0 = g0 + c * o->pp_stride, o->pp_l1 = o->pp_l0 + n;
    m->chunk_l0 = c * n;
    m->fam->bind(m);
}

void dt_model_weight_pass(dt_model *m, dt_wdefer *d) {
    int open = -1;
    const void *gathered = NULL;
    const dt_dtype dt = m->opts.compute;
    for (int i = 0; i < d->n; i++) {
        const dt_wdefer_item *it = &d->items[i];
        if (it->unit != open) { /* the units in the backward's (descending) order */
            if (open >= 0) dt_unit_grads_end(m, open);
            dt_unit_grads_begin(m, it->unit);
            open = it->unit;
        }
        if (it->gsrc && it->gsrc != gathered) { /* sequence parallelism: the input's rows again */
            if (it->xh) dt_sp_gather16(m, (uint16_t *)it->xh, it->gsrc, it->N, it->C);
            else dt_sp_gather(m, (float *)it->x, it->gsrc, it->N, it->C);
            gathered = it->gsrc;
        }
        if (it->site >= 0) { /* LoRA: a site's adapters */
            dt_lora_mm_weights(m, it);
            continue;
        }
        float *dw = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, it->id, it->l) + it->woff;
        float *db = it->bias_unit >= 0 ? m->ps.unit_grads[it->bias_unit] + it->bias_off : NULL;
        if (it->ld != it->OC) { /* a fused projection's tensor: the whole backward's strided GEMM */
            DT_ASSERT(!db);
            if (!it->xh) {
                dt_matmul_backward_ld(NULL, 0, dw, it->dout, it->ld, it->x, NULL, it->N, it->C, it->OC);
                continue;
            }
            uint16_t *h = m->lp_scratch + it->col; /* its columns narrowed where the backward had them */
            for (int n = 0; n < it->N; n++)
                dt_to_lowp(dt, h + (size_t)n * it->ld, it->dout + (size_t)n * it->ld, (size_t)it->OC);
            dt_matmul_backward_ld_lp(dt, NULL, 0, dw, h, it->ld, it->xh, NULL, it->N, it->C, it->OC);
        } else if (it->xh) { /* dt_matmul_backward_lp's dW and dbias: the dout narrowed again alike */
            dt_matmul_backward_lp(dt, NULL, dw, db, it->dout, m->lp_scratch, it->xh, NULL, it->N, it->C, it->OC);
        } else {
            dt_matmul_backward(NULL, dw, db, it->dout, it->x, NULL, it->N, it->C, it->OC);
        }
    }
    if (open >= 0) dt_unit_grads_end(m, open);
    d->n = d->nd = 0;
    d->g_full = d->g_loc = NULL;
}

int dt_model_defer_gemms(const dt_model *m, int douts) {
    if (m->cfg.n_experts) return douts * (m->cfg.n_experts + 1); /* a layer's 6: its experts' 2 E GEMMs and 3 */
    return dt_tp_size(&m->opts) > 1 || m->opts.lora.rank > 0 ? douts * dt_tp_local(&m->opts) * 3 : douts;
}

/* dt_model_defer_plan's walk: the spans dead so far (free[0..nf), their layer and index in
 * lay/idx, `used` floats of each taken), the fallback's floats, the places made. */
typedef struct defer_walk {
    dt_act_span *free; /* room for every layer's spans */
    int *lay, *idx;
    size_t *used;
    int nf, cap, items;
    size_t fallback;
    dt_wdefer_place *out;
} defer_walk;

static size_t defer_round(size_t n) { return (n + 15) / 16 * 16; } /* dt_act_take's alignment */

/* The next dout (n floats): first-fit into the dead spans, else the fallback. */
static void defer_put(defer_walk *w, size_t n) {
    dt_wdefer_place pl = {-1, -1, w->fallback, n};
    int k = 0;
    while (k < w->nf && w->used[k] + n > w->free[k].n) k++;
    if (k < w->nf) {
        pl = (dt_wdefer_place){w->lay[k], w->idx[k], w->used[k], n};
        w->used[k] = defer_round(w->used[k] + n);
    } else {
        w->fallback += defer_round(n);
    }
    if (w->out) w->out[w->items] = pl;
    w->items++;
}

/* Span j of layer l (n of them in sp) joins the free ones. */
static void defer_free(defer_walk *w, const dt_act_span *sp, int l, int j) {
    DT_ASSERT(w->nf < w->cap);
    w->free[w->nf] = sp[j], w->lay[w->nf] = l, w->idx[w->nf] = j, w->used[w->nf] = 0;
    w->nf++;
}

size_t dt_model_defer_plan(const dt_model *m, dt_wdefer_place *out, int *items) {
    const dt_model_family *f = m->fam;
    DT_ASSERT(f->defer_douts && f->defer_spans);
    const int L = dt_stage_layers(&m->cfg, &m->opts);
    defer_walk wk = {0}, *w = &wk;
    w->cap = L * DT_DEFER_MAX;
    w->free = malloc((size_t)w->cap * sizeof *w->free);
    w->lay = malloc((size_t)w->cap * sizeof *w->lay);
    w->idx = malloc((size_t)w->cap * sizeof *w->idx);
    w->used = malloc((size_t)w->cap * sizeof *w->used);
    DT_ASSERT(w->free && w->lay && w->idx && w->used);
    w->out = out;
    dt_model probe = *m; /* the spans' sizes only: no activations read */
    probe.acts = NULL;
    size_t n[DT_DEFER_MAX];
    dt_act_span sp[DT_DEFER_MAX];
    int nd = f->defer_douts(m, L, n); /* the head's: before any layer's activations die */
    for (int i = 0; i < nd; i++) defer_put(w, n[i]);
    for (int l = L - 1; l >= 0; l--) {
        nd = f->defer_douts(m, l, n);
        const int ns = f->defer_spans(&probe, l, sp);
        DT_ASSERT(nd <= DT_DEFER_MAX && ns <= DT_DEFER_MAX);
        for (int i = 0; i <= nd; i++) {
            for (int j = 0; j < ns; j++) /* dead before its i-th dout (i = nd: after the layer) */
                if (sp[j].from == i || (i == nd && sp[j].from > nd)) defer_free(w, sp, l, j);
            if (i < nd) defer_put(w, n[i]);
        }
    }
    nd = f->defer_douts(m, -1, n); /* the embedding's: after every layer */
    for (int i = 0; i < nd; i++) defer_put(w, n[i]);
    if (items) *items = w->items;
    free(w->free), free(w->lay), free(w->idx), free(w->used);
    return w->fallback;
}

float *dt_model_stage_buf(dt_model *m, dt_stage_buf which) {
    DT_ASSERT(m->fam->stage_buf != NULL);
    return m->fam->stage_buf(m, which);
}

size_t dt_model_stage_floats(const dt_model *m) {
    const int N = m->fam->token_rows ? m->fam->token_rows(&m->cfg, m->B, m->T) : m->B * m->T;
    return (size_t)dt_sp_rows(m, N) * (size_t)m->cfg.d_model;
}

size_t dt_model_stage_extra_floats(const dt_model_config *c) {
    const dt_model_family *f = dt_model_family_of(c);
    return f && f->stage_extra_floats ? f->stage_extra_floats(c) : 0;
}

float *dt_model_stage_extra(dt_model *m) {
    return dt_model_stage_extra_floats(&m->cfg) ? m->fam->stage_extra(m) : NULL;
}

void dt_model_use_acts(dt_model *m, float *acts) {
    m->acts = acts; /* rebound even when unchanged: the chunk may have changed the layout */
    m->fam->bind(m);
    if (m->lora) dt_lora_bind(m, m->acts + m->fam->act_floats(&m->cfg, &m->opts, m->B, m->T));
}

void dt_model_free(dt_model *m) {
    if (!m->alloc) return;
    size_t win = window_len(dt_model_weights(m), &m->opts, m->B * m->T) * sizeof(uint16_t);
    for (int w = 0; w < 2; w++)
        if (m->lp_win[w]) dt_alloc_put(m->alloc, DT_MEM_PARAMS, m->lp_win[w], win);
    if (m->lp_head) dt_alloc_put(m->alloc, DT_MEM_PARAMS, m->lp_head, m->lp_head_len * sizeof(uint16_t));
    dt_lora_model_free(m);
    dt_params_free(&m->ps);
    dt_alloc_put(m->alloc, DT_MEM_ACTS, m->acts, m->n_acts * sizeof(float));
    if (m->impl) dt_alloc_put(m->alloc, DT_MEM_OTHER, m->impl, m->fam->impl_bytes);
    memset(m, 0, sizeof *m);
}

void dt_model_init_weights(dt_model *m, uint64_t seed) {
    dt_model_init_base(m, seed);
    dt_params_init_range(&m->ps, seed, m->ps.params, 0, m->ps.n_params);
}

void dt_model_init_base(dt_model *m, uint64_t seed) {
    if (!m->lora || m->opts.lora.base_external) return; /* a file's base comes later (lora.h) */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    /* drawn values are finite: quantizing them cannot fail */
    dt_status st = dt_lora_init_base(&ctx, m, seed);
    DT_ASSERT(st == DT_OK);
    (void)st;
}

dt_status dt_model_forward(dt_ctx *ctx, dt_model *m, const int32_t *inputs, const int32_t *targets,
                           float *loss) {
    m->epoch++; /* the master weights may have changed since the last forward */
    m->head_grads = 0;
    m->lora_drop_on = m->train_fwd && m->lora && m->opts.lora.dropout > 0.0f; /* eval, sample: never */
    return m->fam->forward(ctx, m, inputs, targets, loss);
}

dt_status dt_model_forward_train(dt_ctx *ctx, dt_model *m, const int32_t *inputs, const int32_t *targets,
                                 float scale, float *loss) {
    m->train_fwd = 1;
    m->train_scale = scale;
    dt_status st = dt_model_forward(ctx, m, inputs, targets, loss);
    m->train_fwd = 0;
    return st;
}

int dt_model_head_rows(const dt_model_opts *o, int N) {
    int r = o && o->head_rows > 0 ? o->head_rows : DT_HEAD_ROWS;
    return r < N ? r : N;
}

int dt_model_logit_rows(const dt_model_opts *o, int N) {
    return o && o->fused_loss ? dt_model_head_rows(o, N) : N;
}

/* ---- mixed precision: 16-bit copies of the matmul weights, per unit */

static size_t max_unit(const dt_params *ps) {
    size_t mx = 0;
    for (int u = 0; u < ps->n_units; u++)
        if (ps->unit_len[u] > mx) mx = ps->unit_len[u];
    return mx;
}

/* Values of a 16-bit weight window: the largest unit; under LoRA the largest extent of the
 * matmul tensors a unit has narrowed (a QLoRA base's layer units hold only norms; the
 * embedding's chunks are read in fp32 unless it is the head, and the head's come from the
 * whole-head copy when there is one). */
static size_t window_len(const dt_params *ps, const dt_model_opts *o, int N) {
    if (!o || o->lora.rank <= 0) return max_unit(ps);
    const int head = head_tensor(ps);
    const int head_copy = lp_head_values(ps, head, o, N) > 0;
    size_t mx = 0;
    for (int id = 0; id < ps->n_tensors; id++) {
        const dt_tensor_info *t = &ps->tensors[id];
        if (!t->matmul) continue;
        if (t->vocab) {
            if (id != head || head_copy) continue;
            mx = t->chunk_rows * t->cols > mx ? t->chunk_rows * t->cols : mx; /* chunks are whole units */
            continue;
        }
        for (int l = 0; l < dt_params_copies(ps, id); l++) {
            size_t off;
            dt_params_unit_of(ps, id, l, &off);
            if (off + t->rows * t->cols > mx) mx = off + t->rows * t->cols;
        }
    }
    return mx;
}

/* The lm_head: the last vocabulary tensor read by a matmul (-1: none). */
static int head_tensor(const dt_params *ps) {
    int id = -1;
    for (int i = 0; i < ps->n_tensors; i++)
        if (ps->tensors[i].vocab && ps->tensors[i].matmul) id = i;
    return id;
}

/* Values of the 16-bit lm_head copy: under the fused loss with several row blocks. */
static size_t lp_head_values(const dt_params *ps, int id, const dt_model_opts *o, int N) {
    if (id < 0 || !o || o->compute == DT_F32 || !o->fused_loss || dt_model_head_rows(o, N) >= N) return 0;
    return ps->tensors[id].rows * ps->tensors[id].cols;
}

void dt_model_lowp_plan(const dt_params *ps, const dt_model_opts *o, int slabs, int B, int T,
                        size_t bytes[DT_MEM_NKINDS]) {
    if (!o || o->compute == DT_F32 || !(slabs & DT_SLAB_PARAMS)) return;
    bytes[DT_MEM_PARAMS] += 2 * window_len(ps, o, B * T) * sizeof(uint16_t);
    bytes[DT_MEM_PARAMS] += lp_head_values(ps, head_tensor(ps), o, B * T) * sizeof(uint16_t);
}

/* Narrows the matmul tensors of unit u from its master weights into dst (same offsets). */
static void narrow_unit(dt_model *m, int u, uint16_t *dst) {
    const dt_params *ps = dt_model_weights(m);
    const float *src = ps->unit_params[u];
    size_t off[DT_MODEL_MAX_TENSORS], len[DT_MODEL_MAX_TENSORS];
    int n = dt_params_matmul_runs(ps, u, off, len, DT_MODEL_MAX_TENSORS);
    for (int i = 0; i < n; i++) dt_to_lowp(m->opts.compute, dst + off[i], src + off[i], len[i]);
}

const uint16_t *dt_model_lp_unit(dt_model *m, int u) {
    DT_ASSERT(m->opts.compute != DT_F32);
    /* Gathered in 16 bits by the strategy: valid until its next need_params of another unit,
     * and cleared when its window is reused, so this is never a stale copy. */
    const dt_params *ps = dt_model_weights(m);
    if (ps->unit_params_lp[u]) return ps->unit_params_lp[u];
    DT_ASSERT(m->lp_win[0] != NULL); /* no windows: the strategy provides every unit */
    if (m->lp_head) { /* the fused loss reads every chunk of the head per row block */
        const dt_tensor_info *t = &ps->tensors[m->head_id];
        int K = dt_params_chunks(ps, m->head_id);
        if (u >= t->unit && u < t->unit + K) {
            if (m->lp_head_epoch != m->epoch) {
                for (int c = 0; c < K; c++)
                    narrow_unit(m, t->unit + c, m->lp_head + (ps->unit_params[t->unit + c] - ps->unit_params[t->unit]));
                m->lp_head_epoch = m->epoch;
            }
            return m->lp_head + (ps->unit_params[u] - ps->unit_params[t->unit]);
        }
    }
    for (int w = 0; w < 2; w++)
        if (m->lp_unit[w] == u && m->lp_epoch[w] == m->epoch) {
            m->lp_last = w;
            return m->lp_win[w];
        }
    int w = m->lp_last ^ 1; /* keep the window read last: the previous unit may still be used */
    narrow_unit(m, u, m->lp_win[w]);
    m->lp_unit[w] = u;
    m->lp_epoch[w] = m->epoch;
    m->lp_last = w;
    return m->lp_win[w];
}

const uint16_t *dt_model_lp_tensor(dt_model *m, int id, int layer) {
    size_t off;
    const dt_params *ps = dt_model_weights(m);
    int u = dt_params_unit_of(ps, id, m->chunk_l0 + layer, &off); /* the current chunk's (family_impl.h) */
    DT_ASSERT(ps->tensors[id].matmul);
    return dt_model_lp_unit(m, u) + off;
}

void dt_model_backward(dt_model *m, float scale) { m->fam->backward(m, scale); }

const float *dt_model_logits(const dt_model *m) {
    return m->opts.fused_loss && m->head_id >= 0 ? NULL : m->fam->logits(m);
}

int dt_model_correct(const dt_model *m) { return m->fam->correct ? m->fam->correct(m) : -1; }

dt_status dt_model_refuse_vision(dt_ctx *ctx, const dt_model_config *c, const char *family) {
    const char *key = c->image_size ? "model.image_size" : c->patch_size ? "model.patch_size"
                      : c->channels ? "model.channels" : c->n_classes ? "model.n_classes" : NULL;
    if (key) return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s is a language model (the key is vit's)", key, family);
    return DT_OK;
}

dt_status dt_model_refuse_experts(dt_ctx *ctx, const dt_model_config *c, const char *family) {
    const char *key = c->n_experts ? "model.n_experts" : c->experts_topk ? "model.experts_topk"
                      : c->expert_d_ff ? "model.expert_d_ff" : NULL;
    if (key) return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s has no experts (mixture of experts is llama's)", key, family);
    return DT_OK;
}

dt_status dt_model_check_tokens(dt_ctx *ctx, const int32_t *inputs, const int32_t *targets, int n,
                                int V) {
    for (int i = 0; i < n; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return dt_fail(ctx, DT_ERR_FORMAT, "input token %d at position %d is outside [0, %d)",
                           inputs[i], i, V);
        if (targets && (targets[i] < -1 || targets[i] >= V))
            return dt_fail(ctx, DT_ERR_FORMAT, "target token %d at position %d is outside [0, %d) (or -1: not counted)",
                           targets[i], i, V);
    }
    return DT_OK;
}

float dt_model_mean_loss(const float *losses, const int32_t *targets, int n) {
    double sum = 0.0;
    int counted = 0;
    for (int i = 0; i < n; i++) {
        sum += losses[i]; /* a row that is not counted holds 0 */
        counted += !targets || targets[i] >= 0;
    }
    return counted ? (float)(sum / counted) : 0.0f;
}

int dt_count_targets(const int32_t *targets, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += targets[i] >= 0;
    return c;
}
