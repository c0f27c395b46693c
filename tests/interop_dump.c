/* interop_dump OUTDIR - a small GPT-2 with random values in every parameter (biases and
 * layernorm weights too, so a misplaced or untransposed tensor changes the logits), saved
 * as OUTDIR/model.safetensors, and dtrain's logits for one batch in OUTDIR/ref.safetensors
 * ("inputs" I32 (B,T), "logits" F32 (B,T,V)). tests/ref/hf_gpt2_check.py runs the Hugging
 * Face export of the model file in HF's convention and compares. Vocabulary 300 (padded to
 * 384 inside dtrain), head size 12, 2 layers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/model_file.h"
#include "model/gpt2/gpt2.h"
#include "core/log.h"
#include "data/synthetic.h"

static int run(dt_ctx *ctx, const char *dir) {
    dt_model_config c = {.n_layer = 2, .d_model = 48, .n_head = 4, .vocab = 300, .context = 32};
    int B = 2, T = 24;
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m;
    DT_CHECK(dt_model_init(ctx, &m, &c, &alloc, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS));
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < m.ps.n_params; i++) { /* xorshift64*, uniform in [-0.25, 0.25) */
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        m.ps.params[i] = (float)((double)((s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0 - 0.5) * 0.5f;
    }
    const dt_gpt2_param_id ln[] = {DT_GPT2_P_LN1W, DT_GPT2_P_LN2W, DT_GPT2_P_LNFW};
    for (int k = 0; k < 3; k++)
        for (int l = 0; l < (ln[k] == DT_GPT2_P_LNFW ? 1 : c.n_layer); l++) {
            float *w = dt_params_tensor(&(&m)->ps, m.ps.params, ln[k], l);
            for (int i = 0; i < c.d_model; i++) w[i] += 1.0f;
        }
    float *wte = dt_params_tensor(&(&m)->ps, m.ps.params, DT_GPT2_P_WTE, 0);
    memset(wte + (size_t)m.cfg.vocab * c.d_model, 0,
           (size_t)(m.cfg.vocab_padded - m.cfg.vocab) * c.d_model * sizeof(float));

    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    DT_CHECK(dt_model_file_save(ctx, &m, path, "", 7));

    int32_t *in = malloc((size_t)B * T * 4), *tg = malloc((size_t)B * T * 4);
    float *logits = malloc((size_t)B * T * c.vocab * sizeof(float));
    dt_synthetic_batch(5, c.vocab, 0, B, T, in, tg);
    DT_CHECK(dt_model_forward(ctx, &m, in, NULL, NULL));
    for (int r = 0; r < B * T; r++)
        memcpy(logits + (size_t)r * c.vocab, dt_model_logits(&m) + (size_t)r * m.cfg.vocab_padded,
               (size_t)c.vocab * sizeof(float));
    dt_st_entry e[] = {{"inputs", DT_ST_I32, 2, {B, T}, in},
                       {"logits", DT_ST_F32, 3, {B, T, c.vocab}, logits}};
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    dt_status st = dt_st_write(ctx, path, e, 2, NULL);
    free(in);
    free(tg);
    free(logits);
    dt_model_free(&m);
    return st;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: interop_dump OUTDIR\n");
        return 2;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (run(&ctx, argv[1]) != DT_OK) {
        dt_log_error(&ctx, "%s", ctx.err);
        return 1;
    }
    return 0;
}
