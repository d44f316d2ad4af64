/* hubrt's own allocation ceiling. malloc-level limits (ulimit -v,
 * libFuzzer's -malloc_limit_mb) do not see the anonymous maps that hold
 * hubrt's large buffers and weight copies, and RSS limits only see pages
 * once touched; this counts what hubrt asks for, before it asks.
 *
 * Counted while live: device buffers on the CPU and the anonymous maps of
 * weight copies and packed weights. Checked one by one against what
 * remains (not kept in the count): loader tables sized by a file's counts
 * (GGUF metadata and tensor lists, safetensors headers, vocabularies).
 * Files mapped read-only are not counted: they are bounded by what the file
 * really holds.
 *
 * The ceiling is HUBRT_MAX_MEMORY (bytes, or with a K, M, G or T suffix,
 * powers of 1024), read once; unset or 0: no ceiling. */
#ifndef HR_CORE_MEM_BUDGET_H
#define HR_CORE_MEM_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

#include "hubrt/base.h"

/* Counts `bytes` for `what`; HR_ERR_OOM naming it and the ceiling (and
 * nothing counted) when that would pass the ceiling. */
hr_status hr_mem_reserve(size_t bytes, const char *what);
void hr_mem_release(size_t bytes);
/* One allocation of `bytes` for `what` against what remains, not counted. */
hr_status hr_mem_check(size_t bytes, const char *what);
/* Bytes counted now, and the most ever counted at once. */
size_t hr_mem_in_use(void);
size_t hr_mem_peak(void);
/* Replaces the ceiling (0: none). With abort_on_exceed, passing it aborts
 * after printing what asked: the fuzz targets' way of making an input that
 * allocates by a claimed size a finding. */
void hr_mem_set_limit(size_t bytes, bool abort_on_exceed);

#endif
