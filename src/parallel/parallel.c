/* Data parallelism: shard geometry, the optimizer step on this rank's shard, and the
 * per-step protocol shared by every strategy. Gradient buckets (DDP, ZeRO-1) are in
 * buckets.c, the ZeRO-2/3 windows and hooks in zero.c, the communication thread and its task
 * queue in tasks.c; parallel_impl.h explains sharding. */
#include "parallel/parallel.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "comm/comm_fit.h"
#include "core/log.h"
#include "core/timer.h"
#include "ops/ops.h"
#include "parallel/parallel_impl.h"
#include "parallel/topk.h"

dt_status dt_strategy_parse(dt_ctx *ctx, const char *s, dt_strategy *out, int *hybrid) {
    *hybrid = 0;
    if (!strcasecmp(s, "ddp") || !strcasecmp(s, "no_shard")) *out = DT_STRAT_DDP;
    else if (!strcasecmp(s, "zero1")) *out = DT_STRAT_ZERO1;
    else if (!strcasecmp(s, "zero2") || !strcasecmp(s, "shard_grad_op")) *out = DT_STRAT_ZERO2;
    else if (!strcasecmp(s, "zero3") || !strcasecmp(s, "full_shard")) *out = DT_STRAT_ZERO3;
    else if (!strcasecmp(s, "hybrid_shard")) {
        *out = DT_STRAT_ZERO3;
        *hybrid = 1;
    } else
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "parallel.strategy: unknown strategy '%s' (ddp, zero1, zero2, zero3 or the FSDP "
                       "names no_shard, shard_grad_op, full_shard, hybrid_shard)", s);
    return DT_OK;
}

const char *dt_strategy_name(dt_strategy s) {
    static const char *const names[] = {"ddp", "zero1", "zero2", "zero3"};
    return names[s];
}

/* Exchanges one integer pair per rank: out[2r], out[2r+1] = rank r's (a, b). */
static dt_status exchange_pairs(dt_ctx *ctx, dt_parallel *p, int64_t a, int64_t b, int64_t *out) {
    memset(out, 0, 2 * (size_t)p->world * sizeof *out);
    out[2 * p->rank] = a;
    out[2 * p->rank + 1] = b;
    return dt_comm_allreduce(ctx, p->comm, p->g_dp, out, 2 * (size_t)p->world, DT_I64, DT_SUM);
}

int dt_par_is_expert(const dt_params *ps, const dt_parallel_cfg *cfg, int u) {
    if (!cfg->skip_len || ps->unit_lo[u] < ps->layers_offset || u >= DT_UNIT_POST0(ps)) return 0;
    const size_t r = (ps->unit_lo[u] - ps->layers_offset) % ps->layer_floats;
    return r >= cfg->skip_off && r < cfg->skip_off + cfg->skip_len;
}

/* Expert parallelism's units and their group (decision 88): ZeRO shards a local expert's unit
 * over the EDP group, the ranks holding the same experts; DDP holds it whole. */
static dt_status plan_experts(dt_ctx *ctx, dt_parallel *p) {
    p->uexp = calloc((size_t)p->U, 1);
    if (!p->uexp) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    p->Ge = 1, p->je = 0, p->g_edp = p->g_shard;
    if (!p->cfg.skip_len) return DT_OK;
    if (p->cfg.hybrid)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.hybrid: hybrid sharding is not built with expert parallelism");
    for (int u = 0; u < p->U; u++) p->uexp[u] = (unsigned char)dt_par_is_expert(&p->m->ps, &p->cfg, u);
    if (p->cfg.strategy != DT_STRAT_DDP && p->cfg.skip_ranks > 1) {
        p->Ge = p->cfg.skip_ranks, p->je = p->cfg.skip_rank, p->g_edp = p->cfg.skip_group;
        DT_ASSERT(p->Ge <= p->G && dt_comm_size(p->comm, p->g_edp) == p->Ge && dt_comm_rank(p->comm, p->g_edp) == p->je);
    }
    return DT_OK;
}

