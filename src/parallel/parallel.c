/* Data parallelism: gradient buckets, the communication thread, sharded optimizer state.
 *
 * Buckets are contiguous ranges of the gradient slab cut from its end downwards, so they
 * become final in order during backward: the slab is [wte wpe | layer 0 .. layer L-1 |
 * ln_f], backward finishes ln_f, then layers L-1 .. 0, then the embeddings (wte is written
 * both by the lm_head, first, and the encoder, last). A bucket is ready once the lowest
 * layer it touches is done; one touching the embeddings only at the very end.
 *
 * Invariants (MPI_THREAD_SERIALIZED):
 *   1. Only the communication thread calls the communicator between the first bucket
 *      launch of a step and the end of dt_parallel_finish_grads.
 *   2. A bucket is enqueued only after its gradients are final for the step, and the model
 *      never writes it again before the next step's zeroing.
 *   3. Buckets are reduced in the same order on every rank (plan order), so collectives
 *      match up.
 */
#include "parallel/parallel.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/timer.h"

typedef struct bucket {
    size_t lo, hi; /* floats in the gradient slab */
    int stage;     /* ready after this layer's backward; -1: after the embeddings */
} bucket;

struct dt_parallel {
    dt_parallel_cfg cfg;
    dt_comm *comm;
    dt_gpt2 *m;
    dt_alloc *alloc;
    int world, rank;
    bucket *b;
    int nb;
    int last_micro, micro;  /* current micro-step: is it the last, its index */
    float *acc;             /* the step's gradient (the model's slab) */
    float *extra;           /* gradients of micro-steps k >= 1, added into acc in order */
    float *red_scratch;     /* ordered all-reduce scratch: one bucket */
    size_t bucket_floats;
    /* optimizer shard */
    size_t shard_off, shard_len;
    size_t *counts, *offsets; /* per rank */
    float *mom, *var;         /* AdamW moments of the shard (or everything for DDP) */
    dt_param_segment *segs;   /* segments intersected with the shard, shard-relative */
    int nsegs;
    /* communication thread */
    pthread_t thread;
    int thread_live, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int queued, done, next; /* buckets enqueued / reduced this step; next to enqueue */
    dt_status err;
    dt_ctx err_ctx;
    double t_exposed, t_total;
};

dt_status dt_strategy_parse(dt_ctx *ctx, const char *s, dt_strategy *out) {
    if (!strcasecmp(s, "ddp") || !strcasecmp(s, "no_shard")) *out = DT_STRAT_DDP;
    else if (!strcasecmp(s, "zero1")) *out = DT_STRAT_ZERO1;
    else if (!strcasecmp(s, "zero2") || !strcasecmp(s, "zero3") || !strcasecmp(s, "shard_grad_op") ||
             !strcasecmp(s, "full_shard") || !strcasecmp(s, "hybrid_shard"))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.strategy: '%s' is not implemented yet (ddp, no_shard, zero1 are)", s);
    else return dt_fail(ctx, DT_ERR_CONFIG, "parallel.strategy: unknown strategy '%s' (ddp, no_shard, zero1)", s);
    return DT_OK;
}

const char *dt_strategy_name(dt_strategy s) { return s == DT_STRAT_DDP ? "ddp" : "zero1"; }

/* ---- bucket reduction */

/* Finishes bucket i: adds the last micro-step's gradient (k >= 1) into the step's, then
 * sums over ranks in rank order. The backward already scaled by 1/(accum x world), so
 * the sum is the mean gradient of the global batch, bitwise what one rank with world x
 * accum micro-steps computes. */
