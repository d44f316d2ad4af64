/* CPU feature detection (CPUID, XGETBV) and the run-time ISA choice. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "hubrt/runtime.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_x86(hr_cpu_features *f) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    unsigned max_leaf = a;
    memcpy(f->vendor, &b, 4);
    memcpy(f->vendor + 4, &d, 4);
    memcpy(f->vendor + 8, &c, 4);
    __get_cpuid(1, &a, &b, &c, &d);
    bool osxsave = c & (1u << 27);
    f->sse42 = c & (1u << 20);
    f->fma = c & (1u << 12);
    f->f16c = c & (1u << 29);
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
    bool tile_os = (xcr0 & 0x60000) == 0x60000;
    f->avx = (c & (1u << 28)) && ymm_os;
    f->fma = f->fma && ymm_os;
    f->f16c = f->f16c && ymm_os;
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f->avx2 = (b & (1u << 5)) && ymm_os;
        f->avx512f = (b & (1u << 16)) && zmm_os;
        f->avx512bw = (b & (1u << 30)) && zmm_os;
        f->avx512vl = (b & (1u << 31)) && zmm_os;
        f->avx512_vnni = (c & (1u << 11)) && zmm_os;
        f->avx512_fp16 = (d & (1u << 23)) && zmm_os;
        f->amx_bf16 = (d & (1u << 22)) && tile_os;
        f->amx_tile = (d & (1u << 24)) && tile_os;
        f->amx_int8 = (d & (1u << 25)) && tile_os;
        __cpuid_count(7, 1, a, b, c, d);
        f->avx_vnni = (a & (1u << 4)) && ymm_os;
        f->avx512_bf16 = (a & (1u << 5)) && zmm_os;
    }
    __get_cpuid(0x80000000, &a, &b, &c, &d);
    if (a >= 0x80000004) {
        unsigned regs[12];
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
        memcpy(f->brand, regs, 48);
        f->brand[48] = '\0';
        char *p = f->brand;
        while (*p == ' ') p++;
        memmove(f->brand, p, strlen(p) + 1);
    }
    /* Linux hands out AMX tile state only on request, once per process. */
    if (f->amx_tile)
        f->amx_usable = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

static hr_cpu_features g_features;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect(void) {
#if defined(__x86_64__)
    detect_x86(&g_features);
#endif
    const hr_cpu_features *f = &g_features;
    const char *emu = getenv("HUBRT_AMX_EMULATE");
    g_features.amx_emulated = emu && !strcmp(emu, "1") && !(f->amx_bf16 && f->amx_usable) && f->avx512f &&
                              f->avx512bw && f->avx512vl && f->avx512_bf16;
    cpu_set_t set;
    CPU_ZERO(&set);
    g_features.logical_cpus =
        sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (g_features.logical_cpus < 1) g_features.logical_cpus = 1;
}

const hr_cpu_features *hr_cpu_features_get(void) {
    pthread_once(&g_once, detect);
    return &g_features;
}

static const char *const isa_names[] = {"scalar", "avx2", "avx512", "amx"};
static int g_isa = -1;
static pthread_mutex_t g_isa_lock = PTHREAD_MUTEX_INITIALIZER;

const char *hr_cpu_isa_name(hr_cpu_isa isa) {
    return (unsigned)isa <= HR_ISA_AMX ? isa_names[isa] : "invalid";
}

static hr_cpu_isa best_isa(void) {
    const hr_cpu_features *f = hr_cpu_features_get();
    bool avx512 = f->avx512f && f->avx512bw && f->avx512vl && f->avx512_bf16;
    if (avx512 && f->amx_bf16 && f->amx_usable) return HR_ISA_AMX;
    if (avx512) return HR_ISA_AVX512;
    if (f->avx2 && f->fma && f->f16c) return HR_ISA_AVX2;
    return HR_ISA_SCALAR;
}

/* The highest ISA that may be chosen: the best, or amx on emulated tiles. */
static hr_cpu_isa top_isa(void) { return hr_cpu_features_get()->amx_emulated ? HR_ISA_AMX : best_isa(); }

hr_status hr_cpu_isa_set(hr_cpu_isa isa) {
    if ((unsigned)isa > HR_ISA_AMX) return hr_error(HR_ERR_INVALID_ARG, "invalid ISA %d", (int)isa);
    hr_cpu_isa top = top_isa();
    if (isa > top)
        return hr_error(HR_ERR_UNSUPPORTED, "ISA '%s' requested but this CPU supports at most '%s'",
                        isa_names[isa], isa_names[top]);
    pthread_mutex_lock(&g_isa_lock);
    g_isa = isa;
    pthread_mutex_unlock(&g_isa_lock);
    return HR_OK;
}

hr_cpu_isa hr_cpu_isa_get(void) {
    pthread_mutex_lock(&g_isa_lock);
    if (g_isa < 0) {
        hr_cpu_isa best = best_isa();
        g_isa = best;
        const char *env = getenv("HUBRT_CPU_ISA");
        if (env && *env) {
            int want = -1;
            for (int i = 0; i <= HR_ISA_AMX; i++)
                if (!strcmp(env, isa_names[i])) want = i;
            if (want < 0)
                hr_log(HR_LOG_WARN, "HUBRT_CPU_ISA='%s' is not one of amx|avx512|avx2|scalar; using %s",
                       env, isa_names[best]);
            else if (want > (int)top_isa())
                hr_log(HR_LOG_WARN, "HUBRT_CPU_ISA='%s' is beyond this CPU; using %s", env, isa_names[best]);
            else
                g_isa = want;
        }
    }
    hr_cpu_isa isa = (hr_cpu_isa)g_isa;
    pthread_mutex_unlock(&g_isa_lock);
    return isa;
}