static dt_status plan_shards(dt_ctx *ctx, dt_parallel *p) {
    dt_model *m = p->m;
    int W = p->world;
    p->U = m->ps.n_units;
    if (p->cfg.strategy == DT_STRAT_DDP) { /* one shard: everything, on every rank */
        p->G = 1;
        p->j = 0;
        p->n_rep = 1;
        p->k = 0;
    } else if (p->cfg.hybrid) {
        /* under a process mesh the trainer's groups of the data-parallel ranks (mesh.h) */
        p->g_shard = p->cfg.node_group ? p->cfg.node_group : DT_GROUP_NODE;
        p->g_cross = p->cfg.cross_group ? p->cfg.cross_group : DT_GROUP_CROSS;
        p->G = dt_comm_size(p->comm, p->g_shard);
        p->j = dt_comm_rank(p->comm, p->g_shard);
        p->n_rep = dt_comm_size(p->comm, p->g_cross);
        p->k = dt_comm_rank(p->comm, p->g_cross);
        if ((long)p->G * p->n_rep != W)
            return dt_fail(ctx, DT_ERR_CONFIG,
                           "parallel.hybrid: nodes must have equal rank counts (%d ranks, %d on this node, %d nodes)",
                           W, p->G, p->n_rep);
    } else {
        p->g_shard = p->g_dp;
        p->G = W;
        p->j = p->rank;
        p->n_rep = 1;
        p->k = 0;
    }
    DT_CHECK(plan_experts(ctx, p));
    size_t U = (size_t)p->U, G = (size_t)p->G;
    p->split_cnt = calloc(U * G * 2, sizeof(size_t));
    p->sb = calloc(U, sizeof(size_t));
    p->rs_cnt = calloc(U * (size_t)W * 2, sizeof(size_t));
    p->sub_cnt = calloc(U * (size_t)p->n_rep * 2, sizeof(size_t));
    int64_t *jk = calloc(2 * (size_t)W, sizeof *jk);
    if (!p->split_cnt || !p->sb || !p->rs_cnt || !p->sub_cnt || !jk) {
        free(jk);
        return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    }
    p->split_off = p->split_cnt + U * G;
    p->rs_dis = p->rs_cnt + U * (size_t)W;
    p->sub_off = p->sub_cnt + U * (size_t)p->n_rep;
    dt_status st = exchange_pairs(ctx, p, p->j, p->k, jk);
    p->S = 0;
    for (size_t u = 0; u < U && st == DT_OK; u++) {
        size_t *cnt = p->split_cnt + u * G, *off = p->split_off + u * G;
        const int Gu = dt_par_G(p, (int)u), ju = dt_par_j(p, (int)u);
        dt_comm_split(m->ps.unit_len[u], Gu, cnt, off);
        p->sb[u] = p->S;
        p->S += cnt[ju];
        if (m->ps.unit_len[u] < (size_t)Gu)
            st = dt_fail(ctx, DT_ERR_CONFIG, "parallel: %d shards exceed the %zu parameters of unit %zu",
                         Gu, m->ps.unit_len[u], u);
        dt_comm_split(cnt[ju], p->n_rep, p->sub_cnt + u * (size_t)p->n_rep, p->sub_off + u * (size_t)p->n_rep);
        if (p->uexp[u]) continue; /* reduced by the trainer (train/ep.c): no owner map */
        if (p->n_rep > 4096) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "parallel: more than 4096 replicas");
            break;
        }
        /* World rank w owns sub-chunk k_w of node-shard j_w. */
        size_t sc[4096], so[4096];
        for (int w = 0; w < W; w++) {
            int jw = (int)jk[2 * w], kw = (int)jk[2 * w + 1];
            dt_comm_split(cnt[jw], p->n_rep, sc, so);
            p->rs_cnt[u * (size_t)W + (size_t)w] = sc[kw];
            p->rs_dis[u * (size_t)W + (size_t)w] = off[jw] + so[kw];
        }
    }
    dt_par_sizes_of(&m->ps, &p->cfg, W, p->G, p->j, p->n_rep, &p->z);
    DT_ASSERT(st != DT_OK || p->z.S == p->S);
    free(jk);
    return st;
}

/* Part i of n split into `parts` near-equal parts (dt_comm_split: the first ones larger). */
static size_t split_part(size_t n, int parts, int i) {
    return n / (size_t)parts + ((size_t)i < n % (size_t)parts);
}

