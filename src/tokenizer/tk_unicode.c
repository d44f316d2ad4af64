/* Alignments through a Unicode normal form. tokenizers aligns each output
 * character with the input character it came from: a decomposition's
 * characters with their source, a composite with its starter, and a mark
 * composed away with nothing. This redoes decomposition, canonical ordering
 * and composition on code points that remember their source, for the short
 * pieces the normalizer sends here. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/tk_internal.h"

typedef struct {
    int32_t cp;
    uint32_t src; /* byte offset of the source character in the piece */
} traced;

static int ccc(int32_t cp) { return utf8proc_get_property(cp)->combining_class; }

/* The canonical composite of a + b, or -1. */
static int32_t compose_pair(int32_t a, int32_t b) {
    char in[8];
    size_t n = tk_utf8_encode(a, in);
    n += tk_utf8_encode(b, in + n);
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &out,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    int32_t c = -1;
    if (r > 0) {
        int32_t cp;
        if (tk_utf8_decode((const char *)out, (size_t)r, &cp) == (size_t)r) c = cp;
    }
    free(out);
    return c;
}

static hr_status push(traced **v, size_t *n, size_t *cap, traced t) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        traced *p = realloc(*v, c * sizeof *p);
        if (!p) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = t;
    return HR_OK;
}

static hr_status decompose(const char *s, size_t n, bool compat, traced **v, size_t *len, size_t *cap) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_decode(s + i, n - i, &cp);
        utf8proc_int32_t buf[32];
        int boundclass = 0;
        utf8proc_ssize_t m = utf8proc_decompose_char(cp, buf, 32, UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0),
                                                     &boundclass);
        if (m < 0 || m > 32) return hr_error(HR_ERR_INTERNAL, "normalizer: cannot decompose U+%04X", cp);
        for (utf8proc_ssize_t q = 0; q < m; q++) HR_TRY(push(v, len, cap, (traced){buf[q], (uint32_t)i}));
        i += k;
    }
    return HR_OK;
}

/* Canonical ordering: runs of non-starters sorted stably by class. */
static void reorder(traced *v, size_t n) {
    for (size_t i = 1; i < n; i++) {
        int c = ccc(v[i].cp);
        if (!c) continue;
        for (size_t j = i; j > 0; j--) {
            int p = ccc(v[j - 1].cp);
            if (!p || p <= c) break;
            traced t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    }
}

/* Canonical composition in place; returns the new length. */
static size_t compose(traced *v, size_t n) {
    size_t out = 0;
    long starter = -1;
    int last = 0; /* class of the last kept character after the starter */
    for (size_t i = 0; i < n; i++) {
        int c = ccc(v[i].cp);
        bool adjacent = starter >= 0 && (size_t)starter == out - 1;
        if (starter >= 0 && (adjacent || (last < c && c != 0))) {
            int32_t comp = compose_pair(v[starter].cp, v[i].cp);
            if (comp >= 0) {
                v[starter].cp = comp;
                continue;
            }
        }
        if (c == 0) {
            starter = (long)out;
            last = 0;
        } else {
            last = c;
        }
        v[out++] = v[i];
    }
    return out;
}

hr_status tk_unicode_traced(bool compose_form, bool compat, const char *s, const tk_align *al, size_t n, tk_buf *want,
                            tk_aligns *al_out, bool *ok) {
    traced *v = NULL;
    size_t len = 0, cap = 0;
    *ok = false;
    hr_status st = decompose(s, n, compat, &v, &len, &cap);
    if (st == HR_OK) {
        reorder(v, len);
        if (compose_form) len = compose(v, len);
        /* Only used when it reproduces utf8proc's text exactly. */
        char *w = want->p;
        size_t at = 0;
        bool same = true;
        for (size_t i = 0; same && i < len; i++) {
            char u[4];
            size_t k = tk_utf8_encode(v[i].cp, u);
            same = at + k <= want->n && !memcmp(w + at, u, k);
            at += k;
        }
        if (same && at == want->n) {
            *ok = true;
            for (size_t i = 0; st == HR_OK && i < len; i++) {
                char u[4];
                st = tk_aligns_fill(al_out, al[v[i].src], tk_utf8_encode(v[i].cp, u));
            }
        }
    }
    free(v);
    return st;
}
