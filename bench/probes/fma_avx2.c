/* f32 FMA throughput on AVX2 (ymm): the compute peak of CPUs without
 * AVX512_BF16 or AMX, where hubrt's kernels widen bf16 to f32 and use FMA.
 * Twelve independent accumulators cover FMA latency x two pipes. One
 * thread; limits.py runs one copy per core at once. Prints the median of
 * five timed runs after a warm-up: "avx2 fp32 fma: median X GFLOP/s". */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 50000000L
#define ACC 12

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double gflops(void) {
    __m256 a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(0.9999999f), c[ACC];
    for (int i = 0; i < ACC; i++) c[i] = _mm256_set1_ps(0.1f * (float)(i + 1));
    double t0 = now();
    for (long it = 0; it < ITERS; it++) {
        __asm__ volatile("" : "+x"(a), "+x"(b));
#pragma GCC unroll 12
        for (int i = 0; i < ACC; i++) c[i] = _mm256_fmadd_ps(a, b, c[i]);
    }
    double t = now() - t0;
    __m256 s = c[0];
    for (int i = 1; i < ACC; i++) s = _mm256_add_ps(s, c[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    volatile float sink = out[0];
    (void)sink;
    return (double)ITERS * ACC * 8 * 2 / t / 1e9;
}

int main(void) {
    double v[6];
    for (int r = 0; r < 6; r++) v[r] = gflops();
    qsort(v + 1, 5, sizeof v[0], cmp); /* the first run ramps the clock */
    printf("avx2 fp32 fma: median %.1f GFLOP/s\n", v[3]);
    return 0;
}
