/* lora.h - LoRA adapters on a frozen base (Hu et al. 2021; ARCHITECTURE decision 49).
 *
 * A LoRA model (dt_model_opts.lora.rank > 0) has two parameter stores: `base`, the family's
 * own table, frozen (a params slab only: no gradients, no optimizer state, never sharded over
 * data-parallel ranks nor communicated; under tensor parallelism cut into its shards like any
 * model's, decision 69), and `ps`, the adapters: per layer and targeted sub-projection W (rows
 * [row0, row0 + rows) of a base matmul weight, out x in) a pair lora_A (rank x in, normal with
 * standard deviation 1/sqrt(in)) and lora_B (rows x rank, zeros). Every strategy, the optimizer and checkpoints
 * see only `ps`. The adapted linear layer computes
 *     y = x W^T + s (x A^T) B^T,   s = alpha / rank,
 * and its backward dx = dy W + s (dy B) A, dB += s dy^T (x A^T), dA += (s dy B)^T x; x A^T is
 * recomputed in the backward (one (B T, rank) scratch and its gradient, in the activations).
 * The adapter arithmetic is fp32 in every precision (16-bit inputs are widened exactly).
 * With lora.dropout p > 0 a training forward's adapters see drop(x) = x * mask / (1 - p)
 * instead of x (as PEFT; the base matmul sees x): the mask bit of an element is a pure
 * function (dt_lora_drop_keep) of the seed, the global sequence index of its row, its
 * position, layer, site and feature, so the backward (dA += (s dy B)^T drop(x), dx += mask /
 * (1 - p) * s (dy B) A) and any recomputation regenerate it, whatever the ranks or threads.
 *
 *   unsigned t; DT_CHECK(dt_lora_parse_targets(ctx, "q,v", &t));
 *   opts.lora = (dt_lora_cfg){.rank = 8, .alpha = 16, .targets = t};
 *   DT_CHECK(dt_model_init_opts(ctx, &m, &cfg, &opts, &alloc, B, T, slabs)); // m.base + m.ps
 */
#ifndef DT_LORA_H
#define DT_LORA_H

#include "model/model.h"

/* "q", "k", "v", "o", "gate", "up", "down", "w1", "w2", "w3" (NULL beyond). A mixture of
 * experts (model.n_experts > 0; ARCHITECTURE decision 90) takes w1, w2, w3 - every expert's
 * gate, down and up projection, each expert its own adapter pair (PEFT's Mixtral module names)
 * - instead of gate, up, down; its router stays frozen. Under expert parallelism an expert's
 * adapters live with the expert on its owner (the rest of the EP group's stores hold no rows
 * of them) and their gradients travel as the experts' do (model.h dt_model.ep_grads). */
const char *dt_lora_target_name(int t);
/* A comma list of target names into bits; an unknown or empty one is refused naming
 * lora.targets. */
dt_status dt_lora_parse_targets(dt_ctx *ctx, const char *list, unsigned *out);
/* "q,k,v" of the bits. */
void dt_lora_targets_str(unsigned bits, char *buf, size_t n);
/* Checks lora against the family of c, naming the lora.* key of a bad value. */
dt_status dt_lora_validate(dt_ctx *ctx, const dt_model_config *c, const dt_lora_cfg *lora);
/* Under tensor parallelism (o->tp > 1; ARCHITECTURE decision 69) every adapter is cut like its
 * base (Megatron): a column-parallel base (split OUT) has A replicated and B split by output
 * rows, a row-parallel one (split IN) A split by input columns and B replicated; the NF4 base
 * is quantized shard by shard, so every shard's slice must be whole NF4 blocks of the unsplit
 * tensor (refused naming the keys otherwise). One line naming the key when c and o cannot. */
dt_status dt_lora_tp_check(dt_ctx *ctx, const dt_model_config *c, const dt_model_opts *o);
/* The base store's layout (table from the family, cut to o's shards; under NF4 the quantized
 * tensors take no room in it) and the adapter store (o's shards), both with `slabs`
 * (dt_params_init); o->lora is the LoRA configuration. */
dt_status dt_lora_base_init(dt_ctx *ctx, dt_params *base, const dt_model_config *c, const dt_model_opts *o,
                            dt_alloc *alloc, int slabs);
dt_status dt_lora_adapters_init(dt_ctx *ctx, dt_params *ps, const dt_model_config *c, const dt_model_opts *o,
                                dt_alloc *alloc, int slabs);
/* Floats of one expert's adapters in one layer (0: no expert targets, or a dense model). */
size_t dt_lora_expert_floats(const dt_model_config *c, const dt_lora_cfg *lora);
/* Trainable adapter parameters of c (what ps holds without tensor parallelism). */
size_t dt_lora_num_params(const dt_model_config *c, const dt_lora_cfg *lora);
/* Training FLOPs per token of a LoRA run (6 N + attention without LoRA, model.h): the frozen
 * base's matmuls run forward and dinp only (4 N instead of 6 N: no weight gradients), the
 * adapters 6 per trainable parameter, the attention as before. Without LoRA: the model's. */
double dt_lora_flops_per_token(const dt_model_config *c, const dt_lora_cfg *lora, int T);
/* Activation floats the adapters add for micro-batch B x T under o (0 without LoRA). */
size_t dt_lora_act_floats(const dt_model_config *c, const dt_model_opts *o, int B, int T);
/* Bytes a LoRA model allocates besides its two stores' layouts and the adapters' slabs, by
 * kind: the base's weights (fp32 slab, and NF4 tensors) under params, the gradient sink of
 * the base's non-matmul tensors under other. */
