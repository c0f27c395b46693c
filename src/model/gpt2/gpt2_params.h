/* gpt2_params.h - the one table of GPT-2 parameter tensors (params.h describes the store).
 *
 *   X(id, group, rows, cols, init, decay, name, hf_name, hf_transposed)
 *   rows, cols: expressions in the config `c` (a vector has rows = 1)
 *   init: NORMAL (std 0.02), RESID (std 0.02/sqrt(2 n_layer)), ONES, ZEROS
 *   decay: 1 if AdamW weight decay applies (2-D weights only)
 *   name: dtrain's name = Hugging Face's GPT-2 name without "transformer." ("%d" = layer)
 *   hf_transposed: HF's Conv1D stores the transpose of dtrain's "out x in" weight
 */
#ifndef DT_GPT2_PARAMS_H
#define DT_GPT2_PARAMS_H

#define DT_GPT2_PARAMS(X)                                                                           \
    X(WTE, PRE, c->vocab_padded, c->d_model, NORMAL, 1, "wte.weight", "wte.weight", 0)             \
    X(WPE, PRE, c->context, c->d_model, NORMAL, 1, "wpe.weight", "wpe.weight", 0)                  \
    X(LN1W, LAYER, 1, c->d_model, ONES, 0, "h.%d.ln_1.weight", "h.%d.ln_1.weight", 0)              \
    X(LN1B, LAYER, 1, c->d_model, ZEROS, 0, "h.%d.ln_1.bias", "h.%d.ln_1.bias", 0)                 \
    X(QKVW, LAYER, 3 * c->d_model, c->d_model, NORMAL, 1, "h.%d.attn.c_attn.weight",              \
      "h.%d.attn.c_attn.weight", 1)                                                                \
    X(QKVB, LAYER, 1, 3 * c->d_model, ZEROS, 0, "h.%d.attn.c_attn.bias", "h.%d.attn.c_attn.bias", 0) \
    X(ATTPROJW, LAYER, c->d_model, c->d_model, RESID, 1, "h.%d.attn.c_proj.weight",               \
      "h.%d.attn.c_proj.weight", 1)                                                                \
    X(ATTPROJB, LAYER, 1, c->d_model, ZEROS, 0, "h.%d.attn.c_proj.bias", "h.%d.attn.c_proj.bias", 0) \
    X(LN2W, LAYER, 1, c->d_model, ONES, 0, "h.%d.ln_2.weight", "h.%d.ln_2.weight", 0)              \
    X(LN2B, LAYER, 1, c->d_model, ZEROS, 0, "h.%d.ln_2.bias", "h.%d.ln_2.bias", 0)                 \
    X(FCW, LAYER, 4 * c->d_model, c->d_model, NORMAL, 1, "h.%d.mlp.c_fc.weight",                  \
      "h.%d.mlp.c_fc.weight", 1)                                                                   \
    X(FCB, LAYER, 1, 4 * c->d_model, ZEROS, 0, "h.%d.mlp.c_fc.bias", "h.%d.mlp.c_fc.bias", 0)      \
    X(FCPROJW, LAYER, c->d_model, 4 * c->d_model, RESID, 1, "h.%d.mlp.c_proj.weight",             \
      "h.%d.mlp.c_proj.weight", 1)                                                                 \
    X(FCPROJB, LAYER, 1, c->d_model, ZEROS, 0, "h.%d.mlp.c_proj.bias", "h.%d.mlp.c_proj.bias", 0)  \
    X(LNFW, POST, 1, c->d_model, ONES, 0, "ln_f.weight", "ln_f.weight", 0)                         \
    X(LNFB, POST, 1, c->d_model, ZEROS, 0, "ln_f.bias", "ln_f.bias", 0)

#endif
