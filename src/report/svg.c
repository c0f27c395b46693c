/* Inline SVG charts and number formatting for the report (see svg.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "report/svg.h"

#define W 620       /* chart width in px */
#define PLOT_H 300  /* plot area height of line charts */
#define ML 70       /* margins: left (y tick labels), right, top, bottom (x labels) */
#define MR 20
#define MT 14
#define MB 46
#define ROW_H 22    /* stacked bar row */
#define CHAR_W 6.6  /* average glyph width at 12px, for layout */

static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1",
                                      "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"};

const char *dt_svg_color(int i) {
    int n = (int)(sizeof palette / sizeof *palette);
    return palette[((i % n) + n) % n];
}

/* ---- numbers ------------------------------------------------------------------------ */

/* x rounded to 3 significant digits, printed without trailing zeros. */
static void fmt3(char *buf, size_t n, double x) {
    int dec = 0;
    if (x != 0) dec = 2 - (int)floor(log10(fabs(x)));
    if (dec < 0) dec = 0;
    if (dec > 6) dec = 6;
    snprintf(buf, n, "%.*f", dec, x);
    if (strchr(buf, '.')) {
        char *e = buf + strlen(buf) - 1;
        while (*e == '0') *e-- = 0;
        if (*e == '.') *e = 0;
    }
    if (!strcmp(buf, "-0")) snprintf(buf, n, "0");
}

/* Rounds |v| to 3 significant digits. */
static double round3(double v) {
    if (v == 0 || !isfinite(v)) return v;
    double p = pow(10, 2 - floor(log10(fabs(v))));
    return round(v * p) / p;
}

void dt_report_fmt_num(char *buf, size_t n, double v) {
    static const char *const si[] = {"", "k", "M", "G", "T", "P"};
    if (!isfinite(v)) {
        snprintf(buf, n, "n/a");
        return;
    }
    if (v != 0 && fabs(v) < 1e-3) {
        snprintf(buf, n, "%.2e", v);
        return;
    }
    int k = 0;
    double x = round3(v);
    while (fabs(x) >= 1000 && k < 5) {
        x = round3(v / pow(1000, ++k));
    }
    char num[32];
    fmt3(num, sizeof num, x);
    snprintf(buf, n, "%s%s", num, si[k]);
}

void dt_report_fmt_bytes(char *buf, size_t n, double v) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (!isfinite(v)) {
        snprintf(buf, n, "n/a");
        return;
    }
    int k = 0;
    double x = v;
    while (fabs(round3(x)) >= 1000 && k < 5) x = v / pow(1024, ++k);
    char num[32];
    if (k == 0)
        snprintf(num, sizeof num, "%.0f", v);
    else
        fmt3(num, sizeof num, round3(x));
    snprintf(buf, n, "%s %s", num, unit[k]);
}

/* ---- ticks -------------------------------------------------------------------------- */

/* A "nice" step near x: nf (1, 2, 2.5, 5 or 10) times 10^e. */
static void nice(double x, int *e, double *nf) {
    *e = (int)floor(log10(x));
    double f = x / pow(10, *e);
    *nf = f < 1.5 ? 1 : f < 2.25 ? 2 : f < 3.5 ? 2.5 : f < 7.5 ? 5 : 10;
}

int dt_svg_ticks(double lo, double hi, int target, double *t, int max) {
    if (!isfinite(lo) || !isfinite(hi) || max < 2) return 0;
    if (hi < lo) {
        double s = lo;
        lo = hi;
        hi = s;
    }
    if (hi == lo) { /* widen a single value */
        double d = lo == 0 ? 1 : fabs(lo) * 0.1;
        lo -= d;
        hi += d;
    }
    if (target < 2) target = 2;
    int e;
    double nf;
    nice((hi - lo) / (target - 1), &e, &nf);
    double step = nf * pow(10, e);
    long long k0 = (long long)floor(lo / step + 1e-9), k1 = (long long)ceil(hi / step - 1e-9);
    int n = 0;
    for (long long k = k0; k <= k1 && n < max; k++) /* k*nf / 10^-e is exact where k*step is not (0.1*3) */
        t[n++] = e < 0 ? (double)k * nf / pow(10, -e) : (double)k * nf * pow(10, e);
    return n;
}

