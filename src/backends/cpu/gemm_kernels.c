/* Portable GEMM micro-kernels and GEMV blocks: plain C (the reference the
 * others are tested against) and AVX2/FMA (the build baseline). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "core/half.h"

#define MR HR_GEMM_F32_MR
#define NR HR_GEMM_F32_NR

static inline void ukr_store(const float *acc, float *c, int64_t ldc, bool accumulate) {
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + acc[i * NR + j];
}

/* ap [kc][MR] f32, bp [kc][NR] f32, c [MR][ldc] */
void hr_gemm_ukr_f32_scalar(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                            bool accumulate) {
    const float *a = ap, *b = bp;
    float acc[MR * NR] = {0};
    for (int64_t p = 0; p < kc; p++, a += MR, b += NR)
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i * NR + j] += a[i] * b[j];
    ukr_store(acc, c, ldc, accumulate);
}

/* Same contract; 12 accumulators of 8 lanes keep both FMA ports busy. */
void hr_gemm_ukr_f32_avx2(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                          bool accumulate) {
    const float *a = ap, *b = bp;
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < kc; p++, a += MR, b += NR) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) {
        float *ci = c + i * ldc;
        if (accumulate) {
            acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(ci));
            acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(ci + 8));
        }
        _mm256_storeu_ps(ci, acc[i][0]);
        _mm256_storeu_ps(ci + 8, acc[i][1]);
    }
}

static inline float load_scalar(const void *p, hr_dtype dt, int64_t i) {
    switch (dt) {
    case HR_BF16: return hr_bf16_to_f32(((const uint16_t *)p)[i]);
    case HR_F16: return hr_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline __attribute__((always_inline)) __m256 load8(const void *p, hr_dtype dt, int64_t i) {
    switch (dt) {
    case HR_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
    case HR_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    default: return _mm256_loadu_ps((const float *)p + i);
    }
}

/* ---- packing support ---- */

/* dst[0..n) = contiguous src converted from dt (f32, bf16 or f16). */
void hr_gemm_row_f32_avx2(float *dst, const void *src, hr_dtype dt, int64_t n) {
    int64_t i = 0;
    if (dt == HR_F16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + i))));
    else if (dt == HR_BF16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, load8(src, HR_BF16, i));
    else
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps((const float *)src + i));
    for (; i < n; i++) dst[i] = load_scalar(src, dt, i);
}

void hr_gemm_load_f32(float *dst, const void *src, hr_dtype dt, int64_t n, int64_t stride, bool avx2) {
    if (avx2 && stride == 1)
        hr_gemm_row_f32_avx2(dst, src, dt, n);
    else
        hr_load_f32(dst, src, dt, n, stride);
}

/* dst[p * ldd + i] = element p of row i, for 8 rows of n 32-bit elements;
 * row i starts at src + i * lds bytes. 8 x 8 blocks are transposed in
 * registers, so packing a K-contiguous B writes whole panel rows. */
