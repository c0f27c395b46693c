#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "data/synthetic.h"

void dt_train_cfg_defaults(dt_train_cfg *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->preset, "gpt2-tiny");
    c->model = (dt_gpt2_config){2, 64, 4, 256, 256, 64};
    c->micro_batch = 4;
    c->seq_len = 64;
    c->accum = 1;
    c->steps = 20;
    c->sched = (dt_lr_schedule){DT_SCHED_COSINE, 6e-4f, 6e-5f, 0, 20};
    c->adamw = (dt_adamw){0.9f, 0.95f, 1e-8f, 0.1f};
    c->clip = 1.0f;
    c->seed = 1337;
}

dt_status dt_train_cfg_validate(dt_ctx *ctx, const dt_train_cfg *c) {
    if (c->accum < 1 || c->accum > 1 << 20)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.grad_accum must be in [1, 1048576] (got %d)", c->accum);
    if (c->steps < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.steps must be >= 1 (got %ld)", c->steps);
    if (!(c->sched.lr > 0.0f) || !(c->sched.lr < 10.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "optimizer.lr must be in (0, 10) (got %g)", (double)c->sched.lr);
    if (!(c->sched.min_lr >= 0.0f) || c->sched.min_lr > c->sched.lr)
        return dt_fail(ctx, DT_ERR_CONFIG, "schedule.min_lr must be in [0, optimizer.lr] (got %g)",
                       (double)c->sched.min_lr);
    if (c->sched.warmup < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "schedule.warmup must be >= 0 (got %ld)", c->sched.warmup);
    if (c->sched.kind != DT_SCHED_CONSTANT && c->sched.total <= c->sched.warmup)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "schedule.decay_steps (%ld, default training.steps) must exceed "
                       "schedule.warmup (%ld)",
                       c->sched.total, c->sched.warmup);
    if (!(c->adamw.beta1 >= 0.0f && c->adamw.beta1 < 1.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "optimizer.beta1 must be in [0, 1) (got %g)", (double)c->adamw.beta1);
    if (!(c->adamw.beta2 >= 0.0f && c->adamw.beta2 < 1.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "optimizer.beta2 must be in [0, 1) (got %g)", (double)c->adamw.beta2);
    if (!(c->adamw.eps > 0.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "optimizer.eps must be > 0 (got %g)", (double)c->adamw.eps);
    if (!(c->adamw.weight_decay >= 0.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "optimizer.weight_decay must be >= 0 (got %g)",
                       (double)c->adamw.weight_decay);
    if (!(c->clip >= 0.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "optimizer.grad_clip must be >= 0 (got %g)", (double)c->clip);
    return DT_OK;
}

dt_status dt_gpt2_param_segments(dt_ctx *ctx, const dt_gpt2 *m, dt_param_segment **out, int *n) {
    /* Walk the slab in memory order: PRE tensors, layer blocks, POST tensors. */
    int cap = DT_GPT2_NPARAMS * (m->cfg.n_layer + 1), cnt = 0;
    dt_param_segment *s = malloc((size_t)cap * sizeof *s);
    if (!s) return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate optimizer segments");
    for (int g = DT_PG_PRE; g <= DT_PG_POST; g++) {
        int copies = g == DT_PG_LAYER ? m->cfg.n_layer : 1;
        for (int l = 0; l < copies; l++)
            for (int i = 0; i < DT_GPT2_NPARAMS; i++) {
                const dt_tensor_info *t = &m->tensors[i];
                if ((int)t->group != g) continue;
                size_t off = t->offset + (g == DT_PG_LAYER ? (size_t)l * t->stride : 0);
                size_t len = t->rows * t->cols;
                if (cnt > 0 && s[cnt - 1].decay == t->decay &&
                    s[cnt - 1].offset + s[cnt - 1].len == off)
                    s[cnt - 1].len += len; /* merge neighbours of equal decay */
                else
                    s[cnt++] = (dt_param_segment){off, len, t->decay};
            }
    }
    *out = s;
    *n = cnt;
    return DT_OK;
}

dt_status dt_trainer_init(dt_ctx *ctx, dt_trainer *tr, const dt_train_cfg *cfg) {
    memset(tr, 0, sizeof *tr);
    tr->cfg = *cfg;
    dt_alloc_init(&tr->alloc);
    tr->alloc.fail_at = cfg->fail_alloc_at;
    DT_CHECK(dt_train_cfg_validate(ctx, cfg));
    dt_status st = DT_OK;
    DT_CHECK_GOTO(dt_gpt2_init(ctx, &tr->model, &cfg->model, &tr->alloc, cfg->micro_batch,
                               cfg->seq_len));
    size_t np = tr->model.n_params * sizeof(float);
    DT_CHECK_GOTO(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OPTIM, np, (void **)&tr->m));
    DT_CHECK_GOTO(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OPTIM, np, (void **)&tr->v));
    size_t bt = (size_t)cfg->micro_batch * cfg->seq_len * sizeof(int32_t);
    DT_CHECK_GOTO(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, bt, (void **)&tr->inputs));
    DT_CHECK_GOTO(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, bt, (void **)&tr->targets));
    DT_CHECK_GOTO(dt_gpt2_param_segments(ctx, &tr->model, &tr->segs, &tr->nsegs));
    dt_gpt2_init_weights(&tr->model, cfg->seed);
    return DT_OK;
fail:
    dt_trainer_free(tr);
    return st;
}

void dt_trainer_free(dt_trainer *tr) {
    size_t np = tr->model.n_params * sizeof(float);
    size_t bt = (size_t)tr->cfg.micro_batch * tr->cfg.seq_len * sizeof(int32_t);
    dt_alloc_put(&tr->alloc, DT_MEM_OPTIM, tr->m, np);
    dt_alloc_put(&tr->alloc, DT_MEM_OPTIM, tr->v, np);
    dt_alloc_put(&tr->alloc, DT_MEM_OTHER, tr->inputs, bt);
    dt_alloc_put(&tr->alloc, DT_MEM_OTHER, tr->targets, bt);
    dt_gpt2_free(&tr->model);
    free(tr->segs);
    tr->m = tr->v = NULL;
    tr->inputs = tr->targets = NULL;
    tr->segs = NULL;
}

/* Shared tail of a step: clip, schedule, AdamW. */
static void finish_step(dt_trainer *tr, dt_step_stats *out) {
    double t0 = dt_now();
    dt_gpt2 *m = &tr->model;
    double norm = sqrt(dt_sumsq(m->grads, m->n_params));
    float coef = dt_clip_coef(norm, tr->cfg.clip);
    if (coef < 1.0f) dt_scale(m->grads, m->n_params, coef);
    float lr = dt_lr_at(&tr->cfg.sched, tr->step);
    dt_adamw_update(&tr->cfg.adamw, m->params, m->grads, tr->m, tr->v, tr->segs, tr->nsegs, lr,
                    tr->step + 1);
    tr->step++;
    out->grad_norm = (float)norm;
    out->lr = lr;
    out->optim_seconds = dt_now() - t0;
}

/* Micro-steps from explicit batches (inputs non-NULL) or from the data source. */
static dt_status run_step(dt_ctx *ctx, dt_trainer *tr, const int32_t *inputs,
                          const int32_t *targets, dt_step_stats *out) {
    double t0 = dt_now();
    dt_gpt2 *m = &tr->model;
    size_t bt = (size_t)m->B * m->T;
    dt_gpt2_zero_grad(m);
    double loss_sum = 0.0;
    for (int k = 0; k < tr->cfg.accum; k++) {
        int32_t *in = tr->inputs, *tg = tr->targets;
        if (inputs) {
            in = (int32_t *)inputs + k * bt;
            tg = (int32_t *)targets + k * bt;
        } else if (tr->next_batch) {
            DT_CHECK(tr->next_batch(ctx, tr->batch_ud, k, &in, &tg));
        } else {
            uint64_t micro = (uint64_t)tr->step * (uint64_t)tr->cfg.accum + (uint64_t)k;
            dt_synthetic_batch(tr->cfg.seed, m->cfg.vocab, micro, m->B, m->T, in, tg);
        }
        float loss;
        DT_CHECK(dt_gpt2_forward(ctx, m, in, tg, &loss));
        dt_gpt2_backward(m, 1.0f / (float)tr->cfg.accum);
        loss_sum += loss;
    }
    out->loss = (float)(loss_sum / tr->cfg.accum);
    finish_step(tr, out);
    out->seconds = dt_now() - t0;
    return DT_OK;
}

dt_status dt_trainer_step_on(dt_ctx *ctx, dt_trainer *tr, const int32_t *inputs,
                             const int32_t *targets, dt_step_stats *out) {
    return run_step(ctx, tr, inputs, targets, out);
}

dt_status dt_trainer_step(dt_ctx *ctx, dt_trainer *tr, dt_step_stats *out) {
    return run_step(ctx, tr, NULL, NULL, out);
}
