/* report.h - `dtrain report`: reads benchmark result files (schema dtrain-bench/1, one JSON
 * object per file, docs/FORMATS.md), derives scaling efficiency and recommendations from the
 * numbers, and writes one self-contained HTML page (inline CSS, inline SVG charts, no script,
 * no external requests).
 *
 *   dt_report *r;
 *   DT_CHECK(dt_report_load(ctx, paths, n, &r));     // bad file => message names file and key
 *   dt_report_analyze(r, 0);                          // efficiency + recommendations
 *   DT_CHECK(dt_report_write_html(ctx, r, "report.html"));
 *   dt_report_free(r);
 */
#ifndef DT_REPORT_H
#define DT_REPORT_H

#include <stdio.h>

#include "core/status.h"

typedef struct cJSON cJSON;

/* mean, std, min, median, max of a measured quantity */
typedef struct dt_rep_stat {
    double mean, std, min, median, max;
} dt_rep_stat;

enum { DT_REP_BD_FORWARD, DT_REP_BD_BACKWARD, DT_REP_BD_OPTIMIZER, DT_REP_BD_COMM, DT_REP_BD_DATA,
       DT_REP_BD_IDLE, DT_REP_BD_N };
enum { DT_REP_MEM_PARAMS, DT_REP_MEM_GRADS, DT_REP_MEM_OPTIMIZER, DT_REP_MEM_ACTIVATIONS,
       DT_REP_MEM_COMM, DT_REP_MEM_OTHER, DT_REP_MEM_N };
extern const char *const dt_rep_breakdown_keys[DT_REP_BD_N];
extern const char *const dt_rep_mem_keys[DT_REP_MEM_N];

typedef struct dt_rep_mem {
    int rank;
    double bytes[DT_REP_MEM_N];
    double rss;
    double plan; /* the memory plan (dt_trainer_mem_plan); -1 in files older than it */
} dt_rep_mem;

typedef struct dt_rep_cost {
    const char *instance;
    double price_hour, spot_hour, usd_per_1k_samples, usd_per_1b_tokens, hours_to_train,
        usd_to_train, spot_usd_to_train;
} dt_rep_cost;

typedef struct dt_rep_repeat {
    int nsteps, nloss;
    double *step_s, *loss;
    const char *loss_hash;
} dt_rep_repeat;

/* Environment strings point into the file's JSON (NULL when absent). */
typedef struct dt_rep_env {
    const char *host, *cpu_model, *mpi, *onednn, *compiler;
    int cores, threads, ranks, nodes;
} dt_rep_env;

