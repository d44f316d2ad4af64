#include "core/anon_map.h"

#include <stdint.h>
#include <sys/mman.h>

void *hr_anon_map_aligned(size_t len, size_t align) {
    /* map align bytes more, then unmap the slack on either side */
    char *raw = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    munmap(p + len, (size_t)(raw + align - p));
    return p;
}

void *hr_anon_map_huge(size_t len) {
    void *p = hr_anon_map_aligned(len, HR_HUGE_PAGE);
    if (p) madvise(p, len, MADV_HUGEPAGE);
    return p;
}
