#include "train/run_impl.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/interop.h"
#include "train/trainer_impl.h"
#include "ckpt/model_file.h"
#include "ckpt/lora_base.h"
#include "model/lora.h"
#include "core/timer.h"
#include "core/trace.h"
#include "core/log.h"
#include "core/sortcmp.h"
#include "data/shard.h"
#include "ops/cpu/isa.h"
#include "ops/ops.h"
#include "train/metrics.h"
#include "train/preempt.h"
#include "train/prom.h"
#include "train/replicas.h"
#include "train/straggler.h"
#include "train/trace_file.h"

/* With a loss mask: the counted targets of the step about to start, over all ranks. */
static uint64_t loader_step_targets(void *ud) { return dt_loader_step_targets((const dt_loader *)ud); }

/* The trainer's batch source: the prefetching loader. */
static dt_status loader_batch(dt_ctx *ctx, void *ud, int k, int32_t **inputs, int32_t **targets) {
    (void)k; /* the loader hands out micro-batches in (step, k) order */
    return dt_loader_next(ctx, (dt_loader *)ud, inputs, targets);
}


static void run_free(run_state *r) {
    dt_ckpt_saver_free(r->saver);
    if (r->ledger_fd >= 0) close(r->ledger_fd);
    dt_metrics_close(&r->metrics);
    dt_loader_free(r->loader);
    dt_val_loader_free(r->val);
    dt_sampler_free(r->sampler);
    dt_dataset_close(r->train_ds);
    dt_dataset_close(r->val_ds);
    dt_tp_ckpt_free(&r->tpc);
    if (r->tr_live) dt_trainer_free(&r->tr);
}

static dt_status open_data(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, int world, int rank) {
    const dt_train_cfg *t = &cfg->train;
    int vocab = t->model.vocab;
    if (cfg->data_train[0]) {
        DT_CHECK(dt_dataset_open(ctx, &r->train_ds, cfg->data_train, cfg->data_format, vocab));
        DT_CHECK(dt_data_check_model(ctx, r->train_ds, &t->model, "data.train"));
        DT_CHECK(dt_dataset_check_seq_len(ctx, r->train_ds, t->seq_len));
        DT_CHECK(dt_sampler_init(ctx, &r->sampler, r->train_ds, t->seq_len, t->seed, cfg->data_shuffle));
        DT_CHECK(dt_loader_init(ctx, &r->loader, r->sampler, world, rank, t->micro_batch, t->accum, 0));
    }
    if (cfg->data_val[0]) {
        DT_CHECK(dt_dataset_open(ctx, &r->val_ds, cfg->data_val, cfg->data_format, vocab));
        DT_CHECK(dt_data_check_model(ctx, r->val_ds, &t->model, "data.val"));
        DT_CHECK(dt_dataset_check_seq_len(ctx, r->val_ds, t->seq_len));
        DT_CHECK(dt_val_loader_init(ctx, &r->val, r->val_ds, t->seq_len, world, rank, t->micro_batch,
                                    (uint64_t)cfg->eval_batches));
    }
    return DT_OK;
}

static dt_status evaluate(dt_ctx *ctx, run_state *r, dt_comm *comm, long step) {
    double loss, tokens, acc, counted;
    if (r->tr.pp.n > 1) { /* through the pipeline: the last stage's results on every stage */
        DT_CHECK(dt_eval_loss_stage(ctx, &r->tr.model, r->val, dt_pp_eval_xfer, &r->tr, r->tr.pp.v, &loss, &tokens, &acc,
                                    &counted));
        DT_CHECK(dt_pp_eval_done(ctx, &r->tr));
        double v[4] = {loss, tokens, acc, counted};
        DT_CHECK(dt_pp_share(ctx, &r->tr, v, 4));
        loss = v[0], tokens = v[1], acc = v[2], counted = v[3];
    } else {
        DT_CHECK(dt_eval_loss(ctx, &r->tr.model, r->val, &loss, &tokens, &acc, &counted));
    }
    /* Ranks finish their rows at different times: that wait is not the network's. */
    dt_comm_watchdog_relax(comm, 1);
    const int masked = dt_dataset_has_loss_mask(r->val_ds);
    if (masked) loss *= counted; /* ranks count different targets: weigh each rank's mean */
    dt_status st = dt_parallel_mean(ctx, r->tr.par, &loss); /* every rank evaluated its own rows */
    if (st == DT_OK && masked) st = dt_parallel_mean(ctx, r->tr.par, &counted);
    if (masked) loss = counted > 0 ? loss / counted : 0.0;
    if (st == DT_OK && !isnan(acc)) st = dt_parallel_mean(ctx, r->tr.par, &acc); /* same count per rank */
    dt_comm_watchdog_relax(comm, 0);
    DT_CHECK(st);
    tokens *= dt_comm_size(comm, dt_parallel_dp_group(r->tr.par)); /* each data-parallel rank its rows */
    if (ctx->rank != 0) return DT_OK;
    return dt_metrics_eval(ctx, &r->metrics, step, loss, tokens, acc);
}

/* ---- the per-sample ledger (data.ledger): one line per step and rank, written with one
 * write(2) so a kill never leaves half a line: "step incarnation id id ...". */

