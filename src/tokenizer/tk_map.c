/* Open-addressing hash maps (see tk_map.h). */
#include "tokenizer/tk_map.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t tk_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0x100000001b3ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ mix64(w)) * 0x9fb21c651e98df25ULL;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ mix64(w ^ n)) * 0x9fb21c651e98df25ULL;
    return mix64(h);
}

static size_t cap_for(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 2) cap <<= 1;
    return cap;
}

hr_status tk_strmap_init(tk_strmap *m, size_t expected) {
    m->cap = cap_for(expected);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    if (!m->slots) return hr_error(HR_ERR_OOM, "tokenizer: out of memory for a hash map of %zu entries", expected);
    return HR_OK;
}

void tk_strmap_free(tk_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

void tk_strmap_clear(tk_strmap *m) {
    memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->n = 0;
}

static void strmap_insert_slot(tk_strmap_slot *slots, size_t cap, tk_strmap_slot s) {
    size_t i = s.hash & (cap - 1);
    while (slots[i].key) i = (i + 1) & (cap - 1);
    slots[i] = s;
}

static hr_status strmap_grow(tk_strmap *m) {
    size_t cap = m->cap * 2;
    tk_strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return hr_error(HR_ERR_OOM, "tokenizer: out of memory growing a hash map");
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key) strmap_insert_slot(slots, cap, m->slots[i]);
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return HR_OK;
}

hr_status tk_strmap_put(tk_strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) HR_TRY(strmap_grow(m));
    /* An empty key still needs a non-NULL pointer to mark the slot used. */
    if (!key) key = "";
    uint32_t h = (uint32_t)tk_hash_bytes(key, len);
    size_t i = h & (m->cap - 1);
    while (m->slots[i].key) {
        tk_strmap_slot *s = &m->slots[i];
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) {
            s->val = val;
            return HR_OK;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->slots[i] = (tk_strmap_slot){key, (uint32_t)len, h, val};
    m->n++;
    return HR_OK;
}

int32_t tk_strmap_get(const tk_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    if (!key) key = "";
    uint32_t h = (uint32_t)tk_hash_bytes(key, len);
    size_t i = h & (m->cap - 1);
    while (m->slots[i].key) {
        const tk_strmap_slot *s = &m->slots[i];
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) return s->val;
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

hr_status tk_u64map_init(tk_u64map *m, size_t expected) {
    m->cap = cap_for(expected);
    m->n = 0;
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots) return hr_error(HR_ERR_OOM, "tokenizer: out of memory for a hash map of %zu entries", expected);
    memset(m->slots, 0xff, m->cap * sizeof *m->slots);
    return HR_OK;
}

void tk_u64map_free(tk_u64map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static hr_status u64map_grow(tk_u64map *m) {
    tk_u64map g;
    HR_TRY(tk_u64map_init(&g, m->cap));
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key != UINT64_MAX) tk_u64map_put(&g, m->slots[i].key, m->slots[i].val);
    tk_u64map_free(m);
    *m = g;
    return HR_OK;
}

hr_status tk_u64map_put(tk_u64map *m, uint64_t key, uint64_t val) {
    if ((m->n + 1) * 2 > m->cap) HR_TRY(u64map_grow(m));
    size_t i = mix64(key) & (m->cap - 1);
    while (m->slots[i].key != UINT64_MAX) {
        if (m->slots[i].key == key) {
            m->slots[i].val = val;
            return HR_OK;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->slots[i] = (tk_u64map_slot){key, val};
    m->n++;
    return HR_OK;
}

int tk_u64map_get(const tk_u64map *m, uint64_t key, uint64_t *val) {
    if (!m->cap) return 0;
    size_t i = mix64(key) & (m->cap - 1);
    while (m->slots[i].key != UINT64_MAX) {
        if (m->slots[i].key == key) {
            *val = m->slots[i].val;
            return 1;
        }
        i = (i + 1) & (m->cap - 1);
    }
    return 0;
}
