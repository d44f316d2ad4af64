/* Helpers shared by the CPU eltwise and index kernel files: row loads and
 * stores through f32 with SIMD paths for contiguous bf16/f16, and strided
 * same-dtype copies. */
#ifndef HR_BACKENDS_CPU_K_ELTWISE_H
#define HR_BACKENDS_CPU_K_ELTWISE_H

#include "core/iter.h"
#include "ops/op_impl.h"

/* True when the AVX2 paths may run: compiled in and not lowered by
 * HUBRT_CPU_ISA=scalar. Read once per kernel call (the getter locks). */
bool hr_k_simd(void);

/* Like hr_load_f32 / hr_store_f32, with vector conversions for stride-1
 * f32/bf16/f16 rows when `simd`. */
void hr_k_load_f32(float *dst, const char *src, hr_dtype dt, int64_t n, int64_t stride, bool simd);
void hr_k_store_f32(char *dst, hr_dtype dt, const float *src, int64_t n, int64_t stride, bool simd);

/* dst[i * sd] = src[i * ss] for n elements of `size` bytes. */
void hr_k_copy_row(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n, size_t size);

/* Copies src into dst (same dtype; src broadcasts to dst's shape), any
 * strides; `parallel` spreads large copies over the thread pool. */
void hr_k_copy_strided(const hr_tensor *dst, const hr_tensor *src, bool parallel);

/* Registers where, copy, cast, fill and arange (k_eltwise_move.c). */
void hr_cpu_register_eltwise_move(hr_cpu_kernel_fn *table);

#endif
