/* Fused softmax + cross-entropy over the vocabulary, and the vectorised exp.
 *
 * Only the log-sum-exp of each row is saved; the backward recomputes softmax from it in
 * place over the logits buffer, so the (N, Vp) probabilities are never stored separately.
 * Padding columns [V, Vp) are ignored in the forward and get zero gradient. A row whose
 * target is negative is not counted (a loss mask): loss 0, gradient 0. */
#include <math.h>
#include <string.h>

#include "ops/cpu/kern/kern.h"

float DT_K(exp_sum)(float *y, const float *x, float shift, int n) {
    return vk_exp_sum(y, x, shift, n);
}

void DT_K(crossentropy_forward)(float *losses, float *lse, const float *logits,
                                const int32_t *targets, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float mx = vk_max(x, V);
        float sum = vk_exp_sum(NULL, x, mx, V);
        float l = mx + logf(sum);
        lse[n] = l;
        losses[n] = targets[n] >= 0 ? l - x[targets[n]] : 0.0f; /* < 0: not counted (loss mask) */
    }
}

void DT_K(crossentropy_backward)(float *dlogits, const float *logits, const float *lse,
                                 const int32_t *targets, float dloss, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float *d = dlogits + (size_t)n * Vp;
        if (targets[n] < 0) { /* not counted: no gradient */
            memset(d, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        vk_exp_sum(d, x, lse[n], V); /* d = softmax(x) */
        vk_scale(d, dloss, V);
        d[targets[n]] -= dloss;
        if (Vp > V) memset(d + V, 0, (size_t)(Vp - V) * sizeof(float));
    }
}