void dt_par_sizes_of(const dt_params *ps, const dt_parallel_cfg *cfg, int world, int G, int j, int n_rep,
                     dt_par_sizes *z) {
    memset(z, 0, sizeof *z);
    /* expert parallelism: a local expert's unit over its EDP group (plan_experts) */
    const int Ge = cfg->strategy != DT_STRAT_DDP && cfg->skip_ranks > 1 ? cfg->skip_ranks : 1;
    const int je = Ge > 1 ? cfg->skip_rank : 0;
    for (int u = 0; u < ps->n_units; u++) {
        const int ex = dt_par_is_expert(ps, cfg, u);
        size_t len = ps->unit_len[u], mine = ex ? split_part(len, Ge, je) : split_part(len, G, j);
        size_t sub = split_part(split_part(len, G, 0), n_rep, 0); /* node-shard 0's sub-chunk 0 */
        z->S += mine;
        if (len > z->max_unit) z->max_unit = len;
        if (mine > z->max_ns) z->max_ns = mine;
        if (sub > z->max_sub) z->max_sub = sub;
    }
    /* ZeRO-3 under mixed precision: 16-bit windows replace the model's (dt_model_lowp_plan) */
    if (cfg->strategy == DT_STRAT_ZERO3 && cfg->compute != DT_F32) z->lpwin = z->max_unit;
    dt_par_lookup_sizes(ps, cfg, G, z);
    size_t W = (size_t)world, per = cfg->bucket_bytes / sizeof(float);
    z->bucket = per < 1024 ? 1024 : per;
    if (z->bucket > ps->n_params) z->bucket = ps->n_params;
    /* A ZeRO-1 bucket lies inside one unit: my part of it is at most max_sub. DDP's part is
     * the first (largest) of an even split of a bucket. */
    z->bk = z->bucket < z->max_sub ? z->bucket : z->max_sub;
    size_t red = cfg->strategy == DT_STRAT_DDP ? W * ((z->bucket + W - 1) / W) : W * z->bk;
    /* ZeRO-2/3 reduce-scatter rounds: one bucket over all ranks, never more than a part. */
    z->rs_round = per / W < 1024 ? 1024 : per / W;
    if (z->rs_round > z->max_sub) z->rs_round = z->max_sub;
    if (cfg->compression == DT_COMPRESS_TOPK && cfg->strategy <= DT_STRAT_ZERO1) {
        /* Top-K (topk.h) replaces the ordered reductions of DDP/ZeRO-1: a residual over the
         * slab and room for every rank's message of the largest bucket (the message grows
         * with the bucket); without dense warm-up steps nothing else. */
        if (world > 1) {
            z->res = ps->n_params;
            z->msg = W * dt_topk_words(z->bucket, cfg->topk_ratio, cfg->grad_dtype);
            if (cfg->topk_age && cfg->topk_ratio < 1) z->age = z->S; /* ratio 1 sends all: no ages */
        }
        if (cfg->topk_warmup == 0) {
            z->esize = sizeof(float);
            z->bk = 0;
            return;
        }
        /* the dense warm-up steps: the buffers of the ordered reductions too */
    }
    if (cfg->grad_dtype == DT_F32) {
        z->red = red;
        z->rs_scr = W * z->rs_round;
        z->esize = sizeof(float);
        return;
    }
    /* bf16 (comm.h): the staging holds what is sent (a bucket, a round over all ranks) and
     * then every rank's copy of my part. A ZeRO-1 bucket lies inside one unit; hybrid ZeRO-1
     * also gathers my node-shard across nodes in it (ZeRO-2/3 do that in ns16). */
    z->esize = sizeof(uint16_t);
    if (cfg->strategy == DT_STRAT_DDP) z->lp = z->bucket + red;
    else if (cfg->strategy == DT_STRAT_ZERO1) {
        z->lp = (z->bucket < z->max_unit ? z->bucket : z->max_unit) + red;
        if (n_rep > 1 && z->max_ns > z->lp) z->lp = z->max_ns;
    } else
        z->lp = 2 * W * z->rs_round;
}

void dt_parallel_plan(const dt_params *ps, const dt_parallel_cfg *cfg, int world, int node_ranks, int rank,
                      size_t bytes[DT_MEM_NKINDS]) {
    int G = world, j = rank, n_rep = 1; /* as plan_shards, with nodes of consecutive ranks */
    if (cfg->strategy == DT_STRAT_DDP) G = 1, j = 0;
    else if (cfg->hybrid) G = node_ranks, j = rank % node_ranks, n_rep = world / node_ranks;
    dt_par_sizes z;
    dt_par_sizes_of(ps, cfg, world, G, j, n_rep, &z);
    const size_t F = sizeof(float), H = sizeof(uint16_t);
    bytes[DT_MEM_OPTIM] += (2 * z.S + z.age) * F;
    if (cfg->strategy >= DT_STRAT_ZERO2) { /* as dt_par_zero_init, dt_par_params_init, dt_par_step_init */
        bytes[DT_MEM_GRADS] += (z.S + 2 * z.max_unit) * F;
        if (cfg->zero_reduce == DT_ZR_STEP) bytes[DT_MEM_GRADS] += ps->n_params * F; /* the step's gradient */
        if (cfg->strategy == DT_STRAT_ZERO3 && cfg->zero3_gather == DT_ZG_STEP) /* resident, no windows */
            bytes[DT_MEM_PARAMS] += (z.S + ps->n_params) * F + (z.lpwin ? ps->n_params : 0) * H;
        else if (cfg->strategy == DT_STRAT_ZERO3)
            bytes[DT_MEM_PARAMS] += (z.S + 2 * z.max_unit) * F + 2 * z.lpwin * H;
        if (world > 1)
            bytes[DT_MEM_COMM] += z.rs_scr * F + (z.rs_round + (n_rep > 1 ? z.max_ns : 0)) * z.esize + z.lp * H;
        bytes[DT_MEM_COMM] += z.lk_bytes; /* ZeRO-3's vocabulary row lookup */
        return;
    }
    if (cfg->accum > 1) bytes[DT_MEM_GRADS] += ps->n_params * F; /* as dt_par_buckets_init */
    if (world > 1)
        bytes[DT_MEM_COMM] += z.red * F + (cfg->strategy == DT_STRAT_ZERO1 ? z.bk : 0) * z.esize + z.lp * H + z.msg * H;
    bytes[DT_MEM_GRADS] += z.res * F; /* Top-K's residual */
}

