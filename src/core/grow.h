/* Doubling arrays: the one growth rule the graph layer's lists share. */
#ifndef HR_CORE_GROW_H
#define HR_CORE_GROW_H

#include <stddef.h>
#include <stdlib.h>

/* `arr` (n elements of `elem` bytes in room for *cap) with room for one
 * more: unchanged while n < *cap, else reallocated to twice *cap (`first`
 * when empty). NULL on out of memory, with arr and *cap left as they were. */
static inline void *hr_grow(void *arr, int n, int *cap, size_t elem, int first) {
    if (n < *cap) return arr;
    int nc = *cap ? 2 * *cap : first;
    void *p = realloc(arr, elem * (size_t)nc);
    if (p) *cap = nc;
    return p;
}

#endif
