/* BPE: characters to ids, then merges applied lowest rank first (leftmost
 * among equal ranks) with a binary heap, exactly as tokenizers' Word does.
 * Results are cached per word in the encode workspace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_model.h"

/* ---- loading ------------------------------------------------------------------ */

static hr_status dup_opt(const cJSON *j, const char *key, char **out, size_t *len) {
    const char *s;
    HR_TRY(tk_json_opt_string(j, key, "model 'BPE'", &s));
    if (!s) s = "";
    *len = strlen(s);
    *out = malloc(*len + 1);
    if (!*out) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    memcpy(*out, s, *len + 1);
    return HR_OK;
}

/* Splits merge i into its two tokens: "a b" or ["a", "b"]. */
static hr_status merge_sides(const cJSON *it, size_t i, const char **a, size_t *an, const char **b, size_t *bn) {
    if (cJSON_IsString(it)) {
        const char *s = it->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return hr_error(HR_ERR_FORMAT, "model 'BPE': merge %zu ('%.80s') is not two tokens", i, s);
        *a = s;
        *an = (size_t)(sp - s);
        *b = sp + 1;
        *bn = strlen(sp + 1);
        return HR_OK;
    }
    const cJSON *l = cJSON_GetArrayItem(it, 0), *r = cJSON_GetArrayItem(it, 1);
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !cJSON_IsString(l) || !cJSON_IsString(r))
        return hr_error(HR_ERR_FORMAT, "model 'BPE': merge %zu must be \"a b\" or [\"a\", \"b\"]", i);
    *a = l->valuestring;
    *an = strlen(*a);
    *b = r->valuestring;
    *bn = strlen(*b);
    return HR_OK;
}

static hr_status parse_merges(const cJSON *arr, tk_model *m) {
    if (!cJSON_IsArray(arr)) return hr_error(HR_ERR_FORMAT, "model 'BPE': field 'merges' must be an array");
    HR_TRY(tk_u64map_init(&m->merges, (size_t)cJSON_GetArraySize(arr)));
    tk_buf cat = {0};
    hr_status st = HR_OK;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const char *a = NULL, *b = NULL;
        size_t an = 0, bn = 0;
        if ((st = merge_sides(it, i, &a, &an, &b, &bn)) != HR_OK) break;
        int32_t ia = tk_vocab_get(&m->vocab, a, an), ib = tk_vocab_get(&m->vocab, b, bn);
        if (ia < 0 || ib < 0) {
            st = hr_error(HR_ERR_FORMAT, "model 'BPE': merge %zu names token '%.*s' that is not in the vocab", i,
                          (int)(ia < 0 ? an : bn), ia < 0 ? a : b);
            break;
        }
        /* The right side loses its continuing-subword prefix when merged. */
        size_t skip = m->prefix_len && bn >= m->prefix_len && !memcmp(b, m->prefix, m->prefix_len) ? m->prefix_len : 0;
        cat.n = 0;
        if ((st = tk_buf_append(&cat, a, an)) != HR_OK || (st = tk_buf_append(&cat, b + skip, bn - skip)) != HR_OK) break;
        int32_t id = tk_vocab_get(&m->vocab, cat.p, cat.n);
        if (id < 0) {
            st = hr_error(HR_ERR_FORMAT, "model 'BPE': merge %zu produces '%.*s' that is not in the vocab", i, (int)cat.n,
                          cat.p);
            break;
        }
        if ((st = tk_u64map_put(&m->merges, (uint64_t)ia << 32 | (uint32_t)ib, (uint64_t)i << 32 | (uint32_t)id)) != HR_OK)
            break;
        i++;
    }
    tk_buf_free(&cat);
    return st;
}

/* char_ids[cp] = id when id's string is the one code point cp and the
 * vocab maps that string back to id. */
static void set_char_id(tk_model *m, int32_t id) {
    size_t len = 0;
    const char *s = tk_vocab_token(&m->vocab, id, &len);
    int32_t cp;
    if (!s || len == 0 || len > 3 || tk_utf8_valid_prefix(s, len) != len || tk_utf8_decode(s, len, &cp) != len ||
        cp >= TK_CHAR_IDS)
        return;
    if (tk_vocab_get(&m->vocab, s, len) == id) m->char_ids[cp] = id;
}