/* One kind=train file. Strings point into the file's JSON tree, owned by the report. */
typedef struct dt_rep_train {
    const char *file, *date, *version;
    char label[96]; /* "R1 ddp x2 mb8" */
    char argv[512]; /* argv joined with spaces (truncated) */
    dt_rep_env env;
    const cJSON *config; /* the "config" object (may be NULL) */
    const char *preset;
    int n_layer, d_model, n_head, vocab, seq_len;
    int n_classes; /* config's model.n_classes: > 0 for image classifiers (a sample = an image) */
    double params;
    /* model.trainable_params (files of earlier versions lack it: params); a LoRA run's
     * "LoRA r16, nf4" from model.lora, else "" */
    double trainable;
    char lora[48];
    int world, hybrid, overlap, micro_batch, accum, global_batch;
    const char *strategy;
    /* The layout (files of earlier versions lack the keys: tp 1, dp = world, no sequence
     * parallelism): parallel.tp and parallel.dp; config's parallel.sequence_parallel and
     * parallel.tp_blocks (the blocks test mode: every shard in each process). */
    int tp, dp, sp, tp_blocks;
    /* summary.tp_comm_s and summary.tp_bytes_step: tensor parallelism's collectives per step
     * (all exposed) and rank 0's bytes into them; 0 in files of earlier versions */
    double tp_comm_s, tp_bytes_step;
    /* From config (files of earlier versions lack the keys: "fp32"): "bf16", "bf16, ckpt
     * full/2, grads bf16" - training.precision, memory.activation_checkpointing(_every),
     * parallel.grad_dtype where not the default, parallel.compression_ratio under Top-K. */
    char precision[64];
    double bucket_bytes;
    double peak_gflops, flops_per_token; /* NaN when null */
    const char *peak_source, *mfu_formula;
    int warmup, steps, repeats;
    int nrep;
    dt_rep_repeat *rep;
    dt_rep_stat step_s, samples_per_s, tokens_per_s, tokens_per_s_rank, tflops_rank, mfu;
    double comm_total_s, comm_exposed_s, comm_overhead, comm_bytes_step;
    double breakdown[DT_REP_BD_N];
    double loss_avg, loss_final;
    const char *loss_hash;
    int nmem;
    dt_rep_mem *mem;
    int ncompute;             /* "ranks" (optional): compute ms per step of each rank */
    double *compute_ms;
    double straggler_factor;  /* config's logging.straggler_factor (1.5 when absent) */
    int ncost;
    dt_rep_cost *cost;
    /* a mixture of experts (the optional "moe" object; NULL / 0 otherwise): the mean expert
     * load per layer and expert over the timed steps (moe_layers x moe_experts) and its max/mean */
    double *moe_load;
    int moe_layers, moe_experts;
    double moe_max_mean;
    int has_sweep;
    const char *sweep_id;
    double weak_eff, strong_eff; /* from the file; NaN when null or absent */
    /* filled by dt_report_analyze */
    double weak_calc, strong_calc; /* computed against a 1-rank baseline; NaN when none */
    int weak_base, strong_base;    /* index of that baseline run, -1 when none */
} dt_rep_train;

typedef struct dt_rep_comm_row {
    const char *op;
    double bytes, time_us, algbw_gbs, busbw_gbs;
    long long wrong;
} dt_rep_comm_row;

/* One kind=comm file. */
typedef struct dt_rep_comm {
    const char *file;
    dt_rep_env env;
    int ranks;
    int nrows;
    dt_rep_comm_row *rows;
} dt_rep_comm;

/* One layout of a plan file (dtrain plan --json, schema dtrain-plan/1; docs/FORMATS.md). */
typedef struct dt_rep_plan_layout {
    const char *layout, *strategy; /* "ddp dp2 tp1 pp1 cp1 ep1", "ddp" */
    int gpus, hybrid, dp, tp, pp, micro_steps, fits;
    double mem[DT_REP_MEM_N], mem_total; /* bytes per device, the fullest one */
    double step_s, compute_s, recompute_s, bubble_s, comm_exposed_s, tokens_per_s, tflops_per_gpu, mfu,
        scaling_eff, usd_per_1k_samples; /* NaN where the file has null */
    double overhead_s;                    /* the calibrated fixed cost (0: a plan file without it) */
    double optimizer_s;                   /* the optimizer step (0: a plan file without it, decision 56) */
    int fastest, cheapest;                /* the plan's recommendations */
} dt_rep_plan_layout;

/* One kind=plan file: the job and its layouts (a --sweep file: one layout per size). */
typedef struct dt_rep_plan {
    const char *file, *model, *hardware, *precision, *checkpointing;
    int sp; /* job.sequence_parallel (plans written before it: 0) */
    int n_layer, d_model, n_head, micro_batch, seq_len, gpus;
    double params, peak_tflops, eff_gemm, eff_intra, eff_inter;
    int nlay;
    dt_rep_plan_layout *lay;
} dt_rep_plan;

/* A measured run and the plan layout that describes it (same model shape, world, strategy,
 * micro-batch, accumulation, sequence length and precision): dt_report_match_plans. */
typedef struct dt_rep_plan_match {
    int train;               /* index into r->train */
    int plan, layout;        /* indices into r->plan and its lay */
    double step_err, mem_err; /* predicted / measured - 1 (memory: the fullest rank's plan
                                 against the largest rank's allocator peak) */
} dt_rep_plan_match;

