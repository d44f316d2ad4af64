/* f32 rows into ggml's 32-element block types, as ggml's
 * quantize_row_*_ref computes them (and gguf-py's numpy quantizers, which
 * match them bit for bit): the scale from the block's extreme values, one
 * reciprocal, then each value rounded as the reference rounds it (Q8_0
 * half away from zero; the 4- and 5-bit types truncate x / d plus an
 * offset of half a step). The scales are stored as f16, rounded to nearest
 * even. */
#include <math.h>
#include <string.h>

#include "core/dequant.h"
#include "core/half.h"

/* The first value of largest magnitude (its sign kept). */
static float signed_max(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void min_max(const float *x, float *lo, float *hi) {
    *lo = x[0], *hi = x[0];
    for (int j = 1; j < 32; j++) {
        if (x[j] < *lo) *lo = x[j];
        if (x[j] > *hi) *hi = x[j];
    }
}

/* (int8_t)t then at most top, as the reference converts, for the t >= 0 it
 * sees; defined (0 or top) for NaN and infinities too. */
static inline int trunc_q(float t, int top) {
    if (!(t > 0.0f)) return 0;
    return t >= (float)top ? top : (int)t;
}

static void q8_0(const float *x, uint8_t *y) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    hr_f16_store(y, d);
    for (int j = 0; j < 32; j++) {
        float r = roundf(x[j] * id); /* within +-127 for finite x */
        y[2 + j] = (uint8_t)(int8_t)(r == r && fabsf(r) <= 127.0f ? (int)r : 0);
    }
}

/* Q4_0 / Q5_0: d = the signed maximum / -8 (-16), q = trunc(x / d + 8.5)
 * (16.5), at most 15 (31). */
static void q_0(const float *x, uint8_t *y, bool five) {
    float max = signed_max(x), d = max / (five ? -16.0f : -8.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
    float off = five ? 16.5f : 8.5f;
    int top = five ? 31 : 15;
    hr_f16_store(y, d);
    uint8_t *qs = y + (five ? 6 : 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int a = trunc_q(x[j] * id + off, top), b = trunc_q(x[16 + j] * id + off, top);
        qs[j] = (uint8_t)((a & 0xF) | (b & 0xF) << 4);
        qh |= (uint32_t)(a >> 4 & 1) << j | (uint32_t)(b >> 4 & 1) << (j + 16);
    }
    if (five) memcpy(y + 2, &qh, 4);
}

/* Q4_1 / Q5_1: d = (max - min) / 15 (31), m = min, q = trunc((x - min) / d
 * + 0.5), at most 15 (31). */
static void q_1(const float *x, uint8_t *y, bool five) {
    float lo, hi;
    min_max(x, &lo, &hi);
    float d = (hi - lo) / (five ? 31.0f : 15.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
    int top = five ? 31 : 15;
    hr_f16_store(y, d);
    hr_f16_store(y + 2, lo);
    uint8_t *qs = y + (five ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int a = trunc_q((x[j] - lo) * id + 0.5f, top), b = trunc_q((x[16 + j] - lo) * id + 0.5f, top);
        qs[j] = (uint8_t)((a & 0xF) | (b & 0xF) << 4);
        qh |= (uint32_t)(a >> 4 & 1) << j | (uint32_t)(b >> 4 & 1) << (j + 16);
    }
    if (five) memcpy(y + 4, &qh, 4);
}

/* MXFP4: the exponent byte floor(log2(amax)) - 2 + 127 (converted through
 * a 32-bit int, as the reference's float-to-byte conversion runs on x86;
 * 0 for an all-zero or non-finite block), then each value the level whose
 * multiple of the half scale is nearest (the first on ties). */
static void mxfp4(const float *x, uint8_t *y) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]);
    float t = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0.0f;
    uint8_t e = isfinite(t) ? (uint8_t)(int32_t)t : 0;
    float d = hr_e8m0_half(e);
    y[0] = e;
    for (int j = 0; j < 32; j++) {
        int best = 0;
        float best_err = fabsf(hr_mxfp4_levels[0] * d - x[j]);
        for (int i = 1; i < 16; i++) {
            float err = fabsf(hr_mxfp4_levels[i] * d - x[j]);
            if (err < best_err) best = i, best_err = err;
        }
        if (j < 16) y[1 + j] = (uint8_t)best;
        else y[1 + j - 16] |= (uint8_t)(best << 4);
    }
}

bool hr_quantize_supported(hr_dtype dt) {
    return dt == HR_Q8_0 || dt == HR_Q4_0 || dt == HR_Q4_1 || dt == HR_Q5_0 || dt == HR_Q5_1 || dt == HR_MXFP4 ||
           dt == HR_Q4_K || dt == HR_Q5_K || dt == HR_Q6_K;
}

void hr_encode_row(hr_dtype dt, const float *x, uint8_t *y, int64_t n) {
    if (dt == HR_F32) memcpy(y, x, sizeof(float) * (size_t)n);
    else if (dt == HR_BF16)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = hr_f32_to_bf16(x[i]);
            memcpy(y + 2 * i, &h, 2);
        }
    else if (dt == HR_F16)
        for (int64_t i = 0; i < n; i++) hr_f16_store(y + 2 * i, x[i]);
    else hr_quantize_row(dt, x, y, n);
}

void hr_quantize_row(hr_dtype dt, const float *x, uint8_t *y, int64_t n) {
    if (hr_dtype_block(dt) == 256) {
        hr_quantize_kquant(dt, x, y, n / 256);
        return;
    }
    size_t bb = hr_dtype_nbytes(dt, 32);
    for (int64_t b = 0; b < n / 32; b++, x += 32, y += bb) {
        switch (dt) {
        case HR_Q8_0: q8_0(x, y); break;
        case HR_Q4_0: q_0(x, y, false); break;
        case HR_Q5_0: q_0(x, y, true); break;
        case HR_Q4_1: q_1(x, y, false); break;
        case HR_Q5_1: q_1(x, y, true); break;
        case HR_MXFP4: mxfp4(x, y); break;
        default: memset(y, 0, bb); break;
        }
    }
}