static dt_status reduce_bucket(dt_ctx *ctx, dt_parallel *p, int i) {
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

static void *comm_main(void *arg) {
    dt_parallel *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->done == p->queued) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        int i = p->done;
        pthread_mutex_unlock(&p->mu);
        dt_status st = p->err == DT_OK ? reduce_bucket(&p->err_ctx, p, i) : DT_OK;
        pthread_mutex_lock(&p->mu);
        if (st != DT_OK && p->err == DT_OK) p->err = st;
        p->done++;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Enqueues every bucket whose stage is >= `stage` (in plan order). */
static void launch_ready(dt_parallel *p, int stage) {
    pthread_mutex_lock(&p->mu);
    while (p->next < p->nb && p->b[p->next].stage >= stage) {
        p->next++;
        p->queued++;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void hook_layer(void *ud, int layer) {
    dt_parallel *p = ud;
    if (p->last_micro) launch_ready(p, layer);
}

static void hook_embed(void *ud) {
    dt_parallel *p = ud;
    if (p->last_micro) launch_ready(p, -1);
}

/* ---- setup */

static int stage_of(const dt_gpt2 *m, size_t lo) {
    if (lo < m->layers_offset) return -1;
    size_t l = (lo - m->layers_offset) / m->layer_floats;
    return l >= (size_t)m->cfg.n_layer ? m->cfg.n_layer - 1 : (int)l;
}

static dt_status plan_buckets(dt_ctx *ctx, dt_parallel *p) {
    size_t n = p->m->n_params;
    size_t per = p->cfg.bucket_bytes / sizeof(float);
    if (per < 1024) per = 1024;
    int cap = (int)((n + per - 1) / per) + 2 * p->m->cfg.n_layer + 4;
    p->bucket_floats = per;
    p->b = calloc((size_t)cap, sizeof *p->b);
    if (!p->b) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    /* From the end downwards; a bucket never spans the embeddings and a layer, so the big
     * embedding buckets (ready last) do not delay the last layer's gradients. */
    size_t hi = n;
    while (hi > 0) {
        size_t lo = hi > per ? hi - per : 0;
        if (hi > p->m->layers_offset && lo < p->m->layers_offset) lo = p->m->layers_offset;
        p->b[p->nb++] = (bucket){lo, hi, stage_of(p->m, lo)};
        hi = lo;
    }
    return DT_OK;
}

static dt_status plan_shard(dt_ctx *ctx, dt_parallel *p) {
    size_t n = p->m->n_params;
    p->counts = calloc((size_t)p->world * 2, sizeof(size_t));
    if (!p->counts) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    p->offsets = p->counts + p->world;
    if (p->cfg.strategy == DT_STRAT_ZERO1) {
        dt_comm_split(n, p->world, p->counts, p->offsets);
        p->shard_off = p->offsets[p->rank];
        p->shard_len = p->counts[p->rank];
    } else {
        p->shard_off = 0;
        p->shard_len = n;
    }
    dt_param_segment *all;
    int nall;
    DT_CHECK(dt_gpt2_param_segments(ctx, p->m, &all, &nall));
    p->segs = calloc((size_t)nall, sizeof *p->segs);
    if (!p->segs) {
        free(all);
        return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    }
    size_t lo = p->shard_off, hi = p->shard_off + p->shard_len;
    for (int i = 0; i < nall; i++) {
        size_t a = all[i].offset > lo ? all[i].offset : lo;
        size_t z = all[i].offset + all[i].len < hi ? all[i].offset + all[i].len : hi;
        if (a < z) p->segs[p->nsegs++] = (dt_param_segment){a - lo, z - a, all[i].decay};
    }
    free(all);
    size_t bytes = p->shard_len * sizeof(float);
    DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_OPTIM, bytes, (void **)&p->mom));
    DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_OPTIM, bytes, (void **)&p->var));
    return DT_OK;
}

dt_status dt_parallel_init(dt_ctx *ctx, dt_parallel **out, dt_comm *comm, dt_gpt2 *m,
                           dt_alloc *alloc, const dt_parallel_cfg *cfg) {
    dt_parallel *p = calloc(1, sizeof *p);
    if (!p) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    p->cfg = *cfg;
    p->comm = comm;
    p->m = m;
    p->alloc = alloc;
    p->world = dt_comm_size(comm, DT_GROUP_WORLD);
    p->rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    p->last_micro = 1;
    p->err_ctx = *ctx;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->acc = m->grads;
    dt_status st = plan_buckets(ctx, p);
    if (st == DT_OK) st = plan_shard(ctx, p);
    if (st == DT_OK && cfg->accum > 1)
        st = dt_alloc_get(ctx, alloc, DT_MEM_GRADS, m->n_params * sizeof(float), (void **)&p->extra);
    if (st == DT_OK && p->world > 1)
        st = dt_alloc_get(ctx, alloc, DT_MEM_SCRATCH, p->bucket_floats * sizeof(float), (void **)&p->red_scratch);
    if (st == DT_OK && p->world > 1 && p->cfg.overlap) {
        if (pthread_create(&p->thread, NULL, comm_main, p) != 0)
            st = dt_fail(ctx, DT_ERR_INTERNAL, "parallel: cannot start the communication thread");
        else p->thread_live = 1;
    }
    if (st != DT_OK) {
        dt_parallel_free(p);
        return st;
    }
    if (p->world > 1 && p->cfg.overlap) {
        m->hooks.ud = p;
        m->hooks.after_layer_backward = hook_layer;
        m->hooks.after_embed_backward = hook_embed;
    }
    *out = p;
    return DT_OK;
}

