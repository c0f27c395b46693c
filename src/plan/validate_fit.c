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

int dt_val_eff_init(dt_val_eff *e, const dt_hw_catalog *cat, int n_fw) {
    int na = cat->n_acc > 0 ? cat->n_acc : 1, nf = n_fw > 0 ? n_fw : 1;
    e->n_acc = cat->n_acc, e->n_fw = n_fw, e->fp8 = 1, e->fp8_rows = 0;
    e->acc = malloc((size_t)na * sizeof *e->acc), e->cls = malloc((size_t)na * nf * sizeof *e->cls);
    if (!e->acc || !e->cls) {
        dt_val_eff_free(e);
        return -1;
    }
    for (int a = 0; a < cat->n_acc; a++) e->acc[a] = cat->acc[a].gemm_eff;
    for (int i = 0; i < na * nf; i++) e->cls[i] = NAN;
    return 0;
}

void dt_val_eff_free(dt_val_eff *e) {
    free(e->acc), free(e->cls);
    e->acc = e->cls = NULL;
}

static double eff16(const dt_val_eff *e, const dt_val_row *w) {
    double c = w->fw >= 0 && w->fw < e->n_fw ? e->cls[w->acc * e->n_fw + w->fw] : NAN;
    return isnan(c) ? e->acc[w->acc] : c;
}

double dt_val_eff_of(const dt_val_eff *e, const dt_val_row *w) { return eff16(e, w) * (w->fp8 ? e->fp8 : 1.0); }

enum { ANY = -2 };

/* The grid value in [lo, hi] (steps of 0.0025) minimising the median |error| of the fitting
 * rows outside skip_src on accelerator a (ANY: every one) of framework fw (ANY: every one)
 * whose fp8 flag is fp8, each predicted at x (fp8: x times its 16-bit efficiency in e).
 * Returns the number of rows (0: none, *best untouched). */
static int grid(dt_val_row *rows, int n, int skip_src, int a, int fw, int fp8, const dt_val_eff *e, double lo,
                double hi, double *best) {
    double err[DT_VAL_MAX_ROWS], least = INFINITY;
    int k = 0;
    for (int step = (int)lround(lo * 400); step <= (int)lround(hi * 400); step++) {
        double x = step / 400.0;
        k = 0;
        for (int i = 0; i < n; i++) {
            dt_val_row *w = &rows[i];
            if (w->heldout || w->src == skip_src || !w->ok || w->fp8 != fp8 || !dt_val_scored(w)) continue;
            if ((a != ANY && w->acc != a) || (fw != ANY && w->fw != fw)) continue;
            dt_val_predict(w, fp8 ? eff16(e, w) * x : x);
            err[k++] = dt_val_rel(w->pred_tflops, w->rep_tflops);
        }
        if (k == 0) return 0;
        double med = dt_median_abs(err, k);
        if (med < least - 1e-12) least = med, *best = x;
    }
    return k;
}

void dt_val_fit(const dt_hw_catalog *cat, dt_val_row *rows, int n, int skip_src, dt_val_eff *e) {
    int *had = calloc((size_t)(cat->n_acc > 0 ? cat->n_acc : 1), sizeof *had); /* types fitted on rows */
    for (int a = 0; a < cat->n_acc; a++) {
        e->acc[a] = cat->acc[a].gemm_eff;
        int k = grid(rows, n, skip_src, a, ANY, 0, e, 0.1, 1.0, &e->acc[a]);
        if (had) had[a] = k > 0;
    }
    for (int a = 0; a < cat->n_acc; a++)
        for (int f = 0; f < e->n_fw; f++) {
            double *c = &e->cls[a * e->n_fw + f];
            *c = NAN;
            grid(rows, n, skip_src, a, f, 0, e, 0.1, 1.0, c);
        }
    /* a type without fitting rows whose catalog entry has the same compute as a fitted type
     * (same_compute_as: same die, clocks and peaks) takes that type's efficiencies, per framework too */
    for (int a = 0; had && a < cat->n_acc; a++) {
        int t = cat->acc[a].compute_twin;
        if (had[a] || t < 0 || !had[t]) continue;
        e->acc[a] = e->acc[t];
        for (int f = 0; f < e->n_fw; f++) e->cls[a * e->n_fw + f] = e->cls[t * e->n_fw + f];
    }
    free(had);
    e->fp8 = 1;
    e->fp8_rows = grid(rows, n, skip_src, ANY, ANY, 1, e, 0.1, 1.5, &e->fp8);
}

int dt_val_twin_fitted(const dt_hw_catalog *cat, const dt_val_row *rows, int n, int a) {
    int t = cat->acc[a].compute_twin, own = 0, twin = 0;
    if (t < 0) return 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].heldout || rows[i].fp8 || !dt_val_scored(&rows[i])) continue;
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

dt_val_err dt_val_score(dt_val_row *rows, int n, const dt_val_eff *e, int which) {
    double err[DT_VAL_MAX_ROWS];
    int k = 0;
    for (int i = 0; i < n; i++) {
        dt_val_row *w = &rows[i];
        if (w->heldout != which || !dt_val_scored(w)) continue;
        dt_val_predict(w, dt_val_eff_of(e, w));
        err[k++] = dt_val_rel(w->pred_tflops, w->rep_tflops);
    }
    return summarise(err, k);
}

dt_val_err dt_val_loso(const dt_hw_catalog *cat, dt_val_row *rows, int n, int n_sources, int n_fw, int *n_src) {
    double err[DT_VAL_MAX_ROWS];
    dt_val_eff e;
    int k = 0, ok = dt_val_eff_init(&e, cat, n_fw) == 0;
    *n_src = 0;
    for (int s = 0; ok && s < n_sources; s++) {
        int any = 0;
        for (int i = 0; i < n && !any; i++) any = rows[i].src == s && !rows[i].heldout && dt_val_scored(&rows[i]);
        if (!any) continue;
        dt_val_fit(cat, rows, n, s, &e);
        for (int i = 0; i < n; i++) {
            dt_val_row *w = &rows[i];
            if (w->src != s || w->heldout || !dt_val_scored(w)) continue;
            dt_val_predict(w, dt_val_eff_of(&e, w));
            err[k++] = dt_val_rel(w->pred_tflops, w->rep_tflops);
        }
        (*n_src)++;
    }
    if (ok) dt_val_eff_free(&e);
    return summarise(err, k);
}
