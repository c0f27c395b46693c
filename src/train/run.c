#include "train/run.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/model_file.h"
#include "core/log.h"
#include "data/shard.h"
#include "ops/ops.h"
#include "train/metrics.h"

dt_status dt_eval_loss(dt_ctx *ctx, dt_gpt2 *m, dt_val_loader *vl, double *loss, double *tokens) {
    dt_val_loader_reset(vl);
    int32_t *in, *tg;
    double sum = 0.0;
    long n = 0;
    while (dt_val_loader_next(vl, &in, &tg)) {
        float l;
        DT_CHECK(dt_gpt2_forward(ctx, m, in, tg, &l));
        sum += l;
        n++;
    }
    if (n == 0) return dt_fail(ctx, DT_ERR_CONFIG, "data.val: no complete validation batch");
    *loss = sum / (double)n;
    *tokens = (double)n * m->B * m->T;
    return DT_OK;
}

/* The trainer's batch source: the prefetching loader. */
static dt_status loader_batch(dt_ctx *ctx, void *ud, int k, int32_t **inputs, int32_t **targets) {
    (void)k; /* the loader hands out micro-batches in (step, k) order */
    return dt_loader_next(ctx, (dt_loader *)ud, inputs, targets);
}

typedef struct run_state {
    dt_dataset *train_ds, *val_ds;
    dt_sampler *sampler;
    dt_loader *loader;
    dt_val_loader *val;
    dt_trainer tr;
    int tr_live;
    dt_metrics metrics;
} run_state;

static void run_free(run_state *r) {
    dt_metrics_close(&r->metrics);
    dt_loader_free(r->loader);
    dt_val_loader_free(r->val);
    dt_sampler_free(r->sampler);
    dt_dataset_close(r->train_ds);
    dt_dataset_close(r->val_ds);
    if (r->tr_live) dt_trainer_free(&r->tr);
}

static dt_status open_data(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, int world, int rank) {
    const dt_train_cfg *t = &cfg->train;
    int vocab = t->model.vocab;
    if (cfg->data_train[0]) {
        DT_CHECK(dt_dataset_open(ctx, &r->train_ds, cfg->data_train, cfg->data_format, vocab));
        DT_CHECK(dt_dataset_check_seq_len(ctx, r->train_ds, t->seq_len));
        DT_CHECK(dt_sampler_init(ctx, &r->sampler, r->train_ds, t->seq_len, t->seed, cfg->data_shuffle));
        DT_CHECK(dt_loader_init(ctx, &r->loader, r->sampler, world, rank, t->micro_batch, t->accum, 0));
    }
    if (cfg->data_val[0]) {
        DT_CHECK(dt_dataset_open(ctx, &r->val_ds, cfg->data_val, cfg->data_format, vocab));
        DT_CHECK(dt_dataset_check_seq_len(ctx, r->val_ds, t->seq_len));
        DT_CHECK(dt_val_loader_init(ctx, &r->val, r->val_ds, t->seq_len, world, rank, t->micro_batch,
                                    (uint64_t)cfg->eval_batches));
    }
    return DT_OK;
}

static dt_status evaluate(dt_ctx *ctx, run_state *r, long step) {
    double loss, tokens;
    DT_CHECK(dt_eval_loss(ctx, &r->tr.model, r->val, &loss, &tokens));
    DT_CHECK(dt_parallel_mean(ctx, r->tr.par, &loss)); /* every rank evaluated its own rows */
    tokens *= ctx->world;
    if (ctx->rank != 0) return DT_OK;
    return dt_metrics_eval(ctx, &r->metrics, step, loss, tokens);
}

/* Writes the full model (gathered first under ZeRO-3: every rank takes part) from rank 0,
 * as a checkpoint step (dir != NULL) or one file. */
static dt_status save_model(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, long step,
                            const char *dir, const char *file) {
    float *full;
    DT_CHECK(dt_parallel_full_params(ctx, r->tr.par, &full));
    dt_status st = DT_OK;
    if (ctx->rank == 0) {
        dt_gpt2 view = r->tr.model; /* same model, reading the full parameters */
        view.params = full;
        st = dir ? dt_ckpt_save(ctx, &view, dir, cfg->tokenizer, step)
                 : dt_model_file_save(ctx, &view, file, cfg->tokenizer, step);
    }
    dt_parallel_release_full_params(r->tr.par, full);
    if (st == DT_OK && dir && ctx->rank == 0) {
        char msg[4200];
        snprintf(msg, sizeof msg, "checkpoint: %s/step-%08ld", dir, step);
        dt_metrics_note(ctx, &r->metrics, msg);
    }
    return st;
}

