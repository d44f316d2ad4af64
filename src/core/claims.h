/* Work items shared by a pool's tasks: the items split into one segment
 * per task; task t claims segment t's items one at a time from its front,
 * and once it is empty, what is left of the others from their backs. Each
 * task reads its own run of items forward (a weight's panels in memory
 * order, so what it prefetches next is what it reads next), and a task
 * the OS deschedules (the cores are shared) leaves the rest of its run to
 * the others rather than holding up the call. Each segment's bounds sit
 * on a cache line of their own: the tasks claim from their own segments
 * without sharing a line. */
#ifndef HR_CORE_CLAIMS_H
#define HR_CORE_CLAIMS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define HR_CLAIMS_MAX 64 /* segments (tasks) at most */

typedef struct hr_claims {
    struct {
        _Alignas(64) _Atomic uint64_t ends; /* unclaimed items [low 32 bits, high 32 bits) */
    } seg[HR_CLAIMS_MAX];
} hr_claims;

/* items (< 2^32) in segs segments (1..HR_CLAIMS_MAX), as even as
 * hr_split_range makes them. */
void hr_claims_init(hr_claims *c, int64_t items, int segs);

/* The next item of segment s from its front (or back); -1 when none is left. */
int64_t hr_claims_take(hr_claims *c, int s, bool front);

/* Task t's next item of nth segments: its own segment's from the front,
 * then the others' (t + 1, t + 2, ... mod nth) from their backs. *seg
 * starts at 0 and says which of those the item came from (0: t's own,
 * claimed forward); -1 when none is left anywhere. */
int64_t hr_claims_next(hr_claims *c, int t, int nth, int *seg);

#endif
