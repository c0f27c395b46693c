/* model_file.h - a model of any family as one safetensors file: every parameter tensor under
 * its name in the family's table (vocabulary padding excluded), with the family (metadata
 * "format", e.g. dtrain-gpt2), its config fields and the tokenizer in __metadata__, so the file alone rebuilds the model. Checkpoint directories
 * (step-NNNNNNNN/ plus a `latest` pointer, ckpt/checkpoint.h) hold one such file each.
 *
 *   DT_CHECK(dt_model_file_save(ctx, &model, "out/model.safetensors", "byte", step));
 *   dt_model_config cfg; char tok[16];
 *   DT_CHECK(dt_model_file_config(ctx, "out/model.safetensors", &cfg, tok, sizeof tok));
 *   DT_CHECK(dt_model_file_load(ctx, &model, "out/model.safetensors"));
 */
#ifndef DT_MODEL_FILE_H
#define DT_MODEL_FILE_H

#include "ckpt/safetensors.h"
#include "model/model.h"

#define DT_ST_NAME_MAX 96

/* Tensors in a model file (every tensor of every layer). */
int dt_model_file_entry_count(const dt_model *m);
/* Fills e[] (room for dt_model_file_entry_count) with every tensor of `base` (params
 * or grads of m), names prefixed by `prefix`, kept in names[]. Returns the count. */
int dt_model_file_entries(const dt_model *m, float *base, const char *prefix, dt_st_entry *e,
                          char (*names)[DT_ST_NAME_MAX]);

dt_status dt_model_file_save(dt_ctx *ctx, const dt_model *m, const char *path,
                             const char *tokenizer, long step);
/* Same, returning the file's size and checksum. */
dt_status dt_model_file_save_info(dt_ctx *ctx, const dt_model *m, const char *path,
                                  const char *tokenizer, long step, dt_io_info *info);
/* Reads the shape and tokenizer recorded in a model file. */
dt_status dt_model_file_config(dt_ctx *ctx, const char *path, dt_model_config *cfg,
                               char *tokenizer, size_t tokenizer_size);
/* Loads weights into m, whose shape must match the file's. */
dt_status dt_model_file_load(dt_ctx *ctx, dt_model *m, const char *path);

/* Resolves a model file from a file path, a plain folder holding model.safetensors, a step
 * directory (verified against its manifest) or a checkpoint directory (dt_ckpt_find: the
 * newest intact step by the `latest` rule, verified), saying on stderr which step it
 * loads. out gets the model.safetensors path. */
dt_status dt_ckpt_resolve(dt_ctx *ctx, const char *path, char *out, size_t out_size);

#endif
