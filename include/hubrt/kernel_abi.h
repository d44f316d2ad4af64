/* The C ABI a kernel library from the kernel hub exports (header only: a
 * kernel includes it and links nothing of hubrt).
 *
 * A kernel package holds, per variant folder `build/hubrt1-cpu-<arch>-<os>/`,
 * a shared library exporting one symbol, HR_KERNEL_ABI_SYMBOL, an
 * hr_kernel_abi struct whose abi_version is HR_KERNEL_ABI_VERSION, and a
 * metadata.json (docs/kernels.md). hubrt checks the digests, the ABI
 * version and the publisher before it dlopens the library, and the struct
 * after. Everything crosses as plain C: pointers, sizes, dtype codes. */
#ifndef HUBRT_KERNEL_ABI_H
#define HUBRT_KERNEL_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HR_KERNEL_ABI_VERSION 1
#define HR_KERNEL_ABI_SYMBOL "hubrt_kernel_abi_v1"

/* The experts op (hubrt/ops.h) on contiguous host arrays. Codes are
 * hubrt's: dtype an hr_dtype (f32 0, bf16 1, f16 2), act an
 * hr_experts_act, isa an hr_cpu_isa (the caller's setting, so that a
 * kernel with several paths takes the same one). */
typedef struct hr_kernel_experts_args {
    int32_t dtype;          /* of x, gate_up, down, the biases and out */
    int32_t weights_dtype;  /* of weights */
    int32_t act;
    int32_t per_expert;     /* transformers' per-expert rounding */
    double limit, alpha;    /* act gpt_oss's clamp and sigmoid scale */
    int64_t t, h, i, e, k;  /* rows, hidden, intermediate, experts, slots per row */
    const void *x;          /* [t, h] */
    const void *weights;    /* [t, k] */
    const int64_t *indices; /* [t, k]; outside [0, e): the slot adds nothing */
    const void *gate_up;    /* [e, 2i, h]: the gate's i rows, then the up's */
    const void *down;       /* [e, h, i] */
    const void *gate_up_bias, *down_bias; /* [e, 2i], [e, h], or both NULL */
    void *out;              /* [t, h]; may be x itself: read all of x before writing out */
    int32_t isa;
    int32_t threads;        /* threads the kernel may use */
    char *error;            /* a message on failure, NUL-terminated, at most error_cap bytes */
    size_t error_cap;
} hr_kernel_experts_args;

typedef struct hr_kernel_abi {
    uint32_t abi_version; /* HR_KERNEL_ABI_VERSION */
    uint32_t struct_size; /* sizeof(hr_kernel_abi) */
    const char *name;     /* the op it implements: "experts" */
    /* 0 on success; otherwise an hr_status with a message in a->error */
    int (*experts)(const hr_kernel_experts_args *a);
} hr_kernel_abi;

#ifdef __cplusplus
}
#endif

#endif
