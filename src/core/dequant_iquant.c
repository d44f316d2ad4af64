/* ggml's 4-bit non-linear blocks (ggml-common.h) to f32, in the order and
 * arithmetic of ggml's dequantize_row_iq4_nl / _iq4_xs: each 4-bit code
 * picks one of 16 int8 levels, spaced closer near zero where weights
 * cluster, times the block's scale. These are the "IQ4_NL" and "IQ4_XS"
 * files; the other i-quants index lattice grids of hundreds of entries and
 * are refused at parse time. */
#include <string.h>

#include "core/half.h"
#include "core/dequant.h"

/* kvalues_iq4nl (ggml-common.h) */
static const int8_t LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* 32 elements: low nibbles of qs[0..16) then high nibbles, times dl. */
static void nibbles32(const uint8_t *qs, float dl, float *y) {
    for (int j = 0; j < 16; j++) {
        y[j] = dl * (float)LEVELS[qs[j] & 0xF];
        y[j + 16] = dl * (float)LEVELS[qs[j] >> 4];
    }
}

/* IQ4_NL: f16 d, qs[16]; 18 bytes, 32 elements. */
void hr_dq_iq4_nl(const uint8_t *src, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 18, y += 32) nibbles32(src + 2, hr_f16_load(src), y);
}

/* IQ4_XS: f16 d, u16 scales_h (2 high bits of each sub-block's 6-bit
 * scale), scales_l[4] (low 4 bits, two per byte), qs[128]; 136 bytes,
 * 256 elements in 8 sub-blocks of 32, each scaled by d * (scale - 32). */
void hr_dq_iq4_xs(const uint8_t *src, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 136) {
        float d = hr_f16_load(src);
        unsigned scales_h = (unsigned)src[2] | (unsigned)src[3] << 8;
        const uint8_t *scales_l = src + 4, *qs = src + 8;
        for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
            int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (int)((scales_h >> 2 * ib) & 3) << 4;
            nibbles32(qs, d * (float)(ls - 32), y);
        }
    }
}

/* MXFP4 (OCP microscaling, the type llama.cpp keeps gpt-oss's experts in):
 * an e8m0 exponent byte e, then 16 bytes of e2m1 codes as IQ4_NL's nibbles;
 * the codes' values doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives)
 * times 2^(e - 128), as ggml's GGML_E8M0_TO_FP32_HALF builds it bitwise. */
const int8_t hr_mxfp4_levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float hr_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void hr_dq_mxfp4(const uint8_t *src, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 17, y += 32) {
        float d = hr_e8m0_half(src[0]);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)hr_mxfp4_levels[src[1 + j] & 0xF];
            y[j + 16] = d * (float)hr_mxfp4_levels[src[1 + j] >> 4];
        }
    }
}
