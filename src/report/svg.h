/* svg.h - the report's charts, written as inline SVG (no script, no external requests):
 * line charts (linear or log2 axes, error bars, dashed series) and stacked horizontal bars
 * with an optional marker per row. Every drawn data element carries class "mark" and the
 * <svg> carries data-marks="N" (how many it drew), which the browser test checks.
 *
 *   dt_svg_series s = {.name = "ddp", .n = 2, .x = world, .y = tokens};
 *   dt_svg_axis xa = {.label = "ranks", .log2 = 1}, ya = {.label = "tokens/s", .from_zero = 1};
 *   int marks = dt_svg_lines(f, &xa, &ya, &s, 1, NAN);
 */
#ifndef DT_SVG_H
#define DT_SVG_H

#include <stdio.h>

typedef struct dt_svg_axis {
    const char *label;
    int log2;      /* logarithmic, base 2 (values must be > 0) */
    int bytes;     /* tick labels in binary units */
    int percent;   /* values are fractions, ticks in % */
    int from_zero; /* a linear axis that includes 0 */
    int integer;   /* a linear axis of whole numbers: tick step >= 1 */
} dt_svg_axis;

typedef struct dt_svg_series {
    const char *name;
    const char *color; /* NULL: the palette's colour for the series index */
    int n;
    const double *x, *y;
    const double *err; /* optional: +- per point */
    int dashed;
} dt_svg_series;

typedef struct dt_svg_bars {
    int nrows, nseg;
    const char *const *rows; /* row labels */
    const char *const *segs; /* segment names (legend) */
    const double *v;         /* nrows x nseg values, row-major */
    const double *marker;    /* per row, drawn as a diamond (optional; NaN = none) */
    const char *marker_name;
    const dt_svg_axis *axis; /* the value axis */
    double scale;            /* displayed value = v * scale (0 means 1) */
} dt_svg_bars;

/* A heat map: nrows x ncols values v (row-major) coloured white at 1, red above (2 and more:
 * full), blue below (0: full), each cell's value (and count, if given) in its tooltip. */
typedef struct dt_svg_heat {
    int nrows, ncols;
    const char *row_label, *col_label; /* "layer", "expert" */
    const double *v;
    const double *count; /* optional: shown beside each value */
} dt_svg_heat;

/* Colour i of the palette (cycles). */
const char *dt_svg_color(int i);

/* Nice linear ticks covering [lo, hi] (about `target` of them, step 1/2/2.5/5 x 10^k); writes
 * at most max values to t and returns their count. Widens a degenerate range. */
int dt_svg_ticks(double lo, double hi, int target, double *t, int max);
/* Ticks at powers of two covering [lo, hi] (lo, hi > 0), every 2^k-th power so that at most
 * `target` ticks remain. */
int dt_svg_ticks_log2(double lo, double hi, int target, double *t, int max);

/* Writes a line chart; points that are not finite (or not > 0 on a log axis) are skipped,
 * hline (if finite) draws a dashed reference line. Returns the number of marks drawn; 0
 * means nothing was written (no data). */
int dt_svg_lines(FILE *f, const dt_svg_axis *xa, const dt_svg_axis *ya, const dt_svg_series *s,
                 int ns, double hline);
/* Writes stacked horizontal bars; returns the number of marks (segments > 0 and markers);
 * 0 means nothing was written. */
int dt_svg_stacked_bars(FILE *f, const dt_svg_bars *b);

/* Writes a heat map (cells of class "mark heat-cell"); returns the cells drawn (finite
 * values), 0: nothing written. */
int dt_svg_heatmap(FILE *f, const dt_svg_heat *hm);
/* Writes s with &, <, >, " escaped. */
void dt_svg_escape(FILE *f, const char *s);

#endif
