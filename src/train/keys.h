/* keys.h - the table of configuration keys ("section.name") of a run: the one place that
 * says which keys exist, their types, defaults and help. The YAML loader, --set and the
 * flags all go through dt_cfg_set; docs/config.md is generated from dt_cfg_print_keys.
 *
 *   dt_run_cfg c; dt_run_cfg_defaults(&c);
 *   DT_CHECK(dt_cfg_set(ctx, &c, "model.n_layer", "12"));
 *   DT_CHECK(dt_cfg_finish(ctx, &c));   // applies the preset, validates, derives
 */
#ifndef DT_KEYS_H
#define DT_KEYS_H

#include <stdio.h>

#include "parallel/pp_split.h"
#include "train/trainer.h"

#define DT_PATH_MAX 4096

/* A list-valued key's integers (parallel.pp_layers): n of them, 0 = unset. */
typedef struct dt_cfg_ints {
    int n;
    int v[DT_PP_MAX];
} dt_cfg_ints;

/* A run's configuration: the trainer's part plus data, logging, checkpoint and runtime. */
typedef struct dt_run_cfg {
    dt_train_cfg train;
    /* data */
    char data_train[DT_PATH_MAX], data_val[DT_PATH_MAX];
    char data_format[16]; /* auto | llmc | raw16 */
    int data_shuffle;
    char tokenizer[16];   /* byte | gpt2 | hf: recorded in checkpoints so `sample` decodes right */
    char ledger[DT_PATH_MAX]; /* test aid: per-rank ledger of consumed sample ids */
    char init_from[DT_PATH_MAX]; /* initial weights (model file, checkpoint, llm.c .bin) */
    /* training */
    long tokens;          /* if > 0: steps = ceil(tokens / tokens per step) */
    int global_batch;     /* training.batch: if > 0, grad_accum = batch / (micro_batch x ranks) */
    int eval_interval;    /* steps between validation passes (0 = off) */
    int eval_batches;     /* micro-batches per validation pass */
    char nonfinite[8];    /* stop | skip */
    char precision[8];    /* training.precision: fp32 | bf16 | fp16 */
    char recompute[16];   /* memory.activation_checkpointing: none | selective | full */
    char lora_targets[64]; /* lora.targets: comma list of q,k,v,o,gate,up,down */
    char lora_base[8];    /* lora.base_dtype: fp32 | nf4 */
    float spike_factor;   /* loss above this x the median of the last 20: a spike (0 = off) */
    int spike_rollback;        /* rollbacks allowed on a loss spike (0 = off) */
    /* logging */
    int log_every;
    char metrics[DT_PATH_MAX]; /* JSONL metrics file */
    char progress[16];         /* auto | bar | lines */
    char trace[DT_PATH_MAX];   /* Chrome trace file ('' = off) */
    char prometheus[DT_PATH_MAX]; /* node-exporter textfile ('' = off) */
    int prometheus_every;      /* steps between writes */
    int straggler_every;       /* steps between straggler checks (0 = off) */
    float straggler_factor;    /* slower than this x the others' median: a straggler */
    float peak_gflops;         /* MFU reference; 0 = measure at start */
    /* checkpoint */
    char ckpt_dir[DT_PATH_MAX];
    long ckpt_every;           /* steps between checkpoints (0 = only at the end) */
    float ckpt_minutes;        /* also after this many minutes (0 = off) */
    int ckpt_keep;             /* committed checkpoints kept (0 = all) */
    int ckpt_async;            /* write on a background thread */
    int ckpt_max_failures;     /* consecutive failed saves before stopping */
    char resume[DT_PATH_MAX];  /* '' | latest | auto | a directory */
    /* fault tolerance */
    float coll_timeout;        /* collective watchdog, seconds (0 = off; -1 = auto) */
    float loss_scale;          /* training.loss_scale (-1 = auto) */
    float preempt_grace;       /* seconds from a preemption signal to the exit */
    /* parallel */
    char strategy[16];
    float bucket_mb;           /* parallel.bucket_mb (-1 = auto: from comm_model) */
    char comm_model[DT_PATH_MAX]; /* parallel.comm_model */
    int overlap;
    char grad_dtype[8];        /* parallel.grad_dtype: fp32 | bf16 | fp16 (what gradients travel as) */
    char allreduce[16];        /* parallel.allreduce: auto | flat | hierarchical */
    char compression[8];       /* parallel.compression: none | topk */
    float compression_ratio;   /* parallel.compression_ratio: part of each block Top-K sends */
    long compression_warmup;   /* parallel.compression_warmup: dense steps before Top-K */
    char compression_adam[8];  /* parallel.compression_adam: age | plain */
    char zero_reduce[8];       /* parallel.zero_reduce: auto | step | micro */
    char zero3_gather[8];      /* parallel.zero3_gather: auto | step | use */
    int shm;                   /* parallel.shared_memory */
    int hybrid;
    int check_replicas;        /* compare every rank's parameter hash every N steps (0 = off) */
    int tp, cp, pp, ep;        /* the process mesh's degrees (parallel/mesh.h; keys_layout.c: what composes) */
    char cp_split[16];         /* parallel.cp_split: balanced | contiguous */
    char moe_aux_type[8];      /* training.moe_aux_loss_type: global | layer */
    char cp_comm[16];          /* parallel.cp_comm: p2p | all_gather */
    char pp_schedule[16];      /* parallel.pp_schedule: 1f1b | gpipe | interleaved | zb-h1 */
    int pp_virtual;            /* parallel.pp_virtual: virtual stages per rank (interleaved) */
    int pp_blocks;             /* parallel.pp_blocks: one process runs the stages' arithmetic (the test mode) */
    dt_cfg_ints pp_layers;     /* parallel.pp_layers: layers per pipeline stage (n = 0: the cost rule of
                                  parallel/pp_split.h); checked against parallel.pp and model.n_layer */
    int tp_blocks;             /* parallel.tp_blocks: one process holds all tp shards (the test mode) */
    int sp;                    /* parallel.sequence_parallel */
    char layout[8];            /* parallel.layout: "" (the keys as given) or "auto" (cli/layout_auto.c) */
    char layout_hardware[64];  /* its catalog entry and catalog file */
    char layout_catalog[1024];
    int tp_set, strategy_set;  /* parallel.tp / parallel.strategy (or hybrid) were given explicitly */
    int pp_set;                /* parallel.pp was given explicitly */
    /* runtime */
    int threads;
    /* which model fields were set explicitly (over the preset) */
    int model_set[32]; /* per dt_model_cfg_fields entry: set by the user */
    int family_set;
    int decay_steps_set, steps_set, tokens_set, accum_set, seq_len_set;
} dt_run_cfg;

