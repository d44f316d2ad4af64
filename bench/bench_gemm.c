/* Skinny GEMM micro-benchmark: GFLOP/s of hr_linear with bf16 x [M, K] and
 * bf16 W [N, K] (the batched-decode and prefill linears), as a share of the
 * bf16 compute peak measured in the same run by a vdpbf16ps register loop.
 *
 * Each shape runs twice per M: "warm" calls one weight again and again (it
 * stays in L2/L3 when small enough), "cold" cycles through distinct copies
 * totaling --mib MiB (default 256, well above the 32 MiB L3), so the weights
 * come from DRAM as in a model step. A sample is one pass of `count` calls;
 * the warm and cold samples alternate, and the best of --samples is reported
 * with the median.
 *
 * Built by `make` (CMake target bench_gemm in the build folder).
 * Run: B/bench_gemm [--model qwen3|llama|smollm2|all] [--rows 16,64,512] [--threads T]
 *                   [--mib M] [--samples S] [--only NAME] [--no-huge] [--pack]
 *                   [--cpu-time]
 * The weights get madvise(MADV_HUGEPAGE) (THP is "madvise" here), as the
 * model loader does, unless --no-huge. --pack compares, interleaved, cold
 * passes over weights as they are ("warm" columns then show those) against
 * another set packed by hr_linear_pack, as the model loader packs them.
 * --cpu-time times with the process's CPU clock instead of the wall clock:
 * with --threads 1 (no pool threads spinning) it is steady when other work
 * shares the cores. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "hubrt.h"

static const bench_linear_shape LLAMA[] = {
    {"llama q/o_proj", 2048, 2048}, {"llama k/v_proj", 512, 2048}, {"llama gate/up", 8192, 2048},
    {"llama down", 2048, 8192},     {"llama lm_head", 128256, 2048},
};

/* SmolLM2-135M: linears of few 64-row panels (k/v_proj: three) */
static const bench_linear_shape SMOLLM2[] = {
    {"smollm2 q/o_proj", 576, 576}, {"smollm2 k/v_proj", 192, 576}, {"smollm2 gate/up", 1536, 576},
    {"smollm2 down", 576, 1536},    {"smollm2 lm_head", 49152, 576},
};

static void check(hr_status s, const char *what) { bench_check("bench_gemm", s, what); }

/* ---- the peak: 24 independent vdpbf16ps chains per thread ---- */

#define DP(n) "vdpbf16ps %%zmm30, %%zmm31, %%zmm" #n "\n\t"
#define DP8(a, b, c, d, e, f, g, h) DP(a) DP(b) DP(c) DP(d) DP(e) DP(f) DP(g) DP(h)
#define DP24 DP8(0, 1, 2, 3, 4, 5, 6, 7) DP8(8, 9, 10, 11, 12, 13, 14, 15) DP8(16, 17, 18, 19, 20, 21, 22, 23)
#define CLOBBER24                                                                                             \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",         \
        "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",    \
        "xmm23"
#define PEAK_ITERS 4000000L /* x 24 instructions: ~0.2 s on one Zen 4 core (the FMA loop: 8 x as many, x 12) */

typedef struct peak_arg {
    double gflops;
} peak_arg;

/* Each loop is one asm statement, so that its registers, zeroed first
 * (no denormal or NaN leftovers), stay its own throughout. */

/* PEAK_ITERS x 24 vdpbf16ps (64 flop per zmm one: 16 lanes x 2 products
 * x 2). */
#define ZZ(n) "vpxord %%zmm" #n ", %%zmm" #n ", %%zmm" #n "\n\t"
#define ZZ8(a, b, c, d, e, f, g, h) ZZ(a) ZZ(b) ZZ(c) ZZ(d) ZZ(e) ZZ(f) ZZ(g) ZZ(h)
__attribute__((target("avx512f,avx512bf16"))) static void dp_loop(void) {
    long n = PEAK_ITERS;
    __asm__ volatile(ZZ8(0, 1, 2, 3, 4, 5, 6, 7) ZZ8(8, 9, 10, 11, 12, 13, 14, 15)
                         ZZ8(16, 17, 18, 19, 20, 21, 22, 23) ZZ(30) ZZ(31) "1:\n\t" DP24 "dec %0\n\tjnz 1b"
                     : "+r"(n)
                     :
                     : CLOBBER24, "xmm30", "xmm31", "cc");
}

/* Without AVX512_BF16 the kernels widen bf16 and use f32 FMA (AVX2): the
 * peak is then twelve independent ymm FMA chains per thread (16 flop each),
 * as bench/probes/fma_avx2.c measures it for limits.py; 8 x PEAK_ITERS x
 * 12 of them, the same flop as dp_loop. */