static dt_status plan_segments(dt_ctx *ctx, dt_parallel *p) {
    dt_param_segment *all;
    int nall;
    DT_CHECK(dt_params_segments(ctx, &p->m->ps, &all, &nall));
    int cap = nall + 2 * p->U;
    p->segs = calloc((size_t)cap, sizeof *p->segs);
    p->seg_unit = calloc((size_t)cap, sizeof *p->seg_unit);
    if (!p->segs || !p->seg_unit) {
        free(all);
        return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    }
    for (int u = 0; u < p->U; u++) {
        size_t lo = p->m->ps.unit_lo[u] + p->split_off[dt_par_ix(p, u)];
        size_t hi = lo + p->split_cnt[dt_par_ix(p, u)];
        for (int i = 0; i < nall; i++) {
            size_t a = all[i].offset > lo ? all[i].offset : lo;
            size_t z = all[i].offset + all[i].len < hi ? all[i].offset + all[i].len : hi;
            if (a < z && p->nsegs < cap) {
                p->segs[p->nsegs] = (dt_param_segment){a - lo, z - a, all[i].decay};
                p->seg_unit[p->nsegs++] = u;
            }
        }
    }
    free(all);
    return DT_OK;
}

dt_status dt_parallel_init(dt_ctx *ctx, dt_parallel **out, dt_comm *comm, dt_model *m,
                           dt_alloc *alloc, const dt_parallel_cfg *cfg, uint64_t seed) {
    /* How the communicator moves data: node-local shared memory, the hierarchical all-reduce
     * across nodes (the same bits either way: comm.h). */
    dt_comm_set_shm(comm, cfg->shm);
    int hier = dt_comm_set_hierarchical(comm, cfg->allreduce != DT_AR_FLAT);
    if (cfg->allreduce == DT_AR_HIER && !hier && dt_comm_size(comm, DT_GROUP_WORLD) > 1)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "parallel.allreduce=hierarchical needs several nodes with the same number (> 1) of consecutive "
                       "ranks each and parallel.shared_memory on (here: %d ranks on %d node(s), %d on this one)",
                       dt_comm_size(comm, DT_GROUP_WORLD), dt_comm_num_nodes(comm), dt_comm_size(comm, DT_GROUP_NODE));
    if (cfg->compression == DT_COMPRESS_TOPK && cfg->strategy >= DT_STRAT_ZERO2)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "parallel.compression=topk works with parallel.strategy ddp or zero1 only (%s reduce-scatters "
                       "each layer's gradient as it is formed and keeps no full gradient to carry a residual for)",
                       dt_strategy_name(cfg->strategy));
    if (cfg->compression == DT_COMPRESS_TOPK && !(cfg->topk_ratio > 0 && cfg->topk_ratio <= 1))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.compression_ratio must be in (0, 1] (got %g)", cfg->topk_ratio);
    if (cfg->comm_model[0]) {
        dt_comm_fit fit;
        DT_CHECK(dt_comm_fit_load(ctx, cfg->comm_model, &fit));
        dt_comm_set_model(comm, &fit);
        /* auto + a cost model fitted on this layout: the algorithm predicted faster for a bucket */
        double h_us = 0, f_us = 0;
        int pref = hier && cfg->allreduce == DT_AR_AUTO
                       ? dt_comm_fit_prefers_hier(&fit, dt_comm_size(comm, DT_GROUP_WORLD), dt_comm_num_nodes(comm),
                                                  (double)cfg->bucket_bytes, &h_us, &f_us)
                       : -2;
        if (pref == 0) hier = dt_comm_set_hierarchical(comm, 0);
        if (pref >= 0)
            dt_log_info(ctx, "parallel.allreduce=auto: %s (%s predicts %.0f us hierarchical vs %.0f us flat per %.2f MiB bucket)",
                        pref ? "hierarchical" : "flat", cfg->comm_model, h_us, f_us, (double)cfg->bucket_bytes / 1048576.0);
        else if (pref == -1)
            dt_log_info(ctx, "parallel.allreduce=auto: hierarchical (%s was fitted on %d ranks x %d nodes, or without "
                             "allreduce_ordered_flat: no prediction for this layout)",
                        cfg->comm_model, fit.ranks, fit.nodes);
    }
    dt_parallel *p = calloc(1, sizeof *p);
    if (!p) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    p->cfg = *cfg;
    p->cfg.compute = m->opts.compute; /* the model's precision decides (the plan is told it) */
    p->cfg.tokens = m->B * m->T;     /* the lookup's capacity, likewise */
    p->comm = comm;
    p->m = m;
    p->alloc = alloc;
    p->g_dp = cfg->dp_group;
    p->world = dt_comm_size(comm, p->g_dp);
    p->rank = dt_comm_rank(comm, p->g_dp);
    p->sharded_grads = cfg->strategy >= DT_STRAT_ZERO2;
    p->sharded_params = cfg->strategy == DT_STRAT_ZERO3;
    p->zr_step = p->sharded_grads && cfg->zero_reduce == DT_ZR_STEP; /* the once-per-step modes (zero_step.c) */
    p->zg_step = p->sharded_params && cfg->zero3_gather == DT_ZG_STEP;
    p->last_micro = 1;
    p->err_ctx = *ctx;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->gwin_task[0] = p->gwin_task[1] = p->pwin_task[0] = p->pwin_task[1] = -1;
    dt_status st = plan_shards(ctx, p);
    if (st == DT_OK) st = plan_segments(ctx, p);
    if (st == DT_OK) {
        /* Per step at most every bucket plus a gather and a reduction per unit and pass. */
        size_t per = cfg->bucket_bytes / sizeof(float);
        p->cap = (int)(m->ps.n_params / (per < 1024 ? 1024 : per)) + 6 * p->U + 16;
        p->tasks = calloc((size_t)p->cap, sizeof *p->tasks);
        p->part_cnt = calloc(2 * (size_t)p->world, sizeof *p->part_cnt);
        if (!p->tasks || !p->part_cnt) st = dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    }
    if (st == DT_OK && p->world > 1 && cfg->overlap) {
        st = dt_par_thread_start(ctx, p);
    }
    if (st == DT_OK) st = dt_alloc_get(ctx, alloc, DT_MEM_OPTIM, p->S * sizeof(float), (void **)&p->mom);
    if (st == DT_OK) st = dt_alloc_get(ctx, alloc, DT_MEM_OPTIM, p->S * sizeof(float), (void **)&p->var);
    if (st == DT_OK && p->z.age) {
        st = dt_alloc_get(ctx, alloc, DT_MEM_OPTIM, p->z.age * sizeof(float), (void **)&p->age);
        if (st == DT_OK) dt_parallel_ages_reset(p);
    }
    if (st == DT_OK) {
        if (p->sharded_grads) {
            st = dt_par_zero_init(ctx, p, seed);
            if (st == DT_OK && !p->sharded_params) dt_model_init_weights(m, seed);
            else if (st == DT_OK) dt_model_init_base(m, seed); /* LoRA: the frozen base is whole */
        } else {
            st = dt_par_buckets_init(ctx, p);
            if (st == DT_OK) dt_model_init_weights(m, seed);
        }
    }
    if (st != DT_OK) {
        dt_parallel_free(p);
        return st;
    }
    *out = p;
    return DT_OK;
}

