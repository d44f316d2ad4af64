/* The persistent thread pool. A parallel region runs the tasks
 * fn(ctx, ith, nth) for ith in [0, nth) on the pool's threads (the caller
 * among them) and returns when all are done. Any thread may run any task,
 * and one thread may run several, one after another: a task must not wait
 * for another task of its region. Workers spin briefly between regions,
 * then sleep. */
#ifndef HR_CORE_THREADPOOL_H
#define HR_CORE_THREADPOOL_H

#include <stdint.h>

typedef void (*hr_parallel_fn)(void *ctx, int ith, int nth);

/* Runs nth tasks (nth <= 0: one per thread of the pool; at most 65535).
 * More tasks than threads balance uneven or interrupted work at the cost
 * of one atomic claim per task. A call made from inside a region runs its
 * tasks serially on the calling thread. */
void hr_parallel_run(hr_parallel_fn fn, void *ctx, int nth);

/* Work per thread (hr_parallel_threads_for's min_per_thread) of the CPU
 * kernel families; the compile path's threading plan (graph/plan_threads.c)
 * reads the same names, so its counts are the kernels' own. */
#define HR_GRAIN_ELTWISE 32768    /* elements: eltwise, reductions, copies, gathers */
#define HR_GRAIN_ROWS 16384       /* elements of row ops: norms, rope, topk */
#define HR_GRAIN_COS_SIN 2048     /* (position, frequency) pairs of rope_cos_sin */
#define HR_GRAIN_MATMUL (1 << 16) /* multiply-adds: GEMV, GEMM, attention */

/* Threads worth using for `work` units when one thread should get at
 * least `min_per_thread` of them; never more than the planned count. */
int hr_parallel_threads_for(int64_t work, int64_t min_per_thread);

/* The calling thread's planned thread count, set by a compiled plan around
 * each node it replays (0: none). While it is 1, every region of this
 * thread runs its tasks serially on it, the pool untouched; above 1 it
 * caps hr_parallel_threads_for. Task counts, and so results, are the
 * kernel's own either way. */
void hr_parallel_plan_set(int nth);

/* [begin, end) of thread ith's share of n items. */
static inline void hr_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

#endif
