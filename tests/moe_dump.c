/* moe_dump HFDIR TOKENS T OUT - a Hugging Face Mixtral directory imported (config.json,
 * safetensors, one file or shards) and run on one sample: TOKENS holds T + 1 little-endian
 * uint16 tokens (inputs tokens[0:T], targets tokens[1:T+1]). OUT (safetensors) gets "logits"
 * F32 (T, V), "loss" F32 (1) (cross-entropy + the router losses at coefficient 0: the
 * cross-entropy), and "choices" I32 (n_layer, T, experts_topk): each layer's chosen experts
 * by decreasing router probability; then "cap1_loss" F32 (1) and "cap1_dropped" I32 (1), the
 * loss and the dropped choices of a forward with parallel.moe_capacity_factor 1.0.
 * tests/ref/hf_mixtral_check.py compares them with its
 * float64 PyTorch Mixtral. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hf_import.h"
#include "ckpt/safetensors.h"
#include "core/log.h"
#include "model/llama/llama.h"

static int run(dt_ctx *ctx, const char *dir, const char *tokens, int T, const char *out) {
    dt_model_config c;
    char tok[32];
    DT_CHECK(dt_hf_config(ctx, dir, &c, tok, sizeof tok));
    if (!c.n_experts) return dt_fail(ctx, DT_ERR_CONFIG, "%s: not a mixture of experts", dir);
    FILE *f = fopen(tokens, "rb");
    if (T < 1 || T > c.context) return dt_fail(ctx, DT_ERR_CONFIG, "T must be in [1, %d] (got %d)", c.context, T);
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot open", tokens);
    uint16_t *raw = malloc((size_t)(T + 1) * sizeof *raw);
    size_t got = fread(raw, sizeof *raw, (size_t)T + 1, f);
    fclose(f);
    if (got != (size_t)T + 1) {
        free(raw);
        return dt_fail(ctx, DT_ERR_IO, "%s: fewer than %d tokens", tokens, T + 1);
    }
    int32_t *in = malloc((size_t)T * sizeof *in), *tg = malloc((size_t)T * sizeof *tg);
    for (int t = 0; t < T; t++) in[t] = raw[t], tg[t] = raw[t + 1];
    free(raw);
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m;
    DT_CHECK(dt_model_init(ctx, &m, &c, &alloc, 1, T, DT_SLAB_PARAMS | DT_SLAB_GRADS));
    DT_CHECK(dt_hf_load(ctx, &m, dir));
    float loss;
    DT_CHECK(dt_model_forward(ctx, &m, in, tg, &loss));
    const int V = c.vocab, Vp = c.vocab_padded, L = c.n_layer, k = c.experts_topk;
    float *logits = malloc((size_t)T * V * sizeof *logits);
    for (int t = 0; t < T; t++) memcpy(logits + (size_t)t * V, dt_model_logits(&m) + (size_t)t * Vp, V * sizeof(float));
    int32_t *ch = malloc((size_t)L * T * k * sizeof *ch);
    for (int l = 0; l < L; l++) memcpy(ch + (size_t)l * T * k, dt_llama_moe_choices(&m, l), (size_t)T * k * sizeof *ch);
    /* again with parallel.moe_capacity_factor 1.0: the loss and the choices dropped */
    float cap_loss;
    m.moe_capacity = 1.0f;
    DT_CHECK(dt_model_forward(ctx, &m, in, tg, &cap_loss));
    int32_t dropped = (int32_t)m.moe_dropped;
    dt_st_entry e[] = {
        {"logits", DT_ST_F32, 2, {T, V}, logits},
        {"loss", DT_ST_F32, 1, {1}, &loss},
        {"choices", DT_ST_I32, 3, {L, T, k}, ch},
        {"cap1_loss", DT_ST_F32, 1, {1}, &cap_loss},
        {"cap1_dropped", DT_ST_I32, 1, {1}, &dropped},
    };
    dt_status st = dt_st_write(ctx, out, e, 5, NULL);
    free(logits), free(ch), free(in), free(tg);
    dt_model_free(&m);
    return st;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: moe_dump HFDIR TOKENS T OUT\n");
        return 2;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (run(&ctx, argv[1], argv[2], atoi(argv[3]), argv[4]) != 0) {
        dt_log_error(&ctx, "%s", ctx.err);
        return 1;
    }
    return 0;
}
