/* ZeRO-2 and ZeRO-3: gradients (and ZeRO-3 parameters) live only as this rank's shard; a unit
 * (a layer, a vocabulary chunk of the embedding or the lm_head, the other small tensors:
 * params.h) gets a temporary full copy in one of two windows, through the model's unit hooks.
 *
 *   need_params(u, next)  ZeRO-3: gather u into a window unless one holds it, wait for it,
 *                         and start gathering `next` into the other window (zero_params.c,
 *                         with ZeRO-3's parameter shard and the 16-bit gathers).
 *   grads_begin(u)        point u's gradients at the next gradient window, once the
 *                         reduction still reading that window has finished, zeroed.
 *   grads_end(u)          reduce-scatter the window (rank order) into the gradient shard:
 *                         the unit's first reduction of the step writes it, later ones +=.
 * (parallel.zero_reduce=step replaces the gradient hooks: zero_step.c.)
 * No unit is larger than the largest sub-layer unit (params.h), so the windows hold two of
 * those (a third to a half of a layer each), and the embeddings
 * are never whole on a rank (the tied wte is gathered chunk by chunk at both ends of the
 * network, and its gradient is formed chunk by chunk at the end of the backward).
 * Gathers and reductions are tasks on the communication thread (parallel.overlap) or run
 * inline; every rank submits them in the same order. A reduction runs in rounds of at most
 * z.rs_round floats per rank, so its scratch is bucket-sized, not unit-sized.
 * Task failures are recorded and returned by dt_parallel_finish_grads.
 */
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "ops/ops.h"
#include "parallel/parallel_impl.h"

static size_t G_off(const dt_parallel *p, int u) { return p->split_off[dt_par_ix(p, u)]; }
static size_t G_cnt(const dt_parallel *p, int u) { return p->split_cnt[dt_par_ix(p, u)]; }

