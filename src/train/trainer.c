#include "train/trainer.h"

#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/procinfo.h"
#include "core/timer.h"
#include "core/trace.h"
#include "ops/ops.h"
#include "data/synthetic.h"
#include "parallel/mesh.h"
#include "train/trainer_impl.h"

void dt_train_cfg_defaults(dt_train_cfg *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->preset, "gpt2-tiny");
    c->model = (dt_model_config){.n_layer = 2, .d_model = 64, .n_head = 4, .vocab = 256, .context = 64};
    c->micro_batch = 4;
    c->seq_len = 64;
    c->accum = 1;
    c->steps = 20;
    c->sched = (dt_lr_schedule){DT_SCHED_COSINE, 6e-4f, 6e-5f, 0, 20};
    c->adamw = (dt_adamw){0.9f, 0.95f, 1e-8f, 0.1f};
    c->clip = 1.0f;
    c->parallel = (dt_parallel_cfg){DT_STRAT_DDP, 0, 4u << 20, 1, 1, DT_F32, DT_F32, 1, DT_AR_AUTO, "", DT_COMPRESS_NONE, 0.01, 0, 1, 0, 0, 0, 0, 0, 0, DT_ZR_AUTO, DT_ZG_AUTO, 0, 0, 0, 0, 0};
    c->seed = 1337;
    c->model_opts = (dt_model_opts){DT_RECOMPUTE_NONE, 1, DT_F32, 1, 0, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    c->loss_scale_window = 2000;
}

dt_status dt_train_cfg_validate(dt_ctx *ctx, const dt_train_cfg *c) {
    if (!(c->loss_scale >= 0.0f && c->loss_scale <= DT_LOSS_SCALE_MAX))
        return dt_fail(ctx, DT_ERR_CONFIG, "training.loss_scale must be auto (0) or in (0, %g] (got %g)",
                       (double)DT_LOSS_SCALE_MAX, (double)c->loss_scale);
    if (!(c->moe_capacity >= 0.0f && c->moe_capacity <= 1e6f))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.moe_capacity_factor must be in [0, 1e6] (0 = dropless; got %g)",
                       (double)c->moe_capacity);
    if (!(c->moe_aux_coef >= 0.0f && c->moe_aux_coef < 1e6f))
        return dt_fail(ctx, DT_ERR_CONFIG, "training.moe_aux_loss_coef must be in [0, 1e6) (got %g)",
                       (double)c->moe_aux_coef);
    if (!(c->moe_z_coef >= 0.0f && c->moe_z_coef < 1e6f))
        return dt_fail(ctx, DT_ERR_CONFIG, "training.moe_z_loss_coef must be in [0, 1e6) (got %g)",
                       (double)c->moe_z_coef);
    if (c->loss_scale_window < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.loss_scale_window must be >= 1 (got %ld)", c->loss_scale_window);
    if (c->model_opts.recompute_every < 1 || c->model_opts.recompute_every > 1 << 20)
        return dt_fail(ctx, DT_ERR_CONFIG, "memory.activation_checkpointing_every must be in [1, 1048576] (got %d)",
                       c->model_opts.recompute_every);
    if (c->model_opts.head_rows < 0 || c->model_opts.head_rows > 1 << 20)
        return dt_fail(ctx, DT_ERR_CONFIG, "memory.fused_loss_rows must be in [0, 1048576] (0 = %d; got %d)",
                       DT_HEAD_ROWS, c->model_opts.head_rows);
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
    if (c->model_opts.lora.rank != 0 || c->model_opts.lora.nf4)
        DT_CHECK(dt_lora_validate(ctx, &c->model, &c->model_opts.lora));
    return DT_OK;
}

/* The model's options under cfg's strategy: the fused loss needs the gradients in place for
 * the whole micro-step (DDP, ZeRO-1); ZeRO-2/3 store the logits (the same bits). */
static dt_model_opts model_opts(const dt_train_cfg *cfg) {
    dt_model_opts o = cfg->model_opts;
    /* a pipeline's last stage runs forwards ahead of their backwards (gpipe): the head's
     * gradients are formed in the backward (the same bits, model.h) */
    o.fused_loss = o.fused_loss && cfg->parallel.strategy <= DT_STRAT_ZERO1 && cfg->pp <= 1;
    return o;
}

/* Context parallelism: the rows of a micro-batch this rank holds (inputs and targets). */
static size_t cp_tok_bytes(const dt_train_cfg *cfg) {
    return cfg->cp > 1 ? 2 * (size_t)cfg->micro_batch * (size_t)dt_train_local_T(cfg) * sizeof(int32_t) : 0;
}

/* Before anything is allocated: a lower bound of what a rank needs (activations of one
 * micro-batch, and model state fully sharded: 16 bytes per parameter over all ranks; LoRA:
 * per adapter parameter, plus the frozen base every rank holds whole) against
 * what this host has free for its ranks. A run that cannot fit fails here in milliseconds,
 * naming the numbers and the keys to change, instead of swapping or being OOM-killed. A
 * lower bound never refuses a run that would fit; the exact plan is `dtrain bench
 * --find-batch`. DTRAIN_MEM_AVAILABLE (bytes) overrides the host's figure (tests). */
static dt_status check_memory(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm) {
    const char *ov = getenv("DTRAIN_MEM_AVAILABLE");
    double avail = ov ? strtod(ov, NULL) : (double)dt_proc_bytes("/proc/meminfo", "MemAvailable");
    if (!(avail > 0)) return DT_OK;
    int world = comm ? dt_comm_size(comm, DT_GROUP_WORLD) : 1, local = comm ? dt_comm_size(comm, DT_GROUP_NODE) : 1;
    double psi = (double)dt_model_num_params(&cfg->model);
    dt_model_opts mo = model_opts(cfg);
    double acts = 4.0 * (double)dt_model_act_floats_opts(&cfg->model, &mo, cfg->micro_batch, dt_train_local_T(cfg));
    double state = 16.0 * psi / world;
    if (mo.lora.rank > 0) { /* LoRA: the adapters' state sharded, plus the whole frozen base */
        size_t b[DT_MEM_NKINDS] = {0};
        dt_lora_plan(&cfg->model, &mo, b);
        state = 16.0 * (double)dt_lora_num_params(&cfg->model, &mo.lora) / world + (double)b[DT_MEM_PARAMS];
    }
    double need = acts + state, have = avail / local;
    if (need <= have) return DT_OK;
    const double g = 1024.0 * 1024.0 * 1024.0;
    return dt_fail(ctx, DT_ERR_NOMEM,
                   "memory: each rank needs at least %.1f GiB (activations %.1f GiB for training.micro_batch %d x "
                   "training.seq_len %d, model state %.1f GiB even fully sharded over %d rank(s)) but this host has "
                   "%.1f GiB available for its %d rank(s): lower training.micro_batch or training.seq_len, pick a "
                   "smaller model.preset, or add ranks with parallel.strategy=zero3",
                   need / g, acts / g, cfg->micro_batch, cfg->seq_len, state / g, world, avail / g, local);
}

