/* llama_params.h - the one table of LLaMA parameter tensors (params.h describes the store).
 *
 *   X(id, group, rows, cols, decay, name)
 *   rows, cols: expressions in the config `c` and q = n_head * head size, kv = n_kv_head *
 *   head size; every matrix is "out x in" as in Hugging Face (nn.Linear), so names are shared
 *   with HF checkpoints and nothing is transposed. 2-D tensors are drawn from N(0, 0.02)
 *   (HF's initializer_range) and decay; norm weights start at 1 and do not decay.
 *   LM_HEAD must stay last: the table omits it when the embedding is tied.
 */
#ifndef DT_LLAMA_PARAMS_H
#define DT_LLAMA_PARAMS_H

#define DT_LLAMA_PARAMS(X)                                                                     \
    X(EMBED, PRE, c->vocab_padded, c->d_model, 1, "model.embed_tokens.weight")                \
    X(LN1, LAYER, 1, c->d_model, 0, "model.layers.%d.input_layernorm.weight")                 \
    X(WQ, LAYER, q, c->d_model, 1, "model.layers.%d.self_attn.q_proj.weight")                 \
    X(WK, LAYER, kv, c->d_model, 1, "model.layers.%d.self_attn.k_proj.weight")                \
    X(WV, LAYER, kv, c->d_model, 1, "model.layers.%d.self_attn.v_proj.weight")                \
    X(WO, LAYER, c->d_model, q, 1, "model.layers.%d.self_attn.o_proj.weight")                 \
    X(LN2, LAYER, 1, c->d_model, 0, "model.layers.%d.post_attention_layernorm.weight")        \
    X(WGATE, LAYER, c->d_ff, c->d_model, 1, "model.layers.%d.mlp.gate_proj.weight")           \
    X(WUP, LAYER, c->d_ff, c->d_model, 1, "model.layers.%d.mlp.up_proj.weight")               \
    X(WDOWN, LAYER, c->d_model, c->d_ff, 1, "model.layers.%d.mlp.down_proj.weight")           \
    X(NORM, POST, 1, c->d_model, 0, "model.norm.weight")                                      \
    X(LM_HEAD, POST, c->vocab_padded, c->d_model, 1, "lm_head.weight")

#endif
