/* DDP and ZeRO-1 gradients: buckets over the full gradient slab, reduced on a communication
 * thread while backward continues.
 *
 * Buckets are contiguous ranges of the slab cut from its end downwards, so they become
 * final in order during backward: the slab is [PRE units | layer 0 .. layer L-1 | POST
 * units], and every family's backward ends its units in strictly decreasing order (model.h:
 * the head's chunks and final norm, layers L-1 .. 0, then the embedding's chunks). A bucket
 * is ready once the lowest unit it touches has ended; embeddings come last.
 *
 * With Top-K compression (topk.h) a bucket is sparsified against this rank's residual, and
 * every rank's pairs are all-gathered and summed: every rank ends with the whole bucket.
 *
 * Invariants:
 *   1. A bucket is submitted only after its gradients are final for the step, and nothing
 *      writes it again before the next step's zeroing.
 *   2. Buckets are submitted in plan order on every rank, so the collectives match up.
 */
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "ops/ops.h"
#include "parallel/parallel_impl.h"
#include "parallel/topk.h"

/* Finishes bucket i: adds the last micro-step's gradient (k >= 1) into the step's, then
 * sums over ranks in rank order. The backward already scaled by 1/(accum x world), so the
 * sum is the mean gradient of the global batch, bitwise what one rank with world x accum
 * micro-steps computes. With bf16 gradients the step's f32 gradient is what gets rounded
 * (comm.h's rule), and the bucket then holds the widened bf16 sums (DDP: all of it; ZeRO-1:
 * my part). */
dt_status dt_par_reduce_bucket(dt_ctx *ctx, dt_parallel *p, int i) {
    float *g = p->acc + p->b[i].lo;
    size_t n = p->b[i].hi - p->b[i].lo;
    if (p->micro > 0) {
        const float *x = p->extra + p->b[i].lo;
        for (size_t k = 0; k < n; k++) g[k] += x[k];
    }
    if (p->world == 1) return DT_OK;
    double t0 = dt_now();
    const dt_dtype lt = p->cfg.grad_dtype; /* DT_F32, or the 16-bit type gradients travel in */
    if (p->res && p->topk_on) {
        /* Top-K (topk.h): my message of this bucket, every rank's gathered, summed in rank
         * order by every rank into the whole bucket (ZeRO-1 then reads its part of it). */
        int W = p->world;
        dt_dtype vt = lt;
        size_t words = dt_topk_words(n, p->cfg.topk_ratio, vt), *cnt = p->part_cnt, *dis = p->part_cnt + W;
        for (int w = 0; w < W; w++) cnt[w] = words, dis[w] = (size_t)w * words;
        dt_topk_encode(g, p->res + p->b[i].lo, n, p->cfg.topk_ratio, vt, p->msg + dis[p->rank]);
        DT_CHECK(dt_comm_allgatherv_bf16(ctx, p->comm, p->g_dp, p->msg, cnt, dis));
        dt_topk_sum(g, n, p->cfg.topk_ratio, vt, p->msg, W);
    } else if (p->cfg.strategy == DT_STRAT_DDP) {
        if (lt != DT_F32) DT_CHECK(dt_comm_allreduce_ordered_lp(ctx, p->comm, p->g_dp, lt, g, n, p->lp));
        else DT_CHECK(dt_comm_allreduce_ordered(ctx, p->comm, p->g_dp, g, n, p->red_scratch));
    } else {
        /* ZeRO-1: each rank needs only its own part summed (reduce-scatter, not all-reduce):
         * the bucket lies inside one unit, so every owner's part is one range. */
        int u = p->b[i].unit, W = p->world;
        size_t blo = p->b[i].lo - p->m->ps.unit_lo[u], bhi = blo + n;
        size_t *cnt = p->part_cnt, *dis = p->part_cnt + W;
        for (int w = 0; w < W; w++) {
            size_t a = p->rs_dis[(size_t)u * W + w], z = a + p->rs_cnt[(size_t)u * W + w];
            a = a > blo ? a : blo;
            z = z < bhi ? z : bhi;
            cnt[w] = a < z ? z - a : 0;
            dis[w] = a < z ? a - blo : 0;
        }
        if (lt != DT_F32) {
            DT_CHECK(dt_comm_reduce_scatter_ordered_lp(ctx, p->comm, p->g_dp, lt, g, cnt, dis, p->bk16, p->lp));
            dt_from_lowp(lt, g + dis[p->rank], p->bk16, cnt[p->rank]);
        } else {
            DT_CHECK(dt_comm_reduce_scatter_ordered(ctx, p->comm, p->g_dp, g, cnt, dis, p->bk_out,
                                                    p->red_scratch));
            dt_copy(g + dis[p->rank], p->bk_out, cnt[p->rank] * sizeof(float));
        }
    }
    p->t_total += dt_now() - t0;
    return DT_OK;
}

