/* Normalizers: NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents, Replace,
 * Prepend, BertNormalizer, ByteLevel, Precompiled, Nmt and Sequence, as in
 * tokenizers. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/tk_internal.h"
#include "tokenizer/tk_precompiled.h"

typedef enum {
    NZ_NFC,
    NZ_NFD,
    NZ_NFKC,
    NZ_NFKD,
    NZ_LOWERCASE,
    NZ_STRIP,
    NZ_STRIP_ACCENTS,
    NZ_REPLACE,
    NZ_PREPEND,
    NZ_BERT,
    NZ_BYTE_LEVEL,
    NZ_PRECOMPILED,
    NZ_NMT,
    NZ_SEQUENCE,
} nz_type;

struct tk_normalizer {
    nz_type type;
    bool strip_left, strip_right;                          /* Strip */
    tk_regex *pattern;                                     /* Replace */
    char *content;                                         /* Replace content, Prepend text */
    size_t content_len;
    bool clean_text, chinese, strip_accents, lowercase;    /* BertNormalizer */
    tk_charsmap *charsmap;                                 /* Precompiled, NULL for none */
    tk_normalizer **children;                              /* Sequence (n_children) */
    size_t n_children;
};

static const char *const nz_names[] = {
    [NZ_NFC] = "NFC", [NZ_NFD] = "NFD", [NZ_NFKC] = "NFKC", [NZ_NFKD] = "NFKD", [NZ_LOWERCASE] = "Lowercase",
    [NZ_STRIP] = "Strip", [NZ_STRIP_ACCENTS] = "StripAccents", [NZ_REPLACE] = "Replace", [NZ_PREPEND] = "Prepend",
    [NZ_BERT] = "BertNormalizer", [NZ_BYTE_LEVEL] = "ByteLevel", [NZ_PRECOMPILED] = "Precompiled", [NZ_NMT] = "Nmt",
    [NZ_SEQUENCE] = "Sequence",
};

void tk_normalizer_free(tk_normalizer *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_children; i++) tk_normalizer_free(n->children[i]);
    free(n->children);
    tk_regex_free(n->pattern);
    tk_charsmap_free(n->charsmap);
    free(n->content);
    free(n);
}

static hr_status dup_string(const char *s, char **out, size_t *len) {
    size_t n = strlen(s);
    *out = malloc(n + 1);
    if (!*out) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    memcpy(*out, s, n + 1);
    if (len) *len = n;
    return HR_OK;
}

static hr_status parse_fields(const cJSON *j, tk_normalizer *n) {
    const char *s;
    switch (n->type) {
    case NZ_STRIP:
        n->strip_left = tk_json_bool(j, "strip_left", true);
        n->strip_right = tk_json_bool(j, "strip_right", true);
        return HR_OK;
    case NZ_REPLACE:
        HR_TRY(tk_pattern_parse(tk_json_get(j, "pattern"), "normalizer 'Replace'", &n->pattern));
        HR_TRY(tk_json_string(j, "content", "normalizer 'Replace'", &s));
        return dup_string(s, &n->content, &n->content_len);
    case NZ_PREPEND:
        HR_TRY(tk_json_string(j, "prepend", "normalizer 'Prepend'", &s));
        return dup_string(s, &n->content, &n->content_len);
    case NZ_BERT: {
        n->clean_text = tk_json_bool(j, "clean_text", true);
        n->chinese = tk_json_bool(j, "handle_chinese_chars", true);
        n->lowercase = tk_json_bool(j, "lowercase", true);
        /* strip_accents: null follows lowercase. */
        n->strip_accents = tk_json_bool(j, "strip_accents", n->lowercase);
        return HR_OK;
    }
    case NZ_PRECOMPILED:
        /* A null or empty charsmap normalizes nothing. */
        HR_TRY(tk_json_opt_string(j, "precompiled_charsmap", "normalizer 'Precompiled'", &s));
        return s && *s ? tk_charsmap_parse(s, &n->charsmap) : HR_OK;
    case NZ_SEQUENCE: {
        const cJSON *arr = tk_json_get(j, "normalizers");
        if (!cJSON_IsArray(arr)) return hr_error(HR_ERR_FORMAT, "normalizer 'Sequence': field 'normalizers' must be an array");
        int cnt = cJSON_GetArraySize(arr);
        n->children = calloc((size_t)cnt + 1, sizeof *n->children);
        if (!n->children) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            HR_TRY(tk_normalizer_parse(it, &n->children[n->n_children]));
            if (n->children[n->n_children]) n->n_children++;
        }
        return HR_OK;
    }
    default:
        return HR_OK;
    }
}

