/* Pre-tokenizers: Split, ByteLevel, Metaspace, Digits, Punctuation,
 * Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit and
 * Sequence, as in tokenizers. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_internal.h"

typedef enum {
    PT_SPLIT,
    PT_BYTE_LEVEL,
    PT_METASPACE,
    PT_DIGITS,
    PT_PUNCTUATION,
    PT_WHITESPACE,
    PT_WHITESPACE_SPLIT,
    PT_BERT,
    PT_CHAR_DELIMITER,
    PT_SEQUENCE,
} pt_type;

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;

struct tk_pretok {
    pt_type type;
    tk_regex *re;                  /* Split pattern, ByteLevel and Whitespace regex */
    tk_split_behavior behavior;    /* Split, Punctuation */
    bool invert;                   /* Split */
    bool add_prefix_space, use_regex; /* ByteLevel */
    char rep[5];                   /* Metaspace replacement, UTF-8 */
    size_t rep_len;
    int32_t rep_cp;                /* Metaspace replacement, CharDelimiterSplit delimiter */
    prepend_scheme scheme;
    bool split;                    /* Metaspace */
    bool individual_digits;        /* Digits */
    tk_pretok **children;          /* Sequence (n_children) */
    size_t n_children;
};

static const char *const pt_names[] = {
    [PT_SPLIT] = "Split", [PT_BYTE_LEVEL] = "ByteLevel", [PT_METASPACE] = "Metaspace", [PT_DIGITS] = "Digits",
    [PT_PUNCTUATION] = "Punctuation", [PT_WHITESPACE] = "Whitespace", [PT_WHITESPACE_SPLIT] = "WhitespaceSplit",
    [PT_BERT] = "BertPreTokenizer", [PT_CHAR_DELIMITER] = "CharDelimiterSplit", [PT_SEQUENCE] = "Sequence",
};

/* GPT-2's pattern, as tokenizers' ByteLevel spells it. */
static const char BYTE_LEVEL_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Whitespace uses Rust's regex crate, whose \\w also takes Join_Control. */
#define RUST_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"
static const char WHITESPACE_RE[] = "[" RUST_WORD "]+|[^" RUST_WORD "\\p{White_Space}]+";

void tk_pretok_free(tk_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_children; i++) tk_pretok_free(p->children[i]);
    free(p->children);
    tk_regex_free(p->re);
    free(p);
}

static hr_status parse_char(const cJSON *j, const char *field, const char *what, const char *dflt, tk_pretok *p) {
    const char *s = dflt;
    const cJSON *v = tk_json_get(j, field);
    if (cJSON_IsString(v)) s = v->valuestring;
    size_t n = strlen(s);
    if (n == 0 || n > 4 || tk_utf8_valid_prefix(s, n) != n || tk_utf8_decode(s, n, &p->rep_cp) != n)
        return hr_error(HR_ERR_FORMAT, "pre-tokenizer '%s': field '%s' must be one character", what, field);
    memcpy(p->rep, s, n + 1);
    p->rep_len = n;
    return HR_OK;
}

