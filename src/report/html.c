/* The report page: inline CSS, recommendations, inline SVG charts and tables (see report.h).
 * Nothing is fetched: no script, no external stylesheet, font or image. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/sortcmp.h"
#include "report/report.h"
#include "report/svg.h"

static const char *const css =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;margin:0;background:#f6f7f9}"
    "main{max-width:1440px;margin:0 auto;padding:18px 28px}"
    "h1{font-size:22px;margin:8px 0 2px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd}"
    ".sub{color:#666;margin:0 0 8px}"
    ".charts{display:flex;flex-wrap:wrap;gap:16px}"
    "figure.chart{background:#fff;border:1px solid #e1e4e8;border-radius:6px;margin:0;padding:10px 12px;width:620px}"
    "figure.chart figcaption{font-weight:600;margin-bottom:4px}"
    "p.note{color:#777;font-style:italic;margin:4px 0}"
    ".chart-svg{display:block;font-size:12px}"
    ".chart-svg .grid{stroke:#eee}.chart-svg .frame{fill:none;stroke:#ccc}.chart-svg .axis{stroke:#999}"
    ".chart-svg .ref{stroke:#999;stroke-dasharray:4 4}.chart-svg .eb{fill:none;stroke-width:1.3}"
    ".chart-svg .tk{fill:#555;font-size:11px}.chart-svg .al{fill:#333;font-size:12px}"
    ".chart-svg .lg,.chart-svg .rl{fill:#333;font-size:12px}"
    ".tbl{overflow-x:auto}table{border-collapse:collapse;background:#fff;font-size:12.5px}"
    "th,td{border:1px solid #e1e4e8;padding:3px 7px;text-align:right;white-space:nowrap}"
    "th{background:#f0f2f5}td.l,th.l{text-align:left}code{font-size:12px}"
    "ul.recs{list-style:none;padding:0}ul.recs li{background:#fff;border:1px solid #e1e4e8;border-left:5px solid #999;"
    "border-radius:4px;margin:6px 0;padding:6px 10px}"
    "ul.recs li.recommend{border-left-color:#2e7d32}ul.recs li.warning{border-left-color:#c62828;background:#fff5f5}"
    "ul.recs li.info{border-left-color:#1565c0}ul.recs li.nodata{border-left-color:#aaa;color:#555}"
    ".tag{font-weight:600;margin-right:6px}";

static const char *const topic_names[DT_REP_TOPIC_N] = {"DDP vs ZeRO", "Bucket size", "Micro-batch vs accumulation",
                                                        "Loss check"};
static const char *const level_names[] = {"recommend", "info", "warning", "nodata"};

static void esc(FILE *f, const char *s) { dt_svg_escape(f, s ? s : "?"); }

static const char *strategy_color(const char *s, int i) {
    static const char *const names[] = {"ddp", "zero1", "zero2", "zero3"};
    for (int k = 0; k < 4; k++)
        if (s && !strcmp(s, names[k])) return dt_svg_color(k == 3 ? 2 : k == 2 ? 3 : k);
    return dt_svg_color(4 + i);
}

static double eff_weak(const dt_rep_train *t) { return isfinite(t->weak_eff) ? t->weak_eff : t->weak_calc; }
static double eff_strong(const dt_rep_train *t) { return isfinite(t->strong_eff) ? t->strong_eff : t->strong_calc; }

static void figure_open(FILE *f, const char *id, const char *title) {
    fprintf(f, "<figure class=\"chart\" id=\"chart-%s\"><figcaption>%s</figcaption>", id, title);
}

/* Closes a figure; when nothing was drawn, says why instead. */
static void figure_close(FILE *f, int marks, const char *why) {
    if (!marks) fprintf(f, "<p class=\"note\">No data: %s</p>", why);
    fputs("</figure>\n", f);
}

/* Distinct strategies in order of first appearance. */
static int strategies(const dt_report *r, const char **out, int max) {
    int n = 0;
    for (int i = 0; i < r->ntrain; i++) {
        int seen = 0;
        for (int k = 0; k < n; k++) seen |= !strcmp(out[k], r->train[i].strategy);
        if (!seen && n < max) out[n++] = r->train[i].strategy;
    }
    return n;
}

/* Sorts points by x (insertion sort: a handful of points), carrying y and err along. */
static void sort_xy(double *x, double *y, double *err, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) {
            double t = x[j];
            x[j] = x[j - 1];
            x[j - 1] = t;
            t = y[j];
            y[j] = y[j - 1];
            y[j - 1] = t;
            if (err) {
                t = err[j];
                err[j] = err[j - 1];
                err[j - 1] = t;
            }
        }
}

/* ---- charts ------------------------------------------------------------------------- */

