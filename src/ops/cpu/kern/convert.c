/* Conversions between fp32 and the 16-bit training formats (bf16, IEEE binary16), and the
 * non-finite count (tests and diagnostics).
 *
 * Every path computes the same integer function of the bits: the scalar helpers below are the
 * definition, the vector bodies transcribe them lane by lane (no FP rounding instruction is
 * used, so neither MXCSR nor DAZ/FTZ can change a result; AVX512_BF16's vcvtneps2bf16 would
 * flush f32 subnormals and is therefore not used), and tails go through the scalar helpers.
 * Large arrays are cut into fixed blocks spread over OpenMP threads; no block depends on
 * another, so the bits do not depend on the thread count.
 *
 * Narrowing rounds to nearest, ties to even. NaN stays NaN with its sign and the top payload
 * bits, quieted; Inf stays Inf; fp16 overflow (|x| >= 65520) gives Inf. Widening is exact,
 * NaN payloads included (carried bit for bit, signalling or not). */
#include "ops/cpu/kern/kern.h"

#define DT_CVT_BLOCK 16384     /* elements per OpenMP work item */
#define DT_CVT_PAR_MIN 65536   /* below this, one thread */

/* ------------------------------------------------------------------ the definitions */

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline uint16_t bf16_of(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline uint32_t f32_of_bf16(uint16_t h) { return (uint32_t)h << 16; }

static inline uint16_t f16_of(uint32_t u) {
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, h;
    if (a > 0x7f800000u) h = 0x7e00u | ((a >> 13) & 0x3ffu); /* NaN, quieted */
    else if (a >= 0x477ff000u) h = 0x7c00u;                  /* >= 65520: Inf */
    else if (a >= 0x38800000u) {                             /* normal: rebias, round 13 bits */
        uint32_t n = a - 0x38000000u;
        h = (n + 0xfffu + ((n >> 13) & 1u)) >> 13;
    } else { /* subnormal or zero: m 2^(e-150) in units of 2^-24 is m >> (126 - e) */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t s = 126u - e > 25u ? 25u : 126u - e; /* >= 25: everything rounds to 0 */
        h = (m + ((1u << (s - 1)) - 1u) + ((m >> s) & 1u)) >> s;
    }
    return (uint16_t)(sign | h);
}

static inline uint32_t f32_of_f16(uint16_t x) {
    uint32_t h = x, sign = (h & 0x8000u) << 16, e = h & 0x7c00u, m = h & 0x3ffu;
    if (e == 0x7c00u) return sign | 0x7f800000u | (m << 13);        /* Inf, NaN */
    if (e) return sign | (((h & 0x7fffu) << 13) + 0x38000000u);       /* normal */
    return sign | f32_bits((float)m * 0x1p-24f);                     /* subnormal, 0: exact */
}

static inline int f32_nonfinite(uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u; }

/* ------------------------------------------------------------------ vector bodies */
/* Each body converts n elements; the vector part takes whole groups, the scalar helpers the
 * rest. */

#if DT_ISA_ID == DT_ISA_ID_AVX512

static void to_bf16_block(uint16_t *dst, const float *src, size_t n) {
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x0040);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(src + i));
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), lsb), 16);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs), inf);
        r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) dst[i] = bf16_of(f32_bits(src[i]));
}

static void from_bf16_block(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512((void *)(dst + i), _mm512_slli_epi32(h, 16));
    }
    for (; i < n; i++) dst[i] = bits_f32(f32_of_bf16(src[i]));
}

