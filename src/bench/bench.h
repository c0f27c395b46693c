/* bench.h - measuring dtrain: the matmul peak the MFU is relative to, one benchmark run
 * (warm-up steps, timed steps, per-step times and losses, breakdown, memory), and the suite
 * of repeated runs reduced to statistics on rank 0 (DESIGN.md section 8).
 *
 *   dt_peak pk; dt_bench_peak(&pk, DT_F32, 2048, 5);
 *   dt_bench_suite s; DT_CHECK(dt_bench_suite_run(ctx, &cfg, comm, &opts, &s));
 *   ... s.step_s.mean, s.mfu.median, s.mem[rank * DT_BENCH_MEM_N + DT_BENCH_MEM_RSS] ...
 *   dt_bench_suite_free(&s);
 */
#ifndef DT_BENCH_H
#define DT_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "model/model.h"
#include "train/trainer.h"

typedef struct dt_peak {
    int n;          /* square matrix size */
    int reps;
    double gflops;  /* median over reps */
    double best;    /* best rep */
} dt_peak;

/* GEMM rate on n x n x n with the current OpenMP threads, in the matmul dtype of training
 * precision dt: oneDNN sgemm for DT_F32, the 16-bit GEMM (native or widened) otherwise: the
 * peak that MFU is relative to. */
void dt_bench_peak(dt_peak *out, dt_dtype dt, int n, int reps);

/* Five-number summary of a sample. std is the sample standard deviation (n - 1; 0 for one
 * value); median averages the middle two of an even count. All 0 for n = 0. */
typedef struct dt_stats {
    double mean, std, min, median, max;
} dt_stats;
void dt_stats_of(dt_stats *out, const double *x, int n);
/* Median of x[0..n) (sorts a copy). */
double dt_median(const double *x, int n);

/* Model FLOPs utilisation (a fraction): flops_per_token x tokens/s of one rank over that
 * rank's peak (GFLOP/s); 0 without a peak. */
double dt_bench_mfu(double flops_per_token, double tokens_per_s_rank, double peak_gflops);

/* FNV-1a (64-bit) over the bit patterns of the losses, in order: equal hashes mean bitwise
 * equal loss curves. */
uint64_t dt_bench_loss_hash(const float *loss, int n);

/* Peak resident set size of this process (VmHWM of /proc/self/status) in bytes; 0 if unknown. */
size_t dt_bench_rss_hwm(void);

#define DT_BENCH_MAX_STEPS 10000

/* One run: a fresh trainer, warmup + steps optimizer steps; times are rank-local. */
typedef struct dt_bench_result {
    int warmup, steps;
    double step_s[DT_BENCH_MAX_STEPS]; /* timed steps */
    float loss[DT_BENCH_MAX_STEPS];
    double median_s, min_s, max_s, mean_s, std_s;
    double tokens_per_s;
    double flops_per_token;
    double achieved_gflops;
    dt_model_prof prof;          /* summed over the timed steps */
    double optim_s;             /* clip + AdamW, summed over timed steps */
    double sync_s;              /* waiting for gradient reduction, summed over timed steps */
    /* the step split into parts (dt_step_stats), summed over the timed steps */
    double fwd_s, bwd_s, opt_s, data_s, exposed_s;
    size_t mem_peak[DT_MEM_NKINDS];
    size_t n_params;            /* without padding */
    size_t n_trainable;         /* parameters the optimizer updates: n_params, or the LoRA adapters' */
    unsigned long long loss_hash; /* dt_bench_loss_hash of the timed losses: a verification column */
    int world;                  /* ranks */
    double tokens_per_s_rank;   /* per rank */
    double comm_exposed_s, comm_total_s; /* per timed step (mean): waited for / spent in collectives */
    double comm_bytes_step;     /* bytes this rank sent into collectives per step */
    double ep_s, ep_bytes_step; /* per timed step: expert parallelism's all-to-alls (exposed) and
                                   the bytes this rank sent into them (0 without EP ranks) */
    double cp_s, cp_bytes_step; /* per timed step: context parallelism's ring waits (exposed) and
                                   the bytes this rank sent around the ring (0 without CP ranks) */
    double tp_s, tp_bytes_step; /* per timed step: tensor parallelism's collectives (all exposed)
                                   and the bytes this rank sent into them (0 without TP ranks) */
    double comm_predicted_s;    /* per step: the cost model's prediction of comm_total_s (-1: no
                                   parallel.comm_model) */
    /* pipeline parallelism (parallel.pp > 1; bench_pp.c): this rank's stage, and per timed step
     * (mean) the stage's transfers (dt_step_stats pp_seconds, pp_bytes, pp_idle) and the wall
     * time of its schedule's passes (pp_span) */
    int pp_stage;
    double pp_s, pp_bytes_step, pp_idle_s, pp_span_s;
    double pp_wgrad_s; /* of bwd_s: zb-h1's weight-gradient passes (a sum over timed steps, as bwd_s) */
    /* a mixture of experts (dt_step_stats moe_load; NULL otherwise): the expert load
     * (moe_layers x moe_experts, malloc'd: dt_bench_suite_free) and its max/mean, the dropped
     * choices, the aux and z-losses, each summed over the timed steps */
    double *moe_load;
    int moe_layers, moe_experts;
    double moe_max_mean, moe_dropped, moe_aux, moe_z;
} dt_bench_result;

