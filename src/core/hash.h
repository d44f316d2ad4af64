/* FNV-1a, 64-bit: the one hash of cache keys, graph fingerprints and
 * checksums (not cryptographic; it detects accidents, not attacks). */
#ifndef HR_CORE_HASH_H
#define HR_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define HR_FNV_OFFSET 0xcbf29ce484222325ull

static inline uint64_t hr_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#endif
