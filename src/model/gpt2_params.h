/* gpt2_params.h - the one table of GPT-2 parameter tensors.
 *
 * Every other list (struct offsets, sizes, init, weight decay, checkpoint and Hugging Face
 * names) is generated from it, so adding a tensor is one line. Columns:
 *   X(id, group, rows, cols, init, decay, name)
 *   group: DT_PG_PRE (before the layers), DT_PG_LAYER (one copy per layer), DT_PG_POST
 *   rows, cols: expressions in the config `c` (a 1-D tensor has rows = 1)
 *   init: DT_INIT_NORMAL (std 0.02), DT_INIT_RESID (std 0.02/sqrt(2L)), DT_INIT_ONES, DT_INIT_ZEROS
 *   decay: 1 if AdamW weight decay applies (2-D weights only)
 *   name: Hugging Face GPT-2 name without the "transformer." prefix ("%d" = layer)
 * Weights are stored "out x in", like torch.nn.Linear (HF's Conv1D holds the transpose).
 */
#ifndef DT_GPT2_PARAMS_H
#define DT_GPT2_PARAMS_H

#define DT_GPT2_PARAMS(X)                                                                  \
    X(WTE, DT_PG_PRE, c->vocab_padded, c->d_model, DT_INIT_NORMAL, 1, "wte.weight")        \
    X(WPE, DT_PG_PRE, c->context, c->d_model, DT_INIT_NORMAL, 1, "wpe.weight")             \
    X(LN1W, DT_PG_LAYER, 1, c->d_model, DT_INIT_ONES, 0, "h.%d.ln_1.weight")               \
    X(LN1B, DT_PG_LAYER, 1, c->d_model, DT_INIT_ZEROS, 0, "h.%d.ln_1.bias")                \
    X(QKVW, DT_PG_LAYER, 3 * c->d_model, c->d_model, DT_INIT_NORMAL, 1,                    \
      "h.%d.attn.c_attn.weight")                                                          \
    X(QKVB, DT_PG_LAYER, 1, 3 * c->d_model, DT_INIT_ZEROS, 0, "h.%d.attn.c_attn.bias")     \
    X(ATTPROJW, DT_PG_LAYER, c->d_model, c->d_model, DT_INIT_RESID, 1,                     \
      "h.%d.attn.c_proj.weight")                                                          \
    X(ATTPROJB, DT_PG_LAYER, 1, c->d_model, DT_INIT_ZEROS, 0, "h.%d.attn.c_proj.bias")     \
    X(LN2W, DT_PG_LAYER, 1, c->d_model, DT_INIT_ONES, 0, "h.%d.ln_2.weight")               \
    X(LN2B, DT_PG_LAYER, 1, c->d_model, DT_INIT_ZEROS, 0, "h.%d.ln_2.bias")                \
    X(FCW, DT_PG_LAYER, 4 * c->d_model, c->d_model, DT_INIT_NORMAL, 1,                     \
      "h.%d.mlp.c_fc.weight")                                                             \
    X(FCB, DT_PG_LAYER, 1, 4 * c->d_model, DT_INIT_ZEROS, 0, "h.%d.mlp.c_fc.bias")         \
    X(FCPROJW, DT_PG_LAYER, c->d_model, 4 * c->d_model, DT_INIT_RESID, 1,                  \
      "h.%d.mlp.c_proj.weight")                                                           \
    X(FCPROJB, DT_PG_LAYER, 1, c->d_model, DT_INIT_ZEROS, 0, "h.%d.mlp.c_proj.bias")       \
    X(LNFW, DT_PG_POST, 1, c->d_model, DT_INIT_ONES, 0, "ln_f.weight")                     \
    X(LNFB, DT_PG_POST, 1, c->d_model, DT_INIT_ZEROS, 0, "ln_f.bias")

#endif
