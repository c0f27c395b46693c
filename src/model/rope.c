/* RoPE frequencies: the plain rule and the rope_scaling rules (see rope.h). */
#include "model/rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

const char *const dt_rope_scaling_names[] = {"none", "linear", "llama3", "yarn", NULL};

dt_status dt_rope_scaling_parse(dt_ctx *ctx, const char *key, const char *value, int *out) {
    for (int i = 0; dt_rope_scaling_names[i]; i++)
        if (!strcmp(value, dt_rope_scaling_names[i])) {
            *out = i;
            return DT_OK;
        }
    if (!strcmp(value, "dynamic"))
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "%s: 'dynamic' is not supported: dynamic NTK scaling is an inference-time rule "
                       "(its frequencies change with each sequence's length); dtrain trains with fixed "
                       "ones: none, linear, llama3 or yarn", key);
    return dt_fail(ctx, DT_ERR_CONFIG, "%s: '%s' is not one of none, linear, llama3, yarn", key, value);
}

/* The parameters, in the order of their keys. */
typedef struct rope_param {
    const char *key;
    size_t off;
    int is_int;
} rope_param;
#define RP(field, is_int) {"model." #field, offsetof(dt_model_config, field), is_int}
static const rope_param params[] = {
    RP(rope_factor, 0),    RP(rope_low_freq_factor, 0), RP(rope_high_freq_factor, 0),
    RP(rope_original_context, 1), RP(rope_beta_fast, 0), RP(rope_beta_slow, 0),
    RP(rope_attention_factor, 0),
};
#undef RP
#define NPARAMS (int)(sizeof params / sizeof params[0])

static double pget(const dt_model_config *c, int k) {
    const char *p = (const char *)c + params[k].off;
    return params[k].is_int ? (double)*(const int *)p : (double)*(const float *)p;
}

/* Bits of params[] each rule uses. */
#define P_FACTOR 1u
#define P_LOW 2u
#define P_HIGH 4u
#define P_ORIG 8u
#define P_BFAST 16u
#define P_BSLOW 32u
#define P_ATTN 64u
static const unsigned uses[] = {0, P_FACTOR, P_FACTOR | P_LOW | P_HIGH | P_ORIG,
                                P_FACTOR | P_ORIG | P_BFAST | P_BSLOW | P_ATTN};

dt_status dt_rope_refuse(dt_ctx *ctx, const dt_model_config *c, const char *why) {
    if (c->rope_scaling != DT_ROPE_NONE) return dt_fail(ctx, DT_ERR_CONFIG, "model.rope_scaling: %s", why);
    for (int k = 0; k < NPARAMS; k++)
        if (pget(c, k) != 0.0) return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s", params[k].key, why);
    return DT_OK;
}

