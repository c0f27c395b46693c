/* DDP and ZeRO-1 gradients: buckets over the full gradient slab, reduced on a communication
 * thread while backward continues.
 *
 * Buckets are contiguous ranges of the slab cut from its end downwards, so they become
 * final in order during backward: the slab is [wte wpe | layer 0 .. layer L-1 | ln_f];
 * backward finishes ln_f, then layers L-1 .. 0, then the embeddings (wte is written both by
 * the lm_head, first, and by the encoder, last). A bucket is ready once the lowest layer it
 * touches is done; one holding embeddings only at the very end.
 *
 * Invariants:
 *   1. A bucket is submitted only after its gradients are final for the step, and nothing
 *      writes it again before the next step's zeroing.
 *   2. Buckets are submitted in plan order on every rank, so the collectives match up.
 */
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "parallel/parallel_impl.h"

/* Finishes bucket i: adds the last micro-step's gradient (k >= 1) into the step's, then
 * sums over ranks in rank order. The backward already scaled by 1/(accum x world), so the
 * sum is the mean gradient of the global batch, bitwise what one rank with world x accum
 * micro-steps computes. */
/* Finishes bucket i: adds the last micro-step's gradient (k >= 1) into the step's, then
 * sums over ranks in rank order. The backward already scaled by 1/(accum x world), so the
 * sum is the mean gradient of the global batch, bitwise what one rank with world x accum
 * micro-steps computes. */
dt_status dt_par_reduce_bucket(dt_ctx *ctx, dt_parallel *p, int i) {
    float *g = p->acc + p->b[i].lo;
    size_t n = p->b[i].hi - p->b[i].lo;
    if (p->micro > 0) {
        const float *x = p->extra + p->b[i].lo;
        for (size_t k = 0; k < n; k++) g[k] += x[k];
    }
    if (p->world == 1) return DT_OK;
    double t0 = dt_now();
    DT_CHECK(dt_comm_allreduce_ordered(ctx, p->comm, DT_GROUP_WORLD, g, n, p->red_scratch));
    p->t_total += dt_now() - t0;
    return DT_OK;
}

/* Submits every bucket whose stage is >= `stage` (in plan order). */
static void launch_ready(dt_parallel *p, int stage) {
    while (p->next < p->nb && p->b[p->next].stage >= stage) dt_par_submit(p, DT_TASK_BUCKET, p->next++, 0);
}

static void hook_layer(void *ud, int layer) {
    dt_parallel *p = ud;
    if (p->last_micro) launch_ready(p, layer);
}

static void hook_embed(void *ud) {
    dt_parallel *p = ud;
    if (p->last_micro) launch_ready(p, -1);
}

static int stage_of(const dt_gpt2 *m, size_t lo) {
    if (lo < m->layers_offset) return -1;
    size_t l = (lo - m->layers_offset) / m->layer_floats;
    return l >= (size_t)m->cfg.n_layer ? m->cfg.n_layer - 1 : (int)l;
}

dt_status dt_par_buckets_init(dt_ctx *ctx, dt_parallel *p) {
    dt_gpt2 *m = p->m;
    size_t n = m->n_params, per = p->cfg.bucket_bytes / sizeof(float);
    if (per < 1024) per = 1024;
    if (per > n) per = n;
    p->bucket_floats = per;
    int cap = (int)((n + per - 1) / per) + 2 * m->cfg.n_layer + 4;
    p->b = calloc((size_t)cap, sizeof *p->b);
    if (!p->b) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    /* From the end downwards; a bucket never spans the embeddings and a layer, so the big
     * embedding buckets (ready last) do not delay the last layer's gradients. */
    for (size_t hi = n; hi > 0;) {
        size_t lo = hi > per ? hi - per : 0;
        if (hi > m->layers_offset && lo < m->layers_offset) lo = m->layers_offset;
        p->b[p->nb++] = (dt_bucket){lo, hi, stage_of(m, lo)};
        hi = lo;
    }
    p->acc = m->grads;
    if (p->cfg.accum > 1)
        DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_GRADS, n * sizeof(float), (void **)&p->extra));
    if (p->world > 1)
        DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_SCRATCH, per * sizeof(float), (void **)&p->red_scratch));
    if (p->thread_live) {
        m->hooks.ud = p;
        m->hooks.after_layer_backward = hook_layer;
        m->hooks.after_embed_backward = hook_embed;
    }
    return DT_OK;
}

void dt_par_buckets_free(dt_parallel *p) {
    if (p->acc) {
        p->m->grads = p->acc;
        dt_gpt2_point_units(p->m);
    }
    dt_alloc_put(p->alloc, DT_MEM_GRADS, p->extra, p->m->n_params * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_SCRATCH, p->red_scratch, p->bucket_floats * sizeof(float));
    free(p->b);
}

dt_status dt_par_buckets_finish(dt_ctx *ctx, dt_parallel *p) {
    p->m->grads = p->acc;
    dt_gpt2_point_units(p->m);
    if (p->world == 1 && p->micro == 0) return DT_OK;
    launch_ready(p, -1); /* everything the hooks did not launch (all of it without overlap) */
    dt_par_wait(p, p->queued - 1); /* waiting (or inline work) counts as exposed */
    p->next = 0;
    if (p->err != DT_OK) {
        memcpy(ctx->err, p->err_ctx.err, sizeof ctx->err);
        return p->err;
    }
    return DT_OK;
}