void dt_parallel_free(dt_parallel *p) {
    if (!p) return;
    dt_par_thread_stop(p);
    if (p->sharded_grads) dt_par_zero_free(p);
    else dt_par_buckets_free(p);
    if (p->m->hooks.ud == p) memset(&p->m->hooks, 0, sizeof p->m->hooks);
    dt_alloc_put(p->alloc, DT_MEM_OPTIM, p->mom, p->S * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_OPTIM, p->var, p->S * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_OPTIM, p->age, p->z.age * sizeof(float));
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->split_cnt);
    free(p->uexp);
    free(p->sb);
    free(p->rs_cnt);
    free(p->sub_cnt);
    free(p->segs);
    free(p->seg_unit);
    free(p->tasks);
    free(p->part_cnt);
    free(p);
}

void dt_parallel_begin_micro(dt_parallel *p, int k, int last) {
    dt_par_wait(p, p->queued - 1); /* the previous micro-step's reductions read its buffers */
    p->micro = k;
    p->last_micro = last;
    if (p->sharded_grads) {
        dt_par_zero_begin_micro(p);
        return;
    }
    /* Micro-step 0 writes the step's gradient directly; later ones a fresh buffer that is
     * added afterwards, so every micro-step's gradient is computed the same way whatever
     * the accumulation count (a kernel's `+=` into a non-zero buffer would round differently). */
    float *g = k == 0 ? p->acc : p->extra;
    DT_ASSERT(g != NULL);
    dt_fill(g, 0, p->m->ps.n_params * sizeof(float));
    p->m->ps.grads = g;
    dt_params_point_units(&p->m->ps);
}

void dt_parallel_end_micro(dt_parallel *p) {
    if (p->sharded_grads || p->last_micro) return;
    if (p->micro > 0) {
        dt_add_f32(p->acc, p->extra, p->m->ps.n_params);
    }
    p->m->ps.grads = p->acc;
    dt_params_point_units(&p->m->ps);
}

dt_status dt_parallel_finish_grads(dt_ctx *ctx, dt_parallel *p) {
    if (p->sharded_grads) return dt_par_zero_finish(ctx, p);
    return dt_par_buckets_finish(ctx, p);
}

static float *grad_piece(dt_parallel *p, int u);

dt_group dt_parallel_dp_group(const dt_parallel *p) { return p->g_dp; }

/* Where expert unit u starts in the experts' layer-by-layer gradient (train/ep.c's layout). */
static size_t expert_at(const dt_parallel *p, int u) {
    const dt_params *ps = &p->m->ps;
    const size_t x = ps->unit_lo[u] - ps->layers_offset;
    return x / ps->layer_floats * p->cfg.skip_len + x % ps->layer_floats - p->cfg.skip_off;
}