static void to_f16_block(uint16_t *dst, const float *src, size_t n) {
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i one = _mm512_set1_epi32(1);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(src + i));
        __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000));
        __m512i a = _mm512_and_si512(u, abs);
        /* normal */
        __m512i nb = _mm512_sub_epi32(a, _mm512_set1_epi32(0x38000000));
        __m512i nr = _mm512_add_epi32(_mm512_add_epi32(nb, _mm512_set1_epi32(0xfff)),
                                      _mm512_and_si512(_mm512_srli_epi32(nb, 13), one));
        nr = _mm512_srli_epi32(nr, 13);
        /* subnormal / zero */
        __m512i e = _mm512_srli_epi32(a, 23);
        __m512i m = _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0x7fffff)),
                                    _mm512_set1_epi32(0x800000));
        __m512i s = _mm512_sub_epi32(_mm512_set1_epi32(126), e);
        s = _mm512_min_epi32(_mm512_max_epi32(s, _mm512_set1_epi32(14)), _mm512_set1_epi32(25));
        __m512i halfm1 = _mm512_sub_epi32(_mm512_sllv_epi32(one, _mm512_sub_epi32(s, one)), one);
        __m512i sr = _mm512_add_epi32(_mm512_add_epi32(m, halfm1),
                                      _mm512_and_si512(_mm512_srlv_epi32(m, s), one));
        sr = _mm512_srlv_epi32(sr, s);
        /* NaN, overflow */
        __m512i nan = _mm512_or_si512(
            _mm512_set1_epi32(0x7e00),
            _mm512_and_si512(_mm512_srli_epi32(a, 13), _mm512_set1_epi32(0x3ff)));
        __m512i r = sr;
        r = _mm512_mask_mov_epi32(
            r, _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x38800000)), nr);
        r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x477ff000)),
                                  _mm512_set1_epi32(0x7c00));
        r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, inf), nan);
        r = _mm512_or_si512(r, sign);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) dst[i] = f16_of(f32_bits(src[i]));
}

static void from_f16_block(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m512i sign = _mm512_slli_epi32(_mm512_and_si512(h, _mm512_set1_epi32(0x8000)), 16);
        __m512i e = _mm512_and_si512(h, _mm512_set1_epi32(0x7c00));
        __m512i m = _mm512_and_si512(h, _mm512_set1_epi32(0x3ff));
        __m512i body = _mm512_slli_epi32(_mm512_and_si512(h, _mm512_set1_epi32(0x7fff)), 13);
        __m512i r = _mm512_castps_si512(
            _mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(0x1p-24f)));
        r = _mm512_mask_mov_epi32(r, _mm512_test_epi32_mask(e, e),
                                  _mm512_add_epi32(body, _mm512_set1_epi32(0x38000000)));
        r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(0x7c00)),
                                  _mm512_or_si512(body, _mm512_set1_epi32(0x7f800000)));
        _mm512_storeu_si512((void *)(dst + i), _mm512_or_si512(r, sign));
    }
    for (; i < n; i++) dst[i] = bits_f32(f32_of_f16(src[i]));
}

static size_t nonfinite_block(const float *x, size_t n) {
    const __m512i expo = _mm512_set1_epi32(0x7f800000);
    size_t cnt = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i e = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + i)), expo);
        cnt += (size_t)__builtin_popcount((unsigned)_mm512_cmpeq_epi32_mask(e, expo));
    }
    for (; i < n; i++) cnt += (size_t)f32_nonfinite(f32_bits(x[i]));
    return cnt;
}

#elif DT_ISA_ID == DT_ISA_ID_AVX2

/* 8 lanes of values <= 0xffff to 8 uint16 in order. */
static inline void store8_u16(uint16_t *p, __m256i r) {
    __m128i v = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)p, v);
}

static inline __m256i load8_u16(const uint16_t *p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* Unsigned a >= b for 32-bit lanes (AVX2 has only signed compares). */
static inline __m256i cmpge_u32(__m256i a, __m256i b) {
    return _mm256_cmpeq_epi32(_mm256_max_epu32(a, b), a);
}

static void to_bf16_block(uint16_t *dst, const float *src, size_t n) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i quiet = _mm256_set1_epi32(0x0040);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i hi = _mm256_srli_epi32(u, 16);
        __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
        /* |u| and inf are non-negative as int32: the signed compare is the unsigned one */
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
        store8_u16(dst + i, r);
    }
    for (; i < n; i++) dst[i] = bf16_of(f32_bits(src[i]));
}