hr_status tk_normalizer_parse(const cJSON *j, tk_normalizer **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return HR_OK;
    int k;
    HR_TRY(tk_json_type_index(j, nz_names, (int)(sizeof nz_names / sizeof nz_names[0]), "normalizer", &k));
    tk_normalizer *n = calloc(1, sizeof *n);
    if (!n) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    n->type = (nz_type)k;
    hr_status st = parse_fields(j, n);
    if (st != HR_OK) {
        tk_normalizer_free(n);
        return st;
    }
    *out = n;
    return HR_OK;
}

/* ---- the transformations ----------------------------------------------------
 *
 * Each writes bytes and, for every byte, the original range it came from,
 * with tokenizers' conventions: a replaced character keeps the alignment of
 * the one it replaces; an inserted one takes that of the byte before it. */

typedef struct {
    tk_buf *b;
    tk_aligns *a;
} nz_out;

static hr_status put(nz_out o, const char *p, size_t k, tk_align al) {
    HR_TRY(tk_buf_append(o.b, p, k));
    return o.a ? tk_aligns_fill(o.a, al, k) : HR_OK;
}

static hr_status put_src(nz_out o, const char *s, const tk_align *al, size_t k) {
    HR_TRY(tk_buf_append(o.b, s, k));
    return o.a ? tk_aligns_append(o.a, al, k) : HR_OK;
}

static hr_status put_cp(nz_out o, int32_t cp, tk_align al) {
    char u[4];
    return put(o, u, tk_utf8_encode(cp, u), al);
}

static bool is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* utf8proc on s[0..n). Alignments are traced through decomposition and
 * composition; should that ever disagree with utf8proc, output character j
 * takes input character min(j, last). */
static hr_status utf8proc_form(nz_type t, const char *s, const tk_align *al, size_t n, nz_out o) {
    utf8proc_option_t opt = UTF8PROC_STABLE;
    bool compose = t == NZ_NFC || t == NZ_NFKC, compat = t == NZ_NFKC || t == NZ_NFKD;
    opt |= compose ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (compat) opt |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
    if (r < 0) return hr_error(HR_ERR_INVALID_ARG, "normalizer: %s", utf8proc_errmsg(r));
    const char *d = (const char *)dst;
    size_t start = o.b->n;
    hr_status st = tk_buf_append(o.b, d, (size_t)r);
    bool traced = false;
    if (st == HR_OK && o.a && al) {
        tk_buf want = {(char *)o.b->p + start, (size_t)r, (size_t)r};
        st = tk_unicode_traced(compose, compat, s, al, n, &want, o.a, &traced);
    }
    size_t in = 0; /* byte offset of the current input character */
    for (size_t j = 0; o.a && !traced && st == HR_OK && j < (size_t)r;) {
        size_t k = 1;
        while (j + k < (size_t)r && ((unsigned char)d[j + k] & 0xC0) == 0x80) k++;
        st = tk_aligns_fill(o.a, n ? tk_al_get(al, in) : (tk_align){0, 0}, k);
        j += k;
        size_t next = in + 1;
        while (next < n && ((unsigned char)s[next] & 0xC0) == 0x80) next++;
        if (next < n) in = next;
    }
    free(dst);
    return st;
}

/* Unicode normalization leaves most text as it is; only the pieces that can
 * change go through utf8proc. A cut is a position before a starter that
 * composes with nothing before it (composing forms) and whose decomposition,
 * if any, also starts with a starter: the normal form of the whole is that
 * of the pieces between cuts. Small pieces also keep alignments exact. A
 * piece of one character with no decomposition of the form's kind is
 * unchanged. */
