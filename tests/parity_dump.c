/* parity_dump OUTDIR - writes what tests/ref/gpt2_ref.py needs to check dtrain against
 * PyTorch: initial weights (init.safetensors), batches (batch.safetensors), and dtrain's
 * logits, loss, every parameter gradient, and the losses and grad norms of 10 AdamW steps
 * with warm-up/cosine schedule, clipping and 2 accumulation micro-steps, then the weights and
 * both Adam moments after them (dtrain.safetensors).
 * The model is small but has every feature: vocabulary padding (300 -> 384), head size 12
 * (not a multiple of the vector width), 2 layers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "core/log.h"
#include "data/synthetic.h"
#include "train/trainer.h"

#define S_STEPS 10
#define ACCUM 2

/* Entries for every parameter tensor of `base` (params or grads), names with `prefix`. */
static int param_entries(const dt_gpt2 *m, float *base, const char *prefix, dt_st_entry *e,
                         char (*names)[96]) {
    int n = 0;
    for (int id = 0; id < DT_GPT2_NPARAMS; id++) {
        const dt_tensor_info *t = &m->tensors[id];
        int copies = t->group == DT_PG_LAYER ? m->cfg.n_layer : 1;
        for (int l = 0; l < copies; l++) {
            char nm[80];
            dt_gpt2_tensor_name(m, (dt_gpt2_param_id)id, l, nm, sizeof nm);
            snprintf(names[n], 96, "%s%s", prefix, nm);
            size_t rows = id == DT_GPT2_P_WTE ? (size_t)m->cfg.vocab : t->rows; /* unpadded */
            e[n] = (dt_st_entry){names[n], DT_ST_F32, t->rows == 1 ? 1 : 2,
                                 {t->rows == 1 ? (int64_t)t->cols : (int64_t)rows, (int64_t)t->cols},
                                 dt_gpt2_tensor(m, base, (dt_gpt2_param_id)id, l)};
            n++;
        }
    }
    return n;
}

static int run(dt_ctx *ctx, const char *dir) {
    dt_train_cfg cfg;
    dt_train_cfg_defaults(&cfg);
    cfg.preset[0] = 0;
    cfg.model = (dt_gpt2_config){2, 48, 4, 300, 0, 32};
    cfg.micro_batch = 2;
    cfg.seq_len = 16;
    cfg.sched = (dt_lr_schedule){DT_SCHED_COSINE, 3e-3f, 3e-4f, 3, 8};
    cfg.adamw = (dt_adamw){0.9f, 0.95f, 1e-8f, 0.1f};
    cfg.clip = 0.5f;
    cfg.seed = 42;
    cfg.accum = ACCUM;
    dt_trainer tr;
    DT_CHECK(dt_trainer_init(ctx, &tr, &cfg, NULL));
    dt_gpt2 *m = &tr.model;
    int B = m->B, T = m->T, V = m->cfg.vocab, Vp = m->cfg.vocab_padded;
    size_t bt = (size_t)B * T;

    static dt_st_entry e[512];
    static char names[512][96];
    char path[4096], buf[20][32];
    const char *meta[40];
    int k = 0;
#define META(key, fmt, val)                                                                  \
    do {                                                                                     \
        snprintf(buf[k / 2], sizeof buf[0], fmt, val);                                       \
        meta[k] = key;                                                                       \
        meta[k + 1] = buf[k / 2];                                                            \
        k += 2;                                                                              \
    } while (0)
    META("n_layer", "%d", m->cfg.n_layer);
    META("d_model", "%d", m->cfg.d_model);
    META("n_head", "%d", m->cfg.n_head);
    META("vocab", "%d", V);
    META("context", "%d", m->cfg.context);
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
    meta[k++] = "train_steps";
    meta[k++] = "10";
    meta[k++] = "accum";
    meta[k++] = "2";
    meta[k] = NULL;
#undef META

    int n = param_entries(m, m->params, "", e, names);
    snprintf(path, sizeof path, "%s/init.safetensors", dir);
    DT_CHECK(dt_st_write(ctx, path, e, n, meta));

    /* S x ACCUM training micro-batches, then the single batch of the gradient check. */
    enum { NB = S_STEPS * ACCUM };
    int32_t *in = malloc(bt * 4 * (NB + 1)), *tg = malloc(bt * 4 * (NB + 1));
    float *logits = malloc(bt * V * sizeof(float));
    float train_losses[S_STEPS], train_norms[S_STEPS];
    for (int s = 0; s <= NB; s++) dt_synthetic_batch(cfg.seed, V, (uint64_t)s, B, T, in + s * bt, tg + s * bt);
    const int32_t *in1 = in + NB * bt, *tg1 = tg + NB * bt; /* the single batch */
    dt_st_entry be[] = {
        {"inputs", DT_ST_I32, 2, {B, T}, in1},
        {"targets", DT_ST_I32, 2, {B, T}, tg1},
        {"train_inputs", DT_ST_I32, 4, {S_STEPS, ACCUM, B, T}, in},
        {"train_targets", DT_ST_I32, 4, {S_STEPS, ACCUM, B, T}, tg},
    };
    snprintf(path, sizeof path, "%s/batch.safetensors", dir);
    DT_CHECK(dt_st_write(ctx, path, be, 4, NULL));

    float loss;
    dt_gpt2_zero_grad(m);
    DT_CHECK(dt_gpt2_forward(ctx, m, in1, tg1, &loss));
    for (size_t r = 0; r < bt; r++) memcpy(logits + r * V, dt_gpt2_logits(m) + r * Vp, V * sizeof(float));
    dt_gpt2_backward(m, 1.0f);
    /* Training below reuses m->grads: keep this batch's gradients aside. */
    float *grads = malloc(m->n_params * sizeof(float));
    memcpy(grads, m->grads, m->n_params * sizeof(float));
    n = param_entries(m, grads, "grad.", e, names);
    e[n++] = (dt_st_entry){"logits", DT_ST_F32, 3, {B, T, V}, logits};
    e[n++] = (dt_st_entry){"loss", DT_ST_F32, 1, {1}, &loss};

    for (int s = 0; s < S_STEPS; s++) {
        dt_step_stats st;
        DT_CHECK(dt_trainer_step_on(ctx, &tr, in + (size_t)s * ACCUM * bt, tg + (size_t)s * ACCUM * bt, &st));
        train_losses[s] = st.loss;
        train_norms[s] = st.grad_norm;
        printf("step %d loss %.6f norm %.4f lr %.3e\n", s, (double)st.loss, (double)st.grad_norm, (double)st.lr);
    }
    e[n++] = (dt_st_entry){"train_losses", DT_ST_F32, 1, {S_STEPS}, train_losses};
    e[n++] = (dt_st_entry){"train_norms", DT_ST_F32, 1, {S_STEPS}, train_norms};
    /* After the steps: weights and both Adam moments (one rank: full arrays in the parameter
     * layout). */
    float *mom, *var;
    dt_parallel_moments(tr.par, &mom, &var);
    n += param_entries(m, m->params, "final.", e + n, names + n);
    n += param_entries(m, mom, "exp_avg.", e + n, names + n);
    n += param_entries(m, var, "exp_avg_sq.", e + n, names + n);
    snprintf(path, sizeof path, "%s/dtrain.safetensors", dir);
    DT_CHECK(dt_st_write(ctx, path, e, n, NULL));
    free(in); free(tg); free(logits); free(grads);
    dt_trainer_free(&tr);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: parity_dump OUTDIR\n");
        return 2;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (run(&ctx, argv[1]) != 0) {
        dt_log_error(&ctx, "%s", ctx.err);
        return 1;
    }
    return 0;
}
