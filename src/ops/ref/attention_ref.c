/* Naive double-precision attention (grouped-query, causal or not): the full (T,T)
 * probability matrix per head, and a backward pass written from the definition of softmax,
 * not from the flash identities. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "ops/ops_ref.h"

/* Probabilities of query head h of batch b: P (T,T), rows sum to 1 over the keys seen. */
static void ref_probs(double *P, double *lse_row, const double *qkv, int b, int h, int T,
                      int NH, int NKV, int hs, int causal) {
    const size_t ld = (size_t)(NH + 2 * NKV) * hs;
    const int kvh = h / (NH / NKV);
    const double scale = 1.0 / sqrt((double)hs);
    for (int i = 0; i < T; i++) {
        const double *q = qkv + ((size_t)b * T + i) * ld + (size_t)h * hs;
        const int nk = causal ? i + 1 : T;
        double *row = P + (size_t)i * T, m = -INFINITY;
        for (int j = 0; j < nk; j++) {
            const double *k = qkv + ((size_t)b * T + j) * ld + (size_t)(NH + kvh) * hs;
            double s = 0.0;
            for (int d = 0; d < hs; d++) s += q[d] * k[d];
            row[j] = s * scale;
            if (row[j] > m) m = row[j];
        }
        double sum = 0.0;
        for (int j = 0; j < nk; j++) sum += exp(row[j] - m);
        lse_row[i] = m + log(sum);
        for (int j = 0; j < nk; j++) row[j] = exp(row[j] - m) / sum;
        for (int j = nk; j < T; j++) row[j] = 0.0;
    }
}

void dt_ref_attention_forward(double *out, double *lse, const double *qkv, int B, int T, int NH,
                              int NKV, int hs, int causal) {
    const size_t ld = (size_t)(NH + 2 * NKV) * hs, ldo = (size_t)NH * hs;
    double *P = malloc((size_t)T * T * sizeof(double));
    DT_ASSERT(P != NULL);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int kvh = h / (NH / NKV);
            ref_probs(P, lse + ((size_t)b * NH + h) * T, qkv, b, h, T, NH, NKV, hs, causal);
            for (int i = 0; i < T; i++)
                for (int d = 0; d < hs; d++) {
                    double acc = 0.0;
                    for (int j = 0; j < T; j++)
                        acc += P[(size_t)i * T + j] *
                               qkv[((size_t)b * T + j) * ld + (size_t)(NH + NKV + kvh) * hs + d];
                    out[((size_t)b * T + i) * ldo + (size_t)h * hs + d] = acc;
                }
        }
    free(P);
}

/* out and lse are unused: P is recomputed from qkv, and D_i = sum_j P_ij dP_ij is taken
 * from the softmax Jacobian itself rather than from the identity D_i = dO_i . O_i the fast
 * kernel relies on. */
void dt_ref_attention_backward(double *dqkv, const double *dout, const double *qkv,
                               const double *out, const double *lse, int B, int T, int NH,
                               int NKV, int hs, int causal) {
    (void)out, (void)lse;
    const double scale = 1.0 / sqrt((double)hs);
    const size_t ld = (size_t)(NH + 2 * NKV) * hs, ldo = (size_t)NH * hs;
    double *P = malloc((size_t)T * T * sizeof(double));
    double *dP = malloc((size_t)T * T * sizeof(double));
    double *lrow = malloc((size_t)T * sizeof(double));
    DT_ASSERT(P != NULL && dP != NULL && lrow != NULL);
    memset(dqkv, 0, (size_t)B * T * ld * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int kvh = h / (NH / NKV);
            const double *Q = qkv + (size_t)b * T * ld + (size_t)h * hs;
            const double *K = qkv + (size_t)b * T * ld + (size_t)(NH + kvh) * hs;
            const double *V = qkv + (size_t)b * T * ld + (size_t)(NH + NKV + kvh) * hs;
            const double *dO = dout + (size_t)b * T * ldo + (size_t)h * hs;
            double *dQ = dqkv + (size_t)b * T * ld + (size_t)h * hs;
            double *dK = dqkv + (size_t)b * T * ld + (size_t)(NH + kvh) * hs;
            double *dV = dqkv + (size_t)b * T * ld + (size_t)(NH + NKV + kvh) * hs;
            ref_probs(P, lrow, qkv, b, h, T, NH, NKV, hs, causal);
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    double dp = 0.0;
                    for (int d = 0; d < hs; d++) dp += dO[(size_t)i * ldo + d] * V[j * ld + d];
                    dP[(size_t)i * T + j] = dp;
                }
            /* out_i = sum_j P_ij v_j  =>  dV_j += sum_i P_ij dO_i (summed over the group). */
            for (int j = 0; j < T; j++)
                for (int i = 0; i < T; i++)
                    for (int d = 0; d < hs; d++)
                        dV[j * ld + d] += P[(size_t)i * T + j] * dO[(size_t)i * ldo + d];
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
    free(P), free(dP), free(lrow);
}