typedef struct {
    bool compose, compat;
} uform;

static bool u_inert(int32_t cp, const utf8proc_property_t *p, uform f) {
    if (cp < 0x80) return true;
    if (!f.compose && cp >= 0xAC00 && cp <= 0xD7A3) return false; /* Hangul syllables decompose by rule */
    return p->decomp_seqindex == UINT16_MAX || (!f.compat && p->decomp_type != 0);
}

/* Whether cp starts a piece by itself: a starter that cannot join what
 * comes before it. */
static bool u_starter(int32_t cp, const utf8proc_property_t *p, uform f) {
    if (f.compose && cp >= 0x1160 && cp <= 0x11FF) return false; /* Hangul vowels and trailing consonants */
    if (p->combining_class != 0) return false;
    return !(f.compose && p->comb_index != UINT16_MAX && p->comb_index >= 0x8000);
}

static bool u_cut_before(int32_t cp, uform f) {
    if (cp < 0x80) return true;
    const utf8proc_property_t *p = utf8proc_get_property(cp);
    if (!u_starter(cp, p, f)) return false;
    if (u_inert(cp, p, f)) return true;
    /* The decomposition must start with such a starter too. */
    utf8proc_int32_t first[32];
    int ignored;
    utf8proc_ssize_t k = utf8proc_decompose_char(cp, first, 32, UTF8PROC_DECOMPOSE | (f.compat ? UTF8PROC_COMPAT : 0),
                                                 &ignored);
    return k > 0 && k <= 32 && u_starter(first[0], utf8proc_get_property(first[0]), f);
}

static hr_status unicode_form(nz_type t, const char *s, const tk_align *al, size_t n, nz_out o) {
    if (is_ascii(s, n)) return put_src(o, s, al, n);
    uform f = {t == NZ_NFC || t == NZ_NFKC, t == NZ_NFKC || t == NZ_NFKD};
    size_t run = 0; /* start of the pending run of clean or changing pieces */
    bool dirty = false;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = (unsigned char)s[i] < 0x80 ? (cp = s[i], 1) : tk_utf8_decode(s + i, n - i, &cp);
        size_t j = i + k;
        while (j < n && (unsigned char)s[j] >= 0x80) {
            int32_t c2;
            size_t k2 = tk_utf8_decode(s + j, n - j, &c2);
            if (u_cut_before(c2, f)) break;
            j += k2;
        }
        bool seg_dirty = !(j == i + k && u_inert(cp, utf8proc_get_property(cp), f));
        /* Changing pieces go to utf8proc one by one, for their alignments. */
        if ((seg_dirty || dirty) && i > run) {
            HR_TRY(dirty ? utf8proc_form(t, s + run, tk_al_at(al, run), i - run, o)
                         : put_src(o, s + run, tk_al_at(al, run), i - run));
            run = i;
        }
        dirty = seg_dirty;
        i = j;
    }
    return dirty ? utf8proc_form(t, s + run, tk_al_at(al, run), n - run, o)
                 : put_src(o, s + run, tk_al_at(al, run), n - run);
}

static hr_status lowercase(const char *s, const tk_align *al, size_t n, nz_out o) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_decode(s + i, n - i, &cp);
        if (cp == 0x130) /* the one code point whose lowercase is two */
            HR_TRY(put(o, "i\xCC\x87", 3, tk_al_get(al, i)));
        else if (cp < 0x80)
            HR_TRY(put_cp(o, cp >= 'A' && cp <= 'Z' ? cp + 32 : cp, tk_al_get(al, i)));
        else
            HR_TRY(put_cp(o, utf8proc_tolower(cp), tk_al_get(al, i)));
        i += k;
    }
    return HR_OK;
}

