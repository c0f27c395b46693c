/* The checkpoints of a training run (train/run_impl.h): the saver, staging and committing a
 * step, resuming from the newest intact one, and training.spike_rollback. */
#include "train/run_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/interop.h"
#include "ckpt/lora_base.h"
#include "ckpt/model_file.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "data/shard.h"
#include "model/lora.h"
#include "ops/ops.h"
#include "train/replicas.h"

/* ---- checkpoints */

int run_resumed_here(const dt_run_cfg *cfg) {
    if (!strcmp(cfg->resume, "latest") || !strcmp(cfg->resume, "auto")) return 1;
    char a[4096], b[4096], parent[4200];
    snprintf(parent, sizeof parent, "%s/..", cfg->resume);
    if (!realpath(cfg->ckpt_dir, a)) return 0;
    if (realpath(cfg->resume, b) && !strcmp(a, b)) return 1; /* the directory itself */
    return realpath(parent, b) && !strcmp(a, b);             /* one of its steps */
}

dt_status run_saver_open(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, int world, int rank) {
    if (!cfg->ckpt_dir[0]) return DT_OK;
    const dt_train_cfg *t = &cfg->train;
    dt_shard_piece *pieces = malloc((size_t)r->tr.model.ps.n_units * sizeof *pieces);
    char *yaml = NULL;
    size_t ylen = 0;
    FILE *f = open_memstream(&yaml, &ylen);
    if (!pieces || !f) {
        free(pieces);
        if (f) fclose(f);
        free(yaml);
        return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
    }
    dt_cfg_print(f, cfg);
    fclose(f);
    size_t shard;
    dt_parallel_shard(r->tr.par, &shard);
    int np = dt_parallel_save_pieces(r->tr.par, pieces);
    if (np < 0) {
        free(pieces);
        free(yaml);
        return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
    }
    dt_shard_piece *cp = NULL; /* tensor parallelism: the pieces in the canonical index space */
    if (r->tpc.on) {
        dt_status pst = dt_tp_ckpt_pieces(ctx, &r->tpc, pieces, np, 1, &cp, &np);
        free(pieces);
        if (pst != DT_OK) {
            free(yaml);
            return pst;
        }
        pieces = cp;
    }
    dt_ckpt_saver_cfg sc = {cfg->ckpt_dir, r->tpc.on ? &r->tpc.view : &r->tr.model, cfg->tokenizer, yaml, rank, world, pieces, np, shard,
                            dt_strategy_name(t->parallel.strategy), cfg->ckpt_keep, cfg->ckpt_async,
                            cfg->ckpt_max_failures, NULL, 0, NULL, 0};
    float *res, *age;
    dt_parallel_residual(r->tr.par, &res, &sc.residual_n); /* Top-K's, per rank */
    sc.residual = res;
    dt_parallel_ages(r->tr.par, &age, &sc.age_n); /* and its element ages (compression_adam: age) */
    sc.age = age;
    dt_status st = dt_ckpt_saver_init(ctx, &r->saver, &sc);
    free(pieces);
    free(yaml);
    return st;
}

