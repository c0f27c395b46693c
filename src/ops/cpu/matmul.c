/* Linear layers through oneDNN's row-major sgemm (JIT AVX-512 kernels, OpenMP threads).
 * The bias is folded in by pre-filling the output and running the GEMM with beta = 1;
 * weight gradients accumulate with beta = 1 for micro-step accumulation. */
#include <oneapi/dnnl/dnnl.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/status.h"
#include "ops/ops.h"

static void sgemm(char ta, char tb, long M, long N, long K, const float *A, long lda,
                  const float *B, long ldb, float beta, float *C, long ldc) {
    dnnl_status_t s = dnnl_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    /* Only invalid arguments make sgemm fail: a programming error, not a runtime one. */
    DT_ASSERT(s == dnnl_success);
}

void dt_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                       int C, int OC) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    /* out (N,OC) = inp (N,C) . w^T */
    sgemm('N', 'T', N, OC, C, inp, C, w, C, beta, out, OC);
}

void dt_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, int N, int C, int OC) {
    /* dinp (N,C) = dout (N,OC) . w (OC,C) */
    if (dinp) sgemm('N', 'N', N, C, OC, dout, OC, w, C, 0.0f, dinp, C);
    /* dw (OC,C) += dout^T (OC,N) . inp (N,C) */
    sgemm('T', 'N', OC, C, N, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) {
        /* Column sums; threads own column ranges and add rows in order (deterministic). */
#pragma omp parallel
        {
#ifdef _OPENMP
            int nt = omp_get_num_threads(), tid = omp_get_thread_num();
#else
            int nt = 1, tid = 0;
#endif
            int per = (OC + nt - 1) / nt;
            int o0 = tid * per, o1 = o0 + per < OC ? o0 + per : OC;
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC;
                for (int o = o0; o < o1; o++) dbias[o] += d[o];
            }
        }
    }
}
