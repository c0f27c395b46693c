/* lora_dump OUTDIR CASE - writes what tests/ref/lora_ref.py needs to check dtrain's LoRA
 * against a PyTorch model written from the LoRA paper: the frozen base weights (dtrain names,
 * "out x in", unpadded vocabulary), the adapters (lora_B drawn non-zero here, so every
 * gradient is), one batch, and dtrain's loss and adapter gradients of one forward/backward
 * (lora.safetensors; metadata: the config, rank, alpha, targets).
 * CASE: llama (grouped-query attention, untied head, every target), llama-mqa (multi-query,
 * tied head, q,v), gpt2 (q,k,v,o,up,down: q, k, v are the thirds of c_attn), gpt2-kv (k,v). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/model_file.h"
#include "ckpt/safetensors.h"
#include "core/rng.h"
#include "model/lora.h"

static int run(dt_ctx *ctx, const char *dir, const char *cs) {
    dt_model_config mc;
    const char *targets;
    if (!strcmp(cs, "llama") || !strcmp(cs, "llama-mqa")) {
        int mqa = cs[5] != 0;
        mc = (dt_model_config){.family = "llama", .n_layer = 2, .d_model = 48, .n_head = 4,
                               .n_kv_head = mqa ? 1 : 2, .d_ff = 72, .vocab = 300, .context = 16,
                               .untied = !mqa, .rope_theta = 500.0f, .norm_eps = 1e-5f};
        targets = mqa ? "q,v" : "q,k,v,o,gate,up,down";
    } else if (!strcmp(cs, "gpt2") || !strcmp(cs, "gpt2-kv")) {
        mc = (dt_model_config){.family = "gpt2", .n_layer = 2, .d_model = 48, .n_head = 4, .vocab = 300,
                               .context = 16};
        targets = cs[4] ? "k,v" : "q,k,v,o,up,down";
    } else {
        return dt_fail(ctx, DT_ERR_CONFIG, "unknown case '%s' (llama, llama-mqa, gpt2, gpt2-kv)", cs);
    }
    dt_model_opts o = {DT_RECOMPUTE_NONE, 1, DT_F32, 0, 0, {4, 12.0f, 0.0f, 0, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    DT_CHECK(dt_lora_parse_targets(ctx, targets, &o.lora.targets));
    dt_alloc al;
    dt_alloc_init(&al);
    dt_model m;
    const int B = 2, T = 12, N = B * T;
    DT_CHECK(dt_model_init_opts(ctx, &m, &mc, &o, &al, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS));
    dt_model_init_weights(&m, 42);
    /* lora_B starts at zero in training; drawn here so dA and the branch's dx are non-zero */
    for (int id = 1; id < m.ps.n_tensors; id += 2)
        for (int l = 0; l < m.cfg.n_layer; l++) {
            float *b = dt_params_tensor(&m.ps, m.ps.params, id, l);
            size_t n = m.ps.tensors[id].rows * m.ps.tensors[id].cols;
            for (size_t i = 0; i < n; i++) b[i] = 0.05f * dt_rng_normal(7, (uint64_t)id << 8 | (uint64_t)l, i);
        }
    int32_t in[24], tg[24];
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)((i * 131 + 17) % mc.vocab);
        tg[i] = (int32_t)((i * 47 + 5) % mc.vocab);
    }
    float loss;
    dt_params_zero_grad(&m.ps);
    DT_CHECK(dt_model_forward(ctx, &m, in, tg, &loss));
    dt_model_backward(&m, 1.0f);

    static dt_st_entry e[512];
    static char names[512][DT_ST_NAME_MAX];
    dt_model base = m; /* the frozen store as a model of its own, for its file entries */
    base.lora = 0;
    base.ps = m.base;
    int n = dt_model_file_entries(&base, base.ps.params, "", e, names);
    n += dt_model_file_entries(&m, m.ps.params, "", e + n, names + n);
    n += dt_model_file_entries(&m, m.ps.grads, "grad.", e + n, names + n);
    e[n++] = (dt_st_entry){"inputs", DT_ST_I32, 2, {B, T}, in};
    e[n++] = (dt_st_entry){"targets", DT_ST_I32, 2, {B, T}, tg};
    e[n++] = (dt_st_entry){"loss", DT_ST_F32, 1, {1}, &loss};
    char v[12][32];
    snprintf(v[0], 32, "%d", mc.n_layer), snprintf(v[1], 32, "%d", mc.d_model), snprintf(v[2], 32, "%d", mc.n_head);
    snprintf(v[3], 32, "%d", m.cfg.n_kv_head), snprintf(v[4], 32, "%d", m.cfg.d_ff), snprintf(v[5], 32, "%d", mc.vocab);
    snprintf(v[6], 32, "%d", mc.context), snprintf(v[7], 32, "%d", mc.untied), snprintf(v[8], 32, "%.9g", (double)m.cfg.rope_theta);
    snprintf(v[9], 32, "%.9g", (double)m.cfg.norm_eps), snprintf(v[10], 32, "%d", o.lora.rank);
    snprintf(v[11], 32, "%.9g", (double)o.lora.alpha);
    const char *meta[] = {"family", mc.family, "n_layer", v[0], "d_model", v[1], "n_head", v[2], "n_kv_head", v[3],
                          "d_ff", v[4], "vocab", v[5], "context", v[6], "untied", v[7], "rope_theta", v[8],
                          "norm_eps", v[9], "rank", v[10], "alpha", v[11], "targets", targets, NULL};
    char path[4096];
    snprintf(path, sizeof path, "%s/lora.safetensors", dir);
    dt_status st = dt_st_write(ctx, path, e, n, meta);
    printf("%s: loss %.7f, %zu adapter parameters, %d tensors written\n", cs, loss, m.ps.n_params, n);
    dt_model_free(&m);
    return st;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: lora_dump OUTDIR CASE\n");
        return 2;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (run(&ctx, argv[1], argv[2]) != DT_OK) {
        fprintf(stderr, "lora_dump: %s\n", ctx.err);
        return 1;
    }
    return 0;
}