static hr_status parse_fields(const cJSON *j, tk_pretok *p, const char *type) {
    switch (p->type) {
    case PT_SPLIT:
        p->behavior = TK_SPLIT_REMOVED;
        HR_TRY(tk_split_behavior_parse(j, "behavior", &p->behavior));
        p->invert = tk_json_bool(j, "invert", false);
        return tk_pattern_parse(tk_json_get(j, "pattern"), "pre-tokenizer 'Split'", &p->re);
    case PT_BYTE_LEVEL:
        p->add_prefix_space = tk_json_bool(j, "add_prefix_space", true);
        p->use_regex = tk_json_bool(j, "use_regex", true);
        return p->use_regex ? tk_regex_compile(BYTE_LEVEL_RE, strlen(BYTE_LEVEL_RE), false, &p->re) : HR_OK;
    case PT_METASPACE: {
        HR_TRY(parse_char(j, "replacement", type, "\xE2\x96\x81", p));
        p->split = tk_json_bool(j, "split", true);
        const cJSON *ps = tk_json_get(j, "prepend_scheme");
        p->scheme = tk_json_bool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
        if (cJSON_IsString(ps)) {
            if (!strcmp(ps->valuestring, "always")) p->scheme = PREPEND_ALWAYS;
            else if (!strcmp(ps->valuestring, "first")) p->scheme = PREPEND_FIRST;
            else if (!strcmp(ps->valuestring, "never")) p->scheme = PREPEND_NEVER;
            else return hr_error(HR_ERR_FORMAT, "pre-tokenizer 'Metaspace': unknown prepend_scheme '%s'", ps->valuestring);
        }
        return HR_OK;
    }
    case PT_DIGITS:
        p->individual_digits = tk_json_bool(j, "individual_digits", false);
        return HR_OK;
    case PT_PUNCTUATION:
        p->behavior = TK_SPLIT_ISOLATED;
        return tk_split_behavior_parse(j, "behavior", &p->behavior);
    case PT_WHITESPACE:
        return tk_regex_compile(WHITESPACE_RE, strlen(WHITESPACE_RE), false, &p->re);
    case PT_CHAR_DELIMITER:
        return parse_char(j, "delimiter", type, " ", p);
    case PT_SEQUENCE: {
        const cJSON *arr = tk_json_get(j, "pretokenizers");
        if (!cJSON_IsArray(arr))
            return hr_error(HR_ERR_FORMAT, "pre-tokenizer 'Sequence': field 'pretokenizers' must be an array");
        p->children = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *p->children);
        if (!p->children) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            HR_TRY(tk_pretok_parse(it, &p->children[p->n_children]));
            if (p->children[p->n_children]) p->n_children++;
        }
        return HR_OK;
    }
    default:
        return HR_OK;
    }
}

hr_status tk_pretok_parse(const cJSON *j, tk_pretok **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return HR_OK;
    int k;
    HR_TRY(tk_json_type_index(j, pt_names, (int)(sizeof pt_names / sizeof pt_names[0]), "pre-tokenizer", &k));
    tk_pretok *p = calloc(1, sizeof *p);
    if (!p) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    p->type = (pt_type)k;
    hr_status st = parse_fields(j, p, pt_names[k]);
    if (st != HR_OK) {
        tk_pretok_free(p);
        return st;
    }
    *out = p;
    return HR_OK;
}

/* ---- splitting one piece ---------------------------------------------------- */

typedef bool (*cp_pred)(int32_t cp, int32_t arg);

static bool pred_numeric(int32_t cp, int32_t arg) { return tk_cp_is_numeric(cp); }
static bool pred_whitespace(int32_t cp, int32_t arg) { return tk_cp_is_whitespace(cp); }
static bool pred_equal(int32_t cp, int32_t arg) { return cp == arg; }
static bool pred_bert_punct(int32_t cp, int32_t arg) {
    if (cp < 0x80) return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
    return tk_cp_is_punctuation(cp);
}

/* Each code point that satisfies `pred` is its own match (tokenizers' char
 * and closure patterns). */
static hr_status find_chars(cp_pred pred, int32_t arg, const char *s, size_t n, tk_spans *out) {
    out->n = 0;
    if (n == 0) return tk_spans_push(out, 0, 0, false);
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_decode(s + i, n - i, &cp);
        if (pred(cp, arg)) {
            if (last < i) HR_TRY(tk_spans_push(out, (uint32_t)last, (uint32_t)i, false));
            HR_TRY(tk_spans_push(out, (uint32_t)i, (uint32_t)(i + k), true));
            last = i + k;
        }
        i += k;
    }
    if (last < n) HR_TRY(tk_spans_push(out, (uint32_t)last, (uint32_t)n, false));
    return HR_OK;
}

static hr_status split_chars(cp_pred pred, int32_t arg, tk_split_behavior b, const char *s, const tk_align *al,
                             size_t n, bool first, tk_pieces *out, tk_ws *ws) {
    HR_TRY(find_chars(pred, arg, s, n, &ws->spans));
    return tk_split_apply(&ws->spans, b, s, al, first, out);
}

