/* Multi-head attention, flash-style, fp32 (one body for every ISA path: simd.h): causal or
 * bidirectional, with grouped-query heads (NKV key/value heads shared by NH query heads).
 *
 * qkv rows are packed as NH q-heads | NKV k-heads | NKV v-heads, hs floats each; query head
 * h reads kv head h / (NH/NKV). Plain multi-head attention is NKV == NH, and then every
 * floating-point operation, and its order, is that of the original causal MHA kernel.
 *
 * The thread owning a head first gathers it out of the strided qkv rows into padded
 * scratch: row operands (Q, K, V, dO) as (Tp, hsp) and K^T, V^T as (hs, Tp), with Tp = T
 * rounded up to the tile size DT_ATT_BLK and hsp = hs rounded up to 16. Zero padding lets
 * every tile be full and every row a whole number of vectors (16 floats is a multiple of
 * every VW); padded keys are masked, padded query rows are never written.
 *
 * Forward, one task per (batch, query head): for each query tile, walk the key tiles (in
 * causal mode only those at or before the diagonal: later tiles are fully masked), keeping
 * a running max m and sum l per row (online softmax) and rescaling the output accumulator
 * when m grows. lse = m + log(l) is saved.
 *
 * Backward, one task per (batch, kv head), so dK and dV of a kv head are summed over its
 * query heads in a fixed order (ascending h) without atomics. For each query head, for each
 * key tile (dK, dV accumulators stay hot), walk the query tiles that see it; P = exp(S -
 * lse) is recomputed, D = rowsum(dO * O), dS = P (dP - D) scale, and dV += P^T dO,
 * dK += dS^T Q, dQ += dS K. Every product is one small GEMM on a tile; the transposed
 * operands are read through strides instead of being copied. Parallelism is B * NKV tasks
 * (B for multi-query attention).
 *
 * Mixed precision (op = DT_BF16 / DT_F16): every product takes operands rounded to the 16-bit
 * type, with fp32 sums, which is what a 16-bit flash kernel multiplies (FlashAttention-2's
 * rule): the gathered Q, K, V, dO are rounded once, the probability tile before P V (forward:
 * exp(s - running max); backward: exp(s - lse)) and dS before dK and dQ. The softmax
 * statistics, the rescaling, D and dS itself are formed in fp32. The products of two rounded
 * values are exact in fp32, so this is the 16-bit arithmetic, computed on the fp32 FMA units
 * (no speed-up: attention is a few percent of a step).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
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

/* x (n floats) rounded in place to the 16-bit type op (nearest even); DT_F32: unchanged. */
static void round_op(float *x, size_t n, int op) {
    if (op == DT_F32) return;
    uint16_t h[256];
    for (size_t i = 0; i < n; i += 256) {
        size_t k = n - i < 256 ? n - i : 256;
        if (op == DT_BF16) {
            DT_K(f32_to_bf16)(h, x + i, k);
            DT_K(bf16_to_f32)(x + i, h, k);
        } else {
            DT_K(f32_to_f16)(h, x + i, k);
            DT_K(f16_to_f32)(x + i, h, k);
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

/* Scales one row of scores and masks keys c >= nvalid (the causal boundary, or the end of
 * the sequence) to -inf. */
static void scale_mask_row(float *s, float scale, int nvalid) {
    vk_scale(s, scale, DT_ATT_BLK);
    for (int c = nvalid; c < DT_ATT_BLK; c++) s[c] = -INFINITY;
}

/* Keys of key tile j0 that row r of query tile i0 sees. Causal: tiles are aligned, so on
 * the diagonal row r sees keys 0..r (and tiles after the diagonal are never visited).
 * Bidirectional: every key before T. Every valid row sees at least one key, so its max is
 * finite after the first tile. */
static inline int keys_seen(int causal, int i0, int j0, int r, int T) {
    if (causal) return i0 == j0 ? r + 1 : DT_ATT_BLK;
    return T - j0 < DT_ATT_BLK ? T - j0 : DT_ATT_BLK;
}

/* Geometry of one call: the packed qkv row and where each head starts in it. */
typedef struct att_geom {
    int T, Tp, nb, NH, NKV, hs, hsp, causal;
    size_t ld;   /* floats per qkv row: (NH + 2 NKV) hs */
    size_t ldo;  /* floats per out / dout row: NH hs */
    float scale; /* 1 / sqrt(hs) */
} att_geom;

static att_geom geom(int T, int NH, int NKV, int hs, int causal) {
    DT_ASSERT(NKV > 0 && NH % NKV == 0 && hs > 0 && T >= 0);
    att_geom g;
    g.T = T, g.Tp = round_up(T, DT_ATT_BLK), g.nb = g.Tp / DT_ATT_BLK;
    g.NH = NH, g.NKV = NKV, g.hs = hs, g.hsp = round_up(hs, 16), g.causal = causal;
    g.ld = (size_t)(NH + 2 * NKV) * hs, g.ldo = (size_t)NH * hs;
    g.scale = 1.0f / sqrtf((float)hs);
    return g;
}

/* Offsets in a qkv row of query head h, and of key and value head kvh. */
static size_t q_off(const att_geom *g, int h) { return (size_t)h * g->hs; }
static size_t k_off(const att_geom *g, int kvh) { return (size_t)(g->NH + kvh) * g->hs; }
static size_t v_off(const att_geom *g, int kvh) {
    return (size_t)(g->NH + g->NKV + kvh) * g->hs;
}

void DT_K(attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int NH,
                             int NKV, int hs, int causal, int op) {
    const att_geom g = geom(T, NH, NKV, hs, causal);
    const int hsp = g.hsp, Tp = g.Tp, nb = g.nb, BL = DT_ATT_BLK, group = NH / NKV;
    const float scale = g.scale;
#pragma omp parallel
    {
        float *q = scratch((size_t)Tp * hsp), *v = scratch((size_t)Tp * hsp);
        float *kt = scratch((size_t)hs * Tp), *s = scratch((size_t)BL * BL);
        float *o = scratch((size_t)BL * hsp);
        float m[DT_ATT_BLK], l[DT_ATT_BLK];
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            const int b = bh / NH, h = bh % NH, kvh = h / group;
            const float *row0 = qkv + (size_t)b * T * g.ld;
            gather_rows(q, row0 + q_off(&g, h), g.ld, T, Tp, hs, hsp);
            gather_cols(kt, row0 + k_off(&g, kvh), g.ld, T, Tp, hs);
            gather_rows(v, row0 + v_off(&g, kvh), g.ld, T, Tp, hs, hsp);
            round_op(q, (size_t)Tp * hsp, op), round_op(kt, (size_t)hs * Tp, op), round_op(v, (size_t)Tp * hsp, op);
            for (int ib = 0; ib < nb; ib++) {
                const int i0 = ib * BL, jend = causal ? ib : nb - 1;
                memset(o, 0, (size_t)BL * hsp * sizeof(float));
                for (int r = 0; r < BL; r++) m[r] = -INFINITY, l[r] = 0.0f;
                for (int jb = 0; jb <= jend; jb++) {
                    const int j0 = jb * BL;
                    tile_mm(s, BL, q + (size_t)i0 * hsp, hsp, 1, kt + j0, Tp, BL, BL, hs, 0);
                    for (int r = 0; r < BL; r++) {
                        float *sr = s + r * BL;
                        scale_mask_row(sr, scale, keys_seen(causal, i0, j0, r, T));
                        float mnew = fmaxf(m[r], vk_max(sr, BL));
                        float corr = dt_k_expf(m[r] - mnew); /* 0 on the first tile */
                        l[r] = l[r] * corr + vk_exp_sum(sr, sr, mnew, BL);
                        m[r] = mnew;
                        if (corr != 1.0f) {
                            float *orow = o + (size_t)r * hsp;
                            vk_scale(orow, corr, hsp);
                        }
                    }
                    round_op(s, (size_t)BL * BL, op);
                    tile_mm(o, hsp, s, BL, 1, v + (size_t)j0 * hsp, hsp, BL, hsp, BL, 1);
                }
                for (int r = 0; r < BL && i0 + r < T; r++) {
                    const int t = i0 + r;
                    const float inv = 1.0f / l[r];
                    float *dst = out + ((size_t)b * T + t) * g.ldo + q_off(&g, h);
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
    int op;                             /* operand type (mixed precision) */
} att_bwd_buf;

/* Gathers kv head kvh of batch b and zeroes its gradient accumulators. */
static void bwd_load_kv(att_bwd_buf *w, const float *qkv, const att_geom *g, int b, int kvh) {
    const float *row0 = qkv + (size_t)b * g->T * g->ld;
    gather_rows(w->k, row0 + k_off(g, kvh), g->ld, g->T, g->Tp, g->hs, g->hsp);
    gather_cols(w->kt, row0 + k_off(g, kvh), g->ld, g->T, g->Tp, g->hs);
    gather_cols(w->vt, row0 + v_off(g, kvh), g->ld, g->T, g->Tp, g->hs);
    round_op(w->k, (size_t)g->Tp * g->hsp, w->op), round_op(w->kt, (size_t)g->hs * g->Tp, w->op);
    round_op(w->vt, (size_t)g->hs * g->Tp, w->op);
    size_t n = (size_t)g->Tp * g->hsp * sizeof(float);
    memset(w->dk, 0, n), memset(w->dv, 0, n);
}

/* Gathers query head h of batch b (Q, dO, D, lse) and zeroes its dQ accumulator. */
static void bwd_load_q(att_bwd_buf *w, const float *dout, const float *qkv, const float *out,
                       const float *lse, const att_geom *g, int b, int h) {
    const int T = g->T, Tp = g->Tp, hs = g->hs, hsp = g->hsp;
    const float *obase = out + (size_t)b * T * g->ldo + q_off(g, h);
    const float *dbase = dout + (size_t)b * T * g->ldo + q_off(g, h);
    gather_rows(w->q, qkv + (size_t)b * T * g->ld + q_off(g, h), g->ld, T, Tp, hs, hsp);
    gather_rows(w->dout, dbase, g->ldo, T, Tp, hs, hsp);
    round_op(w->q, (size_t)Tp * hsp, w->op), round_op(w->dout, (size_t)Tp * hsp, w->op);
    for (int t = 0; t < Tp; t++) {
        w->D[t] = t < T ? vk_dot(w->dout + (size_t)t * hsp, obase + (size_t)t * g->ldo, hs)
                        : 0.0f;
        w->L[t] = t < T ? lse[((size_t)b * g->NH + h) * T + t] : 0.0f;
    }
    memset(w->dq, 0, (size_t)Tp * hsp * sizeof(float));
}

/* Writes rows of acc (Tp, hsp) into the slice of dqkv at column offset off (every element
 * of dqkv belongs to exactly one head, so together the heads overwrite all of it). */
static void bwd_store(float *dqkv, const float *acc, const att_geom *g, int b, size_t off) {
    float *base = dqkv + (size_t)b * g->T * g->ld + off;
    for (int t = 0; t < g->T; t++)
        memcpy(base + (size_t)t * g->ld, acc + (size_t)t * g->hsp,
               (size_t)g->hs * sizeof(float));
}

/* One (query tile i0, key tile j0) step of the backward pass. Padded query rows have
 * dO = 0 and D = 0, hence dS = 0: they add exact zeros. */
static void bwd_tile(att_bwd_buf *w, const att_geom *g, int i0, int j0) {
    const int BL = DT_ATT_BLK, Tp = g->Tp, hs = g->hs, hsp = g->hsp;
    const float scale = g->scale;
    float *p = w->p, *ds = w->ds;
    tile_mm(p, BL, w->q + (size_t)i0 * hsp, hsp, 1, w->kt + j0, Tp, BL, BL, hs, 0);
    tile_mm(ds, BL, w->dout + (size_t)i0 * hsp, hsp, 1, w->vt + j0, Tp, BL, BL, hs, 0);
    for (int r = 0; r < BL; r++) {
        float *pr = p + r * BL, *dr = ds + r * BL;
        scale_mask_row(pr, scale, keys_seen(g->causal, i0, j0, r, g->T));
        vk_exp_sum(pr, pr, w->L[i0 + r], BL);
        const float Di = w->D[i0 + r];
        const vf vd = vf_set1(Di), vs = vf_set1(scale);
        for (int c = 0; c < BL; c += VW)
            vf_store(dr + c, vf_mul(vf_mul(vf_load(pr + c), vf_sub(vf_load(dr + c), vd)), vs));
    }
    round_op(p, (size_t)BL * BL, w->op), round_op(ds, (size_t)BL * BL, w->op);
    /* dV += P^T dO, dK += dS^T Q: transposes read through swapped strides. */
    tile_mm(w->dv + (size_t)j0 * hsp, hsp, p, 1, BL, w->dout + (size_t)i0 * hsp, hsp, BL,
            hsp, BL, 1);
    tile_mm(w->dk + (size_t)j0 * hsp, hsp, ds, 1, BL, w->q + (size_t)i0 * hsp, hsp, BL, hsp,
            BL, 1);
    tile_mm(w->dq + (size_t)i0 * hsp, hsp, ds, BL, 1, w->k + (size_t)j0 * hsp, hsp, BL, hsp,
            BL, 1);
}

void DT_K(attention_backward)(float *dqkv, const float *dout, const float *qkv,
                              const float *out, const float *lse, int B, int T, int NH,
                              int NKV, int hs, int causal, int op) {
    const att_geom g = geom(T, NH, NKV, hs, causal);
    const int nb = g.nb, BL = DT_ATT_BLK, group = NH / NKV;
#pragma omp parallel
    {
        att_bwd_buf w;
        const size_t nrow = (size_t)g.Tp * g.hsp, ncol = (size_t)hs * g.Tp;
        w.q = scratch(nrow), w.k = scratch(nrow), w.dout = scratch(nrow);
        w.dq = scratch(nrow), w.dk = scratch(nrow), w.dv = scratch(nrow);
        w.kt = scratch(ncol), w.vt = scratch(ncol);
        w.D = scratch((size_t)g.Tp), w.L = scratch((size_t)g.Tp);
        w.p = scratch((size_t)BL * BL);
        w.ds = scratch((size_t)BL * BL);
        w.op = op;
#pragma omp for schedule(static)
        for (int bk = 0; bk < B * NKV; bk++) {
            const int b = bk / NKV, kvh = bk % NKV;
            bwd_load_kv(&w, qkv, &g, b, kvh);
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                bwd_load_q(&w, dout, qkv, out, lse, &g, b, h);
                for (int jb = 0; jb < nb; jb++)
                    for (int ib = causal ? jb : 0; ib < nb; ib++)
                        bwd_tile(&w, &g, ib * BL, jb * BL);
                bwd_store(dqkv, w.dq, &g, b, q_off(&g, h));
            }
            bwd_store(dqkv, w.dk, &g, b, k_off(&g, kvh));
            bwd_store(dqkv, w.dv, &g, b, v_off(&g, kvh));
        }
        free(w.q), free(w.k), free(w.dout), free(w.dq), free(w.dk), free(w.dv);
        free(w.kt), free(w.vt), free(w.D), free(w.L), free(w.p), free(w.ds);
    }
}

/* ---- Blocks of a ring (context parallelism, decision 83): the query rows of one sequence
 * against a block of key/value rows that may be another rank's. The same tiles, masks,
 * online softmax and products as above, with Tq query rows and Tk key rows of their own
 * strides; causal = 1 is a block on the diagonal (Tq == Tk, aligned tiles), 0 a block every
 * query row sees whole. The backward takes the merged out and lse of the rows (what the
 * forward's merges ended with), so P = exp(S - lse) is each block's share of the final
 * softmax and the blocks' gradients add up to the whole attention's. */

typedef struct blk_geom {
    int Tq, Tk, Tqp, Tkp, nbq, nbk, NH, NKV, hs, hsp, causal;
    float scale;
} blk_geom;

static blk_geom blk_geom_of(int Tq, int Tk, int NH, int NKV, int hs, int causal) {
    DT_ASSERT(NKV > 0 && NH % NKV == 0 && hs > 0 && Tq > 0 && Tk > 0 && (!causal || Tq == Tk));
    blk_geom g;
    g.Tq = Tq, g.Tk = Tk, g.Tqp = round_up(Tq, DT_ATT_BLK), g.Tkp = round_up(Tk, DT_ATT_BLK);
    g.nbq = g.Tqp / DT_ATT_BLK, g.nbk = g.Tkp / DT_ATT_BLK;
    g.NH = NH, g.NKV = NKV, g.hs = hs, g.hsp = round_up(hs, 16), g.causal = causal;
    g.scale = 1.0f / sqrtf((float)hs);
    return g;
}

void DT_K(attention_block_forward)(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *kv,
                                   int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, int op) {
    const blk_geom g = blk_geom_of(Tq, Tk, NH, NKV, hs, causal);
    const int hsp = g.hsp, BL = DT_ATT_BLK, group = NH / NKV;
#pragma omp parallel
    {
        float *qs = scratch((size_t)g.Tqp * hsp), *v = scratch((size_t)g.Tkp * hsp);
        float *kt = scratch((size_t)hs * g.Tkp), *s = scratch((size_t)BL * BL);
        float *o = scratch((size_t)BL * hsp);
        float m[DT_ATT_BLK], l[DT_ATT_BLK];
#pragma omp for schedule(static)
        for (int h = 0; h < NH; h++) {
            const int kvh = h / group;
            gather_rows(qs, q + (size_t)h * hs, (size_t)ldq, Tq, g.Tqp, hs, hsp);
            gather_cols(kt, kv + (size_t)kvh * hs, (size_t)ldkv, Tk, g.Tkp, hs);
            gather_rows(v, kv + (size_t)(NKV + kvh) * hs, (size_t)ldkv, Tk, g.Tkp, hs, hsp);
            round_op(qs, (size_t)g.Tqp * hsp, op), round_op(kt, (size_t)hs * g.Tkp, op);
            round_op(v, (size_t)g.Tkp * hsp, op);
            for (int ib = 0; ib < g.nbq; ib++) {
                const int i0 = ib * BL, jend = causal ? ib : g.nbk - 1;
                memset(o, 0, (size_t)BL * hsp * sizeof(float));
                for (int r = 0; r < BL; r++) m[r] = -INFINITY, l[r] = 0.0f;
                for (int jb = 0; jb <= jend; jb++) {
                    const int j0 = jb * BL;
                    tile_mm(s, BL, qs + (size_t)i0 * hsp, hsp, 1, kt + j0, g.Tkp, BL, BL, hs, 0);
                    for (int r = 0; r < BL; r++) {
                        float *sr = s + r * BL;
                        scale_mask_row(sr, g.scale, keys_seen(causal, i0, j0, r, Tk));
                        float mnew = fmaxf(m[r], vk_max(sr, BL));
                        float corr = dt_k_expf(m[r] - mnew);
                        l[r] = l[r] * corr + vk_exp_sum(sr, sr, mnew, BL);
                        m[r] = mnew;
                        if (corr != 1.0f) vk_scale(o + (size_t)r * hsp, corr, hsp);
                    }
                    round_op(s, (size_t)BL * BL, op);
                    tile_mm(o, hsp, s, BL, 1, v + (size_t)j0 * hsp, hsp, BL, hsp, BL, 1);
                }
                for (int r = 0; r < BL && i0 + r < Tq; r++) {
                    const int t = i0 + r;
                    const float inv = 1.0f / l[r];
                    float *dst = out + (size_t)t * ldo + (size_t)h * hs;
                    for (int d = 0; d < hs; d++) dst[d] = o[(size_t)r * hsp + d] * inv;
                    lse[(size_t)h * ldl + t] = m[r] + logf(l[r]);
                }
            }
        }
        free(qs), free(v), free(kt), free(s), free(o);
    }
}

/* One (query tile i0, key tile j0) step of a block's backward (bwd_tile with the block's
 * two row counts: K^T and V^T are (hs, Tkp)). */
static void blk_tile(att_bwd_buf *w, const blk_geom *g, int i0, int j0) {
    const int BL = DT_ATT_BLK, Tkp = g->Tkp, hs = g->hs, hsp = g->hsp;
    float *p = w->p, *ds = w->ds;
    tile_mm(p, BL, w->q + (size_t)i0 * hsp, hsp, 1, w->kt + j0, Tkp, BL, BL, hs, 0);
    tile_mm(ds, BL, w->dout + (size_t)i0 * hsp, hsp, 1, w->vt + j0, Tkp, BL, BL, hs, 0);
    for (int r = 0; r < BL; r++) {
        float *pr = p + r * BL, *dr = ds + r * BL;
        scale_mask_row(pr, g->scale, keys_seen(g->causal, i0, j0, r, g->Tk));
        vk_exp_sum(pr, pr, w->L[i0 + r], BL);
        const vf vd = vf_set1(w->D[i0 + r]), vs = vf_set1(g->scale);
        for (int c = 0; c < BL; c += VW)
            vf_store(dr + c, vf_mul(vf_mul(vf_load(pr + c), vf_sub(vf_load(dr + c), vd)), vs));
    }
    round_op(p, (size_t)BL * BL, w->op), round_op(ds, (size_t)BL * BL, w->op);
    tile_mm(w->dv + (size_t)j0 * hsp, hsp, p, 1, BL, w->dout + (size_t)i0 * hsp, hsp, BL, hsp, BL, 1);
    tile_mm(w->dk + (size_t)j0 * hsp, hsp, ds, 1, BL, w->q + (size_t)i0 * hsp, hsp, BL, hsp, BL, 1);
    tile_mm(w->dq + (size_t)i0 * hsp, hsp, ds, BL, 1, w->k + (size_t)j0 * hsp, hsp, BL, hsp, BL, 1);
}

/* dst rows (n of them, stride ld) += acc rows (stride hsp), hs floats each. */
static void blk_add_rows(float *dst, size_t ld, const float *acc, int n, int hs, int hsp) {
    for (int t = 0; t < n; t++) {
        float *d = dst + (size_t)t * ld;
        const float *a = acc + (size_t)t * hsp;
        for (int i = 0; i < hs; i++) d[i] += a[i];
    }
}

void DT_K(attention_block_backward)(float *dq, int lddq, float *dkv, int lddkv, const float *dout, const float *out,
                                    int ldo, const float *lse, int ldl, const float *q, int ldq, const float *kv,
                                    int ldkv, int Tq, int Tk, int NH, int NKV, int hs, int causal, int op) {
    const blk_geom g = blk_geom_of(Tq, Tk, NH, NKV, hs, causal);
    const int hsp = g.hsp, BL = DT_ATT_BLK, group = NH / NKV;
    /* dq rows of different kv heads' query heads are disjoint, and each kv head's dk, dv its
     * own: one task per kv head writes only its own slices. */
#pragma omp parallel
    {
        att_bwd_buf w;
        const size_t nq = (size_t)g.Tqp * hsp, nk = (size_t)g.Tkp * hsp, ncol = (size_t)hs * g.Tkp;
        w.q = scratch(nq), w.dout = scratch(nq), w.dq = scratch(nq);
        w.k = scratch(nk), w.dk = scratch(nk), w.dv = scratch(nk);
        w.kt = scratch(ncol), w.vt = scratch(ncol);
        w.D = scratch((size_t)g.Tqp), w.L = scratch((size_t)g.Tqp);
        w.p = scratch((size_t)BL * BL), w.ds = scratch((size_t)BL * BL);
        w.op = op;
#pragma omp for schedule(static)
        for (int kvh = 0; kvh < NKV; kvh++) {
            const float *kb = kv + (size_t)kvh * hs, *vb = kv + (size_t)(NKV + kvh) * hs;
            gather_rows(w.k, kb, (size_t)ldkv, Tk, g.Tkp, hs, hsp);
            gather_cols(w.kt, kb, (size_t)ldkv, Tk, g.Tkp, hs);
            gather_cols(w.vt, vb, (size_t)ldkv, Tk, g.Tkp, hs);
            round_op(w.k, nk, op), round_op(w.kt, ncol, op), round_op(w.vt, ncol, op);
            memset(w.dk, 0, nk * sizeof(float)), memset(w.dv, 0, nk * sizeof(float));
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                const float *ob = out + (size_t)h * hs, *db = dout + (size_t)h * hs;
                gather_rows(w.q, q + (size_t)h * hs, (size_t)ldq, Tq, g.Tqp, hs, hsp);
                gather_rows(w.dout, db, (size_t)ldo, Tq, g.Tqp, hs, hsp);
                round_op(w.q, nq, op), round_op(w.dout, nq, op);
                for (int t = 0; t < g.Tqp; t++) {
                    w.D[t] = t < Tq ? vk_dot(w.dout + (size_t)t * hsp, ob + (size_t)t * ldo, hs) : 0.0f;
                    w.L[t] = t < Tq ? lse[(size_t)h * ldl + t] : 0.0f;
                }
                memset(w.dq, 0, nq * sizeof(float));
                for (int jb = 0; jb < g.nbk; jb++)
                    for (int ib = causal ? jb : 0; ib < g.nbq; ib++) blk_tile(&w, &g, ib * BL, jb * BL);
                blk_add_rows(dq + (size_t)h * hs, (size_t)lddq, w.dq, Tq, hs, hsp);
            }
            blk_add_rows(dkv + (size_t)kvh * hs, (size_t)lddkv, w.dk, Tk, hs, hsp);
            blk_add_rows(dkv + (size_t)(NKV + kvh) * hs, (size_t)lddkv, w.dv, Tk, hs, hsp);
        }
        free(w.q), free(w.dout), free(w.dq), free(w.k), free(w.dk), free(w.dv);
        free(w.kt), free(w.vt), free(w.D), free(w.L), free(w.p), free(w.ds);
    }
}

void DT_K(attention_merge)(float *out, int ldo, float *lse, int ldl, const float *ob, int ldob, const float *lb, int ldlb,
                           int T, int NH, int hs) {
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < T; t++) {
            float *l = lse + (size_t)h * ldl + t;
            const float b = lb[(size_t)h * ldlb + t];
            if (b == -INFINITY) continue; /* the block held no key this row sees */
            float *o = out + (size_t)t * ldo + (size_t)h * hs;
            const float *x = ob + (size_t)t * ldob + (size_t)h * hs;
            if (*l == -INFINITY) { /* the first block this row sees */
                for (int d = 0; d < hs; d++) o[d] = x[d];
                *l = b;
                continue;
            }
            const float mx = fmaxf(*l, b), ea = dt_k_expf(*l - mx), eb = dt_k_expf(b - mx), s = ea + eb;
            const float wa = ea / s, wb = eb / s;
            for (int d = 0; d < hs; d++) o[d] = wa * o[d] + wb * x[d];
            *l = mx + logf(s);
        }
}
