/* NF4 dequantization (ops.h "NF4"): packed 4-bit code indices, two per byte with the even
 * element in the high nibble, to fp32 values code[index] * scale, one scale per block of 64.
 *
 * Every path computes the same function: the block scale is one fmaf (the same rounding
 * everywhere) and an element is one fp32 product of a table value and that scale, so a table
 * lookup (AVX-512 vpermps over 16 lanes, AVX2 two 8-lane vpermps and a blend on index bit 3,
 * NEON a 64-byte tbl) gives the bits of the scalar loop. Serial: the caller spreads ranges
 * over threads. */
#include "ops/cpu/kern/kern.h"

/* Element i's 4-bit index in the packed codes. */
static inline unsigned nib(const uint8_t *codes, size_t i) {
    return (unsigned)(codes[i >> 1] >> ((i & 1) ? 0 : 4)) & 15u;
}

/* d[0..m) = the elements whose codes start at byte c (element 0 in its high nibble), times
 * s. The vector part takes whole bytes; an odd last element is the high nibble of c[m/2]. */
#if DT_ISA_ID == DT_ISA_ID_AVX512

static void dequant_run(float *d, const uint8_t *c, size_t m, const float *code, float s) {
    const __m512 tab = _mm512_loadu_ps(code), vs = _mm512_set1_ps(s);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    size_t j = 0;
    for (; j + 16 <= m; j += 16) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(c + j / 2)); /* 8 bytes, 16 elements */
        __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4), lo = _mm_and_si128(b, low4);
        __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(hi, lo)); /* h0 l0 h1 l1 ... */
        _mm512_storeu_ps(d + j, _mm512_mul_ps(_mm512_permutexvar_ps(idx, tab), vs));
    }
    for (; j < m; j++) d[j] = code[nib(c, j)] * s;
}

#elif DT_ISA_ID == DT_ISA_ID_AVX2

static void dequant_run(float *d, const uint8_t *c, size_t m, const float *code, float s) {
    const __m256 tab_lo = _mm256_loadu_ps(code), tab_hi = _mm256_loadu_ps(code + 8);
    const __m256 vs = _mm256_set1_ps(s);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    size_t j = 0;
    for (; j + 8 <= m; j += 8) {
        int32_t four;
        memcpy(&four, c + j / 2, 4); /* 4 bytes, 8 elements */
        __m128i b = _mm_cvtsi32_si128(four);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4), lo = _mm_and_si128(b, low4);
        __m256i idx = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(hi, lo));
        /* vpermps reads the low 3 index bits; bit 3 (moved to the sign) picks the table half */
        __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(tab_lo, idx),
                                    _mm256_permutevar8x32_ps(tab_hi, idx),
                                    _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
        _mm256_storeu_ps(d + j, _mm256_mul_ps(v, vs));
    }
    for (; j < m; j++) d[j] = code[nib(c, j)] * s;
}

#elif DT_ISA_ID == DT_ISA_ID_NEON

static void dequant_run(float *d, const uint8_t *c, size_t m, const float *code, float s) {
    /* The 16 floats as 64 table bytes; lane q of an output vector gathers bytes 4 idx + 0..3
     * (little-endian floats). */
    uint8x16x4_t tab;
    tab.val[0] = vld1q_u8((const uint8_t *)code);
    tab.val[1] = vld1q_u8((const uint8_t *)code + 16);
    tab.val[2] = vld1q_u8((const uint8_t *)code + 32);
    tab.val[3] = vld1q_u8((const uint8_t *)code + 48);
    static const uint8_t rep[4][16] = {{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
                                       {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
                                       {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
                                       {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};
    static const uint8_t k0123[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    const uint8x16_t byte_of = vld1q_u8(k0123);
    const float32x4_t vs = vdupq_n_f32(s);
    size_t j = 0;
    for (; j + 16 <= m; j += 16) {
        uint8x8_t b = vld1_u8(c + j / 2); /* 8 bytes, 16 elements */
        uint8x8x2_t z = vzip_u8(vshr_n_u8(b, 4), vand_u8(b, vdup_n_u8(15)));
        uint8x16_t idx = vcombine_u8(z.val[0], z.val[1]); /* h0 l0 h1 l1 ... */
        for (int q = 0; q < 4; q++) {
            uint8x16_t four = vqtbl1q_u8(idx, vld1q_u8(rep[q])); /* each index 4 times */
            uint8x16_t bi = vaddq_u8(vshlq_n_u8(four, 2), byte_of);
            float32x4_t v = vreinterpretq_f32_u8(vqtbl4q_u8(tab, bi));
            vst1q_f32(d + j + 4 * (size_t)q, vmulq_f32(v, vs));
        }
    }
    for (; j < m; j++) d[j] = code[nib(c, j)] * s;
}

#else /* scalar */

static void dequant_run(float *d, const uint8_t *c, size_t m, const float *code, float s) {
    for (size_t j = 0; j < m; j++) d[j] = code[nib(c, j)] * s;
}

#endif

void DT_K(nf4_dequant)(float *dst, const uint8_t *codes, const int8_t *qabsmax,
                       const float *step, float offset, const float *code, size_t i0,
                       size_t n) {
    size_t i = i0, end = i0 + n;
    while (i < end) {
        size_t b = i / 64, bend = (b + 1) * 64 < end ? (b + 1) * 64 : end;
        float s = fmaf((float)qabsmax[b], step[b / 256], offset);
        float *d = dst + (i - i0);
        if (i & 1) { /* an odd start: the low nibble, then whole bytes */
            *d++ = code[codes[i >> 1] & 15u] * s;
            i++;
        }
        if (i < bend) dequant_run(d, codes + (i >> 1), bend - i, code, s);
        i = bend;
    }
}
