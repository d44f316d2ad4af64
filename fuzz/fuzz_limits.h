/* The memory budget every fuzz target runs under: hubrt's own allocation
 * ceiling (core/mem_budget.h), which aborts, so that an input making a
 * loader ask for memory by a number it claims is a finding, even where the
 * memory is an anonymous map that libFuzzer's -malloc_limit_mb does not
 * see. scripts/run_fuzzers.sh adds -rss_limit_mb and a per-input timeout. */
#ifndef HR_FUZZ_LIMITS_H
#define HR_FUZZ_LIMITS_H

#include "core/mem_budget.h"

#define HR_FUZZ_MEMORY_CEILING ((size_t)256 << 20)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    hr_mem_set_limit(HR_FUZZ_MEMORY_CEILING, true);
    return 0;
}

#endif
