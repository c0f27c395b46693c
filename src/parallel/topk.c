/* Top-K sparsification with error feedback: choosing, packing and summing (topk.h). Runs on
 * the communication thread, serially (ops.h dt_ops_serial_thread). */
#include "parallel/topk.h"

#include <math.h>
#include <string.h>

#include "ops/ops.h"

size_t dt_topk_block_k(size_t len, double ratio) {
    if (len == 0) return 0;
    double k = ceil(ratio * (double)len);
    if (k < 1) return 1;
    return k >= (double)len ? len : (size_t)k;
}

size_t dt_topk_pairs(size_t n, double ratio) {
    size_t K = 0;
    for (size_t lo = 0; lo < n; lo += DT_TOPK_BLOCK) K += dt_topk_block_k(n - lo < DT_TOPK_BLOCK ? n - lo : DT_TOPK_BLOCK, ratio);
    return K;
}

static size_t value_words(dt_dtype vt) { return vt == DT_F32 ? 2 : 1; }

size_t dt_topk_words(size_t n, double ratio, dt_dtype vt) { return dt_topk_pairs(n, ratio) * (1 + value_words(vt)); }

/* |x| as an unsigned key: for non-negative floats the bit pattern orders like the value
 * (NaN above Inf, so a NaN is always sent and the step is seen to be non-finite). */
static uint32_t mag(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x7fffffffu;
}

void dt_topk_select(const float *x, size_t len, size_t k, uint16_t *idx) {
    if (k == 0) return;
    /* Radix select, most significant byte first: the k-th largest key T, and how many of the
     * keys equal to T are taken (the lowest-indexed ones). */
    uint32_t prefix = 0, mask = 0;
    size_t need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        size_t hist[256] = {0};
        for (size_t i = 0; i < len; i++) {
            uint32_t key = mag(x[i]);
            if ((key & mask) == prefix) hist[(key >> shift) & 255u]++;
        }
        int d = 255;
        while (hist[d] < need) need -= hist[d--];
        prefix |= (uint32_t)d << shift;
        mask |= 255u << shift;
    }
    size_t n = 0;
    for (size_t i = 0; i < len && n < k; i++) {
        uint32_t key = mag(x[i]);
        if (key > prefix || (key == prefix && need > 0)) {
            if (key == prefix) need--;
            idx[n++] = (uint16_t)i;
        }
    }
}

/* A residual of zero is -0.0: adding it leaves every gradient's bits as they are. */
static float owed(float d) { return d == 0.0f ? -0.0f : d; }

void dt_topk_residual_clear(float *res, size_t n) {
    for (size_t i = 0; i < n; i++) res[i] = -0.0f;
}

enum { CHUNK = 256 };

void dt_topk_encode(float *g, float *res, size_t n, double ratio, dt_dtype vt, uint16_t *msg) {
    size_t K = dt_topk_pairs(n, ratio), at = 0;
    uint16_t *idx = msg, *val = msg + K;
    for (size_t lo = 0; lo < n; lo += DT_TOPK_BLOCK) {
        size_t len = n - lo < DT_TOPK_BLOCK ? n - lo : DT_TOPK_BLOCK, k = dt_topk_block_k(len, ratio);
        float *x = g + lo, *r = res + lo;
        for (size_t i = 0; i < len; i++) {
            x[i] += r[i];
            r[i] = owed(x[i]); /* owed unless sent */
        }
        uint16_t *bi = idx + at;
        dt_topk_select(x, len, k, bi);
        if (vt == DT_F32) {
            for (size_t j = 0; j < k; j++) {
                memcpy(val + 2 * (at + j), &x[bi[j]], sizeof(float));
                r[bi[j]] = -0.0f;
            }
        } else {
            float buf[CHUNK], back[CHUNK];
            for (size_t j0 = 0; j0 < k; j0 += CHUNK) {
                size_t m = k - j0 < CHUNK ? k - j0 : CHUNK;
                for (size_t j = 0; j < m; j++) buf[j] = x[bi[j0 + j]];
                uint16_t *v = val + at + j0;
                dt_to_lowp(vt, v, buf, m);
                dt_from_lowp(vt, back, v, m);
                /* the rounding error, exact in fp32: what this value did not carry */
                for (size_t j = 0; j < m; j++) r[bi[j0 + j]] = owed(buf[j] - back[j]);
            }
        }
        at += k;
    }
}

void dt_topk_sum(float *out, size_t n, double ratio, dt_dtype vt, const uint16_t *msgs, int parts) {
    size_t K = dt_topk_pairs(n, ratio), words = K * (1 + value_words(vt));
    for (size_t i = 0; i < n; i++) out[i] = -0.0f;
    for (int p = 0; p < parts; p++) {
        const uint16_t *idx = msgs + (size_t)p * words, *val = idx + K;
        size_t at = 0;
        for (size_t lo = 0; lo < n; lo += DT_TOPK_BLOCK) {
            size_t len = n - lo < DT_TOPK_BLOCK ? n - lo : DT_TOPK_BLOCK, k = dt_topk_block_k(len, ratio);
            float *o = out + lo;
            if (vt == DT_F32) {
                for (size_t j = 0; j < k; j++) {
                    float v;
                    memcpy(&v, val + 2 * (at + j), sizeof v);
                    o[idx[at + j]] += v;
                }
            } else {
                float buf[CHUNK];
                for (size_t j0 = 0; j0 < k; j0 += CHUNK) {
                    size_t m = k - j0 < CHUNK ? k - j0 : CHUNK;
                    dt_from_lowp(vt, buf, val + at + j0, m);
                    for (size_t j = 0; j < m; j++) o[idx[at + j0 + j]] += buf[j];
                }
            }
            at += k;
        }
    }
    if (vt == DT_F32) return;
    /* the 16-bit rule: each sum rounded once (an untouched -0.0 stays -0.0) */
    uint16_t h[CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        size_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        dt_to_lowp(vt, h, out + i0, m);
        dt_from_lowp(vt, out + i0, h, m);
    }
}
