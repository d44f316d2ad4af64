/* hubrt runtime: CPU features and the thread pool (public API). */
#ifndef HUBRT_RUNTIME_H
#define HUBRT_RUNTIME_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_cpu_features {
    bool sse42, avx, avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512_vnni, avx512_bf16, avx512_fp16;
    bool avx_vnni;
    bool amx_tile, amx_bf16, amx_int8;
    bool amx_usable; /* the kernel granted tile data permission */
    /* HUBRT_AMX_EMULATE=1 on a CPU with AVX-512 BF16 and no usable AMX:
     * the amx ISA may be chosen (never by default) and runs its tile
     * kernels on a software model of the tiles, for tests. */
    bool amx_emulated;
    int logical_cpus;
    char vendor[16];
    char brand[64];
} hr_cpu_features;

/* Detected once (CPUID and, for AMX, arch_prctl permission). */
HR_API const hr_cpu_features *hr_cpu_features_get(void);

/* ISA level the CPU kernels use: the best detected, lowered by
 * HUBRT_CPU_ISA=amx|avx512|avx2|scalar (a request above what the CPU has is
 * refused with a warning and the best available is used). amx is also
 * allowed, never the default, when the tiles are emulated
 * (hr_cpu_features.amx_emulated). */
typedef enum hr_cpu_isa {
    HR_ISA_SCALAR = 0,
    HR_ISA_AVX2 = 1,
    HR_ISA_AVX512 = 2,
    HR_ISA_AMX = 3,
} hr_cpu_isa;

HR_API hr_cpu_isa hr_cpu_isa_get(void);
HR_API hr_status hr_cpu_isa_set(hr_cpu_isa isa);
HR_API const char *hr_cpu_isa_name(hr_cpu_isa isa);

/* Threads of the persistent pool: HUBRT_NUM_THREADS, default = CPUs this
 * process may run on. */
HR_API int hr_num_threads(void);
HR_API hr_status hr_set_num_threads(int n);

/* The GNU build ID (hex) of the binary holding hubrt's code: libhubrt.so,
 * or the executable it is linked into; "" when the linker wrote none.
 * Compiled plans on disk are keyed by it. */
HR_API const char *hr_build_id(void);

#ifdef __cplusplus
}
#endif
#endif