void dt_run_cfg_defaults(dt_run_cfg *c);
/* checkpoint.resume latest/auto need checkpoint.dir, except in a supervised restart. */
dt_status dt_cfg_check_resume(dt_ctx *ctx, const dt_run_cfg *c);
/* The attempt number dtrain launch --max-restarts gives this run (DTRAIN_RESTART: 0 first,
 * 1 after the first restart, ...); -1 when not supervised. */
int dt_restart_attempt(void);

/* Whether key takes a list (a YAML sequence, or its items as a comma list in text). */
int dt_cfg_key_is_list(const char *key);

/* Sets one key from its text value. Unknown keys and bad values fail naming the key (and
 * the closest known key for a misspelling). */
dt_status dt_cfg_set(dt_ctx *ctx, dt_run_cfg *c, const char *key, const char *value);

/* Applies the preset under explicit model.* overrides, checks the preset's maximum context,
 * derives steps from training.tokens and schedule.decay_steps from steps, validates. */
dt_status dt_cfg_finish(dt_ctx *ctx, dt_run_cfg *c);

/* Derives what depends on the number of ranks: grad_accum from training.batch, steps from
 * training.tokens, the default schedule.decay_steps; then validates. dt_cfg_finish applies
 * the world size the launcher announces (1 outside MPI; 0 = unknown: training.batch is not
 * checked yet); a run applies its world size again once the communicator is up, and only then
 * are parallel.tp/cp/pp/ep checked against it (they must divide it, ep the data-parallel size;
 * what each composes with: keys_layout.c). parallel.pp (<= DT_PP_MAX, <=
 * model.n_layer) and parallel.pp_layers (pp_split.h dt_pp_split_explicit) are checked on every
 * call, the world known or not. */
dt_status dt_cfg_apply_world(dt_ctx *ctx, dt_run_cfg *c, int world);

/* Prints every key with its default and help, grouped by section (for --help and docs). */
void dt_cfg_print_keys(FILE *f);

/* Prints the resolved configuration as YAML that dt_cfg_load_yaml reads back. */
void dt_cfg_print(FILE *f, const dt_run_cfg *c);

#endif
