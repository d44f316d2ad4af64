/* Block-quantized rows (hr_dtype's HR_QTYPE_LIST, ggml's formats) to f32,
 * in the order and arithmetic of ggml's dequantize_row_*: the GGUF loader
 * dequantizes with these, and kernels that read a block-quantized tensor's
 * rows as values (an embedding lookup) do too, so both give the same bits.
 * The legacy 32-element blocks are here; the k-quants in dequant_kquant.c,
 * the 4-bit non-linear ones in dequant_iquant.c. */
#include <string.h>

#include "core/dequant.h"
#include "core/half.h"

/* Q8_0 block: f16 scale d, 32 x int8 q; x = q * d. */
static void dq_q8_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 34, dst += 32) {
        float d = hr_f16_load(src);
        const int8_t *q = (const int8_t *)(src + 2);
        for (int i = 0; i < 32; i++) dst[i] = (float)q[i] * d;
    }
}

/* Q4_0 block: f16 d, 16 bytes; element i < 16 is the low nibble of byte i,
 * element 16 + i its high nibble; x = (q - 8) * d. */
static void dq_q4_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 18, dst += 32) {
        float d = hr_f16_load(src);
        const uint8_t *q = src + 2;
        for (int i = 0; i < 16; i++) {
            dst[i] = (float)((q[i] & 0x0F) - 8) * d;
            dst[i + 16] = (float)((q[i] >> 4) - 8) * d;
        }
    }
}

/* Q4_1 block: f16 d, f16 m, 16 bytes of nibbles as Q4_0; x = q * d + m. */
static void dq_q4_1(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 20, dst += 32) {
        float d = hr_f16_load(src), m = hr_f16_load(src + 2);
        const uint8_t *q = src + 4;
        for (int i = 0; i < 16; i++) {
            dst[i] = (float)(q[i] & 0x0F) * d + m;
            dst[i + 16] = (float)(q[i] >> 4) * d + m;
        }
    }
}

/* Q5_0 block: f16 d, u32 qh (the fifth bits), 16 bytes of nibbles as
 * Q4_0; element i < 16 takes bit i of qh, element 16 + i bit 16 + i; x =
 * (q - 16) * d. Q5_1: f16 d, f16 m first; x = q * d + m. */
static void dq_q5(const uint8_t *src, float *dst, int64_t nb, bool one) {
    size_t head = one ? 4 : 2;
    for (int64_t b = 0; b < nb; b++, src += head + 20, dst += 32) {
        float d = hr_f16_load(src), m = one ? hr_f16_load(src + 2) : 0.0f;
        uint32_t qh;
        memcpy(&qh, src + head, 4);
        const uint8_t *q = src + head + 4;
        for (int i = 0; i < 16; i++) {
            int x0 = (q[i] & 0x0F) | (int)((qh >> i) << 4 & 0x10), x1 = (q[i] >> 4) | (int)((qh >> (i + 12)) & 0x10);
            dst[i] = one ? (float)x0 * d + m : (float)(x0 - 16) * d;
            dst[i + 16] = one ? (float)x1 * d + m : (float)(x1 - 16) * d;
        }
    }
}

/* FP8 blocks: an f32 scale, then 32 e4m3 codes; each value is code x
 * scale, one f32 product (as transformers' Fp8Dequantize computes it). */
static void dq_fp8(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 36, y += 32) {
        float d;
        memcpy(&d, p, 4);
        for (int i = 0; i < 32; i++) y[i] = hr_e4m3_to_f32(p[4 + i]) * d;
    }
}

void hr_dequant_row(hr_dtype dt, const uint8_t *src, float *dst, int64_t n) {
    switch (dt) {
    case HR_F32: memcpy(dst, src, sizeof(float) * (size_t)n); break;
    case HR_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = hr_f16_load(src + 2 * i);
        break;
    case HR_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = hr_bf16_to_f32(h);
        }
        break;
    case HR_Q8_0: dq_q8_0(src, dst, n / 32); break;
    case HR_Q4_0: dq_q4_0(src, dst, n / 32); break;
    case HR_Q4_1: dq_q4_1(src, dst, n / 32); break;
    case HR_Q5_0: dq_q5(src, dst, n / 32, false); break;
    case HR_Q5_1: dq_q5(src, dst, n / 32, true); break;
    case HR_Q2_K: hr_dq_q2_k(src, dst, n / 256); break;
    case HR_Q3_K: hr_dq_q3_k(src, dst, n / 256); break;
    case HR_Q4_K: hr_dq_q4_k(src, dst, n / 256); break;
    case HR_Q5_K: hr_dq_q5_k(src, dst, n / 256); break;
    case HR_Q6_K: hr_dq_q6_k(src, dst, n / 256); break;
    case HR_IQ4_NL: hr_dq_iq4_nl(src, dst, n / 32); break;
    case HR_IQ4_XS: hr_dq_iq4_xs(src, dst, n / 256); break;
    case HR_MXFP4: hr_dq_mxfp4(src, dst, n / 32); break;
    case HR_FP8: dq_fp8(src, dst, n / 32); break;
    case HR_F8_E4M3:
        for (int64_t i = 0; i < n; i++) dst[i] = hr_e4m3_to_f32(src[i]);
        break;
    default: memset(dst, 0, sizeof(float) * (size_t)n); break;
    }
}
