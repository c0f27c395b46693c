/* The pipeline in `dtrain bench` (parallel.pp > 1; ARCHITECTURE decision 77): every rank's
 * compute, transfers, busy and idle time per step gathered to rank 0, and the schedule
 * replay - the measured per-micro-batch forward and backward of each stage run through the
 * configured schedule's action lists (pp_schedule.h dt_pp_replay) - printed beside the
 * textbook bubble (p-1)/(m+p-1) and the measured idle fraction. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_json.h"

dt_status dt_bench_pp_gather(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm, dt_bench_suite *s) {
    dt_bench_pp *p = &s->pp;
    memset(p, 0, sizeof *p);
    p->n = 1;
    if (cfg->pp <= 1) return DT_OK;
    const int W = s->world, me = dt_comm_rank(comm, DT_GROUP_WORLD), R = s->opts.repeats;
    p->n = cfg->pp, p->kind = cfg->pp_kind, p->v = cfg->pp_virtual > 0 ? cfg->pp_virtual : 1, p->m = cfg->accum;
    p->rank = calloc((size_t)W * DT_BENCH_PP_N, sizeof *p->rank);
    p->f = calloc((size_t)p->n, sizeof *p->f);
    p->b = calloc((size_t)p->n, sizeof *p->b);
    p->w = calloc((size_t)p->n, sizeof *p->w);
    p->replay_idle = calloc((size_t)p->n, sizeof *p->replay_idle);
    if (!p->rank || !p->f || !p->b || !p->w || !p->replay_idle) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory");
    /* this rank's row: means per timed step over the repeats; every other row zero, then a sum */
    double *row = p->rank + (size_t)me * DT_BENCH_PP_N;
    const double steps = (double)R * s->opts.steps;
    for (int i = 0; i < R; i++) {
        const dt_bench_result *r = &s->runs[i];
        row[DT_BENCH_PP_STEP] += r->mean_s / R;
        row[DT_BENCH_PP_FWD] += r->fwd_s / steps;
        row[DT_BENCH_PP_BWD] += r->bwd_s / steps;
        row[DT_BENCH_PP_BUSY] += (r->fwd_s + r->bwd_s + r->opt_s + r->data_s) / steps;
        row[DT_BENCH_PP_IDLE] += r->pp_idle_s / R;
        row[DT_BENCH_PP_P2P] += r->pp_s / R;
        row[DT_BENCH_PP_BYTES] += r->pp_bytes_step / R;
        row[DT_BENCH_PP_SPAN] += r->pp_span_s / R;
        row[DT_BENCH_PP_WGRAD] += r->pp_wgrad_s / steps;
    }
    row[DT_BENCH_PP_STAGE] = s->runs[0].pp_stage;
    if (W > 1) DT_CHECK(dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, p->rank, (size_t)W * DT_BENCH_PP_N, DT_F64, DT_SUM));
    /* the replay's durations: each stage's mean over its ranks, per micro-batch */
    int *cnt = calloc((size_t)p->n, sizeof *cnt);
    if (!cnt) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory");
    /* the measured bubble as the textbook counts it: each rank's passes against the pipeline's
     * span (the longest rank's), so the last stage's idle tail (spent in the step's closing
     * collectives, not in a receive) counts */
    double measured = 0, span = 0;
    for (int r = 0; r < W; r++) {
        const double *x = p->rank + (size_t)r * DT_BENCH_PP_N;
        span = x[DT_BENCH_PP_SPAN] > span ? x[DT_BENCH_PP_SPAN] : span;
    }
    for (int r = 0; r < W; r++) {
        const double *x = p->rank + (size_t)r * DT_BENCH_PP_N;
        const int st = (int)x[DT_BENCH_PP_STAGE];
        if (st < 0 || st >= p->n) continue;
        /* one action: a micro-batch through one chunk (an interleaved stage runs v per micro-batch) */
        const double per = (double)p->m * (p->v > 1 ? p->v : 1);
        /* zb-h1: the backward's input-gradient (B) and weight-gradient (W) passes apart */
        p->f[st] += x[DT_BENCH_PP_FWD] / per, p->b[st] += (x[DT_BENCH_PP_BWD] - x[DT_BENCH_PP_WGRAD]) / per;
        p->w[st] += x[DT_BENCH_PP_WGRAD] / per, cnt[st]++;
        measured += span > 0 ? (1.0 - (x[DT_BENCH_PP_FWD] + x[DT_BENCH_PP_BWD]) / span) / W : 0;
    }
    for (int st = 0; st < p->n; st++)
        if (cnt[st]) p->f[st] /= cnt[st], p->b[st] /= cnt[st], p->w[st] /= cnt[st];
    free(cnt);
    p->measured_frac = measured;
    p->textbook_frac = (double)(p->n - 1) / (p->m + p->n - 1);
    double *idle = calloc((size_t)p->n, sizeof *idle);
    if (!idle) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory");
    p->replay_rc = dt_pp_replay((dt_pp_kind)p->kind, p->n, p->v, p->m, p->f, p->b, p->kind == DT_PP_ZBH1 ? p->w : NULL, 0.0,
                                &p->replay_makespan_s, idle);
    for (int st = 0; p->replay_rc == 0 && st < p->n; st++) {
        p->replay_idle[st] = p->replay_makespan_s > 0 ? idle[st] / p->replay_makespan_s : 0;
        p->replay_frac += p->replay_idle[st] / p->n;
    }
    free(idle);
    if (p->replay_rc != 0)
        return dt_fail(ctx, DT_ERR_INTERNAL, "bench: the %s schedule's replay failed (%d)",
                       dt_pp_kind_name((dt_pp_kind)p->kind), p->replay_rc);
    return DT_OK;
}

