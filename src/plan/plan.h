/* plan.h - `dtrain plan`: predicts memory per device, step time, MFU, scaling and cost of a
 * training run on hardware we do not have, from a catalog of accelerators and links
 * (hardware.h) and a few fitted efficiency factors. docs/planner.md gives every formula.
 *
 *   dt_plan_job job = {...};                       // model, batch, hardware, efficiencies
 *   dt_plan_layout lay = {.dp = 8, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .zero = DT_STRAT_ZERO1};
 *   dt_plan_result r; DT_CHECK(dt_plan_predict(ctx, &job, &lay, &r));
 *
 * Memory: layouts dtrain runs (data parallel only: DDP, ZeRO-1/2/3, hybrid) are sized by
 * dtrain's own plan (dt_trainer_mem_plan, equal to the allocator); tensor, pipeline, context
 * and expert parallel layouts by the analytic formulas of plan_mem.c. Time: compute at an
 * efficiency of the GEMM peak, exposed communication per collective and link level (alpha-
 * beta, ring algorithms), the 1F1B pipeline bubble and the recompute cost (plan_time.c). */
#ifndef DT_PLAN_H
#define DT_PLAN_H

#include <stdio.h>

#include "core/alloc.h"
#include "plan/hardware.h"
#include "train/trainer.h"

/* The model as the planner sees it: enough for parameters, FLOPs and activations. dtrain's
 * own models (gpt2, llama families) also carry their dt_model_config (is_dtrain). */
typedef struct dt_plan_model {
    char name[64];
    int n_layer, d_model, n_head, n_kv_head, d_ff, vocab, context;
    int swiglu;          /* 1: gated MLP (3 matrices), 0: GELU MLP (2 matrices) */
    int tied;            /* the lm_head is the embedding */
    int bias;            /* gpt2-style biases and learned positions */
    int experts, topk;   /* mixture of experts: experts per layer (0 = dense), routed per token */
    int is_dtrain;       /* mc is a valid dtrain config of this model */
    dt_model_config mc;
} dt_plan_model;

/* A dtrain config -> planner model (gpt2 / llama families). */
void dt_plan_model_from_dtrain(const dt_model_config *mc, const char *preset, dt_plan_model *out);
/* Parameters (all experts), the active ones per token, and training FLOPs per token
 * (6 x active matmul parameters incl. the lm_head, + 12 L T d attention; docs/planner.md). */
double dt_plan_params(const dt_plan_model *m);
double dt_plan_active_params(const dt_plan_model *m);
double dt_plan_flops_per_token(const dt_plan_model *m, int T);
/* Pipeline stages (ARCHITECTURE decision 76): the costs per token of the embedding, one layer
 * and the head (dtrain's models: parallel/pp_split.h dt_pp_costs_of of their config; others:
 * the same terms from this model's shape), and the boundaries the one rule of
 * parallel/pp_split.h gives (first has room for pp + 1; 1 <= pp <= n_layer). */
struct dt_pp_costs;
void dt_plan_pp_costs(const dt_plan_model *m, int T, struct dt_pp_costs *out);
void dt_plan_pp_split(const dt_plan_model *m, int T, int pp, int *first);

typedef struct dt_plan_layout {
    int dp, tp, pp, cp, ep; /* gpus = dp tp pp cp; ep divides dp (experts split over dp ranks) */
    dt_strategy zero;       /* DDP (no sharding) or ZeRO-1/2/3 over the dp group */
    int hybrid;             /* ZeRO sharded inside a node, replicated across nodes */
} dt_plan_layout;

