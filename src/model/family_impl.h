/* family_impl.h - helpers shared by the model families' forward/backward (internal to
 * src/model). */
#ifndef DT_FAMILY_IMPL_H
#define DT_FAMILY_IMPL_H

#include "core/timer.h"
#include "model/model.h"

/* Times `stmt` into m->prof.fwd/bwd[kind] when profiling is on. */
#define DT_PROF(m, dir, kind, stmt)                                                          \
    do {                                                                                     \
        double t0_ = (m)->profile ? dt_now() : 0.0;                                          \
        stmt;                                                                                \
        if ((m)->profile) (m)->prof.dir[kind] += dt_now() - t0_;                             \
    } while (0)

/* Activation layout: the next view of n floats at *off in base (NULL base: only count),
 * 64-byte aligned. Families lay their saved activations out with it, once to size them
 * (base NULL) and once to bind them. */
static inline float *dt_act_take(float *base, size_t *off, size_t n) {
    float *p = base ? base + *off : NULL;
    *off += (n + 15) / 16 * 16;
    return p;
}

/* Token ids come from files: refuses any outside [0, V), naming the position. */
dt_status dt_model_check_tokens(dt_ctx *ctx, const int32_t *inputs, const int32_t *targets, int n,
                                int V);
/* Mean of n per-position losses in a fixed order (deterministic); may be NaN/Inf. */
float dt_model_mean_loss(const float *losses, int n);

/* Refuses the vision keys (image_size, patch_size, channels, n_classes) for a language
 * family, naming the key. */
dt_status dt_model_refuse_vision(dt_ctx *ctx, const dt_model_config *c, const char *family);

#endif
