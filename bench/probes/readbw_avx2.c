/* DRAM read bandwidth with AVX2 loads: the probe for CPUs without
 * AVX-512, the same method and output as ../shared/tools/limits/readbw.c
 * (which is AVX-512 only): a buffer of the given MiB (2 MiB aligned,
 * MADV_HUGEPAGE with HUGE=1), written once, then read by all OpenMP
 * threads, each its static share, into eight independent sums; nine timed
 * passes, the first dropped. Run: [HUGE=1] OMP_NUM_THREADS=T ./readbw_avx2 1024 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024, n = mib * 1048576 / 8;
    double *b;
    if (!mib || posix_memalign((void **)&b, 2097152, n * 8)) return 1;
    const char *huge = getenv("HUGE");
    if (huge && atoi(huge)) madvise(b, n * 8, MADV_HUGEPAGE);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) b[i] = 1.0;
    enum { PASSES = 9 };
    double v[PASSES];
    volatile double sink = 0;
    for (int k = 0; k < PASSES; k++) {
        double t0 = omp_get_wtime(), tot = 0;
#pragma omp parallel reduction(+ : tot)
        {
            __m256d s[8];
            for (int j = 0; j < 8; j++) s[j] = _mm256_setzero_pd();
#pragma omp for schedule(static)
            for (size_t i = 0; i < n; i += 32)
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) s[j] = _mm256_add_pd(s[j], _mm256_load_pd(b + i + 4 * j));
            __m256d t = _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(s[0], s[1]), _mm256_add_pd(s[2], s[3])),
                                      _mm256_add_pd(_mm256_add_pd(s[4], s[5]), _mm256_add_pd(s[6], s[7])));
            double o[4];
            _mm256_storeu_pd(o, t);
            tot += o[0] + o[1] + o[2] + o[3];
        }
        v[k] = (double)n * 8 / (omp_get_wtime() - t0) / 1e9;
        sink += tot;
    }
    qsort(v + 1, PASSES - 1, sizeof v[0], cmp);
    printf("huge=%s threads=%d size=%5zu MiB read GB/s: min %.2f median %.2f max %.2f\n", huge ? huge : "0",
           omp_get_max_threads(), mib, v[1], v[1 + (PASSES - 1) / 2], v[PASSES - 1]);
    free(b);
    return 0;
}