typedef enum dt_rep_level {
    DT_REP_RECOMMEND, /* a recommendation backed by measured numbers */
    DT_REP_INFO,      /* a fact worth knowing, no action */
    DT_REP_WARNING,   /* something is wrong (e.g. losses that should match do not) */
    DT_REP_NODATA,    /* not enough data to recommend anything on this topic */
} dt_rep_level;

typedef enum dt_rep_topic {
    DT_REP_TOPIC_STRATEGY,
    DT_REP_TOPIC_BUCKET,
    DT_REP_TOPIC_MICROBATCH,
    DT_REP_TOPIC_LOSS,
    DT_REP_TOPIC_N
} dt_rep_topic;

typedef struct dt_rep_rec {
    dt_rep_topic topic;
    dt_rep_level level;
    char text[768];
} dt_rep_rec;

typedef struct dt_report {
    int ntrain, ncomm, nplan;
    dt_rep_train *train;
    dt_rep_comm *comm;
    dt_rep_plan *plan;
    int nrec, caprec;
    dt_rep_rec *rec;
    cJSON **roots; /* one parsed tree per file; strings above point into them */
    char **names;  /* the file names */
    int nroots;
} dt_report;

/* Reads and validates the files (kind train or comm; or schema dtrain-plan/1, kind plan). A missing file, invalid JSON, another
 * schema or a missing/mistyped key fails with a one-line message naming the file and the key
 * path (DT_ERR_IO for an unreadable file, DT_ERR_FORMAT otherwise). */
dt_status dt_report_load(dt_ctx *ctx, const char *const *paths, int n, dt_report **out);
/* Parses one file's text (for tests; `name` is used in messages). */
dt_status dt_report_add_text(dt_ctx *ctx, dt_report *r, const char *name, const char *text);
dt_report *dt_report_new(void);
void dt_report_free(dt_report *r);

/* Computes efficiencies against 1-rank baselines and the recommendations. mem_budget: bytes a
 * rank may use (0 = unknown), used by the strategy and micro-batch advice. */
void dt_report_analyze(dt_report *r, double mem_budget);

/* Tracked peak bytes of run t: the largest rank's sum of params+grads+optimizer+activations+
 * other; model state only (params+grads+optimizer) when model_only. */
double dt_report_peak_bytes(const dt_rep_train *t, int model_only);
/* Largest RSS over the ranks of run t (0 when absent). */
double dt_report_peak_rss(const dt_rep_train *t);
/* The largest per-rank memory plan (-1: the files have none). */
double dt_report_peak_plan(const dt_rep_train *t);

/* The measured runs a plan layout describes (at most max, in run order; returns the count):
 * for each run the first layout, over the plan files in order, of the same model (n_layer,
 * d_model, n_head and parameter count: gpt2 and llama of one shape differ in it), sequence length, micro-batch, accumulation (micro_steps), world (gpus),
 * layout (the run's tp and dp, pp = 1; sequence parallelism on in both or neither), strategy
 * and hybrid flag, and precision (the first word of the run's). A run of the blocks test mode
 * (parallel.tp_blocks) matches none. */
int dt_report_match_plans(const dt_report *r, dt_rep_plan_match *out, int max);

/* Writes the page to `path` (atomically: a temporary file renamed into place). */
dt_status dt_report_write_html(dt_ctx *ctx, const dt_report *r, const char *path);
/* Writes the page to an open stream. */
void dt_report_html(FILE *f, const dt_report *r);

/* Formatting shared by tables, charts and recommendations:
 * 3 significant digits with an SI suffix (1234567 -> "1.23M", 0.5 -> "0.5", 12 -> "12"). */
void dt_report_fmt_num(char *buf, size_t n, double v);
/* Binary units with 3 significant digits: 1536 -> "1.5 KiB", 3<<20 -> "3 MiB". */
void dt_report_fmt_bytes(char *buf, size_t n, double v);

#endif