static void chart_scaling(FILE *f, const dt_report *r) {
    const char *st[16];
    int ns = strategies(r, st, 16), n = r->ntrain ? r->ntrain : 1, dup = 0;
    double *x = calloc((size_t)(ns * n * 3 + 1), sizeof *x), *y = x + ns * n, *e = y + ns * n;
    dt_svg_series *s = calloc((size_t)(2 * ns + 1), sizeof *s);
    if (!x || !s) goto done;
    /* throughput: per strategy and world size, the fastest run (error bar: std) */
    for (int k = 0; k < ns; k++) {
        dt_svg_series *q = &s[k];
        *q = (dt_svg_series){st[k], strategy_color(st[k], k), 0, x + k * n, y + k * n, e + k * n, 0};
        for (int i = 0; i < r->ntrain; i++) {
            const dt_rep_train *t = &r->train[i];
            if (strcmp(t->strategy, st[k])) continue;
            int at = -1;
            for (int p = 0; p < q->n; p++)
                if (x[k * n + p] == t->world) at = p;
            if (at >= 0) {
                dup = 1;
                if (t->tokens_per_s.mean <= y[k * n + at]) continue;
            } else
                at = q->n++;
            x[k * n + at] = t->world;
            y[k * n + at] = t->tokens_per_s.mean;
            e[k * n + at] = t->tokens_per_s.std;
        }
    }
    for (int k = 0; k < ns; k++) sort_xy(x + k * n, y + k * n, e + k * n, s[k].n);
    dt_svg_axis xa = {.label = "ranks (world size)", .log2 = 1}, ya = {.label = "tokens/s (all ranks)", .from_zero = 1};
    figure_open(f, "throughput", "Throughput vs world size");
    int m = dt_svg_lines(f, &xa, &ya, s, ns, NAN);
    if (m && dup) fputs("<p class=\"note\">Several runs per strategy and world size: the fastest is shown.</p>", f);
    figure_close(f, m, "no training runs.");
    /* efficiency: weak (solid) and strong (dashed) per strategy, 100% at the 1-rank baseline */
    int nw = 0;
    double *ex = calloc((size_t)(2 * ns * (n + 1) + 1), sizeof *ex), *ey = calloc((size_t)(2 * ns * (n + 1) + 1), sizeof *ey);
    char (*names)[64] = calloc((size_t)(2 * ns + 1), sizeof *names);
    if (ex && ey && names)
        for (int k = 0; k < ns; k++)
            for (int strong = 0; strong < 2; strong++) {
                double *qx = ex + nw * (n + 1), *qy = ey + nw * (n + 1);
                int c = 0;
                for (int i = 0; i < r->ntrain; i++) {
                    const dt_rep_train *t = &r->train[i];
                    double v = strong ? eff_strong(t) : eff_weak(t);
                    if (strcmp(t->strategy, st[k]) || !isfinite(v) || t->world < 2) continue;
                    int at = -1; /* one point per world size: the best, as in the throughput chart */
                    for (int p = 0; p < c; p++)
                        if (qx[p] == t->world) at = p;
                    if (at >= 0) {
                        qy[at] = fmax(qy[at], v);
                        continue;
                    }
                    qx[c] = t->world;
                    qy[c++] = v;
                }
                if (!c) continue;
                qx[c] = 1; /* the baseline itself: 100% at one rank */
                qy[c++] = 1;
                sort_xy(qx, qy, NULL, c);
                snprintf(names[nw], sizeof names[nw], "%s %s", st[k], strong ? "strong" : "weak");
                s[nw] = (dt_svg_series){names[nw], strategy_color(st[k], k), c, qx, qy, NULL, strong};
                nw++;
            }
    dt_svg_axis ea = {.label = "scaling efficiency", .percent = 1};
    figure_open(f, "efficiency", "Scaling efficiency vs world size");
    m = nw ? dt_svg_lines(f, &xa, &ea, s, nw, 1.0) : 0;
    if (m)
        fputs("<p class=\"note\">throughput(N) / (N &#183; throughput(1)); weak: same per-rank batch, strong: same "
              "global batch (solid: weak, dashed: strong).</p>", f);
    figure_close(f, m, "needs runs at N &gt; 1 ranks and a 1-rank run equal except world size (or sweep "
                       "efficiencies in the files).");
    free(ex);
    free(ey);
    free(names);
done:
    free(x);
    free(s);
}

static void chart_breakdown(FILE *f, const dt_report *r) {
    int n = r->ntrain;
    const char **rows = calloc((size_t)n + 1, sizeof *rows);
    double *v = calloc((size_t)n * DT_REP_BD_N + 1, sizeof *v);
    int m = 0;
    figure_open(f, "breakdown", "Step-time breakdown (per step)");
    if (rows && v) {
        for (int i = 0; i < n; i++) {
            rows[i] = r->train[i].label;
            memcpy(v + i * DT_REP_BD_N, r->train[i].breakdown, sizeof r->train[i].breakdown);
        }
        dt_svg_axis a = {.label = "ms per step"};
        dt_svg_bars b = {n, DT_REP_BD_N, rows, dt_rep_breakdown_keys, v, NULL, NULL, &a, 1e3};
        m = dt_svg_stacked_bars(f, &b);
    }
    figure_close(f, m, "no run has a non-zero time breakdown.");
    free(rows);
    free(v);
}