void dt_parallel_free(dt_parallel *p) {
    if (!p) return;
    if (p->thread_live) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    if (p->m && p->m->hooks.ud == p) memset(&p->m->hooks, 0, sizeof p->m->hooks);
    if (p->m && p->acc) {
        p->m->grads = p->acc;
        dt_gpt2_point_units(p->m);
    }
    dt_alloc_put(p->alloc, DT_MEM_GRADS, p->extra, p->m ? p->m->n_params * sizeof(float) : 0);
    dt_alloc_put(p->alloc, DT_MEM_SCRATCH, p->red_scratch, p->bucket_floats * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_OPTIM, p->mom, p->shard_len * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_OPTIM, p->var, p->shard_len * sizeof(float));
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->b);
    free(p->counts);
    free(p->segs);
    free(p);
}

void dt_parallel_begin_micro(dt_parallel *p, int k, int last) {
    p->micro = k;
    p->last_micro = last;
    /* Micro-step 0 writes the step's gradient directly; later ones a fresh buffer that is
     * added afterwards, so every micro-step's gradient is computed the same way whatever
     * the accumulation count (a kernel's `+=` into a non-zero buffer would round differently). */
    float *g = k == 0 ? p->acc : p->extra;
    DT_ASSERT(g != NULL);
    memset(g, 0, p->m->n_params * sizeof(float));
    p->m->grads = g;
    dt_gpt2_point_units(p->m);
}

void dt_parallel_end_micro(dt_parallel *p) {
    if (p->micro > 0 && !p->last_micro) {
        size_t n = p->m->n_params;
        float *a = p->acc;
        const float *x = p->extra;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) a[i] += x[i];
    }
    if (!p->last_micro) {
        p->m->grads = p->acc;
        dt_gpt2_point_units(p->m);
    }
}

dt_status dt_parallel_finish_grads(dt_ctx *ctx, dt_parallel *p) {
    p->m->grads = p->acc;
    dt_gpt2_point_units(p->m);
    if (p->world == 1 && p->micro == 0) return DT_OK;
    double t0 = dt_now();
    dt_status st = DT_OK;
    if (p->thread_live) {
        launch_ready(p, -1); /* anything the hooks did not launch (e.g. hooks skipped) */
        pthread_mutex_lock(&p->mu);
        while (p->done < p->queued) pthread_cond_wait(&p->cv, &p->mu);
        st = p->err;
        p->queued = p->done = p->next = 0;
        pthread_mutex_unlock(&p->mu);
        if (st != DT_OK) {
            memcpy(ctx->err, p->err_ctx.err, sizeof ctx->err);
            return st;
        }
    } else {
        for (int i = 0; i < p->nb; i++) DT_CHECK(reduce_bucket(ctx, p, i));
    }
    if (p->world > 1) p->t_exposed += dt_now() - t0;
    return st;
}

dt_status dt_parallel_grad_sumsq(dt_ctx *ctx, dt_parallel *p, double *out) {
    (void)ctx;
    /* After the all-reduce every rank holds the same averaged gradient: no communication. */
    *out = dt_sumsq(p->m->grads, p->m->n_params);
    return DT_OK;
}

dt_status dt_parallel_update(dt_ctx *ctx, dt_parallel *p, const dt_adamw *opt, float lr, long t,
                             float clip_coef) {
    float *g = p->m->grads + p->shard_off, *w = p->m->params + p->shard_off;
    if (clip_coef < 1.0f) dt_scale(g, p->shard_len, clip_coef);
    dt_adamw_update(opt, w, g, p->mom, p->var, p->segs, p->nsegs, lr, t);
    if (p->cfg.strategy == DT_STRAT_ZERO1 && p->world > 1) {
        double t0 = dt_now();
        DT_CHECK(dt_comm_allgather(ctx, p->comm, DT_GROUP_WORLD, p->m->params, p->counts));
        double dt = dt_now() - t0;
        p->t_exposed += dt;
        p->t_total += dt;
    }
    return DT_OK;
}

dt_status dt_parallel_mean(dt_ctx *ctx, dt_parallel *p, double *x) {
    if (p->world == 1) return DT_OK;
    DT_CHECK(dt_comm_allreduce(ctx, p->comm, DT_GROUP_WORLD, x, 1, DT_F64, DT_SUM));
    *x /= p->world;
    return DT_OK;
}

void dt_parallel_shard(const dt_parallel *p, size_t *offset, size_t *count) {
    *offset = p->shard_off;
    *count = p->shard_len;
}

void dt_parallel_comm_time(const dt_parallel *p, double *exposed, double *total) {
    *exposed = p->t_exposed;
    *total = p->t_total;
}
