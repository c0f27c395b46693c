/* Naive double-precision causal attention: the full (T,T) probability matrix per head, and
 * a backward pass written from the definition of softmax, not from the flash identities. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "ops/ops_ref.h"

void dt_ref_attention_forward(double *out, double *lse, const double *qkv, int B, int T, int C,
                              int NH) {
    const int hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    double *att = malloc((size_t)T * T * sizeof(double));
    DT_ASSERT(att != NULL);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)b * T + i) * 3 * C + (size_t)h * hs;
                double *row = att + (size_t)i * T;
                double m = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
                    double s = 0.0;
                    for (int d = 0; d < hs; d++) s += q[d] * k[d];
                    row[j] = s * scale;
                    if (row[j] > m) m = row[j];
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) sum += exp(row[j] - m);
                lse[((size_t)b * NH + h) * T + i] = m + log(sum);
                for (int j = 0; j <= i; j++) row[j] = exp(row[j] - m) / sum;
                for (int j = i + 1; j < T; j++) row[j] = 0.0;
            }
            for (int i = 0; i < T; i++) {
                double *o = out + ((size_t)b * T + i) * C + (size_t)h * hs;
                for (int d = 0; d < hs; d++) {
                    double acc = 0.0;
                    for (int j = 0; j < T; j++)
                        acc += att[(size_t)i * T + j] *
                               qkv[((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs + d];
                    o[d] = acc;
                }
            }
        }
    free(att);
}

/* out is unused: D_i = sum_j P_ij dP_ij is taken from the softmax Jacobian itself rather
 * than from the identity D_i = dO_i . O_i the fast kernel relies on. */
void dt_ref_attention_backward(double *dqkv, const double *dout, const double *qkv,
                               const double *out, const double *lse, int B, int T, int C,
                               int NH) {
    (void)out;
    const int hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    const size_t ld = (size_t)3 * C;
    double *P = malloc((size_t)T * T * sizeof(double));
    double *dP = malloc((size_t)T * T * sizeof(double));
    DT_ASSERT(P != NULL && dP != NULL);
    memset(dqkv, 0, (size_t)B * T * ld * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const double *Q = qkv + (size_t)b * T * ld + (size_t)h * hs;
            const double *K = Q + C, *V = Q + 2 * C;
            const double *dO = dout + (size_t)b * T * C + (size_t)h * hs;
            double *dQ = dqkv + (size_t)b * T * ld + (size_t)h * hs;
            double *dK = dQ + C, *dV = dQ + 2 * C;
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    double s = 0.0, dp = 0.0;
                    for (int d = 0; d < hs; d++) {
                        s += Q[i * ld + d] * K[j * ld + d];
                        dp += dO[(size_t)i * C + d] * V[j * ld + d];
                    }
                    P[(size_t)i * T + j] =
                        j <= i ? exp(s * scale - lse[((size_t)b * NH + h) * T + i]) : 0.0;
                    dP[(size_t)i * T + j] = dp;
                }
            /* out_i = sum_j P_ij v_j  =>  dV_j = sum_i P_ij dO_i. */
            for (int j = 0; j < T; j++)
                for (int i = 0; i < T; i++)
                    for (int d = 0; d < hs; d++)
                        dV[j * ld + d] += P[(size_t)i * T + j] * dO[(size_t)i * C + d];
            /* Softmax Jacobian: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik); S = scale q.k. */
            for (int i = 0; i < T; i++) {
                double Di = 0.0;
                for (int k = 0; k < T; k++) Di += P[(size_t)i * T + k] * dP[(size_t)i * T + k];
                for (int j = 0; j < T; j++) {
                    double ds = P[(size_t)i * T + j] * (dP[(size_t)i * T + j] - Di) * scale;
                    for (int d = 0; d < hs; d++) {
                        dQ[i * ld + d] += ds * K[j * ld + d];
                        dK[j * ld + d] += ds * Q[i * ld + d];
                    }
                }
            }
        }
    free(P);
    free(dP);
}
