/* Helpers shared by the CPU eltwise and index kernel files: row loads and
 * stores through f32 with SIMD paths for contiguous bf16/f16, and strided
 * same-dtype copies; the eltwise ops' f32 arithmetic, which fused chains
 * (k_fused_chain.c) run as the unfused kernel does. */
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

/* v = f32(dt(v)) in place for n floats of a float dtype of at most 16
 * bits or f32 (a no-op): what storing them with hr_k_store_f32 and
 * loading them back gives. */
void hr_k_round_f32(float *v, hr_dtype dt, int64_t n, bool simd);

/* dst[i * sd] = src[i * ss] for n elements of `size` bytes. */
void hr_k_copy_row(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n, size_t size);

/* Copies src into dst (same dtype; src broadcasts to dst's shape), any
 * strides; `parallel` spreads large copies over the thread pool. */
void hr_k_copy_strided(const hr_tensor *dst, const hr_tensor *src, bool parallel);

/* ---- the eltwise ops' f32 arithmetic (k_eltwise.c) ------------------------ */

/* Every op k_eltwise.c computes in f32; gelu by its approximation. */
typedef enum hr_ew_op {
    HR_EW_ADD, HR_EW_SUB, HR_EW_MUL, HR_EW_DIV, HR_EW_POW, HR_EW_MAX, HR_EW_MIN, HR_EW_SILU_MUL, HR_EW_GELU_MUL,
    HR_EW_GELU_TANH_MUL, HR_EW_NEG, HR_EW_EXP, HR_EW_LOG, HR_EW_SQRT, HR_EW_RSQRT, HR_EW_ABS, HR_EW_RELU,
    HR_EW_SIGMOID, HR_EW_TANH, HR_EW_SILU, HR_EW_GELU, HR_EW_GELU_TANH, HR_EW_CLAMP, HR_EW_SCALE,
} hr_ew_op;

/* o[i] = op(a[i], b[i]) for n contiguous floats (b NULL for a unary op; o
 * may alias a or b): with simd every element through the AVX2 code (a
 * partial last vector through a padded copy), so an element's result does
 * not depend on n or on where the range starts; else the scalar code.
 * p0, p1: CLAMP's bounds (+-inf when absent), SCALE's mul and add. */
void hr_k_eltwise_f32(hr_ew_op op, float p0, float p1, float *o, const float *a, const float *b, int64_t n,
                      bool simd);

/* Registers where, copy, cast, fill and arange (k_eltwise_move.c). */
void hr_cpu_register_eltwise_move(hr_cpu_kernel_fn *table);

#endif
