/* A growing byte buffer for the writers that build a header or an image
 * in memory (safetensors and GGUF headers, the compile cache's files):
 * doubling growth, a sticky out-of-memory flag checked once at the end,
 * and a NUL kept after the bytes so that text built in it is a C string. */
#ifndef HR_CORE_BYTES_H
#define HR_CORE_BYTES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct hr_bytes {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} hr_bytes;

static inline void hr_bytes_put(hr_bytes *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    b->p[b->len] = 0;
}

#endif
