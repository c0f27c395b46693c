/* Linear layers through oneDNN's row-major sgemm (JIT kernels for the CPU, OpenMP threads).
 * The bias is folded in by pre-filling the output and running the GEMM with beta = 1;
 * weight gradients accumulate with beta = 1 for micro-step accumulation; the bias gradient
 * (column sums) is a kernel of the active ISA path. */
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "core/sortcmp.h"
#include "core/status.h"
#include "core/timer.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/ops.h"

/* C = A' B' + beta C with plain loops (DTRAIN_MATMUL=ref): every output is one float sum
 * over k in index order, rows split over threads, so the bits do not depend on the CPU or
 * the thread count. */
static void sgemm_ref(char ta, char tb, long M, long N, long K, const float *A, long lda,
                      const float *B, long ldb, float beta, float *C, long ldc) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < M; i++)
        for (long j = 0; j < N; j++) {
            float acc = 0.0f;
            for (long k = 0; k < K; k++) {
                float a = ta == 'N' ? A[i * lda + k] : A[k * lda + i];
                float b = tb == 'N' ? B[k * ldb + j] : B[j * ldb + k];
                acc += a * b;
            }
            C[i * ldc + j] = beta == 0.0f ? acc : acc + beta * C[i * ldc + j];
        }
}

static void sgemm_onednn(char ta, char tb, long M, long N, long K, const float *A, long lda,
                         const float *B, long ldb, float beta, float *C, long ldc);

static void sgemm(char ta, char tb, long M, long N, long K, const float *A, long lda,
                  const float *B, long ldb, float beta, float *C, long ldc) {
    if (dt_isa_matmul_ref()) {
        sgemm_ref(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    sgemm_onednn(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

void dt_sgemm(char ta, char tb, long M, long N, long K, const float *A, long lda,
              const float *B, long ldb, float beta, float *C, long ldc) {
    sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

/* The hardware's GEMM (also the peak measurement under DTRAIN_MATMUL=ref). */
static void sgemm_onednn(char ta, char tb, long M, long N, long K, const float *A, long lda,
                         const float *B, long ldb, float beta, float *C, long ldc) {
    dnnl_status_t s = dnnl_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    /* Only invalid arguments make sgemm fail: a programming error, not a runtime one. */
    DT_ASSERT(s == dnnl_success);
}

void dt_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
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

void dt_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, int N, int C, int OC) {
    /* dinp (N,C) = dout (N,OC) . w (OC,C) */
    if (dinp) sgemm('N', 'N', N, C, OC, dout, OC, w, C, 0.0f, dinp, C);
    /* dw (OC,C) += dout^T (OC,N) . inp (N,C) */
    sgemm('T', 'N', OC, C, N, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) dt_cpu_kernels_get()->bias_backward(dbias, dout, N, OC);
}

void dt_cpu_matmul_forward_ld(float *out, int ldo, const float *inp, const float *w, int N, int C,
                          int OC) {
    sgemm('N', 'T', N, OC, C, inp, C, w, C, 0.0f, out, ldo);
}

void dt_cpu_matmul_backward_ld(float *dinp, int accumulate, float *dw, const float *dout, int ldd,
                           const float *inp, const float *w, int N, int C, int OC) {
    if (dinp) sgemm('N', 'N', N, C, OC, dout, ldd, w, C, accumulate ? 1.0f : 0.0f, dinp, C);
    if (dw) sgemm('T', 'N', OC, C, N, dout, ldd, inp, C, 1.0f, dw, C);
}

/* Median (and best) GFLOP/s of run(arg), an n x n x n GEMM, over `reps` timed runs after
 * one warm-up run (JIT, page faults, primitive creation); 0 if memory runs out. */
double dt_gemm_rate(void (*run)(void *), void *arg, int n, int reps, double *best) {
    double *t = malloc((size_t)(reps > 0 ? reps : 1) * sizeof(double)), median = 0.0;
    if (best) *best = 0.0;
    if (!t || reps < 1) goto done;
    run(arg);
    for (int r = 0; r < reps; r++) {
        double t0 = dt_now();
        run(arg);
        t[r] = dt_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, dt_cmp_double);
    double flops = 2.0 * n * (double)n * n;
    median = flops / (reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2])) / 1e9;
    if (best) *best = flops / t[0] / 1e9;
done:
    free(t);
    return median;
}

typedef struct sq_args {
    int n;
    const float *a, *b;
    float *c;
} sq_args;

static void sq_sgemm(void *p) {
    const sq_args *s = p;
    sgemm_onednn('N', 'N', s->n, s->n, s->n, s->a, s->n, s->b, s->n, 0.0f, s->c, s->n);
}

/* Median (and best) GFLOP/s of sgemm on n x n x n over `reps` runs after one warm-up run;
 * 0 if memory runs out. Uses the current OpenMP thread count. */
double dt_cpu_matmul_peak_gflops(int n, int reps, double *best) {
    size_t nn = (size_t)n * n;
    float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float)),
          *c = malloc(nn * sizeof(float));
    double median = 0.0;
    if (best) *best = 0.0;
    if (!a || !b || !c) goto done;
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 7) * 0.01f;
        b[i] = (float)(i % 5) * 0.01f;
    }
    sq_args s = {n, a, b, c};
    median = dt_gemm_rate(sq_sgemm, &s, n, reps, best);
done:
    free(a);
    free(b);
    free(c);
    return median;
}
