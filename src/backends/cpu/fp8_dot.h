/* FP8 blocks (hr_dtype FP8: an f32 scale d, then 32 float8_e4m3fn codes)
 * as the CPU's linear reads them (k_linear_fp8.c). The AVX-512 kernels
 * turn a code into the binary16 of its value / 256 (core/half.h's
 * hr_e4m3_to_f32), widen it with F16C and multiply by 256 d: one rounding,
 * the f32 product code x d that the scalar dequantizer gives. */
#ifndef HR_BACKENDS_CPU_FP8_DOT_H
#define HR_BACKENDS_CPU_FP8_DOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hubrt/base.h"

/* Whether the CPU and HUBRT_CPU_ISA allow the AVX-512 kernels. */
bool hr_fp8_avx512_ok(void);
/* out[r * ors + j] = dot(weight row j, x row r) for nw weight rows of
 * blocks (w_rs bytes apart) and m f32 x rows (k apart), each block
 * decoded in registers once per 8 x rows. */
void hr_fp8_gemv_avx512(const uint8_t *w, size_t w_rs, int64_t k, int nw, const float *x, int m, float *out,
                        int64_t ors);
/* nw weight rows of blocks into rows of dt (f32, bf16 or f16; rounded to
 * nearest even) at out, k elements apart. */
void hr_fp8_dequant_avx512(const uint8_t *w, size_t w_rs, int64_t k, int nw, hr_dtype dt, void *out);

#endif