static hr_status byte_level(const tk_pretok *p, const char *s, const tk_align *al, size_t n, bool first, tk_pieces *out,
                            tk_ws *ws) {
    tk_buf *src = &ws->t1;
    tk_aligns *src_al = &ws->a1;
    src->n = src_al->n = 0;
    /* A prepended space shares the first character's alignment. */
    if (p->add_prefix_space && n && s[0] != ' ') {
        HR_TRY(tk_buf_append(src, " ", 1));
        if (al) HR_TRY(tk_aligns_fill(src_al, al[0], 1));
    }
    HR_TRY(tk_buf_append(src, s, n));
    if (al) HR_TRY(tk_aligns_append(src_al, al, n));
    const tk_align *sal = al ? src_al->p : NULL;
    size_t start = out->n;
    if (p->use_regex) {
        HR_TRY(tk_regex_find(p->re, src->p, src->n, &ws->spans));
        HR_TRY(tk_split_apply(&ws->spans, TK_SPLIT_ISOLATED, src->p, sal, first, out));
    } else if (src->n) {
        HR_TRY(tk_pieces_add(out, src->p, sal, src->n, -1, first));
    }
    /* Map every new piece's bytes to the printable alphabet, rewriting the
     * tail of out: each byte becomes one character (one or two bytes) with
     * the byte's alignment. */
    size_t text_start = start < out->n ? out->v[start].off : out->text.n;
    tk_buf *mapped = &ws->t2;
    tk_aligns *mapped_al = &ws->a2;
    mapped->n = mapped_al->n = 0;
    size_t raw_n = out->text.n - text_start;
    HR_TRY(tk_buf_reserve(mapped, 2 * raw_n + 1));
    if (out->track) HR_TRY(tk_aligns_fill(mapped_al, (tk_align){0, 0}, 2 * raw_n));
    for (size_t i = start; i < out->n; i++) {
        tk_piece *pc = &out->v[i];
        uint32_t off = (uint32_t)(text_start + mapped->n);
        const unsigned char *raw = (const unsigned char *)out->text.p + pc->off;
        char *dst = mapped->p + mapped->n;
        if (out->track) {
            const tk_align *raw_al = out->al.p + pc->off;
            tk_align *dst_al = mapped_al->p + mapped->n;
            for (uint32_t k = 0; k < pc->len; k++) {
                size_t w = tk_utf8_encode(tk_byte_to_cp[raw[k]], dst);
                for (size_t q = 0; q < w; q++) *dst_al++ = raw_al[k];
                dst += w;
            }
        } else {
            for (uint32_t k = 0; k < pc->len; k++) dst += tk_utf8_encode(tk_byte_to_cp[raw[k]], dst);
        }
        mapped->n = (size_t)(dst - mapped->p);
        pc->len = (uint32_t)(text_start + mapped->n) - off;
        pc->off = off;
    }
    out->text.n = text_start;
    if (out->track) {
        out->al.n = text_start;
        HR_TRY(tk_aligns_append(&out->al, mapped_al->p, mapped->n));
    }
    return tk_buf_append(&out->text, mapped->p, mapped->n);
}

static hr_status metaspace(const tk_pretok *p, const char *s, const tk_align *al, size_t n, bool first, tk_pieces *out,
                           tk_ws *ws) {
    tk_buf *b = &ws->t1;
    tk_aligns *ba = &ws->a1;
    b->n = ba->n = 0;
    bool starts_with_rep = n >= p->rep_len && !memcmp(s, p->rep, p->rep_len);
    bool prepend = p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && first);
    if (prepend && n && !(starts_with_rep || s[0] == ' ')) {
        HR_TRY(tk_buf_append(b, p->rep, p->rep_len));
        if (al) HR_TRY(tk_aligns_fill(ba, al[0], p->rep_len));
    }
    for (size_t i = 0; i < n; i++) {
        HR_TRY(tk_buf_append(b, s[i] == ' ' ? p->rep : s + i, s[i] == ' ' ? p->rep_len : 1));
        if (al) HR_TRY(tk_aligns_fill(ba, al[i], s[i] == ' ' ? p->rep_len : 1));
    }
    const tk_align *bal = al ? ba->p : NULL;
    if (!p->split) return b->n ? tk_pieces_add(out, b->p, bal, b->n, -1, first) : HR_OK;
    HR_TRY(find_chars(pred_equal, p->rep_cp, b->p, b->n, &ws->spans));
    return tk_split_apply(&ws->spans, TK_SPLIT_MERGED_WITH_NEXT, b->p, bal, first, out);
}

