/* Rows of any storage dtype to f32: block-quantized ones as ggml's
 * dequantize_row_* computes them (core/dequant.c); and f32 rows into the
 * 32-element block types as its quantize_row_*_ref does (core/quantize.c). */
#ifndef HR_CORE_DEQUANT_H
#define HR_CORE_DEQUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "hubrt/base.h"

/* n elements of dtype dt at src (f32, f16, bf16 or a block type; n a
 * multiple of the block) into f32; zeros for any other dtype. */
void hr_dequant_row(hr_dtype dt, const uint8_t *src, float *dst, int64_t n);

/* `nb` k-quant super-blocks (256 elements each) at src into f32
 * (dequant_kquant.c). */
void hr_dq_q2_k(const uint8_t *src, float *dst, int64_t nb);
void hr_dq_q3_k(const uint8_t *src, float *dst, int64_t nb);
void hr_dq_q4_k(const uint8_t *src, float *dst, int64_t nb);
void hr_dq_q5_k(const uint8_t *src, float *dst, int64_t nb);
void hr_dq_q6_k(const uint8_t *src, float *dst, int64_t nb);
/* `nb` IQ4_NL blocks (32 elements) or IQ4_XS super-blocks (256) at src into
 * f32 (dequant_iquant.c). */
void hr_dq_iq4_nl(const uint8_t *src, float *dst, int64_t nb);
void hr_dq_iq4_xs(const uint8_t *src, float *dst, int64_t nb);
/* `nb` MXFP4 blocks (32 elements, an e8m0 scale) into f32, and the scale of
 * exponent byte e (2^(e - 128), ggml's GGML_E8M0_TO_FP32_HALF). */
void hr_dq_mxfp4(const uint8_t *src, float *dst, int64_t nb);
/* MXFP4's 16 codes as values doubled (e2m1 x 2: 0, 1, 2, 3, 4, 6, 8, 12 and
 * their negatives). */
extern const int8_t hr_mxfp4_levels[16];
float hr_e8m0_half(uint8_t e);

/* Scale and min j (< 8) of a Q4_K/Q5_K super-block: 6 bits each, packed
 * in its 12 scale bytes (ggml's get_scale_min_k4). */
static inline void hr_k4_scale_min(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Whether hr_quantize_row makes dt: q8_0, q4_0, q4_1, q5_0, q5_1, mxfp4
 * (32-element blocks) and q4_k, q5_k, q6_k (256-element super-blocks). */
bool hr_quantize_supported(hr_dtype dt);
/* n f32 values (a multiple of dt's block) into blocks of dt at dst, the
 * bytes ggml's quantize_row_*_ref writes. */
void hr_quantize_row(hr_dtype dt, const float *src, uint8_t *dst, int64_t n);
/* n f32 values into dtype dt at dst, the inverse of hr_dequant_row: f32
 * copied, bf16 and f16 rounded to nearest even, a block type as
 * hr_quantize_row makes it (n a multiple of its block). */
void hr_encode_row(hr_dtype dt, const float *src, uint8_t *dst, int64_t n);
/* nb k-quant super-blocks (q4_k, q5_k, q6_k) from nb * 256 values
 * (quantize_kquant.c). */
void hr_quantize_kquant(hr_dtype dt, const float *src, uint8_t *dst, int64_t nb);

#endif
