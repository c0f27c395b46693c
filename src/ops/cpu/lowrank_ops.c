/* The CPU backend's low-rank adapter products (ops.h: dt_lowrank_*), LoRA's arithmetic with
 * its dropout applied on the fly (ARCHITECTURE decisions 49, 73). */
#include "ops/cpu/kernels.h"

/* Blocking of the loops: columns of x widened at a time (16-bit x), ranks and output rows per
 * accumulator block. Each output element is still one sum in ascending order of its index
 * (c, j, n or k), whatever the blocks and threads. */
enum { XB = 64, KB = 16, JB = 8 };

/* Row n's mask key (0 without dropout). */
static inline uint64_t row_key(const dt_dropout *d, int n) { return d->on ? dt_dropout_row_key(d, n) : 0; }

/* x[n, c0 .. c0 + len) in fp32: a pointer into xf, or widened from xh into tmp; under
 * dropout drop(x) in tmp (key: row n's). */
static inline const float *xseg(const float *xf, const uint16_t *xh, dt_dtype xdt, int n, int C, int c0, int len,
                                float *tmp, const dt_dropout *d, uint64_t key) {
    const float *x = xf + (size_t)n * C + c0;
    if (xh) {
        if (xdt == DT_BF16)
            dt_cpu_bf16_to_f32(tmp, xh + (size_t)n * C + c0, (size_t)len);
        else
            dt_cpu_f16_to_f32(tmp, xh + (size_t)n * C + c0, (size_t)len);
        x = tmp;
    }
    if (!d->on) return x;
    for (int c = 0; c < len; c++) tmp[c] = dt_dropout_kept(d, key, c0 + c) ? x[c] * d->inv : 0.0f;
    return tmp;
}

void dt_cpu_lowrank_down_forward(float *u, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N,
                                 int C, int r, const dt_dropout *d) {
    DT_ASSERT(!xh || xdt == DT_BF16 || xdt == DT_F16);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float tmp[XB];
        float *un = u + (size_t)n * r;
        const uint64_t key = row_key(d, n);
        for (int k = 0; k < r; k++) un[k] = 0.0f;
        for (int c0 = 0; c0 < C; c0 += XB) {
            int len = C - c0 < XB ? C - c0 : XB;
            const float *xs = xseg(xf, xh, xdt, n, C, c0, len, tmp, d, key);
            for (int k = 0; k < r; k++) {
                const float *a = A + (size_t)k * C + c0;
                float acc = un[k];
                for (int c = 0; c < len; c++) acc += xs[c] * a[c];
                un[k] = acc;
            }
        }
    }
}

void dt_cpu_lowrank_up_forward(float *out, int ldo, const float *u, const float *B, float s, int N, int rows, int r) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *un = u + (size_t)n * r;
        float *o = out + (size_t)n * ldo;
        for (int j = 0; j < rows; j++) {
            const float *b = B + (size_t)j * r;
            float acc = 0.0f;
            for (int k = 0; k < r; k++) acc += un[k] * b[k];
            o[j] += s * acc;
        }
    }
}