int dt_svg_ticks_log2(double lo, double hi, int target, double *t, int max) {
    if (!(lo > 0) || !(hi > 0) || !isfinite(lo) || !isfinite(hi) || max < 1) return 0;
    if (hi < lo) {
        double s = lo;
        lo = hi;
        hi = s;
    }
    int e0 = (int)floor(log2(lo) + 1e-9), e1 = (int)ceil(log2(hi) - 1e-9);
    if (e1 == e0) e1++;
    if (target < 2) target = 2;
    int stride = 1;
    while ((e1 - e0) / stride + 1 > target) stride++;
    e0 = (int)floor((double)e0 / stride) * stride; /* ticks on multiples of the stride */
    int n = 0;
    for (int e = e0; n < max; e += stride) {
        t[n++] = ldexp(1.0, e);
        if (e >= e1) break;
    }
    return n;
}

/* A value on axis a (tooltips and bar values): 3 significant digits. */
static void tick_label(char *buf, size_t n, const dt_svg_axis *a, double v) {
    if (v == 0)
        snprintf(buf, n, "0");
    else if (a->bytes)
        dt_report_fmt_bytes(buf, n, v);
    else if (a->percent) {
        char x[32];
        dt_report_fmt_num(x, sizeof x, 100 * v);
        snprintf(buf, n, "%s%%", x);
    } else
        dt_report_fmt_num(buf, n, v);
}

/* Decimals that print every multiple of step exactly (step 0.25 -> 2). */
static int step_decimals(double step) {
    for (int d = 0; d < 6; d++) {
        double x = step * pow(10, d);
        if (fabs(x - round(x)) < 1e-6 * fmax(1, x)) return d;
    }
    return 6;
}

/* Tick labels of one linear axis: one unit (k, M, KiB, ...) for all, and as many decimals as
 * the step needs, so that neighbouring ticks never print alike (5.555 vs 5.56). */
