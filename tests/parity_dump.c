/* parity_dump OUTDIR - writes what tests/ref/gpt2_ref.py needs to check dtrain against
 * PyTorch: initial weights (init.safetensors), batches (batch.safetensors), and dtrain's
 * logits, loss, every parameter gradient, and the losses and grad norms of 10 AdamW steps
 * with warm-up/cosine schedule, clipping and 2 accumulation micro-steps, then the weights and
 * both Adam moments after them (dtrain.safetensors).
 * The model is small but has every feature: vocabulary padding (1000 -> 1024), a vocabulary
 * stored as several chunk units (params.h: the embedding and head run chunk by chunk), head size 12
 * (not a multiple of the vector width), 2 layers.
 *
 * parity_dump OUTDIR [FAMILY [PRECISION]]: PRECISION fp32 (the default), bf16 or fp16 sets
 * model_opts.compute (training.precision): every matmul on 16-bit operands with fp32 results,
 * the rest fp32 (model/model.h). The metadata then carries "precision" and "loss_scale", the
 * scale the trainer's backward runs with (65536 for fp16's dynamic loss scaling, else 1): the
 * single batch's backward below runs with that scale too, so its 16-bit activation gradients
 * are the ones training sees, and its gradients are divided by it before they are written
 * (a power of two: the division is exact), i.e. "grad.*" are always the unscaled gradients of
 * the mean loss. The training steps report unscaled norms and the moments of unscaled
 * gradients already (the trainer divides the scale out). A step skipped for overflow would
 * make the comparison meaningless: parity_dump refuses it.
 * Mixed precision also writes both Adam moments after the first training step
 * ("step1.exp_avg.<param>", "step1.exp_avg_sq.<param>"): 16-bit rounding makes the 10-step runs
 * of dtrain and the oracle drift apart chaotically (tests/ref/gpt2_ref.py, MIXED_NOTE), so the
 * oracle holds the first step to its tolerances and the later ones only to a sanity bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/model_file.h"
#include "ckpt/safetensors.h"
#include "core/log.h"
#include "data/synthetic.h"
#include "train/trainer.h"

#define S_STEPS 10
#define ACCUM 2

/* Entries for every parameter tensor of `base` (params or grads), names with `prefix`. */
static int param_entries(const dt_model *m, float *base, const char *prefix, dt_st_entry *e,
                         char (*names)[DT_ST_NAME_MAX]) {
    return dt_model_file_entries(m, base, prefix, e, names);
}

/* family: "gpt2"; "llama" (grouped-query attention, untied head); "llama-mqa" (multi-query,
 * tied head). */
