/* moe.h - the mixture-of-experts MLP of the LLaMA family (Mixtral's sparse MoE block;
 * internal to src/model/llama; ARCHITECTURE decision 63).
 *
 * With model.n_experts = E > 0 a layer's MLP is E SwiGLU experts of width expert_d_ff (Fe)
 * behind a linear router (no bias): for each token, p = softmax(router(x)) over the experts,
 * the experts_topk (k) largest probabilities are chosen (ties: the lower expert index), their
 * weights renormalised over the k (w_j = p_j / sum of the k), and the MLP output is
 * sum_j w_j expert_j(x). Dropless unless parallel.moe_capacity_factor f > 0: then each expert
 * takes at most ceil(f x tokens x k / E) of the micro-batch's choices, those with the largest
 * w (ties: the lower token index), and a dropped choice adds nothing (the weights of the others
 * are not renormalised again).
 *
 * Layout (params.h): a layer is [input norm, attention] [post-attention norm, router]
 * [w1_0 | w3_0, w2_0] ... [w1_{E-1} | w3_{E-1}, w2_{E-1}]: one unit per expert, w1 (gate) and
 * w3 (up) adjacent (one 2Fe x C projection), names Hugging Face's MixtralForCausalLM names.
 *
 * Losses (Hugging Face Mixtral's definitions), over the N = n_layer x B x T router rows of the
 * micro-batch (every layer's rows pooled, as transformers' load_balancing_loss_func
 * concatenates them):
 *   aux = E x sum_e (c_e / N) (P_e / N), c_e the top-k choices of expert e (before any drop),
 *         P_e the sum of the router probabilities of e;
 *   z   = (1 / N) sum over rows of logsumexp(router logits)^2.
 * With training.moe_aux_loss_type=layer (model.h moe_aux_layer) the load-balancing loss is
 * Megatron-Core's instead, each layer's own over its T' = B x T rows, summed over the layers:
 *   aux = sum_l E / (k T'^2) sum_e c_le P_le (balanced: 1 a layer; ARCHITECTURE decision 93):
 * the pooled loss lets one layer's overload stand against another's underload.
 * The model's loss is cross-entropy + training.moe_aux_loss_coef aux + training.moe_z_loss_coef z.
 *
 * Buffers are sized for the worst case: B T k expert rows per layer whatever the routing (each
 * token's k choices are distinct experts), so the plan equals the allocation.
 *
 * Mixed precision (training.precision bf16/fp16; ARCHITECTURE decision 87): every GEMM as the
 * dense layers run theirs (mixed.c: 16-bit inputs and weights, fp32 results), the router's on
 * the post-attention norm's 16-bit copy; the routing (softmax, top-k, weights) from its fp32
 * logits. An expert's gathered input is gathered from that copy (xh, or the received rows xrh),
 * and its SwiGLU output is kept in 16 bits only (hh: the W2 GEMM's input, forward and backward),
 * as the dense MLP keeps hmid. */
#ifndef DT_LLAMA_MOE_H
#define DT_LLAMA_MOE_H

#include "model/model.h"

/* Tensor ids of a MoE llama's table: the dense table's first rows (EMBED .. LN2), then these. */
#define DT_LLAMA_MOE_ROUTER 7
#define DT_LLAMA_MOE_W1(e) (8 + 3 * (e))
#define DT_LLAMA_MOE_W3(e) (9 + 3 * (e))
#define DT_LLAMA_MOE_W2(e) (10 + 3 * (e))
#define DT_LLAMA_MOE_NORM(E) (8 + 3 * (E))
#define DT_LLAMA_MOE_HEAD(E) (9 + 3 * (E))