static void from_bf16_block(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(load8_u16(src + i), 16));
    for (; i < n; i++) dst[i] = bits_f32(f32_of_bf16(src[i]));
}

static void to_f16_block(uint16_t *dst, const float *src, size_t n) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i one = _mm256_set1_epi32(1);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
        __m256i a = _mm256_and_si256(u, abs);
        __m256i nb = _mm256_sub_epi32(a, _mm256_set1_epi32(0x38000000));
        __m256i nr = _mm256_add_epi32(_mm256_add_epi32(nb, _mm256_set1_epi32(0xfff)),
                                      _mm256_and_si256(_mm256_srli_epi32(nb, 13), one));
        nr = _mm256_srli_epi32(nr, 13);
        __m256i e = _mm256_srli_epi32(a, 23);
        __m256i m = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7fffff)),
                                    _mm256_set1_epi32(0x800000));
        __m256i s = _mm256_sub_epi32(_mm256_set1_epi32(126), e);
        s = _mm256_min_epi32(_mm256_max_epi32(s, _mm256_set1_epi32(14)), _mm256_set1_epi32(25));
        __m256i halfm1 = _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(s, one)), one);
        __m256i sr = _mm256_add_epi32(_mm256_add_epi32(m, halfm1),
                                      _mm256_and_si256(_mm256_srlv_epi32(m, s), one));
        sr = _mm256_srlv_epi32(sr, s);
        __m256i nan = _mm256_or_si256(
            _mm256_set1_epi32(0x7e00),
            _mm256_and_si256(_mm256_srli_epi32(a, 13), _mm256_set1_epi32(0x3ff)));
        __m256i r = _mm256_blendv_epi8(sr, nr, cmpge_u32(a, _mm256_set1_epi32(0x38800000)));
        r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7c00),
                               cmpge_u32(a, _mm256_set1_epi32(0x477ff000)));
        r = _mm256_blendv_epi8(r, nan, _mm256_cmpgt_epi32(a, inf));
        store8_u16(dst + i, _mm256_or_si256(r, sign));
    }
    for (; i < n; i++) dst[i] = f16_of(f32_bits(src[i]));
}

static void from_f16_block(float *dst, const uint16_t *src, size_t n) {
    const __m256i zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i h = load8_u16(src + i);
        __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
        __m256i e = _mm256_and_si256(h, _mm256_set1_epi32(0x7c00));
        __m256i m = _mm256_and_si256(h, _mm256_set1_epi32(0x3ff));
        __m256i body = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7fff)), 13);
        __m256i r = _mm256_castps_si256(
            _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(0x1p-24f)));
        r = _mm256_blendv_epi8(_mm256_add_epi32(body, _mm256_set1_epi32(0x38000000)), r,
                               _mm256_cmpeq_epi32(e, zero));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(body, _mm256_set1_epi32(0x7f800000)),
                               _mm256_cmpeq_epi32(e, _mm256_set1_epi32(0x7c00)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_or_si256(r, sign));
    }
    for (; i < n; i++) dst[i] = bits_f32(f32_of_f16(src[i]));
}

static size_t nonfinite_block(const float *x, size_t n) {
    const __m256i expo = _mm256_set1_epi32(0x7f800000);
    size_t cnt = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i e = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), expo);
        int mask = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(e, expo)));
        cnt += (size_t)__builtin_popcount((unsigned)mask);
    }
    for (; i < n; i++) cnt += (size_t)f32_nonfinite(f32_bits(x[i]));
    return cnt;
}

#elif DT_ISA_ID == DT_ISA_ID_NEON

