/* The allocation ceiling (core/mem_budget.h): one atomic counter. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/mem_budget.h"

static _Atomic size_t g_in_use, g_peak, g_limit;
static atomic_bool g_abort;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
    const char *s = getenv("HUBRT_MAX_MEMORY");
    if (!s || !*s) return;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    switch (end && *end ? *end : 0) {
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    case 'T': case 't': shift = 40; break;
    case 0: break;
    default:
        HR_LOG_WARN("HUBRT_MAX_MEMORY='%s' is not a size (bytes, or with K, M, G or T); no ceiling", s);
        return;
    }
    if (shift && v > (~0ull >> shift)) v = ~0ull >> shift;
    atomic_store(&g_limit, (size_t)(v << shift));
}

static size_t limit(void) {
    pthread_once(&g_once, read_env);
    return atomic_load_explicit(&g_limit, memory_order_relaxed);
}

static hr_status exceeded(size_t bytes, const char *what, size_t lim) {
    size_t used = atomic_load(&g_in_use);
    if (atomic_load(&g_abort)) {
        fprintf(stderr, "hubrt: %s: %zu bytes would pass the allocation ceiling of %zu (%zu in use)\n", what, bytes,
                lim, used);
        abort();
    }
    return hr_error(HR_ERR_OOM, "%s: %zu bytes would pass HUBRT_MAX_MEMORY (%zu bytes; %zu in use)", what, bytes, lim,
                    used);
}

hr_status hr_mem_reserve(size_t bytes, const char *what) {
    size_t lim = limit(), cur = atomic_load(&g_in_use), next;
    do {
        if (lim && (bytes > lim || cur > lim - bytes)) return exceeded(bytes, what, lim);
        next = cur + bytes;
    } while (!atomic_compare_exchange_weak(&g_in_use, &cur, next));
    for (size_t p = atomic_load(&g_peak); next > p && !atomic_compare_exchange_weak(&g_peak, &p, next);) {
    }
    return HR_OK;
}

void hr_mem_release(size_t bytes) { atomic_fetch_sub(&g_in_use, bytes); }

hr_status hr_mem_check(size_t bytes, const char *what) {
    size_t lim = limit(), cur = atomic_load(&g_in_use);
    if (lim && (bytes > lim || cur > lim - bytes)) return exceeded(bytes, what, lim);
    return HR_OK;
}

size_t hr_mem_in_use(void) { return atomic_load(&g_in_use); }
size_t hr_mem_peak(void) { return atomic_load(&g_peak); }

void hr_mem_set_limit(size_t bytes, bool abort_on_exceed) {
    pthread_once(&g_once, read_env);
    atomic_store(&g_limit, bytes);
    atomic_store(&g_abort, abort_on_exceed);
}
