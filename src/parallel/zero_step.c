/* ZeRO-2/3's once-per-step modes (docs/ARCHITECTURE.md decision 80), chosen per run by
 * parallel.zero_reduce and parallel.zero3_gather; zero.c and zero_params.c hold the per-use
 * modes they replace.
 *
 * Gradients reduced once per step (zero_reduce=step): the step's full gradient `acc` (this
 * rank's store, n_params floats, allocated at init and kept between steps) is accumulated
 * locally with DDP's scheme - the first micro-step that forms a unit writes its part of acc
 * (zeroed), a later one writes a zeroed window (zero.c's two) that grads_end adds into acc, so
 * a micro-step's gradient is computed alike whatever the accumulation count - and each unit is
 * reduce-scattered once, in rank order, into the fp32 shard (overwritten): by the last
 * micro-step's grads_end as it finishes (overlapped with the rest of the backward), or, for a
 * unit the last micro-step does not form (an interleaved stage's other chunks; zb-h1's units
 * without deferred GEMMs), at finish_grads in descending unit order. Every element of the
 * shard is so reduce(sum over micro-steps in order), DDP's and ZeRO-1's arithmetic: with the
 * same micro-batches a pipeline and one stage give the same bits, and so do ddp, zero1 and
 * zero2/3 in this mode (16-bit gradients: comm.h's rule on the local sum, as DDP).
 *
 * Parameters gathered once per step (zero3_gather=step): a resident copy of every unit (n_params
 * floats at the store's offsets; under mixed precision the matmul runs narrowed beside it in a
 * 16-bit buffer of n_params values), each unit gathered in fp32 at its first need after the
 * shard changed (the optimizer step, set_params) and narrowed locally - per element, so the bits
 * are those of the per-use 16-bit gathers - with the next unit prefetched the same way. Later
 * needs read it without communication; no windows and no vocabulary row lookup are kept. */
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "parallel/parallel_impl.h"

static void s_grads_begin(void *ud, int u) {
    dt_parallel *p = ud;
    const dt_params *ps = &p->m->ps;
    float *g;
    if (p->uexp[u]) return; /* a local expert's: formed and reduced by expert parallelism (train/ep.c) */
    DT_ASSERT(!p->reduced[u]); /* a unit is formed no more after its reduction */
    if (!p->touched[u]) { /* the first micro-step forming u writes acc directly */
        g = p->acc + ps->unit_lo[u];
        p->touched[u] = 1;
    } else { /* later ones a fresh window, added at grads_end */
        p->gw_cur = 1 - p->gw_cur;
        g = p->gwin[p->gw_cur];
    }
    dt_fill(g, 0, ps->unit_len[u] * sizeof(float));
    p->m->ps.unit_grads[u] = g;
}

static void s_grads_end(void *ud, int u) {
    dt_parallel *p = ud;
    const dt_params *ps = &p->m->ps;
    if (p->uexp[u]) return;
    float *a = p->acc + ps->unit_lo[u], *g = ps->unit_grads[u];
    if (g != a) dt_add_f32(a, g, ps->unit_len[u]);
    if (!p->last_micro) return;
    p->reduced[u] = 1;
    dt_par_submit(p, DT_TASK_REDUCE, u, -1);
}

void dt_par_step_finish(dt_parallel *p) {
    const dt_params *ps = &p->m->ps;
    for (int u = p->U - 1; u >= 0; u--) {
        if (p->reduced[u] || p->uexp[u]) continue;
        if (!p->touched[u]) dt_fill(p->acc + ps->unit_lo[u], 0, ps->unit_len[u] * sizeof(float)); /* no gradient */
        p->touched[u] = p->reduced[u] = 1;
        dt_par_submit(p, DT_TASK_REDUCE, u, -1);
    }
}

static int has_runs(const dt_parallel *p, int u) { return p->lp_gather && p->run0[u + 1] > p->run0[u]; }

dt_status dt_par_gather_resident(dt_ctx *ctx, dt_parallel *p, int u) {
    const size_t lo = p->m->ps.unit_lo[u];
    float *dst = p->pres + lo;
    DT_CHECK(dt_par_gather_unit(ctx, p, u, dst));
    if (has_runs(p, u))
        for (int r = p->run0[u]; r < p->run0[u + 1]; r++)
            dt_to_lowp(p->cfg.compute, p->pres16 + lo + p->run_off[r], dst + p->run_off[r], p->run_len[r]);
    return DT_OK;
}

static void fill_res(dt_parallel *p, int u) {
    p->res_ok[u] = 1;
    p->res_task[u] = dt_par_submit(p, DT_TASK_GATHER_RES, u, 0);
}

static void s_need(void *ud, int u, int next, int flags) {
    (void)flags; /* the resident copy holds both forms */
    dt_parallel *p = ud;
    dt_params *ps = &p->m->ps;
    if (!p->res_ok[u]) fill_res(p, u);
    dt_par_wait(p, p->res_task[u]);
    ps->unit_params[u] = p->pres + ps->unit_lo[u];
    ps->unit_params_lp[u] = has_runs(p, u) ? p->pres16 + ps->unit_lo[u] : NULL;
    if (next >= 0 && next != u && !p->res_ok[next]) fill_res(p, next);
}

void dt_par_step_stale(dt_parallel *p) {
    if (!p->res_ok) return; /* not gathering per step, or not yet set up */
    memset(p->res_ok, 0, (size_t)p->U);
}

dt_status dt_par_step_init(dt_ctx *ctx, dt_parallel *p) {
    dt_model *m = p->m;
    const size_t n = m->ps.n_params;
    p->touched = calloc((size_t)p->U * 2, 1); /* per unit and step (micro mode: reduced only) */
    if (!p->touched) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    p->reduced = p->touched + p->U;
    if (p->zr_step) {
        DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_GRADS, n * sizeof(float), (void **)&p->acc));
        m->hooks.grads_begin = s_grads_begin;
        m->hooks.grads_end = s_grads_end;
    }
    if (p->zg_step) {
        DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_PARAMS, n * sizeof(float), (void **)&p->pres));
        if (p->lp_gather)
            DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_PARAMS, n * sizeof(uint16_t), (void **)&p->pres16));
        p->res_ok = calloc((size_t)p->U, 1);
        p->res_task = calloc((size_t)p->U, sizeof *p->res_task);
        if (!p->res_ok || !p->res_task) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
        m->hooks.need_params = s_need;
    }
    return DT_OK;
}

void dt_par_step_free(dt_parallel *p) {
    const size_t n = p->m->ps.n_params;
    dt_alloc_put(p->alloc, DT_MEM_GRADS, p->acc, n * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_PARAMS, p->pres, n * sizeof(float));
    dt_alloc_put(p->alloc, DT_MEM_PARAMS, p->pres16, n * sizeof(uint16_t));
    if (p->zg_step)
        for (int u = 0; u < p->U; u++) p->m->ps.unit_params_lp[u] = NULL; /* no dangling pointers */
    free(p->touched);
    free(p->res_ok);
    free(p->res_task);
    p->acc = p->pres = NULL, p->pres16 = NULL, p->touched = p->reduced = p->res_ok = NULL, p->res_task = NULL;
}