static void chart_memory(FILE *f, const dt_report *r) {
    int n = 0;
    for (int i = 0; i < r->ntrain; i++) n += r->train[i].nmem;
    const char **rows = calloc((size_t)n + 1, sizeof *rows);
    char (*labels)[128] = calloc((size_t)n + 1, sizeof *labels);
    double *v = calloc((size_t)n * DT_REP_MEM_N + 1, sizeof *v), *rss = calloc((size_t)n + 1, sizeof *rss);
    int m = 0;
    figure_open(f, "memory", "Peak memory per rank by kind");
    if (rows && labels && v && rss) {
        int k = 0;
        for (int i = 0; i < r->ntrain; i++)
            for (int j = 0; j < r->train[i].nmem; j++, k++) {
                const dt_rep_mem *mm = &r->train[i].mem[j];
                snprintf(labels[k], sizeof labels[k], "%s r%d", r->train[i].label, mm->rank);
                rows[k] = labels[k];
                memcpy(v + k * DT_REP_MEM_N, mm->bytes, sizeof mm->bytes);
                rss[k] = mm->rss;
            }
        dt_svg_axis a = {.label = "bytes per rank", .bytes = 1};
        dt_svg_bars b = {n, DT_REP_MEM_N, rows, dt_rep_mem_keys, v, rss, "process RSS", &a, 1};
        m = dt_svg_stacked_bars(f, &b);
    }
    figure_close(f, m, "the files have no per-rank memory.");
    free(rows);
    free(labels);
    free(v);
    free(rss);
}

static void chart_loss(FILE *f, const dt_report *r) {
    int n = r->ntrain, maxl = 1;
    for (int i = 0; i < n; i++)
        if (r->train[i].nrep > 0 && r->train[i].rep[0].nloss > maxl) maxl = r->train[i].rep[0].nloss;
    double *x = calloc((size_t)maxl, sizeof *x);
    dt_svg_series *s = calloc((size_t)n + 1, sizeof *s);
    int m = 0, ns = 0;
    figure_open(f, "loss", "Loss curves (first repeat, measured steps)");
    if (x && s) {
        for (int k = 0; k < maxl; k++) x[k] = k + 1;
        for (int i = 0; i < n; i++) {
            const dt_rep_train *t = &r->train[i];
            if (t->nrep < 1 || t->rep[0].nloss < 1) continue;
            s[ns++] = (dt_svg_series){t->label, dt_svg_color(i), t->rep[0].nloss, x, t->rep[0].loss, NULL, i % 2};
        }
        dt_svg_axis xa = {.label = "measured step", .integer = 1}, ya = {.label = "loss"};
        m = dt_svg_lines(f, &xa, &ya, s, ns, NAN);
        if (m) fputs("<p class=\"note\">Runs that train identically overlap (odd runs dashed).</p>", f);
    }
    figure_close(f, m, "no run recorded per-step losses.");
    free(x);
    free(s);
}

/* A mixture of experts' expert load (ARCHITECTURE decision 86), one heat map per run that has
 * one: layers x experts, each cell the mean tokens per step / the layer's mean over its experts. */
static void chart_moe_load(FILE *f, const dt_report *r) {
    for (int i = 0; i < r->ntrain; i++) {
        const dt_rep_train *t = &r->train[i];
        if (!t->moe_load) continue;
        const int L = t->moe_layers, E = t->moe_experts;
        double *v = calloc((size_t)L * E, sizeof *v);
        if (!v) continue;
        for (int l = 0; l < L; l++) {
            double mean = 0;
            for (int e = 0; e < E; e++) mean += t->moe_load[(size_t)l * E + e] / E;
            for (int e = 0; e < E; e++) v[(size_t)l * E + e] = mean > 0 ? t->moe_load[(size_t)l * E + e] / mean : NAN;
        }
        char id[32], title[256];
        snprintf(id, sizeof id, "moe-load-%d", i);
        fprintf(f, "<figure class=\"chart\" id=\"chart-%s\"><figcaption>Expert load, ", id);
        esc(f, t->label);
        snprintf(title, sizeof title, ": tokens per expert / the layer's mean (mean over the timed steps; max/mean %.3f)",
                 t->moe_max_mean);
        fputs(title, f);
        fputs("</figcaption>", f);
        dt_svg_heat hm = {L, E, "layer", "expert", v, t->moe_load};
        figure_close(f, dt_svg_heatmap(f, &hm), "no layer routed any token.");
        free(v);
    }
}

