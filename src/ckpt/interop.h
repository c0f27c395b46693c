/* interop.h - GPT-2 weights to and from other programs.
 *
 * Import: llm.c model files (gpt2_124M.bin, gpt2_124M_bf16.bin): 256 little-endian int32
 * header (magic 20240326, version 3 = fp32 / 5 = bf16 tensors, maxT, V, L, NH, C, Vp), then
 * the 16 tensor kinds, each for all layers at once, in the order of dtrain's parameter table
 * (wte with Vp >= V rows; matrices "out x in" like dtrain's). dt_model_import reads either
 * that or a dtrain model file, deciding by content, so training can start from either.
 *
 * Export: a Hugging Face GPT-2 directory that transformers' GPT2LMHeadModel loads:
 * model.safetensors with HF's own tensor names (no "transformer." prefix, as in the gpt2
 * repository), Conv1D weights stored "in x out" (the transpose of dtrain's), no vocabulary
 * padding, lm_head tied to wte; and config.json.
 *
 *   dt_model_config cfg; char tok[16];
 *   DT_CHECK(dt_model_import_config(ctx, "gpt2_124M.bin", &cfg, tok, sizeof tok));
 *   DT_CHECK(dt_model_init(ctx, &m, &cfg, &alloc, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS));
 *   DT_CHECK(dt_model_import(ctx, &m, "gpt2_124M.bin"));
 *   DT_CHECK(dt_hf_export(ctx, "ckpt/", "hf-out/"));
 */
#ifndef DT_INTEROP_H
#define DT_INTEROP_H

#include <stddef.h>

#include "model/model.h"

#define DT_LLMC_MODEL_MAGIC 20240326
#define DT_LLMC_MODEL_HEADER_BYTES 1024

/* The model shape of an llm.c model file. Checks magic, version, every header field and the
 * file size against the header, so a file that passes holds every tensor. */
dt_status dt_llmc_model_config(dt_ctx *ctx, const char *path, dt_model_config *out);

/* Loads an llm.c model file into m (whose params slab must exist and whose shape must match
 * the file's); bf16 values are widened exactly. Vocabulary padding rows of m are zeroed. */
dt_status dt_llmc_model_load(dt_ctx *ctx, dt_model *m, const char *path);

/* Shape and tokenizer ("gpt2" for llm.c files with the GPT-2 vocabulary, else "") of a model
 * to import: an llm.c model file, a dtrain model file, a step directory or a checkpoint
 * directory (its latest step). */
dt_status dt_model_import_config(dt_ctx *ctx, const char *path, dt_model_config *out,
                                 char *tokenizer, size_t tokenizer_size);

/* Loads weights from any of the sources dt_model_import_config accepts into m (unsharded,
 * with a params slab, same shape). */
dt_status dt_model_import(dt_ctx *ctx, dt_model *m, const char *path);

/* Writes OUT_DIR/model.safetensors and OUT_DIR/config.json (created if missing, each file
 * written under a temporary name and renamed) from a dtrain model file, step directory or
 * checkpoint directory. */
dt_status dt_hf_export(dt_ctx *ctx, const char *src, const char *out_dir);

#endif