static void to_bf16_block(uint16_t *dst, const float *src, size_t n) {
    const uint32x4_t abs = vdupq_n_u32(0x7fffffffu), inf = vdupq_n_u32(0x7f800000u);
    const uint32x4_t bias = vdupq_n_u32(0x7fffu), one = vdupq_n_u32(1u);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32x4_t u = vld1q_u32((const uint32_t *)(src + i));
        uint32x4_t hi = vshrq_n_u32(u, 16);
        uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(u, bias), vandq_u32(hi, one)), 16);
        uint32x4_t nan = vcgtq_u32(vandq_u32(u, abs), inf);
        r = vbslq_u32(nan, vorrq_u32(hi, vdupq_n_u32(0x40u)), r);
        vst1_u16(dst + i, vmovn_u32(r));
    }
    for (; i < n; i++) dst[i] = bf16_of(f32_bits(src[i]));
}

static void from_bf16_block(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_u32((uint32_t *)(dst + i), vshll_n_u16(vld1_u16(src + i), 16));
    for (; i < n; i++) dst[i] = bits_f32(f32_of_bf16(src[i]));
}

static void to_f16_block(uint16_t *dst, const float *src, size_t n) {
    const uint32x4_t abs = vdupq_n_u32(0x7fffffffu), inf = vdupq_n_u32(0x7f800000u);
    const uint32x4_t one = vdupq_n_u32(1u);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32x4_t u = vld1q_u32((const uint32_t *)(src + i));
        uint32x4_t sign = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x8000u));
        uint32x4_t a = vandq_u32(u, abs);
        uint32x4_t nb = vsubq_u32(a, vdupq_n_u32(0x38000000u));
        uint32x4_t nr = vaddq_u32(vaddq_u32(nb, vdupq_n_u32(0xfffu)),
                                  vandq_u32(vshrq_n_u32(nb, 13), one));
        nr = vshrq_n_u32(nr, 13);
        int32x4_t e = vreinterpretq_s32_u32(vshrq_n_u32(a, 23));
        uint32x4_t m = vorrq_u32(vandq_u32(a, vdupq_n_u32(0x7fffffu)), vdupq_n_u32(0x800000u));
        int32x4_t s = vsubq_s32(vdupq_n_s32(126), e);
        s = vminq_s32(vmaxq_s32(s, vdupq_n_s32(14)), vdupq_n_s32(25));
        int32x4_t neg_s = vnegq_s32(s); /* vshlq by a negative count shifts right */
        uint32x4_t halfm1 = vsubq_u32(vshlq_u32(one, vsubq_s32(s, vdupq_n_s32(1))), one);
        uint32x4_t sr = vaddq_u32(vaddq_u32(m, halfm1), vandq_u32(vshlq_u32(m, neg_s), one));
        sr = vshlq_u32(sr, neg_s);
        uint32x4_t nan = vorrq_u32(vdupq_n_u32(0x7e00u),
                                   vandq_u32(vshrq_n_u32(a, 13), vdupq_n_u32(0x3ffu)));
        uint32x4_t r = vbslq_u32(vcgeq_u32(a, vdupq_n_u32(0x38800000u)), nr, sr);
        r = vbslq_u32(vcgeq_u32(a, vdupq_n_u32(0x477ff000u)), vdupq_n_u32(0x7c00u), r);
        r = vbslq_u32(vcgtq_u32(a, inf), nan, r);
        vst1_u16(dst + i, vmovn_u32(vorrq_u32(r, sign)));
    }
    for (; i < n; i++) dst[i] = f16_of(f32_bits(src[i]));
}

static void from_f16_block(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32x4_t h = vmovl_u16(vld1_u16(src + i));
        uint32x4_t sign = vshlq_n_u32(vandq_u32(h, vdupq_n_u32(0x8000u)), 16);
        uint32x4_t e = vandq_u32(h, vdupq_n_u32(0x7c00u));
        uint32x4_t m = vandq_u32(h, vdupq_n_u32(0x3ffu));
        uint32x4_t body = vshlq_n_u32(vandq_u32(h, vdupq_n_u32(0x7fffu)), 13);
        uint32x4_t r = vreinterpretq_u32_f32(
            vmulq_f32(vcvtq_f32_u32(m), vdupq_n_f32(0x1p-24f)));
        r = vbslq_u32(vceqq_u32(e, vdupq_n_u32(0u)), r,
                      vaddq_u32(body, vdupq_n_u32(0x38000000u)));
        r = vbslq_u32(vceqq_u32(e, vdupq_n_u32(0x7c00u)),
                      vorrq_u32(body, vdupq_n_u32(0x7f800000u)), r);
        vst1q_u32((uint32_t *)(dst + i), vorrq_u32(r, sign));
    }
    for (; i < n; i++) dst[i] = bits_f32(f32_of_f16(src[i]));
}

