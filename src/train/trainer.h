/* trainer.h - one process's training loop state: model, AdamW moments, schedule, data.
 *
 *   dt_train_cfg cfg; dt_train_cfg_defaults(&cfg);  ... set fields ...
 *   dt_trainer tr; DT_CHECK(dt_trainer_init(ctx, &tr, &cfg));
 *   for (...) { dt_step_stats st; DT_CHECK(dt_trainer_step(ctx, &tr, &st)); }
 *   dt_trainer_free(&tr);
 */
#ifndef DT_TRAINER_H
#define DT_TRAINER_H

#include <stdint.h>

#include "core/alloc.h"
#include "comm/comm.h"
#include "model/model.h"
#include "optim/optim.h"
#include "parallel/parallel.h"
#include "parallel/pp_schedule.h"
#include "parallel/pp_split.h"

typedef struct dt_train_cfg {
    char preset[32];        /* model preset the model fields came from ("" = custom) */
    dt_model_config model;
    dt_model_opts model_opts; /* activation checkpointing (memory.*) */
    int micro_batch;        /* B */
    int seq_len;            /* T */
    int accum;              /* micro-steps per optimizer step */
    long steps;             /* optimizer steps */
    dt_lr_schedule sched;
    dt_adamw adamw;
    float clip;             /* global grad-norm clip; <= 0 disables */
    dt_parallel_cfg parallel;
    uint64_t seed;
    long fail_alloc_at;     /* fault injection for tests: the n-th allocation fails (0 = off) */
    int nonfinite_skip;     /* training.nonfinite: 1 = skip a step with a non-finite loss or
                               gradient norm, 0 = stop naming the step */
    float loss_scale;       /* training.loss_scale: 0 = auto (dynamic from 65536 for fp16, off
                               otherwise), else a static scale */
    long loss_scale_window; /* training.loss_scale_window: finite steps before it doubles */
    /* mixture of experts (model/llama/moe.h): training.moe_aux_loss_coef,
       training.moe_z_loss_coef, parallel.moe_capacity_factor (0 = dropless) */
    float moe_aux_coef, moe_z_coef, moe_capacity;
    int moe_aux_layer; /* training.moe_aux_loss_type=layer (model.h) */
    /* Set by the config layer (train/keys.c: dt_cfg_finish, dt_cfg_apply_world) once it has
     * validated the whole configuration, the model in place included (ARCHITECTURE decision
     * 72): dt_trainer_init then does not validate it again. 0 (a library caller that fills a
     * dt_train_cfg itself): dt_trainer_init validates its own copy. */
    int checked;
    /* Pipeline parallelism (parallel.pp > 1; ARCHITECTURE decision 74): the stages (ranks of a
     * PP group), the schedule (pp_schedule.h dt_pp_kind: parallel.pp_schedule) and its virtual
     * stages per rank (parallel.pp_virtual), and each stage's first layer (pp_first[pp] =
     * n_layer; all 0: the trainer cuts them by pp_split.h's rule). pp <= 1: no pipeline. */
    int pp, pp_kind, pp_virtual;
    int pp_first[DT_PP_MAX + 1];
    /* parallel.pp_blocks, the test mode: one process (no pipeline) runs exactly the arithmetic
     * of pp stages - the gradient norm summed stage by stage, a tied head's two gradients
     * apart (model.h tied_h) - so a pipeline's results are bitwise its own. */
    int pp_blocks;
    /* Context parallelism (parallel.cp > 1; ARCHITECTURE decision 83): the ranks of a CP group
     * split every sequence (model/cp.h: 2 chunks each), their gradients summed with the
     * data-parallel ranks'. <= 1: none. */
    int cp;
    int cp_contiguous; /* parallel.cp_split=contiguous (model/cp.h) */
    /* Expert parallelism (parallel.ep > 1; ARCHITECTURE decision 85): the ranks of an EP group
     * (ep consecutive data-parallel ranks) split each layer's experts (model/llama/moe.h); the
     * experts' gradients are summed over the expert-data-parallel group (train/ep.c). <= 1: none. */
    int ep;
} dt_train_cfg;

/* The rows of each sequence a rank holds: training.seq_len / parallel.cp (model/cp.h). */
static inline int dt_train_local_T(const dt_train_cfg *c) { return c->cp > 1 ? c->seq_len / c->cp : c->seq_len; }