static void chart_busbw(FILE *f, const dt_report *r) {
    int total = 0, wrong = 0;
    for (int c = 0; c < r->ncomm; c++) total += r->comm[c].nrows;
    double *x = calloc((size_t)total + 1, sizeof *x), *y = calloc((size_t)total + 1, sizeof *y);
    dt_svg_series *s = calloc((size_t)total + 1, sizeof *s);
    char (*names)[96] = calloc((size_t)total + 1, sizeof *names);
    int ns = 0, used = 0, m = 0;
    figure_open(f, "busbw", "Collective bus bandwidth vs message size");
    if (x && y && s && names) {
        for (int c = 0; c < r->ncomm; c++) {
            const dt_rep_comm *cm = &r->comm[c];
            for (int i = 0; i < cm->nrows; i++) {
                wrong += cm->rows[i].wrong != 0;
                int seen = 0;
                for (int p = 0; p < i; p++) seen |= !strcmp(cm->rows[p].op, cm->rows[i].op);
                if (seen) continue;
                /* a new op of this file: gather its rows */
                dt_svg_series *q = &s[ns];
                if (r->ncomm > 1)
                    snprintf(names[ns], sizeof names[ns], "%s (%d ranks, file %d)", cm->rows[i].op, cm->ranks, c + 1);
                else
                    snprintf(names[ns], sizeof names[ns], "%s (%d ranks)", cm->rows[i].op, cm->ranks);
                *q = (dt_svg_series){names[ns], dt_svg_color(ns), 0, x + used, y + used, NULL, 0};
                for (int p = i; p < cm->nrows; p++)
                    if (!strcmp(cm->rows[p].op, cm->rows[i].op)) {
                        x[used + q->n] = cm->rows[p].bytes;
                        y[used + q->n++] = cm->rows[p].busbw_gbs;
                    }
                used += q->n;
                ns++;
            }
        }
        dt_svg_axis xa = {.label = "message size", .log2 = 1, .bytes = 1}, ya = {.label = "busbw (GB/s)", .from_zero = 1};
        m = dt_svg_lines(f, &xa, &ya, s, ns, NAN);
        if (m) fputs("<p class=\"note\">busbw as nccl-tests defines it (all-reduce: algbw &#183; 2(n&#8722;1)/n).</p>", f);
        if (m && wrong) fprintf(f, "<p class=\"note\"><b>%d row(s) had wrong data.</b></p>", wrong);
    }
    figure_close(f, m, "no kind=comm result files (dtrain bench comm --json).");
    free(x);
    free(y);
    free(s);
    free(names);
}

/* ---- tables ------------------------------------------------------------------------- */

static void td_num(FILE *f, double v) {
    char b[32];
    dt_report_fmt_num(b, sizeof b, v);
    fprintf(f, "<td>%s</td>", b);
}

static void td_bytes(FILE *f, double v) {
    char b[32];
    dt_report_fmt_bytes(b, sizeof b, v);
    fprintf(f, "<td>%s</td>", b);
}

static void td_pct(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "<td>%.1f%%</td>", 100 * v);
    else
        fputs("<td>n/a</td>", f);
}

static void td_str(FILE *f, const char *s) {
    fputs("<td class=\"l\">", f);
    esc(f, s);
    fputs("</td>", f);
}

/* "dp 4"; "tp 2 x dp 2, sequence parallel"; "tp 2 (blocks test mode) x dp 1" */
static void layout_label(const dt_rep_train *t, char *b, size_t n) {
    if (t->tp <= 1) snprintf(b, n, "dp %d", t->dp);
    else
        snprintf(b, n, "tp %d%s x dp %d%s", t->tp, t->tp_blocks ? " (blocks test mode)" : "", t->dp,
                 t->sp ? ", sequence parallel" : "");
}

/* Tensor parallelism: each TP run's layout and its TP collectives per step (bench's
 * summary.tp_comm_s, all exposed, and tp_bytes_step), beside all of its communication. */
static void table_tp(FILE *f, const dt_report *r) {
    int any = 0;
    for (int i = 0; i < r->ntrain; i++) any += r->train[i].tp > 1;
    if (!any) return;
    fputs("<h2>Tensor parallelism</h2><div class=\"tbl\"><table id=\"tp\"><tr><th class=\"l\">run</th>"
          "<th class=\"l\">layout</th><th>TP ranks</th><th>DP ranks</th><th>sequence parallel</th>"
          "<th class=\"l\">ZeRO over dp</th><th>TP bytes/step (rank 0)</th><th>TP ms/step (exposed)</th>"
          "<th>TP share of step</th><th>all comm ms exposed / total</th><th>bytes/step, all collectives</th></tr>\n", f);
    for (int i = 0; i < r->ntrain; i++) {
        const dt_rep_train *t = &r->train[i];
        if (t->tp <= 1) continue;
        char b[96];
        fputs("<tr>", f);
        td_str(f, t->label);
        layout_label(t, b, sizeof b);
        td_str(f, b);
        fprintf(f, "<td>%d</td><td>%d</td><td>%s</td>", t->tp, t->dp, t->sp ? "on" : "off");
        td_str(f, !strcmp(t->strategy, "ddp") ? "none (ddp)" : t->strategy);
        td_bytes(f, t->tp_bytes_step);
        fprintf(f, "<td>%.3f</td>", 1e3 * t->tp_comm_s);
        td_pct(f, t->step_s.mean > 0 ? t->tp_comm_s / t->step_s.mean : NAN);
        fprintf(f, "<td>%.2f / %.2f</td>", 1e3 * t->comm_exposed_s, 1e3 * t->comm_total_s);
        td_bytes(f, t->comm_bytes_step);
        fputs("</tr>\n", f);
    }
    fputs("</table></div>\n<p class=\"sub\">TP collectives: the TP group's all-reduces and, with sequence "
          "parallelism, its all-gathers and reduce-scatters, on the compute thread (all exposed: it waits for them); "
          "bytes in ring accounting, as for all collectives (which include them). The share is of the mean step.</p>\n",
          f);
}