dt_status dt_rope_validate(dt_ctx *ctx, dt_model_config *c) {
    if (c->rope_scaling < DT_ROPE_NONE || c->rope_scaling > DT_ROPE_YARN)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.rope_scaling: unknown rule %d", c->rope_scaling);
    const char *rule = dt_rope_scaling_names[c->rope_scaling];
    for (int k = 0; k < NPARAMS; k++)
        if (!(uses[c->rope_scaling] & (1u << k)) && pget(c, k) != 0.0)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s is set (%g) but model.rope_scaling %s does not use it%s",
                           params[k].key, pget(c, k), rule,
                           c->rope_scaling == DT_ROPE_NONE ? " (set model.rope_scaling: linear, llama3 or yarn)" : "");
    if (c->rope_scaling == DT_ROPE_NONE) return DT_OK;
    if (!(c->rope_factor >= 1.0f && c->rope_factor <= 1e6f))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.rope_factor must be in [1, 1e6] for rope_scaling %s (got %g)",
                       rule, (double)c->rope_factor);
    if (c->rope_scaling == DT_ROPE_LINEAR) return DT_OK;
    if (c->rope_original_context < 1 || c->rope_original_context > (1 << 20))
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "model.rope_original_context (the context before scaling) must be in [1, 1048576] for "
                       "rope_scaling %s (got %d)", rule, c->rope_original_context);
    if (c->rope_scaling == DT_ROPE_LLAMA3) {
        if (!(c->rope_low_freq_factor > 0.0f && c->rope_low_freq_factor <= 1e6f))
            return dt_fail(ctx, DT_ERR_CONFIG,
                           "model.rope_low_freq_factor must be in (0, 1e6] for rope_scaling llama3 (got %g; "
                           "Llama 3.1: 1)", (double)c->rope_low_freq_factor);
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_high_freq_factor <= 1e6f))
            return dt_fail(ctx, DT_ERR_CONFIG,
                           "model.rope_high_freq_factor (%g) must exceed model.rope_low_freq_factor (%g) and be "
                           "<= 1e6 for rope_scaling llama3 (Llama 3.1: 4 and 1)",
                           (double)c->rope_high_freq_factor, (double)c->rope_low_freq_factor);
        return DT_OK;
    }
    if (c->rope_beta_fast == 0.0f) c->rope_beta_fast = 32.0f; /* the YaRN paper's */
    if (c->rope_beta_slow == 0.0f) c->rope_beta_slow = 1.0f;
    if (!(c->rope_beta_slow > 0.0f && c->rope_beta_slow <= 1e6f))
        return dt_fail(ctx, DT_ERR_CONFIG, "model.rope_beta_slow must be in (0, 1e6] (got %g)",
                       (double)c->rope_beta_slow);
    if (!(c->rope_beta_fast > c->rope_beta_slow && c->rope_beta_fast <= 1e6f))
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "model.rope_beta_fast (%g) must exceed model.rope_beta_slow (%g) and be <= 1e6",
                       (double)c->rope_beta_fast, (double)c->rope_beta_slow);
    if (!(c->rope_attention_factor >= 0.0f && c->rope_attention_factor <= 1e3f))
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "model.rope_attention_factor must be in (0, 1000], or 0 for 0.1 ln(factor) + 1 (got %g)",
                       (double)c->rope_attention_factor);
    return DT_OK;
}

double dt_rope_freqs(const dt_model_config *c, int hs, double *inv) {
    const int h2 = hs / 2;
    const double theta = c->rope_theta, factor = c->rope_factor, orig = c->rope_original_context;
    for (int i = 0; i < h2; i++) inv[i] = 1.0 / pow(theta, (double)(2 * i) / (double)hs);
    switch ((dt_rope_scaling)c->rope_scaling) {
    case DT_ROPE_NONE:
        return 1.0;
    case DT_ROPE_LINEAR:
        for (int i = 0; i < h2; i++) inv[i] /= factor;
        return 1.0;
    case DT_ROPE_LLAMA3: {
        const double low = c->rope_low_freq_factor, high = c->rope_high_freq_factor;
        const double long_wave = orig / low, short_wave = orig / high; /* long > short */
        for (int i = 0; i < h2; i++) {
            const double w = 2.0 * M_PI / inv[i];
            if (w > long_wave) {
                inv[i] /= factor;
            } else if (w >= short_wave) {
                const double s = (orig / w - low) / (high - low);
                inv[i] = (1.0 - s) * inv[i] / factor + s * inv[i];
            }
        }
        return 1.0;
    }
    case DT_ROPE_YARN: {
        /* the dimension (of hs) at which a frequency turns b times over orig positions */
        const double lt = 2.0 * log(theta);
        double lo = floor(hs * log(orig / (2.0 * M_PI * c->rope_beta_fast)) / lt);
        double hi = ceil(hs * log(orig / (2.0 * M_PI * c->rope_beta_slow)) / lt);
        if (lo < 0.0) lo = 0.0;
        if (hi > hs - 1) hi = hs - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < h2; i++) {
            double r = (i - lo) / (hi - lo);
            r = r < 0.0 ? 0.0 : r > 1.0 ? 1.0 : r;
            inv[i] = inv[i] * (1.0 - r) + inv[i] / factor * r;
        }
        if (c->rope_attention_factor > 0.0f) return c->rope_attention_factor;
        return factor <= 1.0 ? 1.0 : 0.1 * log(factor) + 1.0;
    }
    }
    return 1.0;
}

void dt_rope_kernel_freqs(const dt_model_config *c, int hs, float *inv, float *scale) {
    if (c->rope_scaling == DT_ROPE_NONE) {
        dt_rope_inv_freq(inv, hs, c->rope_theta);
        *scale = 1.0f;
        return;
    }
    double *d = malloc((size_t)(hs / 2) * sizeof(double) + 1);
    DT_ASSERT(d != NULL);
    *scale = (float)dt_rope_freqs(c, hs, d);
    for (int i = 0; i < hs / 2; i++) inv[i] = (float)d[i];
    free(d);
}
