/* checkpoint.h - training checkpoints: the full state of a run at a step boundary, written
 * crash-consistently (optionally in the background) and read back for a bit-exact resume,
 * also on a different world size or ZeRO stage.
 *
 * A checkpoint is a directory DIR/step-NNNNNNNN/ holding (docs/FORMATS.md):
 *   model.safetensors              the full model (rank 0; gathered first under ZeRO-3)
 *   optim-rank<r>-of-<n>.safetensors  AdamW moments of rank r's shard, with the global
 *                                  offsets of its pieces (one file per distinct shard)
 *   trainer.json                   step, tokens seen, seeds, data cursor, config, versions
 *   MANIFEST.json                  size + XXH3-64 of every file: written last (manifest.h)
 * plus DIR/latest naming the newest committed step. Only directories with a valid manifest
 * whose files all match are loaded; dt_ckpt_find picks the newest such one and says why it
 * skipped newer ones.
 *
 * Saving, per rank, at a step boundary (every rank calls each function at the same point):
 *   dt_ckpt_saver *sv; DT_CHECK(dt_ckpt_saver_init(ctx, &sv, &scfg));
 *   DT_CHECK(dt_ckpt_saver_stage(ctx, sv, full_params_or_NULL, mom, var, &tj));  // copies
 *   ... training goes on while a thread writes this rank's files ...
 *   if every rank's dt_ckpt_saver_done(sv):  DT_CHECK(dt_ckpt_saver_commit(ctx, sv, comm));
 *   dt_ckpt_saver_free(sv);   // waits for a running save (uncommitted saves stay invisible)
 */
#ifndef DT_CHECKPOINT_H
#define DT_CHECKPOINT_H

#include <stdint.h>

#include "ckpt/manifest.h"
#include "comm/comm.h"
#include "data/sampler.h"
#include "model/model.h"
#include "parallel/parallel.h"

/* trainer.json */
typedef struct dt_ckpt_trainer {
    long step;             /* optimizer steps done */
    double tokens_seen;    /* over all ranks */
    uint64_t seed;         /* training.seed: init, shuffling and synthetic data (counter RNG:
                            * the seed and the step are the whole RNG state) */
    int world, micro_batch, accum, seq_len, hybrid;
    int tp;                /* tensor parallelism's degree (1 = none; absent in older checkpoints) */
    char strategy[16];
    int has_sampler;       /* data from files: the sampler state below is valid */
    dt_sampler_state sampler;
    double loss;           /* of the last step */
    double train_seconds;  /* wall time spent training up to this step, over restarts */
    char precision[8];     /* training.precision ("" in checkpoints older than it: fp32) */
    double loss_scale;     /* the loss scaler (1 = off) */
    long loss_scale_good, overflows;
    int lora;              /* a LoRA run: the model file holds only the adapters */
    uint64_t lora_base;    /* its frozen base's XXH3-64 (model/lora.h dt_lora_base_hash) */
    uint64_t lora_base_fp; /* its layout-free fingerprint (dt_lora_base_fingerprint; 0: none) */
    int lora_rank;         /* the adapters' rank, alpha and targets (model.h dt_lora_cfg) */
    double lora_alpha;
    unsigned lora_targets;
    double lora_dropout;   /* lora.dropout of the run (absent in older checkpoints: 0) */
} dt_ckpt_trainer;

typedef struct dt_ckpt_saver_cfg {
    const char *dir;        /* checkpoint root */
    const dt_model *model;   /* shape and tensor names (parameters are passed to stage) */
    const char *tokenizer;
    const char *config_yaml;/* the resolved run configuration, stored in trainer.json */
    int rank, world;
    const dt_shard_piece *pieces; /* what this rank writes of its moments (dt_parallel_save_pieces);
                                   * none: it writes no optimizer file */
    int npieces;
    size_t shard;           /* floats in this rank's moments */
    const char *strategy;
    int keep_last;          /* committed checkpoints to keep (0 = all) */
    int async;              /* write on a background thread */
    int max_failures;       /* consecutive failed saves before training stops */
    const float *residual;  /* (optional) Top-K's residual of this rank (dt_parallel_residual),
                               staged with every save into this rank's optimizer file */
    size_t residual_n;      /* its floats (0: none) */
    const float *age;       /* (optional, with a residual) Top-K's element ages of this rank's
                               shard (dt_parallel_ages), saved beside the residual */
    size_t age_n;           /* its floats (0: none) */
} dt_ckpt_saver_cfg;

typedef struct dt_ckpt_saver dt_ckpt_saver;

