/* Rows of f32 sums stored as bf16 in the GEMM epilogues, inline: the
 * skinny route stores 32 columns of a row at a time, about a million calls
 * per batch-64 decode step, and a call to the generic converter per piece
 * cost 3-4% of the step. Rounding as hr_f32_to_bf16 (nearest even; a NaN
 * keeps its top bits and is made quiet), so the bits do not change. */
#ifndef HR_BACKENDS_CPU_STORE_AVX512_H
#define HR_BACKENDS_CPU_STORE_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* dst[0..n) = bf16(src[i] + bias[i]) (bias may be NULL). */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) void
hr_store_bf16_row_avx512(uint16_t *dst, const float *src, const float *bias, int64_t n) {
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

#endif
