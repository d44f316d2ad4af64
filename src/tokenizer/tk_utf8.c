/* Growable buffers, UTF-8 coding and the Unicode predicates of the pipeline. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/tk_internal.h"

/* ---- buffers ----------------------------------------------------------- */

hr_status tk_buf_reserve(tk_buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return HR_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return hr_error(HR_ERR_OOM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return HR_OK;
}

hr_status tk_buf_append(tk_buf *b, const void *s, size_t n) {
    HR_TRY(tk_buf_reserve(b, n + 1));
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return HR_OK;
}

void tk_buf_free(tk_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

static hr_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return HR_OK;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return hr_error(HR_ERR_OOM, "tokenizer: out of memory (%zu elements)", c);
    *p = q;
    *cap = c;
    return HR_OK;
}

hr_status tk_ids_push(tk_ids *v, int32_t id) {
    HR_TRY(grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p));
    v->p[v->n++] = id;
    return HR_OK;
}

hr_status tk_ids_append(tk_ids *v, const int32_t *ids, size_t n) {
    HR_TRY(grow((void **)&v->p, &v->cap, v->n + n, sizeof *v->p));
    if (n) memcpy(v->p + v->n, ids, n * sizeof *ids);
    v->n += n;
    return HR_OK;
}

void tk_ids_free(tk_ids *v) {
    free(v->p);
    memset(v, 0, sizeof *v);
}

hr_status tk_aligns_fill(tk_aligns *v, tk_align a, size_t count) {
    HR_TRY(grow((void **)&v->p, &v->cap, v->n + count, sizeof *v->p));
    for (size_t i = 0; i < count; i++) v->p[v->n++] = a;
    return HR_OK;
}

hr_status tk_aligns_append(tk_aligns *v, const tk_align *src, size_t n) {
    HR_TRY(grow((void **)&v->p, &v->cap, v->n + n, sizeof *v->p));
    if (n) memcpy(v->p + v->n, src, n * sizeof *src);
    v->n += n;
    return HR_OK;
}

void tk_aligns_free(tk_aligns *v) {
    free(v->p);
    memset(v, 0, sizeof *v);
}

void tk_pieces_reset(tk_pieces *ps, bool track) {
    ps->track = track;
    ps->text.n = 0;
    ps->al.n = 0;
    ps->n = 0;
}

void tk_pieces_free(tk_pieces *ps) {
    tk_buf_free(&ps->text);
    tk_aligns_free(&ps->al);
    free(ps->v);
    memset(ps, 0, sizeof *ps);
}

hr_status tk_pieces_add(tk_pieces *ps, const char *s, const tk_align *al, size_t n, int32_t id, bool first) {
    if (ps->text.n + n > UINT32_MAX) return hr_error(HR_ERR_INVALID_ARG, "tokenizer: text longer than 4 GiB");
    HR_TRY(grow((void **)&ps->v, &ps->cap, ps->n + 1, sizeof *ps->v));
    uint32_t off = (uint32_t)ps->text.n;
    HR_TRY(tk_buf_append(&ps->text, s, n));
    if (ps->track) HR_TRY(al ? tk_aligns_append(&ps->al, al, n) : tk_aligns_fill(&ps->al, (tk_align){0, 0}, n));
    ps->v[ps->n++] = (tk_piece){off, (uint32_t)n, id, first};
    return HR_OK;
}

hr_status tk_spans_push(tk_spans *s, uint32_t start, uint32_t end, bool match) {
    HR_TRY(grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v));
    s->v[s->n++] = (tk_span){start, end, match};
    return HR_OK;
}

hr_status tk_strs_push(tk_strs *s, const char *p, size_t n) {
    if (s->n + 1 > s->cap) {
        size_t c = s->cap;
        HR_TRY(grow((void **)&s->off, &c, s->n + 1, sizeof *s->off));
        c = s->cap;
        HR_TRY(grow((void **)&s->len, &c, s->n + 1, sizeof *s->len));
        s->cap = c;
    }
    s->off[s->n] = (uint32_t)s->text.n;
    s->len[s->n] = (uint32_t)n;
    s->n++;
    return tk_buf_append(&s->text, p, n);
}

void tk_strs_reset(tk_strs *s) {
    s->text.n = 0;
    s->n = 0;
}

void tk_strs_free(tk_strs *s) {
    tk_buf_free(&s->text);
    free(s->off);
    free(s->len);
    memset(s, 0, sizeof *s);
}

/* ---- UTF-8 -------------------------------------------------------------- */

size_t tk_utf8_decode(const char *s, size_t n, int32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0 || n < 4) {
        if (n < 3) {
            *cp = u[0];
            return 1;
        }
        *cp = ((u[0] & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((u[0] & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

size_t tk_utf8_encode(int32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid sequence starting at s (0 when invalid) and, when
 * invalid, the length of its maximal valid prefix in *bad (the bytes that
 * one U+FFFD replaces, at least 1). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= n) break;
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    }
    if (i == need) return need;
    *bad = i;
    return 0;
}

size_t tk_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad, k = utf8_seq(u + i, n - i, &bad);
        if (!k) return i;
        i += k;
    }
    return n;
}

hr_status tk_utf8_lossy_append(tk_buf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        size_t bad, k = u[i] < 0x80 ? 1 : utf8_seq(u + i, n - i, &bad);
        if (k) {
            i += k;
            continue;
        }
        HR_TRY(tk_buf_append(out, s + run, i - run));
        HR_TRY(tk_buf_append(out, "\xEF\xBF\xBD", 3));
        i += bad;
        run = i;
    }
    return tk_buf_append(out, s + run, n - run);
}

/* ---- Unicode predicates -------------------------------------------------- */

int tk_cp_category(int32_t cp) {
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return 'L';
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
        return 'M';
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return 'N';
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return 'P';
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
        return 'S';
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
        return 'Z';
    default:
        return 'C';
    }
}

bool tk_cp_is_whitespace(int32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

bool tk_cp_is_numeric(int32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return tk_cp_category(cp) == 'N';
}

bool tk_cp_is_punctuation(int32_t cp) { return tk_cp_category(cp) == 'P'; }

/* ---- GPT-2 byte-level alphabet ---------------------------------------------- */

static bool byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); }

#define B4(i) BYTE_CP(i), BYTE_CP(i + 1), BYTE_CP(i + 2), BYTE_CP(i + 3)
#define B16(i) B4(i), B4(i + 4), B4(i + 8), B4(i + 12)
/* Non-printable bytes take 256, 257, ... in byte order. */
#define BYTE_CP(b)                                                              \
    ((b) >= 33 && (b) <= 126 ? (b)                                              \
     : (b) >= 161 && (b) <= 172 ? (b)                                           \
     : (b) >= 174 ? (b)                                                         \
     : (b) <= 32 ? 256 + (b)                                                    \
     : (b) <= 160 ? 256 + 33 + ((b) - 127)                                      \
                  : 256 + 33 + 34)
const uint16_t tk_byte_to_cp[256] = {B16(0), B16(16), B16(32), B16(48), B16(64), B16(80), B16(96), B16(112),
                                     B16(128), B16(144), B16(160), B16(176), B16(192), B16(208), B16(224), B16(240)};
#undef BYTE_CP
#undef B16
#undef B4

int tk_cp_to_byte(int32_t cp) {
    if (cp < 256) return byte_is_printable(cp) ? cp : -1;
    if (cp < 256 + 33) return cp - 256;
    if (cp < 256 + 33 + 34) return 127 + (cp - 256 - 33);
    if (cp == 256 + 33 + 34) return 173;
    return -1;
}
