/* plan_impl.h - helpers shared by the planner's files (not part of its interface). */
#ifndef DT_PLAN_IMPL_H
#define DT_PLAN_IMPL_H

#include "plan/plan.h"

/* Layers of the fullest pipeline stage: ceil(L / pp). */
double dt_plan_stage_layers(const dt_plan_model *m, const dt_plan_layout *l);
/* Parameters held by one device of pipeline stage `stage` (tensor and expert split applied). */
double dt_plan_stage_params(const dt_plan_model *m, const dt_plan_layout *l, int stage);
/* Parameters of the largest unit ZeRO-2/3 hold whole (a layer or the vocabulary matrix) per device. */
double dt_plan_unit_params(const dt_plan_model *m, const dt_plan_layout *l);
/* Ranks a ZeRO stage shards over: dp, or under hybrid sharding the dp ranks of one node. */
int dt_plan_shard_ranks(const dt_plan_job *job, const dt_plan_layout *l);

#endif