void dt_train_cfg_defaults(dt_train_cfg *c);
/* Checks the training fields, naming the key of a bad one. c->model must be validated
 * already (dt_model_config_validate: the LoRA checks read its derived shape). */
dt_status dt_train_cfg_validate(dt_ctx *ctx, const dt_train_cfg *c);

/* Supplies micro-batch k (0..accum-1) of the current step; buffers stay valid until the
 * next call. */
typedef dt_status (*dt_batch_fn)(dt_ctx *ctx, void *ud, int k, int32_t **inputs, int32_t **targets);
/* A data source with a loss mask: the targets of the step about to start that count, over
 * every rank and micro-step (the same number on every rank, without a collective). */
typedef uint64_t (*dt_count_fn)(void *ud);

/* Context parallelism's ring (model/cp.h) over the CP group (trainer.c): each slot's send to
 * the next rank and receive from the previous in flight. */
typedef struct dt_cp_link {
    dt_comm *comm;
    dt_group group;
    int n, rank;
    dt_comm_req *sreq[2], *rreq[2];
    dt_ctx ctx;             /* a failure's message */
    double seconds, bytes;  /* waiting for the ring's transfers / sent into them, since init */
    int32_t *tok;           /* (2, B, T / cp) the micro-batch's rows this rank holds */
} dt_cp_link;

/* Tensor parallelism's group as the model's collectives see it (trainer.c). */
typedef struct dt_tp_link {
    dt_comm *comm;
    dt_group group;
    float *scratch; /* dt_trainer_tp_scratch floats: the ordered all-reduce's */
    dt_ctx ctx;     /* a failure's message */
    int failed;
    double seconds; /* spent in the group's collectives since init (all exposed: the compute
                       thread waits for their results) */
    double bytes;   /* sent into them (ring accounting, as comm.h dt_comm_bytes) */
} dt_tp_link;

/* Expert parallelism's state (train/ep.c): the EP group (its all-to-alls for the model) and
 * the expert-data-parallel group (EDP: the ranks holding the same experts), and the local
 * experts' weight-gradient segments, one per source rank of the EP group (model.h
 * dt_model.ep_grads): seg the step's, micro a later micro-step's (training.grad_accum > 1),
 * fold the EDP chain's partial sum (more than one EDP rank). */
typedef struct dt_ep_link {
    dt_comm *comm;
    dt_group group, edp;
    int n, rank;            /* ep, this rank's EP rank (n = 1: none) */
    int edp_n, edp_rank;    /* the EDP group */
    size_t seg_n;           /* floats of one segment (moe.h dt_moe_ep_segment) */
    size_t off, len;        /* the local experts' floats in every layer block of the store */
    float *seg, *micro, *fold;
    dt_ctx ctx;             /* a failure's message */
    double bytes;           /* sent into the EP group's all-to-alls since init */
    double seconds;         /* spent in them (exposed: the compute thread waits) */
} dt_ep_link;

/* Pipeline parallelism's state on a stage (trainer.c, pipeline.c): the PP group, this stage's
 * action list, an activation set per micro-batch in flight, the transfers in flight. */
typedef struct dt_pp_link {
    int n, stage;             /* stages (1: no pipeline) and mine */
    int v;                    /* chunks of this stage (interleaved; 1 otherwise) */
    int passes;               /* the strategy's micro-steps per micro-batch (trainer_impl.h dt_pp_passes) */
    int32_t *tok;             /* interleaved: the step's micro-batches' tokens (inputs, targets) */
    float *pool;              /* interleaved: a copy of every message a step sends (pipeline.c) */
    dt_wdefer *defer;         /* zb-h1: per activation set, its backward's deferred weight GEMMs */
    size_t defer_floats;      /* each set's fallback for the douts no dead span takes */
    int defer_items;          /* the douts of a backward (the plan's places) */
    int defer_gemms;          /* their GEMM records (model.h dt_model_defer_gemms) */
    dt_wdefer_place *defer_place; /* where each dout goes (model.h dt_model_defer_plan) */
    dt_comm_req **pool_req;
    int pool_n, pool_used;
    size_t pool_off;          /* floats of pool the step's messages took */
    dt_group group;           /* the PP group (same t, c, d): stage = group rank */
    dt_pp_action *acts;       /* this stage's schedule for accum micro-batches */
    int n_acts;
    int slots;                /* activation sets: the most micro-batches in flight */
    float **slab;             /* slots sets of n_acts floats each (slab[0]: the model's own) */
    int *slot_of;             /* micro-batch -> slot (-1: none) */
    int *busy;                /* slot -> micro-batch holding it (-1: free) */
    dt_comm_req **out_req, **in_req; /* per slot: its output's and its input gradient's sends */
    dt_comm_req **out_xreq, **in_xreq; /* and those of its side values (dt_model_stage_extra) */
    size_t nx;                /* side values' floats (0: none) */
    float *bscale;            /* per micro-batch: the backward's loss scale */
    double seconds, bytes;    /* waiting for and sent into the stage transfers since init */
    double idle;              /* of seconds: waiting for a neighbour's data (receives) */
    /* a head tied to the embedding (model.h tied_h): its tensor's stored elements, where they
     * start in the store's index space, and the last stage's send of its head gradients */
    int tied;                 /* this stage holds the tied tensor (or its copy; or pp_blocks) */
    size_t tied_n, tied_off;
    dt_comm_req *tied_req;
} dt_pp_link;

