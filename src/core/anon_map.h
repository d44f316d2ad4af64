/* Anonymous memory mapped at an aligned address: the CPU device's large
 * buffers and the model weights' copy sit on huge page boundaries, so that
 * every page of them can be a huge one. */
#ifndef HR_CORE_ANON_MAP_H
#define HR_CORE_ANON_MAP_H

#include <stddef.h>

/* len bytes (a multiple of the page size) of zero-filled anonymous memory
 * starting at a multiple of align (a power of two, at least the page
 * size); NULL when the map fails. Release with munmap(p, len). */
void *hr_anon_map_aligned(size_t len, size_t align);

#define HR_HUGE_PAGE ((size_t)2 << 20)
/* len bytes (a multiple of HR_HUGE_PAGE) on a huge page boundary, advised
 * MADV_HUGEPAGE, for memory streamed on every call (model weights): every
 * page of it can be a huge one. Without THP it works the same, just in
 * small pages. NULL when the map fails; release with munmap(p, len). */
void *hr_anon_map_huge(size_t len);

#endif
