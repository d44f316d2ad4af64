/* Row kernels of rope, rms_norm and add_rms_norm (k_nn_simd.h): each
 * vector of 8 values (16 on the AVX-512 bf16 rows) is loaded from its
 * dtype, computed and rounded in registers and stored, in place of
 * k_nn.c's round trips through f32 chunk buffers and per-chunk conversion
 * calls, which cost more than the arithmetic on the model's rows of 128
 * (heads) or 1024 (hidden) values. A partial last vector goes through a
 * padded copy: the code works lane by lane, so the padding changes no
 * lane. */
#include "backends/cpu/k_nn_simd.h"

#include <math.h>
#include <string.h>

#include "core/half.h"
#include "hubrt/runtime.h"

#if HR_NN_SIMD
#include "backends/cpu/simd_math.h"

#define INLINE static inline __attribute__((always_inline))

/* The dtypes, as constants the row templates below specialize on. */
enum { K_F32, K_BF16, K_F16 };

INLINE int64_t esz(int k) { return k == K_F32 ? 4 : 2; }

INLINE __m256 ld8(int k, const char *p) {
    if (k == K_F32) return _mm256_loadu_ps((const float *)p);
    if (k == K_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return hr_bf16x8_load(p);
}

INLINE float ld1(int k, const char *p) {
    uint16_t h;
    if (k == K_F32) {
        float f;
        memcpy(&f, p, sizeof f);
        return f;
    }
    memcpy(&h, p, sizeof h);
    return k == K_F16 ? hr_f16_to_f32(h) : hr_bf16_to_f32(h);
}

/* f32(dt(v)): what a store to dt and a load back give (k_nn.c's round_to,
 * in every bit a later store keeps). */
INLINE __m256 rnd8(int k, __m256 v) {
    if (k == K_F32) return v;
    if (k == K_F16) return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    return _mm256_castsi256_ps(hr_bf16x8_round(v));
}

/* Stores v in dt, rounded as hr_k_store_f32 rounds. */
INLINE void st8(int k, char *p, __m256 v) {
    if (k == K_F32) return _mm256_storeu_ps((float *)p, v);
    if (k == K_F16) return _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    hr_bf16x8_store(p, v);
}

/* ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)): k_nn.c's order. */
INLINE float hsum_pairs(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_hadd_ps(t, t);
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* ---- rope ----------------------------------------------------------------- */

/* Eight features i of the first half and their partners i + half:
 * y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2, each product rounded to the dtype
 * before the sum (k_nn.c's rope_math). */
INLINE void rope8(int k, const char *x1, const char *x2, const char *c1, const char *c2, const char *s1,
                  const char *s2, char *y1, char *y2) {
    __m256 a = ld8(k, x1), b = ld8(k, x2);
    __m256 nb = _mm256_xor_ps(b, _mm256_set1_ps(-0.0f));
    __m256 p0 = rnd8(k, _mm256_mul_ps(a, ld8(k, c1))), p1 = rnd8(k, _mm256_mul_ps(nb, ld8(k, s1)));
    __m256 p2 = rnd8(k, _mm256_mul_ps(b, ld8(k, c2))), p3 = rnd8(k, _mm256_mul_ps(a, ld8(k, s2)));
    st8(k, y1, _mm256_add_ps(p0, p1));
    st8(k, y2, _mm256_add_ps(p2, p3));
}

/* Features [i0, half) of one row and their partners. */
INLINE void rope_span(int k, int64_t i0, int64_t half, const char *x, const char *c, const char *s, char *y) {
    const int64_t e = esz(k), h = half * e;
    int64_t i = i0 * e, end = half * e;
    for (; i + 8 * e <= end; i += 8 * e)
        rope8(k, x + i, x + h + i, c + i, c + h + i, s + i, s + h + i, y + i, y + h + i);
    if (i == end) return;
    char pad[8][32] = {{0}};
    const char *src[6] = {x, x + h, c, c + h, s, s + h};
    for (int j = 0; j < 6; j++) memcpy(pad[j], src[j] + i, (size_t)(end - i));
    rope8(k, pad[0], pad[1], pad[2], pad[3], pad[4], pad[5], pad[6], pad[7]);
    memcpy(y + i, pad[6], (size_t)(end - i));
    memcpy(y + h + i, pad[7], (size_t)(end - i));
}

INLINE void rope_rows_k(int k, int64_t rows, int64_t half, const char *x, int64_t xs, const char *c,
                        int64_t cs, const char *s, int64_t ss, char *y, int64_t ys) {
    for (int64_t r = 0; r < rows; r++, x += xs, c += cs, s += ss, y += ys) rope_span(k, 0, half, x, c, s, y);
}

/* ---- AVX-512 bf16: 16 lanes, vcvtneps2bf16 rounding ----------------------
 *
 * A block of values is computed with vcvtneps2bf16, and if any value it
 * rounds or stores is subnormal, which it would flush, the block is redone
 * by the AVX2 code above (simd_math.h). A row's last partial block (< 16
 * values) takes the AVX2 code too, so its tail handling stays that code's. */

#define T512 HR_T512
#define INLINE512 static inline __attribute__((always_inline)) T512

/* rope8's math on 16 features; false (nothing stored) when a product or
 * sum is subnormal. */
INLINE512 bool rope16(const char *x1, const char *x2, const char *c1, const char *c2, const char *s1,
                      const char *s2, char *y1, char *y2) {
    __m512 a = hr_bf16x16_load(x1), b = hr_bf16x16_load(x2);
    __m512 nb = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(b), _mm512_set1_epi32((int)0x80000000u)));
    __m512 p0 = _mm512_mul_ps(a, hr_bf16x16_load(c1)), p1 = _mm512_mul_ps(nb, hr_bf16x16_load(s1));
    __m512 p2 = _mm512_mul_ps(b, hr_bf16x16_load(c2)), p3 = _mm512_mul_ps(a, hr_bf16x16_load(s2));
    __mmask16 bad = hr_subnormal16(p0) | hr_subnormal16(p1) | hr_subnormal16(p2) | hr_subnormal16(p3);
    __m512 q0 = _mm512_add_ps(hr_bf16x16_unpack(hr_bf16x16_pack(p0)), hr_bf16x16_unpack(hr_bf16x16_pack(p1)));
    __m512 q1 = _mm512_add_ps(hr_bf16x16_unpack(hr_bf16x16_pack(p2)), hr_bf16x16_unpack(hr_bf16x16_pack(p3)));
    if (bad | hr_subnormal16(q0) | hr_subnormal16(q1)) return false;
    _mm256_storeu_si256((__m256i *)y1, hr_bf16x16_pack(q0));
    _mm256_storeu_si256((__m256i *)y2, hr_bf16x16_pack(q1));
    return true;
}

