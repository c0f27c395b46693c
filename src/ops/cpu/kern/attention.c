/* Causal multi-head attention, flash-style, fp32 (one body for every ISA path: simd.h).
 *
 * Each (batch, head) pair is owned by one thread, so results do not depend on scheduling.
 * The thread first gathers its head out of the strided qkv rows into padded scratch: row
 * operands (Q, K, V, dO) as (Tp, hsp) and K^T, V^T as (hs, Tp), with Tp = T rounded up to
 * the tile size DT_ATT_BLK and hsp = hs rounded up to 16. Zero padding lets every tile be
 * full and every row a whole number of vectors (16 floats is a multiple of every VW);
 * padded keys are masked, padded query rows are never written.
 *
 * Forward: for each query tile, walk the key tiles at or before the diagonal (later tiles
 * are fully masked and skipped), keeping a running max m and sum l per row (online
 * softmax) and rescaling the output accumulator when m grows. lse = m + log(l) is saved.
 *
 * Backward: for each key tile (dK, dV accumulators stay hot), walk the query tiles at or
 * after it; P = exp(S - lse) is recomputed, D = rowsum(dO * O), dS = P (dP - D) scale, and
 * dV += P^T dO, dK += dS^T Q, dQ += dS K. Every product is one small GEMM on a tile; the
 * transposed operands are read through strides instead of being copied.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "ops/cpu/kern/kern.h"

/* 32 rows x 32 keys: diagonal tiles waste little work to masking, and one tile of S, dP and
 * the dK/dV accumulators stay in L1 while the head's operands stay in L2. */
#define DT_ATT_BLK 32

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

static float *scratch(size_t nfloat) {
    /* aligned_alloc wants a multiple of the alignment; all callers pass multiples of 16. */
    float *p = aligned_alloc(64, nfloat * sizeof(float));
    DT_ASSERT(p != NULL);
    return p;
}

/* One register block of the tile GEMM below: rows [0,MR) x vectors [0,NV) of C. Inlined
 * with constant MR, NV so the accumulators live in registers (MR * NV <= 16). */
