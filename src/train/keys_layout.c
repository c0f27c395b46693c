/* The parallel layout's checks of the configuration (keys_layout.h). */
#include "train/keys_layout.h"

#include <string.h>

#include "model/cp.h"
#include "model/model.h"
#include "parallel/mesh.h"
#include "parallel/parallel.h"
#include "parallel/pp_split.h"

/* The mesh's degrees against the world (parallel/mesh.h), then the refusal of what is not
 * built yet: a run with tp, cp, pp or ep > 1 would otherwise train as plain data parallelism,
 * silently not the model the user asked for. */
dt_status dt_cfg_check_mesh(dt_ctx *ctx, const dt_run_cfg *c, int world) {
    dt_mesh m;
    DT_CHECK(dt_mesh_init(ctx, &m, world, 0, c->tp_blocks ? 1 : c->tp, c->cp, c->pp_blocks ? 1 : c->pp, c->ep));
    return DT_OK;
}

/* Expert parallelism (decision 85) against the model and what it composes with so far: one
 * line naming the keys, before anything is allocated. */
dt_status dt_cfg_check_ep(dt_ctx *ctx, const dt_run_cfg *c) {
    const dt_train_cfg *t = &c->train;
    const int ep = c->ep;
    if (ep < 2) return DT_OK;
    if (t->model.n_experts <= 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.ep=%d needs a mixture of experts (model.n_experts > 0): a dense "
                       "model has no experts to split", ep);
    if (t->model.n_experts % ep)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.ep=%d must divide model.n_experts=%d (each rank of an EP group holds "
                       "n_experts / ep experts)", ep, t->model.n_experts);
    const char *why = c->pp_blocks                                ? "parallel.pp_blocks"
                      : c->cp > 1                                 ? "parallel.cp"
                      : t->parallel.hybrid                        ? "parallel.hybrid"
                      : t->parallel.compression != DT_COMPRESS_NONE ? "parallel.compression"
                                                                  : NULL;
    if ((t->model_opts.lora.rank > 0 || t->model_opts.lora.nf4) && (c->pp > 1 || c->pp_blocks))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.ep=%d with lora.rank and parallel.pp=%d: not built (LoRA under "
                       "expert parallelism runs without a pipeline; decisions 89, 90)", ep, c->pp);
    if (!why && t->parallel.strategy != DT_STRAT_DDP) { /* decision 88 built ZeRO with ep alone */
        const char *with = c->tp > 1 || c->tp_blocks                 ? "parallel.tp"
                           : c->pp > 1                               ? "parallel.pp"
                           : t->parallel.grad_dtype != DT_F32        ? "parallel.grad_dtype"
                           : t->model_opts.lora.rank > 0 || t->model_opts.lora.nf4 ? "lora.rank"
                                                                     : NULL;
        if (with)
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.ep=%d with parallel.strategy=%s and %s: not built (ZeRO with "
                           "expert parallelism runs with fp32 gradients, without tensor or pipeline parallelism or LoRA)",
                           ep, dt_strategy_name(t->parallel.strategy), with);
    }
    if (why)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.ep=%d with %s: "
                       "not built with expert parallelism yet (docs/FEATURES.md, Mixture of experts: expert parallelism, "
                       "lists what it composes with)", ep, why);
    return DT_OK;
}

/* Context parallelism (decision 83) against the model and what it composes with so far: one
 * line naming the keys, before anything is allocated. */
dt_status dt_cfg_check_cp(dt_ctx *ctx, const dt_run_cfg *c) {
    const dt_train_cfg *t = &c->train;
    const int cp = c->cp;
    if (cp < 2) return DT_OK;
    const dt_model_family *f = dt_model_family_of(&t->model);
    if (!f || (strcmp(f->name, "llama") && strcmp(f->name, "gpt2")))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.cp=%d: context parallelism is built for the causal families llama "
                       "and gpt2 (model.family is %s; a bidirectional ring is not built)", cp, f ? f->name : t->model.family);
    if (cp > DT_CP_MAX)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.cp=%d: at most %d context-parallel ranks", cp, DT_CP_MAX);
    if (t->seq_len % (2 * cp))
        return dt_fail(ctx, DT_ERR_CONFIG, "training.seq_len=%d must be a multiple of 2 x parallel.cp = %d (each CP rank "
                       "holds 2 chunks of every sequence)", t->seq_len, 2 * cp);
    if (t->model.n_experts > 0 && t->moe_capacity > 0.0f)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.cp=%d with parallel.moe_capacity_factor=%g: an expert's capacity is "
                       "decided over a source rank's rows, and a CP rank holds only part of each sequence (a mixture of "
                       "experts runs dropless under context parallelism)", cp, t->moe_capacity);
    if (t->model.n_experts > 0 && t->moe_aux_layer)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.moe_aux_loss_type=layer with parallel.cp=%d: not built (a layer's "
                       "loss needs its choice counts and probability sums over the whole sequence; decision 93)", cp);
    const char *why = c->sp                                       ? "parallel.sequence_parallel"
                      : c->hybrid                                 ? "parallel.hybrid"
                      : t->model_opts.lora.rank > 0 || t->model_opts.lora.nf4 ? "lora.rank"
                      : t->parallel.compression != DT_COMPRESS_NONE ? "parallel.compression"
                                                                  : NULL;
    if (why)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.cp=%d with %s: not built yet (issue 33; context parallelism runs "
                       "with data parallelism, every ZeRO stage, bf16/fp16 and activation checkpointing)", cp, why);
    return DT_OK;
}

/* Tensor parallelism's degree against the model and what it composes with (decision 62):
 * one line naming the keys, before anything is allocated. Every data-parallel strategy works
 * over the DP ranks (hybrid sharding and Top-K compression included: decision 70). */
dt_status dt_cfg_check_tp(dt_ctx *ctx, const dt_run_cfg *c) {
    const dt_train_cfg *t = &c->train;
    if (c->tp_blocks && c->tp < 2)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp_blocks needs parallel.tp >= 2 (got %d)", c->tp);
    if (c->tp < 2) return DT_OK;
    if (t->model.n_experts > 0 && (c->pp > 1 || c->pp_blocks)) /* decision 91 */
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp with parallel.tp=%d and model.n_experts=%d: a pipeline of a "
                       "tensor-parallel mixture of experts is not built", c->tp, t->model.n_experts);
    return dt_model_tp_check(ctx, &t->model, &t->model_opts); /* t->model: validated by dt_cfg_finish */
}

/* Pipeline stages against the model (parallel/pp_split.h): at most DT_PP_MAX and at most one
 * per layer; explicit layer counts (parallel.pp_layers) one per stage, each >= 1, summing to
 * model.n_layer. */
dt_status dt_cfg_check_pp(dt_ctx *ctx, const dt_run_cfg *c) {
    const int L = c->train.model.n_layer;
    if (c->pp_layers.n) {
        int first[DT_PP_MAX + 1];
        return dt_pp_split_explicit(ctx, c->pp_layers.v, c->pp_layers.n, c->pp, L, first);
    }
    return dt_pp_check_degree(ctx, c->pp, L);
}