static hr_status strip(const tk_normalizer *nz, const char *s, const tk_align *al, size_t n, nz_out o) {
    size_t a = 0, b = n;
    if (nz->strip_left)
        while (a < b) {
            int32_t cp;
            size_t k = tk_utf8_decode(s + a, b - a, &cp);
            if (!tk_cp_is_whitespace(cp)) break;
            a += k;
        }
    if (nz->strip_right)
        while (b > a) {
            size_t k = 1;
            while (k < b - a && ((unsigned char)s[b - k] & 0xC0) == 0x80) k++;
            int32_t cp;
            tk_utf8_decode(s + b - k, k, &cp);
            if (!tk_cp_is_whitespace(cp)) break;
            b -= k;
        }
    return put_src(o, s + a, tk_al_at(al, a), b - a);
}

static hr_status filter_marks(const char *s, const tk_align *al, size_t n, bool nonspacing_only, nz_out o) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_decode(s + i, n - i, &cp);
        bool drop = cp >= 0x300 && (nonspacing_only ? utf8proc_category(cp) == UTF8PROC_CATEGORY_MN
                                                    : tk_cp_category(cp) == 'M');
        if (!drop) HR_TRY(put_src(o, s + i, tk_al_at(al, i), k));
        i += k;
    }
    return HR_OK;
}

static hr_status replace(const tk_normalizer *nz, const char *s, const tk_align *al, size_t n, nz_out o, tk_ws *ws) {
    HR_TRY(tk_regex_find(nz->pattern, s, n, &ws->spans));
    for (size_t i = 0; i < ws->spans.n; i++) {
        tk_span sp = ws->spans.v[i];
        if (!sp.match) HR_TRY(put_src(o, s + sp.start, tk_al_at(al, sp.start), sp.end - sp.start));
        /* The content is inserted after the removed match: it takes the
         * alignment of the match's last byte. */
        else HR_TRY(put(o, nz->content, nz->content_len, sp.end ? tk_al_get(al, sp.end - 1) : (tk_align){0, 0}));
    }
    return HR_OK;
}

static bool is_chinese(int32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static hr_status bert_clean(const tk_normalizer *nz, const char *s, const tk_align *al, size_t n, nz_out o) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_decode(s + i, n - i, &cp);
        const tk_align a = tk_al_get(al, i);
        i += k;
        if (nz->clean_text) {
            /* Controls go first (U+0085 too, though Rust calls it whitespace). */
            bool control = cp != '\t' && cp != '\n' && cp != '\r' && tk_cp_category(cp) == 'C';
            if (cp == 0 || cp == 0xFFFD || control) continue;
            if (tk_cp_is_whitespace(cp)) {
                HR_TRY(put(o, " ", 1, a));
                continue;
            }
        }
        if (nz->chinese && is_chinese(cp)) {
            HR_TRY(put(o, " ", 1, a));
            HR_TRY(put_src(o, s + i - k, tk_al_at(al, i - k), k));
            HR_TRY(put(o, " ", 1, a));
            continue;
        }
        HR_TRY(put_src(o, s + i - k, tk_al_at(al, i - k), k));
    }
    return HR_OK;
}

static hr_status bert(const tk_normalizer *nz, const char *s, const tk_align *al, size_t n, nz_out o) {
    tk_buf a = {0}, b = {0};
    tk_aligns aa = {0}, ba = {0};
    bool track = o.a != NULL;
    hr_status st = bert_clean(nz, s, al, n, (nz_out){&a, track ? &aa : NULL});
    if (st == HR_OK && nz->strip_accents) {
        st = unicode_form(NZ_NFD, a.p ? a.p : "", aa.p, a.n, (nz_out){&b, track ? &ba : NULL});
        a.n = aa.n = 0;
        if (st == HR_OK) st = filter_marks(b.p ? b.p : "", ba.p, b.n, true, (nz_out){&a, track ? &aa : NULL});
    }
    if (st == HR_OK) st = nz->lowercase ? lowercase(a.p ? a.p : "", aa.p, a.n, o) : put_src(o, a.p, aa.p, a.n);
    tk_buf_free(&a);
    tk_buf_free(&b);
    tk_aligns_free(&aa);
    tk_aligns_free(&ba);
    return st;
}

