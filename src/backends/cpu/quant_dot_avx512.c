/* AVX-512 VNNI dot products of unpacked weight rows (quant_rows.h) with
 * int8 activations: vpdpbusd sums four u8 x s8 products per int32 lane,
 * so lane l of a 64-byte step holds elements 4l..4l+3, all in run l / 4;
 * the lanes are scaled by their run's weight and activation scales in f32.
 * Four weight rows share each load of the activations. Chosen at run time
 * (hr_qdot_pick). */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "backends/cpu/quant_rows.h"
#include "core/dequant.h"

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
    static const uint8_t MXFP4_U[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
    uint32_t qh;
    *d = dt == HR_MXFP4 ? 0.0f : f16_at(p);
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
    case HR_MXFP4:
        *d = hr_e8m0_half(p[0]);
        *c = -12.0f * *d;
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MXFP4_U)),
                                   nibbles32(p + 1));
    default: /* HR_IQ4_NL */
        *c = -128.0f * *d;
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_U)),
                                   nibbles32(p + 2));
    }
}

/* out[j] = dot(weight row j, x) for nw weight rows: two blocks per
 * vpdpbusd (one per 256-bit half, each half scaled by its block's weight
 * and activation scales), two chains to hide its latency; the blocks'
 * constants gathered per CHUNK blocks and summed against x's block sums
 * xsb 16 at a time. */
#define CHUNK 64

/* The products of blocks b and b + 1 (at p, bb bytes apart), each half
 * scaled by its block's scales; their constants into cb. */
INLINE_ __m512 two_blocks(hr_dtype dt, size_t bb, const uint8_t *p, const int8_t *q, const float *xd, float *cb) {
    float d0, d1;
    __m256i u0 = block_u(dt, p, &d0, &cb[0]), u1 = block_u(dt, p + bb, &d1, &cb[1]);
    __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
    __m512 prod = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(q)));
    __m512 sc = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(d0 * xd[0])),
                                                    _mm256_castps_pd(_mm256_set1_ps(d1 * xd[2])), 1));
    return _mm512_mul_ps(prod, sc);
}

INLINE_ void gemv_row(hr_dtype dt, size_t bb, const uint8_t *w, size_t w_rs, int64_t k, int nw, hr_qx x,
                      const float *xsb, float *out) {
    int64_t nb = k / 32;
    float cb[CHUNK];
    for (int j = 0; j < nw; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), cacc = _mm512_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
            int n = nb - b0 < CHUNK ? (int)(nb - b0) : CHUNK, b = 0;
            const int8_t *q = x.q + 32 * b0;
            const float *xd = x.xd + 2 * b0;
            /* two chains of two blocks each hide the FMA latency */
            for (; b + 4 <= n; b += 4, p += 4 * bb) {
                acc0 = _mm512_add_ps(acc0, two_blocks(dt, bb, p, q + 32 * b, xd + 2 * b, cb + b));
                acc1 = _mm512_add_ps(acc1, two_blocks(dt, bb, p + 2 * bb, q + 32 * b + 64, xd + 2 * b + 4, cb + b + 2));
            }
            if (b + 2 <= n) {
                acc0 = _mm512_add_ps(acc0, two_blocks(dt, bb, p, q + 32 * b, xd + 2 * b, cb + b));
                b += 2, p += 2 * bb;
            }
            if (b < n) {
                float d0;
                __m256i u0 = block_u(dt, p, &d0, &cb[b]);
                p += bb;
                __m256 prod = _mm256_cvtepi32_ps(
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, _mm256_loadu_si256((const __m256i *)(q + 32 * b))));
                acc1 = _mm512_add_ps(acc1, _mm512_zextps256_ps512(_mm256_mul_ps(prod, _mm256_set1_ps(d0 * xd[2 * b]))));
            }
            for (int i = 0; i < n; i += 16) {
                __mmask16 m = (__mmask16)(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1u);
                cacc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, cb + i), _mm512_maskz_loadu_ps(m, xsb + b0 + i), cacc);
            }
        }
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), cacc));
    }
}

/* ---- decode rows of the k-quants ------------------------------------------------------ */

/* out[j] = dot(row j, x) for Q4_K / Q5_K rows: each 64 elements are the
 * low nibbles of 32 bytes (sub-block 2c) then their high nibbles (2c + 1),
 * one vpdpbusd, each 256-bit half scaled by d * its 6-bit scale and x's
 * scale; the mins' part (-dmin * min x the sub-block's x sum) in f32. */