/* Every rank: stages the state of the step just finished and starts writing it. */
dt_status run_save_stage(dt_ctx *ctx, run_state *r, dt_comm *comm, const dt_run_cfg *cfg, long step, int world) {
    const dt_train_cfg *t = &cfg->train;
    dt_ckpt_trainer tj;
    memset(&tj, 0, sizeof tj);
    tj.step = step;
    tj.tokens_seen = r->seen;
    tj.seed = t->seed;
    tj.world = world;
    tj.micro_batch = t->micro_batch;
    tj.accum = t->accum;
    tj.seq_len = t->seq_len;
    tj.hybrid = t->parallel.hybrid;
    tj.tp = t->model_opts.tp > 1 ? t->model_opts.tp : 1;
    snprintf(tj.strategy, sizeof tj.strategy, "%s", dt_strategy_name(t->parallel.strategy));
    if (r->sampler) {
        tj.has_sampler = 1;
        tj.sampler = dt_sampler_state_get(r->sampler, dt_loader_cursor(r->loader));
    }
    tj.loss = r->last_loss;
    tj.train_seconds = r->train_s;
    snprintf(tj.precision, sizeof tj.precision, "%s", dt_dtype_name(t->model_opts.compute));
    tj.loss_scale = r->tr.scaler.scale;
    tj.loss_scale_good = r->tr.scaler.good;
    tj.overflows = r->tr.scaler.overflows;
    tj.lora = r->tr.model.lora;
    tj.lora_base = r->base_hash;
    tj.lora_base_fp = r->base_fp;
    tj.lora_rank = t->model_opts.lora.rank;
    tj.lora_alpha = t->model_opts.lora.alpha > 0.0f ? t->model_opts.lora.alpha : (float)t->model_opts.lora.rank;
    tj.lora_targets = t->model_opts.lora.targets;
    tj.lora_dropout = t->model_opts.lora.dropout;
    double t0 = dt_now(), tt = dt_trace_begin();
    float *full, *mom, *var;
    dt_comm_watchdog_relax(comm, 1); /* the gather waits for every rank to reach the save */
    dt_status gst = dt_parallel_full_params(ctx, r->tr.par, &full); /* ZeRO-3: a gather, every rank */
    float *canon = NULL; /* tensor parallelism: the TP group's shards as the unsplit model */
    if (gst == DT_OK && r->tpc.on) gst = dt_tp_ckpt_gather(ctx, &r->tpc, full, &canon);
    dt_comm_watchdog_relax(comm, 0);
    if (gst != DT_OK) dt_parallel_release_full_params(r->tr.par, full);
    DT_CHECK(gst);
    dt_parallel_moments(r->tr.par, &mom, &var);
    dt_status st = dt_ckpt_saver_stage(ctx, r->saver, canon ? canon : full, mom, var, &tj);
    r->staged_step = step;
    free(canon);
    dt_parallel_release_full_params(r->tr.par, full);
    r->last_save_t = dt_now();
    dt_trace_end(tt, "ckpt", "checkpoint stage step %ld", step);
    dt_log_debug(ctx, "checkpoint step %ld staged in %.1f ms", step, (r->last_save_t - t0) * 1e3);
    return st;
}

dt_status run_save_commit(dt_ctx *ctx, run_state *r, dt_comm *comm, const dt_run_cfg *cfg) {
    int done = 0;
    if (!dt_ckpt_saver_pending(r->saver)) return DT_OK;
    double tt = dt_trace_begin();
    /* The commit waits for the slowest rank's write and rank 0's fsyncs: the disk's pace. */
    dt_comm_watchdog_relax(comm, 1);
    dt_status cst = dt_ckpt_saver_commit(ctx, r->saver, comm, &done);
    dt_comm_watchdog_relax(comm, 0);
    DT_CHECK(cst);
    dt_trace_end(tt, "ckpt", "checkpoint commit");
    r->last_commit_ok = done;
    if (done) r->last_commit_t = dt_now();
    if (done && ctx->rank == 0) {
        char msg[DT_PATH_MAX + 96];
        snprintf(msg, sizeof msg, "checkpoint: %s/step-%08ld", cfg->ckpt_dir, r->staged_step);
        dt_metrics_note(ctx, &r->metrics, msg);
    }
    return DT_OK;
}

/* Resolves checkpoint.resume on rank 0 and tells every rank: found (step dir), fresh start
 * (auto with nothing to resume), or failure. */