static void tick_labels(char (*out)[48], const dt_svg_axis *a, const double *t, int nt) {
    static const char *const si[] = {"", "k", "M", "G", "T"}, *const bu[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double big = 0, step = nt > 1 ? t[1] - t[0] : 1, mul = a->percent ? 100 : 1, base = a->bytes ? 1024 : 1000;
    for (int i = 0; i < nt; i++) big = fmax(big, fabs(t[i] * mul));
    int k = 0;
    while (k < 4 && big / pow(base, k) >= (a->bytes ? 1024 : 10000)) k++;
    double u = pow(base, k);
    int dec = step_decimals(step * mul / u);
    for (int i = 0; i < nt; i++) {
        if (t[i] == 0) {
            snprintf(out[i], 48, "0");
            continue;
        }
        snprintf(out[i], 48, "%.*f%s%s%s", dec, t[i] * mul / u, a->bytes ? " " : "", a->bytes ? bu[k] : si[k],
                 a->percent ? "%" : "");
    }
}

/* Tick labels of a log2 axis: each value on its own. */
static void log_labels(char (*out)[48], const dt_svg_axis *a, const double *t, int nt) {
    for (int i = 0; i < nt; i++) tick_label(out[i], 48, a, t[i]);
}

void dt_svg_escape(FILE *f, const char *s) {
    for (; s && *s; s++) switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
}

/* ---- scales ------------------------------------------------------------------------- */

typedef struct scale {
    int log2;
    double lo, hi;   /* data range after ticks */
    double p0, p1;   /* pixel range */
    double ticks[32];
    int nt;
} scale;

static void scale_init(scale *s, const dt_svg_axis *a, double lo, double hi, double p0, double p1, int target) {
    s->log2 = a->log2;
    s->p0 = p0;
    s->p1 = p1;
    if (a->from_zero && !a->log2) {
        if (lo > 0) lo = 0;
        if (hi < 0) hi = 0;
    }
    if (a->log2) {
        s->nt = dt_svg_ticks_log2(lo, hi, target, s->ticks, 32);
    } else {
        /* bytes: nice steps of KiB/MiB/GiB; integers: a step of at least 1 */
        double u = 1;
        if (a->bytes)
            while (fmax(fabs(lo), fabs(hi)) / u >= 1024) u *= 1024;
        s->nt = dt_svg_ticks(lo / u, hi / u, target, s->ticks, 32);
        if (a->integer && s->nt > 1 && s->ticks[1] - s->ticks[0] < 1) {
            s->nt = 0;
            for (double v = floor(lo); v <= ceil(hi) && s->nt < 32; v++) s->ticks[s->nt++] = v;
            if (s->nt < 2) s->ticks[s->nt++] = s->ticks[0] + 1;
        }
        for (int i = 0; i < s->nt; i++) s->ticks[i] *= u;
    }
    s->lo = s->ticks[0];
    s->hi = s->ticks[s->nt - 1];
    if (a->log2 && s->hi <= s->lo) s->hi = s->lo * 2;
}

static double scale_at(const scale *s, double v) {
    double f = s->log2 ? (log2(v) - log2(s->lo)) / (log2(s->hi) - log2(s->lo)) : (v - s->lo) / (s->hi - s->lo);
    return s->p0 + f * (s->p1 - s->p0);
}

static int usable(const dt_svg_axis *a, double v) { return isfinite(v) && (!a->log2 || v > 0); }

/* ---- legend ------------------------------------------------------------------------- */

typedef struct legend_item {
    const char *name, *color;
    int dashed, kind; /* 0 line, 1 box, 2 diamond */
} legend_item;

static double text_w(const char *s) { return CHAR_W * (double)strlen(s ? s : ""); }

/* Height the legend needs at width w. */
static double legend_h(const legend_item *it, int n, double w) {
    double x = 0, rows = n ? 1 : 0;
    for (int i = 0; i < n; i++) {
        double iw = 28 + text_w(it[i].name) + 14;
        if (x > 0 && x + iw > w) {
            rows++;
            x = 0;
        }
        x += iw;
    }
    return rows * 18;
}

static void legend(FILE *f, const legend_item *it, int n, double x0, double y0, double w) {
    double x = 0, y = y0;
    for (int i = 0; i < n; i++) {
        double iw = 28 + text_w(it[i].name) + 14;
        if (x > 0 && x + iw > w) {
            y += 18;
            x = 0;
        }
        double lx = x0 + x, ly = y + 9;
        if (it[i].kind == 0)
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>",
                    lx, ly, lx + 22, ly, it[i].color, it[i].dashed ? " stroke-dasharray=\"5 3\"" : "");
        else if (it[i].kind == 1)
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"11\" fill=\"%s\"/>", lx + 3, ly - 5.5,
                    it[i].color);
        else
            fprintf(f, "<path d=\"M%.1f %.1fl5 5l-5 5l-5 -5z\" fill=\"%s\"/>", lx + 11, ly - 5, it[i].color);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"lg\">", lx + 28, ly + 4);
        dt_svg_escape(f, it[i].name);
        fputs("</text>", f);
        x += iw;
    }
}

/* ---- line chart ------------------------------------------------------------------- */

static void open_svg(FILE *f, double h, int marks) {
    fprintf(f, "<svg class=\"chart-svg\" viewBox=\"0 0 %d %.0f\" width=\"%d\" height=\"%.0f\" role=\"img\" "
               "data-marks=\"%d\">", W, h, W, h, marks);
}

