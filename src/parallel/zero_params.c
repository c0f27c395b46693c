/* ZeRO-3's parameters: this rank's fp32 master shard, and the two unit windows a unit is
 * gathered into before the model reads it (zero.c has the gradients).
 *
 *   need_params(u, next, flags)  gather u into a window unless one holds it (in the form
 *                                wanted), wait for it, and start gathering `next` into the
 *                                other window.
 *
 * Under mixed precision (cfg.compute bf16/fp16) a unit with `matmul` tensors is gathered in
 * two parts: its matmul elements in 16 bits into a 16-bit window (lpwin), which the model
 * reads as unit_params_lp[u], and the others in fp32 into the fp32 window (pwin), each at its
 * unit offsets. Each rank narrows the matmul elements of its piece of its master shard (the
 * bits DDP's local narrowing gives: conversion is per element) and packs its piece into the
 * windows: matmul values at their rank among the unit's matmul elements, the others at their
 * rank among the others. The concatenation of the ranks' packed parts, in rank order, is the
 * unit's matmul (other) elements in unit order, because pieces are contiguous and ascending:
 * one in-place all-gather per part (counts from the tensor layout and the shard split), then
 * the runs are moved to their unit offsets, back to front (a run's unit offset is never below
 * its packed one, so nothing unread is overwritten). No staging buffer. The matmul regions
 * of the fp32 window are left undefined. A lookup (the embedding, DT_NEED_F32) needs the
 * whole unit in fp32: such gathers are fp32 as without mixed precision, and the window
 * remembers which form it holds.
 */
#include <stdlib.h>

#include "core/timer.h"
#include "ops/ops.h"
#include "parallel/parallel_impl.h"

static size_t G_off(const dt_parallel *p, int u) { return p->split_off[dt_par_ix(p, u)]; }
static size_t G_cnt(const dt_parallel *p, int u) { return p->split_cnt[dt_par_ix(p, u)]; }

dt_status dt_par_gather_unit(dt_ctx *ctx, dt_parallel *p, int u, float *dst) {
    dt_copy(dst + G_off(p, u), p->pshard + p->sb[u], G_cnt(p, u) * sizeof(float));
    if (dt_par_G(p, u) == 1) return DT_OK;
    double t0 = dt_now(); /* (an expert's unit: within its EDP group) */
    DT_CHECK(dt_comm_allgatherv(ctx, p->comm, dt_par_group(p, u), dst, p->split_cnt + (size_t)u * p->G,
                                p->split_off + (size_t)u * p->G));
    p->t_total += dt_now() - t0;
    return DT_OK;
}

/* Matmul elements of unit u in [0, x) (x inside the unit). */
static size_t mm_before(const dt_parallel *p, int u, size_t x) {
    size_t n = 0;
    for (int r = p->run0[u]; r < p->run0[u + 1] && p->run_off[r] < x; r++) {
        size_t e = p->run_off[r] + p->run_len[r];
        n += (e < x ? e : x) - p->run_off[r];
    }
    return n;
}

static size_t mm_total(const dt_parallel *p, int u) { return mm_before(p, u, p->m->ps.unit_len[u]); }

dt_status dt_par_gather_unit_lp(dt_ctx *ctx, dt_parallel *p, int u, int w) {
    float *f = p->pwin[w];
    uint16_t *h = p->lpwin[w];
    const size_t G = (size_t)p->G, i = dt_par_ix(p, u);
    const size_t o = p->split_off[i], end = o + p->split_cnt[i];
    const float *src = p->pshard + p->sb[u] - o; /* src[x]: element x of the unit */
    /* Pack my piece [o, end): matmul values narrowed, the others copied. */
    size_t hp = p->mm_off[i], fp = p->nm_off[i], pos = o;
    for (int r = p->run0[u]; r < p->run0[u + 1] && pos < end; r++) {
        size_t a = p->run_off[r], b = a + p->run_len[r];
        if (b <= pos) continue;
        if (a > pos) { /* the other elements before the run */
            size_t e = a < end ? a : end;
            dt_copy(f + fp, src + pos, (e - pos) * sizeof(float));
            fp += e - pos;
            pos = e;
            if (pos == end) break;
        }
        size_t e = b < end ? b : end;
        dt_to_lowp(p->cfg.compute, h + hp, src + pos, e - pos);
        hp += e - pos;
        pos = e;
    }
    if (pos < end) dt_copy(f + fp, src + pos, (end - pos) * sizeof(float));
    const size_t len = p->m->ps.unit_len[u];
    size_t P = mm_total(p, u);
    if (dt_par_G(p, u) > 1) {
        double t0 = dt_now();
        const dt_group g = dt_par_group(p, u);
        const size_t *mc = p->mm_cnt + (size_t)u * G, *nc = p->nm_cnt + (size_t)u * G;
        if (P > 0) DT_CHECK(dt_comm_allgatherv_bf16(ctx, p->comm, g, h, mc, p->mm_off + (size_t)u * G));
        if (P < len) DT_CHECK(dt_comm_allgatherv(ctx, p->comm, g, f, nc, p->nm_off + (size_t)u * G));
        p->t_total += dt_now() - t0;
    }
    /* Unpack in place, back to front: run r's values sit at P - len_r (P: matmul elements up
     * to its end), the others after it at (run end) - P. */
    size_t tail = len;
    for (int r = p->run0[u + 1] - 1; r >= p->run0[u]; r--) {
        size_t a = p->run_off[r], l = p->run_len[r], b = a + l;
        if (tail > b && P > 0) dt_copy(f + b, f + b - P, (tail - b) * sizeof(float));
        P -= l;
        if (a > P) dt_copy(h + a, h + P, l * sizeof(uint16_t));
        tail = a;
    }
    return DT_OK;
}

