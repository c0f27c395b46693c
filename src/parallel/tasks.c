/* The communication thread (parallel_impl.h): one thread per dt_parallel runs the queued
 * collectives (gradient buckets, ZeRO's gathers and reductions, the vocabulary lookup) in
 * submission order while the compute thread goes on; without overlap (or on one rank) a
 * submitted task runs inline and all of its time is exposed. */
#include <pthread.h>
#include <string.h>

#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "ops/ops.h"
#include "parallel/parallel_impl.h"

dt_status dt_par_run_task(dt_ctx *ctx, dt_parallel *p, const dt_par_task *t) {
    switch (t->kind) {
    case DT_TASK_BUCKET: return dt_par_reduce_bucket(ctx, p, t->a);
    case DT_TASK_GATHER: p->n_gather++; return dt_par_gather_unit(ctx, p, t->a, p->pwin[t->b]);
    case DT_TASK_GATHER_LP: p->n_gather++; return dt_par_gather_unit_lp(ctx, p, t->a, t->b);
    case DT_TASK_GATHER_RES: p->n_gather++; return dt_par_gather_resident(ctx, p, t->a);
    case DT_TASK_REDUCE: return dt_par_reduce_unit(ctx, p, t->a, t->b);
    case DT_TASK_LOOKUP: return dt_par_lookup(ctx, p);
    }
    return DT_OK;
}

static void run_one(dt_parallel *p, const dt_par_task *t) {
    if (p->err != DT_OK) return; /* after a failure the job is ending: skip the rest */
    dt_ctx c = p->err_ctx;
    double tt = dt_trace_begin();
    dt_status st = dt_par_run_task(&c, p, t);
    if (t->kind == DT_TASK_BUCKET)
        dt_trace_end(tt, "comm", "bucket %d %s", t->a,
                     p->res && p->topk_on               ? "top-k all-gather"
                     : p->cfg.strategy == DT_STRAT_DDP ? "all-reduce"
                                                        : "reduce-scatter");
    else
        dt_trace_end(tt, "comm", "unit %d %s", t->a,
                     t->kind == DT_TASK_GATHER      ? "all-gather"
                     : t->kind == DT_TASK_GATHER_RES ? "all-gather (resident)"
                     : t->kind == DT_TASK_GATHER_LP ? "all-gather 16-bit"
                     : t->kind == DT_TASK_LOOKUP    ? "vocabulary rows"
                                                    : "reduce-scatter");
    if (st != DT_OK && p->err == DT_OK) {
        p->err_ctx = c;
        p->err = st;
    }
}

static void *comm_main(void *arg) {
    dt_parallel *p = arg;
    dt_trace_set_thread(DT_TRACE_TID_COMM);
    dt_ops_serial_thread(); /* bf16 packing here must not start a second OpenMP team */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->done == p->queued) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        dt_par_task t = p->tasks[p->done % p->cap];
        pthread_mutex_unlock(&p->mu);
        run_one(p, &t);
        pthread_mutex_lock(&p->mu);
        p->done++;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

long dt_par_submit(dt_parallel *p, dt_task_kind kind, int a, int b) {
    dt_par_task t = {kind, a, b};
    if (!p->thread_live) { /* inline: all of it is exposed */
        double t0 = dt_now();
        run_one(p, &t);
        p->t_exposed += dt_now() - t0;
        p->done++;
        return p->queued++;
    }
    pthread_mutex_lock(&p->mu);
    DT_ASSERT(p->queued - p->done < p->cap);
    p->tasks[p->queued % p->cap] = t;
    long seq = p->queued++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return seq;
}

void dt_par_wait(dt_parallel *p, long seq) {
    if (seq < 0 || !p->thread_live) return;
    double t0 = dt_now();
    pthread_mutex_lock(&p->mu);
    while (p->done <= seq) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    p->t_exposed += dt_now() - t0;
}

void dt_par_thread_stop(dt_parallel *p) {
    if (!p->thread_live) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    p->thread_live = 0;
}

dt_status dt_par_thread_start(dt_ctx *ctx, dt_parallel *p) {
    if (pthread_create(&p->thread, NULL, comm_main, p) != 0)
        return dt_fail(ctx, DT_ERR_INTERNAL, "parallel: cannot start the communication thread");
    p->thread_live = 1;
    return DT_OK;
}
