/* gpt2.h - the GPT-2 family: learned position embedding, LayerNorm, GELU MLP (4 d_model),
 * biases everywhere, lm_head tied to the token embedding.
 *
 * Layout (params.h): PRE = wte (vocab padded to 128 rows), wpe; each layer block = ln_1,
 * c_attn (fused q|k|v), c_proj, ln_2, c_fc, mlp c_proj; POST = ln_f. */
#ifndef DT_GPT2_H
#define DT_GPT2_H

#include "model/model.h"

extern const dt_model_family dt_family_gpt2;

/* Tensor ids: the rows of the table in gpt2_params.h. */
typedef enum dt_gpt2_param_id {
#define DT_X_ENUM(id, group, rows, cols, init, decay, name, hf, tr) DT_GPT2_P_##id,
#include "model/gpt2/gpt2_params.h"
    DT_GPT2_PARAMS(DT_X_ENUM)
#undef DT_X_ENUM
        DT_GPT2_NPARAMS
} dt_gpt2_param_id;

#endif