hr_status tk_bpe_parse(const cJSON *j, tk_model *m) {
    HR_TRY(tk_vocab_from_object(tk_json_get(j, "vocab"), "model 'BPE'", &m->vocab));
    HR_TRY(dup_opt(j, "continuing_subword_prefix", &m->prefix, &m->prefix_len));
    HR_TRY(dup_opt(j, "end_of_word_suffix", &m->suffix, &m->suffix_len));
    m->byte_fallback = tk_json_bool(j, "byte_fallback", false);
    m->fuse_unk = tk_json_bool(j, "fuse_unk", false);
    m->ignore_merges = tk_json_bool(j, "ignore_merges", false);
    const cJSON *dropout = tk_json_get(j, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
        return hr_error(HR_ERR_UNSUPPORTED, "model 'BPE': dropout is not supported (deterministic encoding only)");
    const char *unk;
    HR_TRY(tk_json_opt_string(j, "unk_token", "model 'BPE'", &unk));
    if (unk) {
        m->unk_id = tk_vocab_get(&m->vocab, unk, strlen(unk));
        if (m->unk_id < 0) return hr_error(HR_ERR_FORMAT, "model 'BPE': unk_token '%.80s' is not in the vocab", unk);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = tk_vocab_get(&m->vocab, name, 6);
    }
    /* Filled from the vocabulary: one pass, no lookup per code point. */
    for (int32_t cp = 0; cp < TK_CHAR_IDS; cp++) m->char_ids[cp] = -1;
    for (size_t id = 0; id < m->vocab.n; id++) set_char_id(m, (int32_t)id);
    for (size_t k = 0; k < m->vocab.far.cap; k++)
        if (m->vocab.far.slots[k].key != UINT64_MAX) set_char_id(m, (int32_t)m->vocab.far.slots[k].key);
    return parse_merges(tk_json_get(j, "merges"), m);
}

/* ---- encoding ------------------------------------------------------------------ */

typedef struct {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* 0 once merged into its left neighbour */
} symbol;

typedef struct {
    uint32_t rank;
    uint32_t pos;
    int32_t id;
} merge_entry;

#define CACHE_KEY_BYTES (1u << 20)
#define CACHE_IDS (1u << 18)
#define CACHE_MAX_WORD 4096
#define CACHE_ENTRIES (1u << 16)
#define SCRATCH_KEEP (1u << 16) /* symbols */

typedef struct {
    symbol *sym;
    size_t sym_cap;
    merge_entry *heap;
    size_t heap_cap, heap_n;
    tk_buf str;
    tk_strmap cache;   /* word -> index into entries */
    char *keys;        /* CACHE_KEY_BYTES */
    size_t keys_n;
    int32_t *ids;      /* CACHE_IDS */
    int32_t *lens;     /* CACHE_IDS: byte length of each cached token */
    size_t ids_n;
    uint32_t (*entries)[2]; /* (entries_cap) offset and count in ids */
    size_t entries_n, entries_cap;
} bpe_scratch;

void tk_bpe_scratch_free(void *p) {
    bpe_scratch *s = p;
    free(s->sym);
    free(s->heap);
    tk_buf_free(&s->str);
    tk_strmap_free(&s->cache);
    free(s->keys);
    free(s->ids);
    free(s->lens);
    free(s->entries);
    free(s);
}

static hr_status scratch_get(tk_ws *ws, bpe_scratch **out) {
    if (!ws->model_scratch) {
        bpe_scratch *s = calloc(1, sizeof *s);
        if (!s) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        s->keys = malloc(CACHE_KEY_BYTES);
        s->ids = malloc(CACHE_IDS * sizeof *s->ids);
        s->lens = malloc(CACHE_IDS * sizeof *s->lens);
        s->entries_cap = CACHE_ENTRIES;
        s->entries = malloc(s->entries_cap * sizeof *s->entries);
        if (!s->keys || !s->ids || !s->lens || !s->entries || tk_strmap_init(&s->cache, CACHE_ENTRIES) != HR_OK) {
            tk_bpe_scratch_free(s);
            return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        }
        ws->model_scratch = s;
    }
    *out = ws->model_scratch;
    return HR_OK;
}

static inline bool heap_less(merge_entry a, merge_entry b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static hr_status heap_push(bpe_scratch *s, merge_entry e) {
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 64;
        merge_entry *h = realloc(s->heap, cap * sizeof *h);
        if (!h) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        s->heap = h;
        s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(e, s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
    return HR_OK;
}

static merge_entry heap_pop(bpe_scratch *s) {
    merge_entry top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(s->heap[c + 1], s->heap[c])) c++;
        if (!heap_less(s->heap[c], last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

static hr_status sym_push(bpe_scratch *s, size_t *n, int32_t id, uint32_t len) {
    if (*n == s->sym_cap) {
        size_t cap = s->sym_cap ? s->sym_cap * 2 : 256;
        symbol *p = realloc(s->sym, cap * sizeof *p);
        if (!p) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        s->sym = p;
        s->sym_cap = cap;
    }
    s->sym[*n] = (symbol){id, (int32_t)*n - 1, (int32_t)*n + 1, len};
    (*n)++;
    return HR_OK;
}

/* Characters to initial symbols, with prefix/suffix, byte fallback and unk. */
static hr_status word_symbols(const tk_model *m, bpe_scratch *s, const char *w, size_t n, size_t *n_sym) {
    size_t ns = 0;
    int32_t unk_len = -1; /* pending unk run (fuse_unk) */
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        while (i + k < n && ((unsigned char)w[i + k] & 0xC0) == 0x80) k++;
        bool first = i == 0, last = i + k == n;
        const char *c = w + i;
        size_t cn = k;
        if ((!first && m->prefix_len) || (last && m->suffix_len)) {
            s->str.n = 0;
            if (!first) HR_TRY(tk_buf_append(&s->str, m->prefix, m->prefix_len));
            HR_TRY(tk_buf_append(&s->str, w + i, k));
            if (last) HR_TRY(tk_buf_append(&s->str, m->suffix, m->suffix_len));
            c = s->str.p;
            cn = s->str.n;
        }
        int32_t id;
        if (c == w + i && k <= 3) { /* in the BMP */
            int32_t cp;
            tk_utf8_decode(c, k, &cp);
            id = m->char_ids[cp];
        } else {
            id = tk_vocab_get(&m->vocab, c, cn);
        }
        if (id >= 0) {
            if (unk_len >= 0) HR_TRY(sym_push(s, &ns, m->unk_id, (uint32_t)unk_len));
            unk_len = -1;
            HR_TRY(sym_push(s, &ns, id, (uint32_t)k));
        } else {
            bool done = false;
            if (m->byte_fallback) {
                done = true;
                for (size_t b = 0; b < cn; b++) done = done && m->byte_ids[(unsigned char)c[b]] >= 0;
                /* As in tokenizers, a pending unk run is not flushed first. */
                for (size_t b = 0; done && b < cn; b++) HR_TRY(sym_push(s, &ns, m->byte_ids[(unsigned char)c[b]], 1));
            }
            if (!done && m->unk_id >= 0) {
                if (unk_len >= 0 && m->fuse_unk) unk_len += (int32_t)k;
                else {
                    if (unk_len >= 0) HR_TRY(sym_push(s, &ns, m->unk_id, (uint32_t)unk_len));
                    unk_len = (int32_t)k;
                }
            }
        }
        i += k;
    }
    if (unk_len >= 0) HR_TRY(sym_push(s, &ns, m->unk_id, (uint32_t)unk_len));
    if (ns) s->sym[ns - 1].next = -1;
    *n_sym = ns;
    return HR_OK;
}

static inline bool merge_lookup(const tk_model *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    uint64_t v;
    if (!tk_u64map_get(&m->merges, (uint64_t)a << 32 | (uint32_t)b, &v)) return false;
    *rank = (uint32_t)(v >> 32);
    *id = (int32_t)(uint32_t)v;
    return true;
}

static hr_status merge_all(const tk_model *m, bpe_scratch *s, size_t ns) {
    symbol *sym = s->sym;
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        uint32_t rank;
        int32_t id;
        if (merge_lookup(m, sym[i].id, sym[i + 1].id, &rank, &id)) HR_TRY(heap_push(s, (merge_entry){rank, (uint32_t)i, id}));
    }
    while (s->heap_n) {
        merge_entry top = heap_pop(s);
        symbol *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        symbol *right = &sym[cur->next];
        uint32_t rank;
        int32_t id;
        /* Stale entry: the pair at this position changed since it was queued. */
        if (!merge_lookup(m, cur->id, right->id, &rank, &id) || id != top.id) continue;
        cur->id = top.id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0) sym[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && merge_lookup(m, sym[cur->prev].id, cur->id, &rank, &id))
            HR_TRY(heap_push(s, (merge_entry){rank, (uint32_t)cur->prev, id}));
        if (cur->next >= 0 && merge_lookup(m, cur->id, sym[cur->next].id, &rank, &id))
            HR_TRY(heap_push(s, (merge_entry){rank, top.pos, id}));
    }
    return HR_OK;
}

static void cache_store(bpe_scratch *s, const char *w, size_t n, const symbol *sym, size_t ns, size_t k) {
    if (n > CACHE_MAX_WORD || k > CACHE_MAX_WORD) return;
    if (s->keys_n + n > CACHE_KEY_BYTES || s->ids_n + k > CACHE_IDS || s->entries_n == s->entries_cap) {
        tk_strmap_clear(&s->cache);
        s->keys_n = s->ids_n = s->entries_n = 0;
    }
    memcpy(s->keys + s->keys_n, w, n);
    size_t j = s->ids_n;
    for (size_t i = 0; i < ns; i++)
        if (sym[i].len) {
            s->ids[j] = sym[i].id;
            s->lens[j++] = (int32_t)sym[i].len;
        }
    s->entries[s->entries_n][0] = (uint32_t)s->ids_n;
    s->entries[s->entries_n][1] = (uint32_t)k;
    if (tk_strmap_put(&s->cache, s->keys + s->keys_n, n, (int32_t)s->entries_n) != HR_OK) {
        tk_strmap_clear(&s->cache);
        s->keys_n = s->ids_n = s->entries_n = 0;
        return;
    }
    s->keys_n += n;
    s->ids_n += k;
    s->entries_n++;
}

/* Token byte ranges in the word from their lengths. */
static hr_status push_offsets(tk_ids *offs, const int32_t *lens, size_t k) {
    int32_t pos = 0;
    for (size_t i = 0; i < k; i++) {
        HR_TRY(tk_ids_push(offs, pos));
        pos += lens[i];
        HR_TRY(tk_ids_push(offs, pos));
    }
    return HR_OK;
}

hr_status tk_bpe_tokenize(const tk_model *m, const char *w, size_t n, tk_ids *out, tk_ids *offs, tk_ws *ws) {
    if (m->ignore_merges) {
        int32_t id = tk_vocab_get(&m->vocab, w, n);
        if (id >= 0) {
            if (offs) HR_TRY(push_offsets(offs, (const int32_t[]){(int32_t)n}, 1));
            return tk_ids_push(out, id);
        }
    }
    bpe_scratch *s = NULL;
    HR_TRY(scratch_get(ws, &s));
    int32_t hit = tk_strmap_get(&s->cache, w, n);
    if (hit >= 0) {
        uint32_t at = s->entries[hit][0], k = s->entries[hit][1];
        if (offs) HR_TRY(push_offsets(offs, s->lens + at, k));
        return tk_ids_append(out, s->ids + at, k);
    }
    size_t ns;
    HR_TRY(word_symbols(m, s, w, n, &ns));
    HR_TRY(merge_all(m, s, ns));
    size_t start = out->n;
    int32_t pos = 0;
    for (size_t i = 0; i < ns; i++) {
        if (!s->sym[i].len) continue;
        HR_TRY(tk_ids_push(out, s->sym[i].id));
        if (offs) {
            HR_TRY(tk_ids_push(offs, pos));
            HR_TRY(tk_ids_push(offs, pos + (int32_t)s->sym[i].len));
        }
        pos += (int32_t)s->sym[i].len;
    }
    cache_store(s, w, n, s->sym, ns, out->n - start);
    /* Symbol and heap arrays sized for a huge word are not kept. */
    if (s->sym_cap > SCRATCH_KEEP) {
        free(s->sym);
        free(s->heap);
        s->sym = NULL;
        s->heap = NULL;
        s->sym_cap = s->heap_cap = 0;
    }
    return HR_OK;
}