/* Runs warmup + steps optimizer steps of cfg on the ranks of comm (NULL: one process) and
 * fills r; tokens/s counts all ranks. With `trace`, the timed steps are recorded by the
 * trace recorder (core/trace.h), which the caller enabled. */
dt_status dt_bench_train(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm, int warmup,
                         int steps, int trace, dt_bench_result *r);

/* Memory columns per rank, in bytes: allocator high-water by kind (communication buffers as
 * "comm"; tables, views and staging as "other"), their total, the memory plan's
 * total (dt_trainer_mem_plan: equal to the total), and the process's VmHWM. */
enum { DT_BENCH_MEM_PARAMS, DT_BENCH_MEM_GRADS, DT_BENCH_MEM_OPTIM, DT_BENCH_MEM_ACTS,
       DT_BENCH_MEM_COMM, DT_BENCH_MEM_OTHER, DT_BENCH_MEM_TOTAL, DT_BENCH_MEM_PLAN, DT_BENCH_MEM_RSS,
       DT_BENCH_MEM_N };
extern const char *const dt_bench_mem_names[DT_BENCH_MEM_N];

/* Per rank of a pipeline, per timed step (means over every timed step of every repeat; s):
 * its stage, its step, forward and backward compute (without the waits inside), busy =
 * forward + backward + optimizer + data (the rank's own work), idle = waiting in receives for
 * a neighbour's activations or gradients (the bubble), the transfers (waits for sends
 * included) and the bytes sent, and the span of its schedule's passes. */
enum { DT_BENCH_PP_STAGE, DT_BENCH_PP_STEP, DT_BENCH_PP_FWD, DT_BENCH_PP_BWD, DT_BENCH_PP_BUSY, DT_BENCH_PP_IDLE,
       DT_BENCH_PP_P2P, DT_BENCH_PP_BYTES, DT_BENCH_PP_SPAN, DT_BENCH_PP_WGRAD, DT_BENCH_PP_N };

/* The pipeline's view (ARCHITECTURE decision 77): every rank's columns (rank 0 has all) and the
 * schedule replay: the measured mean forward and backward of one micro-batch on each stage
 * (the mean over the stage's ranks of forward / m, backward / m) replayed through the
 * configured schedule (pp_schedule.h dt_pp_replay, transfers taking no time) give each stage's
 * idle fraction of the replayed span; beside it the textbook (p-1)/(m+p-1) and the measured
 * idle / span. Fractions are means over the stages (measured: over the ranks). */
typedef struct dt_bench_pp {
    int n, kind, v, m;           /* stages (1: no pipeline), schedule (dt_pp_kind), virtual stages, micro-batches */
    double *rank;                /* [world x DT_BENCH_PP_N] */
    double *f, *b, *w;           /* [n] per micro-batch, s: the replay's durations (w: zb-h1's W) */
    double *replay_idle;         /* [n] each stage's replayed idle fraction */
    double replay_makespan_s;    /* the replayed span of one step's passes */
    double replay_frac, textbook_frac, measured_frac;
    int replay_rc;               /* dt_pp_replay's return (0: replayed) */
} dt_bench_pp;

