/* Fused softmax + cross-entropy over the vocabulary. Only the log-sum-exp of each row is
 * saved; the backward recomputes softmax from it in place over the logits buffer, so the
 * (N, Vp) probabilities are never stored separately. Padding columns [V, Vp) are ignored
 * in the forward and get zero gradient. */
#include <math.h>
#include <string.h>

#include "ops/cpu/vmath.h"
#include "ops/ops.h"

void dt_crossentropy_forward(float *losses, float *lse, const float *logits,
                             const int32_t *targets, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float mx = dt_vmax(x, V);
        float sum = dt_vexp_sum(NULL, x, mx, V);
        float l = mx + logf(sum);
        lse[n] = l;
        losses[n] = l - x[targets[n]];
    }
}

void dt_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, float dloss, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float *d = dlogits + (size_t)n * Vp;
        dt_vexp_sum(d, x, lse[n], V); /* d = softmax(x) */
        for (int v = 0; v < V; v++) d[v] *= dloss;
        d[targets[n]] -= dloss;
        if (Vp > V) memset(d + V, 0, (size_t)(Vp - V) * sizeof(float));
    }
}
