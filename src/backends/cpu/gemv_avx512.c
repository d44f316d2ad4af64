/* AVX-512 BF16 GEMV kernel (the decode route): vdpbf16ps multiplies bf16
 * pairs exactly and accumulates in f32. Chosen at run time
 * (hr_gemm_use_avx512_bf16). */
#include <immintrin.h>

#include "backends/cpu/gemm.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline __attribute__((always_inline)) TARGET_ __m512bh load32(const uint16_t *p, int64_t left) {
    if (left >= 32) return (__m512bh)_mm512_loadu_si512(p);
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1u << left) - 1u), p);
}

/* x [rows][k] bf16, w rows [nw][ldw] bf16: 4 weight rows per pass, each
 * 64-byte weight load feeding every x row. */
static inline __attribute__((always_inline)) TARGET_ void gemv4(int64_t k, int rows, const uint16_t *x,
                                                                const uint16_t *w, int64_t ldw, int nw,
                                                                float *y, int64_t ldy) {
    const uint16_t *wr[4];
    for (int j = 0; j < 4; j++) wr[j] = w + (j < nw ? j : 0) * ldw;
    __m512 acc[HR_GEMV_MAX_ROWS][4];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p += 32) {
        __m512bh wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) wv[j] = load32(wr[j] + p, k - p);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            __m512bh xv = load32(x + r * k + p, k - p);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, wv[j]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < nw; j++) y[r * ldy + j] = _mm512_reduce_add_ps(acc[r][j]);
}

TARGET_ void hr_gemv_bf16_avx512(int64_t k, int rows, const void *x, const void *w, hr_dtype wdt,
                                 int64_t ldw, int nw, float *y, int64_t ldy) {
    switch (rows) {
    case 1: gemv4(k, 1, x, w, ldw, nw, y, ldy); break;
    case 2: gemv4(k, 2, x, w, ldw, nw, y, ldy); break;
    case 3: gemv4(k, 3, x, w, ldw, nw, y, ldy); break;
    default: gemv4(k, 4, x, w, ldw, nw, y, ldy); break;
    }
}
