/* AVX2 math shared by the CPU kernels that run a softmax or an activation
 * inside a larger loop (attention, fused linear epilogues), and the bf16
 * conversions of the row kernels that keep values in registers (k_nn_simd.c,
 * k_eltwise.c). */
#ifndef HR_BACKENDS_CPU_SIMD_MATH_H
#define HR_BACKENDS_CPU_SIMD_MATH_H

#include <immintrin.h>
#include <stdint.h>

static inline float hr_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp on 8 lanes: 2^n * poly(r), |r| <= ln2/2, ~1 ulp; inputs below -87
 * (including -inf) give exactly 0, inputs above 88 saturate. */
static inline __m256 hr_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

/* ---- bf16 in registers --------------------------------------------------- */

static inline __m256 hr_bf16x8_load(const void *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* v rounded to bf16, as f32 bits: nearest even, a NaN made quiet with its
 * other bits kept (hr_f32_to_bf16's result, shifted up, in every bit that
 * survives a store). */
static inline __m256i hr_bf16x8_round(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)),
                                 _mm256_set1_epi32((int)0xffff0000u));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
}

/* Stores v as 8 bf16, rounded as hr_f32_to_bf16. */
static inline void hr_bf16x8_store(void *p, __m256 v) {
    __m256i r = _mm256_srli_epi32(hr_bf16x8_round(v), 16);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

/* dst[0..n) = bf16(src[i] + bias[i]) (bias may be NULL), 16 lanes at a
 * time with hr_bf16x8_round's integer rounding, so subnormals round too:
 * the GEMM epilogues store every row piece of C through this inline (a
 * call to the generic converter per 32-column piece of the skinny route
 * cost 3-4% of a batch-64 decode step). */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) void
hr_bf16_row_store_avx512(uint16_t *dst, const float *src, const float *bias, int64_t n) {
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, src + i);
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + i));
        __m512i u = _mm512_castps_si512(v);
        __m512i top = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(top, one))), 16);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_or_epi32(r, nan, top, quiet);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(r));
    }
}

/* AVX-512 with avx512_bf16: vcvtneps2bf16 rounds as hr_f32_to_bf16 for
 * every f32 but those with a zero exponent, which it flushes to zero
 * (checked over all 2^32 inputs); callers redo a block holding a subnormal
 * (hr_subnormal16) with the 8-lane code above. */
#define HR_T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

static inline HR_T512 __m512 hr_bf16x16_load(const void *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Lanes of v that are subnormal (vfpclassps category 0x20: zero exponent,
 * nonzero fraction). */
static inline HR_T512 __mmask16 hr_subnormal16(__m512 v) { return _mm512_fpclass_ps_mask(v, 0x20); }

/* v as 16 bf16 (v free of subnormals). */
static inline HR_T512 __m256i hr_bf16x16_pack(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

static inline HR_T512 __m512 hr_bf16x16_unpack(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#endif
