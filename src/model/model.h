/* model.h - the model interface: what parallel/, optim/, ckpt/, train/, bench/ and report/
 * see of a model, whatever its family.
 *
 * A family (src/model/<family>/) provides a dt_model_family: its presets, config checks, its
 * parameter table (params.h), activation sizing, forward and backward with unit hooks, FLOPs
 * per token and the external (Hugging Face) description. Everything else works on dt_model:
 * the parameter store `ps`, the hooks, and the wrappers below.
 *
 *   dt_model_config cfg; DT_CHECK(dt_model_preset(ctx, "gpt2", &cfg));
 *   dt_model m; DT_CHECK(dt_model_init(ctx, &m, &cfg, &alloc, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS));
 *   dt_model_init_weights(&m, seed);
 *   dt_params_zero_grad(&m.ps);
 *   DT_CHECK(dt_model_forward(ctx, &m, inputs, targets, &loss));
 *   dt_model_backward(&m, 1.0f);
 *   dt_model_free(&m);
 */
#ifndef DT_MODEL_H
#define DT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "model/cp.h"
#include "model/params.h"

/* One config for every family; a family uses the fields it needs and refuses the others
 * (0 = unset). */
typedef struct dt_model_config {
    char family[16];  /* "gpt2", "llama", "vit" ("" = gpt2) */
    int n_layer;
    int d_model;
    int n_head;
    int n_kv_head;    /* key/value heads (grouped-query attention); gpt2: = n_head */
    int d_ff;         /* MLP width; gpt2: 4 d_model */
    int vocab;        /* real vocabulary size */
    int vocab_padded; /* vocab rounded up to a multiple of 128 (derived) */
    int context;      /* maximum sequence length */
    int untied;       /* 1: the lm_head has its own weights (llama); gpt2: tied (0) */
    float rope_theta; /* rotary base (llama) */
    float norm_eps;   /* epsilon of the norms */
    int image_size;   /* vit: square images of image_size^2 pixels per channel */
    int patch_size;   /* vit: square patches (must divide image_size) */
    int channels;     /* vit: colour planes (1 = grey) */
    int n_classes;    /* vit: classification head width */
    /* RoPE scaling (llama; model/rope.h): the rule (dt_rope_scaling) and its parameters, 0 =
     * unset (what the rule does not use must stay 0). */
    int rope_scaling;            /* DT_ROPE_NONE, _LINEAR, _LLAMA3, _YARN */
    float rope_factor;           /* linear, llama3, yarn: the context extension factor */
    float rope_low_freq_factor;  /* llama3 */
    float rope_high_freq_factor; /* llama3 */
    int rope_original_context;   /* llama3, yarn: the context before scaling */
    float rope_beta_fast;        /* yarn (0 = 32) */
    float rope_beta_slow;        /* yarn (0 = 1) */
    float rope_attention_factor; /* yarn: cos/sin scale (0 = 0.1 ln(factor) + 1) */
    /* Mixture of experts (llama; model/llama/moe.h): 0 = a dense MLP. */
    int n_experts;    /* experts per layer (<= DT_MOE_MAX_EXPERTS) */
    int experts_topk; /* experts each token is routed to */
    int expert_d_ff;  /* each expert's SwiGLU width (then d_ff is 0) */
} dt_model_config;
/* Experts per layer at most (the parameter table has DT_MODEL_MAX_TENSORS rows). */
#define DT_MOE_MAX_EXPERTS 16

/* The config fields by name (model files, keys, shape checks): "n_layer", ... */
typedef enum dt_cfg_type { DT_CFG_INT, DT_CFG_FLOAT } dt_cfg_type;
typedef struct dt_cfg_field {
    const char *name; /* in model files */
    const char *key;  /* the config key ("model.vocab_size") */
    dt_cfg_type type;
    size_t offset;
    const char *help;
    /* (optional) an int field named by these words (NULL-ended; value = index): model files
     * hold the word */
    const char *const *names;
    /* model files hold it only when not 0, and a file without it reads 0 (fields added after
     * files existed: older files stay loadable, plain models' files unchanged) */
    int optional;
} dt_cfg_field;
extern const dt_cfg_field dt_model_cfg_fields[];
extern const int dt_model_cfg_nfields;
/* Field value as a double (ints exact). */
double dt_model_cfg_get(const dt_model_config *c, const dt_cfg_field *f);
void dt_model_cfg_set(dt_model_config *c, const dt_cfg_field *f, double v);

/* Per-unit callbacks for the parallel strategies (units: params.h); any member may be NULL.
 * A family announces every unit it reads or writes (a layer is several units, params.h:
 * announced in increasing order in the forward and a recompute, decreasing in the backward):
 *   need_params(u, next, flags)
 *                         before reading unit u's parameters (forward or backward); `next` is
 *                         the unit whose parameters it reads after u (-1: none or unknown),
 *                         so ZeRO-3 can gather it meanwhile. unit_params[u] (and
 *                         unit_params_lp[u]) stay valid only until the next need_params of
 *                         another unit. Under mixed precision the strategy may provide u's
 *                         `matmul` tensors only as their 16-bit copies, in unit_params_lp[u]
 *                         (then their part of unit_params[u] is undefined), unless flags has
 *                         DT_NEED_F32: u's matmul tensors are read in fp32 too (an embedding
 *                         lookup); DT_NEED_NEXT_F32 says the same of `next`.
 *   grads_begin(u)        before writing unit u's gradients (ZeRO-2/3 point them at a
 *                         zeroed window), and grads_end(u) once they are final for the
 *                         micro-step. Begin/end pairs do not nest, and a backward ends the
 *                         units in strictly decreasing order (every family's order), so DDP
 *                         launches a bucket once the lowest unit it touches has ended.
 *   lookup(id, tokens, N, next, out)
 *                         an embedding lookup of vocabulary tensor id by tokens[0..N): the
 *                         strategy may do it itself, writing row i of out (N x cols) = the
 *                         tensor's row tokens[i] (untouched when outside the tensor), and
 *                         start gathering `next` meanwhile; it returns 1 then, 0 to let the
 *                         family ask for the chunks with need_params. */