typedef struct dt_moe_acts {
    /* per layer (L slots: dt_moe_layout) */
    float *probs;   /* (L, BT, E) router probabilities */
    float *lse;     /* (L, BT) logsumexp of the router logits */
    int32_t *sel;   /* (L, BT, k) chosen experts, by decreasing probability */
    float *w;       /* (L, BT, k) their renormalised weights */
    int32_t *pos;   /* (L, BT, k) the choice's row among the layer's expert rows (-1: dropped) */
    int32_t *rows;  /* (L, BT k) the expert rows: token x k + slot, expert by expert, tokens ascending */
    int32_t *off;   /* (L, E + 1) expert e's rows are [off[e], off[e + 1]) */
    float *gu;      /* (L, BT k, 2 Fe) gate | up of each row */
    float *h;       /* (L, BT k, Fe) silu(gate) up (fp32 runs) */
    uint16_t *hh;   /* (L, BT k, Fe) its 16-bit copy (mixed precision, in place of h) */
    float *y;       /* (L, BT k, C) the expert's output */
    /* scratch */
    float *xe, *dy, *dx; /* (BT, C) gathered inputs, output gradients, input gradients */
    uint16_t *xh;        /* (BT, C) mixed precision: the gathered inputs (in place of xe) */
    float *dh;           /* (BT, Fe) */
    float *dgu;          /* (BT, 2 Fe) */
    float *logit;        /* (BT, E) router logits; their gradient in the backward */
    float *dw;           /* (BT, k) gradients of the weights */
    float *cand;         /* (BT, 2) capacity: an expert's candidates (weight, row) */
    /* The micro-batch's totals over the layers (forward), for the losses and their gradients:
     * E choice counts, E probability sums, the sum of squared logsumexps, the layer-wise
     * load-balancing loss summed so far (2E + 2 doubles, in
     * the activation set: each micro-batch in flight has its own). A pipeline stage starts
     * from the previous stage's totals and hands its own on with its output; the last stage's
     * (every layer's) travel back with the gradients (dt_moe_stage_floats). */
    double *count, *psum, *zsum;
    double *auxl; /* the layer-wise load-balancing loss summed over the layers routed so far */
    /* Expert parallelism (model.h dt_model_opts.ep > 1; moe_ep.c): gu and h hold, per layer, the
     * rows this rank's experts received from the EP group's source ranks (at most
     * dt_moe_expert_rows: ep x B T x min(k, E / ep)), not this rank's own rows; then per layer */
    float *xr;      /* (L, Rr, C) the received inputs, source by source, each expert by expert */
    uint16_t *xrh;  /* (L, Rr, C) mixed precision: the same in 16 bits (in place of xr) */
    int32_t *rc;    /* (L, ep, E / ep) the rows of each source rank for each local expert */
    /* and scratch */
    float *sx;      /* (BT k, C) a source's rows in expert order: inputs out (16-bit under mixed
                       precision), dy out, dx back */
    float *ox, *ox2;/* (Rr, C) an owner's rows: outputs out and dy in; dx out */
} dt_moe_acts;

/* Layer l's per-layer views (family_impl.h: class DT_ACT_SEL). */
typedef struct dt_moe_views {
    float *probs, *lse, *w, *gu, *h, *y, *xr;
    int32_t *sel, *pos, *rows, *off, *rc;
    uint16_t *hh, *xrh;
} dt_moe_views;

/* The experts this process holds: [dt_moe_first, dt_moe_first + dt_moe_local) (all of them
 * without expert parallelism). */
static inline int dt_moe_local(const dt_model_config *c, const dt_model_opts *o) {
    return o && o->ep > 1 ? c->n_experts / o->ep : c->n_experts;
}
static inline int dt_moe_first(const dt_model_config *c, const dt_model_opts *o) {
    return o && o->ep > 1 ? o->ep_rank * (c->n_experts / o->ep) : 0;
}
/* The expert width this process holds: expert_d_ff, or under tensor parallelism (decision 91)
 * its shards' columns, tp_local x expert_d_ff / tp (gate|up and h hold them shard by shard: an
 * expert's n rows as tp_local blocks of (n, 2 Fl) and (n, Fl), Fl = expert_d_ff / tp). */