/* Submits every bucket whose lowest unit is >= u (in plan order): all of them have ended. */
static void launch_ready(dt_parallel *p, int u) {
    while (p->next < p->nb && p->b[p->next].first >= u) dt_par_submit(p, DT_TASK_BUCKET, p->next++, 0);
}

static void hook_grads_end(void *ud, int u) {
    dt_parallel *p = ud;
    if (p->last_micro) launch_ready(p, u);
}

static int unit_at(const dt_model *m, size_t x) {
    int u = m->ps.n_units - 1;
    while (m->ps.unit_lo[u] > x) u--;
    return u;
}

dt_status dt_par_buckets_init(dt_ctx *ctx, dt_parallel *p) {
    dt_model *m = p->m;
    size_t n = m->ps.n_params, per = p->z.bucket;
    int cap = (int)((n + per - 1) / per) + 2 * m->ps.n_units + 4;
    p->b = calloc((size_t)cap, sizeof *p->b);
    if (!p->b) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    /* From the end downwards; a bucket never spans the embeddings and a layer, so the big
     * embedding buckets (ready last) do not delay the last layer's gradients. */
    const size_t L0 = m->ps.layers_offset, LF = m->ps.layer_floats, SO = p->cfg.skip_off, SL = p->cfg.skip_len;
    const size_t L1 = L0 + LF * (size_t)m->ps.n_layer;
    for (size_t hi = n; hi > 0;) {
        size_t lo = hi > per ? hi - per : 0;
        if (SL && hi > L0 && hi <= L1) { /* expert parallelism: no bucket holds the local experts */
            const size_t l = (hi - 1 - L0) / LF, r = (hi - 1 - L0) % LF, b = L0 + l * LF;
            if (r >= SO && r < SO + SL) { /* inside: go below them */
                hi = b + SO;
                continue;
            }
            const size_t below = r >= SO + SL ? b + SO + SL : l > 0 ? b - LF + SO + SL : 0;
            lo = lo > below ? lo : below;
        }
        int u = unit_at(m, hi - 1);
        /* Never across the embeddings/layer boundary; for ZeRO-1 never across any unit. */
        if (p->cfg.strategy != DT_STRAT_DDP) lo = lo > m->ps.unit_lo[u] ? lo : m->ps.unit_lo[u];
        if (hi > m->ps.layers_offset && lo < m->ps.layers_offset) lo = m->ps.layers_offset;
        p->b[p->nb++] = (dt_bucket){lo, hi, unit_at(m, lo), u};
        hi = lo;
    }
    p->acc = m->ps.grads;
    if (p->cfg.accum > 1)
        DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_GRADS, n * sizeof(float), (void **)&p->extra));
    if (p->world > 1) {
        /* The ordered reduction stacks every rank's copy of my part (sizes: dt_par_sizes_of);
         * bf16 gradients use the bf16 staging (lp) instead of red_scratch. */
        if (p->z.red)
            DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_COMM, p->z.red * sizeof(float), (void **)&p->red_scratch));
        if (p->z.lp) DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_COMM, p->z.lp * sizeof(uint16_t), (void **)&p->lp));
        if (p->z.res) { /* Top-K: nothing owed at the start */
            DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_GRADS, p->z.res * sizeof(float), (void **)&p->res));
            DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_COMM, p->z.msg * sizeof(uint16_t), (void **)&p->msg));
            dt_topk_residual_clear(p->res, p->z.res);
        }
        if (p->cfg.strategy != DT_STRAT_DDP && p->z.bk)
            DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_COMM, p->z.bk * p->z.esize,
                                  p->z.esize == sizeof(float) ? (void **)&p->bk_out : (void **)&p->bk16));
    }
    if (p->thread_live) {
        m->hooks.ud = p;
        m->hooks.grads_end = hook_grads_end;
    }
    return DT_OK;
}