/* What to plan: everything but the layout. */
typedef struct dt_plan_job {
    dt_plan_model model;
    dt_train_cfg train;      /* micro_batch, seq_len, precision, recompute, bucket, overlap, grad dtype */
    int gpus;                /* devices in the job */
    int dpn;                 /* devices used per node (hw's devices_per_node, or gpus / --nodes) */
    long global_batch;       /* sequences per optimizer step */
    double train_tokens;     /* whole run (0: none) */
    const dt_hw_accel *hw;
    const dt_hw_link *intra, *inter;
    double gemm_eff, intra_eff, inter_eff; /* achievable fractions of peak */
    const dt_hw_link *tp;    /* tensor parallelism's link inside a node (dt_hw_tp_link); NULL: intra at intra_eff */
    double tp_eff;           /* its achievable fraction (with tp == intra: intra_eff) */
    const dt_hw_link *pp;    /* pipeline stages' point-to-point link inside a node (dt_hw_pp_link); NULL: intra */
    double pp_eff;           /* its achievable fraction (with pp == intra: intra_eff) */
    const dt_hw_link *ep;    /* expert parallelism's all-to-all link inside a node (dt_hw_ep_link); NULL: intra */
    double ep_eff;           /* its achievable fraction (with ep == intra: intra_eff) */
    const dt_hw_link *pp_inter, *ep_inter; /* the same two across nodes (dt_hw_pp_inter_link,
                                              dt_hw_ep_inter_link); NULL: inter at inter_eff */
    double pp_inter_eff, ep_inter_eff;     /* their achievable fractions */
    double tp_overlap;       /* fraction of tensor-parallel communication that may hide behind the
                                micro-step's GEMMs (Megatron --tp-comm-overlap, AsyncTP: 1; default 0) */
    double price_hour, spot_hour;          /* per node ($/h); < 0: no price */
    double attn_peak;        /* the attention core's peak over hw's compute peak (fp8 runs, whose
                                attention core stays in 16 bits: the 16-bit peak over the fp8 one;
                                decision 99); 0: the same peak as the rest */
} dt_plan_job;

/* ---- collectives (plan_time.c) */
typedef enum dt_plan_coll { DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER, DT_COLL_ALLTOALL,
                            DT_COLL_P2P } dt_plan_coll;
typedef struct dt_plan_net {
    double bw_intra, a_intra; /* bytes/s per device (efficiency applied), seconds of latency */
    double bw_inter, a_inter; /* bytes/s per device's share of the node's NICs, latency */
} dt_plan_net;
/* Seconds of one collective of `bytes` (all-reduce, all-to-all: per-rank buffer; reduce-
 * scatter / all-gather: the whole buffer) over a group of k ranks per node on nn nodes, split
 * into the intra- and inter-node parts (hierarchical ring: docs/planner.md). */
double dt_plan_coll_time(dt_plan_coll op, double bytes, int k, int nn, const dt_plan_net *net, double *t_intra,
                         double *t_inter);
/* Ranks per node (k) and nodes (nn) of a group of n ranks at rank stride s, d devices/node. */
void dt_plan_group_span(int n, int stride, int d, int *k, int *nn);
/* The 1F1B pipeline bubble as a fraction of the step: (p - 1) / (m + p - 1). */
double dt_plan_bubble_fraction(int p, int m);
/* One pipeline step's makespan (plan_pipe.c, decision 95): schedule `kind` (a dt_pp_kind that
 * dt_pp_schedule_check accepts for pp, v, m) replayed in time order, each stage running its
 * action list one action at a time as soon as the action's input exists (transfers take no
 * time: the planner prices them apart). f[s], b[s], w[s]: stage s's forward, backward (zb-h1:
 * input-gradient) and weight-gradient (zb-h1; w NULL: none) pass of one chunk at the rate the
 * stage has when every stage is busy. Stages share compute in groups of `group` consecutive
 * stages (time-sliced devices: more ranks than cores; group outside 1..pp: all pp): while n of
 * a group's g stages are busy, each runs min(speedup, g / n) times that rate (speedup 1:
 * dedicated devices, the classic replay). Returns 0 and *makespan; -1 when the lists deadlock;
 * -2 when memory runs out. */
int dt_plan_pp_makespan(int kind, int pp, int v, int m, const double *f, const double *b, const double *w,
                        double speedup, int group, double *makespan);
/* Bytes the optimizer (AdamW) moves per parameter it updates: 12 + g + 12 (+ 2 under 16-bit compute). */
double dt_plan_opt_bytes(const dt_train_cfg *tc);
/* Extra FLOPs per token that activation recomputation costs (docs/planner.md). */
double dt_plan_recompute_flops(const dt_plan_model *m, dt_recompute r, int T);

/* ---- memory (plan_mem.c) */
/* Activation bytes of one layer for one micro-batch of b sequences of s tokens (s already
 * divided by cp), tensor-parallel degree t (sequence parallel), element size e. */
double dt_plan_layer_act_bytes(const dt_plan_model *m, dt_recompute r, double b, double s, int t, int e);

#define DT_PLAN_MAX_COMM 8
typedef struct dt_plan_comm_term {
    char what[32];     /* "dp all-reduce (grads)", ... */
    double bytes;      /* per collective */
    double count;      /* collectives per step */
    double t_intra, t_inter; /* seconds per step on each link level */
    double exposed;    /* seconds per step not hidden behind compute */
} dt_plan_comm_term;