void dt_test_aid(const char *name, long *a, int *b) {
    const char *v = getenv(name);
    if (!v || sscanf(v, "%ld:%d", a, b) != 2) *a = -1;
}

/* This host's physical memory in bytes (DTRAIN_MEM_PHYSICAL overrides it: tests). */
static double phys_bytes(void) {
    const char *ov = getenv("DTRAIN_MEM_PHYSICAL");
    if (ov) return strtod(ov, NULL);
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0.0;
}

static dt_status plan_body(dt_ctx *ctx, const dt_train_cfg *cfg, int world, int node_ranks, int rank,
                           size_t bytes[DT_MEM_NKINDS]);

/* parallel.zero_reduce's auto: once per step under a pipeline, and under expert parallelism
 * with several micro-steps (its experts' gradients are accumulated over the step before their
 * reduction: decision 88); per micro-step otherwise. */
static int auto_reduce(const dt_train_cfg *c) {
    return c->pp > 1 || (c->ep > 1 && c->accum > 1) ? DT_ZR_STEP : DT_ZR_MICRO;
}

dt_status dt_trainer_zero3_fits(dt_ctx *ctx, const dt_train_cfg *cfg, int world, int node_ranks, int rank,
                                double budget, int *fits) {
    dt_train_cfg c = *cfg;
    c.parallel.zero3_gather = DT_ZG_STEP;
    if (c.parallel.zero_reduce == DT_ZR_AUTO) c.parallel.zero_reduce = auto_reduce(cfg);
    size_t b[DT_MEM_NKINDS];
    DT_CHECK(plan_body(ctx, &c, world, node_ranks, rank, b));
    double tot = 0;
    for (int k = 0; k < DT_MEM_NKINDS; k++) tot += (double)b[k];
    *fits = tot <= budget;
    return DT_OK;
}

/* parallel.zero_reduce and parallel.zero3_gather's auto, by this rank's rule (decision 80):
 * gradients once per step under a pipeline; ZeRO-3's parameters resident for the step under a
 * pipeline when the plan with them fits this rank's share of the host's physical memory. */
static dt_status resolve_zero(dt_ctx *ctx, dt_train_cfg *c, int world, int node_ranks, int rank) {
    if (c->parallel.zero_reduce == DT_ZR_AUTO) c->parallel.zero_reduce = auto_reduce(c);
    if (c->parallel.zero3_gather != DT_ZG_AUTO) return DT_OK;
    int fits = 0;
    if (c->parallel.strategy == DT_STRAT_ZERO3 && c->pp > 1)
        DT_CHECK(dt_trainer_zero3_fits(ctx, c, world, node_ranks, rank, phys_bytes() / node_ranks, &fits));
    c->parallel.zero3_gather = fits ? DT_ZG_STEP : DT_ZG_USE;
    return DT_OK;
}

dt_status dt_trainer_mem_plan(dt_ctx *ctx, const dt_train_cfg *cfg, int world, int node_ranks, int rank,
                              size_t bytes[DT_MEM_NKINDS]) {
    memset(bytes, 0, DT_MEM_NKINDS * sizeof bytes[0]);
    if (world < 1 || node_ranks < 1 || world % node_ranks || rank < 0 || rank >= world)
        return dt_fail(ctx, DT_ERR_CONFIG, "memory plan: %d ranks cannot be %d per node (rank %d)", world,
                       node_ranks, rank);
    dt_train_cfg c = *cfg;
    DT_CHECK(resolve_zero(ctx, &c, world, node_ranks, rank));
    return plan_body(ctx, &c, world, node_ranks, rank, bytes);
}

