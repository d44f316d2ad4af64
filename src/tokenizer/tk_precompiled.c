/* The Precompiled normalizer: SentencePiece's `precompiled_charsmap`, a
 * double-array trie over UTF-8 bytes whose values index NUL-terminated
 * replacements. Applied per extended grapheme cluster exactly as tokenizers
 * does: a cluster shorter than 6 bytes is replaced whole by its first
 * (shortest) prefix match; otherwise, or without a match, each character is
 * looked up on its own. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/tk_precompiled.h"

struct tk_charsmap {
    uint32_t *units; /* (n_units) the double array */
    size_t n_units;
    char *normalized; /* (n_normalized) replacement strings, each ending in NUL */
    size_t n_normalized;
};

static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

static hr_status base64_decode(const char *s, unsigned char **out, size_t *n) {
    size_t len = strlen(s), k = 0;
    unsigned char *buf = malloc(len / 4 * 3 + 4);
    if (!buf) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '=' || s[i] == '\n' || s[i] == '\r') continue;
        int v = base64_value((unsigned char)s[i]);
        if (v < 0) {
            free(buf);
            return hr_error(HR_ERR_FORMAT, "normalizer 'Precompiled': precompiled_charsmap is not base64 (byte %zu)", i);
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            buf[k++] = (unsigned char)(acc >> bits);
        }
    }
    *out = buf;
    *n = k;
    return HR_OK;
}

void tk_charsmap_free(tk_charsmap *m) {
    if (!m) return;
    free(m->units);
    free(m->normalized);
    free(m);
}

hr_status tk_charsmap_parse(const char *base64, tk_charsmap **out) {
    *out = NULL;
    unsigned char *raw = NULL;
    size_t n = 0;
    HR_TRY(base64_decode(base64, &raw, &n));
    hr_status st = HR_OK;
    tk_charsmap *m = calloc(1, sizeof *m);
    uint32_t trie_bytes = 0;
    if (!m) st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    else if (n < 4 || (memcpy(&trie_bytes, raw, 4), trie_bytes > n - 4) || trie_bytes % 4)
        st = hr_error(HR_ERR_FORMAT, "normalizer 'Precompiled': charsmap of %zu bytes has a bad trie size", n);
    if (st == HR_OK) {
        m->n_units = trie_bytes / 4;
        m->n_normalized = n - 4 - trie_bytes;
        m->units = malloc((m->n_units + 1) * sizeof *m->units);
        m->normalized = malloc(m->n_normalized + 1);
        if (!m->units || !m->normalized) st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    }
    if (st == HR_OK) {
        for (size_t i = 0; i < m->n_units; i++) {
            const unsigned char *u = raw + 4 + 4 * i;
            m->units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
        }
        memcpy(m->normalized, raw + 4 + trie_bytes, m->n_normalized);
        m->normalized[m->n_normalized] = '\0';
        if (tk_utf8_valid_prefix(m->normalized, m->n_normalized) != m->n_normalized)
            st = hr_error(HR_ERR_FORMAT, "normalizer 'Precompiled': replacement strings are not valid UTF-8");
    }
    free(raw);
    if (st != HR_OK) {
        tk_charsmap_free(m);
        return st;
    }
    *out = m;
    return HR_OK;
}

/* Double-array unit fields, as SentencePiece's Darts-clone stores them. */
static bool unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }
static uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static size_t unit_offset(uint32_t u) { return (size_t)(u >> 10) << ((u & (1u << 9)) >> 6); }

/* The replacement of the shortest prefix of s[0..n) in the trie, or NULL. */
static const char *lookup(const tk_charsmap *m, const char *s, size_t n, size_t *len) {
    if (!m->n_units) return NULL;
    size_t pos = unit_offset(m->units[0]);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == 0) break;
        pos ^= c;
        if (pos >= m->n_units) return NULL;
        uint32_t u = m->units[pos];
        if (unit_label(u) != c) return NULL;
        pos ^= unit_offset(u);
        if (unit_has_leaf(u)) {
            if (pos >= m->n_units) return NULL;
            size_t at = unit_value(m->units[pos]);
            if (at >= m->n_normalized) return NULL;
            *len = strlen(m->normalized + at);
            return m->normalized + at;
        }
    }
    return NULL;
}

/* Appends rep for the characters old[0..n): output character i keeps the
 * alignment of old character min(i, last), as tokenizers' replace() gives. */
static hr_status put_replacement(const char *rep, size_t rep_len, const char *old, const tk_align *al, size_t n,
                                 tk_buf *out, tk_aligns *al_out) {
    HR_TRY(tk_buf_append(out, rep, rep_len));
    if (!al_out) return HR_OK;
    size_t in = 0;
    for (size_t j = 0; j < rep_len;) {
        size_t k = 1;
        while (j + k < rep_len && ((unsigned char)rep[j + k] & 0xC0) == 0x80) k++;
        HR_TRY(tk_aligns_fill(al_out, tk_al_get(al, in), k));
        j += k;
        size_t next = in + 1;
        while (next < n && ((unsigned char)old[next] & 0xC0) == 0x80) next++;
        if (next < n) in = next;
    }
    return HR_OK;
}

hr_status tk_charsmap_normalize(const tk_charsmap *m, const char *s, const tk_align *al, size_t n, tk_buf *out,
                                tk_aligns *al_out) {
    utf8proc_int32_t state = 0;
    for (size_t g = 0; g < n;) {
        /* One extended grapheme cluster: s[g..e). */
        int32_t prev, cp;
        size_t e = g + tk_utf8_decode(s + g, n - g, &prev);
        while (e < n) {
            size_t k = tk_utf8_decode(s + e, n - e, &cp);
            if (utf8proc_grapheme_break_stateful(prev, cp, &state)) break;
            prev = cp;
            e += k;
        }
        size_t rep_len;
        const char *rep = e - g < 6 ? lookup(m, s + g, e - g, &rep_len) : NULL;
        if (rep) {
            HR_TRY(put_replacement(rep, rep_len, s + g, tk_al_at(al, g), e - g, out, al_out));
        } else {
            for (size_t i = g; i < e;) {
                size_t k = tk_utf8_decode(s + i, e - i, &cp);
                rep = lookup(m, s + i, k, &rep_len);
                if (rep) HR_TRY(put_replacement(rep, rep_len, s + i, tk_al_at(al, i), k, out, al_out));
                else {
                    HR_TRY(tk_buf_append(out, s + i, k));
                    if (al_out) HR_TRY(tk_aligns_append(al_out, tk_al_at(al, i), k));
                }
                i += k;
            }
        }
        g = e;
    }
    return HR_OK;
}