static dt_status ledger_open(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, dt_comm *comm, int rank, int writes) {
    r->ledger_fd = -1;
    if (!cfg->ledger[0]) return DT_OK;
    if (!r->sampler) return dt_fail(ctx, DT_ERR_CONFIG, "data.ledger needs data.train (sample ids come from files)");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t inc = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    DT_CHECK(dt_comm_broadcast(ctx, comm, DT_GROUP_WORLD, &inc, sizeof inc, 0)); /* one id per incarnation */
    r->incarnation = (uint64_t)inc;
    if (!writes) return DT_OK;
    char path[DT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s.rank%d", cfg->ledger, rank);
    r->ledger_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (r->ledger_fd < 0) return dt_fail(ctx, DT_ERR_IO, "data.ledger: cannot open %s", path);
    return DT_OK;
}

static dt_status ledger_step(dt_ctx *ctx, run_state *r, long step, uint64_t cursor, int world, int rank) {
    if (r->ledger_fd < 0) return DT_OK;
    const dt_train_cfg *t = &r->tr.cfg;
    size_t cap = 64 + (size_t)t->accum * t->micro_batch * 21, len = 0;
    char *line = malloc(cap);
    if (!line) return dt_fail(ctx, DT_ERR_NOMEM, "data.ledger: out of memory");
    len += (size_t)snprintf(line, cap, "%ld %llu", step, (unsigned long long)r->incarnation);
    for (int k = 0; k < t->accum; k++)
        for (int b = 0; b < t->micro_batch; b++) {
            uint64_t p = dt_sampler_position(cursor, world, rank, t->micro_batch, k, b);
            len += (size_t)snprintf(line + len, cap - len, " %llu",
                                    (unsigned long long)dt_sampler_sample_id(r->sampler, p));
        }
    line[len++] = '\n';
    ssize_t w = write(r->ledger_fd, line, len);
    free(line);
    if (w != (ssize_t)len) return dt_fail(ctx, DT_ERR_IO, "data.ledger: write failed");
    return DT_OK;
}

/* Test aids, read once at start: DTRAIN_TEST_HANG=STEP:RANK makes that rank stop before that
 * step (as a rank stuck in a kernel or a dead NIC would), in the first attempt of a
 * supervised job only; DTRAIN_TEST_STEP_DELAY_MS=N sleeps N ms per step, so kill tests can
 * land anywhere in a run of a tiny model; DTRAIN_TEST_PERTURB=STEP:RANK flips the lowest bit
 * of that rank's first parameter after that step (DDP, ZeRO-1/2: their ranks hold full
 * replicas), so the replica check has something to find. */
static void test_aids_read(run_state *r) {
    const char *d = getenv("DTRAIN_TEST_STEP_DELAY_MS");
    dt_test_aid("DTRAIN_TEST_PERTURB", &r->perturb_step, &r->perturb_rank);
    r->hang_step = -1;
    if (dt_restart_attempt() <= 0) dt_test_aid("DTRAIN_TEST_HANG", &r->hang_step, &r->hang_rank);
    r->delay_ms = d ? atoi(d) : 0;
    if (r->delay_ms < 0 || r->delay_ms > 100000) r->delay_ms = 0;
}

static void test_aids_after_step(run_state *r, long step, int rank) {
    if (r->perturb_step != step || r->perturb_rank != rank || r->tr.cfg.parallel.strategy == DT_STRAT_ZERO3) return;
    uint32_t u;
    memcpy(&u, &r->tr.model.ps.params[0], sizeof u);
    u ^= 1u;
    memcpy(&r->tr.model.ps.params[0], &u, sizeof u);
}

static void test_aids_step(const run_state *r, long step, int rank) {
    if (r->hang_step == step && r->hang_rank == rank)
        for (;;) pause();
    if (r->delay_ms > 0) usleep((useconds_t)r->delay_ms * 1000);
}

/* After training: this rank's allocator high-water by kind beside the memory plan
 * (dt_trainer_mem_plan), which must be equal (rank 0 logs; it holds the largest shards). */
static dt_status log_memory(dt_ctx *ctx, run_state *r, dt_comm *comm) {
    size_t plan[DT_MEM_NKINDS], tot = 0;
    DT_CHECK(dt_trainer_mem_plan_here(ctx, &r->tr.cfg, comm, plan));
    for (int k = 0; k < DT_MEM_NKINDS; k++) tot += plan[k];
    const size_t *pk = r->tr.alloc.peak;
    dt_log_info(ctx, "memory high-water: allocator=%zu plan=%zu params=%zu grads=%zu optimizer=%zu activations=%zu "
                "comm=%zu other=%zu", r->tr.alloc.total_peak, tot, pk[DT_MEM_PARAMS], pk[DT_MEM_GRADS],
                pk[DT_MEM_OPTIM], pk[DT_MEM_ACTS], pk[DT_MEM_COMM], pk[DT_MEM_OTHER]);
    if (r->tr.cfg.parallel.strategy >= DT_STRAT_ZERO2) { /* how often units were reduced and gathered (decision 80) */
        long red, gat;
        dt_parallel_unit_counts(r->tr.par, &red, &gat);
        dt_log_info(ctx, "zero: %ld unit reduce-scatters, %ld unit gathers in %ld steps of %d units", red, gat,
                    r->steps_run, r->tr.model.ps.n_units);
    }
    return DT_OK;
}

/* Checkpoints (saving, resuming, rolling back): run_ckpt.c. */

/* The classes the loss is over (a classifier's, else the vocabulary) and ln of them: the loss of
 * guessing uniformly, where a freshly initialised model starts. */
static int loss_classes(const dt_model_config *mc) { return mc->n_classes > 0 ? mc->n_classes : mc->vocab; }
static double uniform_loss(const dt_model_config *mc) { return log((double)loss_classes(mc)); }

/* training.spike_factor: a run whose recent losses (the median of the last 20 finite ones) end
 * far above ln(V) diverged: its model is worse than uniform guessing, the run cannot be right. */
static dt_status check_diverged(dt_ctx *ctx, const run_state *r, const dt_run_cfg *cfg, const dt_model_config *mc) {
    int n = r->n_recent < 20 ? r->n_recent : 20;
    double ref = uniform_loss(mc);
    if (cfg->spike_factor <= 0 || n == 0 || ref <= 0) return DT_OK;
    float q[20];
    memcpy(q, r->recent, (size_t)n * sizeof *q);
    qsort(q, (size_t)n, sizeof *q, dt_cmp_float);
    double med = n % 2 ? (double)q[n / 2] : 0.5 * ((double)q[n / 2 - 1] + (double)q[n / 2]);
    if (!(med > cfg->spike_factor * ref)) return DT_OK;
    return dt_fail(ctx, DT_ERR_NUMERIC, "the run diverged: the median loss of its last %d step(s), %.4g, is %.0fx "
                   "the loss of uniform guessing over %d %s (ln %d = %.4f; training.spike_factor %g); lower "
                   "optimizer.lr, or bound the updates with optimizer.grad_clip", n, med, med / ref, loss_classes(mc),
                   mc->n_classes > 0 ? "classes" : "tokens", loss_classes(mc), ref, (double)cfg->spike_factor);
}

/* model.init_from: every rank reads the weights and keeps what it holds. */
static dt_status init_weights(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg) {
    /* tensor parallelism: the file is read as the unsplit model and cut into this rank's shards */
    const int tp = r->tpc.on;
    float *full = calloc(r->tr.model.ps.n_params, sizeof(float));
    float *canon = tp ? calloc(r->tpc.canon.n_params, sizeof(float)) : NULL;
    if (!full || (tp && !canon)) {
        free(full), free(canon);
        return dt_fail(ctx, DT_ERR_NOMEM, "model.init_from: out of memory");
    }
    dt_model view = tp ? r->tpc.view : r->tr.model;
    view.ps.params = tp ? canon : full;
    dt_status st = dt_model_import(ctx, &view, cfg->init_from);
    if (st == DT_OK && tp) dt_tp_ckpt_scatter(&r->tpc, canon, full);
    if (st == DT_OK) st = dt_parallel_set_params(ctx, r->tr.par, full);
    free(full), free(canon);
    if (st == DT_OK) dt_log_info(ctx, "initial weights from %s", cfg->init_from);
    return st;
}

/* Writes the full model (gathered first under ZeRO-3: every rank takes part) from rank 0. */
static dt_status save_weights_file(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, long step, const char *file) {
    float *full, *canon = NULL;
    DT_CHECK(dt_parallel_full_params(ctx, r->tr.par, &full));
    /* tensor parallelism: the TP group's shards laid out as the unsplit model */
    dt_status st = r->tpc.on ? dt_tp_ckpt_gather(ctx, &r->tpc, full, &canon) : DT_OK;
    if (st == DT_OK && ctx->rank == 0) {
        dt_model view = r->tpc.on ? r->tpc.view : r->tr.model; /* the model, reading the full parameters */
        view.ps.params = r->tpc.on ? canon : full;
        st = dt_model_file_save(ctx, &view, file, cfg->tokenizer, step);
    }
    free(canon);
    dt_parallel_release_full_params(r->tr.par, full);
    return st;
}

/* Test aid: DTRAIN_TEST_SAVE_GRADS=FILE writes the last step's reduced gradients (the whole
 * model's, DDP: every rank holds them; under expert, tensor (the blocks mode included) or
 * pipeline parallelism the EP, TP groups' and the stages' stores gathered as the whole model,
 * as the weights are) from rank 0 as a weights file, so tests compare gradients tensor by
 * tensor (context, expert, tensor or pipeline parallelism against none). Other layouts are refused in one line. */
static dt_status save_grads_file(dt_ctx *ctx, run_state *r, long step) {
    const char *file = getenv("DTRAIN_TEST_SAVE_GRADS");
    if (!file || !file[0]) return DT_OK;
    const int gather = r->tpc.on && !r->tr.cfg.pp_blocks && !(dt_tp_size(&r->tr.model.opts) > 1 && r->tr.pp.n > 1);
    if (r->tr.cfg.parallel.strategy != DT_STRAT_DDP || (r->tpc.on && !gather) || r->tr.model.lora || !r->tr.model.ps.grads)
        return dt_fail(ctx, DT_ERR_CONFIG, "DTRAIN_TEST_SAVE_GRADS: parallel.strategy=ddp without LoRA, the pipeline's "
                       "blocks mode, or tensor with pipeline parallelism, only");
    float *canon = NULL;
    if (gather) DT_CHECK(dt_tp_ckpt_gather(ctx, &r->tpc, r->tr.model.ps.grads, &canon)); /* every EP rank and stage */
    dt_status st = DT_OK;
    if (ctx->rank == 0) {
        dt_model view = gather ? r->tpc.view : r->tr.model;
        view.ps.params = gather ? canon : r->tr.model.ps.grads;
        st = dt_model_file_save(ctx, &view, file, NULL, step);
    }
    free(canon);
    return st;
}

/* The step-boundary agreement of all ranks, one small all-reduce (max): [0] a preemption
 * signal arrived somewhere, [1] a background save is still writing somewhere, [2] rank 0's
 * clock says a timed checkpoint is due. */
static dt_status boundary_flags(dt_ctx *ctx, run_state *r, const dt_run_cfg *cfg, dt_comm *comm, int world,
                                int64_t f[3]) {
    f[0] = dt_preempt_requested(NULL);
    f[1] = r->saver && dt_ckpt_saver_pending(r->saver) && !dt_ckpt_saver_done(r->saver);
    f[2] = r->saver && ctx->rank == 0 && cfg->ckpt_minutes > 0 &&
           dt_now() - r->last_save_t >= 60.0 * (double)cfg->ckpt_minutes;
    if (world == 1) return DT_OK;
    return dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, f, 3, DT_I64, DT_MAX);
}