void dt_cpu_lowrank_up_backward(float *dB, float *du, const float *dout, int ldd, const float *u, const float *B,
                                float s, int N, int rows, int r) {
    /* dB[j, k] += s sum_n g[n, j] u[n, k]: JB output rows at a time (dout read by rows) */
    int nj = dB ? (rows + JB - 1) / JB : 0; /* dB NULL: skipped */
#pragma omp parallel for schedule(static)
    for (int jb = 0; jb < nj; jb++) {
        int j0 = jb * JB, nr = rows - j0 < JB ? rows - j0 : JB;
        for (int k0 = 0; k0 < r; k0 += KB) {
            int nk = r - k0 < KB ? r - k0 : KB;
            float acc[JB * KB] = {0};
            for (int n = 0; n < N; n++) {
                const float *gr = dout + (size_t)n * ldd + j0, *un = u + (size_t)n * r + k0;
                for (int j = 0; j < nr; j++)
                    for (int k = 0; k < nk; k++) acc[j * KB + k] += gr[j] * un[k];
            }
            for (int j = 0; j < nr; j++)
                for (int k = 0; k < nk; k++) dB[(size_t)(j0 + j) * r + k0 + k] += s * acc[j * KB + k];
        }
    }
    /* du[n, k] = s sum_j g[n, j] B[j, k] */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *gr = dout + (size_t)n * ldd;
        float *dn = du + (size_t)n * r;
        for (int k = 0; k < r; k++) dn[k] = 0.0f;
        for (int j = 0; j < rows; j++) {
            const float gj = gr[j], *b = B + (size_t)j * r;
            for (int k = 0; k < r; k++) dn[k] += gj * b[k];
        }
        for (int k = 0; k < r; k++) dn[k] *= s;
    }
}

void dt_cpu_lowrank_down_backward(float *dA, float *dinp, const float *du, const float *xf, const uint16_t *xh,
                                  dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d) {
    DT_ASSERT(!xh || xdt == DT_BF16 || xdt == DT_F16);
    /* dA[k, c] += sum_n du[n, k] drop(x)[n, c]: blocks of XB columns x KB ranks, x widened once
     * per row and block */
    int nblk = dA ? (C + XB - 1) / XB : 0; /* dA NULL: skipped */
#pragma omp parallel for schedule(static)
    for (int bi = 0; bi < nblk; bi++) {
        int c0 = bi * XB, len = C - c0 < XB ? C - c0 : XB;
        float tmp[XB];
        for (int k0 = 0; k0 < r; k0 += KB) {
            int nk = r - k0 < KB ? r - k0 : KB;
            float acc[KB * XB] = {0};
            for (int n = 0; n < N; n++) {
                const float *xs = xseg(xf, xh, xdt, n, C, c0, len, tmp, d, row_key(d, n));
                const float *dn = du + (size_t)n * r + k0;
                for (int k = 0; k < nk; k++) {
                    const float g = dn[k];
                    float *a = acc + k * XB;
                    for (int c = 0; c < len; c++) a[c] += g * xs[c];
                }
            }
            for (int k = 0; k < nk; k++) {
                float *da = dA + (size_t)(k0 + k) * C + c0;
                for (int c = 0; c < len; c++) da[c] += acc[k * XB + c];
            }
        }
    }
    if (!dinp) return;
    /* dinp[n, c] += sum_k du[n, k] A[k, c] (times mask / (1 - p) under dropout): the sum
     * formed apart, then added */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *dx = dinp + (size_t)n * C;
        const uint64_t key = row_key(d, n);
        const float *dn = du + (size_t)n * r;
        for (int c0 = 0; c0 < C; c0 += XB) {
            int len = C - c0 < XB ? C - c0 : XB;
            float acc[XB] = {0};
            for (int k = 0; k < r; k++) {
                const float dk = dn[k], *a = A + (size_t)k * C + c0;
                for (int c = 0; c < len; c++) acc[c] += dk * a[c];
            }
            if (!d->on)
                for (int c = 0; c < len; c++) dx[c0 + c] += acc[c];
            else
                for (int c = 0; c < len; c++)
                    if (dt_dropout_kept(d, key, c0 + c)) dx[c0 + c] += acc[c] * d->inv;
        }
    }
}

void dt_cpu_lowrank_merge(float *W, const float *A, const float *B, float s, int rows, int C, int r) {
#pragma omp parallel for schedule(static)
    for (int j = 0; j < rows; j++)
        for (size_t c = 0; c < (size_t)C; c++) {
            double acc = 0.0;
            for (int k = 0; k < r; k++) acc += (double)B[(size_t)j * r + k] * (double)A[(size_t)k * C + c];
            float *w = W + (size_t)j * C + c;
            *w = (float)((double)*w + (double)s * acc);
        }
}