static dt_status plan_body(dt_ctx *ctx, const dt_train_cfg *cfg, int world, int node_ranks, int rank,
                           size_t bytes[DT_MEM_NKINDS]) {
    memset(bytes, 0, DT_MEM_NKINDS * sizeof bytes[0]);
    dt_model_config mc = cfg->model;
    DT_CHECK(dt_model_config_validate(ctx, &mc));
    if (world < 1 || node_ranks < 1 || world % node_ranks || rank < 0 || rank >= world)
        return dt_fail(ctx, DT_ERR_CONFIG, "memory plan: %d ranks cannot be %d per node (rank %d)", world,
                       node_ranks, rank);
    dt_model_opts mo = model_opts(cfg);
    dt_tensor_info table[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors_tp(&mc, &mo, table); /* tensor parallelism: one rank's shards */
    const int tp = cfg->parallel.tp > 1 ? cfg->parallel.tp : 1, pp = cfg->pp > 1 && !cfg->pp_blocks ? cfg->pp : 1;
    int stage = 0, slots = 1;
    if (mo.ep > 1) /* expert parallelism (cp = 1): EP rank = dp rank % ep (parallel/mesh.h: tp fastest, then dp) */
        mo.ep_rank = rank % (world / pp) / tp % mo.ep;
    if (pp > 1) { /* a pipeline stage (parallel/mesh.h: tp fastest, then dp, then pp) */
        if (world % (tp * pp))
            return dt_fail(ctx, DT_ERR_CONFIG, "memory plan: parallel.tp=%d x parallel.pp=%d does not divide %d ranks",
                           tp, pp, world);
        dt_train_cfg c2 = *cfg;
        DT_CHECK(dt_pp_cfg_stages(ctx, &c2));
        const int dpw = world / (tp * pp);
        stage = rank / (tp * dpw);
        mo.pp_l0 = c2.pp_first[stage], mo.pp_l1 = c2.pp_first[stage + 1];
        dt_pp_chunk_opts(&c2, &mo);
        DT_CHECK(dt_model_stage_table(ctx, &mc, &mo, table, n));
        if (dt_pp_chunks(cfg) > 1) { /* token copies; a copy of every message (pipeline.c) */
            bytes[DT_MEM_OTHER] += dt_pp_tokens_bytes(cfg);
            const int N = dt_model_family_of(&mc)->token_rows ? dt_model_family_of(&mc)->token_rows(&mc, cfg->micro_batch, dt_train_local_T(cfg))
                                                                : cfg->micro_batch * dt_train_local_T(cfg);
            const size_t rows = mo.sp ? (size_t)N / (size_t)(mo.tp > 1 ? mo.tp : 1) : (size_t)N;
            bytes[DT_MEM_COMM] += dt_pp_pool_bytes(cfg, rows * (size_t)mc.d_model);
        }
        slots = dt_pp_inflight((dt_pp_kind)cfg->pp_kind, pp, cfg->pp_virtual > 0 ? cfg->pp_virtual : 1, cfg->accum,
                               stage);
        slots = slots > 1 ? slots : 1;
        /* this stage's tp x dp ranks, consecutive world ranks: its nodes' parts of them (hybrid) */
        world = tp * dpw, rank = rank % (tp * dpw);
        node_ranks = world % node_ranks == 0 ? node_ranks : node_ranks % world == 0 ? world : 1;
    }
    if (tp > 1) { /* the data-parallel group: tp fastest in rank order (parallel/mesh.h) */
        mo.tp_first = rank % tp;
        world /= tp, rank /= tp;
        node_ranks = node_ranks % tp == 0 ? node_ranks / tp : 1;
        bytes[DT_MEM_OTHER] += dt_trainer_tp_scratch(cfg) * sizeof(float);
    }
    if (mo.ep > 1) { /* this EP rank's experts (cp = 1; a stage's under a pipeline: after the tp split, its
                        dp ranks are the world now) */
        DT_CHECK(dt_model_stage_table(ctx, &mc, &mo, table, n));
        dt_ep_plan(cfg, &mo, world, dt_stage_chunks(&mo) * dt_stage_layers(&mc, &mo), bytes);
    }
    dt_alloc a; /* the store's table and unit arrays: what dt_model_init allocates besides slabs */
    dt_alloc_init(&a);
    dt_params ps, base;
    const dt_lora_cfg *lora = &cfg->model_opts.lora;
    if (lora->rank > 0) { /* ps: the adapters; the frozen base besides (dt_lora_plan) */
        DT_CHECK(dt_lora_validate(ctx, &mc, lora));
        DT_CHECK(dt_lora_adapters_init(ctx, &ps, &mc, &mo, &a, 0)); /* tensor parallelism: this rank's shards */
        DT_CHECK(dt_lora_base_init(ctx, &base, &mc, &mo, &a, 0));
    } else {
        DT_CHECK(dt_params_init(ctx, &ps, table, n, dt_stage_chunks(&mo) * dt_stage_layers(&mc, &mo), &a, 0));
    }
    for (int k = 0; k < DT_MEM_NKINDS; k++) bytes[k] += a.cur[k];
    const size_t F = sizeof(float);
    dt_strategy strat = cfg->parallel.strategy;
    if (strat != DT_STRAT_ZERO3) bytes[DT_MEM_PARAMS] += ps.n_params * F;
    if (strat == DT_STRAT_DDP || strat == DT_STRAT_ZERO1) bytes[DT_MEM_GRADS] += ps.n_params * F;
    /* a head tied to the embedding under a pipeline or its blocks mode: its gradients apart */
    if (cfg->pp > 1 && lora->rank <= 0) bytes[DT_MEM_GRADS] += dt_pp_tied_floats(&ps) * F;
    /* a pipeline stage: an activation set per micro-batch in flight (pipeline.c); zb-h1: each
     * with its deferred weight GEMMs' douts where dead activations do not take them (their
     * placement: decision 81) */
    bytes[DT_MEM_ACTS] += (size_t)slots * dt_model_act_floats_opts(&mc, &mo, cfg->micro_batch, dt_train_local_T(cfg)) * F;
    if (pp > 1 && cfg->pp_kind == DT_PP_ZBH1) {
        dt_model shape; /* what dt_model_defer_plan reads: the family, its options, the batch */
        memset(&shape, 0, sizeof shape);
        shape.fam = dt_model_family_of(&mc), shape.cfg = mc, shape.opts = mo, shape.B = cfg->micro_batch, shape.T = dt_train_local_T(cfg);
        int items;
        bytes[DT_MEM_ACTS] += (size_t)slots * dt_model_defer_plan(&shape, NULL, &items) * F;
        bytes[DT_MEM_OTHER] += (size_t)slots * (size_t)dt_model_defer_gemms(&shape, items) * sizeof(dt_wdefer_item) +
                              (size_t)items * sizeof(dt_wdefer_place);
    }
    bytes[DT_MEM_OTHER] += dt_model_family_of(&mc)->impl_bytes;
    /* as dt_trainer_init: ZeRO-3's model has no slabs (and gathers the 16-bit weights) */
    if (lora->rank > 0) { /* the windows narrow the base, which every strategy holds whole */
        dt_model_lowp_plan(&base, &mo, DT_SLAB_PARAMS, cfg->micro_batch, dt_train_local_T(cfg), bytes);
        dt_lora_plan(&mc, &mo, bytes);
        dt_params_free(&base);
    } else {
        dt_model_lowp_plan(&ps, &mo, strat == DT_STRAT_ZERO3 ? 0 : DT_SLAB_PARAMS, cfg->micro_batch,
                           dt_train_local_T(cfg), bytes);
    }
    dt_parallel_cfg pc = cfg->parallel;
    pc.accum = cfg->accum * dt_pp_passes(cfg);
    pc.compute = cfg->model_opts.compute;
    pc.tokens = cfg->micro_batch * dt_train_local_T(cfg);
    dt_ep_parallel_cfg(&ps, &mc, &mo, world, rank, &pc); /* expert parallelism: ZeRO shards the experts over EDP */
    dt_parallel_plan(&ps, &pc, world, node_ranks, rank, bytes);
    bytes[DT_MEM_OTHER] += 2 * (size_t)cfg->micro_batch * cfg->seq_len * sizeof(int32_t) + cp_tok_bytes(cfg) +
                           dt_moe_load_bytes(cfg);
    dt_params_free(&ps);
    return DT_OK;
}

dt_status dt_trainer_mem_plan_here(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm,
                                   size_t bytes[DT_MEM_NKINDS]) {
    int node = dt_comm_size(comm, DT_GROUP_NODE);
    int me = dt_comm_rank(comm, DT_GROUP_CROSS) * node + dt_comm_rank(comm, DT_GROUP_NODE);
    return dt_trainer_mem_plan(ctx, cfg, dt_comm_size(comm, DT_GROUP_WORLD), node, me, bytes);
}

size_t dt_trainer_tp_scratch(const dt_train_cfg *cfg) {
    size_t tp = cfg->parallel.tp > 1 ? (size_t)cfg->parallel.tp : 1;
    size_t n = (size_t)cfg->micro_batch * dt_train_local_T(cfg) * (size_t)cfg->model.d_model; /* the largest TP sum */
    return tp > 1 ? tp * ((n + tp - 1) / tp) : 0;
}

/* The TP group's sums for the model (model.h dt_model_tp_ops): comm.h's ordered all-reduce (rank
 * order) and a max; a failure is kept for the trainer to report. */
static void tp_count(dt_tp_link *t, double t0, size_t n) {
    int k = dt_comm_size(t->comm, t->group);
    t->seconds += dt_now() - t0;
    t->bytes += 2.0 * (double)(k - 1) / (double)k * (double)n * sizeof(float);
}
static int tp_sum(void *ud, float *x, size_t n) {
    dt_tp_link *t = ud;
    if (t->failed) return 1;
    double t0 = dt_now();
    if (dt_comm_allreduce_ordered(&t->ctx, t->comm, t->group, x, n, t->scratch) != DT_OK) t->failed = 1;
    tp_count(t, t0, n);
    return t->failed;
}
static int tp_max(void *ud, float *x, size_t n) {
    dt_tp_link *t = ud;
    if (t->failed) return 1;
    double t0 = dt_now();
    if (dt_comm_allreduce(&t->ctx, t->comm, t->group, x, n, DT_F32, DT_MAX) != DT_OK) t->failed = 1;
    tp_count(t, t0, n);
    return t->failed;
}

/* Sequence parallelism's collectives over the TP group (model.h dt_model_tp_ops): n floats
 * per rank, each rank's block at rank n (all-gather in place; reduce-scatter in rank order). */
static int tp_blocks_op(dt_tp_link *t, const float *in, float *buf, size_t n) {
    if (t->failed) return 1;
    double t0 = dt_now();
    int k = dt_comm_size(t->comm, t->group);
    size_t cnt[64], off[64];
    for (int r = 0; r < k && r < 64; r++) cnt[r] = n, off[r] = (size_t)r * n;
    dt_status st = k > 64 ? dt_fail(&t->ctx, DT_ERR_CONFIG, "sequence parallelism over more than 64 TP ranks")
                   : in  ? dt_comm_reduce_scatter_ordered(&t->ctx, t->comm, t->group, in, cnt, off, buf, t->scratch)
                         : dt_comm_allgatherv(&t->ctx, t->comm, t->group, buf, cnt, off);
    if (st != DT_OK) t->failed = 1;
    t->seconds += dt_now() - t0;
    t->bytes += (double)(k - 1) * (double)n * sizeof(float);
    return t->failed;
}
static int tp_allgather(void *ud, float *buf, size_t n) { return tp_blocks_op(ud, NULL, buf, n); }
static int tp_reduce_scatter(void *ud, const float *in, float *out, size_t n) { return tp_blocks_op(ud, in, out, n); }

/* Context parallelism's ring (model/cp.h): point-to-point over the CP group, one tag per slot. */
enum { TAG_CP = 6000 };
static int cp_start(void *ud, int slot, const float *send, float *recv, size_t n) {
    dt_cp_link *c = ud;
    const int next = (c->rank + 1) % c->n, prev = (c->rank + c->n - 1) % c->n;
    double t0 = dt_now();
    dt_status st = dt_comm_irecv(&c->ctx, c->comm, c->group, recv, n * sizeof(float), prev, TAG_CP + slot, &c->rreq[slot]);
    if (st == DT_OK)
        st = dt_comm_isend(&c->ctx, c->comm, c->group, send, n * sizeof(float), next, TAG_CP + slot, &c->sreq[slot]);
    c->seconds += dt_now() - t0;
    c->bytes += (double)n * sizeof(float);
    return st != DT_OK;
}
static int cp_wait(void *ud, int slot) {
    dt_cp_link *c = ud;
    double t0 = dt_now(), tr = dt_trace_begin();
    dt_status st = DT_OK;
    if (c->rreq[slot]) st = dt_comm_wait(&c->ctx, c->comm, c->rreq[slot]);
    if (c->sreq[slot] && st == DT_OK) st = dt_comm_wait(&c->ctx, c->comm, c->sreq[slot]);
    c->rreq[slot] = c->sreq[slot] = NULL;
    c->seconds += dt_now() - t0;
    dt_trace_end(tr, "cp", "ring %s", slot == DT_CP_KV ? "k|v" : "dk|dv");
    return st != DT_OK;
}

/* parallel.cp_comm=all_gather: the blocks gathered, the gradient shares sent home (model/cp.h). */
static int cp_allgather(void *ud, float *buf, size_t n) {
    dt_cp_link *c = ud;
    size_t counts[DT_CP_MAX];
    for (int q = 0; q < c->n; q++) counts[q] = n;
    double t0 = dt_now(), tr = dt_trace_begin();
    dt_status st = dt_comm_allgather(&c->ctx, c->comm, c->group, buf, counts);
    c->seconds += dt_now() - t0;
    c->bytes += (double)n * sizeof(float) * (c->n - 1);
    dt_trace_end(tr, "cp", "all-gather k|v");
    return st != DT_OK;
}
static int cp_alltoall(void *ud, const float *send, float *recv, size_t n) {
    dt_cp_link *c = ud;
    double t0 = dt_now(), tr = dt_trace_begin();
    dt_status st = dt_comm_alltoall(&c->ctx, c->comm, c->group, send, recv, n, sizeof(float));
    c->seconds += dt_now() - t0;
    c->bytes += (double)n * sizeof(float) * (c->n - 1);
    dt_trace_end(tr, "cp", "all-to-all dk|dv");
    return st != DT_OK;
}

/* After a pass: a TP collective or a CP ring transfer that failed stops the run, naming it. */
dt_status dt_trainer_tp_check(dt_ctx *ctx, dt_trainer *tr) {
    if (tr->model.ep_failed)
        return dt_fail(ctx, DT_ERR_BACKEND, "expert parallelism: an all-to-all of the EP group failed: %s", tr->ep.ctx.err);
    if (tr->model.cp_failed)
        return dt_fail(ctx, DT_ERR_BACKEND, "context parallelism: a transfer of the CP ring failed: %s", tr->cp.ctx.err);
    if (!tr->model.tp_failed) return DT_OK;
    return dt_fail(ctx, DT_ERR_BACKEND, "tensor parallelism: a collective of the TP group failed: %s", tr->tp.ctx.err);
}

/* Resolves the ZeRO modes' auto in tr->cfg (so the memory plan sees what runs): each rank's rule,
 * then one verdict for the world (resident parameters only if they fit on every rank), since the
 * ranks of a data-parallel group must issue the same gathers. */
static dt_status zero_modes(dt_ctx *ctx, dt_trainer *tr, dt_comm *comm) {
    dt_train_cfg *c = &tr->cfg;
    const int was_auto = c->parallel.zero3_gather == DT_ZG_AUTO;
    const int node = dt_comm_size(comm, DT_GROUP_NODE), world = dt_comm_size(comm, DT_GROUP_WORLD);
    const int me = dt_comm_rank(comm, DT_GROUP_CROSS) * node + dt_comm_rank(comm, DT_GROUP_NODE);
    DT_CHECK(resolve_zero(ctx, c, world, node, me));
    if (!was_auto || c->parallel.strategy != DT_STRAT_ZERO3 || c->pp <= 1 || world <= 1) return DT_OK;
    int64_t fits = c->parallel.zero3_gather == DT_ZG_STEP;
    DT_CHECK(dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, &fits, 1, DT_I64, DT_MIN));
    c->parallel.zero3_gather = fits ? DT_ZG_STEP : DT_ZG_USE;
    return DT_OK;
}