static dt_status resume_find(dt_ctx *ctx, const dt_run_cfg *cfg, dt_comm *comm, char *dir, size_t n, int *found) {
    char buf[DT_PATH_MAX + 8];
    memset(buf, 0, sizeof buf);
    dt_status st = DT_OK;
    int autostart = !strcmp(cfg->resume, "auto");
    if (autostart && !cfg->ckpt_dir[0]) { /* a supervised restart of a run without checkpoints */
        dt_log_warn(ctx, "restart %d: no checkpoint.dir, nothing to resume: training again from step 0",
                    dt_restart_attempt());
        *found = 0;
        dir[0] = 0;
        return DT_OK;
    }
    if (ctx->rank == 0) {
        const char *root = (!strcmp(cfg->resume, "latest") || autostart) ? cfg->ckpt_dir : cfg->resume;
        st = dt_ckpt_find(ctx, root, buf + 1, sizeof buf - 1);
        if (st == DT_OK) buf[0] = 'F';
        else if (autostart && strstr(ctx->err, "no checkpoint")) {
            dt_log_info(ctx, "checkpoint.resume auto: %s; starting from scratch", ctx->err);
            buf[0] = 'N';
            st = DT_OK;
        } else buf[0] = 'E';
    }
    /* The others wait while rank 0 hashes the checkpoint's files: the disk's pace. */
    dt_comm_watchdog_relax(comm, 1);
    dt_status bst = dt_comm_broadcast(ctx, comm, DT_GROUP_WORLD, buf, sizeof buf, 0);
    dt_comm_watchdog_relax(comm, 0);
    DT_CHECK(bst);
    if (buf[0] == 'E')
        return ctx->rank == 0 ? st : dt_fail(ctx, DT_ERR_IO, "checkpoint.resume: rank 0 found no usable checkpoint");
    *found = buf[0] == 'F';
    snprintf(dir, n, "%s", buf + 1);
    return DT_OK;
}

/* Loads step directory `dir` into the running trainer: parameters, optimizer state (resharded
 * as needed), the data cursor, counters; *start = its step. */