dt_status dt_ckpt_saver_init(dt_ctx *ctx, dt_ckpt_saver **out, const dt_ckpt_saver_cfg *cfg);
/* Waits for a running write (it is not committed). NULL is a no-op. */
void dt_ckpt_saver_free(dt_ckpt_saver *s);

/* Copies the state of step tj->step into the staging buffers and starts writing it (async)
 * or writes it (sync). full: the full parameters (rank 0 only; others may pass NULL);
 * mom/var: this rank's moments (only the save pieces are copied). A previous save must have been committed first. */
dt_status dt_ckpt_saver_stage(dt_ctx *ctx, dt_ckpt_saver *s, const float *full, const float *mom,
                              const float *var, const dt_ckpt_trainer *tj);
/* 1 while a staged save awaits commit; done = its files are written (or failed). */
int dt_ckpt_saver_pending(const dt_ckpt_saver *s);
int dt_ckpt_saver_done(dt_ckpt_saver *s);
/* Every rank: waits for this rank's writes (logging a wait of more than 10 ms), exchanges
 * results, and rank 0 writes the manifest, moves `latest` and prunes old checkpoints. A
 * failed save (disk full, I/O error on any rank) is logged with the rank and reason and
 * removed; the previous checkpoint stays the newest. Returns an error only after
 * max_failures consecutive failures. *committed (may be NULL) = 1 if it committed. */
dt_status dt_ckpt_saver_commit(dt_ctx *ctx, dt_ckpt_saver *s, dt_comm *comm, int *committed);
/* Seconds the training loop spent copying state into staging / waiting for a save's writes /
 * committing (the exchange of results and, on rank 0, manifest, `latest` and pruning),
 * summed; saves committed and failed. */
void dt_ckpt_saver_stats(const dt_ckpt_saver *s, double *stage_s, double *wait_s, double *commit_s, int *committed,
                         int *failed, double *write_s, double *bytes);

/* ---- reading */

/* Checks one step directory: manifest, every file's size and checksum, trainer.json and
 * the model file's header. The message names the file and the reason. */
dt_status dt_ckpt_verify(dt_ctx *ctx, const char *step_dir, dt_manifest *out_or_null);
/* The newest intact checkpoint under root (or root itself if it is a step directory, then
 * verified): `latest` wins — steps newer than the one it names are ignored (a rolled-back
 * run's, or a save whose commit did not finish), then damaged or incomplete ones are skipped
 * with a warning naming the reason; without a `latest` pointer the newest intact step.
 * out gets the step directory. DT_ERR_IO with "no checkpoint" if there is none. */
dt_status dt_ckpt_find(dt_ctx *ctx, const char *root, char *out, size_t out_size);
/* The same; quiet: no line about skipped or ignored steps (ckpt verify lists them itself). */
dt_status dt_ckpt_find_quiet(dt_ctx *ctx, const char *root, int quiet, char *out, size_t out_size);
/* The step the `latest` pointer of root names; -1 without a (well-formed) pointer. */
long dt_ckpt_latest_step(const char *root);
dt_status dt_ckpt_read_trainer(dt_ctx *ctx, const char *step_dir, dt_ckpt_trainer *out);
/* Parses trainer.json text (len bytes); `origin` names it in messages. */
dt_status dt_ckpt_parse_trainer(dt_ctx *ctx, const char *text, size_t len, const char *origin,
                                dt_ckpt_trainer *out);
/* The full parameters of the step's model file into full (model->ps.n_params floats, slab
 * layout; padding rows zero). The model's shape must match the file's. */
dt_status dt_ckpt_load_params(dt_ctx *ctx, const char *step_dir, const dt_model *model, float *full);
/* This rank's moments from the optimizer files, whatever world size and strategy wrote
 * them: each of my pieces is filled from the pieces of the files that overlap it, and must
 * be covered exactly once. */
dt_status dt_ckpt_load_moments(dt_ctx *ctx, const char *step_dir, size_t n_params,
                               const dt_shard_piece *pieces, int npieces, float *mom, float *var);
/* Top-K's residual of world rank `rank` (tensor compression_residual of its optimizer file
 * optim-rank<rank>-of-<world>.safetensors, n floats) into res, and with age_n > 0 its element
 * ages (tensor compression_age, age_n floats) into age. *found = 0 (res and age untouched)
 * when the step was written by another world size or holds no residual; ages are read only
 * with the residual, and left untouched where the file has none (written with
 * parallel.compression_adam: plain). A tensor of another length or dtype is DT_ERR_FORMAT. */
dt_status dt_ckpt_load_residual(dt_ctx *ctx, const char *step_dir, int rank, int world, float *res, size_t n,
                                float *age, size_t age_n, int *found);

#endif
