/* Open-addressing hash maps for the tokenizer: string -> int32 (vocabularies,
 * caches) and uint64 -> uint64 (BPE merge pairs). Linear probing, power-of-two
 * capacity, load factor <= 1/2; keys are never removed, only the whole map is
 * cleared. Keys of tk_strmap are not copied: the caller keeps them alive. */
#ifndef HR_TOKENIZER_TK_MAP_H
#define HR_TOKENIZER_TK_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "hubrt/base.h"

typedef struct {
    const char *key;
    uint32_t len;
    uint32_t hash;
    int32_t val;
} tk_strmap_slot;

typedef struct {
    tk_strmap_slot *slots; /* (cap) */
    size_t cap, n;
} tk_strmap;

uint64_t tk_hash_bytes(const void *p, size_t n);

hr_status tk_strmap_init(tk_strmap *m, size_t expected);
void tk_strmap_free(tk_strmap *m);
void tk_strmap_clear(tk_strmap *m);
/* Inserts or overwrites; `key` must outlive the map. */
hr_status tk_strmap_put(tk_strmap *m, const char *key, size_t len, int32_t val);
/* Returns the value or -1 when absent. */
int32_t tk_strmap_get(const tk_strmap *m, const char *key, size_t len);

typedef struct {
    uint64_t key; /* UINT64_MAX marks an empty slot */
    uint64_t val;
} tk_u64map_slot;

typedef struct {
    tk_u64map_slot *slots; /* (cap): key and value side by side, one cache miss a probe */
    size_t cap, n;
} tk_u64map;

hr_status tk_u64map_init(tk_u64map *m, size_t expected);
void tk_u64map_free(tk_u64map *m);
hr_status tk_u64map_put(tk_u64map *m, uint64_t key, uint64_t val);
/* Returns 1 and sets *val when present, 0 otherwise. */
int tk_u64map_get(const tk_u64map *m, uint64_t key, uint64_t *val);

#endif