INLINE_ void gemv_row_q45k(bool five, const uint8_t *w, size_t w_rs, int64_t k, int nw, hr_qx x, const float *xsb,
                           float *out) {
    size_t bb = five ? 176 : 144;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int j = 0; j < nw; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        float cacc = 0.0f;
        for (int64_t e0 = 0; e0 < k; e0 += 256, p += bb) {
            float d = f16_at(p), dmin = f16_at(p + 2);
            const uint8_t *sc = p + 4, *ql = p + (five ? 48 : 16);
            __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                int s0, m0, s1, m1;
                hr_k4_scale_min(2 * c, sc, &s0, &m0);
                hr_k4_scale_min(2 * c + 1, sc, &s1, &m1);
                __m256i v = _mm256_loadu_si256((const __m256i *)(ql + 32 * c));
                __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                if (five) {
                    /* the fifth bit of sub-block 2c is bit 2c of qh[l], of 2c + 1 bit 2c + 1 */
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
                }
                int64_t b = (e0 + 64 * c) / 32; /* x's block of the first half */
                __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                __m512 prod = _mm512_cvtepi32_ps(
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(x.q + e0 + 64 * c)));
                __m512 scl = _mm512_castpd_ps(_mm512_insertf64x4(
                    _mm512_castps_pd(_mm512_set1_ps(d * (float)s0 * x.xd[2 * b])),
                    _mm256_castps_pd(_mm256_set1_ps(d * (float)s1 * x.xd[2 * b + 2])), 1));
                acc[c & 1] = _mm512_fmadd_ps(prod, scl, acc[c & 1]);
                cacc += -(dmin * (float)m0) * xsb[b] + -(dmin * (float)m1) * xsb[b + 1];
            }
        }
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + cacc;
    }
}

/* out[j] = dot(row j, x) for Q6_K rows: per 128 elements, four 32-element
 * quarters of 6-bit codes (low nibbles of ql[0..32), of ql[32..64), high
 * nibbles of each, with 2 bits of qh each), two to a vpdpbusd; lanes in
 * runs of 16 scaled by d * the run's int8 scale and x's scale; the codes'
 * offset of 32 (-32 d scale x the run's x sum) in f32, 4 runs at a time. */
INLINE_ void gemv_row_q6k(const uint8_t *w, size_t w_rs, int64_t k, int nw, hr_qx x, float *out) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
    for (int j = 0; j < nw; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        __m128 cacc = _mm_setzero_ps();
        for (int64_t e0 = 0; e0 < k; e0 += 256, p += 210) {
            float d = f16_at(p + 208);
            for (int n = 0; n < 2; n++) {
                const uint8_t *ql = p + 64 * n, *qh = p + 128 + 32 * n;
                const int8_t *sc = (const int8_t *)(p + 192) + 8 * n;
                __m256i v0 = _mm256_loadu_si256((const __m256i *)ql), v1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                __m256i h = _mm256_loadu_si256((const __m256i *)qh);
                __m256i q[4] = {
                    _mm256_or_si256(_mm256_and_si256(v0, lo4), _mm256_slli_epi16(_mm256_and_si256(h, two), 4)),
                    _mm256_or_si256(_mm256_and_si256(v1, lo4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), two), 4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), lo4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), two), 4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), lo4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), two), 4))};
                for (int half = 0; half < 2; half++) {
                    int64_t e = e0 + 128 * n + 64 * half, r = e / 16; /* first element and run */
                    __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(q[2 * half]), q[2 * half + 1], 1);
                    __m512 prod = _mm512_cvtepi32_ps(
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(x.q + e)));
                    int32_t s4;
                    memcpy(&s4, sc + 4 * half, 4);
                    __m128 ws = _mm_mul_ps(_mm_set1_ps(d), _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(s4))));
                    acc[half] = _mm512_fmadd_ps(prod, spread4(_mm_mul_ps(ws, _mm_loadu_ps(x.xd + r))), acc[half]);
                    cacc = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(-32.0f), ws), _mm_loadu_ps(x.xs + r), cacc);
                }
            }
        }
        __m128 c2 = _mm_add_ps(cacc, _mm_movehl_ps(cacc, cacc));
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + _mm_cvtss_f32(_mm_add_ss(c2, _mm_movehdup_ps(c2)));
    }
}

/* The 32-element types block_u reads; DISPATCH_Q32_ calls fn with dt as a
 * constant, so that each type gets its own copy of the inlined loop. */
#define Q32_TYPES_(X) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(IQ4_NL) X(MXFP4)
#define Q32_CASE_(T) case HR_##T: Q32_FN_(HR_##T); break;
#define DISPATCH_Q32_(dt) \
    switch (dt) { Q32_TYPES_(Q32_CASE_) default: break; }

bool hr_quant_tile_avx512_has(hr_dtype dt) {
    if (dt == HR_Q4_K || dt == HR_Q5_K) return true;
#define Q32_FN_(T) return true
    DISPATCH_Q32_(dt)
#undef Q32_FN_
    return false;
}

