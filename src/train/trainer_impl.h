/* trainer_impl.h - the trainer's pieces shared by trainer.c and pipeline.c (internal to
 * src/train). */
#ifndef DT_TRAINER_IMPL_H
#define DT_TRAINER_IMPL_H

#include "train/trainer.h"

/* A step's micro-batches: explicit batches (inputs non-NULL: accum x (B,T) each) or the data
 * source; whether the targets are masked and how many count over the global batch; the
 * data-parallel ranks W and this rank's place R. */
typedef struct dt_micro {
    const int32_t *inputs, *targets;
    int masked;
    uint64_t counted;
    int W, R;
    int G; /* the ranks a gradient is summed over: W x parallel.cp (each holds part of the rows) */
} dt_micro;

/* Micro-batch k's tokens (valid until the next call). */
dt_status dt_trainer_micro_batch(dt_ctx *ctx, dt_trainer *tr, const dt_micro *mi, int k, int32_t **in,
                                 int32_t **tg);
/* Its backward's scale: the mean over the global batch times the loss scale. */
float dt_trainer_micro_scale(const dt_trainer *tr, const dt_micro *mi, int k);
/* After a pass: a collective of the TP group that failed stops the run, naming it. */
dt_status dt_trainer_tp_check(dt_ctx *ctx, dt_trainer *tr);
/* LoRA dropout's keys for micro-batch k (model.h lora_drop_*). */
void dt_trainer_micro_drop(dt_trainer *tr, const dt_micro *mi, int k);

/* The process mesh (mesh_groups.c; parallel/mesh.h): splits this run's groups (TP, DP, CP and
 * DP x CP, EP and EDP, PP, the model-parallel group; hybrid sharding's), sets the model's ranks
 * in mo and the gradients' group in pc. */
dt_status dt_trainer_mesh_groups(dt_ctx *ctx, dt_trainer *tr, dt_model_opts *mo, dt_parallel_cfg *pc);

/* ---- the expert load of a mixture of experts (moe_load.c; ARCHITECTURE decision 86) */

/* The bytes of the step's counts (n_layer x n_experts int64, kind OTHER; 0 for a dense model):
 * dt_moe_load_init allocates them and points the model's moe_load at them. */
size_t dt_moe_load_bytes(const dt_train_cfg *cfg);
dt_status dt_moe_load_init(dt_ctx *ctx, dt_trainer *tr);
void dt_moe_load_free(dt_trainer *tr);
/* At the step's start: the counts zeroed (the model adds each forward's choices). */
void dt_moe_load_begin(dt_trainer *tr);
/* At the step's end (every rank alike): the counts summed over the world, out's moe_load,
 * moe_layers, moe_experts and moe_load_max_mean set (NULL and 0 for a dense model). */
dt_status dt_moe_load_finish(dt_ctx *ctx, dt_trainer *tr, dt_step_stats *out);
/* Context parallelism's `sum` (model/cp.h; decision 89): x (n doubles, a mixture of experts'
 * router totals) replaced by its sum over the CP group (ud: the trainer's dt_cp_link), added
 * in rank order; nonzero on a failure (its message in the link's ctx). */
int dt_moe_cp_sum(void *ud, double *x, size_t n);

/* ---- expert parallelism (ep.c; ARCHITECTURE decision 85) */

/* After the model (tr->ep's groups set by the mesh): installs the EP group's all-to-all and
 * allocates the gradient segments. Nothing without expert parallelism. */
dt_status dt_ep_init(dt_ctx *ctx, dt_trainer *tr);
void dt_ep_free(dt_trainer *tr);
/* The bytes dt_ep_init allocates (the memory plan), added into bytes[]: the segments (kind
 * GRADS), for a store of store_layers layers on a data-parallel group of dp ranks. */
/* The data-parallel configuration's expert fields (parallel.h skip_*) for store ps of data-parallel
 * rank dp_rank of dp: the local experts' range of every layer block and their EDP group's size
 * and my place (not its handle). */
void dt_ep_parallel_cfg(const dt_params *ps, const dt_model_config *c, const dt_model_opts *o, int dp, int dp_rank,
                        dt_parallel_cfg *pc);
void dt_ep_plan(const dt_train_cfg *cfg, const dt_model_opts *o, int dp, int store_layers, size_t bytes[DT_MEM_NKINDS]);
/* Around micro-step k's backward: where its expert gradients go (the step's segments, or a
 * zeroed buffer added into them afterwards, as DDP accumulates: parallel.c). */
void dt_ep_begin_micro(dt_trainer *tr, int k);
void dt_ep_end_micro(dt_trainer *tr, int k);
/* After the data-parallel reduction (which leaves the experts out): each local expert's
 * gradient, the segments of every data-parallel rank summed in data-parallel rank order down
 * the EDP group, into the store's gradients on every rank holding the expert. */
dt_status dt_ep_reduce(dt_ctx *ctx, dt_trainer *tr);
/* The gradient's sum of squares: the dense tensors (EP rank 0's part) and each rank's
 * experts, exchanged exactly and added in EP rank order. pre / post: the tensors before the
 * layers (the embedding) and after them count (a pipeline stage: the first / the last). */