dt_status dt_trainer_init(dt_ctx *ctx, dt_trainer *tr, const dt_train_cfg *cfg, dt_comm *comm) {
    memset(tr, 0, sizeof *tr);
    tr->cfg = *cfg;
    dt_alloc_init(&tr->alloc);
    tr->alloc.fail_at = cfg->fail_alloc_at;
    /* Test aid: DTRAIN_TEST_NAN=STEP:RANK makes that rank's loss NaN in that step (1-based; 0:
     * in every step). */
    dt_test_aid("DTRAIN_TEST_NAN", &tr->poison_step, &tr->poison_rank);
    /* Test aid: DTRAIN_TEST_SPIKE=STEP:RANK multiplies that rank's loss in that step by 100. */
    dt_test_aid("DTRAIN_TEST_SPIKE", &tr->spike_step, &tr->spike_rank);
    /* Test aid: DTRAIN_TEST_OVERFLOW=STEP:RANK puts an Inf into that rank's gradients in that step
     * (0: in every step). */
    dt_test_aid("DTRAIN_TEST_OVERFLOW", &tr->overflow_step, &tr->overflow_rank);
    if (cfg->loss_scale > 0.0f)
        dt_loss_scaler_init(&tr->scaler, cfg->loss_scale, 0, cfg->loss_scale_window);
    else if (cfg->model_opts.compute == DT_F16)
        dt_loss_scaler_init(&tr->scaler, 65536.0f, 1, cfg->loss_scale_window);
    else
        dt_loss_scaler_init(&tr->scaler, 1.0f, 0, cfg->loss_scale_window);
    /* Test aid: DTRAIN_TEST_SLOW=RANK:MS makes that rank's forward MS ms longer each micro-step. */
    long slow_rank;
    dt_test_aid("DTRAIN_TEST_SLOW", &slow_rank, &tr->slow_ms);
    tr->slow_rank = (int)slow_rank;
    /* Validated once, by the config layer (train/keys.c); a library caller's own configuration
     * is validated here, the model's shape derived in the trainer's copy (decision 72). */
    if (!tr->cfg.checked) {
        DT_CHECK(dt_model_config_validate(ctx, &tr->cfg.model));
        DT_CHECK(dt_train_cfg_validate(ctx, &tr->cfg));
        tr->cfg.checked = 1;
    }
    cfg = &tr->cfg;
    DT_CHECK(check_memory(ctx, cfg, comm));
    dt_status st = DT_OK;
    /* The strategy decides which full slabs exist: ZeRO-2 has no full gradients, ZeRO-3
     * neither full parameters. */
    dt_strategy strat = cfg->parallel.strategy;
    dt_model_opts mo = model_opts(cfg);
    dt_parallel_cfg pc = cfg->parallel;
    if (!comm) {
        DT_CHECK_GOTO(dt_comm_init_self(ctx, &tr->own_comm));
        comm = tr->own_comm;
    }
    tr->comm = comm;
    tr->dp_group = DT_GROUP_WORLD;
    tr->pp.n = 1;
    tr->cp.n = 1;
    tr->ep.n = 1;
    tr->mp_ranks = 1;
    if (cfg->pp > 1) DT_CHECK_GOTO(dt_pp_cfg_stages(ctx, &tr->cfg)); /* the stages' layers */
    if (cfg->parallel.tp > 1 || (cfg->pp > 1 && !cfg->pp_blocks) || cfg->cp > 1 || cfg->ep > 1)
        DT_CHECK_GOTO(dt_trainer_mesh_groups(ctx, tr, &mo, &pc));
    DT_CHECK_GOTO(dt_model_init_opts(ctx, &tr->model, &cfg->model, &mo, &tr->alloc, cfg->micro_batch,
                                         dt_train_local_T(cfg),
                                         strat == DT_STRAT_ZERO3   ? 0
                                         : strat == DT_STRAT_ZERO2 ? DT_SLAB_PARAMS
                                                                   : DT_SLAB_PARAMS | DT_SLAB_GRADS));
    tr->model.moe_aux_coef = cfg->moe_aux_coef;
    tr->model.moe_z_coef = cfg->moe_z_coef;
    tr->model.moe_aux_layer = cfg->moe_aux_layer;
    tr->model.moe_capacity = cfg->moe_capacity;
    if (cfg->cp > 1) { /* the ring, and the rows of each micro-batch this rank holds */
        tr->model.cp_ring = (dt_cp_ring){tr->cp.n, tr->cp.rank, cfg->cp_contiguous, &tr->cp, cp_start, cp_wait,
                                         cfg->model_opts.cp_all_gather ? cp_allgather : NULL,
                                         cfg->model_opts.cp_all_gather ? cp_alltoall : NULL, dt_moe_cp_sum};
        DT_CHECK_GOTO(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, cp_tok_bytes(cfg), (void **)&tr->cp.tok));
    }
    if (cfg->parallel.tp > 1) {
        size_t n = dt_trainer_tp_scratch(cfg) * sizeof(float);
        DT_CHECK_GOTO(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, n, (void **)&tr->tp.scratch));
        tr->model.tp_ops = (dt_model_tp_ops){&tr->tp, tp_sum, tp_max, tp_allgather, tp_reduce_scatter};
    }
    DT_CHECK_GOTO(dt_ep_init(ctx, tr)); /* expert parallelism: the all-to-all, the gradient segments */
    DT_CHECK_GOTO(dt_moe_load_init(ctx, tr)); /* a mixture of experts: the step's expert load */
    if (tr->ep.n > 1) { /* the experts (under LoRA their adapters: dt_ep_init's range), reduced by
                           dt_ep_reduce, held (ZeRO: sharded) by the EDP group */
        pc.skip_off = tr->ep.off, pc.skip_len = tr->ep.len;
        pc.skip_ranks = tr->ep.edp_n, pc.skip_rank = tr->ep.edp_rank, pc.skip_group = tr->ep.edp;
    }
    pc.accum = cfg->accum * dt_pp_passes(cfg); /* a micro-step per pass (a chunk's; zb-h1's B and W) */
    pc.compute = cfg->model_opts.compute;
    DT_CHECK_GOTO(zero_modes(ctx, tr, comm)); /* parallel.zero_reduce / zero3_gather's auto */
    pc.zero_reduce = tr->cfg.parallel.zero_reduce, pc.zero3_gather = tr->cfg.parallel.zero3_gather;
    DT_CHECK_GOTO(dt_parallel_init(ctx, &tr->par, comm, &tr->model, &tr->alloc, &pc, cfg->seed));
    if (cfg->pp > 1) DT_CHECK_GOTO(dt_pp_init(ctx, tr));
    size_t bt = (size_t)cfg->micro_batch * cfg->seq_len * sizeof(int32_t);
    DT_CHECK_GOTO(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, bt, (void **)&tr->inputs));
    DT_CHECK_GOTO(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, bt, (void **)&tr->targets));
    /* dt_parallel_init drew the initial weights: every rank the same values from the counter
     * RNG (its shard only under ZeRO-3), so no broadcast is needed. */
    return DT_OK;
