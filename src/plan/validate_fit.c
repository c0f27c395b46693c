/* `dtrain plan --validate`: one prediction, its flags, the GEMM-efficiency fit and its scores
 * (validate_impl.h). The fit reads only rows of split fit; held-out rows are scored, never fitted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/validate.h"
#include "plan/validate_impl.h"

#define GIB 1073741824.0

void dt_val_predict(dt_val_row *w, double eff) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    w->job.gemm_eff = eff;
    if (dt_plan_predict(&ctx, &w->job, &w->lay, &w->r) != DT_OK) return;
    double hw = (w->r.compute_s + w->r.recompute_s) / w->r.compute_s;
    w->pred_tflops = w->r.tflops_gpu * (w->hw_flops ? hw : 1.0);
}

double dt_val_rel(double pred, double rep) { return isfinite(rep) && rep > 0 ? (pred - rep) / rep : NAN; }

int dt_val_flags(const dt_val_row *w, char *buf, size_t n) {
    double peak = dt_hw_peak(w->job.hw, w->job.train.model_opts.compute), mem = w->job.hw->memory_bytes;
    int bad = 0;
    buf[0] = 0;
    /* what the GPUs must have executed: the claimed model FLOP/s plus the recompute the run's
     * checkpointing implies (unless the publisher counted it already) */
    double x = w->hw_flops || !(w->r.compute_s > 0) ? 1.0 : (w->r.compute_s + w->r.recompute_s) / w->r.compute_s;
    double hwt = w->rep_tflops * x;
    char how[96] = "";
    if (x > 1) snprintf(how, sizeof how, " x %.3g for %s recompute = %.4g", x, dt_recompute_name(w->job.train.model_opts.recompute), hwt);
    if (isfinite(hwt) && hwt > peak) {
        snprintf(buf, n, "IMPOSSIBLE: %.4g TFLOP/s per GPU (from %s)%s > peak %.4g (%.2f of peak)", w->rep_tflops,
                 w->rep_from, how, peak, hwt / peak);
        bad = 1;
    } else if (isfinite(hwt) && hwt > 0.8 * peak)
        snprintf(buf, n, "implausible: %.4g TFLOP/s per GPU (from %s)%s = %.2f of peak %.4g (above 0.8)", w->rep_tflops,
                 w->rep_from, how, hwt / peak, peak);
    size_t k = strlen(buf);
    if (w->r.mem_total > mem) {
        snprintf(buf + k, n - k, "%sCANNOT FIT: params %.1f + grads %.1f + optimizer %.1f + acts %.1f + comm %.1f = %.1f GiB > %.0f GiB",
                 k ? "; " : "", w->r.mem[DT_MEM_PARAMS] / GIB, w->r.mem[DT_MEM_GRADS] / GIB, w->r.mem[DT_MEM_OPTIM] / GIB,
                 w->r.mem[DT_MEM_ACTS] / GIB, w->r.mem[DT_MEM_COMM] / GIB, w->r.mem_total / GIB, mem / GIB);
        bad |= 2;
    }
    k = strlen(buf);
    if (isfinite(w->rep_mem) && w->rep_mem * 1e9 > mem * 1.0001 && w->rep_mem > mem / GIB) {
        snprintf(buf + k, n - k, "%sIMPOSSIBLE: reported %.4g GB > device %.4g GiB", k ? "; " : "", w->rep_mem, mem / GIB);
        bad = 1;
    }
    return bad;
}

int dt_val_scored(const dt_val_row *w) {
    char fl[512];
    return w->ok && isfinite(w->rep_tflops) && !(dt_val_flags(w, fl, sizeof fl) & 1);
}

void dt_val_fit(const dt_hw_catalog *cat, dt_val_row *rows, int n, int skip_src, double *eff) {
    double err[DT_VAL_MAX_ROWS];
    int *had = calloc((size_t)(cat->n_acc > 0 ? cat->n_acc : 1), sizeof *had); /* types fitted on rows */
    for (int a = 0; a < cat->n_acc; a++) {
        eff[a] = cat->acc[a].gemm_eff;
        double best = INFINITY;
        for (int step = 40; step <= 400; step++) { /* 0.1 to 1 in steps of 0.0025 */
            double e = step / 400.0;
            int k = 0;
            for (int i = 0; i < n; i++) {
                dt_val_row *w = &rows[i];
                if (w->heldout || w->src == skip_src || !w->ok || w->acc != a || !dt_val_scored(w)) continue;
                dt_val_predict(w, e);
                err[k++] = dt_val_rel(w->pred_tflops, w->rep_tflops);
            }
            if (k == 0) break;
            if (had) had[a] = 1;
            double med = dt_median_abs(err, k);
            if (med < best - 1e-12) best = med, eff[a] = e;
        }
    }
    /* a type without fitting rows whose catalog entry has the same compute as a fitted type
     * (same_compute_as: same die, clocks and peaks) takes that type's efficiency */
    for (int a = 0; had && a < cat->n_acc; a++) {
        int t = cat->acc[a].compute_twin;
        if (!had[a] && t >= 0 && had[t]) eff[a] = eff[t];
    }
    free(had);
}

int dt_val_twin_fitted(const dt_hw_catalog *cat, const dt_val_row *rows, int n, int a) {
    int t = cat->acc[a].compute_twin, own = 0, twin = 0;
    if (t < 0) return 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].heldout || !dt_val_scored(&rows[i])) continue;
        own |= rows[i].acc == a, twin |= rows[i].acc == t;
    }
    return !own && twin;
}

/* The median and worst of the first k errors (reordered). */
static dt_val_err summarise(double *err, int k) {
    dt_val_err s = {k, NAN, NAN};
    if (k == 0) return s;
    s.median = dt_median_abs(err, k); /* leaves |err| sorted ascending */
    s.worst = err[k - 1];
    return s;
}

dt_val_err dt_val_score(dt_val_row *rows, int n, const double *eff, int which) {
    double err[DT_VAL_MAX_ROWS];
    int k = 0;
    for (int i = 0; i < n; i++) {
        dt_val_row *w = &rows[i];
        if (w->heldout != which || !dt_val_scored(w)) continue;
        dt_val_predict(w, eff[w->acc]);
        err[k++] = dt_val_rel(w->pred_tflops, w->rep_tflops);
    }
    return summarise(err, k);
}

dt_val_err dt_val_loso(const dt_hw_catalog *cat, dt_val_row *rows, int n, int n_sources, int *n_src) {
    double err[DT_VAL_MAX_ROWS], *eff = malloc((size_t)(cat->n_acc > 0 ? cat->n_acc : 1) * sizeof *eff);
    int k = 0;
    *n_src = 0;
    for (int s = 0; eff && s < n_sources; s++) {
        int any = 0;
        for (int i = 0; i < n && !any; i++) any = rows[i].src == s && !rows[i].heldout && dt_val_scored(&rows[i]);
        if (!any) continue;
        dt_val_fit(cat, rows, n, s, eff);
        for (int i = 0; i < n; i++) {
            dt_val_row *w = &rows[i];
            if (w->src != s || w->heldout || !dt_val_scored(w)) continue;
            dt_val_predict(w, eff[w->acc]);
            err[k++] = dt_val_rel(w->pred_tflops, w->rep_tflops);
        }
        (*n_src)++;
    }
    free(eff);
    return summarise(err, k);
}