/* SentencePiece's NMT rules: ASCII controls go, some spaces become ' '. */
static hr_status nmt(const char *s, const tk_align *al, size_t n, nz_out o) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_decode(s + i, n - i, &cp);
        bool drop = (cp >= 1 && cp <= 8) || cp == 0x0B || (cp >= 0x0E && cp <= 0x1F) || cp == 0x7F || cp == 0x8F ||
                    cp == 0x9F;
        bool space = cp == 0x09 || cp == 0x0A || cp == 0x0C || cp == 0x0D || cp == 0x1680 || (cp >= 0x200B && cp <= 0x200F) ||
                     cp == 0x2028 || cp == 0x2029 || cp == 0x2581 || cp == 0xFEFF || cp == 0xFFFD;
        if (space) HR_TRY(put(o, " ", 1, tk_al_get(al, i)));
        else if (!drop) HR_TRY(put_src(o, s + i, tk_al_at(al, i), k));
        i += k;
    }
    return HR_OK;
}

static hr_status byte_level(const char *s, const tk_align *al, size_t n, nz_out o) {
    for (size_t i = 0; i < n; i++) HR_TRY(put_cp(o, tk_byte_to_cp[(unsigned char)s[i]], tk_al_get(al, i)));
    return HR_OK;
}

static hr_status normalize_into(const tk_normalizer *nz, const char *s, const tk_align *al, size_t n, nz_out o,
                                tk_ws *ws) {
    switch (nz->type) {
    case NZ_NFC: case NZ_NFD: case NZ_NFKC: case NZ_NFKD:
        return unicode_form(nz->type, s, al, n, o);
    case NZ_LOWERCASE: return lowercase(s, al, n, o);
    case NZ_STRIP: return strip(nz, s, al, n, o);
    case NZ_STRIP_ACCENTS: return filter_marks(s, al, n, false, o);
    case NZ_REPLACE: return replace(nz, s, al, n, o, ws);
    case NZ_PREPEND:
        if (n) HR_TRY(put(o, nz->content, nz->content_len, tk_al_get(al, 0)));
        return put_src(o, s, al, n);
    case NZ_BERT: return bert(nz, s, al, n, o);
    case NZ_BYTE_LEVEL: return byte_level(s, al, n, o);
    case NZ_NMT: return nmt(s, al, n, o);
    case NZ_PRECOMPILED:
        return nz->charsmap ? tk_charsmap_normalize(nz->charsmap, s, al, n, o.b, o.a) : put_src(o, s, al, n);
    case NZ_SEQUENCE: {
        tk_buf cur = {0}, next = {0};
        tk_aligns cur_al = {0}, next_al = {0};
        bool track = o.a != NULL;
        hr_status st = put_src((nz_out){&cur, track ? &cur_al : NULL}, s, al, n);
        for (size_t i = 0; st == HR_OK && i < nz->n_children; i++) {
            next.n = next_al.n = 0;
            st = tk_buf_append(&next, "", 0);
            if (st == HR_OK)
                st = normalize_into(nz->children[i], cur.p, cur_al.p, cur.n, (nz_out){&next, track ? &next_al : NULL}, ws);
            tk_buf t = cur;
            cur = next;
            next = t;
            tk_aligns ta = cur_al;
            cur_al = next_al;
            next_al = ta;
        }
        if (st == HR_OK) st = put_src(o, cur.p, cur_al.p, cur.n);
        tk_buf_free(&cur);
        tk_buf_free(&next);
        tk_aligns_free(&cur_al);
        tk_aligns_free(&next_al);
        return st;
    }
    }
    return hr_error(HR_ERR_INTERNAL, "normalizer: bad type %d", (int)nz->type);
}

hr_status tk_normalize(const tk_normalizer *nz, const char *s, const tk_align *al, size_t n, tk_buf *out,
                       tk_aligns *al_out, tk_ws *ws) {
    out->n = 0;
    if (al_out) al_out->n = 0;
    HR_TRY(tk_buf_append(out, "", 0));
    return normalize_into(nz, s, al, n, (nz_out){out, al_out}, ws);
}
