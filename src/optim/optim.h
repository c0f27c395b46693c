/* optim.h - AdamW, learning-rate schedules and global gradient-norm clipping.
 *
 * The optimizer works on flat ranges of the parameter vector described by segments
 * (offset, length, decay?), so the same code updates a whole model or one rank's shard.
 *
 *   dt_lr_schedule s = {DT_SCHED_COSINE, 6e-4f, 6e-5f, 100, 5000};
 *   float coef = dt_clip_coef(sqrt(dt_sumsq(grads, n)), 1.0f);
 *   dt_adamw_update(&opt, params, grads, m, v, segs, nsegs, dt_lr_at(&s, step), step + 1, coef);
 */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H

#include <stddef.h>

#include "core/status.h"

typedef struct dt_adamw {
    float beta1, beta2, eps, weight_decay;
} dt_adamw;

typedef struct dt_param_segment {
    size_t offset, len; /* in floats */
    int decay;          /* weight decay applies */
} dt_param_segment;

/* One AdamW step (torch.optim.AdamW semantics) on every segment, with the gradient scaled
 * by gscale on the fly (gradient clipping without a separate pass over the gradients):
 * g = grads * gscale; p *= 1 - lr wd (decay segments only); m, v moments;
 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). t is the 1-based step count. */
void dt_adamw_update(const dt_adamw *opt, float *params, const float *grads, float *m, float *v,
                     const dt_param_segment *segs, int nsegs, float lr, long t, float gscale);

/* AdamW for sparse, delayed gradients (Top-K with error feedback; parallel.compression_adam:
 * age). age[i] >= 1 counts the steps since element i last received a gradient, this one
 * included. An element whose gradient is 0 (nothing arrived) keeps m, v, and moves only by
 * weight decay; age[i] += 1. An element whose gradient g (= grads * gscale) arrived after
 * a = age[i] steps is taken as a steps of the mean gradient g / a, the noise estimated from
 * the sum, g^2 / a: m = b1^a m + (1-b1^a) g/a; v = b2^a v + (1-b2^a) g^2/a;
 * p -= a lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps), the a steps of movement at once;
 * age[i] = 1. With every age 1 and no zero gradient this is dt_adamw_update's rule (the same
 * formula in scalar code, not guaranteed the same bits). Elementwise: any split, same bits. */
void dt_adamw_update_aged(const dt_adamw *opt, float *params, const float *grads, float *m, float *v,
                          float *age, const dt_param_segment *segs, int nsegs, float lr, long t, float gscale);

/* Dynamic loss scaling for fp16 (PyTorch GradScaler's rule): the loss is multiplied by
 * `scale` before the backward so small gradients survive the 16-bit GEMMs; the optimizer
 * divides it out. A step whose gradients overflow (Inf/NaN norm) is skipped and the scale
 * halved; after `interval` finite steps in a row it doubles. A static scale never changes
 * (overflowing steps are still skipped). The state is part of checkpoints.
 *
 *   dt_loss_scaler s; dt_loss_scaler_init(&s, 65536.0f, 1, 2000);
 *   backward with s.scale; norm = sqrt(sumsq) / s.scale;
 *   if (dt_loss_scaler_update(&s, isfinite(norm))) skip the step; else clip and update with
 *   gscale = clip_coef / s.scale. */
typedef struct dt_loss_scaler {
    float scale;    /* 1 = off */
    int dynamic;
    long interval;  /* finite steps in a row before the scale doubles */
    long good;      /* finite steps since the last change */
    long overflows; /* steps skipped for overflow since the start */
} dt_loss_scaler;
/* The smallest and largest scales a dynamic scaler reaches. */
#define DT_LOSS_SCALE_MIN (1.0f / 16777216.0f)
#define DT_LOSS_SCALE_MAX 16777216.0f
void dt_loss_scaler_init(dt_loss_scaler *s, float scale, int dynamic, long interval);
/* After a step: finite = its gradients are finite. Returns 1 when the step must be skipped
 * (an overflow), having backed the scale off. */
int dt_loss_scaler_update(dt_loss_scaler *s, int finite);

typedef enum dt_sched_kind { DT_SCHED_CONSTANT, DT_SCHED_COSINE, DT_SCHED_LINEAR } dt_sched_kind;

typedef struct dt_lr_schedule {
    dt_sched_kind kind;
    float lr, min_lr;
    long warmup; /* linear warm-up steps: lr (s+1)/warmup for s < warmup (not for constant) */
    long total;  /* decay ends at step `total`, min_lr after */
} dt_lr_schedule;

/* Learning rate at 0-based step s. */
float dt_lr_at(const dt_lr_schedule *s, long step);
dt_status dt_lr_schedule_parse(dt_ctx *ctx, const char *name, dt_sched_kind *out);
const char *dt_sched_kind_name(dt_sched_kind k);

/* Sum of squares in double, in fixed-size chunks summed in a fixed order: the result is
 * the same whatever the thread count, and the same on every ISA path (as is AdamW). */
double dt_sumsq(const float *x, size_t n);
/* Clipping coefficient of torch's clip_grad_norm_: min(1, max_norm / (norm + 1e-6));
 * max_norm <= 0 disables clipping (returns 1). */
float dt_clip_coef(double norm, float max_norm);

#endif