fail:
    dt_trainer_free(tr);
    return st;
}

void dt_trainer_free(dt_trainer *tr) {
    size_t bt = (size_t)tr->cfg.micro_batch * tr->cfg.seq_len * sizeof(int32_t);
    dt_pp_free(tr);
    dt_ep_free(tr);
    dt_moe_load_free(tr);
    dt_parallel_free(tr->par);
    dt_comm_free(tr->own_comm);
    dt_alloc_put(&tr->alloc, DT_MEM_OTHER, tr->inputs, bt);
    dt_alloc_put(&tr->alloc, DT_MEM_OTHER, tr->targets, bt);
    if (tr->cp.tok) dt_alloc_put(&tr->alloc, DT_MEM_OTHER, tr->cp.tok, cp_tok_bytes(&tr->cfg));
    tr->cp.tok = NULL;
    if (tr->tp.scratch) dt_alloc_put(&tr->alloc, DT_MEM_OTHER, tr->tp.scratch, dt_trainer_tp_scratch(&tr->cfg) * sizeof(float));
    tr->tp.scratch = NULL;
    dt_model_free(&tr->model);
    tr->par = NULL;
    tr->own_comm = NULL;
    tr->inputs = tr->targets = NULL;
}

/* Shared tail of a step: gradients reduced across ranks, the mean loss, global clip,
 * schedule, AdamW. *mean_loss comes in as this rank's mean over its micro-steps and leaves
 * as the mean over all ranks. Every rank sees the same mean loss (a NaN or Inf anywhere makes
 * the sum non-finite everywhere) and the same gradient norm (computed from the reduced
 * gradients), so all ranks take the same decision on a non-finite step without another
 * collective. */