static inline size_t dt_moe_ff_held(const dt_model_config *c, const dt_model_opts *o) {
    return (size_t)(c->expert_d_ff / dt_tp_size(o)) * (size_t)dt_tp_local(o);
}
/* Expert rows a layer's gu and h hold: B T k, or under expert parallelism the most this rank's
 * experts can receive, ep x B T x min(k, E / ep) (a token's k choices are distinct experts). */
size_t dt_moe_expert_rows(const dt_model_config *c, const dt_model_opts *o, size_t BT);
/* Floats of one source rank's segment of the local experts' weight gradients (model.h
 * dt_model.ep_grads): store_layers x (E / ep) x 3 Fe C (tensor parallelism: the shards' width
 * held, dt_moe_ff_held, laid out as the store); under LoRA x their adapters' floats
 * (lora.h dt_lora_expert_floats) instead of 3 Fe C. */
size_t dt_moe_ep_segment(const dt_model_config *c, const dt_model_opts *o, int store_layers);
/* The offset, within a store layer of m->ps, of the local experts' trainable tensors (one run
 * of dt_moe_ep_segment's per-layer floats): their weights, or under LoRA their adapters. */
size_t dt_moe_ep_offset(const dt_model *m);
/* Expert parallelism's halves of dt_moe_forward and dt_moe_backward (moe_ep.c), after the
 * routing (forward) and the routing weights' gradients (backward). */
void dt_moe_ep_forward(dt_model *m, dt_moe_acts *a, const dt_moe_views *v, int l, const float *ln2,
                       const uint16_t *ln2h, int next);
void dt_moe_ep_backward(dt_model *m, dt_moe_acts *a, const dt_moe_views *v, int l, const float *dout, float *dln2,
                        int router_unit);

/* Lays the buffers out after *off (dt_act_take; base NULL: only counts). The per-layer ones
 * are of class DT_ACT_SEL (family_impl.h): kept by every layer but those `full` activation
 * checkpointing recomputes, which share one slot. */
void dt_moe_layout(dt_moe_acts *a, float *base, size_t *off, const dt_model_config *c, const dt_model_opts *o,
                   int B, int T);
/* Before the first layer of a forward: the totals start at zero on the first stage (on a
 * later one they arrived from the previous stage). */
void dt_moe_begin(dt_model *m, dt_moe_acts *a);
/* The floats of the totals (2E + 2 doubles) that cross between pipeline stages; they start at
 * a->count. */
size_t dt_moe_stage_floats(const dt_model_config *c);
/* The MoE table (moe_table.c): out holds the dense llama table (DT_LLAMA_P_*); its rows from the
 * MLP on are replaced by the router, each expert's w1 | w3 and w2, the norm and the head.
 * Returns the tensor count. */
int dt_moe_tensors(const dt_model_config *c, dt_tensor_info *out);
/* Layer l's MoE MLP: out (BT, C) = res2 + MoE(ln2) (ln2h: its 16-bit copy under mixed
 * precision, read instead of ln2, which may then hold anything). Its post-attention norm's unit has been
 * announced; this announces each expert's unit (`next`: the unit read after the layer). out
 * NULL: a recompute in the backward (activation checkpointing): the layer's routing and
 * expert rows formed again, bitwise the same, the micro-batch's totals left alone. */
void dt_moe_forward(dt_model *m, dt_moe_acts *a, int l, const float *ln2, const uint16_t *ln2h, const float *res2,
                    float *out, int next);
/* After the last layer: sets m->moe_aux, m->moe_z, m->moe_dropped; returns the loss terms
 * aux_coef aux + z_coef z. */
double dt_moe_finish(dt_model *m, dt_moe_acts *a);
/* Layer l's backward: dout (BT, C) the gradient of its output; dln2 (BT, C) = the gradient of
 * ln2 (overwritten). Announces and ends each expert's unit (descending), then announces the
 * router's unit (`next`: the unit read after it) and begins its gradients: the caller ends
 * them after the post-attention norm's backward. */
void dt_moe_backward(dt_model *m, dt_moe_acts *a, int l, const float *ln2, const uint16_t *ln2h, const float *dout,
                     float *dln2, float scale, int next);

#endif