void dt_parallel_expert_grads(dt_parallel *p, const float *acc) {
    for (int u = 0; u < p->U; u++) {
        if (!p->uexp[u]) continue;
        const size_t i = dt_par_ix(p, u);
        dt_copy(grad_piece(p, u), acc + expert_at(p, u) + p->split_off[i], p->split_cnt[i] * sizeof(float));
    }
}

size_t dt_parallel_expert_pack(const dt_parallel *p, int q, const float *acc, float *out) {
    size_t k = 0;
    for (int u = 0; u < p->U; u++) {
        if (!p->uexp[u]) continue;
        const size_t i = (size_t)u * (size_t)p->G + (size_t)q;
        if (out) dt_copy(out + k, acc + expert_at(p, u) + p->split_off[i], p->split_cnt[i] * sizeof(float));
        k += p->split_cnt[i];
    }
    return k;
}

void dt_parallel_expert_unpack(dt_parallel *p, const float *packed) {
    size_t k = 0;
    for (int u = 0; u < p->U; u++) {
        if (!p->uexp[u]) continue;
        const size_t n = p->split_cnt[dt_par_ix(p, u)];
        dt_copy(grad_piece(p, u), packed + k, n * sizeof(float));
        k += n;
    }
}

/* Tensor parallelism (model.h dt_model_opts.tp): each shard's part of the norm, tensor by
 * tensor in store order, a replicated tensor counted once (in shard 0's part); the parts are
 * added in shard order, over the shards held and then over the TP group (rank order: each
 * rank's part travels alone in its slot, exactly). So a TP group and the blocks test mode
 * add the same numbers in the same order. */
static dt_status tp_sumsq_zero(dt_ctx *ctx, dt_parallel *p, double *out);

static dt_status tp_sumsq(dt_ctx *ctx, dt_parallel *p, double *out) {
    if (p->cfg.strategy != DT_STRAT_DDP) return tp_sumsq_zero(ctx, p, out);
    const dt_params *ps = &p->m->ps;
    const int k = dt_tp_size(&p->m->opts), nb = dt_tp_local(&p->m->opts), first = dt_tp_first(&p->m->opts);
    double part[64] = {0};
    if (k > 64) return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp: more than 64 shards");
    for (int j = 0; j < nb; j++)
        for (int id = 0; id < ps->n_tensors; id++) {
            const dt_tensor_info *t = &ps->tensors[id];
            if (!t->split && first + j != 0) continue;
            size_t len = t->split ? dt_tensor_shard_len(t) : t->rows * t->cols;
            for (int l = 0; l < dt_params_copies(ps, id); l++)
                part[first + j] += dt_sumsq(dt_params_tensor(ps, ps->grads, id, l) + (t->split ? (size_t)j * len : 0), len);
        }
    if (nb < k) DT_CHECK(dt_comm_allreduce(ctx, p->comm, p->cfg.tp_group, part, (size_t)k, DT_F64, DT_SUM));
    double s = 0;
    for (int r = 0; r < k; r++) s += part[r];
    *out = s;
    return DT_OK;
}

/* ZeRO under tensor parallelism: my data-parallel shard's pieces, tensor by tensor, each split
 * tensor's elements in the part of the TP shard they belong to, a replicated tensor's in shard
 * 0's; a slot per (TP shard, data-parallel rank), exchanged exactly over both groups and added
 * in order. The pieces follow ZeRO's cut of each unit, which differs between the blocks test
 * mode (one unit holds every shard) and TP ranks: the norms agree to rounding there, not
 * bitwise (docs/ARCHITECTURE.md decision 62). */
static dt_status tp_sumsq_zero(dt_ctx *ctx, dt_parallel *p, double *out) {
    const dt_params *ps = &p->m->ps;
    const int k = dt_tp_size(&p->m->opts), first = dt_tp_first(&p->m->opts), G = p->G;
    if ((long)k * G > 4096) return dt_fail(ctx, DT_ERR_CONFIG, "parallel: more than 4096 tensor x data shards");
    double *part = calloc((size_t)k * G, sizeof *part);
    if (!part) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    for (int u = 0; u < p->U; u++) {
        size_t lo = ps->unit_lo[u] + p->split_off[(size_t)u * G + p->j], n = p->split_cnt[(size_t)u * G + p->j];
        const float *g = grad_piece(p, u);
        for (int id = 0; id < ps->n_tensors; id++) {
            const dt_tensor_info *t = &ps->tensors[id];
            size_t len = t->rows * t->cols, sl = t->split ? dt_tensor_shard_len(t) : len;
            for (int l = 0; l < dt_params_copies(ps, id); l++) {
                size_t base = dt_params_flat(ps, id, l);
                for (size_t s0 = base; s0 < base + len; s0 += sl) { /* each stored shard block */
                    int j = t->split ? (int)((s0 - base) / sl) : 0;
                    if (!t->split && first != 0) continue; /* replicated: counted by TP rank 0 */
                    size_t a = s0 > lo ? s0 : lo, z = s0 + sl < lo + n ? s0 + sl : lo + n;
                    if (a < z) part[(size_t)(first + j) * G + p->j] += dt_sumsq(g + (a - lo), z - a);
                }
            }
        }
    }
    dt_status st = DT_OK;
    if (G > 1) st = dt_comm_allreduce(ctx, p->comm, p->g_shard, part, (size_t)k * G, DT_F64, DT_SUM);
    if (st == DT_OK && dt_tp_local(&p->m->opts) < k)
        st = dt_comm_allreduce(ctx, p->comm, p->cfg.tp_group, part, (size_t)k * G, DT_F64, DT_SUM);
    double s = 0;
    for (size_t i = 0; i < (size_t)k * G; i++) s += part[i];
    free(part);
    *out = s;
    return st;
}