static dt_status finish_step(dt_ctx *ctx, dt_trainer *tr, double *mean_loss, dt_step_stats *out) {
    double tr0 = dt_trace_begin();
    double t0 = dt_now();
    DT_CHECK(dt_parallel_finish_grads(ctx, tr->par));
    DT_CHECK(dt_ep_reduce(ctx, tr)); /* the experts' gradients, over their EDP group */
    if (tr->pp.n > 1) DT_CHECK(dt_pp_share_loss(ctx, tr, mean_loss)); /* the last stage's, on every stage */
    DT_CHECK(dt_parallel_mean(ctx, tr->par, mean_loss));
    out->sync_seconds = dt_now() - t0;
    t0 = dt_now();
    double sumsq;
    /* under a pipeline (or its blocks mode): summed stage by stage; then the tied embedding's
     * gradient to the last stage's copy */
    DT_CHECK(tr->cfg.pp > 1   ? dt_pp_sumsq(ctx, tr, &sumsq)
             : tr->ep.n > 1 && tr->cfg.parallel.strategy == DT_STRAT_DDP ? dt_ep_sumsq(ctx, tr, 1, 1, &sumsq)
                            : dt_parallel_grad_sumsq(ctx, tr->par, &sumsq));
    if (tr->pp.n > 1) DT_CHECK(dt_pp_tied_grads(ctx, tr));
    const float S = tr->scaler.scale;
    double norm = sqrt(sumsq) / S; /* of the unscaled gradients */
    float lr = dt_lr_at(&tr->cfg.sched, tr->step);
    out->skipped = 0;
    out->loss_scale = S;
    /* With loss scaling, Inf/NaN gradients of a finite loss are an overflow: skipped, and
     * the scale backs off (every rank alike: the norm is global). */
    int scaled = S != 1.0f || tr->scaler.dynamic;
    if (scaled && isfinite(*mean_loss) && dt_loss_scaler_update(&tr->scaler, isfinite(norm))) {
        out->skipped = 2;
    } else if (!isfinite(*mean_loss) || !isfinite(norm)) {
        if (!tr->cfg.nonfinite_skip)
            return dt_fail(ctx, DT_ERR_NUMERIC, "step %ld: non-finite %s (loss %g, gradient norm %g): diverged; "
                           "lower optimizer.lr, or training.nonfinite=skip drops such steps",
                           tr->step + 1, isfinite(*mean_loss) ? "gradient norm" : "loss", *mean_loss, norm);
        out->skipped = 1; /* no update: parameters and moments stay; data and schedule move on */
        tr->skipped++;
    } else {
        float coef = dt_clip_coef(norm, tr->cfg.clip) / S;
        DT_CHECK(dt_parallel_update(ctx, tr->par, &tr->cfg.adamw, lr, tr->step + 1, coef));
    }
    /* Top-K's residual (parallel.h): dropped with a skipped step's gradients, and kept in the
     * units of the loss scale the next gradients will have. */
    if (out->skipped) dt_parallel_residual_adjust(tr->par, 0.0f);
    else if (tr->scaler.scale != S) dt_parallel_residual_adjust(tr->par, tr->scaler.scale / S);
    tr->step++;
    out->grad_norm = (float)norm;
    out->lr = lr;
    out->optim_seconds = dt_now() - t0;
    dt_trace_end(tr0, "optim", "sync + optimizer");
    return DT_OK;
}

/* Exposed communication so far: the data-parallel waits, the TP group's collectives and the
 * pipeline's transfers. */
static double exposed_now(const dt_trainer *tr) {
    double ex, tot;
    dt_parallel_comm_time(tr->par, &ex, &tot);
    return ex + tr->tp.seconds + tr->pp.seconds + tr->cp.seconds + tr->ep.seconds;
}