#define DT_NEED_F32 1
#define DT_NEED_NEXT_F32 2
typedef struct dt_model_hooks {
    void *ud;
    void (*need_params)(void *ud, int unit, int next, int flags);
    void (*grads_begin)(void *ud, int unit);
    void (*grads_end)(void *ud, int unit);
    int (*lookup)(void *ud, int id, const int32_t *tokens, int N, int next, float *out);
} dt_model_hooks;

/* Activation checkpointing (memory.activation_checkpointing): which saved activations of a
 * layer are dropped after its forward and recomputed in its backward, from the layer's input
 * (kept: the previous layer's output) and, for selective, what it keeps. A llama mixture of
 * experts (model/llama/moe.h) keeps its MoE state under selective and forms it again under full.
 *   none       keep everything;
 *   selective  in fp32, keep the MLP's input projection output and one of the attention's
 *              two matmul outputs (gpt2, vit: q|k|v; llama: the attention block's output),
 *              and the layer output; recompute the norms, the attention, the other
 *              attention matmul and the MLP activation (Megatron's selective recompute, plus
 *              one d_model-input matmul: ARCHITECTURE decision 37). Under bf16/fp16 (decision
 *              52) gpt2 and vit keep the attention output, its log-sum-exp and the attention
 *              block's output, and gpt2 q|k|v (recomputing the norms, the MLP's input
 *              projection and activation), vit the MLP's input projection output
 *              (recomputing the norms, q|k|v and the MLP activation): no attention is
 *              recomputed; llama keeps gate|up alone and recomputes the rest but the down
 *              projection;
 *   full       keep only the layer output; recompute the whole layer but its last matmul.
 * Recomputed layers are those with l % recompute_every == 0. The recompute runs the same
 * kernels on the same inputs, so gradients are bitwise those of `none`. */
typedef enum dt_recompute { DT_RECOMPUTE_NONE, DT_RECOMPUTE_SELECTIVE, DT_RECOMPUTE_FULL } dt_recompute;
/* Mixed precision (training.precision): compute = DT_BF16 or DT_F16 runs every matmul on
 * 16-bit operands with fp32 results: the weights flagged `matmul` (params.h) are narrowed
 * from the fp32 master weights unit by unit when first read after a forward starts (or come
 * narrowed from the strategy: ZeRO-3 gathers them in 16 bits, unit_params_lp); the
 * activations that only feed matmuls are stored in 16 bits (family_impl.h says which);
 * activation gradients are narrowed for their GEMMs. Norms, attention, softmax, the loss and
 * all parameter gradients stay fp32. compute = DT_F32: everything fp32. */
/* The fused loss (fused_loss = 1; language models): the lm_head and the cross-entropy run
 * block by block of head_rows token rows, so only one block's logits exist at a time instead
 * of the micro-batch's (B T x vocabulary floats, a quarter of gpt2's activations at 4 x 256).
 * A training forward (dt_model_forward_train) then forms the head's gradients at once (dx,
 * and dW added into the gradient slab); after a plain forward the backward recomputes them.
 * It needs the gradients in place for the whole micro-step (a DT_SLAB_GRADS model: DDP,
 * ZeRO-1). Both paths run the same kernel calls per (row block, vocabulary chunk), so the
 * fused and the stored loss give the same bits, and so do ZeRO-2/3, which store the logits. */
#define DT_HEAD_ROWS 256
/* LoRA (lora.* keys; model/lora.h; ARCHITECTURE decision 49): rank 0 = off. Targets are bits
 * of dt_lora_target (q, k, v, o, gate, up, down). */