static void table_runs(FILE *f, const dt_report *r) {
    fputs("<h2>Runs</h2><div class=\"tbl\"><table id=\"runs\"><tr><th class=\"l\">run</th><th class=\"l\">file</th>"
          "<th class=\"l\">model</th><th>params</th><th>trainable params</th><th>ranks</th><th class=\"l\">layout</th>"
          "<th class=\"l\">strategy</th>"
          "<th class=\"l\">precision</th>"
          "<th>micro &#215; accum (global)</th><th>bucket</th><th>overlap</th><th>step ms mean &#177; std</th>"
          "<th>tokens/s</th><th>tokens/s/rank</th><th>samples/s (images)</th><th>TFLOP/s/rank</th><th>MFU</th><th>comm overhead</th>"
          "<th>comm ms exposed / total</th><th>weak eff</th><th>strong eff</th><th>peak mem (tracked)</th>"
          "<th>memory plan</th><th>peak RSS</th><th>loss final</th><th class=\"l\">loss hash</th></tr>\n", f);
    for (int i = 0; i < r->ntrain; i++) {
        const dt_rep_train *t = &r->train[i];
        char b[64];
        fputs("<tr>", f);
        td_str(f, t->label);
        const char *base = strrchr(t->file, '/');
        fputs("<td class=\"l\" title=\"", f);
        esc(f, t->file);
        fputs("\">", f);
        esc(f, base ? base + 1 : t->file);
        fputs("</td>", f);
        snprintf(b, sizeof b, "%s L%d d%d h%d T%d", t->preset, t->n_layer, t->d_model, t->n_head, t->seq_len);
        td_str(f, b);
        td_num(f, t->params);
        dt_report_fmt_num(b, sizeof b, t->trainable);
        fprintf(f, "<td>%s%s%s%s</td>", b, t->lora[0] ? " (" : "", t->lora, t->lora[0] ? ")" : "");
        fprintf(f, "<td>%d%s</td>", t->world, t->hybrid ? " hybrid" : "");
        layout_label(t, b, sizeof b);
        td_str(f, b);
        td_str(f, t->strategy);
        td_str(f, t->precision);
        fprintf(f, "<td>%d &#215; %d (%d)</td>", t->micro_batch, t->accum, t->global_batch);
        td_bytes(f, t->bucket_bytes);
        fprintf(f, "<td>%s</td>", t->overlap ? "on" : "off");
        fprintf(f, "<td title=\"min %.2f / median %.2f / max %.2f ms\">%.2f &#177; %.2f</td>", 1e3 * t->step_s.min,
                1e3 * t->step_s.median, 1e3 * t->step_s.max, 1e3 * t->step_s.mean, 1e3 * t->step_s.std);
        char m1[32], m2[32];
        dt_report_fmt_num(m1, sizeof m1, t->tokens_per_s.mean);
        dt_report_fmt_num(m2, sizeof m2, t->tokens_per_s.std);
        fprintf(f, "<td>%s &#177; %s</td>", m1, m2);
        td_num(f, t->tokens_per_s_rank.mean);
        dt_report_fmt_num(m1, sizeof m1, t->samples_per_s.mean);
        fprintf(f, "<td>%s%s</td>", m1, t->n_classes > 0 ? " images/s" : "");
        td_num(f, t->tflops_rank.mean);
        td_pct(f, t->mfu.mean);
        td_pct(f, t->comm_overhead);
        fprintf(f, "<td>%.2f / %.2f</td>", 1e3 * t->comm_exposed_s, 1e3 * t->comm_total_s);
        td_pct(f, isfinite(t->weak_eff) ? t->weak_eff : t->weak_calc);
        td_pct(f, isfinite(t->strong_eff) ? t->strong_eff : t->strong_calc);
        td_bytes(f, dt_report_peak_bytes(t, 0));
        if (dt_report_peak_plan(t) >= 0)
            td_bytes(f, dt_report_peak_plan(t));
        else
            fputs("<td>-</td>", f);
        td_bytes(f, dt_report_peak_rss(t));
        fprintf(f, "<td>%.4f</td>", t->loss_final);
        fprintf(f, "<td class=\"l\"><code>");
        esc(f, t->loss_hash);
        fputs("</code></td></tr>\n", f);
    }
    fputs("</table></div>\n", f);
    /* how MFU was computed, once per distinct formula/peak */
    for (int i = 0; i < r->ntrain; i++) {
        const dt_rep_train *t = &r->train[i];
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= r->train[j].peak_gflops == t->peak_gflops && !strcmp(r->train[j].mfu_formula ? r->train[j].mfu_formula : "",
                                                                        t->mfu_formula ? t->mfu_formula : "");
        if (seen) continue;
        fputs("<p class=\"sub\">MFU: <code>", f);
        esc(f, t->mfu_formula ? t->mfu_formula : "not given");
        fprintf(f, "</code>, %.4g FLOP/token, peak %.4g GFLOP/s per rank (", t->flops_per_token, t->peak_gflops);
        esc(f, t->peak_source ? t->peak_source : "source not given");
        fputs(").</p>\n", f);
    }
}

