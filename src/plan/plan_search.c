/* Layouts: enumeration over strategies x tp x pp (x cp x ep) and the recommendation (plan.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"
#include "plan/plan_impl.h"

void dt_plan_layout_name(const dt_plan_layout *l, char *buf, size_t n) {
    snprintf(buf, n, "%s%s dp%d tp%d pp%d cp%d ep%d", l->hybrid ? "hybrid-" : "", dt_strategy_name(l->zero), l->dp,
             l->tp, l->pp, l->cp, l->ep);
}

static int by_rank(const void *a, const void *b) {
    const dt_plan_result *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (x->step_s != y->step_s) return x->step_s < y->step_s ? -1 : 1;
    return x->mem_total < y->mem_total ? -1 : x->mem_total > y->mem_total;
}

dt_status dt_plan_search(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_fix *fix, dt_plan_result **out, int *n) {
    int cap = 256, cnt = 0, G = job->gpus;
    dt_plan_result *r = malloc(cap * sizeof *r);
    if (!r) return dt_fail(ctx, DT_ERR_NOMEM, "dtrain plan: out of memory");
    int nodes = (G + job->dpn - 1) / job->dpn;
    char first_err[sizeof ctx->err] = "";
    for (int tp = 1; tp <= G; tp++) {
        if (G % tp || (fix->tp ? tp != fix->tp : tp > job->dpn)) continue;
        for (int pp = 1; pp <= G / tp; pp++) {
            if ((G / tp) % pp || (fix->pp && pp != fix->pp)) continue;
            int cp = fix->cp ? fix->cp : 1;
            if ((G / tp / pp) % cp) continue;
            int dp = G / tp / pp / cp;
            int ep_max = fix->ep || job->model.experts ? dp : 1;
            for (int ep = 1; ep <= ep_max; ep++) {
                if (fix->ep ? ep != fix->ep : (ep > 1 && (!job->model.experts || dp % ep || job->model.experts % ep)))
                    continue;
                for (int z = DT_STRAT_DDP; z <= DT_STRAT_ZERO3; z++)
                    for (int h = 0; h <= 1; h++) {
                        if (fix->zero >= 0 && z != fix->zero) continue;
                        if (fix->hybrid >= 0 ? h != fix->hybrid : h && (z == DT_STRAT_DDP || nodes < 2)) continue;
                        if (dp == 1 && z != DT_STRAT_DDP && fix->zero < 0) continue; /* the same as DDP */
                        dt_plan_layout l = {dp, tp, pp, cp, ep, (dt_strategy)z, h};
                        if (h && fix->hybrid < 0 && dt_plan_shard_ranks(job, &l) == dp) continue; /* = not hybrid */
                        if (cnt == cap) {
                            dt_plan_result *nr = realloc(r, (size_t)(cap *= 2) * sizeof *r);
                            if (!nr) {
                                free(r);
                                return dt_fail(ctx, DT_ERR_NOMEM, "dtrain plan: out of memory");
                            }
                            r = nr;
                        }
                        if (dt_plan_predict(ctx, job, &l, &r[cnt]) == DT_OK) cnt++;
                        else if (!first_err[0]) memcpy(first_err, ctx->err, sizeof first_err);
                    }
            }
        }
    }
    if (cnt == 0) {
        free(r);
        if (first_err[0]) memcpy(ctx->err, first_err, sizeof first_err);
        return first_err[0] ? DT_ERR_CONFIG
                            : dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: no layout of %d devices matches the flags", G);
    }
    ctx->err[0] = 0;
    qsort(r, (size_t)cnt, sizeof *r, by_rank);
    *out = r, *n = cnt;
    return DT_OK;
}

void dt_plan_recommend(const dt_plan_result *r, int n, int *fastest, int *cheapest) {
    *fastest = *cheapest = -1;
    for (int i = 0; i < n; i++) {
        if (!r[i].fits) continue;
        if (*fastest < 0 || r[i].step_s < r[*fastest].step_s) *fastest = i;
        double c = r[i].usd_1b_tokens, cb = *cheapest >= 0 ? r[*cheapest].usd_1b_tokens : INFINITY;
        if (*cheapest < 0 || (isfinite(c) ? c < cb : (!isfinite(cb) && r[i].step_s < r[*cheapest].step_s)))
            *cheapest = i;
    }
}
