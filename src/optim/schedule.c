#include <math.h>
#include <string.h>

#include "optim/optim.h"

float dt_lr_at(const dt_lr_schedule *s, long step) {
    if (s->kind == DT_SCHED_CONSTANT) return s->lr;
    if (step < s->warmup) return s->lr * (float)(step + 1) / (float)s->warmup;
    if (step >= s->total) return s->min_lr;
    double ratio = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    double coeff = s->kind == DT_SCHED_COSINE ? 0.5 * (1.0 + cos(M_PI * ratio)) : 1.0 - ratio;
    return (float)((double)s->min_lr + coeff * ((double)s->lr - (double)s->min_lr));
}

static const char *const sched_names[] = {"constant", "cosine", "linear"};

const char *dt_sched_kind_name(dt_sched_kind k) { return sched_names[k]; }

dt_status dt_lr_schedule_parse(dt_ctx *ctx, const char *name, dt_sched_kind *out) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, sched_names[i]) == 0) {
            *out = (dt_sched_kind)i;
            return DT_OK;
        }
    return dt_fail(ctx, DT_ERR_CONFIG,
                   "schedule.kind: unknown schedule '%s' (use constant, cosine or linear)", name);
}