dt_status dt_ep_sumsq(dt_ctx *ctx, dt_trainer *tr, int pre, int post, double *out);

/* ---- pipeline parallelism (pipeline.c; ARCHITECTURE decision 74) */

/* The stages' layers of cfg (cfg->pp > 1): pp_first as given (parallel.pp_layers) or cut by
 * pp_split.h's rule; refuses, naming the key, a family without stages, a schedule that cannot
 * run accum micro-batches on pp stages, and what is not built under a pipeline yet. */
dt_status dt_pp_cfg_stages(dt_ctx *ctx, dt_train_cfg *cfg);
/* The strategy's micro-steps a pipeline stage's step has per micro-batch: a backward pass per
 * chunk (interleaved: pp_virtual), and under zb-h1 a weight-gradient pass besides. */
static inline int dt_pp_passes(const dt_train_cfg *cfg);
/* Chunks per stage: parallel.pp_virtual under the interleaved schedule (cfg->pp > 1), else 1. */
static inline int dt_pp_chunks(const dt_train_cfg *cfg) {
    return cfg->pp > 1 && !cfg->pp_blocks && cfg->pp_kind == DT_PP_INTERLEAVED && cfg->pp_virtual > 1 ? cfg->pp_virtual : 1;
}
static inline int dt_pp_passes(const dt_train_cfg *cfg) {
    return dt_pp_chunks(cfg) * (cfg->pp > 1 && !cfg->pp_blocks && cfg->pp_kind == DT_PP_ZBH1 ? 2 : 1);
}
/* An interleaved stage's model options (o->pp_l0/pp_l1: its chunk 0, from pp_first): its chunks,
 * pp_first[pp] apart. Nothing otherwise. */
static inline void dt_pp_chunk_opts(const dt_train_cfg *cfg, dt_model_opts *o) {
    if (dt_pp_chunks(cfg) <= 1) return;
    o->pp_v = dt_pp_chunks(cfg), o->pp_stride = cfg->pp_first[cfg->pp], o->pp_c = 0;
}
/* After the model and the strategy: this stage's schedule and activation sets. */
dt_status dt_pp_init(dt_ctx *ctx, dt_trainer *tr);
void dt_pp_free(dt_trainer *tr);
/* One step's micro-batches on this stage, in its schedule's order: forwards from the previous
 * stage's activations (or the tokens), backwards from the next stage's gradients (or the
 * loss); gradients accumulate in micro-batch order, as one rank's. *loss_sum: the last
 * stage's sum (as run_step sums), 0 on the others. Fills out's fwd/bwd/data seconds. */
dt_status dt_pp_micro_steps(dt_ctx *ctx, dt_trainer *tr, const dt_micro *mi, double *loss_sum, double moe_sum[4],
                            dt_step_stats *out);
/* The last stage's value of *x on every stage; of x[0..n) (dt_pp_share). */
dt_status dt_pp_share_loss(dt_ctx *ctx, dt_trainer *tr, double *x);
dt_status dt_pp_share(dt_ctx *ctx, dt_trainer *tr, double *x, int n);
/* Evaluation through the pipeline (run.h dt_eval_xfer; ud: the trainer): before a forward the
 * previous stage's activations, after it this stage's sent on. */
dt_status dt_pp_eval_xfer(dt_ctx *ctx, void *ud, int before, int chunk);
/* After an evaluation through the pipeline: its last send completed, chunk 0 current. */
dt_status dt_pp_eval_done(dt_ctx *ctx, dt_trainer *tr);
/* The gradient norm's sum of squares under a pipeline (cfg.pp > 1): each stage's part (with
 * ddp the chunked sum over its slab, a tied copy left out), summed over the stages in stage
 * order, the same on every stage; in the blocks mode the same parts of the one slab. */
dt_status dt_pp_sumsq(dt_ctx *ctx, dt_trainer *tr, double *sumsq);
/* A tied head's reduced gradient, from the first stage to the last stage's copy (after the
 * norm, which counts it once, before the update: both copies take the same step). */
dt_status dt_pp_tied_grads(dt_ctx *ctx, dt_trainer *tr);
/* Bytes of an interleaved stage's token copies (cfg.accum micro-batches' inputs and targets),
 * and of its send buffers (2 accum v messages of stage_floats floats). */
size_t dt_pp_tokens_bytes(const dt_train_cfg *cfg);
size_t dt_pp_pool_bytes(const dt_train_cfg *cfg, size_t stage_floats);
/* A LoRA base's identities over the pipeline's stages (each stage's of its own part): the
 * hash of the stages' hashes in stage order, and the sum of their fingerprints (a sum over the
 * model's elements, model/lora.h), the same on every stage. */
dt_status dt_pp_base_ids(dt_ctx *ctx, dt_trainer *tr, uint64_t *hash, uint64_t *fp);
/* Floats of a tied head's tied_h in store ps (0: none held). */
size_t dt_pp_tied_floats(const dt_params *ps);

#endif
