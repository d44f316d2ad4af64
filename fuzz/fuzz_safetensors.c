/* libFuzzer target: safetensors header parsing from memory, and the same
 * bytes as a file opened by ranges (what a tensor-parallel rank reads). A
 * header that validates must describe byte ranges inside the input:
 * reading every tensor's bytes, and slices of every dim, lets ASan prove
 * it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/st_internal.h"
#include "fuzz_limits.h"

/* The input as a file (a memfd), opened by ranges: every tensor whole and
 * a middle slice of each dim, read through. */
static unsigned ranged(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0) return 0;
    unsigned sum = 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    hr_safetensors *st = NULL;
    if (write(fd, data, size) == (ssize_t)size && hr_safetensors_open_ranged(path, &st) == HR_OK) {
        for (size_t i = 0; i < hr_safetensors_count(st); i++) {
            const char *name = hr_safetensors_name(st, i);
            hr_tensor_info info;
            hr_tensor *t = NULL;
            if (hr_safetensors_info(st, name, &info) != HR_OK) abort();
            if (hr_safetensors_tensor(st, name, &t) == HR_OK) {
                const uint8_t *p = hr_tensor_data(t);
                for (size_t k = 0; k < hr_tensor_nbytes(t); k++) sum += p[k];
                hr_tensor_free(t);
            } else if (!hr_last_error()[0]) {
                abort();
            }
            for (int d = 0; d < info.ndim; d++) {
                int64_t n = info.shape[d];
                if (hr_safetensors_rows(st, name, d, n / 3, n - n / 3 - n / 4, &t) != HR_OK) continue;
                const uint8_t *p = hr_tensor_data(t);
                for (size_t k = 0; k < hr_tensor_nbytes(t); k++) sum += p[k];
                hr_tensor_free(t);
            }
        }
        hr_safetensors_close(st);
    } else if (!hr_last_error()[0]) {
        abort();
    }
    close(fd);
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_header h;
    if (hr_st_parse("fuzz.safetensors", data, size, &h) != HR_OK) {
        if (!hr_last_error()[0]) abort(); /* every failure carries a message */
        return (int)(ranged(data, size) == 0xFFFFFFFFu);
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
    sum += ranged(data, size);
    return sum == 0xFFFFFFFFu; /* keeps the reads from being optimised away */
}
