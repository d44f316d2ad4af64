/* libFuzzer target: safetensors header parsing from memory. A header that
 * validates must describe byte ranges inside the input: reading every
 * tensor's bytes lets ASan prove it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/st_internal.h"
#include "fuzz_limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_header h;
    if (hr_st_parse("fuzz.safetensors", data, size, &h) != HR_OK) {
        if (!hr_last_error()[0]) abort(); /* every failure carries a message */
        return 0;
    }
    unsigned sum = 0;
    for (size_t i = 0; i < h.n; i++) {
        const st_entry *e = &h.entries[i];
        if (hr_st_find(&h, e->name) != (long)i) abort();
        const uint8_t *p = data + h.data_start + e->begin;
        for (uint64_t k = 0; k < e->end - e->begin; k++) sum += p[k];
    }
    for (size_t i = 0; i < h.n_meta; i++) sum += (unsigned)strlen(h.meta[i].value);
    hr_st_header_free(&h);
    return sum == 0xFFFFFFFFu; /* keeps the reads from being optimised away */
}
