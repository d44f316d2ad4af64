/* Decoders: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
 * WordPiece, BPEDecoder, CTC and Sequence. Each step rewrites the list of
 * token strings; the result is their concatenation, as in tokenizers. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_internal.h"

typedef enum {
    DC_BYTE_LEVEL,
    DC_METASPACE,
    DC_REPLACE,
    DC_BYTE_FALLBACK,
    DC_FUSE,
    DC_STRIP,
    DC_WORDPIECE,
    DC_BPE,
    DC_CTC,
    DC_SEQUENCE,
} dc_type;

struct tk_decoder {
    dc_type type;
    tk_regex *pattern;       /* Replace */
    char *s1, *s2;           /* Replace content; Metaspace replacement; WordPiece prefix;
                                BPEDecoder suffix; CTC pad token (s1) and word delimiter (s2) */
    size_t n1, n2;
    int32_t strip_cp;        /* Strip content */
    size_t strip_start, strip_stop;
    bool cleanup;            /* WordPiece, CTC */
    bool prepend;            /* Metaspace: prepend_scheme != never */
    tk_decoder **children;   /* Sequence (n_children) */
    size_t n_children;
};

static const char *const dc_names[] = {
    [DC_BYTE_LEVEL] = "ByteLevel", [DC_METASPACE] = "Metaspace", [DC_REPLACE] = "Replace",
    [DC_BYTE_FALLBACK] = "ByteFallback", [DC_FUSE] = "Fuse", [DC_STRIP] = "Strip", [DC_WORDPIECE] = "WordPiece",
    [DC_BPE] = "BPEDecoder", [DC_CTC] = "CTC", [DC_SEQUENCE] = "Sequence",
};

void tk_decoder_free(tk_decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_children; i++) tk_decoder_free(d->children[i]);
    free(d->children);
    tk_regex_free(d->pattern);
    free(d->s1);
    free(d->s2);
    free(d);
}

static hr_status dup_field(const cJSON *j, const char *key, const char *dflt, const char *what, char **out, size_t *n) {
    const char *s;
    HR_TRY(tk_json_opt_string(j, key, what, &s));
    if (!s) s = dflt;
    *n = strlen(s);
    *out = malloc(*n + 1);
    if (!*out) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    memcpy(*out, s, *n + 1);
    return HR_OK;
}

static hr_status parse_fields(const cJSON *j, tk_decoder *d) {
    switch (d->type) {
    case DC_METASPACE: {
        HR_TRY(dup_field(j, "replacement", "\xE2\x96\x81", "decoder 'Metaspace'", &d->s1, &d->n1));
        const cJSON *ps = tk_json_get(j, "prepend_scheme");
        d->prepend = cJSON_IsString(ps) ? strcmp(ps->valuestring, "never") != 0 : tk_json_bool(j, "add_prefix_space", true);
        return HR_OK;
    }
    case DC_REPLACE:
        HR_TRY(tk_pattern_parse(tk_json_get(j, "pattern"), "decoder 'Replace'", &d->pattern));
        return dup_field(j, "content", "", "decoder 'Replace'", &d->s1, &d->n1);
    case DC_STRIP: {
        const char *c;
        HR_TRY(tk_json_string(j, "content", "decoder 'Strip'", &c));
        size_t n = strlen(c);
        if (n == 0 || n > 4 || tk_utf8_valid_prefix(c, n) != n || tk_utf8_decode(c, n, &d->strip_cp) != n)
            return hr_error(HR_ERR_FORMAT, "decoder 'Strip': field 'content' must be one character");
        const cJSON *a = tk_json_get(j, "start"), *b = tk_json_get(j, "stop");
        d->strip_start = cJSON_IsNumber(a) && a->valuedouble > 0 ? (size_t)a->valuedouble : 0;
        d->strip_stop = cJSON_IsNumber(b) && b->valuedouble > 0 ? (size_t)b->valuedouble : 0;
        return HR_OK;
    }
    case DC_WORDPIECE:
        d->cleanup = tk_json_bool(j, "cleanup", true);
        return dup_field(j, "prefix", "##", "decoder 'WordPiece'", &d->s1, &d->n1);
    case DC_BPE:
        return dup_field(j, "suffix", "</w>", "decoder 'BPEDecoder'", &d->s1, &d->n1);
    case DC_CTC:
        d->cleanup = tk_json_bool(j, "cleanup", true);
        HR_TRY(dup_field(j, "pad_token", "<pad>", "decoder 'CTC'", &d->s1, &d->n1));
        return dup_field(j, "word_delimiter_token", "|", "decoder 'CTC'", &d->s2, &d->n2);
    case DC_SEQUENCE: {
        const cJSON *arr = tk_json_get(j, "decoders"), *it;
        if (!cJSON_IsArray(arr)) return hr_error(HR_ERR_FORMAT, "decoder 'Sequence': field 'decoders' must be an array");
        d->children = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *d->children);
        if (!d->children) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        cJSON_ArrayForEach(it, arr) {
            HR_TRY(tk_decoder_parse(it, &d->children[d->n_children]));
            if (d->children[d->n_children]) d->n_children++;
        }
        return HR_OK;
    }
    default:
        return HR_OK;
    }
}

