/* f32 rows into ggml's k-quant super-blocks (256 elements) as ggml's
 * quantize_row_{q4,q5,q6}_K_ref computes them without an importance
 * matrix, so that a file hubrt writes holds the blocks llama-quantize
 * would write for the same values:
 *
 * - Q4_K / Q5_K: each 32-element group gets a scale and a min from a
 *   weighted least-squares search over candidate step counts (weights
 *   rms(group) + |x|); the eight scales and mins are then quantized to 6
 *   bits against the super-block's largest, and the values requantized
 *   with the stored (f16 x 6-bit) scales.
 * - Q6_K: each 16-element group gets a symmetric scale from a search over
 *   19 candidate steps (weights x^2); the scales go to int8 against the
 *   largest, then the values to 6 bits.
 *
 * The arithmetic (float, in the reference's order; the build has no FP
 * contraction) and the rounding (nearest_int: round half to even through
 * the 1.5 * 2^23 trick) are the reference's, so the bytes agree exactly;
 * tests/python/test_quantize_ref.py checks them against ggml itself. */
#include <math.h>
#include <string.h>

#include "core/dequant.h"
#include "core/half.h"

#define QK_K 256

/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves
 * the integer in the low mantissa bits. Defined (garbage in range) for any
 * other float, as the reference's. */
static inline int nearest_int(float v) {
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Levels 0..nmax for one group x[n] as scale * l - min, chosen to minimise
 * the weighted squared error over nstep + 1 candidate step counts (nmax +
 * rmin + rdelta * is); the min is at most 0 (stored as its negation). */
static float qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, float rmin,
                  float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        best += w[i] * (diff * diff);
    }
    uint8_t aux[32];
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            aux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * aux[i] + this_min - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best) {
            memcpy(L, aux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *neg_min = -min;
    return scale;
}

/* Q4_K (nmax 15) and Q5_K (31): f16 d, f16 dmin, 12 bytes of 6-bit scales
 * and mins, [Q5_K: 32 bytes of fifth bits], 128 bytes of nibbles. */
static void q45_k(const float *x, uint8_t *y, bool five) {
    const int nmax = five ? 31 : 15;
    uint8_t L[QK_K], *sc = y + 4;
    float scales[8], mins[8], w[32], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *g = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += g[l] * g[l];
        float av = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av + fabsf(g[l]);
        scales[j] = five ? qkx2(32, 31, g, w, L + 32 * j, &mins[j], -0.5f, 0.1f, 15)
                         : qkx2(32, 15, g, w, L + 32 * j, &mins[j], -1.0f, 0.1f, 20);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        /* the reference stores the rounded int in a byte, then caps it */
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]), lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = ls > 63 ? 63 : ls;
        lm = lm > 63 ? 63 : lm;
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    hr_f16_store(y, max_scale / 63.f);
    hr_f16_store(y + 2, max_min / 63.f);
    float d0 = hr_f16_load(y), m0 = hr_f16_load(y + 2);
    for (int j = 0; j < 8; j++) {
        int s, m;
        hr_k4_scale_min(j, sc, &s, &m);
        const float d = d0 * s;
        if (!d) continue; /* the group keeps its search's levels */
        const float dm = m0 * m;
        for (int i = 0; i < 32; i++) L[32 * j + i] = (uint8_t)clampi(nearest_int((x[32 * j + i] + dm) / d), 0, nmax);
    }
    uint8_t *qh = y + 16, *qs = y + (five ? 48 : 16);
    if (five) memset(qh, 0, 32);
    for (int n = 0, pair = 0; n < QK_K; n += 64, pair++, qs += 32)
        for (int l = 0; l < 32; l++) {
            int lo = L[n + l], hi = L[n + l + 32];
            if (five) {
                qh[l] |= (uint8_t)((lo >> 4) << (2 * pair) | (hi >> 4) << (2 * pair + 1));
                lo &= 15;
                hi &= 15;
            }
            qs[l] = (uint8_t)(lo | hi << 4);
        }
}

/* A symmetric scale for one 16-element group at levels -32..31 (weights
 * x^2): the reference's make_qx_quants with rmse_type 1, nmax 32. */
static float qx(const float *x, int8_t *L) {
    const int n = 16, nmax = 32;
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q6_K: ql[128] (low nibbles), qh[64] (two high bits each), int8
 * scales[16], f16 d; 210 bytes. */
static void q6_k(const float *x, uint8_t *y) {
    int8_t L[QK_K];
    float scales[16], max_scale = 0, max_abs = 0;
    for (int ib = 0; ib < 16; ib++) {
        scales[ib] = qx(x + 16 * ib, L + 16 * ib);
        if (fabsf(scales[ib]) > max_abs) {
            max_abs = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    memset(y, 0, 210);
    if (max_abs < 1e-15f) return; /* all zero: d = +0 */
    int8_t *sc = (int8_t *)(y + 192);
    float iscale = -128.f / max_scale;
    hr_f16_store(y + 208, 1 / iscale);
    float d0 = hr_f16_load(y + 208);
    for (int ib = 0; ib < 16; ib++) {
        int v = nearest_int(iscale * scales[ib]);
        sc[ib] = (int8_t)(v > 127 ? 127 : v);
    }
    for (int j = 0; j < 16; j++) {
        float d = d0 * sc[j];
        if (!d) continue;
        for (int i = 0; i < 16; i++) L[16 * j + i] = (int8_t)(clampi(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
    }
    uint8_t *ql = y, *qh = y + 128;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
            ql[l] = (uint8_t)((q1 & 0xF) | (q3 & 0xF) << 4);
            ql[l + 32] = (uint8_t)((q2 & 0xF) | (q4 & 0xF) << 4);
            qh[l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
        }
}

void hr_quantize_kquant(hr_dtype dt, const float *x, uint8_t *y, int64_t nb) {
    size_t bb = hr_dtype_nbytes(dt, QK_K);
    for (int64_t b = 0; b < nb; b++, x += QK_K, y += bb) {
        if (dt == HR_Q4_K) q45_k(x, y, false);
        else if (dt == HR_Q5_K) q45_k(x, y, true);
        else if (dt == HR_Q6_K) q6_k(x, y);
        else memset(y, 0, bb);
    }
}
