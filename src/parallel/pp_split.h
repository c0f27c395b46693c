/* pp_split.h - the one rule that cuts a model's layers into pipeline stages (issue 32 item 1;
 * ARCHITECTURE decision 76), shared by the trainer and the planner (plan/plan_mem.c), and the
 * explicit override parallel.pp_layers.
 *
 * Cost. A stage costs the training FLOPs per token of what it runs: its layers, plus the
 * embedding on stage 0 and the final norm, head and loss on the last stage. Layers are the
 * family's own count (model.h flops_per_token: 6 x parameters + the 12 T C attention term;
 * the per-layer part is flops_per_token's growth per layer, so the two cannot drift), the head
 * 6 x (head + final norm parameters) as flops_per_token counts it, plus two terms
 * flops_per_token leaves out, given FLOP-equivalents here:
 *   - an embedding lookup moves C values per token and table: a copy of C values in the
 *     forward and a read-add-write of C gradient values in the backward, counted 1 + 2 =
 *     DT_PP_LOOKUP_FLOPS per value (gpt2: token and position tables; llama: one table; vit:
 *     its patch embedding is a matmul, counted 6 x its parameters, plus the class-token and
 *     position table over T positions);
 *   - the loss reads each logit for the max, the exponential and the sum in the forward and
 *     normalises and scales it in the backward: DT_PP_LOSS_FLOPS per logit (vocabulary or
 *     classes).
 * Every family's layers cost the same, so a stage's cost is n_s x layer + its extras.
 *
 * Rule. Among the contiguous splits of L layers into pp stages of >= 1 layer each (pp <= L):
 *   1. the smallest cost of the most expensive stage (exact: the optimum is one of the 3 L
 *      values embed + k layer, k layer, head + k layer; the smallest feasible one is taken);
 *   2. then the most even layer counts (the smallest sum of their squares);
 *   3. then the fewest layers on the last stage (the head's stage lighter);
 *   4. then the fewest on stage 0, then stage 1, ... (earlier stages lighter: stage 0 also
 *      holds the embedding and, under 1F1B, the most micro-batches in flight).
 * Costs compare with a relative tolerance of 1e-9 (equal up to rounding = tied).
 *
 *   int first[DT_PP_MAX + 1];
 *   dt_pp_split(&cfg, T, pp, first);        // layers [first[s], first[s+1]) on stage s
 */
#ifndef DT_PP_SPLIT_H
#define DT_PP_SPLIT_H

#include "core/status.h"
#include "model/model.h"

#define DT_PP_MAX 64        /* pipeline stages at most (a run's parallel.pp) */
#define DT_PP_RULE_MAX 1024 /* stages the rule cuts at most (the planner's long pipelines) */

/* FLOP-equivalents of the two terms flops_per_token does not count (above). */
#define DT_PP_LOOKUP_FLOPS 3.0 /* per embedding value per token (forward copy + backward add) */
#define DT_PP_LOSS_FLOPS 5.0   /* per logit per token (max, exp, sum; normalise, scale) */

/* A model's costs per token, in training FLOPs: the embedding's (stage 0), one layer's, and
 * the final norm, head and loss's (the last stage). */
typedef struct dt_pp_costs {
    double embed, layer, head;
} dt_pp_costs;

/* The costs of config c (validated) at sequence length T (ignored by vit: its sequence is the
 * image). embed + n_layer x layer + head = dt_model_flops_per_token + the lookup and loss terms. */
void dt_pp_costs_of(const dt_model_config *c, int T, dt_pp_costs *out);
/* The rule over costs k for L layers and pp stages (1 <= pp <= L; first has room for pp + 1):
 * first[s] = the first layer of stage s, first[pp] = L. pp up to DT_PP_RULE_MAX (the planner
 * refuses more); beyond it the layers are cut evenly by count. */
void dt_pp_split_costs(const dt_pp_costs *k, int L, int pp, int *first);
/* Stage s's cost under boundaries first[] of pp stages. */
double dt_pp_costs_stage(const dt_pp_costs *k, int pp, const int first[], int s);

/* Stage boundaries for a model of L = c->n_layer layers over pp stages (the rule above;
 * 1 <= pp <= min(L, DT_PP_MAX): the config refuses more). */
void dt_pp_split(const dt_model_config *c, int T, int pp, int first[DT_PP_MAX + 1]);
/* Stage s's cost (training FLOPs per token) under boundaries first[] (for logs, bench). */
double dt_pp_stage_cost(const dt_model_config *c, int T, int pp, const int first[], int s);
/* parallel.pp against the model: at most DT_PP_MAX stages and one layer each at least (one
 * line naming the key), for the config layer and the trainer alike. */
dt_status dt_pp_check_degree(dt_ctx *ctx, int pp, int L);
/* parallel.pp_layers: explicit layer counts per stage (n of them): n == pp, each >= 1, sum ==
 * L, else one line naming parallel.pp_layers and the numbers; fills first[]. */
dt_status dt_pp_split_explicit(dt_ctx *ctx, const int *counts, int n, int pp, int L, int first[DT_PP_MAX + 1]);

#endif