static inline __attribute__((always_inline)) void mm_block(int MR, int NV, float *Cp,
                                                          int ldc, const float *A, int ais,
                                                          int aks, const float *Bp, int ldb,
                                                          int K, int accumulate) {
    vf acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            acc[r][v] = accumulate ? vf_load(Cp + (size_t)r * ldc + VW * v) : vf_zero();
    for (int k = 0; k < K; k++) {
        vf b[4];
        const float *brow = Bp + (size_t)k * ldb;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = vf_load(brow + VW * v);
        const float *acol = A + (size_t)k * aks;
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            vf a = vf_set1(acol[(size_t)r * ais]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = vf_fma(a, b[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) vf_store(Cp + (size_t)r * ldc + VW * v, acc[r][v]);
}

/* Register blocking per vector width: 4x4 vectors where the register file holds 16
 * accumulators plus operands (32 zmm / 32 NEON q / scalars), 4x2 on AVX2's 16 ymm. Every
 * element of C sums over k in the same order whatever the blocking. */
#define MM_WIDE (VW != 8)
#define MM_MR2 (VW == 8 ? 4 : 8)

/* C (M,N) = or += A (M,K) B (K,N). A(i,k) = A[i*ais + k*aks], so A^T is passed by swapping
 * the strides; B and C are row-major with leading dimensions ldb, ldc. M is a multiple of 8
 * and N of 16 (guaranteed by the padding). */
static void tile_mm(float *C, int ldc, const float *A, int ais, int aks, const float *B,
                    int ldb, int M, int N, int K, int accumulate) {
    for (int j = 0; j < N;) {
        if (MM_WIDE && N - j >= 4 * VW) {
            for (int i = 0; i < M; i += 4)
                mm_block(4, 4, C + (size_t)i * ldc + j, ldc, A + (size_t)i * ais, ais, aks,
                         B + j, ldb, K, accumulate);
            j += 4 * VW;
        } else if (N - j >= 2 * VW) {
            for (int i = 0; i < M; i += MM_MR2)
                mm_block(MM_MR2, 2, C + (size_t)i * ldc + j, ldc, A + (size_t)i * ais, ais,
                         aks, B + j, ldb, K, accumulate);
            j += 2 * VW;
        } else {
            for (int i = 0; i < M; i += 8)
                mm_block(8, 1, C + (size_t)i * ldc + j, ldc, A + (size_t)i * ais, ais, aks,
                         B + j, ldb, K, accumulate);
            j += VW;
        }
    }
}

/* dst (Tp, hsp) <- rows of src (stride ld), zero outside (T, hs). */
static void gather_rows(float *dst, const float *src, size_t ld, int T, int Tp, int hs,
                        int hsp) {
    for (int t = 0; t < Tp; t++) {
        float *d = dst + (size_t)t * hsp;
        int n = t < T ? hs : 0;
        if (n) memcpy(d, src + (size_t)t * ld, (size_t)hs * sizeof(float));
        memset(d + n, 0, (size_t)(hsp - n) * sizeof(float));
    }
}

/* dst (hs, Tp) <- transpose of rows of src, zero for t >= T. Blocks of 16 rows, so each
 * write fills a cache line: a plain column walk strides by Tp floats and thrashes L1 sets. */
static void gather_cols(float *dst, const float *src, size_t ld, int T, int Tp, int hs) {
    for (int t0 = 0; t0 < Tp; t0 += 16) {
        const int n = T - t0 < 16 ? (T - t0 > 0 ? T - t0 : 0) : 16;
        for (int i = 0; i < hs; i++) {
            float *d = dst + (size_t)i * Tp + t0;
            for (int t = 0; t < n; t++) d[t] = src[(size_t)(t0 + t) * ld + i];
            for (int t = n; t < 16; t++) d[t] = 0.0f;
        }
    }
}

/* Scales one row of scores and masks keys c >= nvalid (the causal boundary) to -inf. */
static void scale_mask_row(float *s, float scale, int nvalid) {
    vk_scale(s, scale, DT_ATT_BLK);
    for (int c = nvalid; c < DT_ATT_BLK; c++) s[c] = -INFINITY;
}

void DT_K(attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int C,
                          int NH) {
    const int hs = C / NH, hsp = round_up(hs, 16), Tp = round_up(T, DT_ATT_BLK);
    const int nb = Tp / DT_ATT_BLK, BL = DT_ATT_BLK;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t ld = (size_t)3 * C;
#pragma omp parallel
    {
        float *q = scratch((size_t)Tp * hsp), *v = scratch((size_t)Tp * hsp);
        float *kt = scratch((size_t)hs * Tp), *s = scratch((size_t)BL * BL);
        float *o = scratch((size_t)BL * hsp);
        float m[DT_ATT_BLK], l[DT_ATT_BLK];
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            const int b = bh / NH, h = bh % NH;
            const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
            gather_rows(q, base, ld, T, Tp, hs, hsp);
            gather_cols(kt, base + C, ld, T, Tp, hs);
            gather_rows(v, base + 2 * C, ld, T, Tp, hs, hsp);
            for (int ib = 0; ib < nb; ib++) {
                const int i0 = ib * BL;
                memset(o, 0, (size_t)BL * hsp * sizeof(float));
                for (int r = 0; r < BL; r++) m[r] = -INFINITY, l[r] = 0.0f;
                for (int jb = 0; jb <= ib; jb++) {
                    const int j0 = jb * BL;
                    tile_mm(s, BL, q + (size_t)i0 * hsp, hsp, 1, kt + j0, Tp, BL, BL, hs, 0);
                    for (int r = 0; r < BL; r++) {
                        float *sr = s + r * BL;
                        /* Tiles are aligned, so on the diagonal row r sees keys 0..r; every
                         * row has a finite max and m never stays -inf after a tile. */
                        scale_mask_row(sr, scale, jb == ib ? r + 1 : BL);
                        float mnew = fmaxf(m[r], vk_max(sr, BL));
                        float corr = dt_k_expf(m[r] - mnew); /* 0 on the first tile */
                        l[r] = l[r] * corr + vk_exp_sum(sr, sr, mnew, BL);
                        m[r] = mnew;
                        if (corr != 1.0f) {
                            float *orow = o + (size_t)r * hsp;
                            vk_scale(orow, corr, hsp);
                        }
                    }
                    tile_mm(o, hsp, s, BL, 1, v + (size_t)j0 * hsp, hsp, BL, hsp, BL, 1);
                }
                for (int r = 0; r < BL && i0 + r < T; r++) {
                    const int t = i0 + r;
                    const float inv = 1.0f / l[r];
                    float *dst = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                    for (int d = 0; d < hs; d++) dst[d] = o[(size_t)r * hsp + d] * inv;
                    lse[((size_t)b * NH + h) * T + t] = m[r] + logf(l[r]);
                }
            }
        }
        free(q), free(v), free(kt), free(s), free(o);
    }
}

/* Scratch of one thread for the backward pass. */
typedef struct att_bwd_buf {
    float *q, *k, *dout, *dq, *dk, *dv; /* (Tp, hsp) */
    float *kt, *vt;                     /* (hs, Tp) */
    float *D, *L;                       /* (Tp): rowsum(dO * O) and lse, 0 in padding */
    float *p, *ds;                      /* (BLK, BLK) tiles */
} att_bwd_buf;

/* Gathers head h of batch b and zeroes the gradient accumulators. */
static void bwd_load(att_bwd_buf *w, const float *dout, const float *qkv, const float *out,
                     const float *lse, int b, int h, int T, int Tp, int C, int NH, int hs,
                     int hsp) {
    const size_t ld = (size_t)3 * C;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
    const float *obase = out + (size_t)b * T * C + (size_t)h * hs;
    const float *dbase = dout + (size_t)b * T * C + (size_t)h * hs;
    gather_rows(w->q, base, ld, T, Tp, hs, hsp);
    gather_rows(w->k, base + C, ld, T, Tp, hs, hsp);
    gather_cols(w->kt, base + C, ld, T, Tp, hs);
    gather_cols(w->vt, base + 2 * C, ld, T, Tp, hs);
    gather_rows(w->dout, dbase, (size_t)C, T, Tp, hs, hsp);
    for (int t = 0; t < Tp; t++) {
        w->D[t] = t < T ? vk_dot(w->dout + (size_t)t * hsp, obase + (size_t)t * C, hs) : 0.0f;
        w->L[t] = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
    }
    size_t n = (size_t)Tp * hsp * sizeof(float);
    memset(w->dq, 0, n), memset(w->dk, 0, n), memset(w->dv, 0, n);
}

/* Writes the head's dQ, dK, dV into its slices of dqkv (every element of dqkv belongs to
 * exactly one head, so together the heads overwrite all of it). */
static void bwd_store(float *dqkv, const att_bwd_buf *w, int b, int h, int T, int C, int hs,
                      int hsp) {
    const size_t ld = (size_t)3 * C;
    float *base = dqkv + (size_t)b * T * ld + (size_t)h * hs;
    for (int t = 0; t < T; t++) {
        float *row = base + (size_t)t * ld;
        memcpy(row, w->dq + (size_t)t * hsp, (size_t)hs * sizeof(float));
        memcpy(row + C, w->dk + (size_t)t * hsp, (size_t)hs * sizeof(float));
        memcpy(row + 2 * C, w->dv + (size_t)t * hsp, (size_t)hs * sizeof(float));
    }
}

/* One (query tile i0, key tile j0) step of the backward pass. Padded query rows have
 * dO = 0 and D = 0, hence dS = 0: they add exact zeros. */
static void bwd_tile(att_bwd_buf *w, int i0, int j0, int diag, int Tp, int hs, int hsp,
                     float scale) {
    const int BL = DT_ATT_BLK;
    float *p = w->p, *ds = w->ds;
    tile_mm(p, BL, w->q + (size_t)i0 * hsp, hsp, 1, w->kt + j0, Tp, BL, BL, hs, 0);
    tile_mm(ds, BL, w->dout + (size_t)i0 * hsp, hsp, 1, w->vt + j0, Tp, BL, BL, hs, 0);
    for (int r = 0; r < BL; r++) {
        float *pr = p + r * BL, *dr = ds + r * BL;
        scale_mask_row(pr, scale, diag ? r + 1 : BL);
        vk_exp_sum(pr, pr, w->L[i0 + r], BL);
        const float Di = w->D[i0 + r];
        const vf vd = vf_set1(Di), vs = vf_set1(scale);
        for (int c = 0; c < BL; c += VW)
            vf_store(dr + c, vf_mul(vf_mul(vf_load(pr + c), vf_sub(vf_load(dr + c), vd)), vs));
    }
    /* dV += P^T dO, dK += dS^T Q: transposes read through swapped strides. */
    tile_mm(w->dv + (size_t)j0 * hsp, hsp, p, 1, BL, w->dout + (size_t)i0 * hsp, hsp, BL,
            hsp, BL, 1);
    tile_mm(w->dk + (size_t)j0 * hsp, hsp, ds, 1, BL, w->q + (size_t)i0 * hsp, hsp, BL, hsp,
            BL, 1);
    tile_mm(w->dq + (size_t)i0 * hsp, hsp, ds, BL, 1, w->k + (size_t)j0 * hsp, hsp, BL, hsp,
            BL, 1);
}

void DT_K(attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int C, int NH) {
    const int hs = C / NH, hsp = round_up(hs, 16), Tp = round_up(T, DT_ATT_BLK);
    const int nb = Tp / DT_ATT_BLK;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        att_bwd_buf w;
        const size_t nrow = (size_t)Tp * hsp, ncol = (size_t)hs * Tp;
        w.q = scratch(nrow), w.k = scratch(nrow), w.dout = scratch(nrow);
        w.dq = scratch(nrow), w.dk = scratch(nrow), w.dv = scratch(nrow);
        w.kt = scratch(ncol), w.vt = scratch(ncol);
        w.D = scratch((size_t)Tp), w.L = scratch((size_t)Tp);
        w.p = scratch((size_t)DT_ATT_BLK * DT_ATT_BLK);
        w.ds = scratch((size_t)DT_ATT_BLK * DT_ATT_BLK);
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            const int b = bh / NH, h = bh % NH;
            bwd_load(&w, dout, qkv, out, lse, b, h, T, Tp, C, NH, hs, hsp);
            for (int jb = 0; jb < nb; jb++)
                for (int ib = jb; ib < nb; ib++)
                    bwd_tile(&w, ib * DT_ATT_BLK, jb * DT_ATT_BLK, ib == jb, Tp, hs, hsp,
                             scale);
            bwd_store(dqkv, &w, b, h, T, C, hs, hsp);
        }
        free(w.q), free(w.k), free(w.dout), free(w.dq), free(w.dk), free(w.dv);
        free(w.kt), free(w.vt), free(w.D), free(w.L), free(w.p), free(w.ds);
    }
}
