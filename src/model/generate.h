/* generate.h - autoregressive sampling from a GPT-2: temperature, top-k, a seed.
 *
 * The model must have been initialised with B = 1; its T is the window: generation past T
 * tokens keeps the last T as context. Temperature 0 is greedy decoding.
 *
 *   dt_gen_cfg g = {.max_new = 200, .temperature = 0.8f, .top_k = 40, .seed = 1, .stop = eot};
 *   DT_CHECK(dt_generate(ctx, &m, prompt, n_prompt, &g, out, &n_out));
 */
#ifndef DT_GENERATE_H
#define DT_GENERATE_H

#include <stdint.h>

#include "model/model.h"

typedef struct dt_gen_cfg {
    int max_new;       /* tokens to generate */
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = whole vocabulary */
    uint64_t seed;
    int stop;          /* stop after generating this token (-1 = never) */
    int vocab_limit;   /* sample only ids below this (0 = the model's whole vocabulary) */
    /* Called with each generated token as soon as it is chosen (NULL = none): streaming. */
    dt_status (*on_token)(dt_ctx *ctx, void *ud, int32_t token);
    void *on_token_ud;
} dt_gen_cfg;

/* out receives the generated tokens only (room for g->max_new); *n_out their count. */
dt_status dt_generate(dt_ctx *ctx, dt_model *m, const int32_t *prompt, int n_prompt,
                      const dt_gen_cfg *g, int32_t *out, int *n_out);

/* Picks a token from logits (V) as dt_generate does; scratch holds V floats. Exposed for
 * tests. */
int dt_sample_logits(const float *logits, int V, float temperature, int top_k, float u,
                     float *scratch);

#endif
