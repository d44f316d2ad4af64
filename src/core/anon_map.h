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

#endif