/* Whether a need of unit u (DT_NEED_F32 in f32) gets the 16-bit form. */
static int wants_lp(const dt_parallel *p, int u, int f32) {
    return p->lp_gather && !f32 && p->run0[u + 1] > p->run0[u];
}

/* Window w will hold unit u (form lp): the unit it held loses its 16-bit pointer, and the
 * gather is queued. */
static void fill(dt_parallel *p, int w, int u, int lp) {
    int old = p->pwin_unit[w];
    if (old >= 0 && p->m->ps.unit_params_lp[old] == p->lpwin[w]) p->m->ps.unit_params_lp[old] = NULL;
    p->pwin_unit[w] = u;
    p->pwin_lp[w] = lp;
    p->pwin_task[w] = dt_par_submit(p, lp ? DT_TASK_GATHER_LP : DT_TASK_GATHER, u, w);
}

static int holds(const dt_parallel *p, int w, int u, int lp) { return p->pwin_unit[w] == u && p->pwin_lp[w] == lp; }

/* Starts gathering unit u (f32: in fp32) into the window the model is not reading, unless a
 * window holds it already. */
static void prefetch(dt_parallel *p, int u, int f32) {
    int lp = wants_lp(p, u, f32);
    if (!holds(p, 0, u, lp) && !holds(p, 1, u, lp)) fill(p, 1 - p->pw_cur, u, lp);
}

static void z_need(void *ud, int u, int next, int flags) {
    dt_parallel *p = ud;
    int lp = wants_lp(p, u, flags & DT_NEED_F32);
    int w = holds(p, 0, u, lp) ? 0 : holds(p, 1, u, lp) ? 1 : 1 - p->pw_cur;
    if (!holds(p, w, u, lp)) fill(p, w, u, lp);
    dt_par_wait(p, p->pwin_task[w]);
    p->m->ps.unit_params[u] = p->pwin[w];
    p->m->ps.unit_params_lp[u] = lp ? p->lpwin[w] : NULL;
    p->pw_cur = w;
    if (next >= 0 && next != u) prefetch(p, next, flags & DT_NEED_NEXT_F32);
}

/* The model's lookup hook (model.h): out's rows from vocabulary tensor id's rows that tokens
 * name, gathered by the lookup task (zero_lookup.c), while `next` is gathered after it. */
static int z_lookup(void *ud, int id, const int32_t *tokens, int N, int next, float *out) {
    dt_parallel *p = ud;
    if (N > p->cfg.tokens) return 0; /* more tokens than the buffers were sized for */
    p->lk_tokens = tokens;
    p->lk_n = N;
    p->lk_id = id;
    p->lk_out = out;
    long seq = dt_par_submit(p, DT_TASK_LOOKUP, p->m->ps.tensors[id].unit, N); /* traced by its first unit */
    if (next >= 0) prefetch(p, next, 0);
    dt_par_wait(p, seq);
    return 1; /* after a failure the task was skipped: the job is ending (dt_parallel reports it) */
}

void dt_par_params_stale(dt_parallel *p) {
    p->pwin_unit[0] = p->pwin_unit[1] = -1; /* units are gathered when next used */
    for (int u = 0; u < p->U; u++) p->m->ps.unit_params_lp[u] = NULL;
    dt_par_step_stale(p); /* the resident copies too (zero_step.c) */
}

/* The 16-bit gather layout: each unit's matmul runs, and per node-shard its matmul and
 * other elements (counts, and packed offsets: the elements of the kind before it). */
