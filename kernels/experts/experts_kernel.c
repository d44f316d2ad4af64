/* The grouped experts kernel as a kernel-hub package: a shared library
 * exporting one symbol, hubrt_kernel_abi_v1 (hubrt/kernel_abi.h). It
 * carries its own copy of hubrt's CPU experts kernel (the GEMM engine and
 * thread pool it runs on, linked in from the static library with every
 * symbol hidden: a version script exports the ABI struct alone), so it
 * imports nothing from libhubrt and gives the built-in kernel's bits.
 * CMake builds it into build/kernels/hubrt/experts-grouped/ with its
 * metadata.json (docs/kernels.md). */
#include "backends/cpu/k_moe.h"

static int experts(const hr_kernel_experts_args *a) { return hr_cpu_experts_raw(a); }

__attribute__((visibility("default"))) const hr_kernel_abi hubrt_kernel_abi_v1 = {
    .abi_version = HR_KERNEL_ABI_VERSION,
    .struct_size = sizeof(hr_kernel_abi),
    .name = "experts",
    .experts = experts,
};
