/* AVX-512 kernels of fp8_dot.h. Sums run in 16 f32 lanes over k, reduced
 * at the end of a row: the order depends on k alone. Chosen at run time
 * (hr_fp8_avx512_ok). */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/fp8_dot.h"
#include "hubrt/base.h"
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
    /* the code in the high byte, shifted down by one with its sign copied
     * into bit 14, which is then cleared: exponent and mantissa up by 7,
     * the sign at bit 15, as binary16 bits */
    __m512i h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(c, 8), 1), _mm512_set1_epi16((short)0xBFFF));
    *w0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), ds);
    *w1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), ds);
}

/* One weight row against m (<= 8) x rows: two accumulators per x row
 * (one per half block) hide the FMA latency. */
INLINE_ void gemv_row(int m, const uint8_t *p, int64_t k, const float *x, float *out, int64_t ors) {
    __m512 a0[8], a1[8];
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

/* Groups of up to 8 x rows, each weight row decoded once per group (the
 * tile's blocks stay in cache between the groups). */
TARGET_ void hr_fp8_gemv_avx512(const uint8_t *w, size_t w_rs, int64_t k, int nw, const float *x, int m, float *out,
                                int64_t ors) {
    for (int r0 = 0; r0 < m; r0 += 8) {
        const float *xr = x + (size_t)r0 * (size_t)k;
        float *o = out + r0 * ors;
        for (int j = 0; j < nw; j++) {
            const uint8_t *p = w + (size_t)j * w_rs;
            switch (m - r0 < 8 ? m - r0 : 8) {
            case 1: gemv_row(1, p, k, xr, o + j, ors); break;
            case 2: gemv_row(2, p, k, xr, o + j, ors); break;
            case 3: gemv_row(3, p, k, xr, o + j, ors); break;
            case 4: gemv_row(4, p, k, xr, o + j, ors); break;
            case 5: gemv_row(5, p, k, xr, o + j, ors); break;
            case 6: gemv_row(6, p, k, xr, o + j, ors); break;
            case 7: gemv_row(7, p, k, xr, o + j, ors); break;
            default: gemv_row(8, p, k, xr, o + j, ors); break;
            }
        }
    }
}

/* 16 f32 values as dt (bf16: rounded to nearest even, as hr_f32_to_bf16;
 * the values are finite) at o. */
INLINE_ void store16(hr_dtype dt, __m512 v, void *o) {
    if (dt == HR_F32) {
        _mm512_storeu_ps(o, v);
    } else if (dt == HR_F16) {
        _mm256_storeu_si256(o, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
        __m512i u = _mm512_castps_si512(v);
        __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        u = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
        _mm256_storeu_si256(o, _mm512_cvtepi32_epi16(u));
    }
}

TARGET_ void hr_fp8_dequant_avx512(const uint8_t *w, size_t w_rs, int64_t k, int nw, hr_dtype dt, void *out) {
    size_t es = dt == HR_F32 ? 4 : 2;
    for (int j = 0; j < nw; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        char *o = (char *)out + (size_t)j * (size_t)k * es;
        for (int64_t i = 0; i < k; i += 32, p += 36) {
            __m512 w0, w1;
            decode32(p, &w0, &w1);
            store16(dt, w0, o + (size_t)i * es);
            store16(dt, w1, o + (size_t)(i + 16) * es);
        }
    }
}
