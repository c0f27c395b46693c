/* hf_import.h - Hugging Face model directories in: config.json plus model.safetensors or a
 * sharded checkpoint (model.safetensors.index.json naming model-0000k-of-0000n.safetensors).
 *
 * Families: LlamaForCausalLM / MistralForCausalLM (model_type llama or mistral) and
 * GPT2LMHeadModel (gpt2; Conv1D weights transposed on the way in, names with or without the
 * "transformer." prefix). Tensors may be F32, F16 or BF16: widened to float32 exactly. What
 * dtrain does not compute is refused naming the config.json key (rope_scaling, biases,
 * another activation, a head_dim that is not hidden_size / heads); Mistral's sliding window
 * becomes the model's context, so no sequence is longer than the window.
 *
 *   dt_model_config c; char tok[16];
 *   if (dt_hf_is_dir("TinyLlama/")) {
 *       DT_CHECK(dt_hf_config(ctx, "TinyLlama/", &c, tok, sizeof tok));
 *       ... dt_model_init(...) ...
 *       DT_CHECK(dt_hf_load(ctx, &m, "TinyLlama/"));
 *   }
 */
#ifndef DT_HF_IMPORT_H
#define DT_HF_IMPORT_H

#include <stddef.h>

#include "model/model.h"

/* 1 when path is a directory holding config.json (and is not a dtrain checkpoint). */
int dt_hf_is_dir(const char *path);

/* The model config of DIR/config.json; tokenizer gets config.json's dtrain_tokenizer (an
 * export of dtrain's), "gpt2" for a GPT-2 vocabulary of 50257, else "". */
dt_status dt_hf_config(dt_ctx *ctx, const char *dir, dt_model_config *out, char *tokenizer,
                       size_t tokenizer_size);

/* Loads every tensor of m's table from DIR (m: unsharded params slab, the config of
 * dt_hf_config). Vocabulary padding rows are zeroed; a missing tensor, wrong shape or dtype
 * is refused naming the tensor and the file. */
dt_status dt_hf_load(dt_ctx *ctx, dt_model *m, const char *dir);

#endif