dt_status dt_train_run(dt_ctx *ctx, dt_comm *comm, const dt_run_cfg *cfg, const char *save_weights) {
    run_state r;
    memset(&r, 0, sizeof r);
    const dt_train_cfg *t = &cfg->train;
    dt_status st = DT_OK;
    int world = dt_comm_size(comm, DT_GROUP_WORLD), rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    DT_CHECK_GOTO(open_data(ctx, &r, cfg, world, rank));
    DT_CHECK_GOTO(dt_trainer_init(ctx, &r.tr, t, comm));
    r.tr_live = 1;
    if (r.loader) {
        r.tr.next_batch = loader_batch;
        r.tr.batch_ud = r.loader;
    }
    const dt_alloc *al = &r.tr.alloc;
    dt_log_info(ctx, "model state per rank: params %.2f MiB, grads %.2f MiB, optimizer %.2f MiB; activations %.2f MiB",
                (double)al->cur[DT_MEM_PARAMS] / 1048576.0, (double)al->cur[DT_MEM_GRADS] / 1048576.0,
                (double)al->cur[DT_MEM_OPTIM] / 1048576.0, (double)al->cur[DT_MEM_ACTS] / 1048576.0);
    size_t shard;
    dt_parallel_shard(r.tr.par, &shard);
    dt_log_info(ctx, "memory bytes: psi=%zu shard=%zu params=%zu grads=%zu optimizer=%zu",
                r.tr.model.n_params, shard, al->cur[DT_MEM_PARAMS], al->cur[DT_MEM_GRADS],
                al->cur[DT_MEM_OPTIM]);
    dt_progress mode;
    DT_CHECK_GOTO(dt_progress_parse(ctx, cfg->progress, &mode));
    DT_CHECK_GOTO(dt_metrics_open(ctx, &r.metrics, rank == 0 ? cfg->metrics : NULL, mode, t->steps));
    const dt_gpt2_config *mc = &r.tr.model.cfg;
    double peak = cfg->peak_gflops > 0 ? cfg->peak_gflops : dt_matmul_peak_gflops(2048, 3, NULL);
    dt_log_info(ctx, "model %s: %d layers, d_model %d, %d heads, vocab %d (padded %d), %.2fM params",
                t->preset[0] ? t->preset : "custom", mc->n_layer, mc->d_model, mc->n_head, mc->vocab,
                mc->vocab_padded, (double)dt_gpt2_num_params(mc) / 1e6);
    dt_log_info(ctx, "%d rank(s) on %d node(s), %s over %s, bucket %.1f MiB, overlap %s",
                world, dt_comm_num_nodes(comm), dt_strategy_name(t->parallel.strategy), dt_comm_backend(comm),
                (double)t->parallel.bucket_bytes / 1048576.0, t->parallel.overlap ? "on" : "off");
    dt_log_info(ctx, "batch %d x %d tokens x %d accumulation per rank, %ld steps; data %s (%s)%s%s; MFU vs %.1f GFLOP/s",
                t->micro_batch, t->seq_len, t->accum, t->steps,
                cfg->data_train[0] ? cfg->data_train : "synthetic",
                r.sampler ? (cfg->data_shuffle ? "shuffled" : "in order") : "random tokens",
                cfg->data_val[0] ? ", validation " : "", cfg->data_val, peak);
    if (r.val && cfg->eval_interval > 0) DT_CHECK_GOTO(evaluate(ctx, &r, 0));
    double tokens_per_step = (double)t->micro_batch * t->seq_len * t->accum * world, seen = 0;
    double fpt = dt_gpt2_flops_per_token(mc, t->seq_len);
    for (long s = 1; s <= t->steps; s++) {
        dt_step_stats ss;
        DT_CHECK_GOTO(dt_trainer_step(ctx, &r.tr, &ss));
        seen += tokens_per_step;
        if (rank == 0 && (s % cfg->log_every == 0 || s == t->steps)) {
            /* MFU per rank: the peak is one process's matmul rate. */
            dt_step_record rec = {s, ss.loss, ss.lr, ss.grad_norm, ss.seconds, tokens_per_step,
                                  seen, fpt / world, peak};
            DT_CHECK_GOTO(dt_metrics_step(ctx, &r.metrics, &rec));
        }
        if (r.val && ((cfg->eval_interval > 0 && s % cfg->eval_interval == 0) || s == t->steps))
            DT_CHECK_GOTO(evaluate(ctx, &r, s));
        if (cfg->ckpt_dir[0] && ((cfg->ckpt_every > 0 && s % cfg->ckpt_every == 0) || s == t->steps))
            DT_CHECK_GOTO(save_model(ctx, &r, cfg, s, cfg->ckpt_dir, NULL));
    }
    if (save_weights) DT_CHECK_GOTO(save_model(ctx, &r, cfg, t->steps, NULL, save_weights));
fail:
    run_free(&r);
    return st;
}