static T512 void rope_rows_bf16_avx512(int64_t rows, int64_t half, const char *x, int64_t xs, const char *c,
                                       int64_t cs, const char *s, int64_t ss, char *y, int64_t ys) {
    const int64_t h = half * 2, whole = (half & ~(int64_t)15) * 2;
    for (int64_t r = 0; r < rows; r++, x += xs, c += cs, s += ss, y += ys) {
        for (int64_t i = 0; i < whole; i += 32)
            if (!rope16(x + i, x + h + i, c + i, c + h + i, s + i, s + h + i, y + i, y + h + i))
                for (int64_t j = i; j < i + 32; j += 16)
                    rope8(K_BF16, x + j, x + h + j, c + j, c + h + j, s + j, s + h + j, y + j, y + h + j);
        rope_span(K_BF16, whole / 2, half, x, c, s, y);
    }
}

static void rope_rows_f32(int64_t rows, int64_t half, const char *x, int64_t xs, const char *c, int64_t cs,
                          const char *s, int64_t ss, char *y, int64_t ys) {
    rope_rows_k(K_F32, rows, half, x, xs, c, cs, s, ss, y, ys);
}
static void rope_rows_bf16(int64_t rows, int64_t half, const char *x, int64_t xs, const char *c, int64_t cs,
                           const char *s, int64_t ss, char *y, int64_t ys) {
    rope_rows_k(K_BF16, rows, half, x, xs, c, cs, s, ss, y, ys);
}
static void rope_rows_f16(int64_t rows, int64_t half, const char *x, int64_t xs, const char *c, int64_t cs,
                          const char *s, int64_t ss, char *y, int64_t ys) {
    rope_rows_k(K_F16, rows, half, x, xs, c, cs, s, ss, y, ys);
}

/* ---- rms_norm ------------------------------------------------------------- */

/* The sum of squares of one row in k_nn.c's order: per chunk two vector
 * accumulators over 16 values at a time, their sum reduced by
 * hsum_pairs, the chunk's tail added one by one, the chunks summed. */
