#include <stdlib.h>

#include "optim/optim.h"

#define DT_SUMSQ_CHUNK 65536

static double chunk_sumsq(const float *x, size_t n, size_t c) {
    size_t end = (c + 1) * DT_SUMSQ_CHUNK < n ? (c + 1) * DT_SUMSQ_CHUNK : n;
    double s = 0.0;
    for (size_t i = c * DT_SUMSQ_CHUNK; i < end; i++) s += (double)x[i] * x[i];
    return s;
}

double dt_sumsq(const float *x, size_t n) {
    size_t nchunks = (n + DT_SUMSQ_CHUNK - 1) / DT_SUMSQ_CHUNK;
    double total = 0.0;
    double *part = malloc((nchunks ? nchunks : 1) * sizeof(double));
    if (!part) { /* serial: same chunks, same order, same result */
        for (size_t c = 0; c < nchunks; c++) total += chunk_sumsq(x, n, c);
        return total;
    }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) part[c] = chunk_sumsq(x, n, c);
    for (size_t c = 0; c < nchunks; c++) total += part[c];
    free(part);
    return total;
}

float dt_clip_coef(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double coef = (double)max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}
