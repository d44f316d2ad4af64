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
 * may alias a or b): whole vectors of 8 through the AVX2 code when simd,
 * the rest through the scalar code. p0, p1: CLAMP's bounds (+-inf when
 * absent), SCALE's mul and add. */
void hr_k_eltwise_f32(hr_ew_op op, float p0, float p1, float *o, const float *a, const float *b, int64_t n,
                      bool simd);

/* Whether op's vector code may give other bits than its scalar code (exp
 * and what is built on it): then an element's result depends on whether
 * it fell in a whole vector of its call of hr_k_eltwise_f32 or in the tail. */
bool hr_k_eltwise_inexact(hr_ew_op op);

/* How the eltwise kernel cuts an op's elements into calls of
 * hr_k_eltwise_f32 (the chunks it may make of a call end in whole
 * vectors, so only the calls' ends matter): rows of hr_k_eltwise_cols
 * elements in row-major order of the output, the coalesced last dim of
 * its iteration over the op's output and inputs (any strides). */
int64_t hr_k_eltwise_cols(const hr_tensor *const *ops, int n_ops);

/* [*begin, *end): the columns of the call that computed column col of a
 * row of `cols`, in an op of n > 0 elements run on nth tasks
 * (hr_iter_parallel's thread count for n). */
void hr_k_eltwise_call(int64_t cols, int64_t n, int nth, int64_t col, int64_t *begin, int64_t *end);

/* Registers where, copy, cast, fill and arange (k_eltwise_move.c). */
void hr_cpu_register_eltwise_move(hr_cpu_kernel_fn *table);

#endif
