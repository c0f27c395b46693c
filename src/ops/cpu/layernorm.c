/* LayerNorm over the last dimension, eps 1e-5. */
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ops/ops.h"

#define DT_LN_EPS 1e-5f

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        /* Two passes (mean, then centred variance): stable for large offsets. */
        float m = 0.0f;
        for (int i = 0; i < C; i++) m += x[i];
        m /= (float)C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            v += d * d;
        }
        v /= (float)C;
        float s = 1.0f / sqrtf(v + DT_LN_EPS);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C) {
    /* Pass 1, rows in parallel: dinp. */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float sum_g = 0.0f, sum_gx = 0.0f; /* sums of dnorm and dnorm * norm */
        for (int i = 0; i < C; i++) {
            float dn = g[i] * w[i];
            sum_g += dn;
            sum_gx += dn * (x[i] - m) * s;
        }
        sum_g /= (float)C;
        sum_gx /= (float)C;
        float *di = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            di[i] += s * (g[i] * w[i] - sum_g - norm * sum_gx);
        }
    }
    /* Pass 2, dw/db: threads own channel ranges and walk all rows in order (deterministic). */
#pragma omp parallel
    {
#ifdef _OPENMP
        int nt = omp_get_num_threads(), tid = omp_get_thread_num();
#else
        int nt = 1, tid = 0;
#endif
        int per = (C + nt - 1) / nt;
        int c0 = tid * per, c1 = c0 + per < C ? c0 + per : C;
        if (c0 < c1) {
            float *aw = calloc((size_t)(c1 - c0) * 2, sizeof(float));
            float *ab = aw + (c1 - c0);
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
                float m = mean[n], s = rstd[n];
                for (int i = c0; i < c1; i++) {
                    aw[i - c0] += g[i] * (x[i] - m) * s;
                    ab[i - c0] += g[i];
                }
            }
            for (int i = c0; i < c1; i++) {
                dw[i] += aw[i - c0];
                db[i] += ab[i - c0];
            }
            free(aw);
        }
    }
}