dt_status dt_parallel_grad_sumsq(dt_ctx *ctx, dt_parallel *p, double *out) {
    if (dt_tp_size(&p->m->opts) > 1) return tp_sumsq(ctx, p, out);
    if (p->cfg.strategy == DT_STRAT_DDP) {
        /* Every rank holds the same full averaged gradient: no communication. */
        *out = dt_sumsq(p->m->ps.grads, p->m->ps.n_params);
        return DT_OK;
    }
    /* ZeRO: only my shard is reduced. Partial sums per unit piece, exchanged exactly (one
     * non-zero per slot) and added in rank order. */
    double part[1024] = {0};
    if (p->G > 1024) return dt_fail(ctx, DT_ERR_CONFIG, "parallel: more than 1024 shards");
    /* (expert parallelism: my pieces of my experts' units too, each counted by one rank) */
    for (int u = 0; u < p->U; u++) part[p->j] += dt_sumsq(grad_piece(p, u), p->split_cnt[dt_par_ix(p, u)]);
    if (p->G > 1) DT_CHECK(dt_comm_allreduce(ctx, p->comm, p->g_shard, part, (size_t)p->G, DT_F64, DT_SUM));
    double s = 0;
    for (int r = 0; r < p->G; r++) s += part[r];
    *out = s;
    return DT_OK;
}

/* Where unit u's piece of my shard lives: parameters and gradients. */
static float *param_piece(dt_parallel *p, int u) {
    if (p->sharded_params) return p->pshard + p->sb[u];
    return p->m->ps.params + p->m->ps.unit_lo[u] + p->split_off[dt_par_ix(p, u)];
}
static float *grad_piece(dt_parallel *p, int u) {
    if (p->sharded_grads) return p->gshard + p->sb[u];
    return p->m->ps.grads + p->m->ps.unit_lo[u] + p->split_off[dt_par_ix(p, u)];
}

dt_status dt_parallel_update(dt_ctx *ctx, dt_parallel *p, const dt_adamw *opt, float lr, long t,
                             float clip_coef) {
    for (int u = 0, s = 0; u < p->U; u++) {
        float *g = grad_piece(p, u);
        int s0 = s;
        while (s < p->nsegs && p->seg_unit[s] == u) s++;
        if (p->age && p->topk_on) /* Top-K's sparse, delayed sums: AdamW by age (optim.h) */
            dt_adamw_update_aged(opt, param_piece(p, u), g, p->mom + p->sb[u], p->var + p->sb[u], p->age + p->sb[u],
                                 p->segs + s0, s - s0, lr, t, clip_coef);
        else
            dt_adamw_update(opt, param_piece(p, u), g, p->mom + p->sb[u], p->var + p->sb[u], p->segs + s0,
                            s - s0, lr, t, clip_coef);
    }
    if (p->age && !p->topk_on) dt_parallel_ages_reset(p); /* a dense step reaches every element */
    if (p->sharded_params) {
        dt_par_params_stale(p); /* units are gathered when next used */
        return DT_OK;
    }
    if (p->G == 1) return DT_OK; /* one shard holder (world 1, or hybrid with one rank per node) */
    double t0 = dt_now();
    for (int u = 0; u < p->U; u++)
        if (dt_par_G(p, u) > 1) /* (an expert's unit over its EDP group) */
            DT_CHECK(dt_comm_allgatherv(ctx, p->comm, dt_par_group(p, u), p->m->ps.params + p->m->ps.unit_lo[u],
                                        p->split_cnt + (size_t)u * p->G, p->split_off + (size_t)u * p->G));
    double dt = dt_now() - t0;
    p->t_exposed += dt;
    p->t_total += dt;
    return DT_OK;
}


dt_status dt_parallel_mean(dt_ctx *ctx, dt_parallel *p, double *x) {
    if (p->world == 1) return DT_OK;
    DT_CHECK(dt_comm_allreduce(ctx, p->comm, p->g_dp, x, 1, DT_F64, DT_SUM));
    *x /= p->world;
    return DT_OK;
}