void hr_gemm_transpose8_avx2(const char *src, int64_t lds, int64_t n, uint32_t *dst, int64_t ldd) {
    int64_t p = 0;
    for (; p + 8 <= n; p += 8) {
        __m256 r[8], t[8], u[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps((const float *)(src + i * lds + 4 * p));
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
            u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int i = 0; i < 4; i++) {
            _mm256_storeu_ps((float *)(dst + (p + i) * ldd), _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
            _mm256_storeu_ps((float *)(dst + (p + i + 4) * ldd), _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
        }
    }
    for (; p < n; p++)
        for (int i = 0; i < 8; i++) memcpy(dst + p * ldd + i, src + i * lds + 4 * p, 4);
}

/* ---- GEMV ---- */

/* x [rows][k] f32, w rows [nw][ldw] in wdt, y [rows][ldy] */
void hr_gemv_scalar(int64_t k, int rows, const void *x, const void *w, hr_dtype wdt, int64_t ldw, int nw,
                    float *y, int64_t ldy) {
    const float *xf = x;
    size_t isz = hr_dtype_size(wdt);
    for (int j = 0; j < nw; j++) {
        const char *wj = (const char *)w + (size_t)(j * ldw) * isz;
        for (int r = 0; r < rows; r++) {
            float s = 0.0f;
            for (int64_t p = 0; p < k; p++) s += xf[r * k + p] * load_scalar(wj, wdt, p);
            y[r * ldy + j] = s;
        }
    }
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One specialization per (rows, wdt): 4 weight rows share each x load and
 * each weight load serves every x row, so W streams from memory once.
 *
 * The four rows are four streams a row length apart, which the hardware
 * prefetchers follow poorly when rows are short: so each row of the next
 * block is prefetched a line at a time as this block's reads cross a line
 * (the next block is usually the next four rows in memory, or just past a
 * thread's range; a prefetch never faults). Qwen3 shapes, in-place bf16
 * weights from DRAM, 2 threads (bench_gemv, alternated runs): K = 1024
 * 10-14 -> 14-18 GB/s, the lm_head 12 -> 16, K = 3072 15-17 -> 19-21, of a
 * 19-25 GB/s read; NTA, as the skinny route, since each line is read once. */
static inline __attribute__((always_inline)) void gemv4_avx2(int64_t k, int rows, const float *x,
                                                             const char *w, hr_dtype wdt, int64_t ldw,
                                                             int nw, float *y, int64_t ldy) {
    size_t isz = wdt == HR_F32 ? 4 : 2;
    const char *wr[4];
    for (int j = 0; j < 4; j++) wr[j] = w + (size_t)((j < nw ? j : 0) * ldw) * isz;
    __m256 acc[HR_GEMV_MAX_ROWS][4];
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_ps();
    int64_t p = 0;
    /* the next block's rows: integers, as the block may be the last */
    uintptr_t pf = (uintptr_t)w + (uintptr_t)(4 * ldw) * isz;
    int64_t pf_every = 64 / (8 * (int64_t)isz); /* loop steps per line */
    for (; p + 8 <= k; p += 8) {
        __m256 wv[4];
        if ((p / 8) % pf_every == 0)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                _mm_prefetch((const char *)(pf + (uintptr_t)(j * ldw + p) * isz), _MM_HINT_NTA);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) wv[j] = load8(wr[j], wdt, p);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * k + p);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < nw; j++) {
            float s = hsum8(acc[r][j]);
            for (int64_t q = p; q < k; q++) s += x[r * k + q] * load_scalar(wr[j], wdt, q);
            y[r * ldy + j] = s;
        }
}

#define GEMV_ROWS_(R, DT) \
    case R: gemv4_avx2(k, R, x, w, DT, ldw, nw, y, ldy); break;
#define GEMV_DT_(DT)                                                                       \
    switch (rows) {                                                                        \
        GEMV_ROWS_(1, DT) GEMV_ROWS_(2, DT) GEMV_ROWS_(3, DT) default : GEMV_ROWS_(4, DT) \
    }

static void gemv_avx2_block(int64_t k, int rows, const float *x, const char *w, hr_dtype wdt, int64_t ldw,
                            int nw, float *y, int64_t ldy) {
    switch (wdt) {
    case HR_BF16: GEMV_DT_(HR_BF16) break;
    case HR_F16: GEMV_DT_(HR_F16) break;
    default: GEMV_DT_(HR_F32) break;
    }
}

void hr_gemv_avx2(int64_t k, int rows, const void *x, const void *w, hr_dtype wdt, int64_t ldw, int nw,
                  float *y, int64_t ldy) {
    size_t isz = hr_dtype_size(wdt);
    for (int j = 0; j < nw; j += 4)
        gemv_avx2_block(k, rows, x, (const char *)w + (size_t)(j * ldw) * isz, wdt, ldw, nw - j < 4 ? nw - j : 4,
                        y + j, ldy);
}