INLINE float rms_sum_sq(int k, const char *x, int64_t h, int64_t chunk) {
    const int64_t e = esz(k);
    float acc = 0;
    for (int64_t k0 = 0; k0 < h; k0 += chunk) {
        int64_t n = h - k0 < chunk ? h - k0 : chunk, i = 0;
        const char *p = x + k0 * e;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            __m256 u = ld8(k, p + i * e), v = ld8(k, p + (i + 8) * e);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(u, u));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(v, v));
        }
        float sum = hsum_pairs(_mm256_add_ps(a0, a1));
        for (; i < n; i++) {
            float t = ld1(k, p + i * e);
            sum += t * t;
        }
        acc += sum;
    }
    return acc;
}

/* y = x * rstd [rounded] [* w] for 8 values; `tail` adds the + 0.0f of
 * k_nn.c's scalar tail, which turns a -0 product into +0. */
INLINE void rms8(int k, const char *x, char *y, const float *w, __m256 rstd, bool round_first, bool tail) {
    __m256 v = _mm256_mul_ps(ld8(k, x), rstd);
    if (w) {
        if (round_first) v = rnd8(k, v);
        v = _mm256_mul_ps(v, _mm256_loadu_ps(w));
        if (tail) v = _mm256_add_ps(v, _mm256_setzero_ps());
    }
    st8(k, y, v);
}

/* Values [i0, h) of one row (i0 a multiple of 8). */
INLINE void rms_span(int k, int64_t i0, int64_t h, const char *x, char *y, const float *w, __m256 rstd,
                     bool round_first) {
    const int64_t e = esz(k), whole = h & ~(int64_t)7, rest = h - whole;
    for (int64_t i = i0; i < whole; i += 8) rms8(k, x + i * e, y + i * e, w ? w + i : NULL, rstd, round_first, false);
    if (!rest) return;
    char px[32] = {0}, py[32];
    float pw[8] = {0};
    memcpy(px, x + whole * e, (size_t)(rest * e));
    if (w) memcpy(pw, w + whole, sizeof(float) * (size_t)rest);
    rms8(k, px, py, w ? pw : NULL, rstd, round_first, true);
    memcpy(y + whole * e, py, (size_t)(rest * e));
}

INLINE void rms_rows_k(int k, int64_t rows, int64_t h, int64_t chunk, const char *x, int64_t xs, char *y,
                       int64_t ys, const float *w, bool round_first, float eps) {
    for (int64_t r = 0; r < rows; r++, x += xs, y += ys) {
        float acc = rms_sum_sq(k, x, h, chunk);
        rms_span(k, 0, h, x, y, w, _mm256_set1_ps(1.0f / sqrtf(acc / (float)h + eps)), round_first);
    }
}

/* rms_sum_sq of a bf16 row with one 16-lane accumulator: its low and high
 * halves are rms_sum_sq's two accumulators, lane for lane. */
static T512 float rms_sum_sq_bf16_avx512(const char *x, int64_t h, int64_t chunk) {
    float acc = 0;
    for (int64_t k0 = 0; k0 < h; k0 += chunk) {
        int64_t n = h - k0 < chunk ? h - k0 : chunk, i = 0;
        const char *p = x + k0 * 2;
        __m512 a = _mm512_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            __m512 u = hr_bf16x16_load(p + i * 2);
            a = _mm512_add_ps(a, _mm512_mul_ps(u, u));
        }
        float sum = hsum_pairs(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
        for (; i < n; i++) {
            float t = ld1(K_BF16, p + i * 2);
            sum += t * t;
        }
        acc += sum;
    }
    return acc;
}

/* rms8's math on 16 values; false (nothing stored) when a value rounded
 * or stored is subnormal. */
INLINE512 bool rms16(const char *x, char *y, const float *w, __m512 rstd, bool round_first) {
    __m512 v = _mm512_mul_ps(hr_bf16x16_load(x), rstd);
    __mmask16 bad = 0;
    if (w) {
        if (round_first) {
            bad = hr_subnormal16(v);
            v = hr_bf16x16_unpack(hr_bf16x16_pack(v));
        }
        v = _mm512_mul_ps(v, _mm512_loadu_ps(w));
    }
    if (bad | hr_subnormal16(v)) return false;
    _mm256_storeu_si256((__m256i *)y, hr_bf16x16_pack(v));
    return true;
}

/* rms_span of a whole bf16 row, 16 values at a time. */
static T512 void rms_scale_bf16_avx512(int64_t h, const char *x, char *y, const float *w, bool round_first,
                                       float rstd) {
    const int64_t whole = h & ~(int64_t)15;
    __m512 r16 = _mm512_set1_ps(rstd);
    __m256 r8 = _mm256_set1_ps(rstd);
    for (int64_t i = 0; i < whole; i += 16)
        if (!rms16(x + i * 2, y + i * 2, w ? w + i : NULL, r16, round_first))
            rms_span(K_BF16, i, i + 16, x, y, w, r8, round_first);
    rms_span(K_BF16, whole, h, x, y, w, r8, round_first);
}

