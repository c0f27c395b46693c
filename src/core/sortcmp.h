/* sortcmp.h - qsort comparators shared by the modules that take medians and quantiles, and
 * the straggler rule (the trainer, the bench tables and the report name the same ranks). */
#ifndef DT_SORTCMP_H
#define DT_SORTCMP_H

#include <stdlib.h>

static inline int dt_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline int dt_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) without v[r] (0 when n < 2 or out of memory). */
static inline double dt_median_others(const double *v, int n, int r) {
    double *o = n > 1 ? (double *)malloc((size_t)(n - 1) * sizeof *o) : NULL;
    if (!o) return 0.0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i != r) o[k++] = v[i];
    qsort(o, (size_t)k, sizeof *o, dt_cmp_double);
    double med = k % 2 ? o[k / 2] : 0.5 * (o[k / 2 - 1] + o[k / 2]);
    free(o);
    return med;
}

#endif
