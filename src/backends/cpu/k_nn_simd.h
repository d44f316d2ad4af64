/* AVX2 (and AVX-512 bf16) row kernels of rope, rms_norm and add_rms_norm
 * for rows whose last dims are contiguous and share one float dtype
 * (k_nn_simd.c): the conversions, roundings and arithmetic stay in
 * registers, where the portable path of k_nn.c goes through f32 buffers.
 * Bit for bit that path: the same f32 operations in the same order,
 * rounded at the same points. */
#ifndef HR_BACKENDS_CPU_K_NN_SIMD_H
#define HR_BACKENDS_CPU_K_NN_SIMD_H

#include <stdbool.h>
#include <stdint.h>

#include "hubrt/base.h"

/* Compiled in where the baseline ISA has AVX2, FMA and F16C. The dtype of
 * every kernel here is f32, bf16 or f16. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HR_NN_SIMD 1

/* True when the AVX-512 bf16 rows may run: the CPU has avx512_bf16 and
 * HUBRT_CPU_ISA allows AVX-512. Read once per kernel call (the getter
 * locks). */
bool hr_nn_avx512(void);

/* rope on `rows` rows of 2 * half features (the rotary part): row r of x,
 * cos, sin, y starts at x + r * xs (strides in bytes), and so on; every
 * operand in dtype dt, which is also the dtype torch rounds the products
 * and sums to. y may be x. */
void hr_nn_rope_rows(hr_dtype dt, bool avx512, int64_t rows, int64_t half, const char *x, int64_t xs,
                     const char *cos, int64_t cs, const char *sin, int64_t ss, char *y, int64_t ys);

/* rms_norm of `rows` rows of h values, x and y in dtype dt (strides in
 * bytes between rows): y = x * rstd, rounded to dt first when round_first,
 * times w[i] when w (f32 [h], the weight plus its offset). The sum of
 * squares runs in k_nn.c's order (chunks of `chunk` values). With avx512
 * (hr_nn_avx512()), bf16 rows take 16 lanes at a time, bit for bit the
 * 8-lane code; so in rope and hr_nn_rms_scale_row. */
void hr_nn_rms_rows(hr_dtype dt, bool avx512, int64_t rows, int64_t h, int64_t chunk, const char *x, int64_t xs,
                    char *y, int64_t ys, const float *w, bool round_first, float eps);

/* add_rms_norm's first pass over one row of h values: s = dt(x + r) (s may
 * be x or r), returning the sum of the squares of s in k_nn.c's order. */
float hr_nn_add_sum_sq_row(hr_dtype dt, int64_t h, int64_t chunk, const char *x, const char *r, char *s);

/* One row of hr_nn_rms_rows's second pass, given rstd. */
void hr_nn_rms_scale_row(hr_dtype dt, bool avx512, int64_t h, const char *x, char *y, const float *w,
                         bool round_first, float rstd);
#else
#define HR_NN_SIMD 0
#endif

#endif
