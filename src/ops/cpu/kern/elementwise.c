/* Elementwise kernels: GELU, the residual add, token + position embedding, bias gradient.
 *
 * GELU is the tanh form, tanh(u) = 1 - 2 / (exp(2u) + 1) on the vectorised exp; tails go
 * through the same vector operations (partial loads), so every element of one path is
 * computed alike. */
#include <math.h>
#include <string.h>

#include "ops/cpu/kern/kern.h"

#define DT_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define DT_GELU_A 0.044715f
#define DT_CHUNK 4096 /* elements per OpenMP work item */

static inline vf tanh_v(vf u) {
    /* Clamp keeps exp(2u) finite; tanh(+-9) == +-1 in fp32. */
    u = vf_min(vf_max(u, vf_set1(-9.0f)), vf_set1(9.0f));
    vf e = vf_exp(vf_add(u, u));
    vf one = vf_set1(1.0f);
    return vf_sub(one, vf_div(vf_set1(2.0f), vf_add(e, one)));
}

static inline vf inner_v(vf x) { /* K (x + A x^3) */
    vf x3 = vf_mul(vf_mul(x, x), x);
    return vf_mul(vf_set1(DT_GELU_K), vf_fma(vf_set1(DT_GELU_A), x3, x));
}

static inline vf gelu_v(vf x) {
    return vf_mul(vf_mul(vf_set1(0.5f), x), vf_add(vf_set1(1.0f), tanh_v(inner_v(x))));
}

static inline vf gelu_grad_v(vf x, vf d) {
    const vf half = vf_set1(0.5f), one = vf_set1(1.0f);
    vf th = tanh_v(inner_v(x));
    vf sech2 = vf_fnma(th, th, one);
    /* du/dx = K (1 + 3A x^2) */
    vf du = vf_mul(vf_set1(DT_GELU_K), vf_fma(vf_set1(3.0f * DT_GELU_A), vf_mul(x, x), one));
    vf g = vf_add(vf_mul(half, vf_add(one, th)), vf_mul(vf_mul(half, x), vf_mul(sech2, du)));
    return vf_mul(d, g);
}

void DT_K(gelu_forward)(float *out, const float *inp, int N) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < N; c += DT_CHUNK) {
        int end = c + DT_CHUNK < N ? c + DT_CHUNK : N, i = c;
        for (; i + VW <= end; i += VW) vf_store(out + i, gelu_v(vf_load(inp + i)));
        if (i < end) vf_store_n(out + i, gelu_v(vf_load_n(inp + i, end - i)), end - i);
    }
}

void DT_K(gelu_backward)(float *dinp, const float *inp, const float *dout, int N) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < N; c += DT_CHUNK) {
        int end = c + DT_CHUNK < N ? c + DT_CHUNK : N, i = c;
        for (; i + VW <= end; i += VW)
            vf_store(dinp + i, gelu_grad_v(vf_load(inp + i), vf_load(dout + i)));
        if (i < end)
            vf_store_n(dinp + i,
                       gelu_grad_v(vf_load_n(inp + i, end - i), vf_load_n(dout + i, end - i)),
                       end - i);
    }
}

void DT_K(residual_forward)(float *out, const float *a, const float *b, int N) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < N; c += DT_CHUNK) {
        int n = N - c < DT_CHUNK ? N - c : DT_CHUNK;
        vk_add(out + c, a + c, b + c, n);
    }
}

void DT_K(encoder_forward)(float *out, const int32_t *tokens, const float *wte, int row0,
                           int rows, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        unsigned r = (unsigned)(tokens[n] - row0); /* wraps for tokens below row0 */
        if (r < (unsigned)rows)
            memcpy(out + (size_t)n * C, wte + (size_t)r * C, (size_t)C * sizeof(float));
    }
}

void DT_K(encoder_backward)(float *dwte, int row0, int rows, const float *dout,
                            const int32_t *tokens, int N, int C) {
    /* Threads own disjoint channel ranges: the scatter needs no atomics and the summation
     * order per element is fixed (positions ascending) => deterministic. */
#pragma omp parallel
    {
        int c0, c1;
        DT_K(thread_range)(C, &c0, &c1);
        for (int n = 0; n < N && c0 < c1; n++) {
            unsigned r = (unsigned)(tokens[n] - row0);
            if (r < (unsigned)rows) vk_acc(dwte + (size_t)r * C + c0, dout + (size_t)n * C + c0, c1 - c0);
        }
    }
}

void DT_K(pos_forward)(float *out, const float *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) vk_acc(out + (size_t)bt * C, wpe + (size_t)(bt % T) * C, C);
}

void DT_K(pos_backward)(float *dwpe, const float *dout, int B, int T, int C) {
#pragma omp parallel
    {
        int c0, c1;
        DT_K(thread_range)(C, &c0, &c1);
        for (int bt = 0; bt < B * T && c0 < c1; bt++)
            vk_acc(dwpe + (size_t)(bt % T) * C + c0, dout + (size_t)bt * C + c0, c1 - c0);
    }
}

void DT_K(bias_backward)(float *dbias, const float *dout, int N, int OC) {
    /* Column sums; threads own column ranges and add rows in order (deterministic). */
#pragma omp parallel
    {
        int o0, o1;
        DT_K(thread_range)(OC, &o0, &o1);
        for (int n = 0; n < N && o0 < o1; n++)
            vk_acc(dbias + o0, dout + (size_t)n * OC + o0, o1 - o0);
    }
}
