/* The CPU backend's operations of the parallel and optimizer layers (ops.h "parallel/ and
 * optim/ operations"): OpenMP over fixed chunks, the ISA path's kernels (kern/optim.c) inside
 * each. Chunks are static and their results combined in a fixed order, so the bits do not
 * depend on the thread count. */
#include <math.h>
#include <stdlib.h>

#include "ops/cpu/kernels.h"

#define DT_ADAMW_CHUNK 16384 /* elements per OpenMP work item */
#define DT_SUMSQ_CHUNK 65536

void dt_cpu_adamw_chunked(float *params, const float *grads, float *m, float *v, size_t n,
                          const dt_adamw_step *s) {
    const dt_cpu_kernels *k = dt_cpu_kernels_get();
    /* Elementwise: any split gives the same bits. */
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < n; c += DT_ADAMW_CHUNK) {
        size_t len = n - c < DT_ADAMW_CHUNK ? n - c : DT_ADAMW_CHUNK;
        k->adamw(params + c, grads + c, m + c, v + c, len, s);
    }
}

void dt_cpu_adamw_aged(float *params, const float *grads, float *m, float *v, float *age, size_t n,
                       const dt_adamw_step *s) {
    const float b1 = s->b1, b2 = s->b2, eps = s->eps, shrink = s->shrink, gscale = s->gscale;
    const float step_size = s->step_size, bc2_sqrt = s->bc2_sqrt;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < n; c += DT_ADAMW_CHUNK) {
        size_t end = n - c < DT_ADAMW_CHUNK ? n : c + DT_ADAMW_CHUNK;
        for (size_t i = c; i < end; i++) {
            const float g = grads[i] * gscale;
            if (g == 0.0f) { /* nothing arrived */
                params[i] *= shrink;
                age[i] += 1.0f;
                continue;
            }
            const float a = age[i], d1 = powf(b1, a), d2 = powf(b2, a);
            m[i] = d1 * m[i] + (1.0f - d1) * (g / a);
            v[i] = d2 * v[i] + (1.0f - d2) * (g * g / a);
            params[i] = params[i] * shrink - a * step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
            age[i] = 1.0f;
        }
    }
}

static double chunk_sumsq(const dt_cpu_kernels *k, const float *x, size_t n, size_t c) {
    size_t end = (c + 1) * DT_SUMSQ_CHUNK < n ? (c + 1) * DT_SUMSQ_CHUNK : n;
    return k->sumsq(x + c * DT_SUMSQ_CHUNK, end - c * DT_SUMSQ_CHUNK);
}

double dt_cpu_sumsq_chunked(const float *x, size_t n) {
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

void dt_cpu_add_f32(float *a, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) a[i] += x[i];
}

void dt_cpu_scale_f32(float *x, float factor, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= factor;
}
