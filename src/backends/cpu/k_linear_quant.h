/* linear with a block-quantized weight on the CPU (k_linear_quant.c). */
#ifndef HR_BACKENDS_CPU_K_LINEAR_QUANT_H
#define HR_BACKENDS_CPU_K_LINEAR_QUANT_H

#include <stdbool.h>

#include "core/tensor_impl.h"

/* Whether x [..., k] @ w [n, k]^T -> out runs here: w block-quantized and
 * row-major, x and out rows of one stride each. */
bool hr_linear_quant_fits(const hr_tensor *x, const hr_tensor *w, const hr_tensor *out);
hr_status hr_cpu_linear_quant(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out);

#endif