dt_status dt_train_run(dt_ctx *ctx, dt_comm *comm, const dt_run_cfg *cfg, const char *save_weights) {
    run_state r;
    memset(&r, 0, sizeof r);
    r.ledger_fd = -1;
    test_aids_read(&r);
    const dt_train_cfg *t = &cfg->train;
    dt_status st = DT_OK;
    int world = dt_comm_size(comm, DT_GROUP_WORLD), rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    /* the data-parallel ranks read the data (each TP group's ranks, each CP group's and each
     * pipeline's stages the same batches; parallel/mesh.h: tp fastest, then cp, dp, pp) */
    const int tp_ranks = cfg->tp > 1 && !cfg->tp_blocks ? cfg->tp : 1, pp = cfg->pp > 1 && !cfg->pp_blocks ? cfg->pp : 1;
    const int cp = cfg->cp > 1 ? cfg->cp : 1, mp_in = tp_ranks * cp; /* consecutive ranks of one batch */
    int dp_world = world / (mp_in * pp);
    int dp_rank = (rank / mp_in) % dp_world;
    DT_CHECK_GOTO(open_data(ctx, &r, cfg, dp_world, dp_rank));
    DT_CHECK_GOTO(dt_trainer_init(ctx, &r.tr, t, comm));
    r.tr_live = 1;
    /* canonical checkpoints: a LoRA run's adapters too under tensor parallelism */
    if (!r.tr.model.lora || dt_tp_size(&r.tr.model.opts) > 1 || r.tr.pp.n > 1 || r.tr.model.opts.ep > 1)
        DT_CHECK_GOTO(dt_tp_ckpt_init(ctx, &r.tpc, &r.tr));
    if (r.loader) {
        r.tr.next_batch = loader_batch;
        r.tr.batch_ud = r.loader;
        if (dt_dataset_has_loss_mask(r.train_ds)) r.tr.step_targets = loader_step_targets;
    }
    dt_comm_set_watchdog(comm, cfg->coll_timeout);
    const dt_alloc *al = &r.tr.alloc;
    char recompute[96] = "";
    if (t->model_opts.recompute != DT_RECOMPUTE_NONE)
        snprintf(recompute, sizeof recompute, " (activation checkpointing %s, every %d layer%s)",
                 dt_recompute_name(t->model_opts.recompute), t->model_opts.recompute_every,
                 t->model_opts.recompute_every > 1 ? "s" : "");
    dt_log_info(ctx, "model state per rank: params %.2f MiB, grads %.2f MiB, optimizer %.2f MiB; activations %.2f MiB%s",
                (double)al->cur[DT_MEM_PARAMS] / 1048576.0, (double)al->cur[DT_MEM_GRADS] / 1048576.0,
                (double)al->cur[DT_MEM_OPTIM] / 1048576.0, (double)al->cur[DT_MEM_ACTS] / 1048576.0, recompute);
    size_t shard;
    dt_parallel_shard(r.tr.par, &shard);
    size_t largest = 0;
    for (int u = 0; u < r.tr.model.ps.n_units; u++)
        if (r.tr.model.ps.unit_len[u] > largest) largest = r.tr.model.ps.unit_len[u];
    dt_log_info(ctx, "memory bytes: psi=%zu shard=%zu params=%zu grads=%zu optimizer=%zu units=%d largest_unit=%zu",
                r.tr.model.ps.n_params, shard, al->cur[DT_MEM_PARAMS], al->cur[DT_MEM_GRADS],
                al->cur[DT_MEM_OPTIM], r.tr.model.ps.n_units, largest);
    long start = 0;
    int resumed = 0;
    if (dt_restart_attempt() == 0 && !cfg->ckpt_dir[0])
        dt_log_warn(ctx, "supervised run without checkpoint.dir: a restart after a failure trains again from step 0");
    if (r.tr.model.lora) { /* the base first: a resume checks its adapters were trained on it */
        if (save_weights && save_weights[0])
            DT_CHECK_GOTO(dt_fail(ctx, DT_ERR_CONFIG, "--save-weights: a LoRA run (lora.rank > 0) trains only "
                                  "adapters; its checkpoints hold them"));
        if (cfg->init_from[0]) DT_CHECK_GOTO(dt_lora_base_load(ctx, &r.tr.model, cfg->init_from));
        r.base_hash = dt_lora_base_hash(&r.tr.model);
        r.base_fp = dt_lora_base_fingerprint(&r.tr.model);
        if (r.tr.pp.n > 1) DT_CHECK_GOTO(dt_pp_base_ids(ctx, &r.tr, &r.base_hash, &r.base_fp)); /* every stage's part */
        dt_log_info(ctx, "LoRA rank %d, alpha %g, targets %s: %zu trainable parameters; frozen base %s, XXH3 %016llx",
                    t->model_opts.lora.rank, (double)(t->model_opts.lora.alpha > 0 ? t->model_opts.lora.alpha
                                                                                   : (float)t->model_opts.lora.rank),
                    cfg->lora_targets, dt_lora_num_params(&r.tr.model.cfg, &t->model_opts.lora), /* all TP shards */
                    t->model_opts.lora.nf4 ? "nf4" : "fp32",
                    (unsigned long long)r.base_hash);
    }
    if (cfg->resume[0]) DT_CHECK_GOTO(run_resume(ctx, &r, cfg, comm, world, &start, &resumed));
    if (cfg->init_from[0] && !resumed && !r.tr.model.lora) DT_CHECK_GOTO(init_weights(ctx, &r, cfg));
    DT_CHECK_GOTO(run_saver_open(ctx, &r, cfg, world, rank));
    /* a data-parallel rank's samples, recorded by the first rank of its TP x CP ranks on the
     * first stage (the others read the same ones): the ledger's files are one per data-parallel
     * rank */
    DT_CHECK_GOTO(ledger_open(ctx, &r, cfg, comm, dp_rank, rank == dp_rank * mp_in));
    dt_progress mode;
    DT_CHECK_GOTO(dt_progress_parse(ctx, cfg->progress, &mode));
    /* logging.metrics auto: next to the checkpoints (the run's own folder), never into the
     * working directory of whoever runs dtrain. */
    char metrics_path[DT_PATH_MAX + 16];
    if (!strcmp(cfg->metrics, "auto"))
        snprintf(metrics_path, sizeof metrics_path, "%s%s", cfg->ckpt_dir, cfg->ckpt_dir[0] ? "/metrics.jsonl" : "");
    else
        snprintf(metrics_path, sizeof metrics_path, "%s", cfg->metrics);
    DT_CHECK_GOTO(dt_metrics_open(ctx, &r.metrics, rank == 0 && metrics_path[0] ? metrics_path : NULL, mode,
                                  t->steps, start > 0));
    const dt_model_config *mc = &r.tr.model.cfg;
    /* MFU is relative to the GEMM of the run's precision (the 16-bit one under mixed precision). */
    dt_dtype prec = t->model_opts.compute;
    /* the best of 3 runs: a peak is what the GEMM can reach, a busy moment only lowers one run */
    double peak = cfg->peak_gflops;
    if (!(peak > 0)) {
        if (prec == DT_F32) dt_matmul_peak_gflops(2048, 3, &peak);
        else dt_matmul_peak_gflops_lp(prec, 2048, 3, &peak);
    }
    dt_log_info(ctx, "model %s: %d layers, d_model %d, %d heads, vocab %d (padded %d), %.2fM params",
                t->preset[0] ? t->preset : "custom", mc->n_layer, mc->d_model, mc->n_head, mc->vocab,
                mc->vocab_padded, (double)dt_model_num_params(mc) / 1e6);
    char isa[320];
    dt_isa_describe(isa, sizeof isa);
    dt_log_info(ctx, "%s", isa);
    if (prec != DT_F32)
        dt_log_info(ctx, "precision %s: matmuls on %s%s", dt_dtype_name(prec),
                    dt_lowp_gemm_native(prec) ? "native 16-bit instructions"
                                              : "16-bit operands widened to fp32 (the speed-up is not available on this CPU)",
                    r.tr.scaler.dynamic ? "; dynamic loss scaling from 65536" : "");
    DT_CHECK_GOTO(dt_replicas_log_isa(ctx, comm));
    char topk[96] = "";
    if (t->parallel.compression == DT_COMPRESS_TOPK)
        snprintf(topk, sizeof topk, ", Top-K %g%% with error feedback%s", 100.0 * t->parallel.topk_ratio,
                 world == 1                                          ? " (one rank: nothing sent, nothing compressed)"
                 : t->parallel.topk_age && t->parallel.topk_ratio < 1 ? ", AdamW by age"
                                                                      : "");
    dt_log_info(ctx, "%d rank(s) on %d node(s), %s over %s (%s), bucket %.1f MiB, overlap %s, gradients sent in %s%s",
                world, dt_comm_num_nodes(comm), dt_strategy_name(t->parallel.strategy), dt_comm_backend(comm),
                dt_comm_routing(comm), (double)t->parallel.bucket_bytes / 1048576.0, t->parallel.overlap ? "on" : "off",
                dt_dtype_name(t->parallel.grad_dtype), topk);
    if (t->model_opts.tp > 1)
        dt_log_info(ctx, "process mesh: tp %d x dp %d%s (tensor-parallel: attention heads and the MLP's input projections "
                    "column-parallel, output projections row-parallel, vocabulary-parallel embedding and loss)",
                    t->model_opts.tp, dp_world,
                    cfg->tp_blocks ? ", all tp shards in each process (parallel.tp_blocks)" : "");
    if (t->cp > 1)
        dt_log_info(ctx, "context parallelism: cp %d x dp %d, %d rows of each %d-token sequence per rank (chunks r and "
                    "%d - r of %d), ring attention; gradients summed over %d ranks", t->cp, dp_world, t->seq_len / t->cp,
                    t->seq_len, 2 * t->cp - 1, 2 * t->cp, t->cp * dp_world);
    if (t->pp > 1) { /* the stages' layers (trainer.c: pp_first, cut by the cost rule or given) */
        char cut[256];
        size_t len = 0;
        cut[0] = 0;
        for (int s = 0; s < t->pp && len < sizeof cut; s++)
            len += (size_t)snprintf(cut + len, sizeof cut - len, "%s%d", s ? "," : "",
                                    r.tr.cfg.pp_first[s + 1] - r.tr.cfg.pp_first[s]);
        dt_log_info(ctx, "pipeline: pp %d x tp %d x dp %d, schedule %s%s, layers per stage [%s]%s; %d micro-batches a step",
                    t->pp, t->model_opts.tp > 1 ? t->model_opts.tp : 1, dp_world, dt_pp_kind_name((dt_pp_kind)t->pp_kind),
                    t->pp_kind == DT_PP_INTERLEAVED ? " (chunks of them around a ring)" : "", cut,
                    t->pp_blocks ? ", all stages in each process (parallel.pp_blocks)" : "", t->accum);
    }
    const dt_parallel_cfg *zc = &r.tr.cfg.parallel; /* the ZeRO modes as resolved (decision 80) */
    if (zc->strategy >= DT_STRAT_ZERO2)
        dt_log_info(ctx, "zero: gradients reduce-scattered once a %s (parallel.zero_reduce=%s)%s",
                    zc->zero_reduce == DT_ZR_STEP ? "step, accumulated locally" : "micro-step",
                    zc->zero_reduce == DT_ZR_STEP ? "step" : "micro",
                    zc->strategy != DT_STRAT_ZERO3    ? ""
                    : zc->zero3_gather == DT_ZG_STEP ? "; parameters gathered once a step into a resident copy (parallel.zero3_gather=step)"
                                                     : "; parameters gathered at every use (parallel.zero3_gather=use)");
    dt_log_info(ctx, "batch %d x %d tokens x %d accumulation per rank, %ld steps; data %s (%s)%s%s; MFU vs %.1f GFLOP/s",
                t->micro_batch, t->seq_len, t->accum, t->steps,
                cfg->data_train[0] ? cfg->data_train : "synthetic",
                r.sampler ? (cfg->data_shuffle ? "shuffled" : "in order") : "random tokens",
                cfg->data_val[0] ? ", validation " : "", cfg->data_val, peak);
    if (start >= t->steps) {
        dt_log_info(ctx, "the checkpoint is at step %ld, training.steps is %ld: nothing left to train", start, t->steps);
        /* Resumed from another checkpoint directory: its state is written into checkpoint.dir
         * in this run's layout (tp, dp, ZeRO stage) - a checkpoint resharded, nothing trained. */
        if (resumed && r.saver && !run_resumed_here(cfg)) {
            DT_CHECK_GOTO(run_save_stage(ctx, &r, comm, cfg, start, world));
            DT_CHECK_GOTO(run_save_commit(ctx, &r, comm, cfg));
            if (rank == 0) dt_log_info(ctx, "resharded: %s/step-%08ld holds step %ld in this run's layout", cfg->ckpt_dir, start, start);
        }
    } else if (r.val && cfg->eval_interval > 0 && start == 0) {
        DT_CHECK_GOTO(evaluate(ctx, &r, comm, 0));
    }
    r.last_save_t = dt_now();
    if (cfg->prometheus[0]) dt_prom_init(&r.prom, cfg->prometheus);
    if (cfg->trace[0]) {
        DT_CHECK_GOTO(dt_comm_barrier(ctx, comm, DT_GROUP_WORLD)); /* one time origin for all ranks */
        dt_trace_enable(dt_now());
    }
    double tokens_per_step = (double)t->micro_batch * t->seq_len * t->accum * dp_world;
    double fpt = dt_lora_flops_per_token(mc, &t->model_opts.lora, t->seq_len); /* LoRA: no base dW */
    int preempted = 0;
    for (long s = start + 1; s <= t->steps; s++) {
        dt_step_stats ss;
        uint64_t cursor = r.loader ? dt_loader_cursor(r.loader) : 0;
        test_aids_step(&r, s, rank);
        DT_CHECK_GOTO(dt_trainer_step(ctx, &r.tr, &ss));
        test_aids_after_step(&r, s, rank);
        /* fault.collective_timeout auto: the first 10 steps of a process (start-up, JIT, page
         * faults, a resume's first collectives) run under the warm-up bound. */
        if (s == start + 2 || s == start + 10) dt_comm_watchdog_arm(comm); /* measure, then arm */
        if (cfg->coll_timeout < 0 && rank == 0 && s >= start + 10) {
            double slowest, to = dt_comm_watchdog_timeout(comm, &slowest);
            if (to > 0 && (r.wd_reported <= 0 || fabs(to - r.wd_reported) > 0.2 * r.wd_reported)) {
                r.wd_reported = to;
                DT_CHECK_GOTO(dt_metrics_watchdog(ctx, &r.metrics, s, to, slowest));
            }
        }
        if (cfg->check_replicas > 0 && (s % cfg->check_replicas == 0 || s == t->steps)) {
            DT_CHECK_GOTO(dt_replicas_check(ctx, comm, r.tr.par, r.tr.model.ps.n_params, s, &r.replica_hash));
            r.replica_checks++;
            r.replica_step = s;
        }
        DT_CHECK_GOTO(ledger_step(ctx, &r, s, cursor, dp_world, dp_rank));
        r.seen += tokens_per_step;
        r.train_s += ss.seconds;
        r.step_s_sum += ss.seconds;
        r.steps_run++;
        if (ss.skipped == 2)
            r.skipped_overflow++;
        else if (ss.skipped)
            r.skipped_nonfinite++;
        else
            r.updates++;
        r.last_loss = ss.loss;
        if (ss.skipped == 2 && rank == 0)
            dt_log_warn(ctx, "step %ld: gradients overflowed at loss scale %g: update skipped, scale now %g "
                        "(%ld overflow(s) so far)", s, (double)ss.loss_scale, (double)r.tr.scaler.scale,
                        r.tr.scaler.overflows);
        else if (ss.skipped && rank == 0)
            dt_log_warn(ctx, "step %ld: non-finite %s (loss %g, gradient norm %g): update skipped "
                        "(training.nonfinite=skip; %ld so far)", s, isfinite(ss.loss) ? "gradient norm" : "loss",
                        (double)ss.loss, (double)ss.grad_norm, r.tr.skipped);
        if (rank == 0 && (s % cfg->log_every == 0 || s == t->steps || ss.skipped)) {
            /* MFU per rank: the peak is one process's matmul rate. */
            dt_step_record rec = {s, ss.loss, ss.lr, ss.grad_norm, ss.seconds, tokens_per_step,
                                  r.seen, fpt / world, peak, ss.skipped, ss.loss_scale, &ss};
            DT_CHECK_GOTO(dt_metrics_step(ctx, &r.metrics, &rec));
        }
        if (cfg->spike_factor > 0 && isfinite(ss.loss)) {
            /* The loss is the same on every rank (all-reduced): rank 0 reports. Against the
             * median of the previous 20 steps; before there are 20 (the start, or after a
             * rollback), against ln(V), the loss of uniform guessing that a fresh model starts
             * at: no normal run is far above it, a diverging one is from step 1 or 2 (lr 9.9
             * without clipping: 5.56, then 3142). That one is reported once per stretch. */
            double ref = 0;
            int uniform = r.n_recent < 20;
            if (!uniform) {
                float q[20];
                memcpy(q, r.recent, sizeof q);
                qsort(q, 20, sizeof *q, dt_cmp_float);
                ref = 0.5 * ((double)q[9] + (double)q[10]);
            } else {
                ref = uniform_loss(mc);
            }
            int above = ref > 0 && ss.loss > cfg->spike_factor * ref;
            int report = above && !(uniform && r.uniform_reported);
            if (uniform) r.uniform_reported = above;
            if (report) {
                if (rank == 0)
                    DT_CHECK_GOTO(dt_metrics_spike(ctx, &r.metrics, s, ss.loss, ref, uniform ? loss_classes(mc) : 0));
                if (r.rollbacks < cfg->spike_rollback) {
                    int rolled;
                    r.spike_uniform = uniform;
                    DT_CHECK_GOTO(run_rollback(ctx, &r, cfg, comm, world, s, ss.loss, ref, &s, &rolled));
                    if (rolled) {
                        r.rollbacks++;
                        continue; /* the loop goes on from the checkpoint's step + 1 */
                    }
                }
            }
            r.recent[r.n_recent++ % 20] = ss.loss;
        }
        if (cfg->straggler_every > 0) {
            /* The first step of a process (JIT, page faults) is not compared. */
            if (s > start + 1) dt_straggler_add(&r.strag, s, ss.fwd_seconds + ss.bwd_seconds + ss.opt_seconds);
            if (s % cfg->straggler_every == 0)
                DT_CHECK_GOTO(dt_straggler_check(ctx, &r.strag, comm, s, cfg->straggler_factor, &r.metrics));
        }
        if (cfg->prometheus[0]) {
            dt_prom_step(&r.prom, ss.seconds, ss.comm_seconds);
            if (s % cfg->prometheus_every == 0 || s == t->steps) {
                double tps = ss.seconds > 0 ? tokens_per_step / ss.seconds : 0,
                       mfu = dt_train_mfu(fpt / world, tps, peak); /* NaN: unknown */
                dt_prom_snapshot snap = {s, t->steps, r.tr.skipped, ss.loss, tps, isnan(mfu) ? -1 : mfu,
                                         r.last_commit_t > 0 ? dt_now() - r.last_commit_t : -1,
                                         dt_restart_attempt() < 0 ? 0 : dt_restart_attempt(),
                                         r.tr.scaler.scale, r.tr.scaler.overflows, &r.tr.alloc};
                DT_CHECK_GOTO(dt_prom_write(ctx, &r.prom, comm, &snap));
            }
        }
        if (r.val && ((cfg->eval_interval > 0 && s % cfg->eval_interval == 0) || s == t->steps))
            DT_CHECK_GOTO(evaluate(ctx, &r, comm, s));
        int64_t f[3];
        DT_CHECK_GOTO(boundary_flags(ctx, &r, cfg, comm, world, f));
        preempted = f[0] != 0;
        if (r.saver) {
            if (dt_ckpt_saver_pending(r.saver) && !f[1]) DT_CHECK_GOTO(run_save_commit(ctx, &r, comm, cfg));
            int due = (cfg->ckpt_every > 0 && s % cfg->ckpt_every == 0) || f[2] || s == t->steps || preempted;
            if (due) {
                DT_CHECK_GOTO(run_save_commit(ctx, &r, comm, cfg)); /* the previous one first (waits) */
                DT_CHECK_GOTO(run_save_stage(ctx, &r, comm, cfg, s, world));
                if (s == t->steps || preempted || !cfg->ckpt_async) DT_CHECK_GOTO(run_save_commit(ctx, &r, comm, cfg));
            }
        }
        if (preempted) {
            double el = 0;
            if (dt_preempt_requested(&el)) {
                if (el > cfg->preempt_grace)
                    dt_log_warn(ctx, "preemption: %.0f s from the signal to the exit exceed fault.preempt_grace (%.0f s)",
                                el, (double)cfg->preempt_grace);
            }
            if (rank == 0)
                dt_log_info(ctx, "preempted (signal received): %s at step %ld; exiting cleanly",
                            r.saver ? "checkpoint written" : "no checkpoint.dir, nothing saved", s);
            break;
        }
    }
    if (r.saver) {
        DT_CHECK_GOTO(run_save_commit(ctx, &r, comm, cfg));
        double stage, wait, commit, wr, bytes;
        int ok, failed;
        dt_ckpt_saver_stats(r.saver, &stage, &wait, &commit, &ok, &failed, &wr, &bytes);
        if (ok + failed > 0 && r.steps_run > 0) {
            double mean = r.step_s_sum / (double)r.steps_run, n = ok + failed;
            dt_log_info(ctx, "checkpoints: %d committed, %d failed; per save the loop spent %.1f ms copying state and "
                        "%.1f ms committing (%.2f%% of a %.0f ms step), and %.1f ms in all waiting for the disk; "
                        "%.1f MB written by rank %d at %.0f MB/s", ok, failed, 1e3 * stage / n, 1e3 * commit / n,
                        100.0 * (stage + commit) / n / mean, mean * 1e3, 1e3 * wait, bytes / 1e6, rank,
                        wr > 0 ? bytes / 1e6 / wr : 0.0);
        }
    }
    /* A failed save mid-run is survivable (the previous checkpoint stays); the last one is
     * the run's result: if it failed, the run failed. */
    if (r.saver && r.steps_run > 0 && !r.last_commit_ok) {
        st = dt_fail(ctx, DT_ERR_IO, "checkpoint: the final checkpoint could not be written (see the messages above); "
                     "the newest intact one in %s is older", cfg->ckpt_dir);
        goto fail;
    }
    if (r.tr.skipped > 0)
        dt_log_info(ctx, "training.nonfinite=skip: %ld of %ld step(s) skipped (non-finite loss or gradient norm)",
                    r.tr.skipped, r.steps_run);
    /* Skipping is for the odd bad step: a run in which no step updated the weights trained
     * nothing, and with a non-finite step among them must not end as a success. Overflows
     * alone are the loss scale's business (dynamic scaling backs off by design; a static scale
     * that overflows is shown by tests/test_compress.sh): said, not failed. */
    if (r.steps_run > 0 && r.updates == 0) {
        const double scale = (double)r.tr.scaler.scale;
        if (r.skipped_overflow == 0)
            st = dt_fail(ctx, DT_ERR_NUMERIC, "training.nonfinite=skip: every step was skipped (%ld of %ld, each for "
                         "a non-finite loss or gradient norm): the run trained nothing; lower optimizer.lr, or check "
                         "the data and model.init_from", r.steps_run, r.steps_run);
        else if (r.skipped_nonfinite > 0)
            st = dt_fail(ctx, DT_ERR_NUMERIC, "training.nonfinite=skip: every step was skipped (%ld of %ld: %ld for a "
                         "non-finite loss or gradient norm, %ld for gradients overflowing the loss scale, now %g): the "
                         "run trained nothing; lower optimizer.lr, or check the data and model.init_from", r.steps_run,
                         r.steps_run, r.skipped_nonfinite, r.skipped_overflow, scale);
        else if (r.tr.scaler.dynamic)
            dt_log_warn(ctx, "every step was skipped (%ld of %ld): the gradients overflowed while the dynamic loss "
                        "scale backed off (now %g); nothing was trained yet", r.steps_run, r.steps_run, scale);
        else
            dt_log_warn(ctx, "every step was skipped (%ld of %ld, each for gradients overflowing at the static "
                        "training.loss_scale %g): nothing was trained; lower training.loss_scale or set it to auto",
                        r.steps_run, r.steps_run, scale);
        if (st != DT_OK) goto fail;
    }
    DT_CHECK_GOTO(check_diverged(ctx, &r, cfg, mc));
    if (r.replica_checks > 0)
        dt_log_info(ctx, "parallel.check_replicas: %d check(s), the parameters of all %d rank(s) identical "
                    "(xxh3 %016llx at step %ld)", r.replica_checks, world, (unsigned long long)r.replica_hash,
                    r.replica_step);
    if (r.steps_run > 0) DT_CHECK_GOTO(log_memory(ctx, &r, comm));
    if (save_weights && !preempted) DT_CHECK_GOTO(save_weights_file(ctx, &r, cfg, t->steps, save_weights));
    if (!preempted) DT_CHECK_GOTO(save_grads_file(ctx, &r, t->steps));
    if (cfg->trace[0]) {
        dt_trace_disable();
        DT_CHECK_GOTO(dt_trace_write_merged(ctx, comm, cfg->trace));
        dt_trace_reset();
        dt_log_info(ctx, "trace: %s (open in https://ui.perfetto.dev or chrome://tracing)", cfg->trace);
    }
fail:
    run_free(&r);
    return st;
}