static int run(dt_ctx *ctx, const char *dir, const char *family, const char *precision) {
    dt_train_cfg cfg;
    dt_train_cfg_defaults(&cfg);
    if (!strcmp(precision, "fp32"))
        cfg.model_opts.compute = DT_F32;
    else if (!strcmp(precision, "bf16"))
        cfg.model_opts.compute = DT_BF16;
    else if (!strcmp(precision, "fp16"))
        cfg.model_opts.compute = DT_F16;
    else
        return dt_fail(ctx, DT_ERR_CONFIG, "unknown precision '%s' (fp32, bf16, fp16)", precision);
    cfg.loss_scale = 0.0f; /* auto: dynamic from 65536 for fp16, none otherwise */
    cfg.model_opts.fused_loss = 0; /* the logits are dumped (test_model: fused == stored, bitwise) */
    cfg.preset[0] = 0;
    if (!strcmp(family, "gpt2"))
        cfg.model = (dt_model_config){.n_layer = 2, .d_model = 48, .n_head = 4, .vocab = 1000, .context = 32};
    else if (!strcmp(family, "llama") || !strcmp(family, "llama-mqa"))
        /* d_ff 72 and head size 12: neither a multiple of the vector width. */
        cfg.model = (dt_model_config){.family = "llama", .n_layer = 2, .d_model = 48, .n_head = 4,
                                      .n_kv_head = family[5] ? 1 : 2, .d_ff = 72, .vocab = 1000,
                                      .context = 32, .untied = !family[5], .rope_theta = 500.0f,
                                      .norm_eps = 1e-5f};
    else if (!strcmp(family, "mixtral") || !strcmp(family, "mixtral-cap") || !strcmp(family, "mixtral-layer")) {
        /* LLaMA with a mixture of 4 experts of width 40, top-2 (model/llama/moe.h), both
         * router losses on; dropless, or (mixtral-cap) with parallel.moe_capacity_factor 1.0
         * (each expert keeps 16 of the micro-batch's 64 choices at most), or (mixtral-layer)
         * dropless with the layer-wise load-balancing loss (training.moe_aux_loss_type=layer). */
        cfg.model = (dt_model_config){.family = "llama", .n_layer = 2, .d_model = 48, .n_head = 4,
                                      .n_kv_head = 2, .vocab = 1000, .context = 32, .untied = 1,
                                      .rope_theta = 500.0f, .norm_eps = 1e-5f, .n_experts = 4,
                                      .experts_topk = 2, .expert_d_ff = 40};
        cfg.moe_aux_coef = 0.02f;
        cfg.moe_z_coef = 0.001f;
        if (!strcmp(family, "mixtral-cap")) cfg.moe_capacity = 1.0f;
        cfg.moe_aux_layer = !strcmp(family, "mixtral-layer");
    } else if (!strcmp(family, "vit"))
        /* 3 channels (their order in a patch matters), 4 patches + the class token, 7 classes. */
        cfg.model = (dt_model_config){.family = "vit", .n_layer = 2, .d_model = 48, .n_head = 4, .d_ff = 80,
                                      .image_size = 8, .patch_size = 4, .channels = 3, .n_classes = 7};
    else
        return dt_fail(ctx, DT_ERR_CONFIG, "unknown family '%s' (gpt2, llama, llama-mqa, mixtral, mixtral-cap, mixtral-layer, vit)", family);
    const int vit = !strcmp(family, "vit");
    cfg.micro_batch = vit ? 4 : 2;
    cfg.seq_len = vit ? 3 * 8 * 8 : 16; /* vit: one image */
    cfg.sched = (dt_lr_schedule){DT_SCHED_COSINE, 3e-3f, 3e-4f, 3, 8};
    /* LLaMA runs with Adam eps 1e-5: at 1e-8 a few of its ~60k weights have gradients near
     * 1e-8 by chance, where float32 rounding decides most of Adam's first step, and the 10-step
     * runs drift apart (measured 8.2e-4 on weights, 1.4e-4 on moments with GQA); at 1e-5 the
     * worst after-training error is 3.3e-6. ViT alike (1.45e-4 at 1e-8, 1.1e-6 at 1e-5). GPT-2
     * keeps the 1e-8 its tolerances were set on. */
    cfg.adamw = (dt_adamw){0.9f, 0.95f, strcmp(family, "gpt2") ? 1e-5f : 1e-8f, 0.1f};
    cfg.clip = 0.5f;
    cfg.seed = 42;
    cfg.accum = ACCUM;
    dt_trainer tr;
    DT_CHECK(dt_trainer_init(ctx, &tr, &cfg, NULL));
    dt_model *m = &tr.model;
    const float lscale = tr.scaler.scale; /* 1 unless fp16 */
    int B = m->B, T = m->T, V = m->cfg.vocab, Vp = m->cfg.vocab_padded;
    size_t bt = (size_t)B * T;

    static dt_st_entry e[512];
    static char names[512][DT_ST_NAME_MAX];
    char path[4096], buf[48][32];
    const char *meta[100];
    int k = 0;
#define META(key, fmt, val)                                                                  \
    do {                                                                                     \
        snprintf(buf[k / 2], sizeof buf[0], fmt, val);                                       \
        meta[k] = key;                                                                       \
        meta[k + 1] = buf[k / 2];                                                            \
        k += 2;                                                                              \
    } while (0)
    meta[k++] = "family";
    meta[k++] = m->cfg.family;
    META("n_layer", "%d", m->cfg.n_layer);
    META("d_model", "%d", m->cfg.d_model);
    META("n_head", "%d", m->cfg.n_head);
    META("vocab", "%d", V);
    META("context", "%d", m->cfg.context);
    if (vit) {
        META("d_ff", "%d", m->cfg.d_ff);
        META("image_size", "%d", m->cfg.image_size);
        META("patch_size", "%d", m->cfg.patch_size);
        META("channels", "%d", m->cfg.channels);
        META("n_classes", "%d", m->cfg.n_classes);
    }
    if (!strcmp(m->cfg.family, "llama")) {
        META("n_kv_head", "%d", m->cfg.n_kv_head);
        META("d_ff", "%d", m->cfg.d_ff);
        META("untied", "%d", m->cfg.untied);
        META("rope_theta", "%.9g", (double)m->cfg.rope_theta);
        META("norm_eps", "%.9g", (double)m->cfg.norm_eps);
    }
    if (m->cfg.n_experts) {
        META("n_experts", "%d", m->cfg.n_experts);
        META("experts_topk", "%d", m->cfg.experts_topk);
        META("expert_d_ff", "%d", m->cfg.expert_d_ff);
        META("moe_aux_coef", "%.9g", (double)cfg.moe_aux_coef);
        META("moe_z_coef", "%.9g", (double)cfg.moe_z_coef);
        META("moe_capacity", "%.9g", (double)cfg.moe_capacity);
        META("moe_aux_layer", "%d", cfg.moe_aux_layer);
    }
    META("B", "%d", B);
    META("T", "%d", T);
    META("lr", "%.9g", (double)cfg.sched.lr);
    META("min_lr", "%.9g", (double)cfg.sched.min_lr);
    META("warmup", "%ld", cfg.sched.warmup);
    META("total_steps", "%ld", cfg.sched.total);
    META("beta1", "%.9g", (double)cfg.adamw.beta1);
    META("beta2", "%.9g", (double)cfg.adamw.beta2);
    META("eps", "%.9g", (double)cfg.adamw.eps);
    META("weight_decay", "%.9g", (double)cfg.adamw.weight_decay);
    META("clip", "%.9g", (double)cfg.clip);
    meta[k++] = "precision";
    meta[k++] = precision;
    META("loss_scale", "%.9g", (double)lscale);
    meta[k++] = "train_steps";
    meta[k++] = "10";
    meta[k++] = "accum";
    meta[k++] = "2";
    meta[k] = NULL;
#undef META

    int n = param_entries(m, m->ps.params, "", e, names);
    snprintf(path, sizeof path, "%s/init.safetensors", dir);
    DT_CHECK(dt_st_write(ctx, path, e, n, meta));

    /* S x ACCUM training micro-batches, then the single batch of the gradient check. */
    enum { NB = S_STEPS * ACCUM };
    int32_t *in = malloc(bt * 4 * (NB + 1)), *tg = malloc(bt * 4 * (NB + 1));
    float *logits = malloc(bt * V * sizeof(float));
    float train_losses[S_STEPS], train_norms[S_STEPS];
    for (int s = 0; s <= NB; s++) dt_synthetic_batch(cfg.seed, V, (uint64_t)s, B, T, in + s * bt, tg + s * bt);
    /* vit: random pixels, one label per image in every target slot; the files hold it once. */
    const int NC = m->cfg.n_classes;
    int32_t *labels = malloc((size_t)B * (NB + 1) * sizeof(int32_t));
    for (int r = 0; vit && r < B * (NB + 1); r++) {
        labels[r] = tg[(size_t)r * T] % NC;
        for (int t = 0; t < T; t++) tg[(size_t)r * T + t] = labels[r];
    }
    const int32_t *in1 = in + NB * bt, *tg1 = tg + NB * bt; /* the single batch */
    dt_st_entry be[] = {
        {"inputs", DT_ST_I32, 2, {B, T}, in1},
        {"targets", DT_ST_I32, 2, {B, T}, tg1},
        {"train_inputs", DT_ST_I32, 4, {S_STEPS, ACCUM, B, T}, in},
        {"train_targets", DT_ST_I32, 4, {S_STEPS, ACCUM, B, T}, tg},
    };
    if (vit) {
        be[1] = (dt_st_entry){"targets", DT_ST_I32, 1, {B}, labels + (size_t)NB * B};
        be[3] = (dt_st_entry){"train_targets", DT_ST_I32, 3, {S_STEPS, ACCUM, B}, labels};
    }
    snprintf(path, sizeof path, "%s/batch.safetensors", dir);
    DT_CHECK(dt_st_write(ctx, path, be, 4, NULL));

    float loss;
    dt_params_zero_grad(&m->ps);
    DT_CHECK(dt_model_forward(ctx, m, in1, tg1, &loss));
    if (vit)
        memcpy(logits, dt_model_logits(m), (size_t)B * NC * sizeof(float));
    else
        for (size_t r = 0; r < bt; r++) memcpy(logits + r * V, dt_model_logits(m) + r * Vp, V * sizeof(float));
    /* With the trainer's loss scale (see the top); the division by a power of two is exact. */
    dt_model_backward(m, lscale);
    /* Training below reuses m->grads: keep this batch's gradients aside. */
    float *grads = malloc(m->ps.n_params * sizeof(float));
    for (size_t i = 0; i < m->ps.n_params; i++) grads[i] = m->ps.grads[i] / lscale;
    n = param_entries(m, grads, "grad.", e, names);
    e[n++] = vit ? (dt_st_entry){"logits", DT_ST_F32, 2, {B, NC}, logits}
                 : (dt_st_entry){"logits", DT_ST_F32, 3, {B, T, V}, logits};
    e[n++] = (dt_st_entry){"loss", DT_ST_F32, 1, {1}, &loss};

    const int lowp = cfg.model_opts.compute != DT_F32;
    float *first = NULL; /* mixed precision: exp_avg, exp_avg_sq after the first step */
    for (int s = 0; s < S_STEPS; s++) {
        dt_step_stats st;
        DT_CHECK(dt_trainer_step_on(ctx, &tr, in + (size_t)s * ACCUM * bt, tg + (size_t)s * ACCUM * bt, &st));
        if (st.skipped)
            return dt_fail(ctx, DT_ERR_NUMERIC, "%s %s: training step %d skipped (%s, loss scale %g): the "
                           "parity run needs every step", family, precision, s,
                           st.skipped == 2 ? "loss-scaled gradients overflowed" : "non-finite", (double)st.loss_scale);
        train_losses[s] = st.loss;
        train_norms[s] = st.grad_norm;
        printf("step %d loss %.6f norm %.4f lr %.3e\n", s, (double)st.loss, (double)st.grad_norm, (double)st.lr);
        if (s == 0 && lowp) {
            size_t np = m->ps.n_params;
            float *mo, *va;
            dt_parallel_moments(tr.par, &mo, &va);
            first = malloc(2 * np * sizeof(float));
            memcpy(first, mo, np * sizeof(float));
            memcpy(first + np, va, np * sizeof(float));
        }
    }
    e[n++] = (dt_st_entry){"train_losses", DT_ST_F32, 1, {S_STEPS}, train_losses};
    e[n++] = (dt_st_entry){"train_norms", DT_ST_F32, 1, {S_STEPS}, train_norms};
    /* After the steps: weights and both Adam moments (one rank: full arrays in the parameter
     * layout). */
    float *mom, *var;
    dt_parallel_moments(tr.par, &mom, &var);
    n += param_entries(m, m->ps.params, "final.", e + n, names + n);
    n += param_entries(m, mom, "exp_avg.", e + n, names + n);
    n += param_entries(m, var, "exp_avg_sq.", e + n, names + n);
    if (first) {
        size_t np = m->ps.n_params;
        n += param_entries(m, first, "step1.exp_avg.", e + n, names + n);
        n += param_entries(m, first + np, "step1.exp_avg_sq.", e + n, names + n);
    }
    snprintf(path, sizeof path, "%s/dtrain.safetensors", dir);
    DT_CHECK(dt_st_write(ctx, path, e, n, NULL));
    free(in); free(tg); free(logits); free(grads); free(labels); free(first);
    dt_trainer_free(&tr);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: parity_dump OUTDIR [gpt2|llama|llama-mqa|mixtral|mixtral-cap|mixtral-layer|vit [fp32|bf16|fp16]]\n");
        return 2;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (run(&ctx, argv[1], argc >= 3 ? argv[2] : "gpt2", argc == 4 ? argv[3] : "fp32") != 0) {
        dt_log_error(&ctx, "%s", ctx.err);
        return 1;
    }
    return 0;
}
