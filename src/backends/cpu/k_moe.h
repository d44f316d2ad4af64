/* The CPU experts kernel on plain arrays: the entry of the experts kernel
 * library (kernels/experts/), which carries its own copy of this code, so
 * the kernel the hub loads gives this kernel's bits. */
#ifndef HR_BACKENDS_CPU_K_MOE_H
#define HR_BACKENDS_CPU_K_MOE_H

#include "hubrt/kernel_abi.h"

/* 0 or an hr_status with a message in a->error; sets this copy's ISA and
 * thread count to a's first. */
int hr_cpu_experts_raw(const hr_kernel_experts_args *a);

#endif
