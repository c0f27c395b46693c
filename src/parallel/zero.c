/* ZeRO-2 and ZeRO-3: gradients (and ZeRO-3 parameters) live only as this rank's shard;
 * layers get temporary full copies in double-buffered windows, through the model's hooks.
 *
 * Per micro-step (hooks, in order):
 *   ZeRO-3 forward:  before layer l, wait for its parameters in window l % 2 and prefetch
 *                    layer l + 1 into the other window.
 *   backward:        before layer l, (ZeRO-3: the same, prefetching l - 1; the windows still
 *                    hold the last two layers of the forward) point its gradients at window
 *                    l % 2 once layer l + 2's reduction has read it; after it, reduce-scatter
 *                    the window (rank order) into the gradient shard, += over micro-steps.
 *                    ln_f is reduced with the last layer, the embeddings after the encoder.
 * Gathers and reductions are tasks on the communication thread (parallel.overlap) or run
 * inline; every rank submits them in the same order.
 * The embeddings and ln_f keep full parameter and gradient copies for the whole step: the
 * tied wte is used at both ends of the network (FSDP keeps it gathered too).
 * Task failures are recorded and returned by dt_parallel_finish_grads.
 */
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "parallel/parallel_impl.h"

static size_t G_off(const dt_parallel *p, int u) { return p->split_off[(size_t)u * p->G + p->j]; }
static size_t G_cnt(const dt_parallel *p, int u) { return p->split_cnt[(size_t)u * p->G + p->j]; }

dt_status dt_par_gather_unit(dt_ctx *ctx, dt_parallel *p, int u, float *dst) {
    memcpy(dst + G_off(p, u), p->pshard + p->sb[u], G_cnt(p, u) * sizeof(float));
    if (p->G == 1) return DT_OK;
    double t0 = dt_now();
    DT_CHECK(dt_comm_allgatherv(ctx, p->comm, p->g_shard, dst, p->split_cnt + (size_t)u * p->G,
                                p->split_off + (size_t)u * p->G));
    p->t_total += dt_now() - t0;
    return DT_OK;
}

static float *grad_buffer(dt_parallel *p, int buf) {
    return buf < 2 ? p->gwin[buf] : buf == 2 ? p->gpre : p->gpost;
}

