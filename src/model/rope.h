/* rope.h - the frequencies of rotary position embeddings for the RoPE families (llama): the
 * plain rule and Hugging Face's `rope_scaling` rules linear, llama3 (Llama 3.1) and yarn.
 *
 * With base frequencies f_i = theta^(-2i/hs), i < hs/2, wavelength w_i = 2 pi / f_i:
 *   none    f_i
 *   linear  f_i / factor                                 (positions divided by factor)
 *   llama3  w_i < orig / high_freq_factor: f_i;  w_i > orig / low_freq_factor: f_i / factor;
 *           between: (1 - s) f_i / factor + s f_i,  s = (orig / w_i - low) / (high - low)
 *   yarn    r_i = clamp((i - lo) / (hi - lo), 0, 1) with lo = floor(d(beta_fast)),
 *           hi = ceil(d(beta_slow)) clamped to [0, hs - 1] (hi += 0.001 when lo == hi),
 *           d(b) = hs ln(orig / (2 pi b)) / (2 ln theta);  f_i (1 - r_i) + f_i / factor r_i,
 *           and cos, sin scaled by attention_factor (default 0.1 ln(factor) + 1; 1 when
 *           factor <= 1)
 * (orig = rope_original_context). Computed once per model in double; the kernel takes them
 * rounded to float (ops.h), the plain rule as Hugging Face's float32 values. */
#ifndef DT_ROPE_H
#define DT_ROPE_H

#include "core/status.h"
#include "model/model.h"

typedef enum dt_rope_scaling { DT_ROPE_NONE, DT_ROPE_LINEAR, DT_ROPE_LLAMA3, DT_ROPE_YARN } dt_rope_scaling;
/* "none", "linear", "llama3", "yarn", NULL: the model.rope_scaling words. */
extern const char *const dt_rope_scaling_names[];

/* `value` as a scaling rule, refused in one line naming `key` (dynamic: an inference-time
 * rule; anything else: not one of the words). */
dt_status dt_rope_scaling_parse(dt_ctx *ctx, const char *key, const char *value, int *out);
/* A RoPE family's checks of the scaling keys (naming the bad one), defaults filled. */
dt_status dt_rope_validate(dt_ctx *ctx, dt_model_config *c);
/* A family without rotary embeddings: any model.rope_* key set is refused naming it, with
 * `why` ("gpt2 has learned positions, not rotary"). */
dt_status dt_rope_refuse(dt_ctx *ctx, const dt_model_config *c, const char *why);
/* inv[0..hs/2) = the frequencies of the rule above in double; returns the cos/sin scale. */
double dt_rope_freqs(const dt_model_config *c, int hs, double *inv);
/* What the kernel takes: inv[0..hs/2) in float (plain: Hugging Face's float32
 * fl(1 / fl(theta^fl(2i/hs))), bitwise as before scaling existed; scaled: the double values
 * rounded) and the cos/sin scale. */
void dt_rope_kernel_freqs(const dt_model_config *c, int hs, float *inv, float *scale);

#endif