void dt_par_buckets_free(dt_parallel *p) {
    if (p->acc) {
        p->m->ps.grads = p->acc;
        dt_params_point_units(&p->m->ps);
    }
    dt_alloc_put(p->alloc, DT_MEM_GRADS, p->extra, p->m->ps.n_params * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->red_scratch, p->z.red * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->bk_out, p->z.bk * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->bk16, p->z.bk * sizeof(uint16_t));
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->lp, p->z.lp * sizeof(uint16_t));
    dt_alloc_put(p->alloc, DT_MEM_GRADS, p->res, p->z.res * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->msg, p->z.msg * sizeof(uint16_t));
    free(p->b);
}

/* Top-K under tensor parallelism: a TP rank chooses among its whole slab, its shards of the
 * split tensors and its copy of the replicated ones (norms, some biases) together, so the TP
 * ranks choose differently for the replicated tensors, whose reduced gradients would differ and
 * whose copies would drift apart. TP rank 0's result stands for them: its reduced gradient and
 * its residual of every replicated tensor, sent to the TP group (decision 70). */
static dt_status topk_tp_sync(dt_ctx *ctx, dt_parallel *p) {
    const dt_params *ps = &p->m->ps;
    if (dt_tp_size(&p->m->opts) < 2 || dt_tp_local(&p->m->opts) >= dt_tp_size(&p->m->opts)) return DT_OK;
    for (int id = 0; id < ps->n_tensors; id++) {
        const dt_tensor_info *t = &ps->tensors[id];
        if (t->split) continue;
        size_t bytes = t->rows * t->cols * sizeof(float);
        for (int l = 0; l < dt_params_copies(ps, id); l++) {
            size_t at = dt_params_flat(ps, id, l);
            DT_CHECK(dt_comm_broadcast(ctx, p->comm, p->cfg.tp_group, p->acc + at, bytes, 0));
            DT_CHECK(dt_comm_broadcast(ctx, p->comm, p->cfg.tp_group, p->res + at, bytes, 0));
        }
    }
    return DT_OK;
}

dt_status dt_par_buckets_finish(dt_ctx *ctx, dt_parallel *p) {
    p->m->ps.grads = p->acc;
    dt_params_point_units(&p->m->ps);
    if (p->world == 1 && p->micro == 0) return DT_OK;
    launch_ready(p, 0); /* everything the hooks did not launch (all of it without overlap) */
    dt_par_wait(p, p->queued - 1); /* waiting (or inline work) counts as exposed */
    p->next = 0;
    if (p->err == DT_OK && p->cfg.strategy != DT_STRAT_DDP && p->n_rep > 1 && !(p->res && p->topk_on)) {
        /* Hybrid ZeRO-1: the replicas of my node-shard each reduced a sub-chunk of it. The
         * bf16 sums are gathered as bf16 (re-rounding my widened sub-chunk is exact). */
        for (int u = 0; u < p->U; u++) {
            float *ns = p->acc + p->m->ps.unit_lo[u] + p->split_off[(size_t)u * p->G + p->j];
            const size_t *sc = p->sub_cnt + (size_t)u * p->n_rep, *so = p->sub_off + (size_t)u * p->n_rep;
            if (p->cfg.grad_dtype != DT_F32) {
                dt_to_lowp(p->cfg.grad_dtype, p->lp + so[p->k], ns + so[p->k], sc[p->k]);
                DT_CHECK(dt_comm_allgatherv_bf16(ctx, p->comm, p->g_cross, p->lp, sc, so));
                dt_from_lowp(p->cfg.grad_dtype, ns, p->lp, p->split_cnt[(size_t)u * p->G + p->j]);
            } else {
                DT_CHECK(dt_comm_allgatherv(ctx, p->comm, p->g_cross, ns, sc, so));
            }
        }
    }
    if (p->err != DT_OK) {
        memcpy(ctx->err, p->err_ctx.err, sizeof ctx->err);
        return p->err;
    }
    if (p->res && p->topk_on) {
        double t0 = dt_now();
        DT_CHECK(topk_tp_sync(ctx, p));
        p->t_exposed += dt_now() - t0;
        p->t_total += dt_now() - t0;
    }
    return DT_OK;
}
