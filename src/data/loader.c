#include "data/loader.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* One slot held by the trainer, up to two filled ahead (smooths a slow page fault). */
#define LOADER_SLOTS 3

typedef unsigned long long ull;

/* Slot life: FREE -> FILLING (thread) -> READY -> HELD (trainer) -> FREE on the next call.
 * FAILED is terminal until a seek; its message is in tctx.err. */
typedef enum slot_state { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD, SLOT_FAILED } slot_state;

typedef struct loader_slot {
    int32_t *inputs, *targets; /* (B,T) each, inside the loader's slab */
    slot_state state;
} loader_slot;

struct dt_loader {
    const dt_sampler *s;
    int world, rank, B, accum;
    int32_t *slab;
    dt_ctx tctx; /* the thread's context: caller's identity, its own message */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sync_ready; /* mu and cv initialised */
    pthread_t thread;
    int running;
    /* Set only while the thread is stopped (init, seek); read-only for it. */
    uint64_t cursor0; /* cursor at the last seek */
    uint64_t fault_q;
    /* Shared, under mu. */
    int stop;
    loader_slot slots[LOADER_SLOTS];
    dt_status fail_st;
    /* Trainer side only. */
    uint64_t taken; /* micro-batches returned since the last seek */
    int held;       /* slot the trainer holds, -1 if none */
    uint64_t fault_pending;
};

/* Micro-batch q after the seek is (step q / accum, micro-step q % accum): the order is a
 * function of q alone, so thread timing cannot change what the trainer sees. */
static void *loader_thread(void *arg) {
    dt_loader *l = arg;
    uint64_t per_step = (uint64_t)l->world * (uint64_t)l->B * (uint64_t)l->accum;
    for (uint64_t q = 0;; q++) {
        loader_slot *sl = &l->slots[q % LOADER_SLOTS];
        pthread_mutex_lock(&l->mu);
        while (!l->stop && sl->state != SLOT_FREE) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) {
            pthread_mutex_unlock(&l->mu);
            break;
        }
        sl->state = SLOT_FILLING;
        pthread_mutex_unlock(&l->mu);

        dt_status st = DT_OK;
        if (q == l->fault_q)
            st = dt_fail(&l->tctx, DT_ERR_IO, "data loader: injected fault at micro-batch %llu",
                         (ull)q);
        else
            dt_sampler_fill(l->s, l->cursor0 + (q / (uint64_t)l->accum) * per_step, l->world,
                            l->rank, l->B, l->accum, (int)(q % (uint64_t)l->accum), sl->inputs,
                            sl->targets);

        pthread_mutex_lock(&l->mu);
        sl->state = st == DT_OK ? SLOT_READY : SLOT_FAILED;
        l->fail_st = st;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        if (st != DT_OK) break;
    }
    return NULL;
}

static void loader_stop(dt_loader *l) {
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->running = 0;
}

/* Expects the thread stopped: resets every slot and starts it at `cursor`. */
static dt_status loader_start(dt_ctx *ctx, dt_loader *l, uint64_t cursor) {
    l->cursor0 = cursor;
    l->fault_q = l->fault_pending;
    l->stop = 0;
    l->fail_st = DT_OK;
    l->taken = 0;
    l->held = -1;
    for (int i = 0; i < LOADER_SLOTS; i++) l->slots[i].state = SLOT_FREE;
    /* The thread starts with every signal blocked, so SIGTERM/SIGINT reach the trainer's
     * thread (checkpoint-on-signal) and never interrupt a fill. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&l->thread, NULL, loader_thread, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return dt_fail(ctx, DT_ERR_INTERNAL, "cannot start the data loader thread: %s", strerror(rc));
    l->running = 1;
    return DT_OK;
}

static dt_status check_geometry(dt_ctx *ctx, int world, int rank, int B, int accum) {
    if (world < 1) return dt_fail(ctx, DT_ERR_CONFIG, "data loader: world size must be >= 1 (got %d)", world);
    if (rank < 0 || rank >= world)
        return dt_fail(ctx, DT_ERR_CONFIG, "data loader: rank %d outside [0, %d)", rank, world);
    if (B < 1) return dt_fail(ctx, DT_ERR_CONFIG, "data loader: micro-batch must be >= 1 (got %d)", B);
    if (accum < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "data loader: accumulation steps must be >= 1 (got %d)", accum);
    return DT_OK;
}

dt_status dt_loader_init(dt_ctx *ctx, dt_loader **out, const dt_sampler *s, int world, int rank,
                         int B, int accum, uint64_t cursor) {
    dt_status st = DT_OK;
    *out = NULL;
    DT_CHECK(check_geometry(ctx, world, rank, B, accum));
    dt_loader *l = calloc(1, sizeof *l);
    if (!l) return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the data loader");
    l->s = s;
    l->world = world;
    l->rank = rank;
    l->B = B;
    l->accum = accum;
    l->held = -1;
    l->fault_pending = UINT64_MAX;
    l->tctx = *ctx;
    l->tctx.err[0] = l->tctx.where[0] = 0;
    size_t rows = (size_t)B * (size_t)dt_sampler_seq_len(s);
    if (!(l->slab = malloc(2 * LOADER_SLOTS * rows * sizeof *l->slab))) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the data loader's %d batch buffers",
                     LOADER_SLOTS);
        goto fail;
    }
    for (int i = 0; i < LOADER_SLOTS; i++) {
        l->slots[i].inputs = l->slab + (size_t)(2 * i) * rows;
        l->slots[i].targets = l->slab + (size_t)(2 * i + 1) * rows;
    }
    if (pthread_mutex_init(&l->mu, NULL) != 0) {
        st = dt_fail(ctx, DT_ERR_INTERNAL, "cannot create the data loader's mutex");
        goto fail;
    }
    if (pthread_cond_init(&l->cv, NULL) != 0) {
        pthread_mutex_destroy(&l->mu);
        st = dt_fail(ctx, DT_ERR_INTERNAL, "cannot create the data loader's condition variable");
        goto fail;
    }
    l->sync_ready = 1;
    DT_CHECK_GOTO(loader_start(ctx, l, cursor));
    *out = l;
    return DT_OK;
fail:
    dt_loader_free(l);
    return st;
}

dt_status dt_loader_next(dt_ctx *ctx, dt_loader *l, int32_t **inputs, int32_t **targets) {
    *inputs = *targets = NULL;
    if (!l->running)
        return dt_fail(ctx, DT_ERR_INTERNAL, "data loader is stopped (its last seek failed)");
    pthread_mutex_lock(&l->mu);
    if (l->held >= 0) { /* the trainer is done with the previous batch */
        l->slots[l->held].state = SLOT_FREE;
        l->held = -1;
        pthread_cond_broadcast(&l->cv);
    }
    int idx = (int)(l->taken % LOADER_SLOTS);
    loader_slot *sl = &l->slots[idx];
    while (sl->state != SLOT_READY && sl->state != SLOT_FAILED) pthread_cond_wait(&l->cv, &l->mu);
    if (sl->state == SLOT_FAILED) {
        dt_status st = dt_fail(ctx, l->fail_st, "%s", l->tctx.err);
        pthread_mutex_unlock(&l->mu);
        return st;
    }
    sl->state = SLOT_HELD;
    l->held = idx;
    l->taken++;
    pthread_mutex_unlock(&l->mu);
    *inputs = sl->inputs;
    *targets = sl->targets;
    return DT_OK;
}