typedef struct dt_lora_cfg {
    int rank;         /* 0: off */
    float alpha;      /* scale s = alpha / rank (0 reads as rank: s = 1) */
    float dropout;    /* p in [0, 1): dropout on the adapters' input in training forwards (lora.h) */
    unsigned targets; /* 1 << dt_lora_target */
    int nf4;          /* QLoRA: the base's layer matmul weights stored as NF4 */
    int base_external; /* the base is loaded after init (model.init_from): not drawn from the seed */
} dt_lora_cfg;
typedef struct dt_model_opts {
    dt_recompute recompute;
    int recompute_every; /* >= 1 (0 reads as 1) */
    dt_dtype compute;    /* DT_F32, DT_BF16, DT_F16 */
    int fused_loss;      /* 1: the fused loss above */
    int head_rows;       /* rows per block of the head and loss (0: DT_HEAD_ROWS) */
    dt_lora_cfg lora;    /* LoRA adapters (rank 0: none) */
    /* Tensor parallelism (parallel.tp; ARCHITECTURE decision 62): every tensor the family
     * marks split (params.h, the split column) is cut into tp shards; this process holds and
     * computes tp_local of them from shard tp_first: one (a rank of a TP group: tp_first is
     * its TP rank; the group's sums come through dt_model.tp_ops) or all tp (the blocks test
     * mode, parallel.tp_blocks: one process runs exactly the arithmetic of tp ranks, each
     * shard's GEMMs on its own and the shards' partial sums added in shard order, so a tp = 2
     * run on 2 ranks gives bitwise its results). 0 or 1: none. */
    int tp, tp_local, tp_first;
    /* Sequence parallelism (parallel.sequence_parallel; tp > 1): the residual stream, the norms
     * and their saved activations hold this process's token rows only (rows [tp_first N / tp,
     * ...) of the micro-batch's N, as many shards of them as it holds); gathered before each
     * column-parallel GEMM, reduce-scattered after each row-parallel one (family_impl.h). */
    int sp;
    /* Pipeline parallelism (parallel.pp; ARCHITECTURE decision 74): this process is the stage
     * holding layers [pp_l0, pp_l1) of the model's n_layer (pp_l1 = 0: every layer, no
     * pipeline). Its store lays out those layers (their checkpoint names and initial values
     * are the whole model's layers pp_l0...), the PRE tensors (embeddings) only on the first
     * stage and the POST tensors (final norm, head) only on the last. A stage that is not the
     * first takes its input activation from the previous stage (dt_model_stage_buf
     * DT_STAGE_IN) instead of embedding tokens; one that is not the last leaves its output
     * activation for the next (DT_STAGE_OUT) and starts its backward from that output's
     * gradient (DT_STAGE_DOUT), leaving its input's (DT_STAGE_DIN) for the previous one. */
    int pp_l0, pp_l1;
    /* An interleaved stage (parallel.pp_schedule=interleaved) holds pp_v > 1 chunks of
     * pp_l1 - pp_l0 layers each, chunk c starting pp_stride layers after chunk c - 1; [pp_l0,
     * pp_l1) is then the current chunk pp_c's range (dt_model_set_chunk), the store holds all of
     * them (params.h lchunk, lstride) and the family runs the current one. 0: one range. */
    int pp_v, pp_stride, pp_c;
    /* Context parallelism (parallel.cp; ARCHITECTURE decision 83): this process holds chunks
     * cp_rank and 2 cp - 1 - cp_rank of every sequence's 2 cp chunks (the model's T is their
     * rows, the sequence's T / cp; model/cp.h), positions are global and the attention runs
     * around the CP ring (dt_model.cp_ring). 0 or 1: none. */
    int cp, cp_rank;
    int cp_all_gather; /* parallel.cp_comm=all_gather: the blocks gathered at once (model/cp.h) */
    /* Expert parallelism (parallel.ep; ARCHITECTURE decision 85): the ep ranks of an EP group
     * split each layer's n_experts experts, E / ep consecutive ones each; this process holds
     * experts [ep_rank E / ep, (ep_rank + 1) E / ep) (the store lays out only theirs: the others
     * are absent, params.h) and computes every source rank's rows of them, the rows travelling
     * through dt_model.ep_ops (model/llama/moe.h). 0 or 1: none. */
    int ep, ep_rank;
} dt_model_opts;

/* A pipeline stage's table (o->pp_l1 > 0): the PRE tensors of a stage that is not the first
 * and the POST tensors of one that is not the last lose their rows (params.h
 * dt_tensor_absent), but for a head tied to the embedding, of which the last stage holds a
 * copy (dt_model.tied_h; decision 74). Refuses, naming the key, a layer range outside the
 * model. Nothing happens without a pipeline. */
dt_status dt_model_stage_table(dt_ctx *ctx, const dt_model_config *c, const dt_model_opts *o, dt_tensor_info *table,
                               int n);
/* The embedding a family's lm_head is tied to (a PRE vocabulary matmul tensor), or -1. */
int dt_model_tied_head(const dt_tensor_info *table, int n);
/* The chunks an interleaved stage holds (1 otherwise), the layers its store holds, and where its
 * first chunk starts. */
static inline int dt_stage_chunks(const dt_model_opts *o) { return o && o->pp_l1 > 0 && o->pp_v > 1 ? o->pp_v : 1; }
static inline int dt_store_g0(const dt_model_opts *o) {
    return o && o->pp_l1 > 0 ? o->pp_l0 - (dt_stage_chunks(o) > 1 ? o->pp_c * o->pp_stride : 0) : 0;
}
/* Whether the store holds the model's first layer (its embedding) / last layer (its head). */
static inline int dt_store_first(const dt_model_opts *o) { return !o || o->pp_l1 <= 0 || dt_store_g0(o) == 0; }
static inline int dt_store_last(const dt_model_config *c, const dt_model_opts *o) {
    if (!o || o->pp_l1 <= 0) return 1;
    return dt_store_g0(o) + (dt_stage_chunks(o) - 1) * o->pp_stride + (o->pp_l1 - o->pp_l0) == c->n_layer;
}
/* The layers a stage holds (every layer without pipeline parallelism; an interleaved stage:
 * its current chunk's), and whether it is the first / last stage (it embeds / runs the head
 * and loss; an interleaved stage: whether its current chunk is). */
static inline int dt_stage_layers(const dt_model_config *c, const dt_model_opts *o) {
    return o && o->pp_l1 > 0 ? o->pp_l1 - o->pp_l0 : c->n_layer;
}
static inline int dt_stage_first(const dt_model_opts *o) { return !o || o->pp_l1 <= 0 || o->pp_l0 == 0; }
static inline int dt_stage_last(const dt_model_config *c, const dt_model_opts *o) {
    return !o || o->pp_l1 <= 0 || o->pp_l1 == c->n_layer;
}
/* A stage's activation buffers crossing to its neighbours (dt_model_stage_buf): each holds
 * dt_model_stage_floats fp32 values (the residual stream of the token rows held). */
typedef enum dt_stage_buf { DT_STAGE_IN, DT_STAGE_OUT, DT_STAGE_DOUT, DT_STAGE_DIN } dt_stage_buf;

/* The shards of tensor parallelism (1, 1, 0 without it). */
static inline int dt_tp_size(const dt_model_opts *o) { return o && o->tp > 1 ? o->tp : 1; }
static inline int dt_tp_local(const dt_model_opts *o) {
    return o && o->tp > 1 ? (o->tp_local > 1 ? o->tp_local : 1) : 1;
}
static inline int dt_tp_first(const dt_model_opts *o) { return o && o->tp > 1 ? o->tp_first : 0; }

/* A TP group's collectives, in place over the group's ranks (installed by the trainer; NULL
 * members: a group of one, or the blocks test mode, which sums its shards itself). Each
 * returns 0, or non-zero after a communication failure (the trainer names it). */
