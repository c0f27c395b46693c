/* metrics.h - what a run reports while it trains: a JSONL file (one object per logged step
 * or evaluation; keys in docs/FORMATS.md), and on the console either one live status line
 * (a terminal) or plain log lines.
 *
 *   dt_metrics m; DT_CHECK(dt_metrics_open(ctx, &m, "runs/metrics.jsonl", DT_PROGRESS_AUTO, total, 0));
 *   dt_metrics_step(ctx, &m, &rec);   dt_metrics_eval(ctx, &m, step, val_loss, tokens, acc);
 *   dt_metrics_close(&m);
 */
#ifndef DT_METRICS_H
#define DT_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef enum dt_progress { DT_PROGRESS_AUTO, DT_PROGRESS_BAR, DT_PROGRESS_LINES } dt_progress;

typedef struct dt_metrics {
    FILE *jsonl;       /* NULL: no file */
    int bar;           /* live status line on stdout */
    int bar_dirty;     /* the status line is showing and must be cleared before a log line */
    long total_steps;
    double t_start;
    int mfu_warned;    /* a step ran faster than the peak: said once */
} dt_metrics;

/* Model FLOPs utilisation of a rank running flops_per_token x tokens_per_s_rank against a peak
 * (GFLOP/s): NaN when unknown, i.e. without a peak or when the rate exceeds the peak (the peak
 * was measured on a busy machine or given too low). Never above 1. */
double dt_train_mfu(double flops_per_token, double tokens_per_s_rank, double peak_gflops);

struct dt_step_stats;
typedef struct dt_step_record {
    long step;          /* 1-based */
    float loss, lr, grad_norm;
    double step_s;      /* wall time of the step */
    double tokens;      /* tokens in this step (all ranks) */
    double tokens_seen; /* since the start of training */
    double flops_per_token;
    double peak_gflops; /* 0: MFU not reported */
    int skipped;        /* the update was skipped: 1 non-finite (training.nonfinite=skip),
                           2 loss-scaled gradients overflowed */
    float loss_scale;   /* of the step (1 = none: not reported) */
    const struct dt_step_stats *stats; /* (optional, train/trainer.h) the step's: a mixture of
                                          experts' losses and dropped choices */
} dt_step_record;

/* append: a resumed run adds to the file (readers keep the last record of each step). */
dt_status dt_metrics_open(dt_ctx *ctx, dt_metrics *m, const char *path, dt_progress mode,
                          long total_steps, int append);
/* Records a logged step: a JSONL object and a console line/status. */
dt_status dt_metrics_step(dt_ctx *ctx, dt_metrics *m, const dt_step_record *r);
/* Records a straggler: rank's mean compute time per step over steps [from, step] against the
 * median of the other ranks (a JSONL record and a warning). */
dt_status dt_metrics_straggler(dt_ctx *ctx, dt_metrics *m, long step, long from, int rank, double compute_ms,
                               double others_ms);
/* Records a loss spike: the step's loss against ref, the median of the previous steps, or
 * (uniform_of = V > 0: fewer than 20 steps to take a median of) ln(V), the loss of uniform
 * guessing over V tokens or classes. */
dt_status dt_metrics_spike(dt_ctx *ctx, dt_metrics *m, long step, double loss, double ref, int uniform_of);
/* training.spike_rollback went from `step` back to checkpoint step `to`, skipping `skipped`
 * samples: a log line and a record (ref as for the spike: uniform = against ln(V)). */
dt_status dt_metrics_rollback(dt_ctx *ctx, dt_metrics *m, long step, double loss, double ref, int uniform, long to,
                              uint64_t skipped);
/* fault.collective_timeout auto chose (or changed) the timeout: a log line and a record. */
dt_status dt_metrics_watchdog(dt_ctx *ctx, dt_metrics *m, long step, double timeout_s, double slowest_s);
/* Records a validation pass. */
/* val_acc: top-1 accuracy of a classifier (NaN: none; left out of the record). */
dt_status dt_metrics_eval(dt_ctx *ctx, dt_metrics *m, long step, double val_loss, double val_tokens,
                          double val_acc);
/* A plain message that must not be overwritten by the status line. */
void dt_metrics_note(const dt_ctx *ctx, dt_metrics *m, const char *msg);
void dt_metrics_close(dt_metrics *m);

dt_status dt_progress_parse(dt_ctx *ctx, const char *s, dt_progress *out);

#endif