dt_status dt_loader_seek(dt_ctx *ctx, dt_loader *l, uint64_t cursor) {
    loader_stop(l);
    DT_CHECK(loader_start(ctx, l, cursor));
    return DT_OK;
}

uint64_t dt_loader_step_targets(const dt_loader *l) {
    return dt_sampler_count_targets(l->s, dt_loader_cursor(l), l->world, l->B, l->accum);
}

uint64_t dt_loader_cursor(const dt_loader *l) {
    uint64_t per_step = (uint64_t)l->world * (uint64_t)l->B * (uint64_t)l->accum;
    return l->cursor0 + (l->taken / (uint64_t)l->accum) * per_step;
}

void dt_loader_inject_fault(dt_loader *l, uint64_t q) { l->fault_pending = q; }

void dt_loader_free(dt_loader *l) {
    if (!l) return;
    loader_stop(l);
    if (l->sync_ready) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
    }
    free(l->slab);
    free(l);
}

/* ---- validation ---- */

struct dt_val_loader {
    dt_sampler *s; /* unshuffled, owned */
    int world, rank, B;
    uint64_t n_batches, next;
    int32_t *inputs, *targets;
};

dt_status dt_val_loader_init(dt_ctx *ctx, dt_val_loader **out, const dt_dataset *ds, int T,
                             int world, int rank, int B, uint64_t max_batches) {
    dt_status st = DT_OK;
    *out = NULL;
    DT_CHECK(check_geometry(ctx, world, rank, B, 1));
    dt_val_loader *v = calloc(1, sizeof *v);
    if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the validation loader");
    v->world = world;
    v->rank = rank;
    v->B = B;
    DT_CHECK_GOTO(dt_sampler_init(ctx, &v->s, ds, T, 0, 0));
    uint64_t per_batch = (uint64_t)world * (uint64_t)B;
    uint64_t full = dt_sampler_num_samples(v->s) / per_batch;
    if (full == 0) {
        st = dt_fail(ctx, DT_ERR_CONFIG,
                     "validation data '%s' has %llu samples of T=%d, fewer than one batch of "
                     "world x micro-batch = %llu",
                     dt_dataset_spec(ds), (ull)dt_sampler_num_samples(v->s), T, (ull)per_batch);
        goto fail;
    }
    v->n_batches = max_batches && max_batches < full ? max_batches : full;
    size_t rows = (size_t)B * (size_t)T;
    if (!(v->inputs = malloc(2 * rows * sizeof *v->inputs))) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the validation batch");
        goto fail;
    }
    v->targets = v->inputs + rows;
    *out = v;
    return DT_OK;
fail:
    dt_val_loader_free(v);
    return st;
}

uint64_t dt_val_loader_num_batches(const dt_val_loader *v) { return v->n_batches; }

int dt_val_loader_next(dt_val_loader *v, int32_t **inputs, int32_t **targets) {
    if (v->next >= v->n_batches) return 0;
    uint64_t cursor = v->next * (uint64_t)v->world * (uint64_t)v->B;
    dt_sampler_fill(v->s, cursor, v->world, v->rank, v->B, 1, 0, v->inputs, v->targets);
    v->next++;
    *inputs = v->inputs;
    *targets = v->targets;
    return 1;
}

void dt_val_loader_reset(dt_val_loader *v) { v->next = 0; }

void dt_val_loader_free(dt_val_loader *v) {
    if (!v) return;
    dt_sampler_free(v->s);
    free(v->inputs);
    free(v);
}