/* The trainer's straggler rule on each multi-rank run's compute time per rank. */
static void stragglers(FILE *f, const dt_report *r) {
    int runs = 0, found = 0;
    for (int i = 0; i < r->ntrain; i++) runs += r->train[i].ncompute > 1;
    if (!runs) return;
    fputs("<h2>Stragglers</h2><ul id=\"stragglers\">\n", f);
    for (int i = 0; i < r->ntrain; i++) {
        const dt_rep_train *t = &r->train[i];
        for (int k = 0; t->ncompute > 1 && k < t->ncompute; k++) {
            double med = dt_median_others(t->compute_ms, t->ncompute, k);
            if (med <= 0 || t->compute_ms[k] <= t->straggler_factor * med) continue;
            fputs("<li>", f);
            esc(f, t->label);
            fprintf(f, ": rank %d computes %.2f ms per step, %.1f&#215; the median of the other ranks (%.2f ms; "
                       "logging.straggler_factor %.2g)</li>\n", k, t->compute_ms[k], t->compute_ms[k] / med, med,
                    t->straggler_factor);
            found++;
        }
    }
    if (!found)
        fprintf(f, "<li>none: in each of the %d multi-rank run(s) every rank computes within its run's "
                   "logging.straggler_factor of the others' median</li>\n", runs);
    fputs("</ul>\n", f);
}

static void table_cost(FILE *f, const dt_report *r) {
    int any = 0;
    for (int i = 0; i < r->ntrain; i++) any += r->train[i].ncost;
    if (!any) return;
    fputs("<h2>Cost</h2><div class=\"tbl\"><table id=\"cost\"><tr><th class=\"l\">run</th><th class=\"l\">instance</th>"
          "<th>$/hour</th><th>spot $/hour</th><th>$ per 1K samples</th><th>$ per 1B tokens</th><th>hours to train</th>"
          "<th>$ to train</th><th>spot $ to train</th></tr>\n", f);
    for (int i = 0; i < r->ntrain; i++)
        for (int c = 0; c < r->train[i].ncost; c++) {
            const dt_rep_cost *x = &r->train[i].cost[c];
            fputs("<tr>", f);
            td_str(f, r->train[i].label);
            td_str(f, x->instance);
            const double v[] = {x->price_hour, x->spot_hour, x->usd_per_1k_samples, x->usd_per_1b_tokens,
                                x->hours_to_train, x->usd_to_train, x->spot_usd_to_train};
            for (size_t k = 0; k < sizeof v / sizeof *v; k++) td_num(f, v[k]);
            fputs("</tr>\n", f);
        }
    fputs("</table></div>\n", f);
}

/* ---- plans beside measured runs ------------------------------------------------------ */

static void plan_matches_chart(FILE *f, const dt_report *r, const dt_rep_plan_match *mt, int n) {
    static const char *const segs[] = {"compute", "recompute", "exposed communication", "pipeline bubble",
                                       "fixed overhead", "optimizer step"};
    const char **rows = calloc((size_t)n + 1, sizeof *rows);
    char (*labels)[160] = calloc((size_t)n + 1, sizeof *labels);
    double *v = calloc((size_t)n * 6 + 1, sizeof *v), *meas = calloc((size_t)n + 1, sizeof *meas);
    int marks = 0;
    figure_open(f, "plans", "Predicted step time (bars) and measured (diamond)");
    if (rows && labels && v && meas) {
        for (int i = 0; i < n; i++) {
            const dt_rep_plan_layout *l = &r->plan[mt[i].plan].lay[mt[i].layout];
            snprintf(labels[i], sizeof labels[i], "%s: %s", r->train[mt[i].train].label, l->layout);
            rows[i] = labels[i];
            const double c[6] = {l->compute_s, l->recompute_s, l->comm_exposed_s, l->bubble_s, l->overhead_s,
                                 l->optimizer_s};
            for (int k = 0; k < 6; k++) v[i * 6 + k] = isfinite(c[k]) ? c[k] : 0;
            meas[i] = r->train[mt[i].train].step_s.mean;
        }
        dt_svg_axis a = {.label = "ms per step", .from_zero = 1};
        dt_svg_bars b = {n, 6, rows, segs, v, meas, "measured step time", &a, 1000};
        marks = dt_svg_stacked_bars(f, &b);
    }
    figure_close(f, marks, "no measured run matches a plan layout.");
    free(rows);
    free(labels);
    free(v);
    free(meas);
}

static void td_err(FILE *f, double e) {
    if (isfinite(e))
        fprintf(f, "<td>%+.1f%%</td>", 100 * e);
    else
        fputs("<td>n/a</td>", f);
}

