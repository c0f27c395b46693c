/* plan_impl.h - helpers shared by the planner's files (not part of its interface). */
#ifndef DT_PLAN_IMPL_H
#define DT_PLAN_IMPL_H

#include "parallel/pp_split.h"
#include "plan/plan.h"

/* A layout's pipeline stages under the rule of parallel/pp_split.h (dt_plan_pp_split). */
typedef struct dt_plan_stages {
    int pp;
    int heavy;  /* the most expensive stage (ties: the one with more layers, then the first) */
    double u;   /* pp x its cost / all stages' cost: how much slower than a perfect split (1: pp 1) */
    int first[DT_PP_RULE_MAX + 1];
} dt_plan_stages;
void dt_plan_stages_of(const dt_plan_model *m, int T, int pp, dt_plan_stages *out);
static inline int dt_plan_stage_n(const dt_plan_stages *s, int st) { return s->first[st + 1] - s->first[st]; }
/* Layers of the most expensive pipeline stage at sequence length T (the rule's split). */
double dt_plan_stage_layers(const dt_plan_model *m, const dt_plan_layout *l, int T);
/* Parameters held by one device of pipeline stage `stage` (its layers under the rule's split at
 * sequence length T; tensor and expert split applied). */
double dt_plan_stage_params(const dt_plan_model *m, const dt_plan_layout *l, int T, int stage);
/* The same for stages already cut (st: dt_plan_stages_of for l->pp). */
double dt_plan_stages_params(const dt_plan_model *m, const dt_plan_layout *l, const dt_plan_stages *st, int stage);
/* Parameters of the largest unit ZeRO-2/3 hold whole (a layer or the vocabulary matrix) per device. */
double dt_plan_unit_params(const dt_plan_model *m, const dt_plan_layout *l);
/* The schedule a job's pipeline of pp stages and m micro-batches is priced with (plan_pipe.c,
 * decisions 95-96): its train.pp_kind with *v = train.pp_virtual chunks (interleaved) or 1; 1F1B
 * with *v = 1 where dtrain's schedule check refuses them. */
int dt_plan_pp_kind(const dt_plan_job *job, int pp, int m, int *v);
/* The attention core's training FLOPs a token, QK^T and PV forward and backward: 12 L T d (a
 * third of it in the forward). */
double dt_plan_attn_flops(const dt_plan_model *m, int T);
/* Ranks a ZeRO stage shards over: dp, or under hybrid sharding the dp ranks of one node. */
int dt_plan_shard_ranks(const dt_plan_job *job, const dt_plan_layout *l);

#endif
