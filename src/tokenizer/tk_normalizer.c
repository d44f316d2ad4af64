/* Normalizers: NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents, Replace,
 * Prepend, BertNormalizer, ByteLevel and Sequence, as in tokenizers. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/tk_internal.h"

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
    NZ_SEQUENCE,
} nz_type;

struct tk_normalizer {
    nz_type type;
    bool strip_left, strip_right;                          /* Strip */
    tk_regex *pattern;                                     /* Replace */
    char *content;                                         /* Replace content, Prepend text */
    size_t content_len;
    bool clean_text, chinese, strip_accents, lowercase;    /* BertNormalizer */
    tk_normalizer **children;                              /* Sequence (n_children) */
    size_t n_children;
};

static const struct {
    const char *name;
    nz_type type;
} nz_names[] = {
    {"NFC", NZ_NFC}, {"NFD", NZ_NFD}, {"NFKC", NZ_NFKC}, {"NFKD", NZ_NFKD},
    {"Lowercase", NZ_LOWERCASE}, {"Strip", NZ_STRIP}, {"StripAccents", NZ_STRIP_ACCENTS},
    {"Replace", NZ_REPLACE}, {"Prepend", NZ_PREPEND}, {"BertNormalizer", NZ_BERT},
    {"ByteLevel", NZ_BYTE_LEVEL}, {"Sequence", NZ_SEQUENCE},
};

void tk_normalizer_free(tk_normalizer *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_children; i++) tk_normalizer_free(n->children[i]);
    free(n->children);
    tk_regex_free(n->pattern);
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
    const char *type = tk_json_type(j);
    if (!type) return hr_error(HR_ERR_FORMAT, "normalizer: missing string field 'type'");
    size_t k = 0;
    while (k < sizeof nz_names / sizeof nz_names[0] && strcmp(nz_names[k].name, type)) k++;
    if (k == sizeof nz_names / sizeof nz_names[0]) return hr_error(HR_ERR_UNSUPPORTED, "unsupported normalizer '%s'", type);
    tk_normalizer *n = calloc(1, sizeof *n);
    if (!n) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    n->type = nz_names[k].type;
    hr_status st = parse_fields(j, n);
    if (st != HR_OK) {
        tk_normalizer_free(n);
        return st;
    }
    *out = n;
    return HR_OK;
}

/* ---- the transformations ---------------------------------------------------- */

static bool is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

static hr_status utf8proc_form(nz_type t, const char *s, size_t n, tk_buf *out);

/* NFC leaves most text as it is; only the runs that can change go through
 * utf8proc. A cut is a position before a starter that has no canonical
 * decomposition and composes with nothing before it: NFC of the whole is
 * NFC of the pieces between cuts. A piece of one such starter is unchanged. */
static bool nfc_inert(int32_t cp, const utf8proc_property_t *p) {
    return cp < 0x80 || p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0;
}

static bool nfc_cut_before(int32_t cp, const utf8proc_property_t *p) {
    if (cp < 0x80) return true;
    if (cp >= 0x1160 && cp <= 0x11FF) return false; /* Hangul vowels and trailing consonants compose */
    return p->combining_class == 0 && (p->comb_index == UINT16_MAX || p->comb_index < 0x8000) && nfc_inert(cp, p);
}

static hr_status nfc(const char *s, size_t n, tk_buf *out) {
    size_t run = 0;  /* start of the pending run */
    bool dirty = false;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = (unsigned char)s[i] < 0x80 ? (cp = s[i], 1) : tk_utf8_decode(s + i, n - i, &cp);
        bool inert = cp < 0x80 || nfc_inert(cp, utf8proc_get_property(cp));
        size_t j = i + k;
        while (j < n) {
            int32_t c2;
            if ((unsigned char)s[j] < 0x80) break;
            size_t k2 = tk_utf8_decode(s + j, n - j, &c2);
            if (nfc_cut_before(c2, utf8proc_get_property(c2))) break;
            j += k2;
        }
        bool seg_dirty = !(inert && j == i + k);
        if (seg_dirty != dirty && i > run) {
            HR_TRY(dirty ? utf8proc_form(NZ_NFC, s + run, i - run, out) : tk_buf_append(out, s + run, i - run));
            run = i;
        }
        dirty = seg_dirty;
        i = j;
    }
    return dirty ? utf8proc_form(NZ_NFC, s + run, n - run, out) : tk_buf_append(out, s + run, n - run);
}

static hr_status unicode_form(nz_type t, const char *s, size_t n, tk_buf *out) {
    if (is_ascii(s, n)) return tk_buf_append(out, s, n);
    return t == NZ_NFC ? nfc(s, n, out) : utf8proc_form(t, s, n, out);
}

static hr_status utf8proc_form(nz_type t, const char *s, size_t n, tk_buf *out) {
    utf8proc_option_t opt = UTF8PROC_STABLE;
    if (t == NZ_NFC || t == NZ_NFKC) opt |= UTF8PROC_COMPOSE;
    else opt |= UTF8PROC_DECOMPOSE;
    if (t == NZ_NFKC || t == NZ_NFKD) opt |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
    if (r < 0) return hr_error(HR_ERR_INVALID_ARG, "normalizer: %s", utf8proc_errmsg(r));
    hr_status st = tk_buf_append(out, dst, (size_t)r);
    free(dst);
    return st;
}

static hr_status append_cp(tk_buf *out, int32_t cp) {
    char u[4];
    return tk_buf_append(out, u, tk_utf8_encode(cp, u));
}

