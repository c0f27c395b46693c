/* Token + position embedding. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ops/ops.h"

void dt_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                        int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float *te = wte + (size_t)tokens[bt] * C;
        const float *pe = wpe + (size_t)(bt % T) * C;
        float *o = out + (size_t)bt * C;
        for (int i = 0; i < C; i++) o[i] = te[i] + pe[i];
    }
}

void dt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                         int B, int T, int C) {
    /* Threads own disjoint channel ranges: the scatter into dwte needs no atomics and the
     * summation order per element is fixed (b, t ascending) => deterministic. */
#pragma omp parallel
    {
#ifdef _OPENMP
        int nt = omp_get_num_threads(), tid = omp_get_thread_num();
#else
        int nt = 1, tid = 0;
#endif
        int per = (C + nt - 1) / nt;
        int c0 = tid * per, c1 = c0 + per < C ? c0 + per : C;
        for (int bt = 0; bt < B * T && c0 < c1; bt++) {
            const float *d = dout + (size_t)bt * C;
            float *te = dwte + (size_t)tokens[bt] * C;
            float *pe = dwpe + (size_t)(bt % T) * C;
            for (int i = c0; i < c1; i++) {
                te[i] += d[i];
                pe[i] += d[i];
            }
        }
    }
}
