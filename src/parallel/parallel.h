/* parallel.h - data parallelism: how gradients and optimizer state are shared between
 * ranks. One object per rank; the trainer calls it around each step and the model calls
 * its hooks per layer.
 *
 *   DDP    (FSDP NO_SHARD)       gradients all-reduced in buckets (reverse layer order),
 *                                 overlapped with the backward pass; full optimizer state.
 *   ZeRO-1                        same all-reduce; each rank keeps AdamW state for its shard
 *                                 of every unit only, updates it, then all-gathers.
 *   ZeRO-2 (SHARD_GRAD_OP)        gradients reduce-scattered per unit into the shard; no
 *                                 full gradient buffer (double-buffered unit windows); or,
 *                                 with cfg.zero_reduce step, accumulated in a full buffer
 *                                 and reduce-scattered once per step (zero_step.c).
 *   ZeRO-3 (FULL_SHARD)           parameters sharded too; each unit (a layer, a vocabulary
 *                                 chunk, ...) all-gathered where the model reads it (or, with
 *                                 cfg.zero3_gather step, once per step into a resident copy).
 *   hybrid (HYBRID_SHARD)         any ZeRO stage sharded inside a node, replicated across.
 * Every reduction sums in rank order: all strategies give bitwise the same result as DDP,
 * and as one rank with world x accum micro-steps, when accum = 1 (see docs/ARCHITECTURE.md).
 * grad_dtype DT_BF16 (parallel.grad_dtype: bf16; DT_F16, fp16, alike with IEEE half's rounding)
 * halves the gradient bytes: every gradient
 * collective follows comm.h's bf16 rule (each rank's contribution rounded to bf16, the owner
 * sums in f32 in rank order and rounds the sum once; DDP's all-gather of the reduced parts
 * carries those bf16 sums), so every element of the averaged gradient is
 * w(bf16(sum over ranks, in order, of w(bf16(x_r)))) in every strategy. Hybrid sharding
 * reduces once over the whole world too (the owner of a sub-chunk sums all W ranks'
 * rounded contributions, of every node, and rounds once); its cross-node step only gathers
 * those bf16 sums among the replicas, as bf16, with no arithmetic and nothing re-rounded.
 * So DDP, ZeRO-1/2/3 and hybrid stay bitwise equal to each other when accum = 1 (for any
 * accum when ZeRO-2/3 reduce once per step: cfg.zero_reduce). Only the
 * wire is 16-bit: gradients accumulate over micro-steps in f32 (DDP/ZeRO-1 before the one
 * reduction, ZeRO-2/3 after each micro-step's), parameters and optimizer state stay f32.
 * One rank communicates nothing and rounds nothing, so in bf16 1 rank is not bitwise N
 * ranks (close: tests/test_mpi.sh holds the losses to 1e-4 relative; measured ~1e-5).
 * Under mixed precision (compute DT_BF16/DT_F16) ZeRO-3's parameter gathers move the
 * `matmul` tensors in 16 bits: each rank narrows its piece of its fp32 master shard and the
 * 16-bit values land in a 16-bit window the model reads (unit_params_lp, model.h); the other
 * tensors travel in fp32. Narrowing is per element, so the bits are those DDP narrows
 * locally, and ZeRO-3 stays bitwise equal to DDP. The embedding lookup reads its chunks in
 * fp32 (DT_NEED_F32): those gathers stay fp32. Full-parameter paths (checkpoints, export,
 * set_params) are fp32.
 * Top-K compression (parallel.compression: topk; topk.h) replaces each bucket's ordered
 * all-reduce by an all-gather of every rank's largest ratio x n (index, value) pairs, values in
 * grad_dtype (bf16: the same rounding rule as above), summed by every rank in rank order, with
 * error feedback: a per-rank residual of Psi floats (what was not sent) is added to the next
 * step's gradient, and goes into checkpoints (dt_parallel_residual). DDP and ZeRO-1 only (they
 * reduce whole buckets of a full gradient); ZeRO-2/3 are refused. Under tensor parallelism each
 * TP rank compresses its own slab, and TP rank 0's reduced gradient and residual of the
 * replicated tensors are broadcast to its TP group (buckets.c). One rank sends nothing and
 * keeps no residual. With ratio < 1 and topk_age, the update of a Top-K step is AdamW by age
 * (optim.h dt_adamw_update_aged): per element of the optimizer shard, the steps since its
 * reduced gradient was last non-zero (dt_parallel_ages; checkpointed with the residual).
 *
 *   dt_parallel *p; DT_CHECK(dt_parallel_init(ctx, &p, comm, &model, &alloc, &cfg));
 *   per step:  dt_parallel_begin_micro(p, k, last)  before micro-step k's backward
 *              dt_parallel_end_micro(p)            after it
 *              DT_CHECK(dt_parallel_finish_grads(ctx, p));    all buckets reduced and averaged
 *              DT_CHECK(dt_parallel_grad_sumsq(ctx, p, &s));  global, for clipping
 *              DT_CHECK(dt_parallel_update(ctx, p, &adamw, lr, t, clip_coef));
 *   dt_parallel_free(p);
 */