typedef struct dt_model_tp_ops {
    void *ud;
    int (*sum)(void *ud, float *x, size_t n); /* every element summed in rank order */
    int (*max)(void *ud, float *x, size_t n);
    /* sequence parallelism: in place, each rank's n floats at buf + rank n -> all of them */
    int (*allgather)(void *ud, float *buf, size_t n);
    /* sequence parallelism: out (n) = the sum over the group, in rank order, of each rank's
     * in[rank' n ...] block for this rank (in holds size x n) */
    int (*reduce_scatter)(void *ud, const float *in, float *out, size_t n);
} dt_model_tp_ops;
/* An EP group's all-to-all (installed by the trainer; expert parallelism, model.h
 * dt_model_opts.ep): rank r's scounts[q] esize-byte elements at send + sdispls[q] land at rank
 * q's recv + rdispls[r] (comm.h dt_comm_alltoallv). Returns 0, or non-zero after a failure. */
typedef struct dt_model_ep_ops {
    void *ud;
    int (*alltoallv)(void *ud, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                     const size_t *rcounts, const size_t *rdispls, size_t esize);
} dt_model_ep_ops;
/* Rows per block of the lm_head and loss for N token rows under o (NULL: defaults). */
int dt_model_head_rows(const dt_model_opts *o, int N);
/* Rows of logits a language model stores: one block under the fused loss, else N. */
int dt_model_logit_rows(const dt_model_opts *o, int N);
/* "none", "selective", "full". */
const char *dt_recompute_name(dt_recompute r);
/* 1 when layer l drops activations under o (NULL: never). */
int dt_model_recomputes(const dt_model_opts *o, int l);

/* Per-op wall-time accumulators (seconds), for the benchmark's breakdown. */
typedef enum dt_op_kind {
    DT_OP_ENCODER, DT_OP_LAYERNORM, DT_OP_MATMUL, DT_OP_ATTENTION, DT_OP_GELU,
    DT_OP_RESIDUAL, DT_OP_LMHEAD, DT_OP_CROSSENTROPY, DT_OP_RMSNORM, DT_OP_ROPE, DT_OP_SWIGLU,
    DT_OP_NKINDS
} dt_op_kind;
extern const char *const dt_op_kind_names[DT_OP_NKINDS];
typedef struct dt_model_prof {
    double fwd[DT_OP_NKINDS], bwd[DT_OP_NKINDS];
} dt_model_prof;

typedef struct dt_model dt_model;
typedef struct dt_hf_json dt_hf_json; /* model/hf_json.h */

/* The weight-gradient GEMMs a backward deferred (the zero-bubble schedule's input-gradient pass,
 * parallel.pp_schedule=zb-h1; ARCHITECTURE decision 79): each matmul's dout copied into buf,
 * its input (a saved activation of the micro-batch's set) and where its dW and dbias go. */
typedef struct dt_wdefer_item {
    int id, l, unit;     /* the tensor, its store layer, its unit */
    size_t woff;         /* the tensor-parallel shard's offset in the tensor (0: one shard) */
    const float *dout;   /* the dout copy (N rows of OC fp32 at stride ld): in dead activations or buf */
    int ld, col;         /* col: dout's column in its ld-wide rows (a fused projection's tensor) */
    int di;              /* the dout's index in the plan (the GEMMs of one dout share it) */
    const float *x;      /* the input (N x C), in the activation set (fp32) */
    const uint16_t *xh;  /* or its 16-bit copy (mixed precision) */
    const void *gsrc;    /* sequence parallelism: x (or xh) is the rows gathered from this, again at W */
    int bias_unit;       /* the bias gradient: its unit (-1: none) and offset there (a strategy's */
    size_t bias_off;     /* windows move between passes: the unit's pointer is read at W) */
    int N, C, OC;
    /* LoRA (site >= 0): the adapters of site `site` of the base matmul over tensor bid, family
     * layer fl, shard j: their dA and dB (id: the site's A in the adapters' store), with the
     * micro-batch's dropout (lora.h dt_lora_mm_weights); -1: a matmul's dW */
    int site, bid, fl, j;
    int drop_on;
    uint64_t drop_seed, drop_seq0;
} dt_wdefer_item;
/* A part of an activation set that a backward has made dead (dt_model_family defer_spans):
 * n floats at p, dead from the `from`-th deferred dout of its layer on. */
typedef struct dt_act_span {
    float *p;
    size_t n;
    int from;
} dt_act_span;
enum { DT_DEFER_MAX = 16 }; /* douts of one level, spans of one layer, at most */
/* Where the i-th dout a backward defers goes (dt_model_defer_plan): span `span` of layer
 * `layer`'s dead activations (layer -1: the set's fallback buffer buf), at float `off`. */
typedef struct dt_wdefer_place {
    int layer, span;
    size_t off, n;
} dt_wdefer_place;
typedef struct dt_wdefer {
    float *buf;                    /* the fallback: the douts no dead span takes */
    const dt_wdefer_place *place;  /* the plan, shared by the sets: cap_douts entries */
    dt_wdefer_item *items;         /* the GEMMs (a dout's shards and fused tensors: several) */
    int n, cap_items;              /* GEMMs recorded, room (dt_model_defer_gemms) */
    int nd, cap_douts;             /* douts placed, the plan's */
    const void *g_full, *g_loc;    /* sequence parallelism: the last gather (family_impl.h dt_sp_col_input) */
} dt_wdefer;

/* LoRA targets (lora.targets names, in this order) and a family's adaptable sub-projections:
 * rows [row0, row0 + rows) of base tensor `id` (a LAYER matmul weight, out x in). w1, w2, w3
 * are a mixture of experts' experts (Mixtral's names: gate, down, up), one site per expert
 * (ARCHITECTURE decision 90). */