/* Adds the time since *tp, less the exposed communication waits since *ex, to *acc. */
static void add_phase(const dt_trainer *tr, double *tp, double *ex, double *acc) {
    double now = dt_now(), ex1 = exposed_now(tr);
    *acc += (now - *tp) - (ex1 - *ex);
    *tp = now;
    *ex = ex1;
}

dt_status dt_trainer_micro_batch(dt_ctx *ctx, dt_trainer *tr, const dt_micro *mi, int k, int32_t **inp,
                                 int32_t **tgp) {
    dt_model *m = &tr->model;
    const int T = tr->cfg.seq_len; /* whole sequences (context parallelism: this rank's rows below) */
    size_t bt = (size_t)m->B * T;
    int32_t *in = tr->inputs, *tg = tr->targets;
    if (mi->inputs) {
        in = (int32_t *)mi->inputs + k * bt;
        tg = (int32_t *)mi->targets + k * bt;
    } else if (tr->next_batch) {
        DT_CHECK(tr->next_batch(ctx, tr->batch_ud, k, &in, &tg));
    } else {
        /* Global micro-batch index: rank r's micro-step k reads what 1 rank's micro-step
         * k*W + r would (the sampler's order). */
        uint64_t micro = ((uint64_t)tr->step * (uint64_t)tr->cfg.accum + (uint64_t)k) * (uint64_t)mi->W + (uint64_t)mi->R;
        dt_synthetic_batch(tr->cfg.seed, m->cfg.vocab, micro, m->B, T, in, tg);
        if (m->cfg.n_classes > 0) /* a classifier: a label per image, in every slot */
            for (int b = 0; b < m->B; b++)
                for (int t = 0; t < T; t++)
                    tg[(size_t)b * T + t] = tg[(size_t)b * T] % m->cfg.n_classes;
    }
    if (tr->cp.n > 1) { /* this rank's two chunks of each sequence (model/cp.h) */
        dt_cp_rows(tr->cp.tok, in, m->B, T, tr->cp.n, tr->cp.rank, m->cp_ring.contiguous);
        dt_cp_rows(tr->cp.tok + (size_t)m->B * m->T, tg, m->B, T, tr->cp.n, tr->cp.rank, m->cp_ring.contiguous);
        in = tr->cp.tok, tg = tr->cp.tok + (size_t)m->B * m->T;
    }
    *inp = in, *tgp = tg;
    return DT_OK;
}

float dt_trainer_micro_scale(const dt_trainer *tr, const dt_micro *mi, int k) {
    const size_t bt = (size_t)tr->model.B * tr->model.T;
    /* Mean over the global batch, times the loss scale (1 unless fp16). */
    float bscale = mi->masked ? (mi->counted ? (float)((double)tr->scaler.scale * (double)bt / (double)mi->counted) : 0.0f)
                              : tr->scaler.scale / ((float)tr->cfg.accum * (float)mi->G);
    if ((tr->overflow_step == tr->step + 1 || tr->overflow_step == 0) && k == 0 &&
        tr->overflow_rank == dt_comm_rank(tr->comm, DT_GROUP_WORLD))
        bscale = INFINITY; /* test aid: this rank's gradients overflow (Inf/NaN), its loss stays */
    return bscale;
}

void dt_trainer_micro_drop(dt_trainer *tr, const dt_micro *mi, int k) {
    /* LoRA dropout's masks: keyed by the global index of each sequence (micro-batch k W + r
     * of the step in 1 rank's order, B sequences each), so N ranks draw what 1 rank
     * accumulating N x does, and a resumed step what the uninterrupted one did. */
    dt_model *m = &tr->model;
    m->lora_drop_seed = tr->cfg.seed;
    m->lora_drop_seq0 = (((uint64_t)tr->step * (uint64_t)tr->cfg.accum + (uint64_t)k) * (uint64_t)mi->W +
                         (uint64_t)mi->R) * (uint64_t)m->B;
}

