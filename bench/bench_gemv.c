/* GEMV micro-benchmark: GB/s of bf16 weight bytes streamed by hr_linear at
 * decode shapes (x [rows, K] @ W[N, K]^T), next to a plain read of the same
 * bytes measured moments apart.
 *
 * Every shape cycles through distinct weights totaling --mib MiB (default
 * 512, well above the 32 MiB L3) so they come from memory, as in decode.
 * A sample is one pass over all of them; samples of the GEMV and of the
 * plain read (the same number of threads, 64-byte loads) alternate, and the
 * best of --samples is reported with the median.
 *
 * Built by `make` (CMake target bench_gemv in the build folder).
 * Run: B/bench_gemv [--model qwen3|smollm2|all] [--rows R] [--threads T]
 *                   [--mib M] [--samples S] [--huge] [--pack]
 * --huge: madvise(MADV_HUGEPAGE) on the weights (THP is "madvise" here).
 * --pack: the weights packed by hr_linear_pack first, as the model loader
 * packs them, so hr_linear reads their panels (the route a checkpoint's
 * bf16 weights take) instead of the weights in place (the GEMV route up to
 * 16 rows: weights a model owns after a cast or a GGUF
 * dequantization, f16 and f32 weights). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_util.h"
#include "hubrt.h"

static const bench_linear_shape SMOLLM2[] = {
    {"smollm2 q/o_proj", 576, 576}, {"smollm2 k/v_proj", 192, 576}, {"smollm2 gate/up", 1536, 576},
    {"smollm2 down", 576, 1536},    {"smollm2 lm_head", 49152, 576},
};

/* ---- one shape ---- */

static void bench_shape(const bench_linear_shape *s, int rows, int nth, size_t total, int samples, bool huge,
                        bool pack) {
    size_t wbytes = (size_t)(s->n * s->k) * 2, count, bytes;
    char *buf;
    hr_tensor **w = bench_weights("bench_gemv", s->n, s->k, total, huge, &count, &buf, &bytes);
    for (size_t i = 0; pack && i < count; i++) {
        bool packed;
        bench_check("bench_gemv", hr_linear_pack(w[i], &packed), "pack");
        if (!packed) {
            fprintf(stderr, "bench_gemv: --pack: this CPU or ISA setting packs no weights\n");
            exit(2);
        }
    }
    int64_t xshape[2] = {rows, s->k}, yshape[2] = {rows, s->n};
    uint16_t *xh = malloc((size_t)(rows * s->k) * 2);
    for (int64_t i = 0; i < rows * s->k; i++) xh[i] = (uint16_t)(0x3c00u | (i & 127));
    hr_tensor *x, *y;
    size_t xbytes = (size_t)(rows * s->k) * 2;
    bench_check("bench_gemv", hr_tensor_from_host(hr_device_cpu(), HR_BF16, 2, xshape, xh, xbytes, &x), "x");
    bench_check("bench_gemv", hr_tensor_empty(hr_device_cpu(), HR_BF16, 2, yshape, &y), "y");
    hr_op lin;
    bench_check("bench_gemv", hr_op_find("linear", &lin), "op");
    double *g = malloc((size_t)samples * sizeof *g), *r = malloc((size_t)samples * sizeof *r);
    for (int it = -1; it < samples; it++) { /* it -1 warms up */
        double t0 = bench_now_s();
        for (size_t i = 0; i < count; i++) {
            const hr_tensor *in[2] = {x, w[i]};
            bench_check("bench_gemv", hr_op_run(lin, NULL, in, 2, &y, 1), "linear");
        }
        double gbs = (double)bytes / (bench_now_s() - t0) / 1e9;
        double rbs = bench_read_pass(buf, bytes, nth);
        if (it >= 0) g[it] = gbs, r[it] = rbs;
    }
    qsort(g, (size_t)samples, sizeof *g, bench_cmp_double);
    qsort(r, (size_t)samples, sizeof *r, bench_cmp_double);
    printf("%-18s N=%6lld K=%5lld rows=%d thr=%d %4zu x %7.2f MB  gemv best %5.1f med %5.1f GB/s | "
           "read best %5.1f med %5.1f GB/s | %3.0f%%  %.1f us/call\n",
           s->name, (long long)s->n, (long long)s->k, rows, nth, count, (double)wbytes / 1e6, g[samples - 1],
           g[samples / 2], r[samples - 1], r[samples / 2], 100.0 * g[samples - 1] / r[samples - 1],
           (double)wbytes / g[samples - 1] / 1e3);
    fflush(stdout);
    for (size_t i = 0; i < count; i++) hr_tensor_free(w[i]);
    hr_tensor_free(x);
    hr_tensor_free(y);
    free(w);
    free(xh);
    free(g);
    free(r);
    munmap(buf, bytes);
}

int main(int argc, char **argv) {
    const char *model = "all";
    int rows = 1, nth = 2, samples = 7;
    size_t mib = 512;
    bool huge = false, pack = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--samples") && i + 1 < argc) samples = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--huge")) huge = true;
        else if (!strcmp(argv[i], "--pack")) pack = true;
        else {
            fprintf(stderr, "usage: %s [--model qwen3|smollm2|all] [--rows R] [--threads T] [--mib M] "
                            "[--samples S] [--huge] [--pack]\n", argv[0]);
            return 2;
        }
    }
    if (rows < 1 || nth < 1 || nth > 64 || samples < 1) {
        fprintf(stderr, "bench_gemv: rows, threads and samples must be >= 1 (threads <= 64)\n");
        return 2;
    }
    bench_check("bench_gemv", hr_set_num_threads(nth), "threads");
    printf("isa %s, %d threads, %zu MiB of weights per shape%s%s\n", hr_cpu_isa_name(hr_cpu_isa_get()), nth,
           mib, huge ? ", huge pages" : "", pack ? ", packed (panels)" : ", in place");
    bool all = !strcmp(model, "all");
    if (all || !strcmp(model, "qwen3"))
        for (size_t i = 0; i < sizeof BENCH_QWEN3 / sizeof *BENCH_QWEN3; i++)
            bench_shape(&BENCH_QWEN3[i], rows, nth, mib << 20, samples, huge, pack);
    if (all || !strcmp(model, "smollm2"))
        for (size_t i = 0; i < sizeof SMOLLM2 / sizeof *SMOLLM2; i++)
            bench_shape(&SMOLLM2[i], rows, nth, mib << 20, samples, huge, pack);
    return 0;
}
