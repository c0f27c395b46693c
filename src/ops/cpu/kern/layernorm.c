/* LayerNorm over the last dimension, eps 1e-5. Row sums in VW lanes (a fixed order per
 * path); dw/db by channel ranges owned by threads, rows walked in order. */
#include <math.h>
#include <stdlib.h>

#include "core/status.h"
#include "ops/cpu/kern/kern.h"

#define DT_LN_EPS 1e-5f

void DT_K(layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                             const float *w, const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        /* Two passes (mean, then centred variance): stable for large offsets. */
        const float m = vk_sum(x, C) / (float)C;
        const vf vm = vf_set1(m);
        vf acc = vf_zero();
        int i = 0;
        for (; i + VW <= C; i += VW) {
            vf d = vf_sub(vf_load(x + i), vm);
            acc = vf_fma(d, d, acc);
        }
        if (i < C) {
            vf d = vf_keep_n(vf_sub(vf_load_n(x + i, C - i), vm), C - i);
            acc = vf_fma(d, d, acc);
        }
        const float v = vf_hsum(acc) / (float)C;
        const float s = 1.0f / sqrtf(v + DT_LN_EPS);
        const vf vs = vf_set1(s);
        float *o = out + (size_t)n * C;
        for (i = 0; i + VW <= C; i += VW)
            vf_store(o + i, vf_add(vf_mul(vf_mul(vf_sub(vf_load(x + i), vm), vs), vf_load(w + i)),
                                   vf_load(b + i)));
        if (i < C) {
            const int r = C - i;
            vf y = vf_add(vf_mul(vf_mul(vf_sub(vf_load_n(x + i, r), vm), vs), vf_load_n(w + i, r)),
                          vf_load_n(b + i, r));
            vf_store_n(o + i, y, r);
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

/* One vector step of the backward row pass: accumulates dn = g w and dn * norm. */
static inline void ln_row_sums(vf g, vf x, vf w, vf vm, vf vs, vf *sg, vf *sgx) {
    vf dn = vf_mul(g, w);
    *sg = vf_add(*sg, dn);
    *sgx = vf_fma(dn, vf_mul(vf_sub(x, vm), vs), *sgx);
}

static inline vf ln_dinp(vf di, vf g, vf x, vf w, vf vm, vf vs, vf mg, vf mgx) {
    vf norm = vf_mul(vf_sub(x, vm), vs);
    vf t = vf_fnma(norm, mgx, vf_sub(vf_mul(g, w), mg)); /* g w - sum_g - norm sum_gx */
    return vf_fma(vs, t, di);
}

void DT_K(layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int N, int C) {
    /* Pass 1, rows in parallel: dinp. Masked tail lanes have g = 0: they add nothing. */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        const vf vm = vf_set1(mean[n]), vs = vf_set1(rstd[n]);
        vf sg = vf_zero(), sgx = vf_zero();
        int i = 0;
        for (; i + VW <= C; i += VW)
            ln_row_sums(vf_load(g + i), vf_load(x + i), vf_load(w + i), vm, vs, &sg, &sgx);
        if (i < C)
            ln_row_sums(vf_load_n(g + i, C - i), vf_load_n(x + i, C - i),
                        vf_load_n(w + i, C - i), vm, vs, &sg, &sgx);
        const vf mg = vf_set1(vf_hsum(sg) / (float)C), mgx = vf_set1(vf_hsum(sgx) / (float)C);
        float *di = dinp + (size_t)n * C;
        for (i = 0; i + VW <= C; i += VW)
            vf_store(di + i, ln_dinp(vf_load(di + i), vf_load(g + i), vf_load(x + i),
                                     vf_load(w + i), vm, vs, mg, mgx));
        if (i < C) {
            const int r = C - i;
            vf_store_n(di + i, ln_dinp(vf_load_n(di + i, r), vf_load_n(g + i, r),
                                       vf_load_n(x + i, r), vf_load_n(w + i, r), vm, vs, mg, mgx),
                       r);
        }
    }
    /* Pass 2, dw/db: threads own channel ranges and walk all rows in order (deterministic). */
#pragma omp parallel
    {
        int c0, c1;
        DT_K(thread_range)(C, &c0, &c1);
        if (c0 < c1) {
            const int nc = c1 - c0;
            float *aw = calloc((size_t)nc * 2, sizeof(float));
            DT_ASSERT(aw != NULL);
            float *ab = aw + nc;
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C + c0, *g = dout + (size_t)n * C + c0;
                const vf vm = vf_set1(mean[n]), vs = vf_set1(rstd[n]);
                int i = 0;
                for (; i + VW <= nc; i += VW) {
                    vf gi = vf_load(g + i);
                    vf_store(aw + i, vf_fma(gi, vf_mul(vf_sub(vf_load(x + i), vm), vs),
                                            vf_load(aw + i)));
                    vf_store(ab + i, vf_add(vf_load(ab + i), gi));
                }
                for (; i < nc; i++) { /* tail: the same operations, one lane */
                    aw[i] = fmaf(g[i], (x[i] - mean[n]) * rstd[n], aw[i]);
                    ab[i] += g[i];
                }
            }
            vk_acc(dw + c0, aw, nc);
            vk_acc(db + c0, ab, nc);
            free(aw);
        }
    }
}
