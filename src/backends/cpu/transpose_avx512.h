/* 16 x 16 transpose of 32-bit elements in AVX-512 registers: what packs
 * bf16 rows into K-pair panels (one u32 is a pair of bf16), so that a pair
 * of one row can be broadcast against the same pair of sixteen others. */
#ifndef HR_BACKENDS_CPU_TRANSPOSE_AVX512_H
#define HR_BACKENDS_CPU_TRANSPOSE_AVX512_H

#include <immintrin.h>

/* r[i] holds row i (16 u32); afterwards r[i] holds column i. */
static inline __attribute__((always_inline, target("avx512f"))) void hr_transpose16_u32(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c */
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int cc = 0; cc < 4; cc++) {
        __m512i v02 = _mm512_shuffle_i32x4(u[cc], u[4 + cc], 0x88);
        __m512i w02 = _mm512_shuffle_i32x4(u[8 + cc], u[12 + cc], 0x88);
        __m512i v13 = _mm512_shuffle_i32x4(u[cc], u[4 + cc], 0xdd);
        __m512i w13 = _mm512_shuffle_i32x4(u[8 + cc], u[12 + cc], 0xdd);
        r[cc] = _mm512_shuffle_i32x4(v02, w02, 0x88);
        r[8 + cc] = _mm512_shuffle_i32x4(v02, w02, 0xdd);
        r[4 + cc] = _mm512_shuffle_i32x4(v13, w13, 0x88);
        r[12 + cc] = _mm512_shuffle_i32x4(v13, w13, 0xdd);
    }
}

#endif