dt_status dt_parallel_full_params(dt_ctx *ctx, dt_parallel *p, float **out) {
    if (!p->sharded_params) {
        *out = p->m->ps.params;
        return DT_OK;
    }
    float *full = calloc(p->m->ps.n_params, sizeof(float));
    if (!full) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory gathering the model");
    for (int u = 0; u < p->U; u++) {
        dt_status st = dt_par_gather_unit(ctx, p, u, full + p->m->ps.unit_lo[u]);
        if (st != DT_OK) {
            free(full);
            return st;
        }
    }
    *out = full;
    return DT_OK;
}

void dt_parallel_release_full_params(dt_parallel *p, float *full) {
    if (full != p->m->ps.params) free(full);
}

void dt_parallel_shard(const dt_parallel *p, size_t *count) { *count = p->S; }

float *dt_parallel_unit_grad(dt_parallel *p, int u, size_t *n) {
    *n = p->split_cnt[dt_par_ix(p, u)];
    return grad_piece(p, u);
}

int dt_parallel_pieces(const dt_parallel *p, dt_shard_piece *out) {
    for (int u = 0; u < p->U; u++) {
        size_t i = dt_par_ix(p, u);
        out[u] = (dt_shard_piece){p->m->ps.unit_lo[u] + p->split_off[i], p->sb[u], p->split_cnt[i]};
    }
    return p->U;
}

void dt_parallel_moments(dt_parallel *p, float **mom, float **var) {
    *mom = p->mom;
    *var = p->var;
}

int dt_parallel_save_pieces(const dt_parallel *p, dt_shard_piece *out) {
    int R = p->cfg.strategy == DT_STRAT_DDP ? p->world : p->n_rep;
    int idx = p->cfg.strategy == DT_STRAT_DDP ? p->rank : p->k;
    int n = 0;
    const int R0 = R, idx0 = idx;
    for (int u = 0; u < p->U; u++) {
        size_t i = dt_par_ix(p, u), cnt[1], off[1];
        R = R0, idx = idx0;
        /* DDP: an expert's unit is held by its EDP group alike (expert parallelism); ZeRO shards
         * it over that group, each piece held once */
        if (p->uexp[u] && p->cfg.strategy == DT_STRAT_DDP) R = p->cfg.skip_ranks, idx = p->cfg.skip_rank;
        size_t *c = R <= 1 ? cnt : malloc((size_t)R * 2 * sizeof(size_t));
        if (!c) return -1;
        size_t *o = R <= 1 ? off : c + R;
        dt_comm_split(p->split_cnt[i], R > 1 ? R : 1, c, o);
        int me = R > 1 ? idx : 0;
        if (c[me] > 0)
            out[n++] = (dt_shard_piece){p->m->ps.unit_lo[u] + p->split_off[i] + o[me], p->sb[u] + o[me], c[me]};
        if (R > 1) free(c);
    }
    return n;
}

dt_status dt_parallel_set_params(dt_ctx *ctx, dt_parallel *p, const float *full) {
    (void)ctx; /* nothing here communicates: ZeRO-3 gathers units when next used */
    dt_model *m = p->m;
    if (!p->sharded_params) {
        dt_copy(m->ps.params, full, m->ps.n_params * sizeof(float));
        return DT_OK;
    }
    for (int u = 0; u < p->U; u++) {
        size_t i = dt_par_ix(p, u);
        dt_copy(p->pshard + p->sb[u], full + m->ps.unit_lo[u] + p->split_off[i], p->split_cnt[i] * sizeof(float));
    }
    dt_par_params_stale(p);
    return DT_OK;
}

void dt_parallel_set_compression(dt_parallel *p, int on) {
    dt_par_wait(p, p->queued - 1);
    p->topk_on = on;
}

void dt_parallel_residual(dt_parallel *p, float **res, size_t *n) {
    *res = p->res;
    *n = p->res ? p->z.res : 0;
}

void dt_parallel_ages(dt_parallel *p, float **age, size_t *n) {
    *age = p->age;
    *n = p->age ? p->z.age : 0;
}

void dt_parallel_ages_reset(dt_parallel *p) {
    for (size_t i = 0; i < p->z.age; i++) p->age[i] = 1.0f;
}

void dt_parallel_residual_adjust(dt_parallel *p, float factor) {
    if (!p->res || factor == 1.0f) return;
    dt_par_wait(p, p->queued - 1);
    if (factor == 0.0f) {
        dt_topk_residual_clear(p->res, p->z.res);
        return;
    }
    dt_scale_f32(p->res, factor, p->z.res);
}

void dt_parallel_unit_counts(dt_parallel *p, long *reduces, long *gathers) {
    dt_par_wait(p, p->queued - 1);
    *reduces = p->n_reduce;
    *gathers = p->n_gather;
}

void dt_parallel_comm_time(const dt_parallel *p, double *exposed, double *total) {
    *exposed = p->t_exposed;
    *total = p->t_total;
}