bool hr_qgemv_avx512_has(hr_dtype dt) { return hr_quant_tile_avx512_has(dt) || dt == HR_Q6_K; }

TARGET_ void hr_qgemv_avx512(hr_dtype dt, const uint8_t *w, size_t w_rs, int64_t k, int nw, hr_qx x,
                             const float *xsb, float *out) {
    size_t bb = hr_dtype_nbytes(dt, 32);
    if (dt == HR_Q4_K || dt == HR_Q5_K) return gemv_row_q45k(dt == HR_Q5_K, w, w_rs, k, nw, x, xsb, out);
    if (dt == HR_Q6_K) return gemv_row_q6k(w, w_rs, k, nw, x, out);
#define Q32_FN_(T) gemv_row(T, bb, w, w_rs, k, nw, x, xsb, out)
    DISPATCH_Q32_(dt)
#undef Q32_FN_
}

/* ---- prefill: blocks of 4 x rows by 4 weight rows ------------------------------------ */

/* out[r][j] = the scaled products of nr <= 4 x rows and nc <= 4 weight
 * rows in the interleaved layout (hr_quant_interleave): lane l of a 64-byte
 * step sums run l of the group, so four vpdpbusd per pair add up whole
 * 16-element runs in int32 (at most 16 x 255 x 127), and each group of up
 * to 16 runs costs the pair one conversion, one scale product and one FMA.
 * The int32 sums take 16 registers, the weights 4, x 1. The run constants
 * come after (hr_qgemm_avx512). */
INLINE_ void gemm_block(int nr, int nc, int64_t k, const uint8_t *u, const float *s, const int8_t *q,
                        const float *xd, float *out, int64_t ors) {
    __m512 acc[4][4];
    int64_t runs = k / HR_QSUB;
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < nc; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < runs; g += 16) {
        int n = runs - g < 16 ? (int)(runs - g) : 16;
        __mmask64 bytes = n == 16 ? ~(__mmask64)0 : (((__mmask64)1 << (4 * n)) - 1);
        __mmask16 lanes = (__mmask16)((1u << n) - 1u);
        int64_t base = g * HR_QSUB;
        __m512i sum[4][4];
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < nc; j++) sum[r][j] = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            int64_t off = base + t * 4 * n;
            __m512i w[4];
            for (int j = 0; j < nc; j++) w[j] = _mm512_maskz_loadu_epi8(bytes, u + j * k + off);
            for (int r = 0; r < nr; r++) {
                __m512i x = _mm512_maskz_loadu_epi8(bytes, q + r * k + off);
                for (int j = 0; j < nc; j++) sum[r][j] = _mm512_dpbusd_epi32(sum[r][j], w[j], x);
            }
        }
        for (int r = 0; r < nr; r++) {
            __m512 d = _mm512_maskz_loadu_ps(lanes, xd + r * runs + g);
            for (int j = 0; j < nc; j++) {
                __m512 sc = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, s + j * runs + g), d);
                acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][j]), sc, acc[r][j]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < nc; j++) out[r * ors + j] = _mm512_reduce_add_ps(acc[r][j]);
}

TARGET_ void hr_qgemm_avx512(int64_t k, int nw, const uint8_t *u, const float *s, const float *ct, int m,
                             const int8_t *q, const float *xd, const float *xs, float *out, int64_t ors) {
    int64_t runs = k / HR_QSUB;
    for (int r = 0; r < m; r += 4) {
        int nr = m - r < 4 ? m - r : 4;
        for (int j = 0; j < nw; j += 4) {
            int nc = nw - j < 4 ? nw - j : 4;
            const uint8_t *uj = u + j * k;
            const float *sj = s + j * runs, *dr = xd + r * runs;
            const int8_t *qr = q + r * k;
            float *o = out + r * ors + j;
            if (nr == 4 && nc == 4) gemm_block(4, 4, k, uj, sj, qr, dr, o, ors);
            else gemm_block(nr, nc, k, uj, sj, qr, dr, o, ors);
        }
    }
    /* the run constants: sum over runs of xs[r][run] * c[run][j], 16 weight
     * rows to a register */
    __mmask16 cols = (__mmask16)(nw >= 16 ? 0xFFFF : (1u << nw) - 1u);
    for (int r = 0; r < m; r++) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t t = 0; t < runs; t++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(xs[r * runs + t]), _mm512_maskz_loadu_ps(cols, ct + t * 16), acc);
        _mm512_mask_storeu_ps(out + r * ors, cols, _mm512_add_ps(_mm512_maskz_loadu_ps(cols, out + r * ors), acc));
    }
}

/* ---- 32-element blocks straight into the interleaved tile ---------------------------- */