#define FMA(n) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #n "\n\t"
#define FMA12 FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5) FMA(6) FMA(7) FMA(8) FMA(9) FMA(10) FMA(11)
#define ZY(n) "vxorps %%ymm" #n ", %%ymm" #n ", %%ymm" #n "\n\t"
#define CLOBBER12 "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"

__attribute__((target("avx2,fma"))) static void fma_loop(void) {
    long n = 8 * PEAK_ITERS;
    __asm__ volatile(ZY(0) ZY(1) ZY(2) ZY(3) ZY(4) ZY(5) ZY(6) ZY(7) ZY(8) ZY(9) ZY(10) ZY(11) ZY(14) ZY(15)
                     "1:\n\t" FMA12 "dec %0\n\tjnz 1b"
                     : "+r"(n)
                     :
                     : CLOBBER12, "xmm14", "xmm15", "cc");
}

static bool g_fma_peak; /* no AVX512_BF16: the AVX2 FMA loop */

/* One thread's best of three timed runs of the peak loop, in GFLOP/s. */
static void *peak_thread(void *arg) {
    peak_arg *a = arg;
    a->gflops = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = bench_now_s();
        (g_fma_peak ? fma_loop : dp_loop)();
        double g = 24.0 * 64.0 * (double)PEAK_ITERS / (bench_now_s() - t0) / 1e9;
        if (g > a->gflops) a->gflops = g;
    }
    return NULL;
}

/* Sum over nth threads running the loop at once. */
static double peak_gflops(int nth) {
    pthread_t th[64];
    peak_arg args[64];
    for (int i = 1; i < nth; i++) pthread_create(&th[i], NULL, peak_thread, &args[i]);
    peak_thread(&args[0]);
    double total = args[0].gflops;
    for (int i = 1; i < nth; i++) {
        pthread_join(th[i], NULL);
        total += args[i].gflops;
    }
    return total;
}

/* ---- one shape at one M ---- */

typedef struct result {
    double best, median;
} result;

static result summarize(double *v, int samples) {
    qsort(v, (size_t)samples, sizeof *v, bench_cmp_double);
    return (result){v[samples - 1], v[samples / 2]};
}

static bool g_cpu_time;