void dt_bench_pp_print(FILE *f, const dt_bench_suite *s) {
    const dt_bench_pp *p = &s->pp;
    if (p->n <= 1 || !p->rank) return;
    fprintf(f, "# pipeline: pp %d x tp %d x dp %d, schedule %s, %d micro-batches a step; per rank, ms per timed step "
               "(busy = forward + backward + optimizer + data; idle = waiting in receives for a neighbour: the "
               "bubble; p2p = the transfers, waits included; span = the schedule's passes)\n",
            p->n, s->tp, s->dp, dt_pp_kind_name((dt_pp_kind)p->kind), p->m);
    fprintf(f, "# %-5s %-5s %-10s %-10s %-10s %-10s %-10s %-10s %-12s %-10s %-8s\n", "rank", "stage", "step_ms",
            "fwd_ms", "bwd_ms", "busy_ms", "idle_ms", "p2p_ms", "p2p_MB", "span_ms", "idle_%");
    for (int r = 0; r < s->world; r++) {
        const double *x = p->rank + (size_t)r * DT_BENCH_PP_N;
        fprintf(f, "  %-5d %-5d %-10.3f %-10.3f %-10.3f %-10.3f %-10.3f %-10.3f %-12.6f %-10.3f %-8.1f\n", r,
                (int)x[DT_BENCH_PP_STAGE], x[DT_BENCH_PP_STEP] * 1e3, x[DT_BENCH_PP_FWD] * 1e3,
                x[DT_BENCH_PP_BWD] * 1e3, x[DT_BENCH_PP_BUSY] * 1e3, x[DT_BENCH_PP_IDLE] * 1e3,
                x[DT_BENCH_PP_P2P] * 1e3, x[DT_BENCH_PP_BYTES] / 1e6, x[DT_BENCH_PP_SPAN] * 1e3,
                x[DT_BENCH_PP_SPAN] > 0 ? 100 * x[DT_BENCH_PP_IDLE] / x[DT_BENCH_PP_SPAN] : 0.0);
    }
    fprintf(f, "# schedule replay (%s, transfers free) from the measured forward / backward of a micro-batch per stage (ms):",
            dt_pp_kind_name((dt_pp_kind)p->kind));
    for (int st = 0; st < p->n; st++) {
        fprintf(f, " %d: %.3f / %.3f", st, p->f[st] * 1e3, p->b[st] * 1e3);
        if (p->kind == DT_PP_ZBH1) fprintf(f, " / W %.3f", p->w[st] * 1e3);
    }
    fputc('\n', f);
    fprintf(f, "# pipeline idle fraction: replay %.1f%%, textbook (p-1)/(m+p-1) %.1f%%, measured %.1f%% (1 - passes / the longest span, "
               "mean over ranks); replayed span %.3f ms\n",
            100 * p->replay_frac, 100 * p->textbook_frac, 100 * p->measured_frac, p->replay_makespan_s * 1e3);
}

cJSON *dt_bench_pp_json(const dt_bench_suite *s) {
    const dt_bench_pp *p = &s->pp;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "pp", p->n);
    cJSON_AddStringToObject(o, "schedule", dt_pp_kind_name((dt_pp_kind)p->kind));
    cJSON_AddNumberToObject(o, "micro_batches", p->m);
    cJSON_AddNumberToObject(o, "virtual", p->v > 1 ? p->v : 1);
    static const char *const keys[DT_BENCH_PP_N] = {"stage", "step_s", "forward_s", "backward_s", "busy_s",
                                                    "idle_s", "p2p_s", "p2p_bytes", "span_s", "wgrad_s"};
    cJSON *rk = cJSON_AddArrayToObject(o, "ranks");
    for (int r = 0; r < s->world; r++) {
        const double *x = p->rank + (size_t)r * DT_BENCH_PP_N;
        cJSON *ro = cJSON_CreateObject();
        cJSON_AddNumberToObject(ro, "rank", r);
        for (int k = 0; k < DT_BENCH_PP_N; k++) cJSON_AddNumberToObject(ro, keys[k], x[k]);
        cJSON_AddNumberToObject(ro, "idle_fraction", x[DT_BENCH_PP_SPAN] > 0 ? x[DT_BENCH_PP_IDLE] / x[DT_BENCH_PP_SPAN] : 0);
        cJSON_AddItemToArray(rk, ro);
    }
    cJSON *rp = cJSON_AddObjectToObject(o, "replay");
    cJSON_AddItemToObject(rp, "forward_s", cJSON_CreateDoubleArray(p->f, p->n));
    cJSON_AddItemToObject(rp, "backward_s", cJSON_CreateDoubleArray(p->b, p->n));
    cJSON_AddItemToObject(rp, "wgrad_s", cJSON_CreateDoubleArray(p->w, p->n));
    cJSON_AddItemToObject(rp, "stage_idle_fraction", cJSON_CreateDoubleArray(p->replay_idle, p->n));
    cJSON_AddNumberToObject(rp, "span_s", p->replay_makespan_s);
    cJSON_AddNumberToObject(rp, "idle_fraction", p->replay_frac);
    cJSON_AddNumberToObject(rp, "textbook_idle_fraction", p->textbook_frac);
    cJSON_AddNumberToObject(rp, "measured_idle_fraction", p->measured_frac);
    return o;
}
