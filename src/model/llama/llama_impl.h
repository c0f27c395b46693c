/* llama_impl.h - the LLaMA family's Hugging Face config.json reader and writer (llama_hf.c),
 * shared with its family table (llama.c). Internal to src/model/llama. */
#ifndef DT_LLAMA_IMPL_H
#define DT_LLAMA_IMPL_H

#include <stddef.h>

#include "core/status.h"
#include "model/model.h"

typedef struct dt_hf_json dt_hf_json;

/* config.json (model_type llama, mistral or mixtral) -> c, refusing what the family does not
 * compute, naming the key. */
dt_status dt_llama_hf_read(dt_ctx *ctx, const dt_hf_json *j, dt_model_config *c);
/* The family's part of config.json (a JSON object body, no braces, no trailing comma). */
int dt_llama_hf_config(const dt_model_config *c, char *buf, size_t n);
/* architectures[0] and model_type: Mixtral with experts, else LLaMA. */
void dt_llama_hf_identity(const dt_model_config *c, const char **arch, const char **type);

#endif