static dt_status load_step(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, const char *dir, int world,
                           long *start) {
    const dt_train_cfg *t = &cfg->train;
    double t_load = dt_now();
    dt_ckpt_trainer tj;
    DT_CHECK(dt_ckpt_read_trainer(ctx, dir, &tj));
    if (tj.seed != t->seed)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: written with training.seed %llu, this run has %llu (the data "
                       "order and initialisation would differ)", dir, (unsigned long long)tj.seed,
                       (unsigned long long)t->seed);
    if (tj.seq_len != t->seq_len)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: written with training.seq_len %d, this run has %d", dir, tj.seq_len,
                       t->seq_len);
    if (tj.has_sampler != (r->sampler != NULL))
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s data.train, this run %s", dir,
                       tj.has_sampler ? "trained on" : "trained without", r->sampler ? "has one" : "has none");
    DT_CHECK(dt_lora_check_resume(ctx, dir, &tj, &r->tr.model, r->base_hash, r->base_fp)); /* LoRA: the same base, rank, targets */
    long gb_old = (long)tj.world * tj.micro_batch * tj.accum, gb = (long)world * t->micro_batch * t->accum;
    if (gb_old != gb)
        dt_log_warn(ctx, "resuming with a global batch of %ld sequences (the checkpoint used %ld): the "
                    "optimisation is no longer the same as without the restart", gb, gb_old);
    /* Parameters: every rank reads the full model file and keeps what it holds (tensor
     * parallelism: the file is the unsplit model, cut into this rank's shards). */
    const dt_tp_ckpt *tpc = &r->tpc;
    float *full = malloc(r->tr.model.ps.n_params * sizeof(float));
    float *canon = tpc->on ? malloc(tpc->canon.n_params * sizeof(float)) : NULL;
    if (!full || (tpc->on && !canon)) {
        free(full), free(canon);
        return dt_fail(ctx, DT_ERR_NOMEM, "resume: out of memory for the model");
    }
    dt_status st = dt_ckpt_load_params(ctx, dir, tpc->on ? &tpc->view : &r->tr.model, tpc->on ? canon : full);
    if (st == DT_OK && tpc->on) dt_tp_ckpt_scatter(tpc, canon, full);
    if (st == DT_OK) st = dt_parallel_set_params(ctx, r->tr.par, full);
    free(full), free(canon);
    DT_CHECK(st);
    /* Optimizer state: my pieces, from whichever files hold them (resharding) - as runs of the
     * canonical index space, vocabulary padding left out (zero, and a tensor-parallel run's
     * files hold none of it), so any tp, dp and ZeRO stage reads any other's. */
    dt_shard_piece *pieces = malloc((size_t)r->tr.model.ps.n_units * sizeof *pieces), *cp = NULL;
    if (!pieces) return dt_fail(ctx, DT_ERR_NOMEM, "resume: out of memory");
    int np = dt_parallel_pieces(r->tr.par, pieces);
    if (tpc->runs) {
        st = dt_tp_ckpt_pieces(ctx, tpc, pieces, np, 0, &cp, &np);
        free(pieces);
        DT_CHECK(st);
        pieces = cp;
    }
    float *mom, *var;
    dt_parallel_moments(r->tr.par, &mom, &var);
    st = dt_ckpt_load_moments(ctx, dir, tpc->runs ? tpc->canon.n_params : r->tr.model.ps.n_params, pieces, np, mom,
                              var);
    free(pieces);
    DT_CHECK(st);
    /* Top-K's residual belongs to one rank's data (under tensor parallelism: of its TP shard):
     * it comes back only onto the same world size and tp (bit-exact resume); otherwise it
     * starts empty, as the warning says. */
    float *res, *age;
    size_t nres, nage;
    dt_parallel_residual(r->tr.par, &res, &nres);
    dt_parallel_ages(r->tr.par, &age, &nage); /* all 1 unless the checkpoint has this rank's */
    if (nres) {
        int found = 0, same_tp = tj.tp == dt_tp_size(&t->model_opts);
        if (same_tp) DT_CHECK(dt_ckpt_load_residual(ctx, dir, ctx->rank, world, res, nres, age, nage, &found));
        if (!found && ctx->rank == 0)
            dt_log_warn(ctx, "%s: %s, so parallel.compression=topk starts with an empty residual (the gradients "
                        "not yet sent before the checkpoint are dropped)", dir,
                        tj.world != world ? "written by another number of ranks (the residual is per rank)"
                        : !same_tp        ? "written with another parallel.tp (the residual is per TP shard)"
                                          : "holds no Top-K residual");
    }
    if (r->sampler) {
        uint64_t cursor;
        DT_CHECK(dt_sampler_state_set(ctx, r->sampler, &tj.sampler, &cursor));
        DT_CHECK(dt_loader_seek(ctx, r->loader, cursor));
    }
    r->tr.step = tj.step;
    r->seen = tj.tokens_seen;
    r->train_s = tj.train_seconds;
    r->last_loss = (float)tj.loss;
    /* The loss scaler goes on where it was (same precision; a new precision starts afresh). */
    if (!strcmp(tj.precision, dt_dtype_name(t->model_opts.compute))) {
        if (r->tr.scaler.dynamic) {
            r->tr.scaler.scale = (float)tj.loss_scale;
            r->tr.scaler.good = tj.loss_scale_good;
        }
        r->tr.scaler.overflows = tj.overflows;
    } else if (strcmp(tj.precision, dt_dtype_name(t->model_opts.compute))) {
        dt_log_info(ctx, "%s: written with training.precision %s, this run uses %s", dir, tj.precision,
                    dt_dtype_name(t->model_opts.compute));
    }
    *start = tj.step;
    r->loaded_strategy_changed = tj.world != world || strcmp(tj.strategy, dt_strategy_name(t->parallel.strategy));
    r->loaded_world = tj.world;
    r->loaded_tp = tj.tp;
    r->loaded_strategy_changed |= tj.tp != dt_tp_size(&t->model_opts);
    snprintf(r->loaded_strategy, sizeof r->loaded_strategy, "%s", tj.strategy);
    double bytes = (double)r->tr.model.ps.n_params * 4.0;
    size_t shard;
    dt_parallel_shard(r->tr.par, &shard);
    bytes += 8.0 * (double)shard;
    t_load = dt_now() - t_load;
    dt_log_info(ctx, "checkpoint loaded in %.3f s: %.1f MB of parameters and optimizer state on rank %d (%.0f MB/s)",
                t_load, bytes / 1e6, ctx->rank, bytes / 1e6 / (t_load > 0 ? t_load : 1e-9));
    (void)tj;
    return DT_OK;
}