typedef struct dt_bench_opts {
    int warmup, steps, repeats;
    double peak_gflops;    /* per rank; the MFU reference */
    int trace;             /* record the timed steps of the first repeat */
    double straggler_factor; /* logging.straggler_factor: a rank this much slower is named */
} dt_bench_opts;

/* The suite: `repeats` runs of the same configuration and seed, reduced on rank 0. Step
 * statistics pool every timed step of every repeat; rates are per step (global = all ranks,
 * _rank = one rank's share). */
typedef struct dt_bench_suite {
    dt_bench_opts opts;
    int world, nodes;
    int machine_ranks;          /* ranks on rank 0's machine (the same kernel boot id: simulated nodes
                                   share one), who share its cores */
    dt_bench_result *runs;      /* [repeats], this rank's measurements */
    long tokens_step, samples_step; /* global, per optimizer step */
    double flops_per_token;     /* 6 N + 12 L T d */
    size_t n_params;
    size_t n_trainable;         /* n_params, or the LoRA adapters' (lora.rank > 0) */
    dt_stats step_s, samples_per_s, tokens_per_s, tokens_per_s_rank, tflops_rank, mfu;
    double mfu_over_gflops;     /* > 0: the fastest step ran at this rate per rank, above the peak: MFU
                                   is unknown (null), never shown above 100% */
    dt_stats run_mean_s;        /* the repeats' mean step times */
    double comm_total_s, comm_exposed_s, comm_bytes_step; /* per step, mean over repeats */
    int tp, dp;                 /* the layout: tensor-parallel degree (1: none) and data-parallel ranks */
    double tp_s, tp_bytes_step; /* tensor parallelism's collectives per step, mean over repeats */
    double cp_s, cp_bytes_step; /* context parallelism's ring waits and bytes per step, mean over repeats */
    double ep_s, ep_bytes_step; /* expert parallelism's all-to-alls and bytes per step, mean over repeats */
    int cp;                     /* context-parallel degree (1: none) */
    double *attn_ms, *cp_wait_ms; /* [world] per timed step: the attention's time (the ring's waits
                                     inside it) and the ring's waits */
    double comm_predicted_s;    /* per step, mean over repeats (-1: no cost model) */
    /* per step, mean over all timed steps; adds up to step_s.mean */
    double bd_forward, bd_backward, bd_optimizer, bd_comm, bd_data, bd_idle;
    double loss_avg, loss_final;
    /* a mixture of experts (runs[].moe_load non-NULL): means over every timed step of every
     * repeat of the expert load (moe_layers x moe_experts, malloc'd), of its max/mean, of the
     * dropped choices and of the aux and z-losses (dt_step_stats) */
    double *moe_load;
    int moe_layers, moe_experts;
    double moe_max_mean, moe_dropped, moe_aux, moe_z;
    unsigned long long loss_hash; /* of the first repeat */
    int hash_mismatch;            /* repeats whose hash differs from the first's */
    int64_t *mem;                 /* [world x DT_BENCH_MEM_N], every rank's (rank 0 has all) */
    double *compute_ms;           /* [world] mean forward + backward + optimizer per timed step */
    double *exposed_ms;           /* [world] mean exposed communication (waits) per timed step */
    double comm_exposed_min_s;    /* the least-waiting rank's exposed communication per step: the
                                     collectives' own cost; the others' extra waits are imbalance */
    dt_bench_pp pp;               /* the pipeline's measurements (pp.n = 1: none; bench_pp.c) */
} dt_bench_suite;

/* Runs the suite on every rank of comm; rank 0 ends up with every rank's memory columns. */
dt_status dt_bench_suite_run(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm,
                             const dt_bench_opts *o, dt_bench_suite *s);
void dt_bench_suite_free(dt_bench_suite *s);

/* The pipeline's columns of every rank gathered (all ranks call it) and the replay (bench_pp.c);
 * nothing without a pipeline. */
dt_status dt_bench_pp_gather(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm, dt_bench_suite *s);
/* Its table and the replay line (rank 0; nothing without a pipeline). */
void dt_bench_pp_print(FILE *f, const dt_bench_suite *s);

/* Fixed-width tables (rank 0): per-repeat rows, statistics, kernel and step breakdown,
 * communication, memory per rank, and the Training Summary block. */
void dt_bench_suite_print(FILE *f, const dt_bench_suite *s, const dt_train_cfg *cfg,
                          const char *peak_source, int threads);

#endif
