/* SwiGLU (LLaMA's MLP gate): out = silu(g) u over the output of a fused gate|up projection,
 * silu(x) = x sigmoid(x), sigmoid(x) = 1 / (1 + exp(-x)) on the vectorised exp.
 *
 * Large |x| needs no special case: for x < -87.3 exp(-x) saturates (to a huge value or
 * +inf), so sigmoid is tiny or 0 and silu is -0 or tiny, as in fp32 libm; for x > 87.3
 * exp(-x) = 0 and sigmoid = 1 exactly. Tails go through the same vector operations
 * (partial loads), so every element of one path is computed alike, and the same bits come
 * out on every path (elementwise IEEE operations only). */
#include "ops/cpu/kern/kern.h"

static inline vf sigmoid_v(vf x) {
    const vf one = vf_set1(1.0f);
    return vf_div(one, vf_add(one, vf_exp(vf_sub(vf_zero(), x))));
}

static inline vf swiglu_v(vf g, vf u) { return vf_mul(vf_mul(g, sigmoid_v(g)), u); }

/* dg = d u s (1 + g (1 - s)), du = d silu(g). */
static inline void swiglu_grad_v(vf g, vf u, vf d, vf *dg, vf *du) {
    const vf one = vf_set1(1.0f);
    vf s = sigmoid_v(g);
    *dg = vf_mul(vf_mul(vf_mul(d, u), s), vf_fma(g, vf_sub(one, s), one));
    *du = vf_mul(d, vf_mul(g, s));
}

void DT_K(swiglu_forward)(float *out, const float *inp, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F;
        float *o = out + (size_t)n * F;
        int i = 0;
        for (; i + VW <= F; i += VW) vf_store(o + i, swiglu_v(vf_load(g + i), vf_load(u + i)));
        if (i < F) {
            const int r = F - i;
            vf_store_n(o + i, swiglu_v(vf_load_n(g + i, r), vf_load_n(u + i, r)), r);
        }
    }
}

void DT_K(swiglu_backward)(float *dinp, const float *inp, const float *dout, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F, *d = dout + (size_t)n * F;
        float *dg = dinp + (size_t)n * 2 * F, *du = dg + F;
        vf a, b;
        int i = 0;
        for (; i + VW <= F; i += VW) {
            swiglu_grad_v(vf_load(g + i), vf_load(u + i), vf_load(d + i), &a, &b);
            vf_store(dg + i, a);
            vf_store(du + i, b);
        }
        if (i < F) {
            const int r = F - i;
            swiglu_grad_v(vf_load_n(g + i, r), vf_load_n(u + i, r), vf_load_n(d + i, r), &a, &b);
            vf_store_n(dg + i, a, r);
            vf_store_n(du + i, b, r);
        }
    }
}