#ifndef DT_PARALLEL_H
#define DT_PARALLEL_H

#include "comm/comm.h"
#include "core/alloc.h"
#include "model/model.h"
#include "optim/optim.h"

typedef enum dt_strategy { DT_STRAT_DDP, DT_STRAT_ZERO1, DT_STRAT_ZERO2, DT_STRAT_ZERO3 } dt_strategy;

typedef struct dt_parallel_cfg {
    dt_strategy strategy;
    int hybrid;          /* ZeRO stages: shard inside a node, replicate across nodes */
    size_t bucket_bytes; /* gradient bucket size */
    int overlap;         /* all-reduce buckets on a communication thread during backward */
    int accum;           /* micro-steps per step (set by the trainer) */
    dt_dtype grad_dtype; /* DT_F32, or DT_BF16: gradient reductions travel in bf16 (below) */
    dt_dtype compute;    /* the model's training.precision (set by the trainer; dt_parallel_init
                            takes the model's): under DT_BF16/DT_F16 ZeRO-3 gathers the
                            `matmul` tensors in 16 bits (below) */
    int shm;             /* node-local collectives over shared memory (comm.h dt_comm_set_shm) */
    int allreduce;       /* DT_AR_AUTO, DT_AR_FLAT, DT_AR_HIER (comm.h dt_comm_set_hierarchical) */
    char comm_model[1024]; /* parallel.comm_model: a `bench comm --fit` file whose predictions the
                              communicator sums (comm.h dt_comm_set_model); "" = none */
    int compression;     /* DT_COMPRESS_NONE, or DT_COMPRESS_TOPK (DDP and ZeRO-1 only; below) */
    double topk_ratio;   /* parallel.compression_ratio: the part of each block sent, (0, 1] */
    long topk_warmup;    /* parallel.compression_warmup: steps reduced densely first (the trainer
                            switches Top-K on after them: dt_parallel_set_compression) */
    int topk_age;        /* parallel.compression_adam: age (1; ratio < 1, world > 1: AdamW by
                            age, optim.h dt_adamw_update_aged) or plain (0) */
    dt_group dp_group;   /* the data-parallel group gradients and shards span (set by the
                            trainer from the process mesh; 0 = DT_GROUP_WORLD) */
    dt_group node_group; /* hybrid sharding's groups under a process mesh (set by the trainer,
                            parallel/mesh.h dt_mesh_hybrid): the DP group's ranks on this node */
    dt_group cross_group;/* and those at this rank's place on each node; 0 (both): the
                            communicator's DT_GROUP_NODE and DT_GROUP_CROSS */
    int tp;              /* tensor parallelism's ranks (> 1: the model's split tensors hold one
                            shard each; the gradient norm adds the TP group's parts) */
    dt_group tp_group;   /* their group (with tp > 1) */
    int tokens;          /* token positions per micro-batch, B x T (set by the trainer;
                            dt_parallel_init takes the model's): sizes ZeRO-3's vocabulary
                            row lookup (zero_lookup.c) */
    int zero_reduce;     /* ZeRO-2/3's gradients (parallel.zero_reduce): DT_ZR_MICRO reduce-scatters
                            every unit at every micro-step into the fp32 shard (+= in micro order);
                            DT_ZR_STEP accumulates the full gradient locally over the step (DDP's
                            scheme: zero_step.c) and reduce-scatters each unit once, in the last
                            micro-step that forms it. DT_ZR_AUTO (the trainer resolves it: step
                            under parallel.pp > 1) is micro here */
    int zero3_gather;    /* ZeRO-3's parameters (parallel.zero3_gather): DT_ZG_USE gathers a unit
                            into one of two windows at every use; DT_ZG_STEP into a resident full
                            buffer once per step (and its 16-bit copy under mixed precision), read
                            without communication until the update. DT_ZG_AUTO (resolved by the
                            trainer from the memory plan) is use here */
    size_t skip_off, skip_len; /* expert parallelism (set by the trainer): every layer
                            block's floats [skip_off, skip_off + skip_len), the local experts, are
                            left out of the data-parallel reduction (the trainer sums them over
                            their expert-data-parallel group: train/ep.c); skip_len 0: none */
    int skip_ranks, skip_rank; /* the ranks holding those floats alike (the EDP group) and my place
                            among them: DDP's checkpoints spread their writing over them
                            (save_pieces); ZeRO shards the experts' units over them (decision 88) */
    dt_group skip_group; /* their group (with skip_len > 0 and skip_ranks > 1) */
} dt_parallel_cfg;
enum { DT_ZR_AUTO, DT_ZR_STEP, DT_ZR_MICRO };
enum { DT_ZG_AUTO, DT_ZG_STEP, DT_ZG_USE };
enum { DT_AR_AUTO, DT_AR_FLAT, DT_AR_HIER };
enum { DT_COMPRESS_NONE, DT_COMPRESS_TOPK };

