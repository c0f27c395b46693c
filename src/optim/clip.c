#include <stdlib.h>

#include "ops/cpu/kernels.h"
#include "optim/optim.h"

#define DT_SUMSQ_CHUNK 65536

static double chunk_sumsq(const dt_cpu_kernels *k, const float *x, size_t n, size_t c) {
    size_t end = (c + 1) * DT_SUMSQ_CHUNK < n ? (c + 1) * DT_SUMSQ_CHUNK : n;
    return k->sumsq(x + c * DT_SUMSQ_CHUNK, end - c * DT_SUMSQ_CHUNK);
}

double dt_sumsq(const float *x, size_t n) {
    size_t nchunks = (n + DT_SUMSQ_CHUNK - 1) / DT_SUMSQ_CHUNK;
    double total = 0.0;
    const dt_cpu_kernels *k = dt_cpu_kernels_get();
    double *part = malloc((nchunks ? nchunks : 1) * sizeof(double));
    if (!part) { /* serial: same chunks, same order, same result */
        for (size_t c = 0; c < nchunks; c++) total += chunk_sumsq(k, x, n, c);
        return total;
    }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) part[c] = chunk_sumsq(k, x, n, c);
    for (size_t c = 0; c < nchunks; c++) total += part[c];
    free(part);
    return total;
}

float dt_clip_coef(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double coef = (double)max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}
