/* Fused CPU kernels: linears that share one input in one pass over the
 * thread pool (the linear_group kernel's decode rows, and the groups the
 * plan fusion pass plan_fuse.c finds), with the op that consumed their
 * outputs (silu_mul, gelu_mul, a residual add) applied in the GEMV's
 * epilogue, so the intermediates never reach memory; and elementwise
 * chains. */
#ifndef HR_BACKENDS_CPU_K_FUSED_H
#define HR_BACKENDS_CPU_K_FUSED_H

#include <stdbool.h>

#include "backends/cpu/k_eltwise.h"
#include "core/tensor_impl.h"
#include "ops/op_impl.h"

#define HR_FUSED_MAX_LINEARS 3

typedef enum hr_fused_epilogue {
    HR_FUSED_STORE = 0,    /* out[j] = x @ w[j]^T + b[j], for each j */
    HR_FUSED_GATED = 1,    /* out[0] = silu(x @ w[0]^T + b[0]) * (x @ w[1]^T + b[1]) */
    HR_FUSED_RESIDUAL = 2, /* out[0] = (x @ w[0]^T + b[0]) + res */
    HR_FUSED_GATED_GELU = 3, /* GATED with gelu's tanh approximation for silu */
} hr_fused_epilogue;

typedef struct hr_fused_linear {
    hr_fused_epilogue epi;
    int n;                                    /* linears sharing x */
    const hr_tensor *x;                       /* [..., k]: rows of one stride */
    const hr_tensor *w[HR_FUSED_MAX_LINEARS]; /* [n_j, k], k contiguous, x's dtype */
    const hr_tensor *b[HR_FUSED_MAX_LINEARS]; /* [n_j] or NULL */
    const hr_tensor *res;                     /* RESIDUAL: [..., n_0] */
    hr_tensor *out[HR_FUSED_MAX_LINEARS];     /* [..., n_j]; GATED*, RESIDUAL: out[0] only */
} hr_fused_linear;

/* True when t reads as a matrix [rows, last dim] with unit element stride
 * and one row stride; sets both. */
bool hr_fused_rows(const hr_tensor *t, int64_t *rows, int64_t *row_stride);

/* Whether a linear x [..., k] @ w [n, k]^T + b -> out takes the GEMV route
 * the fused kernel replaces (few rows, k-contiguous weights, one dtype, a
 * bias, if any, of [n] floats). */
bool hr_fused_linear_fits(const hr_tensor *x, const hr_tensor *w, const hr_tensor *b, const hr_tensor *out);

/* Linear fusion, eager and compiled, on unless HUBRT_FUSE=0 (read at each
 * call: tests switch it). */
bool hr_fused_linears_enabled(void);

hr_status hr_cpu_fused_linear(const hr_fused_linear *f);

/* The linear_group kernel (k_linear_group.c), registered with linalg's. */
void hr_cpu_register_linear_group(hr_cpu_kernel_fn *table);

/* ---- elementwise chains ----------------------------------------------------
 * A run of elementwise ops whose intermediates nothing else reads becomes
 * one pass over blocks of the output: the head operand is loaded once as
 * f32, each step applies one op (with an operand broadcast to the output,
 * or the running value itself), rounds the result to the dtype the
 * unfused op stored, and only the last result is stored. */

#define HR_FUSED_MAX_STEPS 8
#define HR_FUSED_MAX_OPERANDS 8

typedef struct hr_chain_step {
    hr_ew_op op;
    bool cast;      /* a cast between float dtypes: no op, only the rounding */
    int operand;    /* binary: index into operands, -1 for the running value */
    bool acc_right; /* binary: the running value is the op's second input */
    hr_dtype round; /* dtype the unfused op stored its result in */
    float p0, p1;   /* SCALE: mul, add; CLAMP: low, high (+-inf when absent) */
} hr_chain_step;

typedef struct hr_fused_chain {
    int n_steps;
    hr_chain_step steps[HR_FUSED_MAX_STEPS];
    int n_operands;
    const hr_tensor *operands[HR_FUSED_MAX_OPERANDS]; /* [0]: the head op's first input; each
                                                         broadcasts to out; float dtypes, any strides */
    hr_tensor *out;                                   /* the last op's output, any strides */
} hr_fused_chain;

hr_status hr_cpu_fused_chain(const hr_fused_chain *c);

#endif