typedef enum dt_lora_target {
    DT_LORA_Q, DT_LORA_K, DT_LORA_V, DT_LORA_O, DT_LORA_GATE, DT_LORA_UP, DT_LORA_DOWN,
    DT_LORA_W1, DT_LORA_W2, DT_LORA_W3, DT_LORA_NTARGETS
} dt_lora_target;
/* The dense targets (q .. down): a dense family's sites, at most one each. */
#define DT_LORA_NDENSE (DT_LORA_DOWN + 1)
static inline int dt_lora_expert_target(int t) { return t >= DT_LORA_W1 && t <= DT_LORA_W3; }
/* Sites of a layer at most: the attention's four and three per expert. */
#define DT_LORA_MAX_SITES (4 + 3 * DT_MOE_MAX_EXPERTS)
typedef struct dt_lora_site {
    dt_lora_target target;
    int id;                     /* base tensor */
    size_t row0, rows;          /* its output rows the adapter writes */
    const char *name_a, *name_b; /* adapter tensor names ("%d" = layer) */
    const char *ext_a, *ext_b;   /* PEFT names, NULL: none */
} dt_lora_site;

/* What a family provides. */
typedef struct dt_model_family {
    const char *name;
    const char *const *presets; /* NULL-terminated */
    /* Fills *out with preset `name` (one of `presets`). */
    void (*preset)(const char *name, dt_model_config *out);
    /* Checks every field the family uses (naming the config key of a bad one), refuses
     * fields it does not use, and derives the rest (vocab_padded, defaults). */
    dt_status (*validate)(dt_ctx *ctx, dt_model_config *c);
    /* Writes the tensor table for c into out (room for DT_MODEL_MAX_TENSORS); returns n. */
    int (*tensors)(const dt_model_config *c, dt_tensor_info *out);
    /* Activation floats for micro-batch B x T under checkpointing opts o (what init
     * allocates). */
    size_t (*act_floats)(const dt_model_config *c, const dt_model_opts *o, int B, int T);
    /* Bytes of the family's private state (views into the activations), and binding it. */
    size_t impl_bytes;
    void (*bind)(dt_model *m);
    dt_status (*forward)(dt_ctx *ctx, dt_model *m, const int32_t *inputs, const int32_t *targets,
                         float *loss);
    void (*backward)(dt_model *m, float scale);
    const float *(*logits)(const dt_model *m);
    /* (optional) Classifiers: images of the last forward whose top-1 class is the target. */
    int (*correct)(const dt_model *m);
    /* Parameters without vocabulary padding. */
    size_t (*num_params)(const dt_model_config *c);
    /* Training FLOPs per token (PaLM convention: 6 N + attention, no causal halving). */
    double (*flops_per_token)(const dt_model_config *c, int T);
    /* Model files: metadata "format" value and the config fields written (NULL-ended). */
    const char *file_format;
    const char *const *file_fields;
    /* (optional) Hugging Face: architectures[0] and model_type of config.json, and the
     * family-specific part of config.json (a JSON object body without braces, ends without a
     * comma). NULL: the family has no HF export. */
    const char *hf_architecture, *hf_model_type;
    int (*hf_config)(const dt_model_config *c, char *buf, size_t n);
    /* (optional) Hugging Face import: the config.json model_type values read as this family
     * (NULL-terminated), and the reader of the family's keys (j: a dt_hf_json of
     * model/hf_json.h) into c, refusing what the family does not compute by key. */
    const char *const *hf_model_types;
    dt_status (*hf_read_config)(dt_ctx *ctx, const dt_hf_json *j, dt_model_config *c);
    /* Samples are images: model.context (pixels per image) and the pixel range are derived,
     * not taken from the language defaults. */
    int images;
    /* Positions are rotary (no table of them): model.context may exceed the preset's. */
    int rotary;
    /* (optional) LoRA: the family's adaptable sub-projections for c, one per target it has
     * (room for DT_LORA_MAX_SITES); returns the number. NULL: LoRA is refused. */
    int (*lora_sites)(const dt_model_config *c, dt_lora_site *out);
    /* (optional) Hugging Face architectures[0] and model_type for c when they depend on it
     * (llama with experts: MixtralForCausalLM, mixtral); NULL: hf_architecture, hf_model_type. */
    void (*hf_identity)(const dt_model_config *c, const char **arch, const char **type);
    /* (optional) Sequence parallelism (model.h dt_model_opts.sp): built for the family */
    int sp;
    /* (optional) Token rows a micro-batch of B samples of T inputs runs through the layers
     * (sequence parallelism splits them); NULL: B T. */
    int (*token_rows)(const dt_model_config *c, int B, int T);
    /* (optional) Tensor parallelism: the family's forward and backward run split tensors
     * shard by shard (model.h dt_model_opts.tp), and tp must divide these config fields
     * (offsets into dt_model_config, 0-ended; each named by its key). NULL: refused. */
    const size_t *tp_divides;
    /* (optional) Pipeline parallelism: the family's forward and backward run a stage
     * (dt_model_opts.pp_l0/pp_l1) and this gives its buffers crossing to the neighbours
     * (dt_model_stage_buf). NULL: refused. */
    float *(*stage_buf)(dt_model *m, dt_stage_buf which);
    /* (optional) Side values a stage hands on with its output and gets back with its output's
     * gradient (dt_model_stage_extra); NULL or 0 floats: none. */
    size_t (*stage_extra_floats)(const dt_model_config *c);
    float *(*stage_extra)(dt_model *m);
    /* (optional) zb-h1's deferred douts placed in dead activations (ARCHITECTURE decision 81;
     * model.c dt_model_defer_plan). defer_douts: the floats of each dout the backward of
     * level l defers, in record order (l in [0, L): layer l; L: the head's, before the
     * layers; -1: the embedding's, after them; at most DT_DEFER_MAX). defer_spans: the parts
     * of layer l's activations (l in [0, L)) that no later backward step and no deferred
     * weight GEMM reads, each dead from its `from`-th dout of layer l on (the layer's count:
     * once its backward ended); p is NULL when m->acts is (the planner). NULL: zb-h1
     * refused. */
    int (*defer_douts)(const dt_model *m, int l, size_t *n);
    int (*defer_spans)(const dt_model *m, int l, dt_act_span *out);
} dt_model_family;

