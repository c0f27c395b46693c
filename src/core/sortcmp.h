/* sortcmp.h - qsort comparators shared by the modules that take medians and quantiles. */
#ifndef DT_SORTCMP_H
#define DT_SORTCMP_H

static inline int dt_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline int dt_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

#endif
