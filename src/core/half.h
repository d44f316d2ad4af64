/* bf16 and f16 <-> f32 conversions (scalar; SIMD kernels have their own). */
#ifndef HR_CORE_HALF_H
#define HR_CORE_HALF_H

#include <stdint.h>
#include <string.h>

static inline float hr_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t hr_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE binary16 by bit manipulation: portable, and clang 14 lacks x86
 * _Float16. Hot loops use F16C instead. */
static inline float hr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float8_e4m3fn (torch's, the Hub's FP8 weights): 1 sign, 4 exponent
 * bits biased by 7, 3 mantissa bits, no infinities; 0x7f and 0xff are NaN.
 * Its bits shifted up by 7 are the binary16 of the value / 256 (subnormals
 * too), which is how the SIMD kernels convert it (F16C, then x 256). */
static inline float hr_e4m3_to_f32(uint8_t b) {
    if ((b & 0x7f) == 0x7f) return __builtin_nanf("");
    float v = hr_f16_to_f32((uint16_t)((b & 0x7f) << 7)) * 256.0f;
    return b & 0x80 ? -v : v;
}

/* An f16 stored at any byte address (ggml blocks put them unaligned). */
static inline float hr_f16_load(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return hr_f16_to_f32(h);
}

/* v as binary16 (round to nearest even) at p, which need not be aligned. */
static inline void hr_f16_store(void *p, float v);

/* Round to nearest even. */
static inline uint16_t hr_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (a < 0x38800000u) { /* result is subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - (a >> 23); /* 14..24: units of 2^-24 */
        uint32_t r = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((a >> 13) - (112u << 10));
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

static inline void hr_f16_store(void *p, float v) {
    uint16_t h = hr_f32_to_f16(v);
    memcpy(p, &h, sizeof h);
}

#endif