typedef struct dt_parallel dt_parallel;

/* Parses ddp, zero1, zero2, zero3 and the FSDP names no_shard (= ddp), shard_grad_op
 * (= zero2), full_shard (= zero3), hybrid_shard (= zero3 sharded inside each node,
 * replicated across nodes: *hybrid = 1). Case-insensitive. */
dt_status dt_strategy_parse(dt_ctx *ctx, const char *s, dt_strategy *out, int *hybrid);
const char *dt_strategy_name(dt_strategy s);

/* Installs the model's hooks, allocates the state this rank owns and draws the initial
 * weights (ZeRO-3: only this rank's shard). The model must come from dt_model_init
 * with slabs for DDP/ZeRO-1, a params slab only for ZeRO-2, no slabs for ZeRO-3. */
dt_status dt_parallel_init(dt_ctx *ctx, dt_parallel **out, dt_comm *comm, dt_model *m,
                           dt_alloc *alloc, const dt_parallel_cfg *cfg, uint64_t seed);
void dt_parallel_free(dt_parallel *p);

/* Before micro-step k's backward: points the model's gradients at a zeroed buffer.
 * Communication happens only when `last` is set (the last accumulation micro-step), so
 * earlier micro-steps just accumulate locally. */
void dt_parallel_begin_micro(dt_parallel *p, int k, int last);
/* After a micro-step's backward: adds it into the step's gradient (non-last micro-steps;
 * the last one is added bucket by bucket just before its reduction). */
void dt_parallel_end_micro(dt_parallel *p);

/* Waits for every bucket; afterwards m->grads holds the mean gradient of the global batch
 * (the model's backward must have scaled by 1/(accum x world)). */
dt_status dt_parallel_finish_grads(dt_ctx *ctx, dt_parallel *p);

/* Sum of squares of the global (averaged) gradient, identical on every rank. */
dt_status dt_parallel_grad_sumsq(dt_ctx *ctx, dt_parallel *p, double *out);

/* Scales gradients by clip_coef (the clipping coefficient divided by the loss scale: it may
 * exceed 1 when the loss scale is below 1), runs AdamW on this rank's part and leaves every rank with
 * the full updated parameters. t is the 1-based step. */
dt_status dt_parallel_update(dt_ctx *ctx, dt_parallel *p, const dt_adamw *opt, float lr, long t,
                             float clip_coef);

/* After dt_parallel_finish_grads: where this rank's reduced gradient of unit u lies, *n floats -
 * the unit's piece this rank holds (ddp: the whole unit; ZeRO: its shard of it, as
 * dt_parallel_pieces). Ranks at the same place of equal data-parallel groups holding equally
 * laid-out units hold the same piece (a pipeline's tied embedding and its copy, decision 74). */
float *dt_parallel_unit_grad(dt_parallel *p, int u, size_t *n);

/* Expert parallelism (cfg.skip_len > 0): the local experts' reduced gradients, skip_len floats
 * per layer block in layer order (train/ep.c sums them over the EDP group), into this rank's
 * pieces of their units (DDP: the whole units; ZeRO: each unit's shard over the EDP group).
 * After dt_parallel_finish_grads. */
void dt_parallel_expert_grads(dt_parallel *p, const float *acc);
/* ZeRO (the experts' units sharded over the EDP group): the floats of EDP rank q's pieces of
 * them, unit by unit, copied from acc (laid out as above) into out unless out is NULL; returns
 * their count. dt_parallel_expert_unpack puts my pieces, packed so, into my gradient pieces. */
size_t dt_parallel_expert_pack(const dt_parallel *p, int q, const float *acc, float *out);
void dt_parallel_expert_unpack(dt_parallel *p, const float *packed);

