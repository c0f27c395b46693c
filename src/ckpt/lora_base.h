/* lora_base.h - a LoRA run's frozen base from a dtrain model file, tensor by tensor
 * (ARCHITECTURE decision 49): each tensor is copied from the mapped file into the base's
 * slab, or, under QLoRA, quantized to NF4 from a copy of that one tensor, so no full fp32
 * copy of the model is made.
 *
 *   int done; DT_CHECK(dt_lora_base_stream(ctx, &m, "base.st", &done));
 *   if (!done) ... import the whole model, then dt_lora_set_base ...
 */
#ifndef DT_LORA_BASE_H
#define DT_LORA_BASE_H

#include "model/model.h"

/* path: a dtrain model file, a step directory or a checkpoint directory (*done = 1 once
 * read), or another format model.init_from reads (a Hugging Face directory, an llm.c
 * file: *done = 0, nothing read). A LoRA checkpoint, another shape, a missing tensor or a
 * wrong dtype or shape is refused naming the file. */
dt_status dt_lora_base_stream(dt_ctx *ctx, dt_model *m, const char *path, int *done);

#endif
