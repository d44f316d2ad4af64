/* Per-op time accounting behind HUBRT_PROFILE. */
#include "ops/profile.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_enabled;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static double g_seconds[HR_OP_COUNT];
static long long g_calls[HR_OP_COUNT];
static double g_dispatch_seconds;
static long long g_dispatch_calls;

static void report(void) {
    int order[HR_OP_COUNT];
    double total = 0;
    for (int i = 0; i < HR_OP_COUNT; i++) order[i] = i, total += g_seconds[i];
    for (int i = 1; i < HR_OP_COUNT; i++)
        for (int j = i; j > 0 && g_seconds[order[j]] > g_seconds[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    fprintf(stderr, "hubrt profile: %.3f s in ops\n%-14s %10s %10s %8s %6s\n", total, "op", "calls", "total ms",
            "us/call", "share");
    for (int i = 0; i < HR_OP_COUNT && g_calls[order[i]]; i++) {
        int op = order[i];
        fprintf(stderr, "%-14s %10lld %10.1f %8.1f %5.1f%%\n", hr_op_name((hr_op)op), g_calls[op],
                g_seconds[op] * 1e3, g_seconds[op] * 1e6 / (double)g_calls[op],
                total > 0 ? 100 * g_seconds[op] / total : 0);
    }
    if (g_dispatch_calls)
        fprintf(stderr, "eager dispatch outside the kernels: %.1f ms over %lld ops, %.2f us per op\n",
                g_dispatch_seconds * 1e3, g_dispatch_calls, g_dispatch_seconds * 1e6 / (double)g_dispatch_calls);
}

static void init(void) {
    const char *s = getenv("HUBRT_PROFILE");
    g_enabled = s && *s && strcmp(s, "0");
    if (g_enabled) atexit(report);
}

bool hr_profile_enabled(void) {
    pthread_once(&g_once, init);
    return g_enabled;
}

double hr_profile_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hr_profile_add(hr_op op, double seconds) {
    pthread_mutex_lock(&g_lock);
    g_seconds[op] += seconds;
    g_calls[op]++;
    pthread_mutex_unlock(&g_lock);
}

void hr_profile_add_dispatch(double seconds) {
    pthread_mutex_lock(&g_lock);
    g_dispatch_seconds += seconds;
    g_dispatch_calls++;
    pthread_mutex_unlock(&g_lock);
}
