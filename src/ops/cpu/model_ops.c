/* The CPU backend's operations of the model layer (ops.h, "model/ operations"): the vision
 * embedding, the vocabulary-parallel cross-entropy's backward, the in-place narrowing of
 * dlogits, and parameter initialisation. Each is the loop the model ran before the backend
 * seam (ARCHITECTURE decision 73), with its arithmetic, order of sums and OpenMP schedule. */
#include <string.h>

#include "core/rng.h"
#include "ops/cpu/kernels.h"

void dt_cpu_patchify(float *patches, const int32_t *pix, int B, int CH, int S, int p) {
    const int g = S / p;
    const size_t K = (size_t)CH * p * p, Np = (size_t)g * g, P = (size_t)CH * S * S;
#pragma omp parallel for schedule(static)
    for (int bp = 0; bp < B * (int)Np; bp++) {
        const int b = bp / (int)Np, q = bp % (int)Np, gy = q / g, gx = q % g;
        float *dst = patches + (size_t)bp * K;
        for (int ch = 0; ch < CH; ch++)
            for (int py = 0; py < p; py++)
                for (int px = 0; px < p; px++)
                    dst[((size_t)ch * p + py) * p + px] =
                        (float)pix[(size_t)b * P + ((size_t)ch * S + (size_t)(gy * p + py)) * S + (size_t)(gx * p + px)] /
                        255.0f;
    }
}

void dt_cpu_cls_pos_forward(float *out, const float *cls, const float *pe, const float *pos, int r0, int rows, int T,
                            int C) {
    const int Np = T - 1;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) {
        const int bt = r0 + i, b = bt / T, t = bt % T;
        const float *src = t == 0 ? cls : pe + ((size_t)b * Np + (size_t)(t - 1)) * C;
        float *dst = out + (size_t)i * C;
        for (int k = 0; k < C; k++) dst[k] = src[k] + pos[(size_t)t * C + k];
    }
}

void dt_cpu_cls_pos_backward(float *dpos, float *dcls, float *dpe, const float *dout, int B, int T, int C) {
    const int Np = T - 1;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++) {
            const float *dr = dout + ((size_t)b * T + t) * C;
            float *dp = dpos + (size_t)t * C;
            for (int i = 0; i < C; i++) dp[i] += dr[i];
            if (t == 0)
                for (int i = 0; i < C; i++) dcls[i] += dr[i];
            else
                memcpy(dpe + ((size_t)b * Np + (size_t)(t - 1)) * C, dr, (size_t)C * sizeof(float));
        }
}

/* Real (unpadded) columns of block j: those of canonical index < V. */
static inline int block_real(long col0, int j, int Vl, int V) {
    long lo = col0 + (long)j * Vl, n = V - lo;
    return n <= 0 ? 0 : n < (long)Vl ? (int)n : Vl;
}

void dt_cpu_crossentropy_backward_blocks(float *dlogits, const float *lse, const int32_t *targets, float dloss, int N,
                                         int ld, int nb, int Vl, long col0, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *d = dlogits + (size_t)n * ld;
        if (targets[n] < 0) {
            memset(d, 0, (size_t)ld * sizeof(float));
            continue;
        }
        for (int j = 0; j < nb; j++) {
            float *dj = d + (size_t)j * Vl;
            int r = block_real(col0, j, Vl, V);
            dt_cpu_exp_sum(dj, dj, lse[n], r);
            for (int i = 0; i < r; i++) dj[i] *= dloss;
            if (r < Vl) memset(dj + r, 0, (size_t)(Vl - r) * sizeof(float));
        }
        long tg = targets[n] - col0;
        if (tg >= 0 && tg < (long)nb * Vl) d[tg] -= dloss;
    }
}

void dt_cpu_f32_to_lowp_rows_inplace(dt_dtype dt, float *x, int N, int ld) {
    enum { BLK = 256 };
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    void (*narrow)(uint16_t *, const float *, size_t) = dt == DT_BF16 ? dt_cpu_f32_to_bf16 : dt_cpu_f32_to_f16;
    /* Block b of a row reads floats [256 b, 256 b + 256) and writes 16-bit values over bytes
     * [512 b, 512 b + 512): below every later block's input, and its own input is copied
     * first, so front to back in place is safe. */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        float *row = x + (size_t)r * ld, f[BLK];
        uint16_t *h = (uint16_t *)row, hb[BLK];
        for (int b = 0; b < ld; b += BLK) {
            int n = ld - b < BLK ? ld - b : BLK;
            memcpy(f, row + b, (size_t)n * sizeof(float));
            narrow(hb, f, (size_t)n);
            memcpy(h + b, hb, (size_t)n * sizeof(uint16_t));
        }
    }
}

void dt_cpu_fill_normal(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t i0, uint64_t drawn, float std) {
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < n; k++) {
        const uint64_t i = i0 + k;
        dst[k] = i < drawn ? std * dt_rng_normal(seed, stream, i) : 0.0f;
    }
}

void dt_cpu_fill_f32(float *dst, float v, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < n; k++) dst[k] = v;
}
