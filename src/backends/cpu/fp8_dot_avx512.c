/* AVX-512 kernels of fp8_dot.h. Sums run in 16 f32 lanes over k, reduced
 * at the end of a row: the order depends on k alone. Chosen at run time
 * (hr_fp8_avx512_ok). */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/fp8_dot.h"
#include "hubrt/runtime.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
#define INLINE_ static inline __attribute__((always_inline)) TARGET_

bool hr_fp8_avx512_ok(void) {
    const hr_cpu_features *f = hr_cpu_features_get();
    return hr_cpu_isa_get() >= HR_ISA_AVX512 && f->avx512f && f->avx512bw && f->f16c;
}

/* Block p's 32 values: codes 0..15 into *w0, 16..31 into *w1. */
INLINE_ void decode32(const uint8_t *p, __m512 *w0, __m512 *w1) {
    float d;
    memcpy(&d, p, 4);
    const __m512 ds = _mm512_set1_ps(d * 256.0f);
    __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p + 4)));
    /* exponent and mantissa up by 7, the sign up by 8: binary16 bits */
    __m512i h = _mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(c, _mm512_set1_epi16(0x7f)), 7),
                                _mm512_slli_epi16(_mm512_and_si512(c, _mm512_set1_epi16(0x80)), 8));
    *w0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), ds);
    *w1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), ds);
}

/* One weight row against m x rows: two accumulators per x row (one per
 * half block) hide the FMA latency. */
INLINE_ void gemv_row(int m, const uint8_t *p, int64_t k, const float *x, float *out, int64_t ors) {
    __m512 a0[4], a1[4];
    for (int r = 0; r < m; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 32, p += 36) {
        __m512 w0, w1;
        decode32(p, &w0, &w1);
        for (int r = 0; r < m; r++) {
            a0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * k + i), a0[r]);
            a1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * k + i + 16), a1[r]);
        }
    }
    for (int r = 0; r < m; r++) out[r * ors] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
}

TARGET_ void hr_fp8_gemv_avx512(const uint8_t *w, size_t w_rs, int64_t k, int nw, const float *x, int m, float *out,
                                int64_t ors) {
    for (int j = 0; j < nw; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        switch (m) {
        case 1: gemv_row(1, p, k, x, out + j, ors); break;
        case 2: gemv_row(2, p, k, x, out + j, ors); break;
        case 3: gemv_row(3, p, k, x, out + j, ors); break;
        default: gemv_row(4, p, k, x, out + j, ors); break;
        }
    }
}

TARGET_ void hr_fp8_dequant_avx512(const uint8_t *w, size_t w_rs, int64_t k, int nw, float *wf) {
    for (int j = 0; j < nw; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        float *o = wf + (size_t)j * (size_t)k;
        for (int64_t i = 0; i < k; i += 32, p += 36) {
            __m512 w0, w1;
            decode32(p, &w0, &w1);
            _mm512_storeu_ps(o + i, w0);
            _mm512_storeu_ps(o + i + 16, w1);
        }
    }
}

/* nr x nc (<= 4 x 4) dot products, 16 accumulators. */
INLINE_ void dots_block(int nr, int nc, const float *wf, const float *x, int64_t k, float *out, int64_t ors) {
    __m512 acc[4][4];
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < nc; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        __m512 wv[4];
        for (int j = 0; j < nc; j++) wv[j] = _mm512_loadu_ps(wf + j * k + i);
        for (int r = 0; r < nr; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * k + i);
            for (int j = 0; j < nc; j++) acc[r][j] = _mm512_fmadd_ps(wv[j], xv, acc[r][j]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < nc; j++) out[r * ors + j] = _mm512_reduce_add_ps(acc[r][j]);
}

TARGET_ void hr_f32_dots_avx512(const float *wf, int nw, const float *x, int m, int64_t k, float *out, int64_t ors) {
    for (int r = 0; r < m; r += 4) {
        int nr = m - r < 4 ? m - r : 4;
        for (int j = 0; j < nw; j += 4) {
            int nc = nw - j < 4 ? nw - j : 4;
            const float *wj = wf + j * k, *xr = x + r * k;
            float *o = out + r * ors + j;
            if (nr == 4 && nc == 4) dots_block(4, 4, wj, xr, k, o, ors);
            else dots_block(nr, nc, wj, xr, k, o, ors);
        }
    }
}
