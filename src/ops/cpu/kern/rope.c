/* Rotary position embeddings in Hugging Face's rotate-half convention, in place on the
 * q and k heads of a packed qkv buffer (see ops.h for the layout).
 *
 * The angles are those Hugging Face's LlamaRotaryEmbedding computes in float32: the caller's
 * float32 frequencies f_i (plain RoPE: dt_rope_inv_freq's fl(1 / fl(theta ^ fl(2i / hs))),
 * HF's own values; a scaled rule's: model/rope.h's double values rounded once), and
 * angle(t, i) = fl(t * f_i), fl() rounding to float32. Only then do we leave float32: cos and
 * sin of the float angle are computed in double (libm), times the scale (1 but for YaRN), and
 * rounded once to float, into a (T, hs/2) table built once per call. At t ~ 4096 one ulp of
 * the angle is ~5e-4 rad, so rounding the angle exactly as torch does matters more than the
 * precision of cos/sin. The rotation itself is elementwise with IEEE operations only (one FMA
 * per output), so every path gives the same bits. The backward is the transposed rotation:
 * the same table with sin negated (sin is odd; the scale multiplies both). */
#include <math.h>
#include <stdlib.h>

#include "core/status.h"
#include "ops/cpu/kern/kern.h"

/* cs (T, hs/2, 2) interleaved scale cos, sign scale sin of the float32 angles above, for
 * positions t0 .. t0 + T - 1. */
static float *rope_table(int T, int t0, int hs, const float *inv, float scale, float sign) {
    const int h2 = hs / 2;
    float *cs = malloc((size_t)T * h2 * 2 * sizeof(float) + 1);
    DT_ASSERT(cs != NULL);
    const double m = scale;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int i = 0; i < h2; i++) {
            const double a = (double)((float)(t0 + t) * inv[i]);
            cs[((size_t)t * h2 + i) * 2] = (float)(cos(a) * m);
            cs[((size_t)t * h2 + i) * 2 + 1] = sign * (float)(sin(a) * m);
        }
    return cs;
}

/* One head: lo' = lo c - hi s, hi' = hi c + lo s over h2 pairs; c, s from the table row. */
static inline void rotate_v(float *lo, float *hi, vf c, vf s, int n) {
    vf a = vf_load_n(lo, n), b = vf_load_n(hi, n);
    vf_store_n(lo, vf_fnma(b, s, vf_mul(a, c)), n);
    vf_store_n(hi, vf_fma(a, s, vf_mul(b, c)), n);
}

static void rope_apply(float *qkv, int B, int T, int t0, int NH, int NKV, int hs, const float *inv,
                       float scale, float sign) {
    DT_ASSERT(hs % 2 == 0 && NH > 0 && NKV > 0);
    const int h2 = hs / 2, nrot = NH + NKV; /* q and k heads: the first nrot of the row */
    const size_t ld = (size_t)(NH + 2 * NKV) * hs;
    float *cs = rope_table(T, t0, hs, inv, scale, sign);
    /* Split the table row into cos and sin vectors once per row: (h2) each. */
#pragma omp parallel
    {
        float *cv = malloc((size_t)h2 * 2 * sizeof(float) + 1);
        DT_ASSERT(cv != NULL);
        float *sv = cv + h2;
#pragma omp for schedule(static)
        for (int bt = 0; bt < B * T; bt++) {
            const int t = bt % T;
            const float *row = cs + (size_t)t * h2 * 2;
            for (int i = 0; i < h2; i++) cv[i] = row[2 * i], sv[i] = row[2 * i + 1];
            float *x = qkv + (size_t)bt * ld;
            for (int h = 0; h < nrot; h++) {
                float *lo = x + (size_t)h * hs, *hi = lo + h2;
                int i = 0;
                for (; i + VW <= h2; i += VW)
                    rotate_v(lo + i, hi + i, vf_load(cv + i), vf_load(sv + i), VW);
                if (i < h2)
                    rotate_v(lo + i, hi + i, vf_load_n(cv + i, h2 - i), vf_load_n(sv + i, h2 - i),
                             h2 - i);
            }
        }
        free(cv);
    }
    free(cs);
}

void DT_K(rope_forward)(float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq,
                        float scale) {
    rope_apply(qkv, B, T, 0, NH, NKV, hs, inv_freq, scale, 1.0f);
}

void DT_K(rope_forward_at)(float *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq,
                           float scale) {
    rope_apply(qkv, B, T, pos0, NH, NKV, hs, inv_freq, scale, 1.0f);
}

void DT_K(rope_backward)(float *dqkv, int B, int T, int NH, int NKV, int hs, const float *inv_freq,
                         float scale) {
    rope_apply(dqkv, B, T, 0, NH, NKV, hs, inv_freq, scale, -1.0f);
}

void DT_K(rope_backward_at)(float *dqkv, int B, int T, int pos0, int NH, int NKV, int hs, const float *inv_freq,
                            float scale) {
    rope_apply(dqkv, B, T, pos0, NH, NKV, hs, inv_freq, scale, -1.0f);
}