static void plan_matches_table(FILE *f, const dt_report *r, const dt_rep_plan_match *mt, int n) {
    fputs("<div class=\"tbl\"><table id=\"plan-vs-measured\"><tr><th class=\"l\">run</th><th class=\"l\">plan</th>"
          "<th class=\"l\">layout</th><th>step ms planned</th><th>step ms measured</th><th>step error</th>"
          "<th>tokens/s planned</th><th>tokens/s measured</th><th>memory planned</th><th>memory measured</th>"
          "<th>memory error</th></tr>\n", f);
    for (int i = 0; i < n; i++) {
        const dt_rep_train *t = &r->train[mt[i].train];
        const dt_rep_plan_layout *l = &r->plan[mt[i].plan].lay[mt[i].layout];
        fputs("<tr>", f);
        td_str(f, t->label);
        td_str(f, r->plan[mt[i].plan].file);
        td_str(f, l->layout);
        td_num(f, 1e3 * l->step_s);
        td_num(f, 1e3 * t->step_s.mean);
        td_err(f, mt[i].step_err);
        td_num(f, l->tokens_per_s);
        td_num(f, t->tokens_per_s.mean);
        td_bytes(f, l->mem_total);
        td_bytes(f, dt_report_peak_bytes(t, 0));
        td_err(f, mt[i].mem_err);
        fputs("</tr>\n", f);
    }
    fputs("</table></div>\n", f);
}

/* One plan file's layouts: the first 12, and any a measured run matches. */
static void plan_table(FILE *f, const dt_report *r, int p, const dt_rep_plan_match *mt, int n) {
    const dt_rep_plan *pl = &r->plan[p];
    char params[32], peak[32];
    dt_report_fmt_num(params, sizeof params, pl->params);
    dt_report_fmt_num(peak, sizeof peak, pl->peak_tflops);
    fputs("<p class=\"sub\">", f);
    esc(f, pl->file);
    fputs(": ", f);
    esc(f, pl->model);
    fprintf(f, " (%s parameters), micro-batch %d &#215; %d tokens, %d device(s) of ", params, pl->micro_batch,
            pl->seq_len, pl->gpus);
    esc(f, pl->hardware);
    fprintf(f, " (peak %s TFLOP/s), ", peak);
    esc(f, pl->precision);
    fputs(", checkpointing ", f);
    esc(f, pl->checkpointing);
    fprintf(f, "; efficiency factors: GEMM %.3g, intra-node link %.3g, inter-node link %.3g.</p>\n", pl->eff_gemm,
            pl->eff_intra, pl->eff_inter);
    fprintf(f, "<div class=\"tbl\"><table id=\"plan-%d\"><tr><th class=\"l\">layout</th><th>devices</th>"
               "<th>fits</th><th>memory/device</th><th>step ms</th><th>compute ms</th><th>recompute ms</th>"
               "<th>exposed comm ms</th><th>bubble ms</th><th>overhead ms</th><th>optimizer ms</th><th>tokens/s</th><th>TFLOP/s/device</th><th>MFU</th>"
               "<th>scaling eff</th><th>$ per 1K samples</th><th class=\"l\">note</th></tr>\n", p + 1);
    for (int k = 0; k < pl->nlay; k++) {
        const dt_rep_plan_layout *l = &pl->lay[k];
        int matched = 0;
        for (int i = 0; i < n; i++) matched |= mt[i].plan == p && mt[i].layout == k;
        if (k >= 12 && !matched && !l->fastest && !l->cheapest) continue;
        fputs("<tr>", f);
        td_str(f, l->layout);
        fprintf(f, "<td>%d</td><td>%s</td>", l->gpus, l->fits ? "yes" : "no");
        td_bytes(f, l->mem_total);
        const double ms[] = {l->step_s, l->compute_s, l->recompute_s, l->comm_exposed_s, l->bubble_s, l->overhead_s,
                             l->optimizer_s};
        for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) td_num(f, 1e3 * ms[i]);
        td_num(f, l->tokens_per_s);
        td_num(f, l->tflops_per_gpu);
        td_pct(f, l->mfu);
        td_pct(f, l->scaling_eff);
        if (isfinite(l->usd_per_1k_samples)) td_num(f, l->usd_per_1k_samples);
        else fputs("<td>-</td>", f);
        char note[96] = "";
        snprintf(note, sizeof note, "%s%s%s", l->fastest ? "fastest " : "", l->cheapest ? "cheapest " : "",
                 matched ? "measured" : "");
        td_str(f, note);
        fputs("</tr>\n", f);
    }
    fputs("</table></div>\n", f);
}

static void plans(FILE *f, const dt_report *r) {
    if (!r->nplan) return;
    int cap = r->ntrain > 0 ? r->ntrain : 1;
    dt_rep_plan_match *mt = calloc((size_t)cap, sizeof *mt);
    int n = mt ? dt_report_match_plans(r, mt, cap) : 0;
    fputs("<h2 id=\"plans\">Plans beside measured runs</h2>\n", f);
    fprintf(f, "<p class=\"sub\">%d plan file(s) (dtrain plan --json); %d measured run(s) match a planned layout "
               "(same model, sequence, micro-batch, accumulation, ranks, strategy and precision).</p>\n",
            r->nplan, n);
    if (n) {
        fputs("<div class=\"charts\">\n", f);
        plan_matches_chart(f, r, mt, n);
        fputs("</div>\n", f);
        plan_matches_table(f, r, mt, n);
    }
    for (int p = 0; p < r->nplan; p++) plan_table(f, r, p, mt, n);
    free(mt);
}

