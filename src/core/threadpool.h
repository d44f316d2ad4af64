/* The persistent thread pool. A parallel region runs fn(ctx, ith, nth) on
 * nth threads (the caller is thread 0) and returns when all are done.
 * Workers spin briefly between regions, then sleep. */
#ifndef HR_CORE_THREADPOOL_H
#define HR_CORE_THREADPOOL_H

#include <stdint.h>

typedef void (*hr_parallel_fn)(void *ctx, int ith, int nth);

/* Runs fn on min(nth, pool size) threads; nth <= 0 means all. A call made
 * from inside a region runs serially on the calling thread. */
void hr_parallel_run(hr_parallel_fn fn, void *ctx, int nth);

/* Threads worth using for `work` units when one thread should get at
 * least `min_per_thread` of them. */
int hr_parallel_threads_for(int64_t work, int64_t min_per_thread);

/* [begin, end) of thread ith's share of n items. */
static inline void hr_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

#endif