static hr_status split_piece(const tk_pretok *p, const char *s, const tk_align *al, size_t n, bool first,
                             tk_pieces *out, tk_ws *ws) {
    switch (p->type) {
    case PT_SPLIT:
        HR_TRY(tk_regex_find(p->re, s, n, &ws->spans));
        if (p->invert)
            for (size_t i = 0; i < ws->spans.n; i++) ws->spans.v[i].match = !ws->spans.v[i].match;
        return tk_split_apply(&ws->spans, p->behavior, s, al, first, out);
    case PT_BYTE_LEVEL: return byte_level(p, s, al, n, first, out, ws);
    case PT_METASPACE: return metaspace(p, s, al, n, first, out, ws);
    case PT_DIGITS:
        return split_chars(pred_numeric, 0, p->individual_digits ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS, s, al, n,
                           first, out, ws);
    case PT_PUNCTUATION: return split_chars(pred_bert_punct, 0, p->behavior, s, al, n, first, out, ws);
    case PT_WHITESPACE:
        HR_TRY(tk_regex_find(p->re, s, n, &ws->spans));
        for (size_t i = 0; i < ws->spans.n; i++) ws->spans.v[i].match = !ws->spans.v[i].match;
        return tk_split_apply(&ws->spans, TK_SPLIT_REMOVED, s, al, first, out);
    case PT_WHITESPACE_SPLIT: return split_chars(pred_whitespace, 0, TK_SPLIT_REMOVED, s, al, n, first, out, ws);
    case PT_CHAR_DELIMITER: return split_chars(pred_equal, p->rep_cp, TK_SPLIT_REMOVED, s, al, n, first, out, ws);
    case PT_BERT:
    case PT_SEQUENCE:
        break;
    }
    return hr_error(HR_ERR_INTERNAL, "pre-tokenizer: bad type %d", (int)p->type);
}

static hr_status apply_one(const tk_pretok *p, const tk_pieces *in, tk_pieces *out, tk_ws *ws) {
    tk_pieces_reset(out, in->track);
    for (size_t i = 0; i < in->n; i++) {
        const tk_piece *pc = &in->v[i];
        const char *s = in->text.p + pc->off;
        const tk_align *al = tk_pieces_al(in, pc->off);
        if (pc->id >= 0) HR_TRY(tk_pieces_add(out, s, al, pc->len, pc->id, pc->first));
        else HR_TRY(split_piece(p, s, al, pc->len, pc->first, out, ws));
    }
    return HR_OK;
}

hr_status tk_pretokenize(const tk_pretok *p, const tk_pieces *in, tk_pieces *out, tk_ws *ws) {
    if (p->type != PT_SEQUENCE && p->type != PT_BERT) return apply_one(p, in, out, ws);
    /* Sequences (BertPreTokenizer is WhitespaceSplit then Punctuation) run
     * their steps through two scratch lists. */
    static const tk_pretok bert_steps[2] = {{.type = PT_WHITESPACE_SPLIT},
                                            {.type = PT_PUNCTUATION, .behavior = TK_SPLIT_ISOLATED}};
    const tk_pretok *const bert_ptrs[2] = {&bert_steps[0], &bert_steps[1]};
    const tk_pretok *const *steps = p->type == PT_BERT ? bert_ptrs : (const tk_pretok *const *)p->children;
    size_t n_steps = p->type == PT_BERT ? 2 : p->n_children;
    tk_pieces tmp[2];
    memset(tmp, 0, sizeof tmp);
    const tk_pieces *cur = in;
    hr_status st = HR_OK;
    for (size_t i = 0; st == HR_OK && i < n_steps; i++) {
        tk_pieces *dst = i + 1 == n_steps ? out : &tmp[i & 1];
        st = tk_pretokenize(steps[i], cur, dst, ws);
        cur = dst;
    }
    if (st == HR_OK && n_steps == 0) {
        tk_pieces_reset(out, in->track);
        for (size_t i = 0; st == HR_OK && i < in->n; i++)
            st = tk_pieces_add(out, in->text.p + in->v[i].off, tk_pieces_al(in, in->v[i].off), in->v[i].len, in->v[i].id,
                               in->v[i].first);
    }
    tk_pieces_free(&tmp[0]);
    tk_pieces_free(&tmp[1]);
    return st;
}
