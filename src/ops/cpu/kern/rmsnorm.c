/* RMSNorm over the last dimension (LLaMA): out = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps).
 * Row sums in VW lanes (a fixed order per path); dw by channel ranges owned by threads, rows
 * walked in order, as in layernorm.c. */
#include <math.h>
#include <stdlib.h>

#include "core/status.h"
#include "ops/cpu/kern/kern.h"

void DT_K(rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N,
                           int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float s = 1.0f / sqrtf(vk_dot(x, x, C) / (float)C + eps);
        const vf vs = vf_set1(s);
        float *o = out + (size_t)n * C;
        int i = 0;
        for (; i + VW <= C; i += VW)
            vf_store(o + i, vf_mul(vf_mul(vf_load(x + i), vs), vf_load(w + i)));
        if (i < C) {
            const int r = C - i;
            vf_store_n(o + i, vf_mul(vf_mul(vf_load_n(x + i, r), vs), vf_load_n(w + i, r)), r);
        }
        rstd[n] = s;
    }
}

/* dinp_i += rstd (g_i w_i - xhat_i mean_j(g_j w_j xhat_j)), xhat = x rstd. */
static inline vf rms_dinp(vf di, vf g, vf x, vf w, vf vs, vf mgx) {
    return vf_fma(vs, vf_fnma(vf_mul(x, vs), mgx, vf_mul(g, w)), di);
}

void DT_K(rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp,
                            const float *w, const float *rstd, int N, int C) {
    /* Pass 1, rows in parallel: dinp. Masked tail lanes have g = 0: they add nothing. */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        const vf vs = vf_set1(rstd[n]);
        vf sgx = vf_zero();
        int i = 0;
        for (; i + VW <= C; i += VW)
            sgx = vf_fma(vf_mul(vf_load(g + i), vf_load(w + i)), vf_mul(vf_load(x + i), vs), sgx);
        if (i < C) {
            const int r = C - i;
            sgx = vf_fma(vf_mul(vf_load_n(g + i, r), vf_load_n(w + i, r)),
                         vf_mul(vf_load_n(x + i, r), vs), sgx);
        }
        const vf mgx = vf_set1(vf_hsum(sgx) / (float)C);
        float *di = dinp + (size_t)n * C;
        for (i = 0; i + VW <= C; i += VW)
            vf_store(di + i, rms_dinp(vf_load(di + i), vf_load(g + i), vf_load(x + i),
                                      vf_load(w + i), vs, mgx));
        if (i < C) {
            const int r = C - i;
            vf_store_n(di + i, rms_dinp(vf_load_n(di + i, r), vf_load_n(g + i, r),
                                        vf_load_n(x + i, r), vf_load_n(w + i, r), vs, mgx),
                       r);
        }
    }
    /* Pass 2, dw: threads own channel ranges and walk all rows in order (deterministic). */
#pragma omp parallel
    {
        int c0, c1;
        DT_K(thread_range)(C, &c0, &c1);
        if (c0 < c1) {
            const int nc = c1 - c0;
            float *aw = calloc((size_t)nc, sizeof(float));
            DT_ASSERT(aw != NULL);
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C + c0, *g = dout + (size_t)n * C + c0;
                const vf vs = vf_set1(rstd[n]);
                int i = 0;
                for (; i + VW <= nc; i += VW)
                    vf_store(aw + i, vf_fma(vf_load(g + i), vf_mul(vf_load(x + i), vs),
                                            vf_load(aw + i)));
                for (; i < nc; i++) aw[i] = fmaf(g[i], x[i] * rstd[n], aw[i]); /* one lane */
            }
            vk_acc(dw + c0, aw, nc);
            free(aw);
        }
    }
}