/* Into the step's gradient shard: micro-step 0 writes, later ones add. */
static void accumulate(float *dst, const float *src, size_t n, int first) {
    if (first) dt_copy(dst, src, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* As accumulate, from 16-bit sums of type t (widening is exact). */
static void accumulate_lp(dt_dtype t, float *dst, const uint16_t *src, size_t n, int first) {
    if (first) {
        dt_from_lowp(t, dst, src, n);
        return;
    }
    float x[512];
    for (size_t i0 = 0; i0 < n; i0 += 512) {
        size_t m = n - i0 < 512 ? n - i0 : 512;
        dt_from_lowp(t, x, src + i0, m);
        for (size_t i = 0; i < m; i++) dst[i0 + i] += x[i];
    }
}

/* Sums unit u's gradient window over all ranks into my shard of it (rank order). With bf16
 * gradients (comm.h's rule) each round's sums arrive in bf16 and are widened into the f32
 * shard; under hybrid sharding they go straight into my sub-chunk of the bf16 node-shard,
 * which the replicas then gather across nodes as bf16 (nothing more is rounded there). */
dt_status dt_par_reduce_unit(dt_ctx *ctx, dt_parallel *p, int u, int buf) {
    double t0 = dt_now();
    /* buf < 0 (parallel.zero_reduce=step): the unit's part of the step's gradient, reduced once
     * into the shard, which it overwrites (zero_step.c) */
    const float *win = buf < 0 ? p->acc + p->m->ps.unit_lo[u] : p->gwin[buf & 1];
    const int first = buf < 0 || (buf & 2); /* the unit's first reduction of the step: it writes */
    size_t n = G_cnt(p, u);
    float *dst = p->gshard + p->sb[u];
    p->n_reduce++;
    if (p->world == 1) { /* my shard is the whole unit */
        accumulate(dst, win + G_off(p, u), n, first);
        p->t_total += dt_now() - t0;
        return DT_OK;
    }
    const int W = p->world;
    const size_t *cnt = p->rs_cnt + (size_t)u * W, *dis = p->rs_dis + (size_t)u * W;
    size_t most = 0, R = p->z.rs_round;
    for (int w = 0; w < W; w++) most = cnt[w] > most ? cnt[w] : most;
    /* Hybrid: the replicas of my node-shard each reduce a sub-chunk of it, into ns_buf. */
    const size_t *sc = p->sub_cnt + (size_t)u * p->n_rep, *so = p->sub_off + (size_t)u * p->n_rep;
    const dt_dtype lt = p->cfg.grad_dtype;
    int bf16 = lt != DT_F32; /* 16-bit gradients (bf16 or fp16) */
    float *mine = p->n_rep > 1 && !bf16 ? p->ns_buf + so[p->k] : NULL;
    uint16_t *mine16 = p->n_rep > 1 && bf16 ? p->ns16 + so[p->k] : NULL;
    size_t *rc = p->part_cnt, *rd = p->part_cnt + W;
    for (size_t done = 0; done < most; done += R) {
        for (int w = 0; w < W; w++) {
            size_t left = cnt[w] > done ? cnt[w] - done : 0;
            rc[w] = left < R ? left : R;
            rd[w] = dis[w] + (left ? done : 0);
        }
        if (bf16) {
            uint16_t *out = mine16 ? mine16 + done : p->rs16;
            DT_CHECK(dt_comm_reduce_scatter_ordered_lp(ctx, p->comm, p->g_dp, lt, win, rc, rd, out, p->lp));
            if (!mine16) accumulate_lp(lt, dst + done, p->rs16, rc[p->rank], first);
            continue;
        }
        DT_CHECK(dt_comm_reduce_scatter_ordered(ctx, p->comm, p->g_dp, win, rc, rd, p->rs_out, p->rs_scratch));
        if (mine) dt_copy(mine + done, p->rs_out, rc[p->rank] * sizeof(float));
        else accumulate(dst + done, p->rs_out, rc[p->rank], first);
    }
    if (mine) {
        DT_CHECK(dt_comm_allgatherv(ctx, p->comm, p->g_cross, p->ns_buf, sc, so));
        accumulate(dst, p->ns_buf, n, first);
    }
    if (mine16) {
        DT_CHECK(dt_comm_allgatherv_bf16(ctx, p->comm, p->g_cross, p->ns16, sc, so));
        accumulate_lp(lt, dst, p->ns16, n, first);
    }
    p->t_total += dt_now() - t0;
    return DT_OK;
}

static void z_grads_begin(void *ud, int u) {
    dt_parallel *p = ud;
    if (p->uexp[u]) return; /* a local expert's: formed and reduced by expert parallelism (train/ep.c) */
    int w = 1 - p->gw_cur;
    dt_par_wait(p, p->gwin_task[w]); /* the reduction before last still reads this window */
    dt_fill(p->gwin[w], 0, p->m->ps.unit_len[u] * sizeof(float));
    p->m->ps.unit_grads[u] = p->gwin[w];
    p->gw_cur = w;
}

static void z_grads_end(void *ud, int u) {
    dt_parallel *p = ud;
    if (p->uexp[u]) return;
    DT_ASSERT(p->m->ps.unit_grads[u] == p->gwin[p->gw_cur]);
    /* the first reduction of u in the step writes the shard, later ones add: the first
     * micro-step's, except for an interleaved stage's chunks that micro-step does not form */
    int first = !p->reduced[u];
    p->reduced[u] = 1;
    p->gwin_task[p->gw_cur] = dt_par_submit(p, DT_TASK_REDUCE, u, p->gw_cur | first << 1);
}

void dt_par_zero_begin_micro(dt_parallel *p) {
    /* No unit has a gradient buffer until its grads_begin. */
    for (int u = 0; u < p->U; u++) p->m->ps.unit_grads[u] = NULL;
    if (p->micro == 0) memset(p->touched, 0, 2 * (size_t)p->U); /* a new step (zero_step.c) */
}

dt_status dt_par_zero_finish(dt_ctx *ctx, dt_parallel *p) {
    if (p->zr_step) dt_par_step_finish(p); /* the units the last micro-step did not reduce */
    dt_par_wait(p, p->queued - 1);
    if (p->err == DT_OK) return DT_OK;
    memcpy(ctx->err, p->err_ctx.err, sizeof ctx->err);
    return p->err;
}

static dt_status get(dt_ctx *ctx, dt_parallel *p, dt_mem_kind kind, size_t n, float **out) {
    if (n == 0) return DT_OK;
    return dt_alloc_get(ctx, p->alloc, kind, n * sizeof(float), (void **)out);
}

static dt_status get16(dt_ctx *ctx, dt_parallel *p, size_t n, uint16_t **out) {
    if (n == 0) return DT_OK;
    return dt_alloc_get(ctx, p->alloc, DT_MEM_COMM, n * sizeof(uint16_t), (void **)out);
}

dt_status dt_par_zero_init(dt_ctx *ctx, dt_parallel *p, uint64_t seed) {
    dt_model *m = p->m;
    DT_CHECK(get(ctx, p, DT_MEM_GRADS, p->S, &p->gshard));
    DT_CHECK(get(ctx, p, DT_MEM_GRADS, p->z.max_unit, &p->gwin[0]));
    DT_CHECK(get(ctx, p, DT_MEM_GRADS, p->z.max_unit, &p->gwin[1]));
    if (p->world > 1 && p->cfg.grad_dtype != DT_F32) { /* sizes: dt_par_sizes_of */
        DT_CHECK(get16(ctx, p, p->z.lp, &p->lp));
        DT_CHECK(get16(ctx, p, p->z.rs_round, &p->rs16));
        if (p->n_rep > 1) DT_CHECK(get16(ctx, p, p->z.max_ns, &p->ns16));
    } else if (p->world > 1) {
        DT_CHECK(get(ctx, p, DT_MEM_COMM, p->z.rs_scr, &p->rs_scratch));
        DT_CHECK(get(ctx, p, DT_MEM_COMM, p->z.rs_round, &p->rs_out));
        if (p->n_rep > 1) DT_CHECK(get(ctx, p, DT_MEM_COMM, p->z.max_ns, &p->ns_buf));
    }
    p->gw_cur = 1;
    m->hooks.ud = p;
    m->hooks.grads_begin = z_grads_begin;
    m->hooks.grads_end = z_grads_end;
    if (p->sharded_params) DT_CHECK(dt_par_params_init(ctx, p, seed));
    DT_CHECK(dt_par_step_init(ctx, p)); /* the once-per-step modes, when chosen */
    dt_par_zero_begin_micro(p);
    return DT_OK;
}

void dt_par_zero_free(dt_parallel *p) {
#define PUT(kind, ptr, n) dt_alloc_put(p->alloc, kind, ptr, (n) * sizeof(float))
    PUT(DT_MEM_GRADS, p->gshard, p->S);
    PUT(DT_MEM_GRADS, p->gwin[0], p->z.max_unit);
    PUT(DT_MEM_GRADS, p->gwin[1], p->z.max_unit);
    PUT(DT_MEM_COMM, p->rs_scratch, p->z.rs_scr);
    PUT(DT_MEM_COMM, p->rs_out, p->z.rs_round);
    PUT(DT_MEM_COMM, p->ns_buf, p->z.max_ns);
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->lp, p->z.lp * sizeof(uint16_t));
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->rs16, p->z.rs_round * sizeof(uint16_t));
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->ns16, p->z.max_ns * sizeof(uint16_t));
#undef PUT
    dt_par_step_free(p);
    if (p->sharded_params) dt_par_params_free(p);
}