typedef struct dt_trainer {
    dt_train_cfg cfg;
    dt_alloc alloc;
    dt_model model;
    dt_comm *comm;      /* the run's communicator (or own_comm) */
    dt_comm *own_comm;  /* single-process communicator when none was given */
    dt_parallel *par;   /* gradient reduction and (sharded) optimizer state */
    dt_batch_fn next_batch;    /* NULL: synthetic tokens (dt_synthetic_batch) */
    void *batch_ud;
    dt_count_fn step_targets;  /* (with next_batch) set when the data has a loss mask: the loss
                                  is then the mean over the step's counted targets */
    int32_t *inputs, *targets; /* (B,T) staging for synthetic micro-batches */
    long step;                 /* optimizer steps done (skipped ones included) */
    long skipped;              /* steps skipped for a non-finite loss or gradient norm */
    long poison_step;          /* test aid DTRAIN_TEST_NAN=STEP:RANK (-1 = off) */
    int poison_rank;
    int slow_rank, slow_ms;    /* test aid DTRAIN_TEST_SLOW=RANK:MS (-1 = off) */
    long spike_step;           /* test aid DTRAIN_TEST_SPIKE=STEP:RANK (-1 = off) */
    int spike_rank;
    dt_loss_scaler scaler;     /* fp16 (or a set training.loss_scale); scale 1 = off */
    long overflow_step;        /* test aid DTRAIN_TEST_OVERFLOW=STEP:RANK: that rank's gradients
                                  become Inf in that step (-1 = off) */
    int overflow_rank;
    dt_group dp_group;         /* the data-parallel ranks (the world without a process mesh) */
    dt_tp_link tp;             /* parallel.tp > 1: the TP group */
    dt_pp_link pp;             /* parallel.pp > 1: the pipeline (n = 1 otherwise) */
    dt_cp_link cp;             /* parallel.cp > 1: the ring (n = 1 otherwise) */
    dt_ep_link ep;             /* parallel.ep > 1: the EP and EDP groups (n = 1 otherwise) */
    dt_group mp_group;         /* the model-parallel ranks (same c, d: tp x pp) holding one whole
                                  model together (DT_GROUP_SELF-like without model parallelism:
                                  valid only when mp_ranks > 1) */
    int mp_ranks;
} dt_trainer;