/* The reduced vector sum of one row's chunk plus its tail, in rms_sum_sq's
 * order. */
INLINE512 float chunk_sum(__m512 a, const char *p, int64_t i, int64_t n) {
    float sum = hsum_pairs(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
    for (; i < n; i++) {
        float t = ld1(K_BF16, p + i * 2);
        sum += t * t;
    }
    return sum;
}

/* rms_sum_sq_bf16_avx512 of two rows of one chunk (h <= chunk) in one loop:
 * the short rows of per-head norms (128 values) are bound by the latency
 * of their one accumulator, which two independent rows hide. */
static T512 void rms_sum_sq2_bf16_avx512(const char *x0, const char *x1, int64_t h, float *s0, float *s1) {
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= h; i += 16) {
        __m512 u = hr_bf16x16_load(x0 + i * 2), v = hr_bf16x16_load(x1 + i * 2);
        a = _mm512_add_ps(a, _mm512_mul_ps(u, u));
        b = _mm512_add_ps(b, _mm512_mul_ps(v, v));
    }
    /* 0 + sum: rms_sum_sq's acc over one chunk */
    *s0 = 0.0f + chunk_sum(a, x0, i, h);
    *s1 = 0.0f + chunk_sum(b, x1, i, h);
}

static T512 void rms_rows_bf16_avx512(int64_t rows, int64_t h, int64_t chunk, const char *x, int64_t xs, char *y,
                                      int64_t ys, const float *w, bool round_first, float eps) {
    int64_t r = 0;
    for (; h <= chunk && r + 2 <= rows; r += 2, x += 2 * xs, y += 2 * ys) {
        float s0, s1;
        rms_sum_sq2_bf16_avx512(x, x + xs, h, &s0, &s1);
        rms_scale_bf16_avx512(h, x, y, w, round_first, 1.0f / sqrtf(s0 / (float)h + eps));
        rms_scale_bf16_avx512(h, x + xs, y + ys, w, round_first, 1.0f / sqrtf(s1 / (float)h + eps));
    }
    for (; r < rows; r++, x += xs, y += ys)
        rms_scale_bf16_avx512(h, x, y, w, round_first,
                              1.0f / sqrtf(rms_sum_sq_bf16_avx512(x, h, chunk) / (float)h + eps));
}

/* ---- add_rms_norm ------------------------------------------------------- */

INLINE void st1(int k, char *p, float v) {
    if (k == K_F32) {
        memcpy(p, &v, sizeof v);
        return;
    }
    uint16_t h = k == K_F16 ? hr_f32_to_f16(v) : hr_f32_to_bf16(v);
    memcpy(p, &h, sizeof h);
}

/* s = dt(x + r) over a row, returning the sum of the rounded squares in
 * rms_sum_sq's order (k_nn.c's add_round_sum_sq over its chunks). */
INLINE float add_sum_sq_k(int k, int64_t h, int64_t chunk, const char *x, const char *r, char *s) {
    const int64_t e = esz(k);
    float acc = 0;
    for (int64_t k0 = 0; k0 < h; k0 += chunk) {
        int64_t n = h - k0 < chunk ? h - k0 : chunk, i = 0;
        const char *px = x + k0 * e, *pr = r + k0 * e;
        char *ps = s + k0 * e;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            __m256 u = rnd8(k, _mm256_add_ps(ld8(k, px + i * e), ld8(k, pr + i * e)));
            __m256 v = rnd8(k, _mm256_add_ps(ld8(k, px + (i + 8) * e), ld8(k, pr + (i + 8) * e)));
            st8(k, ps + i * e, u);
            st8(k, ps + (i + 8) * e, v);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(u, u));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(v, v));
        }
        float sum = hsum_pairs(_mm256_add_ps(a0, a1));
        for (; i < n; i++) {
            st1(k, ps + i * e, ld1(k, px + i * e) + ld1(k, pr + i * e));
            float t = ld1(k, ps + i * e);
            sum += t * t;
        }
        acc += sum;
    }
    return acc;
}