#define DT_MODEL_MAX_TENSORS 128 /* a LoRA adapter store: 2 per site (DT_LORA_MAX_SITES) */

struct dt_model {
    const dt_model_family *fam;
    dt_model_config cfg;
    dt_params ps;
    int B, T; /* activation buffers are sized for micro-batch B of T tokens */
    dt_model_opts opts;
    /* mixed precision: 16-bit copies of the matmul weights of the two units read last (none
     * without a params slab: the strategy provides unit_params_lp) */
    uint16_t *lp_win[2];
    int lp_unit[2];      /* unit held by each window (-1: none) */
    long lp_epoch[2];    /* forward count when it was narrowed */
    long epoch;          /* forwards so far: a new forward may see new master weights */
    int lp_last;         /* the window narrowed or read last */
    uint16_t *lp_scratch; /* family-sized scratch for narrowed activation gradients */
    uint16_t *lp_head;   /* fused loss, several row blocks: 16-bit lm_head (NULL: windows) */
    size_t lp_head_len;  /* its values */
    int head_id;         /* the lm_head's tensor (the last vocabulary matmul tensor; -1: none) */
    long lp_head_epoch;  /* forward count when lp_head was narrowed (-1: never) */
    float *acts;
    size_t n_acts;
    void *impl; /* the family's views (impl_bytes) */
    dt_alloc *alloc;
    dt_model_hooks hooks;
    dt_model_prof prof;
    int profile;     /* accumulate prof timings when non-zero */
    float last_loss; /* mean loss of the last forward with targets */
    int has_targets; /* the last forward kept state for a backward */
    int train_fwd;     /* in dt_model_forward_train */
    float train_scale; /* its scale */
    int head_grads;    /* the last forward formed the head's gradients (fused loss) */
    /* LoRA (model/lora.h): `base` is the family's frozen parameter store (params slab only,
     * never sharded over data-parallel ranks nor communicated; tensor parallelism cuts it like
     * any model: decision 69) and `ps` holds only the adapters. */
    int lora;             /* opts.lora.rank > 0 */
    dt_params base;
    float lora_scale;     /* alpha / rank */
    int n_sites;
    dt_lora_site sites[DT_LORA_MAX_SITES];
    int site_a[DT_LORA_MAX_SITES]; /* adapter tensor of the site's A (B: the next one) */
    float *lora_sink;     /* gradients of the base's non-matmul tensors, discarded */
    size_t lora_sink_len;
    size_t lora_sink_off[DT_MODEL_MAX_TENSORS];
    float *lora_u, *lora_du; /* (B T, rank) x A^T and its gradient (activations) */
    float *lora_mm;       /* QLoRA: (B T, largest NF4 tensor's rows) one GEMM's block (activations) */
    /* tensor parallelism: per site, the contribution of the shards held to the gradient of its
     * replicated adapter (lora.h dt_lora_mm_backward_sh), and one shard's part (activations) */
    float *lora_red, *lora_red_part;
    size_t lora_red_off[DT_LORA_MAX_SITES];
    int lora_open;        /* adapter unit whose gradients are begun (-1: none) */
    struct dt_lora_nf4 *lora_q; /* QLoRA: the base's NF4 tensors (NULL: fp32 base) */
    dt_model_tp_ops tp_ops; /* tensor parallelism's group (model.h dt_model_opts.tp) */
    int tp_failed;          /* a tp_ops call failed (the trainer checks it after each pass) */
    dt_cp_ring cp_ring;     /* context parallelism's ring (model/cp.h; installed by the trainer) */
    int cp_failed;          /* an exchange of the ring failed (the trainer checks it after each pass) */
    dt_model_ep_ops ep_ops; /* expert parallelism's group (dt_model_opts.ep; installed by the trainer) */
    int ep_failed;          /* an ep_ops call failed (the trainer checks it after each pass) */
    /* Expert parallelism: where the backward accumulates each local expert's weight gradient,
     * one segment per source rank of the EP group (set by the trainer before each micro-step's
     * backward): ep x dt_moe_ep_segment floats, segment s holding, per store layer, the local
     * experts' [w1 | w3 | w2] gradients formed from source s's rows (moe.h). */
    float *ep_grads;
    /* LoRA under expert parallelism: while set, the expert adapters' gradients go to this
     * source's segment of ep_grads (lora_seg: its layer's block, whose first float is the store
     * layer's offset lora_seg_off; ARCHITECTURE decision 90) instead of the store. */
    float *lora_seg;
    size_t lora_seg_off;
    long ep_rows_sent;      /* expert rows this rank sent to other ranks of the EP group since init */
    float *tp_scratch;      /* (B T, d_model) a shard's partial sum when several are held (the
                               family binds it; NULL otherwise) */
    float *tp_stat;         /* (2 B T) the vocabulary-parallel cross-entropy's row statistics
                               (tensor parallelism; the language families bind it) */
    /* LoRA dropout (lora.h dt_lora_drop_key): set by the trainer before each training forward;
     * lora_drop_on is set by every forward (dt_model_forward_train with lora.dropout > 0) and
     * holds for its backward (recomputation included). */
    int lora_drop_on;
    uint64_t lora_drop_seed;  /* the run's seed */
    uint64_t lora_drop_seq0;  /* global index of the micro-batch's first sequence */
    /* Mixture of experts, of the last forward with targets (0 for a dense model): the mean
     * cross-entropy, the load-balancing loss and the z-loss before their coefficients
     * (last_loss = ce + aux_coef aux + z_coef z), and the routed choices the capacity dropped. */
    float moe_ce, moe_aux, moe_z;
    long moe_dropped;
    /* Mixture of experts, the expert load (set by the trainer; NULL: not counted): (n_layer,
     * n_experts) counts indexed by the model's layer (a pipeline stage adds to its layers'
     * rows only), to which every forward that is not a recompute adds each layer's router
     * choices per expert, before any capacity drop (moe.h; ARCHITECTURE decision 86). */
    int64_t *moe_load;
    /* Mixture of experts, set after init (0: off; the trainer sets them from its config, which
     * checks them): the coefficients of the load-balancing loss (training.moe_aux_loss_coef)
     * and of the router z-loss (training.moe_z_loss_coef) added to the loss, and the capacity
     * factor (parallel.moe_capacity_factor, 0 = dropless). */
    float moe_aux_coef, moe_z_coef, moe_capacity;
    /* training.moe_aux_loss_type (0: global, Hugging Face Mixtral's loss over all layers' routers
     * pooled; 1: layer, Megatron-Core's loss per layer summed over the layers; moe.h). */
    int moe_aux_layer;
    /* A head tied to the embedding, its two gradients apart (pipeline parallelism, decision 74;
     * set by the trainer, NULL otherwise): the head's weight gradient accumulates over a step's
     * micro-batches in tied_h (the tied tensor's stored elements, zeroed by the trainer at the
     * step's start), not in the tensor's gradient; the embedding's goes there as always, and in
     * the backward with tied_add set (the step's last) each chunk's tied_h is added to it after
     * the embedding's scatter. The last stage of a pipeline only accumulates tied_h (its copy of
     * the tensor gets no gradient); the first only adds the tied_h it received; one process
     * (parallel.pp_blocks) does both: the same sums in the same order. */
    float *tied_h;
    int tied_add;
    /* An interleaved stage (model.h dt_model_opts.pp_v): the store's first layer of the current
     * chunk (0 otherwise); the families run layers chunk_l0 + l (family_impl.h dt_fam_layer). */
    int chunk_l0;
    /* Set around a backward (zb-h1's input-gradient pass): the matmuls' weight and bias
     * gradients are not formed but recorded here (mixed.c), for dt_model_weight_pass. NULL: a
     * whole backward. Every tensor-parallel shard's, LoRA's adapters', the experts' (ARCHITECTURE
     * decision 84); a layer that recomputes its forward forms its own in the backward. */
    dt_wdefer *wdefer;
};