hr_status tk_decoder_parse(const cJSON *j, tk_decoder **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return HR_OK;
    int k;
    HR_TRY(tk_json_type_index(j, dc_names, (int)(sizeof dc_names / sizeof dc_names[0]), "decoder", &k));
    tk_decoder *d = calloc(1, sizeof *d);
    if (!d) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    d->type = (dc_type)k;
    hr_status st = parse_fields(j, d);
    if (st != HR_OK) {
        tk_decoder_free(d);
        return st;
    }
    *out = d;
    return HR_OK;
}

/* ---- steps -------------------------------------------------------------------- */

#define TOK(l, i) ((l)->text.p + (l)->off[i])

/* Appends s with every occurrence of `from` replaced by `to`. */
static hr_status replace_all(tk_buf *out, const char *s, size_t n, const char *from, size_t fn, const char *to, size_t tn) {
    size_t i = 0;
    while (fn && i + fn <= n) {
        const char *at = memmem(s + i, n - i, from, fn);
        if (!at) break;
        HR_TRY(tk_buf_append(out, s + i, (size_t)(at - s) - i));
        HR_TRY(tk_buf_append(out, to, tn));
        i = (size_t)(at - s) + fn;
    }
    return tk_buf_append(out, s + i, n - i);
}

static hr_status cleanup(tk_buf *b) {
    static const char *const pairs[][2] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    tk_buf t = {0};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        t.n = 0;
        hr_status st = replace_all(&t, b->p ? b->p : "", b->n, pairs[k][0], strlen(pairs[k][0]), pairs[k][1],
                                   strlen(pairs[k][1]));
        if (st != HR_OK) {
            tk_buf_free(&t);
            return st;
        }
        tk_buf x = *b;
        *b = t;
        t = x;
    }
    tk_buf_free(&t);
    return HR_OK;
}

static hr_status byte_level(const tk_strs *in, tk_strs *out, tk_buf *tmp) {
    tmp->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = TOK(in, i);
        size_t n = in->len[i], start = tmp->n;
        bool ok = true;
        for (size_t k = 0; k < n && ok;) {
            int32_t cp;
            k += tk_utf8_decode(s + k, n - k, &cp);
            int b = tk_cp_to_byte(cp);
            if (b < 0) ok = false;
            else {
                char c = (char)b;
                HR_TRY(tk_buf_append(tmp, &c, 1));
            }
        }
        if (!ok) {
            tmp->n = start;
            HR_TRY(tk_buf_append(tmp, s, n));
        }
    }
    tk_buf lossy = {0};
    hr_status st = tk_utf8_lossy_append(&lossy, tmp->p ? tmp->p : "", tmp->n);
    if (st == HR_OK) st = tk_strs_push(out, lossy.p ? lossy.p : "", lossy.n);
    tk_buf_free(&lossy);
    return st;
}

static hr_status byte_fallback(const tk_strs *in, tk_strs *out, tk_buf *bytes) {
    bytes->n = 0;
    for (size_t i = 0; i <= in->n; i++) {
        const char *s = i < in->n ? TOK(in, i) : NULL;
        size_t n = i < in->n ? in->len[i] : 0;
        int hi = -1, lo = -1;
        if (s && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
            const char *hex = "0123456789ABCDEF", *a = memchr(hex, s[3], 16), *b = memchr(hex, s[4], 16);
            const char *hexl = "0123456789abcdef", *al = memchr(hexl, s[3], 16), *bl = memchr(hexl, s[4], 16);
            hi = a ? (int)(a - hex) : al ? (int)(al - hexl) : -1;
            lo = b ? (int)(b - hex) : bl ? (int)(bl - hexl) : -1;
        }
        if (hi >= 0 && lo >= 0) {
            char c = (char)(hi * 16 + lo);
            HR_TRY(tk_buf_append(bytes, &c, 1));
            continue;
        }
        if (bytes->n) {
            /* A run that is not valid UTF-8 becomes one U+FFFD per byte. */
            if (tk_utf8_valid_prefix(bytes->p, bytes->n) == bytes->n) HR_TRY(tk_strs_push(out, bytes->p, bytes->n));
            else
                for (size_t k = 0; k < bytes->n; k++) HR_TRY(tk_strs_push(out, "\xEF\xBF\xBD", 3));
            bytes->n = 0;
        }
        if (s) HR_TRY(tk_strs_push(out, s, n));
    }
    return HR_OK;
}

