/* AVX-512 VNNI dot products of unpacked weight rows (quant_rows.h) with
 * int8 activations: vpdpbusd sums four u8 x s8 products per int32 lane,
 * so lane l of a 64-byte step holds elements 4l..4l+3, all in run l / 4;
 * the lanes are scaled by their run's weight and activation scales in f32.
 * Four weight rows share each load of the activations. Chosen at run time
 * (hr_qdot_pick). */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/quant_rows.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
#define INLINE_ static inline __attribute__((always_inline)) TARGET_

/* Each of 4 run scales over its 4 lanes. */
INLINE_ __m512 spread4(__m128 v) {
    const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

/* sum(c[r] * xs[r]) over the row's runs. */
INLINE_ float const_term(int64_t runs, const float *c, const float *xs) {
    __m512 acc = _mm512_setzero_ps();
    int64_t r = 0;
    for (; r + 16 <= runs; r += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(c + r), _mm512_loadu_ps(xs + r), acc);
    if (r < runs) {
        __mmask16 m = (__mmask16)((1u << (runs - r)) - 1u);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, c + r), _mm512_maskz_loadu_ps(m, xs + r), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* acc[j] += lanes of nw (<= 4) rows' products over elements [i, i + 64)
 * (or 32 of them, masked: `bytes`, `runs` set the step). */
INLINE_ void step(int nw, int64_t k, const uint8_t *u, const float *s, int64_t i, __mmask64 bytes, __mmask16 runs,
                  hr_qx x, __m512 *acc) {
    __m512i q = _mm512_maskz_loadu_epi8(bytes, x.q + i);
    __m128 xd = _mm_maskz_loadu_ps((__mmask8)runs, x.xd + i / HR_QSUB);
    int64_t nr = k / HR_QSUB;
    for (int j = 0; j < nw; j++) {
        __m512i w = _mm512_maskz_loadu_epi8(bytes, u + j * k + i);
        __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, q));
        __m128 sc = _mm_mul_ps(_mm_maskz_loadu_ps((__mmask8)runs, s + j * nr + i / HR_QSUB), xd);
        acc[j] = _mm512_fmadd_ps(p, spread4(sc), acc[j]);
    }
}

INLINE_ void rows(int nw, int64_t k, const uint8_t *u, const float *s, const float *c, hr_qx x, float *out) {
    __m512 acc[4];
    for (int j = 0; j < nw; j++) acc[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= k; i += 64) step(nw, k, u, s, i, ~(__mmask64)0, 0xF, x, acc);
    if (i < k) step(nw, k, u, s, i, (__mmask64)0xFFFFFFFFu, 0x3, x, acc); /* k is a multiple of 32 */
    int64_t nr = k / HR_QSUB;
    for (int j = 0; j < nw; j++) out[j] = _mm512_reduce_add_ps(acc[j]) + const_term(nr, c + j * nr, x.xs);
}

TARGET_ void hr_qdot_avx512(int64_t k, int nw, const uint8_t *u, const float *s, const float *c, hr_qx x,
                            float *out) {
    int64_t nr = k / HR_QSUB;
    int j = 0;
    for (; j + 4 <= nw; j += 4) rows(4, k, u + j * k, s + j * nr, c + j * nr, x, out + j);
    for (; j < nw; j++) rows(1, k, u + j * k, s + j * nr, c + j * nr, x, out + j);
}

/* ---- decode rows straight from the 32-element blocks ------------------------------ */

/* 32 nibbles of 16 bytes: low nibbles (elements 0..15), then high ones. */
INLINE_ __m256i nibbles32(const uint8_t *p) {
    __m128i raw = _mm_loadu_si128((const __m128i *)p), lo = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), lo), _mm_and_si128(raw, lo));
}

INLINE_ float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Block p of type dt as 32 bytes u with scale *d and constant *c
 * (quant_rows.c's unpacked form, in registers). */
INLINE_ __m256i block_u(hr_dtype dt, const uint8_t *p, float *d, float *c) {
    static const uint8_t IQ4_U[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
    uint32_t qh;
    *d = f16_at(p);
    switch (dt) {
    case HR_Q4_0: *c = -8.0f * *d; return nibbles32(p + 2);
    case HR_Q4_1: *c = f16_at(p + 2); return nibbles32(p + 4);
    case HR_Q5_0:
        *c = -16.0f * *d;
        memcpy(&qh, p + 2, 4);
        return _mm256_or_si256(nibbles32(p + 6), _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10)));
    case HR_Q5_1:
        *c = f16_at(p + 2);
        memcpy(&qh, p + 4, 4);
        return _mm256_or_si256(nibbles32(p + 8), _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10)));
    case HR_Q8_0:
        *c = -128.0f * *d;
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_epi8((char)0x80));
    default: /* HR_IQ4_NL */
        *c = -128.0f * *d;
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_U)),
                                   nibbles32(p + 2));
    }
}

INLINE_ float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* out[r][j] (rows ors apart) for nw weight rows and m <= HR_QGEMV_ROWS x
 * rows: each block unpacked once in registers and dotted with every x
 * row; two chains per row hide the dot product's latency. */
INLINE_ void gemv_rows(hr_dtype dt, size_t bb, const uint8_t *w, size_t w_rs, int64_t k, int nw, int m,
                       const hr_qx *x, float *out, int64_t ors) {
    int64_t nb = k / 32;
    for (int j = 0; j < nw; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        __m256 acc[HR_QGEMV_ROWS][2];
        float cacc[HR_QGEMV_ROWS] = {0};
        for (int r = 0; r < m; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++, p += bb) {
            float d, c;
            __m256i u = block_u(dt, p, &d, &c);
            for (int r = 0; r < m; r++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(x[r].q + 32 * b));
                __m256 s = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, q));
                acc[r][b & 1] = _mm256_fmadd_ps(s, _mm256_set1_ps(d * x[r].xd[2 * b]), acc[r][b & 1]);
                cacc[r] += c * (x[r].xs[2 * b] + x[r].xs[2 * b + 1]);
            }
        }
        for (int r = 0; r < m; r++) out[r * ors + j] = hsum8(_mm256_add_ps(acc[r][0], acc[r][1])) + cacc[r];
    }
}

bool hr_qgemv_avx512_has(hr_dtype dt) {
    return dt == HR_Q4_0 || dt == HR_Q4_1 || dt == HR_Q5_0 || dt == HR_Q5_1 || dt == HR_Q8_0 || dt == HR_IQ4_NL;
}

TARGET_ void hr_qgemv_avx512(hr_dtype dt, const uint8_t *w, size_t w_rs, int64_t k, int nw, int m, const hr_qx *x,
                             float *out, int64_t ors) {
    size_t bb = hr_dtype_nbytes(dt, 32);
    switch (dt) {
    case HR_Q4_0: gemv_rows(HR_Q4_0, bb, w, w_rs, k, nw, m, x, out, ors); break;
    case HR_Q4_1: gemv_rows(HR_Q4_1, bb, w, w_rs, k, nw, m, x, out, ors); break;
    case HR_Q5_0: gemv_rows(HR_Q5_0, bb, w, w_rs, k, nw, m, x, out, ors); break;
    case HR_Q5_1: gemv_rows(HR_Q5_1, bb, w, w_rs, k, nw, m, x, out, ors); break;
    case HR_Q8_0: gemv_rows(HR_Q8_0, bb, w, w_rs, k, nw, m, x, out, ors); break;
    default: gemv_rows(HR_IQ4_NL, bb, w, w_rs, k, nw, m, x, out, ors); break;
    }
}
