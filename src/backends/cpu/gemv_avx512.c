/* AVX-512 BF16 GEMV kernel (the decode route): vdpbf16ps multiplies bf16
 * pairs exactly and accumulates in f32. Chosen at run time
 * (hr_gemm_use_avx512_bf16). */
#include <immintrin.h>

#include "backends/cpu/gemm.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE_ static inline __attribute__((always_inline)) TARGET_

INLINE_ __m512bh load32(const uint16_t *p, int64_t left) {
    if (left >= 32) return (__m512bh)_mm512_loadu_si512(p);
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1u << left) - 1u), p);
}

/* Sums of the 16 lanes of a, b, c, d as [sum a, sum b, sum c, sum d]. */
INLINE_ __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 v = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xee));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* acc[r] = lanes of dot(x[r], w) for one weight row w [k]. The row is
 * read front to back, so a thread's weights form one linear stream that
 * the hardware prefetcher follows across rows (software prefetch only
 * slowed it); two chains per x row hide the vdpbf16ps latency. */
INLINE_ void row_dot(int64_t k, int rows, const uint16_t *x, const uint16_t *w, __m512 *acc) {
    __m512 a1[HR_GEMV_MAX_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) acc[r] = a1[r] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 64 <= k; p += 64) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + p), w1 = (__m512bh)_mm512_loadu_si512(w + p + 32);
        /* Pins the weights in registers: GCC would otherwise load them
         * again for every x row (seen at rows == 3, a third slower). */
        __asm__("" : "+v"(w0), "+v"(w1));
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(x + r * k + p), w0);
            a1[r] = _mm512_dpbf16_ps(a1[r], (__m512bh)_mm512_loadu_si512(x + r * k + p + 32), w1);
        }
    }
    for (; p < k; p += 32) {
        __m512bh wv = load32(w + p, k - p);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) acc[r] = _mm512_dpbf16_ps(acc[r], load32(x + r * k + p, k - p), wv);
    }
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) acc[r] = _mm512_add_ps(acc[r], a1[r]);
}

/* x [rows][k] bf16, w [nw][ldw] bf16, y [rows][ldy]: blocks of NB weight
 * rows keep NB * rows accumulators in registers, reduced four rows at a
 * time. */
INLINE_ void gemv_rows(int64_t k, int rows, int nb, const uint16_t *x, const uint16_t *w, int64_t ldw,
                       int nw, float *y, int64_t ldy) {
    int j0 = 0;
    for (; j0 + nb <= nw; j0 += nb) {
        __m512 acc[16][HR_GEMV_MAX_ROWS];
#pragma GCC unroll 16
        for (int j = 0; j < nb; j++) row_dot(k, rows, x, w + (j0 + j) * ldw, acc[j]);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
            for (int j = 0; j < nb; j += 4)
                _mm_storeu_ps(y + r * ldy + j0 + j, reduce4(acc[j][r], acc[j + 1][r], acc[j + 2][r], acc[j + 3][r]));
    }
    /* The last < nb weight rows, four at a time with zero padding: reduce4
     * sums each lane of a the same way whatever b, c, d hold, so a column's
     * value never depends on where nw cut the blocks. */
    for (; j0 < nw; j0 += 4) {
        int nj = nw - j0 < 4 ? nw - j0 : 4;
        __m512 acc[4][HR_GEMV_MAX_ROWS];
        for (int j = 0; j < 4; j++)
            if (j < nj) row_dot(k, rows, x, w + (j0 + j) * ldw, acc[j]);
            else
                for (int r = 0; r < rows; r++) acc[j][r] = _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm_mask_storeu_ps(y + r * ldy + j0, (__mmask8)((1u << nj) - 1u),
                               reduce4(acc[0][r], acc[1][r], acc[2][r], acc[3][r]));
    }
}

TARGET_ void hr_gemv_bf16_avx512(int64_t k, int rows, const void *x, const void *w, hr_dtype wdt,
                                 int64_t ldw, int nw, float *y, int64_t ldy) {
    (void)wdt;
    switch (rows) {
    case 1: gemv_rows(k, 1, 16, x, w, ldw, nw, y, ldy); break;
    case 2: gemv_rows(k, 2, 8, x, w, ldw, nw, y, ldy); break;
    case 3: gemv_rows(k, 3, 4, x, w, ldw, nw, y, ldy); break;
    default: gemv_rows(k, 4, 4, x, w, ldw, nw, y, ldy); break;
    }
}