/* Sums unit u's gradient buffer over all ranks into my shard of it (rank order). */
dt_status dt_par_reduce_unit(dt_ctx *ctx, dt_parallel *p, int u, int buf) {
    double t0 = dt_now();
    const float *win = grad_buffer(p, buf);
    size_t n = G_cnt(p, u);
    const float *src = win + G_off(p, u);
    if (p->world > 1) {
        DT_CHECK(dt_comm_reduce_scatter_ordered(ctx, p->comm, DT_GROUP_WORLD, win,
                                                p->rs_cnt + (size_t)u * p->world,
                                                p->rs_dis + (size_t)u * p->world, p->rs_out,
                                                p->rs_scratch));
        src = p->rs_out;
        if (p->n_rep > 1) { /* hybrid: the replicas of my node-shard each reduced a part */
            const size_t *sc = p->sub_cnt + (size_t)u * p->n_rep, *so = p->sub_off + (size_t)u * p->n_rep;
            memcpy(p->ns_buf + so[p->k], p->rs_out, sc[p->k] * sizeof(float));
            DT_CHECK(dt_comm_allgatherv(ctx, p->comm, DT_GROUP_CROSS, p->ns_buf, sc, so));
            src = p->ns_buf;
        }
    }
    float *dst = p->gshard + p->sb[u];
    if (p->micro == 0) memcpy(dst, src, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
    p->t_total += dt_now() - t0;
    return DT_OK;
}

/* Makes parameter window w hold unit u (gathering unless it already does or is being
 * filled), waits for it, and prefetches unit `next` (if >= 0) into the other window. */
static void need_params(dt_parallel *p, int u, int w, int next) {
    if (p->pwin_unit[w] != u) {
        p->pwin_unit[w] = u;
        p->pwin_task[w] = dt_par_submit(p, DT_TASK_GATHER, u, w);
    }
    dt_par_wait(p, p->pwin_task[w]);
    p->m->ps.unit_params[u] = p->pwin[w];
    int w2 = 1 - w;
    if (next >= 0 && p->pwin_unit[w2] != next) {
        p->pwin_unit[w2] = next;
        p->pwin_task[w2] = dt_par_submit(p, DT_TASK_GATHER, next, w2);
    }
}

static void z_before_forward(void *ud, int l) {
    dt_parallel *p = ud;
    int L = p->m->cfg.n_layer;
    need_params(p, DT_UNIT_LAYER(l), l % 2, l + 1 < L ? DT_UNIT_LAYER(l + 1) : -1);
}

static void z_before_backward(void *ud, int l) {
    dt_parallel *p = ud;
    int u = DT_UNIT_LAYER(l), w = l % 2;
    if (p->sharded_params) need_params(p, u, w, l > 0 ? DT_UNIT_LAYER(l - 1) : -1);
    dt_par_wait(p, p->gwin_task[w]); /* layer l+2's reduction still reads this window */
    memset(p->gwin[w], 0, p->m->ps.unit_len[u] * sizeof(float));
    p->m->ps.unit_grads[u] = p->gwin[w];
}

static void z_after_backward(void *ud, int l) {
    dt_parallel *p = ud;
    dt_model *m = p->m;
    if (l == m->cfg.n_layer - 1) dt_par_submit(p, DT_TASK_REDUCE, DT_UNIT_POST(&m->ps), 3);
    p->gwin_task[l % 2] = dt_par_submit(p, DT_TASK_REDUCE, DT_UNIT_LAYER(l), l % 2);
}

static void z_after_embed(void *ud) {
    dt_parallel *p = ud;
    dt_par_submit(p, DT_TASK_REDUCE, DT_UNIT_PRE, 2);
}

void dt_par_zero_begin_micro(dt_parallel *p) {
    dt_model *m = p->m;
    int post = DT_UNIT_POST(&m->ps);
    memset(p->gpre, 0, m->ps.unit_len[DT_UNIT_PRE] * sizeof(float));
    memset(p->gpost, 0, m->ps.unit_len[post] * sizeof(float));
    m->ps.unit_grads[DT_UNIT_PRE] = p->gpre;
    m->ps.unit_grads[post] = p->gpost;
}

dt_status dt_par_zero_finish(dt_ctx *ctx, dt_parallel *p) {
    dt_par_wait(p, p->queued - 1);
    if (p->err == DT_OK) return DT_OK;
    memcpy(ctx->err, p->err_ctx.err, sizeof ctx->err);
    return p->err;
}

static dt_status get(dt_ctx *ctx, dt_parallel *p, dt_mem_kind kind, size_t n, float **out) {
    return dt_alloc_get(ctx, p->alloc, kind, n * sizeof(float), (void **)out);
}

dt_status dt_par_zero_init(dt_ctx *ctx, dt_parallel *p, uint64_t seed) {
    dt_model *m = p->m;
    int post = DT_UNIT_POST(&m->ps);
    p->layer_floats = m->ps.layer_floats;
    DT_CHECK(get(ctx, p, DT_MEM_GRADS, p->S, &p->gshard));
    DT_CHECK(get(ctx, p, DT_MEM_GRADS, p->layer_floats, &p->gwin[0]));
    DT_CHECK(get(ctx, p, DT_MEM_GRADS, p->layer_floats, &p->gwin[1]));
    DT_CHECK(get(ctx, p, DT_MEM_GRADS, m->ps.unit_len[DT_UNIT_PRE], &p->gpre));
    DT_CHECK(get(ctx, p, DT_MEM_GRADS, m->ps.unit_len[post], &p->gpost));
    DT_CHECK(get(ctx, p, DT_MEM_SCRATCH, p->max_sub * (size_t)p->world, &p->rs_scratch));
    DT_CHECK(get(ctx, p, DT_MEM_SCRATCH, p->max_sub, &p->rs_out));
    DT_CHECK(get(ctx, p, DT_MEM_SCRATCH, p->max_ns, &p->ns_buf));
    if (p->sharded_params) {
        DT_CHECK(get(ctx, p, DT_MEM_PARAMS, p->S, &p->pshard));
        DT_CHECK(get(ctx, p, DT_MEM_PARAMS, p->layer_floats, &p->pwin[0]));
        DT_CHECK(get(ctx, p, DT_MEM_PARAMS, p->layer_floats, &p->pwin[1]));
        DT_CHECK(get(ctx, p, DT_MEM_PARAMS, m->ps.unit_len[DT_UNIT_PRE], &p->ppre));
        DT_CHECK(get(ctx, p, DT_MEM_PARAMS, m->ps.unit_len[post], &p->ppost));
        p->pwin_unit[0] = p->pwin_unit[1] = -1;
        /* Each rank draws only its own shard (the counter RNG makes any range drawable),
         * then the always-full units are gathered. */
        for (int u = 0; u < p->U; u++)
            dt_params_init_range(&m->ps, seed, p->pshard + p->sb[u], m->ps.unit_lo[u] + G_off(p, u), G_cnt(p, u));
        m->ps.unit_params[DT_UNIT_PRE] = p->ppre;
        m->ps.unit_params[post] = p->ppost;
        DT_CHECK(dt_par_gather_unit(ctx, p, DT_UNIT_PRE, p->ppre));
        DT_CHECK(dt_par_gather_unit(ctx, p, post, p->ppost));
        m->hooks.before_layer_forward = z_before_forward;
    }
    m->hooks.ud = p;
    m->hooks.before_layer_backward = z_before_backward;
    m->hooks.after_layer_backward = z_after_backward;
    m->hooks.after_embed_backward = z_after_embed;
    return DT_OK;
}

void dt_par_zero_free(dt_parallel *p) {
    dt_model *m = p->m;
    size_t pre = m->ps.unit_len[DT_UNIT_PRE], post = m->ps.unit_len[DT_UNIT_POST(&m->ps)];
#define PUT(kind, ptr, n) dt_alloc_put(p->alloc, kind, ptr, (n) * sizeof(float))
    PUT(DT_MEM_GRADS, p->gshard, p->S);
    PUT(DT_MEM_GRADS, p->gwin[0], p->layer_floats);
    PUT(DT_MEM_GRADS, p->gwin[1], p->layer_floats);
    PUT(DT_MEM_GRADS, p->gpre, pre);
    PUT(DT_MEM_GRADS, p->gpost, post);
    PUT(DT_MEM_SCRATCH, p->rs_scratch, p->max_sub * (size_t)p->world);
    PUT(DT_MEM_SCRATCH, p->rs_out, p->max_sub);
    PUT(DT_MEM_SCRATCH, p->ns_buf, p->max_ns);
    PUT(DT_MEM_PARAMS, p->pshard, p->S);
    PUT(DT_MEM_PARAMS, p->pwin[0], p->layer_floats);
    PUT(DT_MEM_PARAMS, p->pwin[1], p->layer_floats);
    PUT(DT_MEM_PARAMS, p->ppre, pre);
    PUT(DT_MEM_PARAMS, p->ppost, post);
#undef PUT
}
