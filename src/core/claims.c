#include "core/claims.h"

#include "core/threadpool.h"

void hr_claims_init(hr_claims *c, int64_t items, int segs) {
    for (int s = 0; s < segs; s++) {
        int64_t b, e;
        hr_split_range(items, s, segs, &b, &e);
        atomic_init(&c->seg[s].ends, (uint64_t)e << 32 | (uint64_t)b);
    }
}

int64_t hr_claims_take(hr_claims *c, int s, bool front) {
    _Atomic uint64_t *ends = &c->seg[s].ends;
    uint64_t e = atomic_load_explicit(ends, memory_order_relaxed);
    for (;;) {
        uint32_t lo = (uint32_t)e, hi = (uint32_t)(e >> 32);
        if (lo >= hi) return -1;
        uint64_t next = front ? (uint64_t)hi << 32 | (lo + 1) : (uint64_t)(hi - 1) << 32 | lo;
        if (atomic_compare_exchange_weak_explicit(ends, &e, next, memory_order_relaxed, memory_order_relaxed))
            return front ? lo : hi - 1;
    }
}

int64_t hr_claims_next(hr_claims *c, int t, int nth, int *seg) {
    for (; *seg < nth; ++*seg) {
        int64_t i = hr_claims_take(c, (t + *seg) % nth, *seg == 0);
        if (i >= 0) return i;
    }
    return -1;
}
