/* lora_base.h - a LoRA run's frozen base from a dtrain model file, tensor by tensor
 * (ARCHITECTURE decision 49): each tensor is copied from the mapped file into the base's
 * slab, or, under QLoRA, quantized to NF4 from a copy of that one tensor, so no full fp32
 * copy of the model is made.
 *
 *   DT_CHECK(dt_lora_base_load(ctx, &m, "base.st"));     // any model.init_from
 *   DT_CHECK(dt_lora_check_resume(ctx, dir, &tj, &m, dt_lora_base_hash(&m)));
 */
#ifndef DT_LORA_BASE_H
#define DT_LORA_BASE_H

#include "model/model.h"

/* path: a dtrain model file, a step directory or a checkpoint directory (*done = 1 once
 * read), or another format model.init_from reads (a Hugging Face directory, an llm.c
 * file: *done = 0, nothing read). A LoRA checkpoint, another shape, a missing tensor or a
 * wrong dtype or shape is refused naming the file. */
dt_status dt_lora_base_stream(dt_ctx *ctx, dt_model *m, const char *path, int *done);
/* model.init_from as m's frozen base: streamed as above, or any other format imported whole
 * once (outside the allocator), then copied and quantized (dt_lora_set_base). */
dt_status dt_lora_base_load(dt_ctx *ctx, dt_model *m, const char *path);
/* A resume of m from checkpoint dir (its trainer.json read into tj): refuses a LoRA
 * checkpoint for a full run and the reverse, another rank, alpha or target set, and
 * another base (base_hash: dt_lora_base_hash of m's; base_fp: dt_lora_base_fingerprint, which
 * compares across tensor-parallel layouts when both have one), in one line naming dir. */
struct dt_ckpt_trainer;
dt_status dt_lora_check_resume(dt_ctx *ctx, const char *dir, const struct dt_ckpt_trainer *tj, const dt_model *m,
                               uint64_t base_hash, uint64_t base_fp);

#endif