typedef struct dt_plan_result {
    dt_plan_layout lay;
    int dtrain_sizing;               /* memory from dt_trainer_mem_plan (dtrain runs it) */
    int micro_steps;                 /* m: micro-batches per step per pipeline */
    double mem[DT_MEM_NKINDS];       /* bytes per device (the fullest device) */
    double mem_total;
    int fits;                        /* mem_total <= device memory */
    double flops_token, flops_step;  /* model FLOPs (no recompute) */
    double compute_s, recompute_s, bubble_s, comm_s, step_s; /* comm_s: exposed */
    double sliced_s;                 /* <= 0: what time-sliced pipeline stages gain by running faster
                                        while the others sharing their cores idle (decision 95) */
    double overhead_s;               /* step_overhead_us x m + collective_call_us x calls (decision 55) */
    double optimizer_s;              /* opt_params x opt_bytes / optimizer_bw_gbs (decision 56) */
    double opt_params, opt_bytes;    /* parameters this device's optimizer updates; bytes moved per parameter */
    double calls;                    /* collective calls per step (the comm terms' counts) */
    int n_comm;
    dt_plan_comm_term comm[DT_PLAN_MAX_COMM];
    double tokens_s, samples_s, tflops_gpu, mfu, scaling_eff; /* scaling_eff NaN: not defined */
    double usd_1k_samples, usd_1b_tokens, run_hours, usd_run, spot_usd_run; /* NaN: no price */
} dt_plan_result;

/* Checks the layout against the job (product = gpus, divisibility of heads, layers, batch),
 * naming the flag of the first violation. */
dt_status dt_plan_check_layout(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_layout *lay);
/* Memory of the layout's fullest device (plan_mem.c). */
dt_status dt_plan_memory(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_layout *lay, dt_plan_result *r);
/* Time terms, rates and cost (plan_time.c) of layout l; r->micro_steps must be set. */
void dt_plan_time(const dt_plan_job *job, const dt_plan_layout *lay, dt_plan_result *r);
/* Checks, memory, time, scaling efficiency vs one node and cost of one layout. */
dt_status dt_plan_predict(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_layout *lay, dt_plan_result *r);

/* ---- layouts (plan_search.c) */
/* Fixed parts of the layout (0 / -1: enumerate). */
typedef struct dt_plan_fix {
    int tp, pp, cp, ep;
    int zero;   /* -1: every strategy, else a dt_strategy */
    int hybrid; /* -1: both, 0, 1 */
} dt_plan_fix;
/* Every layout that passes the checks, ranked: fitting ones first, by step time (*out is
 * malloc'd; free it). */
dt_status dt_plan_search(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_fix *fix, dt_plan_result **out, int *n);
/* Index of the fastest fitting result and the cheapest ($/1B tokens, else fastest); -1 none. */
void dt_plan_recommend(const dt_plan_result *r, int n, int *fastest, int *cheapest);
/* The command that runs the fastest fitting layout dtrain runs (after the table; `fastest`: the
 * recommendation's index, to say when it differs). */
void dt_plan_print_run(FILE *f, const dt_plan_job *job, const dt_plan_result *r, int n, int fastest);
/* Why dtrain cannot train layout l of job (one line naming the combination), or NULL when it
 * can: the combinations of data, tensor, pipeline, context and expert parallelism the trainer
 * runs (decisions 74, 83, 85, 87-89, 91). */
const char *dt_plan_dtrain_refusal(const dt_plan_job *job, const dt_plan_layout *l);
/* dt_plan_dtrain_refusal(job, l) == NULL */
int dt_plan_dtrain_runs(const dt_plan_job *job, const dt_plan_layout *l);
/* "zero1 dp8 tp1 pp1 cp1 ep1" */
void dt_plan_layout_name(const dt_plan_layout *l, char *buf, size_t n);

/* ---- output (plan_print.c) */
void dt_plan_print_header(FILE *f, const dt_plan_job *job);
void dt_plan_print_table(FILE *f, const dt_plan_job *job, const dt_plan_result *r, int n, int limit);
void dt_plan_print_detail(FILE *f, const dt_plan_job *job, const dt_plan_result *r, const char *title);
/* JSON object of one result / of the job's inputs (cJSON). */
struct cJSON;
struct cJSON *dt_plan_result_json(const dt_plan_job *job, const dt_plan_result *r);
struct cJSON *dt_plan_job_json(const dt_plan_job *job);

#endif
