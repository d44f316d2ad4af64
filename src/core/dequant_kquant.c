/* ggml's k-quant blocks (super-blocks of 256 elements, ggml-common.h) to
 * f32, in the order and arithmetic of ggml's dequantize_row_* (each
 * element's value is d * scale * q - dmin * min in f32, as there). These
 * are the types of the common "Q4_K_M"-style files: Q4_K and Q6_K, with
 * Q2_K, Q3_K and Q5_K in the other mixes. */
#include "core/half.h"
#include "core/dequant.h"

#define QK_K 256

/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64] (2 bits),
 * f16 d, f16 dmin; 84 bytes. */
void hr_dq_q2_k(const uint8_t *src, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 84) {
        const uint8_t *sc = src, *q = src + 16;
        float d = hr_f16_load(src + 80), min = hr_f16_load(src + 82);
        int is = 0;
        for (int n = 0; n < QK_K; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++) {
                    uint8_t s = sc[is++];
                    float dl = d * (float)(s & 0xF), ml = min * (float)(s >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                }
    }
}

/* Q3_K: hmask[32] (the third bit, set: no -4), qs[64] (2 bits), scales[12]
 * (sixteen 6-bit scales, 32 subtracted), f16 d; 110 bytes. */
void hr_dq_q3_k(const uint8_t *src, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 110) {
        const uint8_t *hm = src, *q = src + 32, *raw = src + 96;
        float d = hr_f16_load(src + 108);
        /* scale j: low 4 bits from byte j % 8 (high nibble for j >= 8),
         * high 2 bits from byte 8 + j % 4, bits 2 * (j / 4) */
        int8_t scales[16];
        for (int j = 0; j < 16; j++) {
            int lo = j < 8 ? raw[j] & 0xF : raw[j - 8] >> 4, hi = (raw[8 + j % 4] >> (2 * (j / 4))) & 3;
            scales[j] = (int8_t)((lo | hi << 4) - 32);
        }
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int half = 0; half < 2; half++) {
                    float dl = d * (float)scales[is++];
                    for (int l = 0; l < 16; l++) {
                        int i = l + 16 * half;
                        *y++ = dl * (float)(((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4));
                    }
                }
    }
}

/* Q4_K (144 bytes: f16 d, f16 dmin, scales[12], qs[128]) and Q5_K (176:
 * the same with qh[32], the fifth bits, before qs). Each 64 elements are
 * the low nibbles of 32 bytes, then their high nibbles. */
static void dq_q45_k(const uint8_t *src, float *y, int64_t nb, bool five) {
    size_t bytes = five ? 176 : 144;
    for (int64_t b = 0; b < nb; b++, src += bytes) {
        float d = hr_f16_load(src), min = hr_f16_load(src + 2);
        const uint8_t *sc = src + 4, *qh = src + 16, *ql = src + (five ? 48 : 16);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            int s, m;
            hr_k4_scale_min(is, sc, &s, &m);
            float d1 = d * (float)s, m1 = min * (float)m;
            hr_k4_scale_min(is + 1, sc, &s, &m);
            float d2 = d * (float)s, m2 = min * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

void hr_dq_q4_k(const uint8_t *src, float *y, int64_t nb) { dq_q45_k(src, y, nb, false); }
void hr_dq_q5_k(const uint8_t *src, float *y, int64_t nb) { dq_q45_k(src, y, nb, true); }

/* Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16
 * d; 210 bytes. q = (low | high << 4) - 32. */
void hr_dq_q6_k(const uint8_t *src, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 210) {
        const uint8_t *ql = src, *qh = src + 128;
        const int8_t *sc = (const int8_t *)(src + 192);
        float d = hr_f16_load(src + 208);
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
                int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
                int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
    }
}
