/* AVX-512 BF16 GEMM micro-kernel: vdpbf16ps multiplies bf16
 * pairs exactly and accumulates in f32, so bf16 operands never widen in
 * memory. Chosen at run time (hr_gemm_use_avx512_bf16), as is the panel
 * route's AMX kernel (hr_gemm_amx_kernel). */
#include <immintrin.h>

#include "backends/cpu/gemm.h"
#include "hubrt/runtime.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define MR HR_GEMM_BF16_MR

bool hr_gemm_use_avx512_bf16(void) {
    return hr_cpu_isa_get() >= HR_ISA_AVX512 && hr_cpu_features_get()->avx512_bf16;
}

bool hr_gemm_use_panels(void) {
    const hr_cpu_features *f = hr_cpu_features_get();
    return hr_cpu_isa_get() >= HR_ISA_AVX2 && f->avx2 && f->fma;
}

bool hr_gemm_use_panels_for(hr_dtype dt) {
    return hr_gemm_use_panels() && (dt == HR_BF16 || (dt == HR_F16 && !hr_gemm_use_avx512_bf16()));
}

hr_gemm_amx_fn hr_gemm_amx_kernel(void) {
    if (hr_cpu_isa_get() != HR_ISA_AMX) return NULL;
    const hr_cpu_features *f = hr_cpu_features_get();
    if (f->amx_bf16 && f->amx_usable) return hr_gemm_amx_rows;
    return f->amx_emulated ? hr_gemm_amx_rows_emulated : NULL;
}

/* kc k-pairs; ap [kc][MR] u32 (bf16 pairs), bp [kc][32][2] bf16, c [MR][ldc] */
TARGET_ void hr_gemm_ukr_bf16_avx512(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                     bool accumulate) {
    const uint32_t *a = ap;
    const uint16_t *b = bp;
    __m512 acc[MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kc; p++, a += MR, b += 2 * HR_GEMM_BF16_NR) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        float *ci = c + i * ldc;
        if (accumulate) {
            acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_loadu_ps(ci));
            acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_loadu_ps(ci + 16));
        }
        _mm512_storeu_ps(ci, acc[i][0]);
        _mm512_storeu_ps(ci + 16, acc[i][1]);
    }
}