int dt_svg_lines(FILE *f, const dt_svg_axis *xa, const dt_svg_axis *ya, const dt_svg_series *s, int ns,
                 double hline) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    int marks = 0;
    for (int i = 0; i < ns; i++)
        for (int k = 0; k < s[i].n; k++) {
            double x = s[i].x[k], y = s[i].y[k], e = s[i].err && isfinite(s[i].err[k]) ? s[i].err[k] : 0;
            if (!usable(xa, x) || !usable(ya, y)) continue;
            marks++;
            xlo = fmin(xlo, x);
            xhi = fmax(xhi, x);
            ylo = fmin(ylo, y - e);
            yhi = fmax(yhi, y + e);
        }
    if (!marks) return 0;
    if (isfinite(hline)) {
        ylo = fmin(ylo, hline);
        yhi = fmax(yhi, hline);
    }
    legend_item *it = calloc((size_t)ns + 1, sizeof *it);
    if (!it) return 0;
    for (int i = 0; i < ns; i++) it[i] = (legend_item){s[i].name, s[i].color ? s[i].color : dt_svg_color(i), s[i].dashed, 0};
    double lh = legend_h(it, ns, W - ML - MR);
    double top = MT + lh + 6, h = top + PLOT_H + MB;
    scale sx, sy;
    scale_init(&sx, xa, xlo, xhi, ML + 10, W - MR - 10, 8);
    scale_init(&sy, ya, ylo, yhi, top + PLOT_H, top, 6);
    open_svg(f, h, marks);
    legend(f, it, ns, ML, MT, W - ML - MR);
    free(it);
    char lab[32][48];
    /* grid, ticks and axis labels */
    (ya->log2 ? log_labels : tick_labels)(lab, ya, sy.ticks, sy.nt);
    for (int i = 0; i < sy.nt; i++) {
        double y = scale_at(&sy, sy.ticks[i]);
        fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>", ML, y, W - MR, y);
        fprintf(f, "<text class=\"tk\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>", ML - 6, y + 4, lab[i]);
    }
    (xa->log2 ? log_labels : tick_labels)(lab, xa, sx.ticks, sx.nt);
    for (int i = 0; i < sx.nt; i++) {
        double x = scale_at(&sx, sx.ticks[i]);
        fprintf(f, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, top, x, top + PLOT_H);
        fprintf(f, "<text class=\"tk\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", x, top + PLOT_H + 16,
                lab[i]);
    }
    fprintf(f, "<rect class=\"frame\" x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%d\"/>", ML, top, W - ML - MR, PLOT_H);
    fprintf(f, "<text class=\"al\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (ML + W - MR) / 2.0, h - 8);
    dt_svg_escape(f, xa->label);
    fprintf(f, "</text><text class=\"al\" transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\">",
            top + PLOT_H / 2.0);
    dt_svg_escape(f, ya->label);
    fputs("</text>", f);
    if (isfinite(hline)) {
        double y = scale_at(&sy, hline);
        fprintf(f, "<line class=\"ref\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>", ML, y, W - MR, y);
    }
    /* series: line, error bars, markers (with a tooltip) */
    for (int i = 0; i < ns; i++) {
        const char *col = s[i].color ? s[i].color : dt_svg_color(i);
        int started = 0, pts = 0;
        for (int k = 0; k < s[i].n; k++) pts += usable(xa, s[i].x[k]) && usable(ya, s[i].y[k]);
        if (pts > 1) {
            fprintf(f, "<path class=\"ln\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s d=\"", col,
                    s[i].dashed ? " stroke-dasharray=\"6 4\"" : "");
            for (int k = 0; k < s[i].n; k++) {
                if (!usable(xa, s[i].x[k]) || !usable(ya, s[i].y[k])) continue;
                fprintf(f, "%s%.1f %.1f", started ? " L" : "M", scale_at(&sx, s[i].x[k]), scale_at(&sy, s[i].y[k]));
                started = 1;
            }
            fputs("\"/>", f);
        }
        double r = s[i].n > 60 ? 1.6 : 3.5; /* dense series (loss curves): small dots */
        for (int k = 0; k < s[i].n; k++) {
            double x = s[i].x[k], y = s[i].y[k];
            if (!usable(xa, x) || !usable(ya, y)) continue;
            double px = scale_at(&sx, x), py = scale_at(&sy, y);
            if (s[i].err && isfinite(s[i].err[k]) && s[i].err[k] > 0) {
                double y0 = scale_at(&sy, y - s[i].err[k]), y1 = scale_at(&sy, y + s[i].err[k]);
                fprintf(f, "<path class=\"eb\" stroke=\"%s\" d=\"M%.1f %.1fV%.1fM%.1f %.1fh8M%.1f %.1fh8\"/>", col, px,
                        y0, y1, px - 4, y0, px - 4, y1);
            }
            char xl[48], yl[48];
            tick_label(xl, sizeof xl, xa, x);
            tick_label(yl, sizeof yl, ya, y);
            fprintf(f, "<circle class=\"mark\" cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"><title>", px, py, r, col);
            dt_svg_escape(f, s[i].name);
            fprintf(f, ": %s = %s, %s = %s</title></circle>", xa->label, xl, ya->label, yl);
        }
    }
    fputs("</svg>", f);
    return marks;
}

/* ---- stacked bars ---------------------------------------------------------------- */

int dt_svg_stacked_bars(FILE *f, const dt_svg_bars *b) {
    double sc = b->scale != 0 ? b->scale : 1, hi = 0;
    int marks = 0;
    for (int r = 0; r < b->nrows; r++) {
        double sum = 0;
        for (int k = 0; k < b->nseg; k++) {
            double v = b->v[r * b->nseg + k] * sc;
            if (isfinite(v) && v > 0) {
                sum += v;
                marks++;
            }
        }
        hi = fmax(hi, sum);
        if (b->marker && isfinite(b->marker[r]) && b->marker[r] > 0) {
            hi = fmax(hi, b->marker[r] * sc);
            marks++;
        }
    }
    if (!marks || !(hi > 0)) return 0;
    double lw = 0;
    for (int r = 0; r < b->nrows; r++) lw = fmax(lw, text_w(b->rows[r]));
    lw = fmin(lw + 12, 280);
    legend_item it[16];
    int ni = 0;
    for (int k = 0; k < b->nseg && ni < 15; k++) it[ni++] = (legend_item){b->segs[k], dt_svg_color(k), 0, 1};
    if (b->marker && b->marker_name) it[ni++] = (legend_item){b->marker_name, "#222", 0, 2};
    double x0 = lw + 8, x1 = W - MR, lh = legend_h(it, ni, W - x0 - MR);
    double top = MT + lh + 8, ph = b->nrows * ROW_H, h = top + ph + MB;
    scale sx;
    scale_init(&sx, b->axis, 0, hi, x0, x1, b->axis->bytes ? 5 : 7);
    open_svg(f, h, marks);
    legend(f, it, ni, x0, MT, W - x0 - MR);
    char ticks[32][48], lab[48];
    tick_labels(ticks, b->axis, sx.ticks, sx.nt);
    for (int i = 0; i < sx.nt; i++) {
        double x = scale_at(&sx, sx.ticks[i]);
        fprintf(f, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, top, x, top + ph);
        fprintf(f, "<text class=\"tk\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", x, top + ph + 16,
                ticks[i]);
    }
    fprintf(f, "<text class=\"al\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (x0 + x1) / 2, h - 8);
    dt_svg_escape(f, b->axis->label);
    fputs("</text>", f);
    for (int r = 0; r < b->nrows; r++) {
        double y = top + r * ROW_H, acc = 0;
        fprintf(f, "<text class=\"rl\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", lw, y + ROW_H / 2.0 + 4);
        dt_svg_escape(f, b->rows[r]);
        fputs("</text>", f);
        for (int k = 0; k < b->nseg; k++) {
            double v = b->v[r * b->nseg + k] * sc;
            if (!(isfinite(v) && v > 0)) continue;
            double xa = scale_at(&sx, acc), xb = scale_at(&sx, acc + v);
            acc += v;
            tick_label(lab, sizeof lab, b->axis, v);
            fprintf(f, "<rect class=\"mark\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>",
                    xa, y + 3, fmax(xb - xa, 0.5), ROW_H - 6, dt_svg_color(k));
            dt_svg_escape(f, b->rows[r]);
            fputs(" - ", f);
            dt_svg_escape(f, b->segs[k]);
            fprintf(f, ": %s</title></rect>", lab);
        }
        if (b->marker && isfinite(b->marker[r]) && b->marker[r] > 0) {
            double x = scale_at(&sx, b->marker[r] * sc), yc = y + ROW_H / 2.0;
            tick_label(lab, sizeof lab, b->axis, b->marker[r] * sc);
            fprintf(f, "<path class=\"mark marker\" d=\"M%.1f %.1fl6 6l-6 6l-6 -6z\" fill=\"#222\"><title>", x, yc - 6);
            dt_svg_escape(f, b->rows[r]);
            fprintf(f, " - %s: %s</title></path>", b->marker_name ? b->marker_name : "marker", lab);
        }
    }
    fprintf(f, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x0, top, x0, top + ph);
    fputs("</svg>", f);
    return marks;
}

/* ---- heat map ---------------------------------------------------------------------- */

/* White at 1, towards red above (2 and more: full), towards blue below (0: full). */
static void heat_color(double v, char *buf, size_t n) {
    double t = v >= 1 ? fmin(v - 1, 1) : fmin(1 - v, 1);
    int dim = (int)(255 - 200 * t + 0.5);
    if (v >= 1) snprintf(buf, n, "#ff%02x%02x", dim, dim);
    else snprintf(buf, n, "#%02x%02xff", dim, dim);
}

int dt_svg_heatmap(FILE *f, const dt_svg_heat *hm) {
    int marks = 0;
    for (int i = 0; i < hm->nrows * hm->ncols; i++) marks += isfinite(hm->v[i]);
    if (!marks || hm->nrows < 1 || hm->ncols < 1) return 0;
    const double lw = fmax(text_w(hm->row_label) + 24, 64), x0 = lw, x1 = W - MR;
    const double cw = (x1 - x0) / hm->ncols, ch = hm->nrows > 32 ? 8 : ROW_H, top = MT + 18;
    const double h = top + hm->nrows * ch + MB;
    open_svg(f, h, marks);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">", (x0 + x1) / 2, MT);
    dt_svg_escape(f, hm->col_label);
    fputs("</text>", f);
    for (int c = 0; c < hm->ncols; c++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%d</text>", x0 + (c + 0.5) * cw,
                top - 3, c);
    for (int r = 0; r < hm->nrows; r++) {
        if (ch >= ROW_H || r % 4 == 0)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%d</text>", x0 - 6,
                    top + (r + 0.5) * ch + 4, r);
        for (int c = 0; c < hm->ncols; c++) {
            const double v = hm->v[r * hm->ncols + c];
            if (!isfinite(v)) continue;
            char col[16];
            heat_color(v, col, sizeof col);
            fprintf(f, "<rect class=\"mark heat-cell\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                       "stroke=\"#fff\"><title>", x0 + c * cw, top + r * ch, cw, ch, col);
            dt_svg_escape(f, hm->row_label);
            fprintf(f, " %d, ", r);
            dt_svg_escape(f, hm->col_label);
            fprintf(f, " %d: %.3f", c, v);
            if (hm->count) fprintf(f, " (%.6g)", hm->count[r * hm->ncols + c]);
            fputs("</title></rect>", f);
            if (ch >= ROW_H && cw >= 36)
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\">%.2f</text>",
                        x0 + (c + 0.5) * cw, top + (r + 0.5) * ch + 4, v);
        }
    }
    fprintf(f, "<text x=\"14\" y=\"%.1f\" font-size=\"12\" transform=\"rotate(-90 14 %.1f)\" text-anchor=\"middle\">",
            top + hm->nrows * ch / 2, top + hm->nrows * ch / 2);
    dt_svg_escape(f, hm->row_label);
    fputs("</text></svg>", f);
    return marks;
}
