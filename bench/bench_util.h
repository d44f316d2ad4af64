/* Helpers shared by the C micro-benchmarks (bench/bench_*.c): a monotonic
 * clock, a comparator for sorting samples, exit-on-error for hubrt
 * calls, cold weights, a plain read of memory and the Qwen3 linear shapes. Each benchmark is its
 * own executable, so these are static. */
#ifndef HUBRT_BENCH_UTIL_H
#define HUBRT_BENCH_UTIL_H

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "hubrt.h"

static inline double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A linear's weight [n, k] at a model's shapes. */
typedef struct bench_linear_shape {
    const char *name;
    int64_t n, k;
} bench_linear_shape;

/* The Qwen3-0.6B linears (bench_gemv, bench_gemm). */
static const bench_linear_shape BENCH_QWEN3[] = {
    {"qwen3 q_proj", 2048, 1024},  {"qwen3 k/v_proj", 1024, 1024}, {"qwen3 o_proj", 1024, 2048},
    {"qwen3 gate/up", 3072, 1024}, {"qwen3 down", 1024, 3072},     {"qwen3 lm_head", 151936, 1024},
};

/* qsort comparator: ascending doubles. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Exits with `prog: what: hubrt's message` unless s is HR_OK. */
static inline void bench_check(const char *prog, hr_status s, const char *what) {
    if (s != HR_OK) {
        fprintf(stderr, "%s: %s: %s\n", prog, what, hr_last_error());
        exit(1);
    }
}

/* `count` distinct bf16 weights [n, k], together at least `total` bytes
 * (count >= 1), so that cycling through them reads from memory as a model
 * step does: one anonymous mapping (*buf, *bytes; munmap it after freeing
 * the tensors), huge pages when `huge`, filled with small random values
 * (exponent near 1) so sums stay finite. Returns the calloc'd tensors. */
static inline hr_tensor **bench_weights(const char *prog, int64_t n, int64_t k, size_t total, bool huge,
                                        size_t *count, char **buf, size_t *bytes) {
    size_t wbytes = (size_t)(n * k) * 2;
    *count = (total + wbytes - 1) / wbytes;
    *bytes = *count * wbytes;
    *buf = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*buf == MAP_FAILED) {
        fprintf(stderr, "%s: cannot map %zu bytes\n", prog, *bytes);
        exit(1);
    }
    if (huge) madvise(*buf, *bytes, MADV_HUGEPAGE);
    uint32_t seed = 12345u;
    for (size_t i = 0; i < *bytes / 2; i++) {
        seed = seed * 1664525u + 1013904223u;
        ((uint16_t *)*buf)[i] = (uint16_t)(0x3c00u | (seed >> 25));
    }
    int64_t shape[2] = {n, k};
    hr_tensor **w = calloc(*count, sizeof *w);
    for (size_t i = 0; i < *count; i++)
        bench_check(prog, hr_tensor_wrap_host(HR_BF16, 2, shape, NULL, *buf + i * wbytes, wbytes, NULL, NULL, &w[i]),
                    "wrap weight");
    return w;
}

/* ---- plain read: each thread sums its contiguous share with 64-byte loads;
 * GB/s of n bytes read by nth threads (the bound a streaming kernel meets) ---- */

typedef struct bench_read_arg {
    const char *p;
    size_t n;
    uint64_t sink;
} bench_read_arg;

static inline void *bench_read_share(void *arg) {
    bench_read_arg *a = arg;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 128 <= a->n; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(a->p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(a->p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(a->p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(a->p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    a->sink = (uint64_t)_mm256_extract_epi64(s, 0) + (uint64_t)_mm256_extract_epi64(s, 3);
    return NULL;
}

static inline double bench_read_pass(const char *p, size_t n, int nth) {
    pthread_t th[64];
    bench_read_arg args[64];
    size_t share = (n / (size_t)nth) & ~(size_t)127;
    double t0 = bench_now_s();
    for (int i = 0; i < nth; i++) {
        args[i] = (bench_read_arg){p + (size_t)i * share, share, 0};
        if (i > 0) pthread_create(&th[i], NULL, bench_read_share, &args[i]);
    }
    bench_read_share(&args[0]);
    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
    double dt = bench_now_s() - t0;
    /* the sums, so that the loads are not optimised away */
    static volatile uint64_t sink;
    for (int i = 0; i < nth; i++) sink = sink + args[i].sink;
    return (double)(share * (size_t)nth) / dt / 1e9;
}

#endif