/* The store the family's forward and backward read weights from: the frozen base under
 * LoRA, else ps. */
static inline dt_params *dt_model_weights(const dt_model *m) {
    return (dt_params *)(m->lora ? &m->base : &m->ps);
}

/* ---- families and configs */

/* The family named c->family ("" = gpt2); NULL if unknown. */
const dt_model_family *dt_model_family_of(const dt_model_config *c);
const dt_model_family *dt_model_family_find(const char *name);
/* Every family, NULL-terminated. */
extern const dt_model_family *const dt_model_families[];
/* Preset by name, from any family; unknown names are refused listing every preset. */
dt_status dt_model_preset(dt_ctx *ctx, const char *name, dt_model_config *out);
/* "gpt2-tiny, bench-small, ..., llama-tiny, ..." */
const char *dt_model_preset_list(void);
/* Checks the family name and the family's rules. */
dt_status dt_model_config_validate(dt_ctx *ctx, dt_model_config *c);
/* Parameters (no padding), FLOPs per token, activation floats: by config, for planning. */
size_t dt_model_num_params(const dt_model_config *c);
double dt_model_flops_per_token(const dt_model_config *c, int T);
size_t dt_model_act_floats(const dt_model_config *c, int B, int T);
/* The same under activation checkpointing opts o (NULL: none). */
size_t dt_model_act_floats_opts(const dt_model_config *c, const dt_model_opts *o, int B, int T);
/* The family's tensor table for c (room for DT_MODEL_MAX_TENSORS rows; file_rows filled in,
 * offsets not); returns the number of rows. */
int dt_model_tensors(const dt_model_config *c, dt_tensor_info *out);
/* The table as model m's store lays it out under tensor parallelism (opts o, NULL: none):
 * dt_model_tensors, then each split tensor cut to the shards o holds (params.h). */
int dt_model_tensors_tp(const dt_model_config *c, const dt_model_opts *o, dt_tensor_info *out);
/* Whether config c can run under tensor parallelism of opts o (tp > 1): the family has it, and
 * tp divides its heads, key/value heads and MLP width; one line naming the keys when not. */
dt_status dt_model_tp_check(dt_ctx *ctx, const dt_model_config *c, const dt_model_opts *o);
/* The padded vocabulary under tensor parallelism degree tp: a multiple of 128 tp (every
 * shard a multiple of 128 rows); c->vocab_padded without it. */
int dt_model_vocab_padded(const dt_model_config *c, const dt_model_opts *o);

/* "gpt2: 2 layers, d_model 64, 4 heads, vocab 256 (padded 256), context 64" */
void dt_model_describe(const dt_model_config *c, char *buf, size_t n);
/* 1 when a and b describe the same model (every field). */
int dt_model_config_equal(const dt_model_config *a, const dt_model_config *b);

/* ---- one model */

/* Bytes dt_model_init_opts allocates for mixed precision with `slabs` and micro-batch B x T,
 * by kind: the two weight windows, and under the fused loss with more than one row block a
 * 16-bit copy of the whole lm_head (every block reads every vocabulary chunk). */
void dt_model_lowp_plan(const dt_params *ps, const dt_model_opts *o, int slabs, int B, int T,
                        size_t bytes[DT_MEM_NKINDS]);