static hr_status lowercase(const char *s, size_t n, tk_buf *out) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        i += tk_utf8_decode(s + i, n - i, &cp);
        if (cp == 0x130) { /* the one code point whose lowercase is two */
            HR_TRY(tk_buf_append(out, "i\xCC\x87", 3));
            continue;
        }
        HR_TRY(append_cp(out, cp < 0x80 ? (cp >= 'A' && cp <= 'Z' ? cp + 32 : cp) : utf8proc_tolower(cp)));
    }
    return HR_OK;
}

static hr_status strip(const tk_normalizer *nz, const char *s, size_t n, tk_buf *out) {
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
    return tk_buf_append(out, s + a, b - a);
}

static hr_status filter_marks(const char *s, size_t n, bool nonspacing_only, tk_buf *out) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_decode(s + i, n - i, &cp);
        bool drop = cp >= 0x300 && (nonspacing_only ? utf8proc_category(cp) == UTF8PROC_CATEGORY_MN
                                                    : tk_cp_category(cp) == 'M');
        if (!drop) HR_TRY(tk_buf_append(out, s + i, k));
        i += k;
    }
    return HR_OK;
}

static hr_status replace(const tk_normalizer *nz, const char *s, size_t n, tk_buf *out, tk_ws *ws) {
    HR_TRY(tk_regex_find(nz->pattern, s, n, &ws->spans));
    for (size_t i = 0; i < ws->spans.n; i++) {
        tk_span sp = ws->spans.v[i];
        if (sp.match) HR_TRY(tk_buf_append(out, nz->content, nz->content_len));
        else HR_TRY(tk_buf_append(out, s + sp.start, sp.end - sp.start));
    }
    return HR_OK;
}

static bool is_chinese(int32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static hr_status bert_clean(const tk_normalizer *nz, const char *s, size_t n, tk_buf *out) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_decode(s + i, n - i, &cp);
        i += k;
        if (nz->clean_text) {
            /* Controls go first (U+0085 too, though Rust calls it whitespace). */
            bool control = cp != '\t' && cp != '\n' && cp != '\r' && tk_cp_category(cp) == 'C';
            if (cp == 0 || cp == 0xFFFD || control) continue;
            if (tk_cp_is_whitespace(cp)) {
                HR_TRY(tk_buf_append(out, " ", 1));
                continue;
            }
        }
        if (nz->chinese && is_chinese(cp)) {
            HR_TRY(tk_buf_append(out, " ", 1));
            HR_TRY(tk_buf_append(out, s + i - k, k));
            HR_TRY(tk_buf_append(out, " ", 1));
            continue;
        }
        HR_TRY(tk_buf_append(out, s + i - k, k));
    }
    return HR_OK;
}

static hr_status bert(const tk_normalizer *nz, const char *s, size_t n, tk_buf *out) {
    tk_buf a = {0}, b = {0};
    hr_status st = bert_clean(nz, s, n, &a);
    if (st == HR_OK && nz->strip_accents) {
        st = unicode_form(NZ_NFD, a.p ? a.p : "", a.n, &b);
        a.n = 0;
        if (st == HR_OK) st = filter_marks(b.p ? b.p : "", b.n, true, &a);
    }
    if (st == HR_OK) st = nz->lowercase ? lowercase(a.p ? a.p : "", a.n, out) : tk_buf_append(out, a.p, a.n);
    tk_buf_free(&a);
    tk_buf_free(&b);
    return st;
}

static hr_status byte_level(const char *s, size_t n, tk_buf *out) {
    for (size_t i = 0; i < n; i++) HR_TRY(append_cp(out, tk_byte_to_cp[(unsigned char)s[i]]));
    return HR_OK;
}

static hr_status normalize_into(const tk_normalizer *nz, const char *s, size_t n, tk_buf *out, tk_ws *ws) {
    switch (nz->type) {
    case NZ_NFC: case NZ_NFD: case NZ_NFKC: case NZ_NFKD:
        return unicode_form(nz->type, s, n, out);
    case NZ_LOWERCASE: return lowercase(s, n, out);
    case NZ_STRIP: return strip(nz, s, n, out);
    case NZ_STRIP_ACCENTS: return filter_marks(s, n, false, out);
    case NZ_REPLACE: return replace(nz, s, n, out, ws);
    case NZ_PREPEND:
        if (n) HR_TRY(tk_buf_append(out, nz->content, nz->content_len));
        return tk_buf_append(out, s, n);
    case NZ_BERT: return bert(nz, s, n, out);
    case NZ_BYTE_LEVEL: return byte_level(s, n, out);
    case NZ_SEQUENCE: {
        tk_buf cur = {0}, next = {0};
        hr_status st = tk_buf_append(&cur, s, n);
        for (size_t i = 0; st == HR_OK && i < nz->n_children; i++) {
            next.n = 0;
            st = tk_buf_append(&next, "", 0);
            if (st == HR_OK) st = normalize_into(nz->children[i], cur.p, cur.n, &next, ws);
            tk_buf t = cur;
            cur = next;
            next = t;
        }
        if (st == HR_OK) st = tk_buf_append(out, cur.p, cur.n);
        tk_buf_free(&cur);
        tk_buf_free(&next);
        return st;
    }
    }
    return hr_error(HR_ERR_INTERNAL, "normalizer: bad type %d", (int)nz->type);
}

hr_status tk_normalize(const tk_normalizer *nz, const char *s, size_t n, tk_buf *out, tk_ws *ws) {
    out->n = 0;
    HR_TRY(tk_buf_append(out, "", 0));
    return normalize_into(nz, s, n, out, ws);
}
