/* plan_emit.h - `dtrain plan ... --emit slurm|mpirun|k8s`: the plan's recommended layout as a
 * job file for a cluster (cmd_plan_emit.c; docs/launch.md "Job files", decision 64).
 *
 *   dt_plan_emit_opts e; dt_plan_emit_defaults(&e);
 *   r = dt_plan_emit_flag(ctx, &e, argc, argv, &i);      // inside the plan's flag handler
 *   DT_CHECK(dt_plan_emit_check(ctx, &e));               // before planning
 *   DT_CHECK(dt_plan_emit(ctx, &e, &rc, &job, results, n, argc, argv, used));
 *
 * Every job runs `dtrain launch --max-restarts K -- train CONFIG FLAGS...`: the config and the
 * run flags given to plan, then the layout's keys (parallel.strategy, parallel.hybrid,
 * training.batch), checkpoint.dir and checkpoint.resume=auto. */
#ifndef DT_PLAN_EMIT_H
#define DT_PLAN_EMIT_H

#include "core/status.h"
#include "plan/plan.h"
#include "train/keys.h"

typedef enum dt_emit_kind { DT_EMIT_NONE, DT_EMIT_SLURM, DT_EMIT_MPIRUN, DT_EMIT_K8S } dt_emit_kind;

typedef struct dt_plan_emit_opts {
    dt_emit_kind kind;
    const char *out;           /* --emit-out FILE; NULL: stdout (the plan's tables are then not printed) */
    const char *name;          /* --job-name (default "dtrain") */
    const char *partition, *time, *account; /* Slurm: --partition, --time, --account (optional) */
    int cpus_per_task;         /* --cpus-per-task (default 1): OpenMP threads of each rank */
    int max_restarts;          /* --max-restarts: the supervisor's restart budget (default 3) */
    int signal_s;              /* --signal-time: Slurm's warning before the time limit, s (120) */
    const char *hosts;         /* mpirun: --hosts a,b,... (one per node) */
    const char *hostfile;      /* mpirun: --hostfile FILE (instead of --hosts) */
    const char *image, *pvc;   /* k8s: --image IMAGE, --pvc CLAIM (holds checkpoint.dir) */
    const char *dtrain;        /* --dtrain PATH: the binary the job runs (default: this one) */
    const char *first_flag;    /* the first of these flags given (they need --emit) */
} dt_plan_emit_opts;

void dt_plan_emit_defaults(dt_plan_emit_opts *e);
/* 1: argv[*i] (and its value) was an emit flag; 0: not one; -1: bad value (ctx->err set). */
int dt_plan_emit_flag(dt_ctx *ctx, dt_plan_emit_opts *e, int argc, char **argv, int *i);
/* The flags' values against each other and the kind (one line naming the flag). */
dt_status dt_plan_emit_check(dt_ctx *ctx, const dt_plan_emit_opts *e);
/* Picks the fastest fitting layout dtrain runs from r[0..n) and writes the job file.
 * argv/argc: plan's arguments (flag aliases already renamed); used[i] != 0 marks those that
 * were plan's own flags or their values: the rest (the config file and run flags) go to train. */
dt_status dt_plan_emit(dt_ctx *ctx, const dt_plan_emit_opts *e, const dt_run_cfg *rc, const dt_plan_job *job,
                       const dt_plan_result *r, int n, int argc, char **argv, const unsigned char *used);

#endif
