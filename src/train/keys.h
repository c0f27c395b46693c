/* keys.h - the table of configuration keys ("section.name") of a training run: the one
 * place that says which keys exist, their types, defaults and help. The CLI's --set and
 * flags (and the YAML loader to come) all go through dt_cfg_set.
 *
 *   DT_CHECK(dt_cfg_set(ctx, &cfg, "model.n_layer", "12"));
 *   DT_CHECK(dt_cfg_finish(ctx, &cfg));   // applies the preset, validates, derives
 */
#ifndef DT_KEYS_H
#define DT_KEYS_H

#include <stdio.h>

#include "train/trainer.h"

/* A run's configuration as the user gives it: the trainer config plus what is set but not
 * yet applied (the preset and explicit model overrides), and runtime settings. */
typedef struct dt_run_cfg {
    dt_train_cfg train;
    int threads;           /* runtime.threads: 0 = OpenMP default */
    char data_path[4096];  /* data.train */
    int model_set[6];      /* which of n_layer, d_model, n_head, vocab_size, context were set */
    int decay_steps_set;
} dt_run_cfg;

void dt_run_cfg_defaults(dt_run_cfg *c);

/* Sets one key from its text value. Unknown keys and bad values fail naming the key (and
 * the closest known key for a misspelling). */
dt_status dt_cfg_set(dt_ctx *ctx, dt_run_cfg *c, const char *key, const char *value);

/* Applies the preset under explicit model.* overrides, checks the preset's maximum context,
 * defaults schedule.decay_steps to training.steps, and validates everything. */
dt_status dt_cfg_finish(dt_ctx *ctx, dt_run_cfg *c);

/* Prints every key with its type, default and help (for --help and docs). */
void dt_cfg_print_keys(FILE *f);

/* Prints the resolved configuration, one "key: value" per line. */
void dt_cfg_print(FILE *f, const dt_run_cfg *c);

#endif
