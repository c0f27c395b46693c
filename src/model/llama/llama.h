/* llama.h - the LLaMA family (LLaMA 1-3, TinyLlama, Mistral shapes): RMSNorm, rotary position
 * embeddings (Hugging Face's rotate-half convention), grouped-query attention, SwiGLU MLP with
 * its own width, no biases, lm_head tied to the token embedding or its own.
 *
 * Layout (params.h): PRE = embed_tokens (vocab padded to 128 rows); each layer block =
 * input_layernorm, q_proj | k_proj | v_proj (adjacent: one fused projection), o_proj,
 * post_attention_layernorm, gate_proj | up_proj (adjacent: one fused projection), down_proj;
 * POST = norm, lm_head (untied only). Tensor names are Hugging Face's LlamaForCausalLM names. */
#ifndef DT_LLAMA_H
#define DT_LLAMA_H

#include "model/model.h"

extern const dt_model_family dt_family_llama;

/* A mixture of experts (model/llama/moe.h): layer l's (of a pipeline stage's layers) chosen experts in the last forward,
 * (B T, experts_topk) by decreasing router probability; NULL for a dense model. */
const int32_t *dt_llama_moe_choices(const dt_model *m, int l);

/* Tensor ids: the rows of the table in llama_params.h (LM_HEAD only when untied). */
typedef enum dt_llama_param_id {
#define DT_X_ENUM(id, group, rows, cols, decay, name) DT_LLAMA_P_##id,
#include "model/llama/llama_params.h"
    DT_LLAMA_PARAMS(DT_X_ENUM)
#undef DT_X_ENUM
        DT_LLAMA_NPARAMS
} dt_llama_param_id;

#endif