/* The data-parallel group (the world without a process mesh). */
dt_group dt_parallel_dp_group(const dt_parallel *p);

/* Mean of x over the data-parallel ranks (for logging the loss). */
dt_status dt_parallel_mean(dt_ctx *ctx, dt_parallel *p, double *x);

/* The full parameters (all ranks must call: ZeRO-3 gathers them into a new buffer);
 * give it back with dt_parallel_release_full_params. */
dt_status dt_parallel_full_params(dt_ctx *ctx, dt_parallel *p, float **out);
void dt_parallel_release_full_params(dt_parallel *p, float *full);

/* A piece of this rank's shard: shard floats [local, local + n) hold the state of
 * parameters [global, global + n) of the full (slab-layout) parameter vector. */
typedef struct dt_shard_piece {
    size_t global, local, n;
} dt_shard_piece;

/* This rank's pieces, one per unit in unit order (room for m->ps.n_units); returns the count. */
int dt_parallel_pieces(const dt_parallel *p, dt_shard_piece *out);
/* The AdamW moments of this rank's shard (dt_parallel_shard floats each). */
void dt_parallel_moments(dt_parallel *p, float **mom, float **var);
/* What this rank writes to a checkpoint: state held by R ranks alike (DDP: every rank;
 * hybrid: one rank per node) is written once, each holder taking 1/R of every piece, so the
 * copy and the writing are spread over the replicas. Pieces as above (local = offset in
 * this rank's moments); returns the count (room for n_units), 0 if this rank writes none. */
int dt_parallel_save_pieces(const dt_parallel *p, dt_shard_piece *out);
/* Replaces the parameters with `full` (n_params floats, the same on every rank; all ranks
 * call: ZeRO-3 keeps its piece; units are gathered when next used). */
dt_status dt_parallel_set_params(dt_ctx *ctx, dt_parallel *p, const float *full);

/* The memory plan: bytes by kind (added into bytes[]) that dt_parallel_init allocates on
 * world rank `rank` of `world`, for the store ps (units laid out, slabs not needed), with
 * node_ranks ranks per node (hybrid sharding groups ranks rank / node_ranks). The model's own
 * slabs are not included (see dt_trainer_mem_plan). docs/ARCHITECTURE.md gives the formula. */
void dt_parallel_plan(const dt_params *ps, const dt_parallel_cfg *cfg, int world, int node_ranks, int rank,
                      size_t bytes[DT_MEM_NKINDS]);

/* Top-K on (1) or off (0: the dense ordered reductions, bitwise Top-K at ratio 1; the residual
 * is kept) from the next step on; call between steps. Off until called. */
void dt_parallel_set_compression(dt_parallel *p, int on);
/* Top-K's residual on this rank (*n floats; *res NULL and *n 0 when there is none: no
 * compression, or one rank). Checkpoints save and restore it (the buffer is written in place). */
void dt_parallel_residual(dt_parallel *p, float **res, size_t *n);
/* After a step's reduction: factor 0 clears the residual (a skipped, non-finite step: its
 * gradients are dropped, and an Inf must not be carried on); any other factor multiplies it
 * (the loss scale changed by that factor: the residual is in the scaled units of the gradients
 * it is added to). No-op without a residual or for factor 1. */
void dt_parallel_residual_adjust(dt_parallel *p, float factor);
/* Top-K by age (parallel.compression_adam: age, ratio < 1, world > 1): the ages of my shard's
 * elements (optim.h dt_adamw_update_aged; *n floats, aligned with dt_parallel_moments; *age
 * NULL and *n 0 when there are none). Checkpoints save and restore them with the residual. */
void dt_parallel_ages(dt_parallel *p, float **age, size_t *n);
/* Every age 1: nothing owed (a fresh start, or a residual that starts empty). */
void dt_parallel_ages_reset(dt_parallel *p);

/* Number of parameters whose optimizer state this rank holds. */
void dt_parallel_shard(const dt_parallel *p, size_t *count);
/* Seconds spent waiting for communication in finish_grads/update (exposed), and in the
 * collectives themselves (total), since init. */
void dt_parallel_comm_time(const dt_parallel *p, double *exposed, double *total);
/* ZeRO-2/3: unit reduce-scatters and unit parameter gathers (ZeRO-3's windows or resident
 * buffer; not the vocabulary row lookups, nor full-parameter gathers for checkpoints) run since
 * init; 0 for DDP/ZeRO-1. Waits for the tasks in flight. */
void dt_parallel_unit_counts(dt_parallel *p, long *reduces, long *gathers);

#endif