/* Block p's two runs of 16 bytes (u = value - c / s as in block_u). */
INLINE_ void block_runs(hr_dtype dt, const uint8_t *p, __m128i *r0, __m128i *r1, float *d, float *c) {
    __m256i u = block_u(dt, p, d, c);
    *r0 = _mm256_castsi256_si128(u);
    *r1 = _mm256_extracti128_si256(u, 1);
}

/* Runs l and l + 1 (16 bytes each) of a group of n into the interleaved
 * layout at o: step t holds elements 4t..4t+3 of run l, then of run l + 1. */
INLINE_ void store_pair(uint8_t *o, int n, int l, __m128i r0, __m128i r1) {
    __m128i lo = _mm_unpacklo_epi32(r0, r1), hi = _mm_unpackhi_epi32(r0, r1);
    _mm_storel_epi64((__m128i *)(o + 4 * l), lo);
    _mm_storeh_pd((double *)(o + 4 * n + 4 * l), _mm_castsi128_pd(lo));
    _mm_storel_epi64((__m128i *)(o + 8 * n + 4 * l), hi);
    _mm_storeh_pd((double *)(o + 12 * n + 4 * l), _mm_castsi128_pd(hi));
}

INLINE_ void tile_rows(hr_dtype dt, size_t bb, const uint8_t *w, size_t w_rs, int64_t k, int nt, uint8_t *ui, float *s,
                       float *ct, int ct_stride) {
    int64_t runs = k / HR_QSUB;
    for (int j = 0; j < nt; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        uint8_t *o = ui + (size_t)j * (size_t)k;
        for (int64_t g = 0; g < runs; g += 16, o += 16 * 16) {
            int n = runs - g < 16 ? (int)(runs - g) : 16;
            /* a group's runs come in pairs, one block each (n is even) */
            for (int l = 0; l < n; l += 2, p += bb) {
                __m128i r0, r1;
                float d, c;
                block_runs(dt, p, &r0, &r1, &d, &c);
                store_pair(o, n, l, r0, r1);
                int64_t run = g + l;
                s[j * runs + run] = s[j * runs + run + 1] = d;
                ct[run * ct_stride + j] = ct[(run + 1) * ct_stride + j] = c;
            }
        }
    }
}

/* Q4_K / Q5_K rows into the tile: a super-block is one group of 16 runs,
 * sub-block 2c (the low nibbles of ql[32c..32c + 32)) its runs 4c and 4c
 * + 1, sub-block 2c + 1 (the high nibbles) runs 4c + 2 and 4c + 3. */
INLINE_ void tile_rows_q45k(bool five, const uint8_t *w, size_t w_rs, int64_t k, int nt, uint8_t *ui, float *s,
                            float *ct, int ct_stride) {
    size_t bb = five ? 176 : 144;
    int64_t runs = k / HR_QSUB;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int j = 0; j < nt; j++) {
        const uint8_t *p = w + (size_t)j * w_rs;
        uint8_t *o = ui + (size_t)j * (size_t)k;
        for (int64_t g = 0; g < runs; g += 16, o += 256, p += bb) {
            float d = f16_at(p), dmin = f16_at(p + 2);
            const uint8_t *sc = p + 4, *ql = p + (five ? 48 : 16);
            __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(ql + 32 * c));
                __m256i sub[2] = {_mm256_and_si256(v, lo4), _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4)};
                for (int h = 0; h < 2; h++) {
                    if (five)
                        sub[h] = _mm256_or_si256(
                            sub[h], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + h), one), 4));
                    int sv, mv, l = 4 * c + 2 * h;
                    hr_k4_scale_min(2 * c + h, sc, &sv, &mv);
                    store_pair(o, 16, l, _mm256_castsi256_si128(sub[h]), _mm256_extracti128_si256(sub[h], 1));
                    int64_t run = g + l;
                    s[j * runs + run] = s[j * runs + run + 1] = d * (float)sv;
                    ct[run * ct_stride + j] = ct[(run + 1) * ct_stride + j] = -(dmin * (float)mv);
                }
            }
        }
    }
}

TARGET_ void hr_quant_tile_avx512(hr_dtype dt, const uint8_t *w, size_t w_rs, int64_t k, int nt, uint8_t *ui,
                                  float *s, float *ct, int ct_stride) {
    size_t bb = hr_dtype_nbytes(dt, 32);
    if (dt == HR_Q4_K || dt == HR_Q5_K) return tile_rows_q45k(dt == HR_Q5_K, w, w_rs, k, nt, ui, s, ct, ct_stride);
#define Q32_FN_(T) tile_rows(T, bb, w, w_rs, k, nt, ui, s, ct, ct_stride)
    DISPATCH_Q32_(dt)
#undef Q32_FN_
}