static dt_status plan_lp(dt_ctx *ctx, dt_parallel *p) {
    const dt_params *ps = &p->m->ps;
    size_t U = (size_t)p->U, G = (size_t)p->G, cap = (size_t)ps->n_tensors, nr = 0;
    p->run0 = calloc(U + 1, sizeof *p->run0);
    p->run_off = calloc(U * cap * 2 + 1, sizeof(size_t));
    p->mm_cnt = calloc(U * G * 4, sizeof(size_t));
    if (!p->run0 || !p->run_off || !p->mm_cnt) return dt_fail(ctx, DT_ERR_NOMEM, "parallel: out of memory");
    p->run_len = p->run_off + U * cap;
    p->mm_off = p->mm_cnt + U * G;
    p->nm_cnt = p->mm_off + U * G;
    p->nm_off = p->nm_cnt + U * G;
    for (size_t u = 0; u < U; u++) {
        p->run0[u] = (int)nr;
        nr += (size_t)dt_params_matmul_runs(ps, (int)u, p->run_off + nr, p->run_len + nr, (int)cap);
        p->run0[u + 1] = (int)nr;
        for (size_t g = 0; g < G; g++) {
            size_t k = u * G + g, lo = p->split_off[k], hi = lo + p->split_cnt[k];
            p->mm_off[k] = mm_before(p, (int)u, lo);
            p->mm_cnt[k] = mm_before(p, (int)u, hi) - p->mm_off[k];
            p->nm_off[k] = lo - p->mm_off[k];
            p->nm_cnt[k] = p->split_cnt[k] - p->mm_cnt[k];
        }
    }
    return DT_OK;
}

static dt_status get(dt_ctx *ctx, dt_parallel *p, size_t n, size_t esize, void **out) {
    if (n == 0) return DT_OK;
    return dt_alloc_get(ctx, p->alloc, DT_MEM_PARAMS, n * esize, out);
}

dt_status dt_par_params_init(dt_ctx *ctx, dt_parallel *p, uint64_t seed) {
    dt_model *m = p->m;
    DT_CHECK(get(ctx, p, p->S, sizeof(float), (void **)&p->pshard));
    for (int w = 0; w < 2 && !p->zg_step; w++) { /* gathers per step: no windows (zero_step.c) */
        DT_CHECK(get(ctx, p, p->z.max_unit, sizeof(float), (void **)&p->pwin[w]));
        DT_CHECK(get(ctx, p, p->z.lpwin, sizeof(uint16_t), (void **)&p->lpwin[w]));
    }
    p->lp_gather = p->z.lpwin > 0;
    if (p->lp_gather) DT_CHECK(plan_lp(ctx, p));
    p->pw_cur = 1;
    if (p->z.lk_bytes) { /* the vocabulary row lookup (zero_lookup.c), carved from one block */
        DT_CHECK(dt_alloc_get(ctx, p->alloc, DT_MEM_COMM, p->z.lk_bytes, &p->lk_block));
        p->lk_recv = p->lk_block;
        p->lk_mine = (int64_t *)(p->lk_recv + p->z.lk_rows * p->z.lk_cols);
        p->lk_all = p->lk_mine + p->z.lk_words;
        p->lk_pos = (size_t *)(p->lk_all + (size_t)p->G * p->z.lk_words);
        p->lk_ids = (int32_t *)(p->lk_pos + p->z.lk_rows * (size_t)p->G);
        m->hooks.lookup = z_lookup;
    }
    /* Each rank draws only its own shard (the counter RNG makes any range drawable). */
    for (int u = 0; u < p->U; u++)
        dt_params_init_range(&m->ps, seed, p->pshard + p->sb[u], m->ps.unit_lo[u] + G_off(p, u), G_cnt(p, u));
    for (int u = 0; u < p->U; u++) m->ps.unit_params[u] = NULL;
    dt_par_params_stale(p);
    m->hooks.need_params = z_need;
    return DT_OK;
}

void dt_par_params_free(dt_parallel *p) {
    for (int u = 0; u < p->U; u++) p->m->ps.unit_params_lp[u] = NULL; /* no dangling pointers */
    dt_alloc_put(p->alloc, DT_MEM_PARAMS, p->pshard, p->S * sizeof(float));
    for (int w = 0; w < 2 && !p->zg_step; w++) {
        dt_alloc_put(p->alloc, DT_MEM_PARAMS, p->pwin[w], p->z.max_unit * sizeof(float));
        dt_alloc_put(p->alloc, DT_MEM_PARAMS, p->lpwin[w], p->z.lpwin * sizeof(uint16_t));
    }
    dt_alloc_put(p->alloc, DT_MEM_COMM, p->lk_block, p->z.lk_bytes);
    free(p->run0);
    free(p->run_off);
    free(p->mm_cnt);
}