typedef struct dt_step_stats {
    float loss;       /* mean over micro-steps */
    float grad_norm;  /* before clipping */
    float lr;
    int skipped;      /* no update: 1 = non-finite loss or gradient norm (training.nonfinite=skip),
                         2 = loss-scaled gradients overflowed (the scale was backed off) */
    float loss_scale; /* the scale this step's backward used (1 = none) */
    double seconds;   /* wall time of the step */
    double sync_seconds;  /* of which: waiting for the gradient reduction to finish */
    double optim_seconds; /* of which: norm, clipping, AdamW (and ZeRO's parameter gather) */
    /* The step split into parts that add up to `seconds` (the rest is other/idle): waiting
     * for communication (exposed, wherever it happened), fetching batches, and forward,
     * backward and sync + optimizer each without the communication waits inside them. */
    double comm_seconds, data_seconds, fwd_seconds, bwd_seconds, opt_seconds;
    /* Of comm_seconds: tensor parallelism's collectives (parallel.tp > 1 ranks), and the bytes
     * this rank sent into them. */
    double tp_seconds, tp_bytes;
    /* Of comm_seconds: context parallelism's ring (parallel.cp > 1): the time this rank waited
     * for blocks and their gradients to arrive (the transfers not hidden behind the blocks'
     * compute), and the bytes it sent. */
    double cp_seconds, cp_bytes;
    /* Of comm_seconds: pipeline parallelism's transfers between stages (parallel.pp > 1): the
     * time this stage waited for them, the bytes it sent, and of the time the part spent
     * waiting for a neighbour's activations or gradients (the bubble). */
    double pp_seconds, pp_bytes, pp_idle;
    /* Of bwd_seconds: zb-h1's weight-gradient passes (W) on this stage (0 otherwise). */
    double pp_wgrad;
    /* The wall time of this stage's action list (its schedule's passes over the micro-batches,
     * the transfers and waits among them): the span the bubble is a fraction of (bench). */
    double pp_span;
    /* mixture of experts (moe = 1; model/llama/moe.h): the cross-entropy, the load-balancing
       loss and the z-loss (before their coefficients; loss includes them), means over the
       micro-steps and ranks, and the routed choices the capacity dropped (all ranks) */
    int moe;
    float moe_ce, moe_aux, moe_z;
    double moe_dropped;
    /* the expert load (ARCHITECTURE decision 86): moe_load (moe_layers x moe_experts) holds
       each layer's router choices per expert in the step (the top-k of every token, before
       any capacity drop), summed over the micro-steps and all ranks (the trainer's buffer:
       valid until its next step; NULL for a dense model), and moe_load_max_mean the largest
       over the layers of max / mean over the experts */
    const int64_t *moe_load;
    int moe_layers, moe_experts;
    double moe_load_max_mean;
    /* expert parallelism (parallel.ep > 1): the expert rows this rank sent to the other ranks
     * of its EP group in the step's forward passes (-1: no expert parallelism), and of
     * comm_seconds the time in the EP group's all-to-alls and the bytes this rank sent into them */
    double ep_rows;
    double ep_seconds, ep_bytes;
} dt_step_stats;

/* A test aid "A:B" from the environment variable `name` (read once at start); *a = -1 when
 * it is unset or malformed. */
void dt_test_aid(const char *name, long *a, int *b);

/* comm may be NULL: a single process. */
/* The memory plan: bytes by kind that dt_trainer_init allocates on rank `rank` of `world`
 * (node_ranks ranks per node) for cfg, without allocating them. Nothing is allocated after
 * init during training, so this is the allocator's high-water of a run (tested equal for
 * every strategy); the formula per strategy is in docs/ARCHITECTURE.md. */
dt_status dt_trainer_mem_plan(dt_ctx *ctx, const dt_train_cfg *cfg, int world, int node_ranks, int rank,
                              size_t bytes[DT_MEM_NKINDS]);
/* Whether rank's memory plan with parallel.zero3_gather=step (parallel.zero_reduce's auto
 * resolved) is at most budget bytes: parallel.zero3_gather=auto's rule (decision 80; the trainer
 * takes this host's physical memory over its ranks, dtrain plan the device's memory). */
dt_status dt_trainer_zero3_fits(dt_ctx *ctx, const dt_train_cfg *cfg, int world, int node_ranks, int rank,
                                double budget, int *fits);
/* The same for the calling rank of comm (its world, node size and place). */
dt_status dt_trainer_mem_plan_here(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm,
                                   size_t bytes[DT_MEM_NKINDS]);

/* Floats of the TP group's all-reduce scratch (0 without tensor parallelism ranks). */
size_t dt_trainer_tp_scratch(const dt_train_cfg *cfg);

dt_status dt_trainer_init(dt_ctx *ctx, dt_trainer *tr, const dt_train_cfg *cfg, dt_comm *comm);
void dt_trainer_free(dt_trainer *tr);

/* One optimizer step on the next `accum` micro-batches of next_batch (or synthetic data). */
dt_status dt_trainer_step(dt_ctx *ctx, dt_trainer *tr, dt_step_stats *out);
/* A mixture of experts' load balance (dt_step_stats moe_load): the largest over the L layers of
 * (the most choices any of the E experts took) / (their mean); 0 when no layer has any. */
double dt_moe_load_max_mean(const int64_t *load, int L, int E);
/* One optimizer step on given micro-batches: inputs/targets hold accum x (B,T) tokens. */
dt_status dt_trainer_step_on(dt_ctx *ctx, dt_trainer *tr, const int32_t *inputs,
                             const int32_t *targets, dt_step_stats *out);

#endif
