/* The reduce kernels live in two files; k_reduce.c registers both. */
#ifndef HR_BACKENDS_CPU_K_REDUCE_H
#define HR_BACKENDS_CPU_K_REDUCE_H

#include "ops/op_impl.h"

/* Registers topk (k_reduce_topk.c). */
void hr_cpu_register_reduce_topk(hr_cpu_kernel_fn *table);

#endif