/* The 16-bit copy of tensor id of layer l (a `matmul` tensor; its unit announced with
 * need_params since the forward began, without DT_NEED_F32): unit_params_lp[u] when the
 * strategy provided it, else narrowed from the master weights on first use into one of the
 * model's two windows (a model without a params slab has none: its strategy must provide
 * every such unit). */
const uint16_t *dt_model_lp_tensor(dt_model *m, int id, int layer);
/* The same for a whole unit (a vocabulary chunk). */
const uint16_t *dt_model_lp_unit(dt_model *m, int unit);

/* Validates cfg, builds the store (allocating the slabs in `slabs`) and the activations.
 * Mixed precision without DT_SLAB_PARAMS (ZeRO-3): the parameters come from the strategy,
 * the 16-bit matmul tensors too (unit_params_lp), so no 16-bit windows are allocated. */
dt_status dt_model_init(dt_ctx *ctx, dt_model *m, const dt_model_config *cfg, dt_alloc *alloc,
                        int B, int T, int slabs);
/* The same with activation checkpointing opts (NULL: none); a bad recompute_every is refused
 * naming memory.activation_checkpointing_every. */
dt_status dt_model_init_opts(dt_ctx *ctx, dt_model *m, const dt_model_config *cfg,
                             const dt_model_opts *opts, dt_alloc *alloc, int B, int T, int slabs);
void dt_model_free(dt_model *m);
/* Pipeline parallelism (dt_model_opts.pp_l0/pp_l1): a stage's buffer crossing to a
 * neighbour (dt_stage_buf), dt_model_stage_floats fp32 values each. DT_STAGE_IN is written
 * before a forward of a stage that is not the first, DT_STAGE_OUT read after the forward of
 * one that is not the last; DT_STAGE_DOUT is written before the backward of a stage that is
 * not the last, DT_STAGE_DIN read after the backward of one that is not the first. The
 * pointers follow the activations in use (dt_model_use_acts). */
float *dt_model_stage_buf(dt_model *m, dt_stage_buf which);
/* An interleaved stage: makes chunk c the current one (its range in opts, its layers the
 * family's), rebinding the activation views (the first and last chunks lay out the embedding's
 * and the head's buffers). */
void dt_model_set_chunk(dt_model *m, int c);
/* zb-h1's weight-gradient pass: the GEMMs d recorded, in their order, each unit's between its
 * gradient hooks (every unit the backward ended that has a matmul ends again, descending);
 * the same kernel calls, so the gradients are the whole backward's bits. Empties d. */
void dt_model_weight_pass(dt_model *m, dt_wdefer *d);
/* zb-h1's placement of the douts one backward of m defers (ARCHITECTURE decision 81), the same
 * rule for the planner (m->acts NULL: m needs cfg, opts, fam, B and T only) and the pipeline:
 * walking the backward's levels in order (the head's douts, layers L-1 down to 0, the
 * embedding's), each dout goes first-fit into the spans dead by then (defer_spans: a layer's
 * as its backward frees them, each span filled from its start, 16-float aligned), else into
 * the fallback. Fills out (NULL: count only) with *items entries, in record order; returns the
 * fallback's floats. */
size_t dt_model_defer_plan(const dt_model *m, dt_wdefer_place *out, int *items);
/* The GEMM records a backward of m defers for `douts` douts, at most: one per dout, or each
 * tensor-parallel shard's of each tensor of a fused projection (q|k|v: 3). */
int dt_model_defer_gemms(const dt_model *m, int douts);
size_t dt_model_stage_floats(const dt_model *m);
/* A stage's side values (a mixture of experts: the micro-batch's router totals, moe.h), in the
 * activations in use: dt_model_stage_extra_floats of them (0: none). They are written before a
 * forward of a stage that is not the first (the previous stage's, after its forward) and
 * handed on after it; written before the backward of a stage that is not the last (the next
 * stage's, after its backward) and handed back after it. */
size_t dt_model_stage_extra_floats(const dt_model_config *c);
float *dt_model_stage_extra(dt_model *m);
/* Points the model's activation views at `acts` (m->n_acts floats, laid out as the model's own):
 * a pipeline stage keeps one set per micro-batch in flight and switches between them. */
void dt_model_use_acts(dt_model *m, float *acts);
/* The family's initialisation, from the counter RNG (whole params slab). */
void dt_model_init_weights(dt_model *m, uint64_t seed);
/* LoRA: the frozen base's initial weights from seed (also quantized under NF4); the adapters
 * are ps (dt_model_init_weights does both). Nothing without LoRA. */
void dt_model_init_base(dt_model *m, uint64_t seed);
/* Forward of a (m->B, m->T) batch; token ids are checked against the vocabulary. With
 * targets, *loss = mean loss and the state for backward is kept; without, logits only. */
dt_status dt_model_forward(dt_ctx *ctx, dt_model *m, const int32_t *inputs, const int32_t *targets,
                           float *loss);
/* A forward followed by dt_model_backward(m, scale) with the same scale: under the fused loss
 * it forms the lm_head's gradients already (the gradient slab must be ready for this
 * micro-step: a strategy's begin_micro comes first); otherwise dt_model_forward. */
dt_status dt_model_forward_train(dt_ctx *ctx, dt_model *m, const int32_t *inputs, const int32_t *targets,
                                 float scale, float *loss);
/* Accumulates parameter gradients of loss * scale (scale = 1/accumulation steps). */
void dt_model_backward(dt_model *m, float scale);
/* Logits (B,T,vocab_padded) of the last forward (classifiers: (B,n_classes)); after backward
 * they hold dlogits (fp32 precision only). NULL under the fused loss (never all stored). */
const float *dt_model_logits(const dt_model *m);
/* Classifiers (cfg.n_classes > 0): samples of the last forward with targets whose top-1
 * prediction is right; -1 for language models. */
int dt_model_correct(const dt_model *m);
/* Targets that count (>= 0; a negative target is masked out of the loss). */
int dt_count_targets(const int32_t *targets, int n);

#endif
