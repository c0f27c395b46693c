/* The mixture of experts' tensor table of the LLaMA family (moe.h): Hugging Face
 * MixtralForCausalLM's names, one unit per expert, the tensor-parallel split columns. */
#include "model/llama/llama.h"
#include "model/llama/moe.h"

/* Hugging Face MixtralForCausalLM names of expert e's tensors (literals: the table keeps
 * pointers). */
#define MOE_NAME(e, w) "model.layers.%d.block_sparse_moe.experts." #e "." w ".weight"
#define MOE_NAMES(w)                                                                          \
    {MOE_NAME(0, w),  MOE_NAME(1, w),  MOE_NAME(2, w),  MOE_NAME(3, w),  MOE_NAME(4, w),  MOE_NAME(5, w),  \
     MOE_NAME(6, w),  MOE_NAME(7, w),  MOE_NAME(8, w),  MOE_NAME(9, w),  MOE_NAME(10, w), MOE_NAME(11, w), \
     MOE_NAME(12, w), MOE_NAME(13, w), MOE_NAME(14, w), MOE_NAME(15, w)}
static const char *const moe_w1[DT_MOE_MAX_EXPERTS] = MOE_NAMES("w1");
static const char *const moe_w2[DT_MOE_MAX_EXPERTS] = MOE_NAMES("w2");
static const char *const moe_w3[DT_MOE_MAX_EXPERTS] = MOE_NAMES("w3");
_Static_assert(DT_MOE_MAX_EXPERTS == 16, "moe_w1/w2/w3 name 16 experts");
_Static_assert(DT_LLAMA_MOE_HEAD(DT_MOE_MAX_EXPERTS) < DT_MODEL_MAX_TENSORS, "the MoE table fits");
_Static_assert(DT_LLAMA_MOE_ROUTER == DT_LLAMA_P_WGATE, "the MoE table shares the dense rows before the MLP");

/* The MoE table (moe.h): the dense rows up to post_attention_layernorm, the router, each
 * expert's w1 | w3 (adjacent: one projection) and w2 (a unit per expert), norm, lm_head. */
int dt_moe_tensors(const dt_model_config *c, dt_tensor_info *out) {
    const int E = c->n_experts;
    const size_t C = (size_t)c->d_model, Fe = (size_t)c->expert_d_ff;
    dt_tensor_info norm = out[DT_LLAMA_P_NORM], head = out[DT_LLAMA_P_LM_HEAD];
#define ROW(name, rows, cols)                                                                   \
    (dt_tensor_info){name, name, DT_PG_LAYER, DT_ELEM_F32, (rows), (cols), 0, DT_INIT_NORMAL, 0.02f, 1, 0, 0, 0, 0, 0, 0, 1, 0, .split = 0}
    out[DT_LLAMA_MOE_ROUTER] = ROW("model.layers.%d.block_sparse_moe.gate.weight", (size_t)E, C);
    for (int e = 0; e < E; e++) {
        out[DT_LLAMA_MOE_W1(e)] = ROW(moe_w1[e], Fe, C);
        out[DT_LLAMA_MOE_W1(e)].unit_start = 1;
        out[DT_LLAMA_MOE_W3(e)] = ROW(moe_w3[e], Fe, C);
        out[DT_LLAMA_MOE_W2(e)] = ROW(moe_w2[e], C, Fe);
        out[DT_LLAMA_MOE_W1(e)].expert = out[DT_LLAMA_MOE_W3(e)].expert = out[DT_LLAMA_MOE_W2(e)].expert = e + 1;
        /* tensor parallelism (decision 91): each expert cut as the dense SwiGLU MLP, w1 and w3
         * by columns of expert_d_ff, w2 by rows of its input; the router replicated */
        out[DT_LLAMA_MOE_W1(e)].split = out[DT_LLAMA_MOE_W3(e)].split = DT_SPLIT_OUT;
        out[DT_LLAMA_MOE_W2(e)].split = DT_SPLIT_IN;
    }
#undef ROW
    out[DT_LLAMA_MOE_NORM(E)] = norm;
    out[DT_LLAMA_MOE_HEAD(E)] = head;
    return c->untied ? DT_LLAMA_MOE_HEAD(E) + 1 : DT_LLAMA_MOE_HEAD(E);
}