static float add_sum_sq_f32(int64_t h, int64_t chunk, const char *x, const char *r, char *s) {
    return add_sum_sq_k(K_F32, h, chunk, x, r, s);
}
static float add_sum_sq_bf16(int64_t h, int64_t chunk, const char *x, const char *r, char *s) {
    return add_sum_sq_k(K_BF16, h, chunk, x, r, s);
}
static float add_sum_sq_f16(int64_t h, int64_t chunk, const char *x, const char *r, char *s) {
    return add_sum_sq_k(K_F16, h, chunk, x, r, s);
}

static void rms_scale_f32(int64_t h, const char *x, char *y, const float *w, bool round_first, float rstd) {
    rms_span(K_F32, 0, h, x, y, w, _mm256_set1_ps(rstd), round_first);
}
static void rms_scale_bf16(int64_t h, const char *x, char *y, const float *w, bool round_first, float rstd) {
    rms_span(K_BF16, 0, h, x, y, w, _mm256_set1_ps(rstd), round_first);
}
static void rms_scale_f16(int64_t h, const char *x, char *y, const float *w, bool round_first, float rstd) {
    rms_span(K_F16, 0, h, x, y, w, _mm256_set1_ps(rstd), round_first);
}

static void rms_rows_f32(int64_t rows, int64_t h, int64_t chunk, const char *x, int64_t xs, char *y, int64_t ys,
                         const float *w, bool round_first, float eps) {
    rms_rows_k(K_F32, rows, h, chunk, x, xs, y, ys, w, round_first, eps);
}
static void rms_rows_bf16(int64_t rows, int64_t h, int64_t chunk, const char *x, int64_t xs, char *y, int64_t ys,
                          const float *w, bool round_first, float eps) {
    rms_rows_k(K_BF16, rows, h, chunk, x, xs, y, ys, w, round_first, eps);
}
static void rms_rows_f16(int64_t rows, int64_t h, int64_t chunk, const char *x, int64_t xs, char *y, int64_t ys,
                         const float *w, bool round_first, float eps) {
    rms_rows_k(K_F16, rows, h, chunk, x, xs, y, ys, w, round_first, eps);
}

bool hr_nn_avx512(void) { return hr_cpu_isa_get() >= HR_ISA_AVX512 && hr_cpu_features_get()->avx512_bf16; }

void hr_nn_rope_rows(hr_dtype dt, bool avx512, int64_t rows, int64_t half, const char *x, int64_t xs,
                     const char *cos, int64_t cs, const char *sin, int64_t ss, char *y, int64_t ys) {
    if (dt == HR_BF16 && avx512) rope_rows_bf16_avx512(rows, half, x, xs, cos, cs, sin, ss, y, ys);
    else if (dt == HR_F32) rope_rows_f32(rows, half, x, xs, cos, cs, sin, ss, y, ys);
    else if (dt == HR_BF16) rope_rows_bf16(rows, half, x, xs, cos, cs, sin, ss, y, ys);
    else rope_rows_f16(rows, half, x, xs, cos, cs, sin, ss, y, ys);
}

void hr_nn_rms_rows(hr_dtype dt, bool avx512, int64_t rows, int64_t h, int64_t chunk, const char *x, int64_t xs,
                    char *y, int64_t ys, const float *w, bool round_first, float eps) {
    if (dt == HR_BF16 && avx512) rms_rows_bf16_avx512(rows, h, chunk, x, xs, y, ys, w, round_first, eps);
    else if (dt == HR_F32) rms_rows_f32(rows, h, chunk, x, xs, y, ys, w, round_first, eps);
    else if (dt == HR_BF16) rms_rows_bf16(rows, h, chunk, x, xs, y, ys, w, round_first, eps);
    else rms_rows_f16(rows, h, chunk, x, xs, y, ys, w, round_first, eps);
}

float hr_nn_add_sum_sq_row(hr_dtype dt, int64_t h, int64_t chunk, const char *x, const char *r, char *s) {
    if (dt == HR_F32) return add_sum_sq_f32(h, chunk, x, r, s);
    if (dt == HR_BF16) return add_sum_sq_bf16(h, chunk, x, r, s);
    return add_sum_sq_f16(h, chunk, x, r, s);
}

void hr_nn_rms_scale_row(hr_dtype dt, bool avx512, int64_t h, const char *x, char *y, const float *w,
                         bool round_first, float rstd) {
    if (dt == HR_BF16 && avx512) rms_scale_bf16_avx512(h, x, y, w, round_first, rstd);
    else if (dt == HR_F32) rms_scale_f32(h, x, y, w, round_first, rstd);
    else if (dt == HR_BF16) rms_scale_bf16(h, x, y, w, round_first, rstd);
    else rms_scale_f16(h, x, y, w, round_first, rstd);
}

#endif