static size_t nonfinite_block(const float *x, size_t n) {
    const uint32x4_t expo = vdupq_n_u32(0x7f800000u);
    size_t cnt = 0, i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32x4_t hit = vceqq_u32(vandq_u32(vld1q_u32((const uint32_t *)(x + i)), expo), expo);
        cnt += vaddvq_u32(vshrq_n_u32(hit, 31));
    }
    for (; i < n; i++) cnt += (size_t)f32_nonfinite(f32_bits(x[i]));
    return cnt;
}

#else /* scalar */

static void to_bf16_block(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_of(f32_bits(src[i]));
}

static void from_bf16_block(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bits_f32(f32_of_bf16(src[i]));
}

static void to_f16_block(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = f16_of(f32_bits(src[i]));
}

static void from_f16_block(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bits_f32(f32_of_f16(src[i]));
}

static size_t nonfinite_block(const float *x, size_t n) {
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++) cnt += (size_t)f32_nonfinite(f32_bits(x[i]));
    return cnt;
}

#endif

/* ------------------------------------------------------------------ the kernels */

/* Runs a block body over n elements, in blocks over the threads when n is large (and the
 * calling thread is not marked serial: dt_ops_serial_thread). */
#define DT_CVT_RUN(body, dst, src, n)                                                      \
    do {                                                                                   \
        if ((n) < DT_CVT_PAR_MIN || dt_cpu_serial) {                                       \
            body(dst, src, n);                                                             \
            break;                                                                         \
        }                                                                                  \
        long nb_ = (long)(((n) + DT_CVT_BLOCK - 1) / DT_CVT_BLOCK);                        \
        _Pragma("omp parallel for schedule(static)") for (long b_ = 0; b_ < nb_; b_++) {   \
            size_t i0_ = (size_t)b_ * DT_CVT_BLOCK;                                        \
            size_t m_ = (n) - i0_ < DT_CVT_BLOCK ? (n) - i0_ : DT_CVT_BLOCK;               \
            body((dst) + i0_, (src) + i0_, m_);                                            \
        }                                                                                  \
    } while (0)

void DT_K(f32_to_bf16)(uint16_t *dst, const float *src, size_t n) {
    DT_CVT_RUN(to_bf16_block, dst, src, n);
}

void DT_K(bf16_to_f32)(float *dst, const uint16_t *src, size_t n) {
    DT_CVT_RUN(from_bf16_block, dst, src, n);
}

void DT_K(f32_to_f16)(uint16_t *dst, const float *src, size_t n) {
    DT_CVT_RUN(to_f16_block, dst, src, n);
}

void DT_K(f16_to_f32)(float *dst, const uint16_t *src, size_t n) {
    DT_CVT_RUN(from_f16_block, dst, src, n);
}

size_t DT_K(count_nonfinite)(const float *x, size_t n) {
    if (n < DT_CVT_PAR_MIN) return nonfinite_block(x, n);
    long nb = (long)((n + DT_CVT_BLOCK - 1) / DT_CVT_BLOCK);
    size_t cnt = 0;
    /* An integer sum: exact in any order. */
#pragma omp parallel for schedule(static) reduction(+ : cnt)
    for (long b = 0; b < nb; b++) {
        size_t i0 = (size_t)b * DT_CVT_BLOCK;
        cnt += nonfinite_block(x + i0, n - i0 < DT_CVT_BLOCK ? n - i0 : DT_CVT_BLOCK);
    }
    return cnt;
}