dt_status run_resume(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, dt_comm *comm, int world, long *start,
                     int *found) {
    char dir[DT_PATH_MAX + 8];
    *found = 0;
    *start = 0;
    DT_CHECK(resume_find(ctx, cfg, comm, dir, sizeof dir, found));
    if (!*found) return DT_OK;
    DT_CHECK(load_step(ctx, r, cfg, dir, world, start));
    dt_log_info(ctx, "resumed from %s: step %ld, %.0f tokens seen; written by %d rank(s) with %s (tp %d), continuing "
                "on %d with %s (tp %d)%s", dir, *start, r->seen, r->loaded_world, r->loaded_strategy, r->loaded_tp,
                world, dt_strategy_name(cfg->train.parallel.strategy), dt_tp_size(&cfg->train.model_opts),
                r->loaded_strategy_changed ? " (resharded)" : "");
    return DT_OK;
}

/* training.spike_rollback: back to the newest intact checkpoint, then past the batches that
 * led to the spike. Every rank decides alike (the loss is all-reduced); rank 0 finds the
 * step directory and tells the others. *s = the checkpoint's step (the loop goes on from
 * there); 0 is returned with *rolled = 0 when there is no checkpoint before `step`. */
dt_status run_rollback(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, dt_comm *comm, int world, long step,
                       float loss, double median, long *s, int *rolled) {
    *rolled = 0;
    DT_CHECK(run_save_commit(ctx, r, comm, cfg)); /* a save in flight is the newest candidate */
    /* Rank 0 finds the newest intact step (hashing its files) and checks that it precedes
     * the spike; "F<dir>" or "N", to everyone. */
    char buf[DT_PATH_MAX + 16];
    memset(buf, 0, sizeof buf);
    buf[0] = 'N';
    if (ctx->rank == 0) {
        char dir[DT_PATH_MAX + 8];
        dt_ctx quiet = *ctx;
        dt_ckpt_trainer tj;
        if (dt_ckpt_find(&quiet, cfg->ckpt_dir, dir, sizeof dir) == DT_OK &&
            dt_ckpt_read_trainer(&quiet, dir, &tj) == DT_OK && tj.step < step)
            snprintf(buf, sizeof buf, "F%s", dir);
    }
    dt_comm_watchdog_relax(comm, 1);
    dt_status st = dt_comm_broadcast(ctx, comm, DT_GROUP_WORLD, buf, sizeof buf, 0);
    dt_comm_watchdog_relax(comm, 0);
    DT_CHECK(st);
    if (buf[0] != 'F') {
        if (ctx->rank == 0)
            dt_log_warn(ctx, "training.spike_rollback: no intact checkpoint before step %ld to roll back to", step);
        return DT_OK;
    }
    const uint64_t past = dt_loader_cursor(r->loader); /* the data after the spike's step */
    long to;
    dt_comm_watchdog_relax(comm, 1);
    st = load_step(ctx, r, cfg, buf + 1, world, &to);
    dt_comm_watchdog_relax(comm, 0);
    DT_CHECK(st);
    const uint64_t from = dt_loader_cursor(r->loader);
    DT_CHECK(dt_loader_seek(ctx, r->loader, past));
    *s = to;
    *rolled = 1;
    r->n_recent = 0; /* the median restarts with the new data */
    r->uniform_reported = 0;
    if (ctx->rank == 0)
        DT_CHECK(dt_metrics_rollback(ctx, &r->metrics, step, loss, median, r->spike_uniform, to, past - from));
    return DT_OK;
}