static double now_s(void) {
    if (!g_cpu_time) return bench_now_s();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench_shape(const bench_linear_shape *s, int64_t rows, size_t total, int samples, bool huge, double peak,
                        bool pack) {
    size_t count, bytes, pcount = 0, pbytes = 0;
    char *buf, *pbuf = NULL;
    hr_tensor **w = bench_weights("bench_gemm", s->n, s->k, total, huge, &count, &buf, &bytes), **wp = NULL;
    if (pack) {
        wp = bench_weights("bench_gemm", s->n, s->k, total, huge, &pcount, &pbuf, &pbytes);
        for (size_t i = 0; i < pcount; i++) {
            bool packed;
            check(hr_linear_pack(wp[i], &packed), "pack");
            if (!packed) {
                fprintf(stderr, "bench_gemm: --pack: this CPU or ISA setting packs no weights\n");
                exit(1);
            }
        }
    }
    size_t wbytes = bytes / count;
    int64_t xshape[2] = {rows, s->k}, yshape[2] = {rows, s->n};
    uint16_t *xh = malloc((size_t)(rows * s->k) * 2);
    for (int64_t i = 0; i < rows * s->k; i++) xh[i] = (uint16_t)(0x3c00u | (i & 127));
    hr_tensor *x, *y;
    check(hr_tensor_from_host(hr_device_cpu(), HR_BF16, 2, xshape, xh, (size_t)(rows * s->k) * 2, &x), "x");
    check(hr_tensor_empty(hr_device_cpu(), HR_BF16, 2, yshape, &y), "y");
    hr_op lin;
    check(hr_op_find("linear", &lin), "op");
    double flop = 2.0 * (double)rows * (double)s->n * (double)s->k;
    double *warm = malloc((size_t)samples * sizeof *warm), *cold = malloc((size_t)samples * sizeof *cold);
    for (int it = -1; it < samples; it++) { /* it -1 warms up (page faults, pool) */
        for (int pass = 0; pass < 2; pass++) {
            double t0 = now_s();
            for (size_t i = 0; i < count; i++) {
                const hr_tensor *in[2] = {x, pack ? (pass == 0 ? w : wp)[i] : w[pass == 0 ? 0 : i]};
                check(hr_op_run(lin, NULL, in, 2, &y, 1), "linear");
            }
            double g = flop * (double)count / (now_s() - t0) / 1e9;
            if (it >= 0) (pass == 0 ? warm : cold)[it] = g;
        }
    }
    result rw = summarize(warm, samples), rc = summarize(cold, samples);
    printf("%-16s N=%6lld K=%5lld M=%4lld %3zu x %6.1f MB | %s best %6.1f med %6.1f GF/s %3.0f%% | "
           "%s best %6.1f med %6.1f GF/s %3.0f%% | %8.1f us/call\n",
           s->name, (long long)s->n, (long long)s->k, (long long)rows, count, (double)wbytes / 1e6,
           pack ? "cold    " : "warm", rw.best, rw.median, 100.0 * rw.best / peak, pack ? "packed" : "cold", rc.best, rc.median, 100.0 * rc.best / peak,
           flop / rc.best / 1e3);
    fflush(stdout);
    for (size_t i = 0; i < count; i++) hr_tensor_free(w[i]);
    for (size_t i = 0; i < pcount; i++) hr_tensor_free(wp[i]);
    if (pbuf) munmap(pbuf, pbytes);
    free(wp);
    hr_tensor_free(x);
    hr_tensor_free(y);
    free(w);
    free(xh);
    free(warm);
    free(cold);
    munmap(buf, bytes);
}

static int parse_rows(const char *arg, int64_t *rows, int max) {
    int n = 0;
    for (const char *p = arg; *p && n < max;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1) return -1;
        rows[n++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *model = "all", *only = NULL;
    int nth = 2, samples = 7, nrows = 3;
    int64_t rows[16] = {16, 64, 512};
    size_t mib = 256;
    bool huge = true, pack = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) nrows = parse_rows(argv[++i], rows, 16);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--samples") && i + 1 < argc) samples = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--no-huge")) huge = false;
        else if (!strcmp(argv[i], "--pack")) pack = true;
        else if (!strcmp(argv[i], "--cpu-time")) g_cpu_time = true;
        else {
            fprintf(stderr, "usage: %s [--model qwen3|llama|smollm2|all] [--rows 16,64,512] [--threads T] [--mib M] "
                            "[--samples S] [--only NAME] [--no-huge] [--pack] [--cpu-time]\n", argv[0]);
            return 2;
        }
    }
    if (nrows < 1 || nth < 1 || nth > 64 || samples < 1) {
        fprintf(stderr, "bench_gemm: rows (a comma list of counts >= 1), threads (1..64) and samples (>= 1)\n");
        return 2;
    }
    check(hr_set_num_threads(nth), "threads");
    const hr_cpu_features *f = hr_cpu_features_get();
    g_fma_peak = !f->avx512_bf16;
    if (g_fma_peak && !(f->avx2 && f->fma)) {
        fprintf(stderr, "bench_gemm: the peak loop needs AVX512_BF16 or AVX2 + FMA\n");
        return 1;
    }
    double peak1 = peak_gflops(1), peak = peak_gflops(nth);
    printf("isa %s, %d threads, %zu MiB of weights per cold pass%s; %s peak %.1f GF/s (1 thread), "
           "%.1f GF/s (%d): %% below is of the latter\n",
           hr_cpu_isa_name(hr_cpu_isa_get()), nth, mib, huge ? ", huge pages" : "",
           g_fma_peak ? "f32 FMA (AVX2)" : "vdpbf16ps", peak1, peak, nth);
    bool all = !strcmp(model, "all");
    for (int r = 0; r < nrows; r++) {
        if (all || !strcmp(model, "qwen3"))
            for (size_t i = 0; i < sizeof BENCH_QWEN3 / sizeof *BENCH_QWEN3; i++)
                if (!only || strstr(BENCH_QWEN3[i].name, only))
                    bench_shape(&BENCH_QWEN3[i], rows[r], mib << 20, samples, huge, peak, pack);
        if (all || !strcmp(model, "llama"))
            for (size_t i = 0; i < sizeof LLAMA / sizeof *LLAMA; i++)
                if (!only || strstr(LLAMA[i].name, only))
                    bench_shape(&LLAMA[i], rows[r], mib << 20, samples, huge, peak, pack);
        if (all || !strcmp(model, "smollm2"))
            for (size_t i = 0; i < sizeof SMOLLM2 / sizeof *SMOLLM2; i++)
                if (!only || strstr(SMOLLM2[i].name, only))
                    bench_shape(&SMOLLM2[i], rows[r], mib << 20, samples, huge, peak, pack);
    }
    return 0;
}