void dt_lora_plan(const dt_model_config *c, const dt_model_opts *o, size_t bytes[DT_MEM_NKINDS]);

/* Model plumbing (model.c): builds m->base and m->ps and the rest (table: the family's). */
dt_status dt_lora_model_init(dt_ctx *ctx, dt_model *m, dt_alloc *alloc, int slabs);
void dt_lora_model_free(dt_model *m);
/* Points the adapters' scratch into the activations at base (dt_lora_act_floats of them). */
void dt_lora_bind(dt_model *m, float *base);
/* Base weights from seed (the family's initialisation; NF4 tensors quantized from it). */
dt_status dt_lora_init_base(dt_ctx *ctx, dt_model *m, uint64_t seed);
/* Quantizes the base's NF4 tensors from full, a flat fp32 copy in the family table's layout
 * (an import); copies the rest into the base slab (tensor parallelism: the shards held). */
dt_status dt_lora_set_base(dt_ctx *ctx, dt_model *m, const float *full);
/* The same for one copy: w is copy l of base tensor id in the family table's (unsplit) shape. */
dt_status dt_lora_set_base_tensor(dt_ctx *ctx, dt_model *m, int id, int l, const float *w);
/* Floats of the family table's flat layout (what dt_lora_set_base reads). */
size_t dt_lora_full_floats(const dt_model *m);
/* XXH3-64 of the base: its fp32 slab, then every NF4 tensor's bytes (a mixture of experts':
 * the hash of its non-expert tensors' and each expert's hash, layout-free, a collective of the
 * EP group under expert parallelism; lora.c moe_hash). Under tensor parallelism
 * the XXH3-64 of the tp shards' hashes in shard order (each over the shard's part of every
 * tensor in store order, then its NF4 tensors), whoever holds them: a TP group's ranks (a
 * collective: it gathers them over m->tp_ops) and the blocks mode agree. */
uint64_t dt_lora_base_hash(dt_model *m);
/* A fingerprint of an fp32 base that does not depend on the layout: the sum (mod 2^64) over
 * every element of the unsplit, unpadded base of a 64-bit mix of (tensor, layer, canonical
 * index, value bits). Each shard adds its elements (a replicated tensor is added by shard 0
 * only) and a TP group's parts are added (a collective over m->tp_ops), so tp = 1, any tp and
 * the blocks mode agree: a checkpoint of one layout resumes in another (decision 69). 0 for an
 * NF4 base, whose shards are quantized per layout. */
uint64_t dt_lora_base_fingerprint(dt_model *m); /* under expert parallelism: the EP group's (a collective) */

/* The adapter unit of base unit u (-1: none, PRE/POST); *first (may be NULL): u is the
 * lowest base unit of its layer (the last one a backward ends). A layer's adapters are one unit
 * but for the experts': each expert's adapters are their own unit, which its base unit maps to
 * (first: it ends them); the other base units map to the layer's dense adapters (-1: none). */
int dt_lora_unit(const dt_model *m, int u, int *first);
/* out (N, OC) += the adapters of the base matmul (id, layer l, OC rows from id's first);
 * x: the layer's input (fp32, or 16-bit under mixed precision). */
void dt_lora_mm_forward(dt_model *m, float *out, const float *xf, const uint16_t *xh, int id, int l, int N,
                        int C, int OC);
/* dinp (N,C) += the adapters' part (NULL: skipped), their dA, dB += (gradient units). */
void dt_lora_mm_backward(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh,
                         int id, int l, int N, int C, int OC);
/* Tensor parallelism: the same for shard j (of those held) of the base matmul, whose output
 * (N, OC) and input (N, C) are that shard's (a row-parallel shard's output is its partial sum:
 * the adapters' partial product is added into it, so the base's reduction sums both). A
 * replicated adapter's gradient formed from sharded activations (A of a column-parallel base,
 * B of a row-parallel one) is a contribution per shard: summed in shard order, then over the TP
 * group (m->tp_ops) after the last shard held, then added to the gradient. */
void dt_lora_mm_forward_sh(dt_model *m, float *out, const float *xf, const uint16_t *xh, int id, int l, int j,
                           int N, int C, int OC);
void dt_lora_mm_backward_sh(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh,
                            int id, int l, int j, int N, int C, int OC);
/* Rows of one stored shard of base tensor id (its rows without tensor parallelism), NF4 or not. */
size_t dt_lora_shard_rows(const dt_model *m, int id);
/* Dropout: the key of one row's mask (seed, global sequence index seq, position t, layer l,
 * site i of m->sites) and whether feature c of that row is kept under probability p (drop
 * with probability p, counter-based: no state). */
uint64_t dt_lora_drop_key(uint64_t seed, uint64_t seq, int t, int l, int site);
int dt_lora_drop_keep(uint64_t key, int c, float p);
/* QLoRA: the NF4 copy of base tensor id of layer l (NULL: the tensor is fp32); under tensor
 * parallelism shard j's (each shard its own NF4 tensor; dt_lora_nf4: shard 0). */
const struct dt_nf4 *dt_lora_nf4(const dt_model *m, int id, int l);
/* The base store's layer holding the model's layer g of tensor id (a pipeline stage's store,
 * model.h pp_l0/pp_l1), or -1: the stage holds neither that layer nor, for a PRE or POST
 * tensor, the tensor. Without a pipeline: g (0 for PRE and POST tensors). */
int dt_lora_base_layer(const dt_model *m, int id, int g);
const struct dt_nf4 *dt_lora_nf4_sh(const dt_model *m, int id, int l, int j);

#endif
