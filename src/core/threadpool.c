/* Persistent thread pool. A region is a list of nth tasks that any thread
 * of the pool may claim: one atomic word holds (region sequence, task
 * count, next task), and a thread owns a task once its compare-exchange on
 * that word succeeds. The caller claims tasks too, so a region never waits
 * for a worker that has not started: on a loaded machine a descheduled
 * worker costs the region nothing unless it already holds a task, and on a
 * quiet one the spinning workers claim their tasks within a cache-line
 * transfer. Idle workers spin, then yield, then sleep on a condvar. */
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

/* A waiting thread pauses for about 6 us (a pause is ~25 ns on the Zen 4
 * this was tuned on), which covers the gap of a small serial op between
 * two parallel ones, then yields the core on every check: on a loaded
 * machine the scheduler often puts both threads on one core, and a thread
 * pausing there only delays the one it waits for. An idle worker sleeps
 * after about a millisecond of yields. */
#define SPIN_PAUSES 256
#define SPIN_YIELDS 1024

/* The claim word: region sequence in the high 32 bits, task count in bits
 * 16..31, next unclaimed task in bits 0..15. */
#define TASK_BITS 16
#define TASK_MASK ((1u << TASK_BITS) - 1)
#define MAX_TASKS ((int)TASK_MASK)

static inline uint64_t claim_word(uint32_t seq, int ntasks, int next) {
    return (uint64_t)seq << 32 | (uint64_t)(unsigned)ntasks << TASK_BITS | (unsigned)next;
}
static inline uint32_t word_seq(uint64_t w) { return (uint32_t)(w >> 32); }
static inline int word_tasks(uint64_t w) { return (int)((w >> TASK_BITS) & TASK_MASK); }
static inline int word_next(uint64_t w) { return (int)(w & TASK_MASK); }

static void backoff(int spins) {
    if (spins < SPIN_PAUSES)
        CPU_RELAX();
    else
        sched_yield();
}

typedef struct {
    _Alignas(64) _Atomic uint64_t claim;
    _Alignas(64) atomic_int done; /* tasks of the current region finished */
    _Alignas(64) atomic_int sleepers;
    hr_parallel_fn fn; /* written by the caller before it publishes claim */
    void *ctx;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int n_workers; /* threads besides the caller */
    pthread_t *threads;
    atomic_bool stop;
} pool;

static pool g_pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t g_region_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local bool tl_in_region;
static _Thread_local int tl_planned; /* hr_parallel_plan_set; 0: none */
static int g_num_threads;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Claims and runs tasks of the region `w` was read from until none is
 * left (or the word moved on to another region). */
static void run_tasks(uint64_t w) {
    for (;;) {
        int nt = word_tasks(w), i = word_next(w);
        if (i >= nt) return;
        if (!atomic_compare_exchange_weak_explicit(&g_pool.claim, &w, w + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* w now holds the current word */
        /* Holding a task keeps the region open, so fn and ctx are still its own. */
        g_pool.fn(g_pool.ctx, i, nt);
        atomic_fetch_add_explicit(&g_pool.done, 1, memory_order_release);
        w = atomic_load_explicit(&g_pool.claim, memory_order_acquire);
    }
}

/* Waits until the claim word leaves `seen`'s region; false when stopping. */
static bool wait_region(uint32_t seen, uint64_t *w) {
    for (int spins = 0;; spins++) {
        *w = atomic_load_explicit(&g_pool.claim, memory_order_acquire);
        if (atomic_load_explicit(&g_pool.stop, memory_order_relaxed)) return false;
        if (word_seq(*w) != seen) return true;
        if (spins < SPIN_PAUSES + SPIN_YIELDS) {
            backoff(spins);
            continue;
        }
        /* Sleep. The sleeper count and the claim word are both seq_cst, so
         * either the caller sees a sleeper and broadcasts under the lock, or
         * this thread sees the new word before it waits. */
        pthread_mutex_lock(&g_pool.lock);
        atomic_fetch_add(&g_pool.sleepers, 1);
        while (word_seq(atomic_load(&g_pool.claim)) == seen && !atomic_load(&g_pool.stop))
            pthread_cond_wait(&g_pool.wake, &g_pool.lock);
        atomic_fetch_sub(&g_pool.sleepers, 1);
        pthread_mutex_unlock(&g_pool.lock);
        spins = 0;
    }
}

static void *worker_main(void *arg) {
    /* Regions started before this worker existed are not its business. */
    uint32_t seen = word_seq(atomic_load(&g_pool.claim));
    tl_in_region = true; /* nested regions inside a worker run serially */
    (void)arg;
    uint64_t w;
    while (wait_region(seen, &w)) {
        seen = word_seq(w);
        run_tasks(w);
    }
    return NULL;
}

static void pool_stop(void) {
    if (!g_pool.threads) return;
    pthread_mutex_lock(&g_pool.lock);
    atomic_store(&g_pool.stop, true);
    pthread_cond_broadcast(&g_pool.wake);
    pthread_mutex_unlock(&g_pool.lock);
    for (int i = 0; i < g_pool.n_workers; i++) pthread_join(g_pool.threads[i], NULL);
    free(g_pool.threads);
    g_pool.threads = NULL;
    g_pool.n_workers = 0;
    atomic_store(&g_pool.stop, false);
}

static void pool_start(int n) {
    g_pool.threads = calloc((size_t)(n > 1 ? n - 1 : 1), sizeof(pthread_t));
    int started = 0;
    for (int i = 1; g_pool.threads && i < n; i++) {
        if (pthread_create(&g_pool.threads[i - 1], NULL, worker_main, NULL)) break;
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

void hr_parallel_plan_set(int nth) { tl_planned = nth > 0 ? nth : 0; }

int hr_parallel_threads_for(int64_t work, int64_t min_per_thread) {
    int n = hr_num_threads();
    if (tl_planned && tl_planned < n) n = tl_planned;
    if (min_per_thread < 1) min_per_thread = 1;
    int64_t want = work / min_per_thread;
    if (want < 1) want = 1;
    return want < n ? (int)want : n;
}

void hr_parallel_run(hr_parallel_fn fn, void *ctx, int nth) {
    int total = hr_num_threads();
    if (nth <= 0) nth = total;
    if (nth > MAX_TASKS) nth = MAX_TASKS;
    if (nth == 1 || total == 1 || tl_planned == 1 || tl_in_region || pthread_mutex_trylock(&g_region_lock) != 0) {
        /* Nested or concurrent regions run serially rather than deadlock. */
        for (int i = 0; i < nth; i++) fn(ctx, i, nth);
        return;
    }
    g_pool.fn = fn;
    g_pool.ctx = ctx;
    atomic_store_explicit(&g_pool.done, 0, memory_order_relaxed);
    uint32_t seq = word_seq(atomic_load_explicit(&g_pool.claim, memory_order_relaxed)) + 1;
    if (seq == 0) seq = 1; /* 0 marks no region: workers start from it */
    uint64_t w = claim_word(seq, nth, 0);
    atomic_store(&g_pool.claim, w);
    if (atomic_load(&g_pool.sleepers) > 0) {
        pthread_mutex_lock(&g_pool.lock);
        pthread_cond_broadcast(&g_pool.wake);
        pthread_mutex_unlock(&g_pool.lock);
    }
    tl_in_region = true;
    run_tasks(w);
    tl_in_region = false;
    for (int spins = 0; atomic_load_explicit(&g_pool.done, memory_order_acquire) < nth; spins++) backoff(spins);
    pthread_mutex_unlock(&g_region_lock);
}
