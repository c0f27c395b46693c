/* What train/run.c and train/run_ckpt.c share: the state of one training run and the
 * checkpoint steps the loop calls (run_ckpt.c: saving, resuming, rolling back). Internal to
 * src/train; the public entry point is train/run.h. */
#ifndef DT_TRAIN_RUN_IMPL_H
#define DT_TRAIN_RUN_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include "ckpt/checkpoint.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "train/metrics.h"
#include "train/prom.h"
#include "train/run.h"
#include "train/straggler.h"
#include "train/trainer.h"
#include "train/tp_ckpt.h"

typedef struct run_state {
    dt_dataset *train_ds, *val_ds;
    dt_sampler *sampler;
    dt_loader *loader;
    dt_val_loader *val;
    dt_trainer tr;
    int tr_live;
    dt_metrics metrics;
    dt_ckpt_saver *saver;
    int ledger_fd;
    uint64_t incarnation;
    double seen;           /* tokens consumed since the start of training, all ranks */
    double train_s;        /* wall time of the steps, over restarts */
    float last_loss;
    double last_save_t;    /* rank 0's clock at the last checkpoint (every_minutes) */
    double step_s_sum;     /* for the stall fraction */
    int last_commit_ok;    /* the latest save was committed */
    long staged_step;      /* step of the save in flight */
    double wd_reported;    /* the auto collective timeout last logged (0: none yet) */
    long hang_step;        /* test aids, read once: DTRAIN_TEST_HANG, DTRAIN_TEST_STEP_DELAY_MS */
    int hang_rank, delay_ms;
    long perturb_step;     /* test aid DTRAIN_TEST_PERTURB */
    int perturb_rank;
    int replica_checks;    /* parallel.check_replicas: checks passed, last hash */
    uint64_t replica_hash;
    dt_prom prom;          /* logging.prometheus */
    dt_straggler strag;    /* logging.straggler_every */
    float recent[20];      /* training.spike_factor: the last finite losses (ring) */
    int rollbacks;         /* training.spike_rollback: done so far */
    int spike_uniform;     /* the spike being handled was against ln(V), not the median */
    int uniform_reported;  /* a stretch of steps above the ln(V) bound has been reported */
    int loaded_strategy_changed, loaded_world, loaded_tp; /* what load_step found */
    char loaded_strategy[32];
    int n_recent;
    double last_commit_t;  /* when a checkpoint was last committed (0: none yet) */
    long replica_step;
    long steps_run;
    long updates, skipped_nonfinite, skipped_overflow; /* this process's steps, by outcome */
    uint64_t base_hash; /* LoRA: XXH3-64 of the frozen base (checkpoints refer to it) */
    uint64_t base_fp;   /* LoRA: its layout-free fingerprint (0: an NF4 base) */
    dt_tp_ckpt tpc;     /* the canonical index space of checkpoints (train/tp_ckpt.h) */
} run_state;

/* checkpoint.dir: the asynchronous saver (rank 0 writes the manifest, every rank its pieces). */
/* Whether the run resumed from a step of its own checkpoint.dir (not another directory's). */
int run_resumed_here(const dt_run_cfg *cfg);
dt_status run_saver_open(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, int world, int rank);
/* Stages step's checkpoint (copies of the state; written in the background). */
dt_status run_save_stage(dt_ctx *ctx, run_state *r, dt_comm *comm, const dt_run_cfg *cfg, long step, int world);
/* Commits the save in flight, if any (waits for it). */
dt_status run_save_commit(dt_ctx *ctx, run_state *r, dt_comm *comm, const dt_run_cfg *cfg);
/* checkpoint.resume: loads the newest intact step (*found = 0: nothing to resume, auto). */
dt_status run_resume(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, dt_comm *comm, int world, long *start,
                     int *found);
/* training.spike_rollback: back to the newest checkpoint before step, past the spike's batches. */
dt_status run_rollback(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, dt_comm *comm, int world, long step,
                       float loss, double median, long *s, int *rolled);

#endif