static void env_row(FILE *f, const char *file, const char *date, const char *ver, const dt_rep_env *e) {
    fputs("<tr>", f);
    td_str(f, file);
    td_str(f, date);
    td_str(f, ver);
    td_str(f, e->host);
    td_str(f, e->cpu_model);
    fprintf(f, "<td>%d</td><td>%d</td><td>%d</td><td>%d</td>", e->cores, e->threads, e->ranks, e->nodes);
    td_str(f, e->mpi);
    td_str(f, e->onednn);
    td_str(f, e->compiler);
    fputs("</tr>\n", f);
}

static void table_env(FILE *f, const dt_report *r) {
    fputs("<h2>Environment</h2><div class=\"tbl\"><table id=\"environment\"><tr><th class=\"l\">file</th>"
          "<th class=\"l\">date</th><th class=\"l\">dtrain</th><th class=\"l\">host</th><th class=\"l\">CPU</th>"
          "<th>cores</th><th>threads</th><th>ranks</th><th>nodes</th><th class=\"l\">MPI</th><th class=\"l\">oneDNN</th>"
          "<th class=\"l\">compiler</th></tr>\n", f);
    for (int i = 0; i < r->ntrain; i++)
        env_row(f, r->train[i].file, r->train[i].date, r->train[i].version, &r->train[i].env);
    for (int i = 0; i < r->ncomm; i++) env_row(f, r->comm[i].file, NULL, NULL, &r->comm[i].env);
    fputs("</table></div>\n", f);
    if (r->ntrain) {
        fputs("<details><summary>Command lines</summary><ul>", f);
        for (int i = 0; i < r->ntrain; i++) {
            fputs("<li>", f);
            esc(f, r->train[i].label);
            fputs(": <code>", f);
            esc(f, r->train[i].argv[0] ? r->train[i].argv : "(not recorded)");
            fputs("</code></li>", f);
        }
        fputs("</ul></details>\n", f);
    }
}

static void recommendations(FILE *f, const dt_report *r) {
    fputs("<h2>Recommendations</h2>\n<ul class=\"recs\" id=\"recommendations\">\n", f);
    if (!r->ntrain)
        fputs("<li class=\"nodata\"><span class=\"tag\">All topics:</span>no training runs (kind=train), so there is "
              "nothing to recommend.</li>\n", f);
    for (int i = 0; i < r->nrec; i++) {
        const dt_rep_rec *x = &r->rec[i];
        fprintf(f, "<li class=\"%s\"><span class=\"tag\">%s%s:</span>", level_names[x->level], topic_names[x->topic],
                x->level == DT_REP_WARNING ? " (warning)" : x->level == DT_REP_NODATA ? " (not enough data)" : "");
        esc(f, x->text);
        fputs("</li>\n", f);
    }
    fputs("</ul>\n", f);
}

void dt_report_html(FILE *f, const dt_report *r) {
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
               "<title>dtrain benchmark report</title><style>%s</style></head>\n<body><main>\n", css);
    fprintf(f, "<h1>dtrain benchmark report</h1><p class=\"sub\">%d training run(s), %d collective benchmark(s)",
            r->ntrain, r->ncomm);
    if (r->nplan) fprintf(f, ", %d plan(s)", r->nplan);
    if (r->ntrain) {
        fputs("; model ", f);
        esc(f, r->train[0].preset);
        char p[32];
        dt_report_fmt_num(p, sizeof p, r->train[0].params);
        fprintf(f, " (%s parameters)", p);
    }
    fputs(".</p>\n", f);
    recommendations(f, r);
    fputs("<h2>Charts</h2><div class=\"charts\">\n", f);
    chart_scaling(f, r);
    chart_breakdown(f, r);
    chart_memory(f, r);
    chart_loss(f, r);
    chart_busbw(f, r);
    chart_moe_load(f, r);
    fputs("</div>\n", f);
    if (r->ntrain) table_runs(f, r);
    table_tp(f, r);
    stragglers(f, r);
    plans(f, r);
    table_cost(f, r);
    table_env(f, r);
    fputs("</main></body></html>\n", f);
}

dt_status dt_report_write_html(dt_ctx *ctx, const dt_report *r, const char *path) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid()) >= (int)sizeof tmp)
        return dt_fail(ctx, DT_ERR_IO, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    dt_report_html(f, r);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        unlink(tmp);
        return dt_fail(ctx, DT_ERR_IO, "%s: write failed", path);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return dt_fail(ctx, DT_ERR_IO, "%s: cannot rename into place: %s", path, strerror(e));
    }
    return DT_OK;
}
