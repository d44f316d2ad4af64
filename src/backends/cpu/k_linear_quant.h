/* linear with a block-quantized weight on the CPU (k_linear_quant.c). */
#ifndef HR_BACKENDS_CPU_K_LINEAR_QUANT_H
#define HR_BACKENDS_CPU_K_LINEAR_QUANT_H

#include <stdbool.h>

#include "core/tensor_impl.h"

/* Whether x [..., k] @ w [n, k]^T -> out runs here: w block-quantized and
 * row-major, x and out rows of one stride each. */
bool hr_linear_quant_fits(const hr_tensor *x, const hr_tensor *w, const hr_tensor *out);
hr_status hr_cpu_linear_quant(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out);
/* The same for FP8 blocks (k_linear_fp8.c): f32 products of the
 * dequantized weights and x. */
hr_status hr_cpu_linear_fp8(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out);

/* Where a block-weight linear writes: out's rows (o_rs elements apart) in
 * its dtype, each output plus the bias when there is one. */
typedef struct hr_linear_out {
    char *out;
    hr_dtype odt;
    int64_t o_rs;
    const char *bias;
    hr_dtype bias_dt;
    int64_t bias_s;
} hr_linear_out;
/* A block-weight linear's operands: x's m rows (x_rs elements apart),
 * w's bytes per row, out's rows and the bias into o; refused naming w
 * unless hr_linear_quant_fits and out has x's rows. */
hr_status hr_linear_quant_args(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out,
                               int64_t *m, int64_t *x_rs, size_t *w_rs, hr_linear_out *o);
/* Outputs [j0, j0 + nt) of row i from v, plus the bias. */
void hr_linear_out_row(const hr_linear_out *o, int64_t i, int64_t j0, int nt, const float *v);

#endif
