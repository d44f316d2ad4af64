/* Persistent thread pool: one region at a time, a generation counter to
 * start it, a countdown to finish it. Workers spin on the generation for a
 * while (so back-to-back ops pay no wake-up), then block on a condvar. */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/error.h"
#include "hubrt/runtime.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Waiting threads pause for a few microseconds, then yield the core on
 * every check (on an oversubscribed machine the thread being waited for may
 * need this very core), and a worker idle for longer sleeps. */
#define SPIN_PAUSES 2048
#define SPIN_ITERS 50000

static void backoff(int spins) {
    if (spins < SPIN_PAUSES)
        CPU_RELAX();
    else
        sched_yield();
}

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    _Alignas(64) atomic_uint generation;
    _Alignas(64) atomic_int pending;
    hr_parallel_fn fn;
    void *ctx;
    int nth;
    int n_workers; /* threads besides the caller */
    unsigned start_generation; /* the generation when the workers were created */
    pthread_t *threads;
    atomic_bool stop;
} pool;

static pool g_pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t g_region_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local bool tl_in_region;
static int g_num_threads;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *worker_main(void *arg) {
    int ith = (int)(intptr_t)arg;
    /* Regions started before this worker existed are not its business. */
    unsigned seen = g_pool.start_generation;
    tl_in_region = true; /* nested regions inside a worker run serially */
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&g_pool.generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                backoff(spins);
                continue;
            }
            pthread_mutex_lock(&g_pool.lock);
            while (atomic_load(&g_pool.generation) == seen && !atomic_load(&g_pool.stop))
                pthread_cond_wait(&g_pool.wake, &g_pool.lock);
            pthread_mutex_unlock(&g_pool.lock);
            spins = 0;
            if (atomic_load(&g_pool.stop)) return NULL;
        }
        seen = gen;
        if (atomic_load(&g_pool.stop)) return NULL;
        if (ith < g_pool.nth) g_pool.fn(g_pool.ctx, ith, g_pool.nth);
        atomic_fetch_sub_explicit(&g_pool.pending, 1, memory_order_acq_rel);
    }
}

static void pool_stop(void) {
    if (!g_pool.threads) return;
    pthread_mutex_lock(&g_pool.lock);
    atomic_store(&g_pool.stop, true);
    atomic_fetch_add(&g_pool.generation, 1);
    pthread_cond_broadcast(&g_pool.wake);
    pthread_mutex_unlock(&g_pool.lock);
    for (int i = 0; i < g_pool.n_workers; i++) pthread_join(g_pool.threads[i], NULL);
    free(g_pool.threads);
    g_pool.threads = NULL;
    g_pool.n_workers = 0;
    atomic_store(&g_pool.stop, false);
}

static void pool_start(int n) {
    g_pool.start_generation = atomic_load(&g_pool.generation);
    g_pool.threads = calloc((size_t)(n > 1 ? n - 1 : 1), sizeof(pthread_t));
    int started = 0;
    for (int i = 1; g_pool.threads && i < n; i++) {
        if (pthread_create(&g_pool.threads[i - 1], NULL, worker_main, (void *)(intptr_t)i)) break;
        started++;
    }
    g_pool.n_workers = started;
    g_num_threads = started + 1;
    if (g_num_threads < n) hr_log(HR_LOG_WARN, "thread pool: started %d of %d threads", g_num_threads, n);
}

static void init_once(void) {
    int n = hr_cpu_features_get()->logical_cpus;
    const char *env = getenv("HUBRT_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 1 || v > 1024)
            hr_log(HR_LOG_WARN, "HUBRT_NUM_THREADS='%s' is not a number in 1..1024; using %d", env, n);
        else
            n = (int)v;
    }
    pool_start(n);
    atexit(pool_stop);
}

int hr_num_threads(void) {
    pthread_once(&g_once, init_once);
    return g_num_threads;
}

hr_status hr_set_num_threads(int n) {
    if (n < 1 || n > 1024) return hr_error(HR_ERR_INVALID_ARG, "thread count %d outside 1..1024", n);
    pthread_once(&g_once, init_once);
    pthread_mutex_lock(&g_region_lock);
    pool_stop();
    pool_start(n);
    pthread_mutex_unlock(&g_region_lock);
    return HR_OK;
}

int hr_parallel_threads_for(int64_t work, int64_t min_per_thread) {
    int n = hr_num_threads();
    if (min_per_thread < 1) min_per_thread = 1;
    int64_t want = work / min_per_thread;
    if (want < 1) want = 1;
    return want < n ? (int)want : n;
}

void hr_parallel_run(hr_parallel_fn fn, void *ctx, int nth) {
    int total = hr_num_threads();
    if (nth <= 0 || nth > total) nth = total;
    if (nth == 1 || tl_in_region || pthread_mutex_trylock(&g_region_lock) != 0) {
        /* Nested or concurrent regions run serially rather than deadlock. */
        fn(ctx, 0, 1);
        return;
    }
    g_pool.fn = fn;
    g_pool.ctx = ctx;
    g_pool.nth = nth;
    atomic_store_explicit(&g_pool.pending, g_pool.n_workers, memory_order_relaxed);
    pthread_mutex_lock(&g_pool.lock);
    atomic_fetch_add_explicit(&g_pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&g_pool.wake);
    pthread_mutex_unlock(&g_pool.lock);
    tl_in_region = true;
    fn(ctx, 0, nth);
    tl_in_region = false;
    for (int spins = 0; atomic_load_explicit(&g_pool.pending, memory_order_acquire) > 0; spins++) backoff(spins);
    pthread_mutex_unlock(&g_region_lock);
}