static hr_status per_token(const tk_decoder *d, const tk_strs *in, tk_strs *out, tk_buf *b, tk_ws *ws) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = TOK(in, i);
        size_t n = in->len[i];
        b->n = 0;
        HR_TRY(tk_buf_append(b, "", 0));
        switch (d->type) {
        case DC_METASPACE:
            /* As tokenizers does: in the first token every replacement goes. */
            HR_TRY(replace_all(b, s, n, d->s1, d->n1, " ", i == 0 && d->prepend ? 0 : 1));
            break;
        case DC_REPLACE:
            HR_TRY(tk_regex_find(d->pattern, s, n, &ws->spans));
            for (size_t k = 0; k < ws->spans.n; k++) {
                tk_span sp = ws->spans.v[k];
                HR_TRY(sp.match ? tk_buf_append(b, d->s1, d->n1) : tk_buf_append(b, s + sp.start, sp.end - sp.start));
            }
            break;
        case DC_STRIP: {
            size_t a = 0, z = n;
            for (size_t k = 0; k < d->strip_start && a < z; k++) {
                int32_t cp;
                size_t l = tk_utf8_decode(s + a, z - a, &cp);
                if (cp != d->strip_cp) break;
                a += l;
            }
            for (size_t k = 0; k < d->strip_stop && z > a; k++) {
                size_t l = 1;
                while (l < z - a && ((unsigned char)s[z - l] & 0xC0) == 0x80) l++;
                int32_t cp;
                tk_utf8_decode(s + z - l, l, &cp);
                if (cp != d->strip_cp) break;
                z -= l;
            }
            HR_TRY(tk_buf_append(b, s + a, z - a));
            break;
        }
        case DC_WORDPIECE:
            if (i && n >= d->n1 && !memcmp(s, d->s1, d->n1)) HR_TRY(tk_buf_append(b, s + d->n1, n - d->n1));
            else {
                if (i) HR_TRY(tk_buf_append(b, " ", 1));
                HR_TRY(tk_buf_append(b, s, n));
            }
            if (d->cleanup) HR_TRY(cleanup(b));
            break;
        case DC_BPE:
            HR_TRY(replace_all(b, s, n, d->s1, d->n1, " ", i + 1 == in->n ? 0 : 1));
            break;
        case DC_CTC:
            if (i && in->len[i - 1] == n && !memcmp(TOK(in, i - 1), s, n)) continue;
            HR_TRY(replace_all(b, s, n, d->s1, d->n1, "", 0));
            if (d->cleanup) {
                HR_TRY(cleanup(b));
                tk_buf t = {0};
                hr_status st = replace_all(&t, b->p, b->n, d->s2, d->n2, " ", 1);
                if (st == HR_OK) {
                    b->n = 0;
                    st = tk_buf_append(b, t.p, t.n);
                }
                tk_buf_free(&t);
                HR_TRY(st);
            }
            if (b->n == 0) continue;
            break;
        default:
            return hr_error(HR_ERR_INTERNAL, "decoder: bad type");
        }
        HR_TRY(tk_strs_push(out, b->p, b->n));
    }
    return HR_OK;
}

static hr_status decode_chain(const tk_decoder *d, tk_strs *toks, tk_ws *ws) {
    if (d->type == DC_SEQUENCE) {
        for (size_t i = 0; i < d->n_children; i++) HR_TRY(decode_chain(d->children[i], toks, ws));
        return HR_OK;
    }
    tk_strs out = {0};
    hr_status st;
    switch (d->type) {
    case DC_BYTE_LEVEL: st = byte_level(toks, &out, &ws->t1); break;
    case DC_BYTE_FALLBACK: st = byte_fallback(toks, &out, &ws->t1); break;
    case DC_FUSE: {
        tk_buf joined = {0};
        st = tk_buf_append(&joined, "", 0);
        for (size_t i = 0; st == HR_OK && i < toks->n; i++) st = tk_buf_append(&joined, TOK(toks, i), toks->len[i]);
        if (st == HR_OK) st = tk_strs_push(&out, joined.p, joined.n);
        tk_buf_free(&joined);
        break;
    }
    default: st = per_token(d, toks, &out, &ws->t1, ws); break;
    }
    if (st == HR_OK) {
        tk_strs t = *toks;
        *toks = out;
        out = t;
    }
    tk_strs_free(&out);
    return st;
}

hr_status tk_decode_tokens(const tk_decoder *d, tk_strs *toks, tk_buf *out) {
    out->n = 0;
    HR_TRY(tk_buf_append(out, "", 0));
    if (!d) {
        for (size_t i = 0; i < toks->n; i++) {
            if (i) HR_TRY(tk_buf_append(out, " ", 1));
            HR_TRY(tk_buf_append(out, TOK(toks, i), toks->len[i]));
        }
        return HR_OK;
    }
    tk_ws ws = {0};
    hr_status st = decode_chain(d, toks, &ws);
    for (size_t i = 0; st == HR_OK && i < toks->n; i++) st = tk_buf_append(out, TOK(toks, i), toks->len[i]);
    tk_ws_clear(&ws);
    return st;
}