/* Micro-steps from explicit batches (inputs non-NULL) or from the data source. */
static dt_status run_step(dt_ctx *ctx, dt_trainer *tr, const int32_t *inputs,
                          const int32_t *targets, dt_step_stats *out) {
    double t0 = dt_now(), trs = dt_trace_begin();
    dt_model *m = &tr->model;
    size_t bt = (size_t)m->B * m->T, bt_all = (size_t)m->B * tr->cfg.seq_len; /* held rows; whole sequences */
    /* Top-K after parallel.compression_warmup dense steps (step numbers are 1-based). */
    if (tr->cfg.parallel.compression == DT_COMPRESS_TOPK)
        dt_parallel_set_compression(tr->par, tr->step >= tr->cfg.parallel.topk_warmup);
    double loss_sum = 0.0, moe_sum[4] = {0}; /* ce, aux, z, dropped */
    /* the data-parallel ranks (the world without a process mesh): batches and their order */
    int W = dt_comm_size(tr->comm, tr->dp_group), R = dt_comm_rank(tr->comm, tr->dp_group);
    /* A loss mask (targets < 0 are not counted): the loss is the mean over the counted targets
     * of the global batch, so every counted token weighs 1 / counted whatever rank and
     * micro-step holds it (N ranks = 1 rank x N micro-steps). Explicit batches with masked
     * targets are counted here (one process only: the other ranks' count is unknown). */
    int masked = tr->next_batch && tr->step_targets && !inputs;
    uint64_t counted = masked ? tr->step_targets(tr->batch_ud) : 0;
    if (inputs) {
        for (int k = 0; k < tr->cfg.accum; k++)
            counted += (uint64_t)dt_count_targets(targets + k * bt_all, (int)bt_all);
        masked = counted != (uint64_t)tr->cfg.accum * bt_all;
        if (masked && W > 1)
            return dt_fail(ctx, DT_ERR_CONFIG, "masked targets in explicit batches need one process (world is %d)", W);
    }
    /* Phase times for the benchmark's breakdown: wall time minus the exposed communication
     * waits (dt_parallel_comm_time) that fell inside the phase. */
    double ex0, ex, tp = t0, td, tps0 = tr->tp.seconds, tpb0 = tr->tp.bytes, cps0 = tr->cp.seconds, cpb0 = tr->cp.bytes;
    const double eps0 = tr->ep.seconds, epb0 = tr->ep.bytes;
    const double pps0 = tr->pp.seconds, ppb0 = tr->pp.bytes, ppi0 = tr->pp.idle;
    ex0 = exposed_now(tr);
    ex = ex0;
    out->data_seconds = out->fwd_seconds = out->bwd_seconds = 0;
    dt_micro mi = {inputs, targets, masked, counted, W, R, W * tr->cp.n};
    const long ep_rows0 = m->ep_rows_sent;
    out->pp_span = 0;
    dt_moe_load_begin(tr);
    if (tr->pp.n > 1) { /* a pipeline stage: its schedule's passes over the micro-batches */
        const double ps0 = dt_now();
        DT_CHECK(dt_pp_micro_steps(ctx, tr, &mi, &loss_sum, moe_sum, out));
        if (m->cfg.n_experts) { /* the last stage's losses, every stage's dropped choices */
            DT_CHECK(dt_pp_share(ctx, tr, moe_sum, 3));
            DT_CHECK(dt_comm_allreduce(ctx, tr->comm, tr->pp.group, &moe_sum[3], 1, DT_F64, DT_SUM));
        }
        ex = exposed_now(tr);
        tp = dt_now();
        out->pp_span = tp - ps0;
    }
    if (m->tied_h) dt_fill(m->tied_h, 0, tr->pp.tied_n * sizeof(float)); /* pp_blocks: the step's head gradients */
    for (int k = 0; k < tr->cfg.accum && tr->pp.n <= 1; k++) {
        td = dt_trace_begin();
        int32_t *in, *tg;
        DT_CHECK(dt_trainer_micro_batch(ctx, tr, &mi, k, &in, &tg));
        dt_trace_end(td, "data", "data %d", k);
        add_phase(tr, &tp, &ex, &out->data_seconds);
        float loss;
        td = dt_trace_begin();
        if (tr->slow_rank >= 0 && tr->slow_rank == dt_comm_rank(tr->comm, DT_GROUP_WORLD))
            usleep((useconds_t)tr->slow_ms * 1000);
        const float bscale = dt_trainer_micro_scale(tr, &mi, k);
        /* The fused loss forms the head's gradients in the forward: the micro-step's gradient
         * buffer is set up first (DDP, ZeRO-1: nothing is in flight then). ZeRO-2/3 begin
         * after the forward, which overlaps the previous micro-step's reduce-scatters. */
        const int early = m->opts.fused_loss;
        if (early) dt_parallel_begin_micro(tr->par, k, k == tr->cfg.accum - 1);
        /* LoRA dropout's masks: keyed by the global index of each sequence (micro-batch
         * k W + r of the step in 1 rank's order, B sequences each), so N ranks draw what 1
         * rank accumulating N x does, and a resumed step what the uninterrupted one did. */
        dt_trainer_micro_drop(tr, &mi, k);
        DT_CHECK(dt_model_forward_train(ctx, m, in, tg, bscale, &loss));
        DT_CHECK(dt_trainer_tp_check(ctx, tr));
        dt_trace_end(td, "fwd", "forward %d", k);
        add_phase(tr, &tp, &ex, &out->fwd_seconds);
        td = dt_trace_begin();
        if (!early) dt_parallel_begin_micro(tr->par, k, k == tr->cfg.accum - 1);
        dt_ep_begin_micro(tr, k);
        m->tied_add = k == tr->cfg.accum - 1; /* pp_blocks: the head's gradients join the embedding's once */
        dt_model_backward(m, bscale);
        m->tied_add = 0;
        DT_CHECK(dt_trainer_tp_check(ctx, tr));
        if ((tr->poison_step == tr->step + 1 || tr->poison_step == 0) && k == 0 &&
            tr->poison_rank == dt_comm_rank(tr->comm, DT_GROUP_WORLD))
            loss = NAN; /* test aid: this rank's loss only; its gradients stay finite */
        if (tr->spike_step == tr->step + 1 && k == 0 && tr->spike_rank == dt_comm_rank(tr->comm, DT_GROUP_WORLD)) {
            loss *= 100.0f; /* test aid: a loss spike (the gradients are this batch's own) */
            tr->spike_step = -1; /* once: a rollback re-runs the step */
        }
        dt_parallel_end_micro(tr->par);
        dt_ep_end_micro(tr, k);
        dt_trace_end(td, "bwd", "backward %d", k);
        add_phase(tr, &tp, &ex, &out->bwd_seconds);
        loss_sum += masked ? (double)loss * dt_count_targets(tg, (int)bt) : (double)loss;
        moe_sum[0] += m->moe_ce, moe_sum[1] += m->moe_aux, moe_sum[2] += m->moe_z;
        moe_sum[3] += (double)m->moe_dropped;
    }
    out->opt_seconds = 0;
    /* masked: this rank's share of the global mean, so the mean over ranks is that mean */
    double mean_loss = masked ? (counted ? loss_sum * mi.G / (double)counted : 0.0) : loss_sum / tr->cfg.accum;
    DT_CHECK(finish_step(ctx, tr, &mean_loss, out));
    out->moe = m->cfg.n_experts > 0;
    if (out->moe) { /* the same collectives on every rank (one model everywhere) */
        for (int i = 0; i < 4; i++) {
            moe_sum[i] /= tr->cfg.accum;
            DT_CHECK(dt_parallel_mean(ctx, tr->par, &moe_sum[i]));
        }
        out->moe_ce = (float)moe_sum[0], out->moe_aux = (float)moe_sum[1], out->moe_z = (float)moe_sum[2];
        out->moe_dropped = moe_sum[3] * tr->cfg.accum * W;
    }
    DT_CHECK(dt_moe_load_finish(ctx, tr, out)); /* every rank alike */
    add_phase(tr, &tp, &ex, &out->opt_seconds);
    out->comm_seconds = ex - ex0;
    out->pp_seconds = tr->pp.seconds - pps0;
    out->pp_bytes = tr->pp.bytes - ppb0;
    out->pp_idle = tr->pp.idle - ppi0;
    out->tp_seconds = tr->tp.seconds - tps0;
    out->tp_bytes = tr->tp.bytes - tpb0;
    out->cp_seconds = tr->cp.seconds - cps0;
    out->cp_bytes = tr->cp.bytes - cpb0;
    out->ep_rows = tr->ep.n > 1 ? (double)(m->ep_rows_sent - ep_rows0) : -1.0;
    out->ep_seconds = tr->ep.seconds - eps0;
    out->ep_bytes = tr->ep.bytes - epb0;
    out->loss = (float)mean_loss;
    out->seconds = dt_now() - t0;
    dt_trace_end(trs, "step", "step %ld", tr->step);
    return DT_OK;
}

dt_status dt_trainer_step_on(dt_ctx *ctx, dt_trainer *tr, const int32_t *inputs,
                             const int32_t *targets, dt_step_stats *out) {
    return run_step(ctx, tr, inputs, targets, out);
}

dt_status dt_trainer_step(dt_ctx *ctx, dt_trainer *tr, dt_step_stats *out) {
    return run_step(ctx, tr, NULL, NULL, out);
}
