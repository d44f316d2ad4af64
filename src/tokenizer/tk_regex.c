/* Regex and literal patterns for splitting and replacing.
 *
 * tokenizers compiles its patterns with Oniguruma, where \s, \w, \d and \h
 * have Unicode (Ruby) meanings that differ from PCRE2's UCP ones; the
 * pattern is rewritten to explicit classes before PCRE2 compiles it. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_internal.h"

struct tk_regex {
    pcre2_code *code; /* NULL for a literal */
    char *literal;
    size_t literal_len;
};

/* Oniguruma's Unicode \\s is White_Space; its \\w is Alphabetic, marks,
 * decimal digits and connectors (checked against tokenizers). */
#define ONIG_SPACE "\\p{White_Space}"
#define ONIG_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
#define ONIG_HEX "0-9a-fA-F"

/* Rewrites Oniguruma class escapes into PCRE2 syntax. */
static hr_status translate(const char *p, size_t n, tk_buf *out) {
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            const char *body = NULL;
            bool neg = false;
            switch (e) {
            case 's': body = ONIG_SPACE; break;
            case 'S': body = ONIG_SPACE; neg = true; break;
            case 'w': body = ONIG_WORD; break;
            case 'W': body = ONIG_WORD; neg = true; break;
            case 'd': body = "\\p{Nd}"; break;
            case 'D': body = "\\p{Nd}"; neg = true; break;
            case 'h': body = ONIG_HEX; break;
            case 'H': body = ONIG_HEX; neg = true; break;
            default: break;
            }
            if (body && !(in_class && neg)) {
                if (!in_class) HR_TRY(tk_buf_append(out, neg ? "[^" : "[", neg ? 2 : 1));
                HR_TRY(tk_buf_append(out, body, strlen(body)));
                if (!in_class) HR_TRY(tk_buf_append(out, "]", 1));
            } else {
                HR_TRY(tk_buf_append(out, p + i, 2));
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            HR_TRY(tk_buf_append(out, p + i, 1));
            /* A ']' right after '[' or '[^' is a literal member. */
            if (i + 1 < n && p[i + 1] == '^') HR_TRY(tk_buf_append(out, p + ++i, 1));
            if (i + 1 < n && p[i + 1] == ']') HR_TRY(tk_buf_append(out, p + ++i, 1));
            continue;
        }
        if (in_class && c == ']') in_class = false;
        HR_TRY(tk_buf_append(out, p + i, 1));
    }
    return tk_buf_append(out, "", 0);
}

hr_status tk_regex_compile(const char *pattern, size_t len, bool literal, tk_regex **out) {
    tk_regex *re = calloc(1, sizeof *re);
    if (!re) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    if (literal) {
        re->literal = malloc(len + 1);
        if (!re->literal) {
            free(re);
            return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        }
        memcpy(re->literal, pattern, len);
        re->literal[len] = '\0';
        re->literal_len = len;
        *out = re;
        return HR_OK;
    }
    tk_buf pat = {0};
    hr_status st = translate(pattern, len, &pat);
    if (st != HR_OK) {
        free(re);
        tk_buf_free(&pat);
        return st;
    }
    int err;
    PCRE2_SIZE erroff;
    re->code = pcre2_compile((PCRE2_SPTR)pat.p, pat.n, PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
    tk_buf_free(&pat);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        free(re);
        return hr_error(HR_ERR_FORMAT, "regex '%.*s' does not compile: %s", (int)(len > 200 ? 200 : len), pattern,
                        (char *)msg);
    }
    /* Without JIT the interpreter still gives the same matches, only slower. */
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    *out = re;
    return HR_OK;
}

void tk_regex_free(tk_regex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    free(re->literal);
    free(re);
}

static hr_status literal_find(const tk_regex *re, const char *s, size_t n, tk_spans *out) {
    size_t prev = 0;
    if (re->literal_len) {
        const char *at = s, *end = s + n;
        while ((at = memmem(at, (size_t)(end - at), re->literal, re->literal_len))) {
            size_t ms = (size_t)(at - s);
            if (ms != prev) HR_TRY(tk_spans_push(out, (uint32_t)prev, (uint32_t)ms, false));
            HR_TRY(tk_spans_push(out, (uint32_t)ms, (uint32_t)(ms + re->literal_len), true));
            prev = ms + re->literal_len;
            at += re->literal_len;
        }
    }
    if (prev != n) HR_TRY(tk_spans_push(out, (uint32_t)prev, (uint32_t)n, false));
    return HR_OK;
}

static size_t char_len_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 1;
    unsigned char c = (unsigned char)s[i];
    size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return k;
}

hr_status tk_regex_find(const tk_regex *re, const char *s, size_t n, tk_spans *out) {
    out->n = 0;
    if (n == 0) return tk_spans_push(out, 0, 0, false);
    if (!re->code) return literal_find(re, s, n, out);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re->code, NULL);
    if (!md) return hr_error(HR_ERR_OOM, "tokenizer: out of memory for regex match data");
    hr_status st = HR_OK;
    size_t prev = 0, from = 0;
    long last_match_end = -1;
    while (from <= n) {
        int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            st = hr_error(HR_ERR_UNSUPPORTED, "regex match failed at byte %zu: %s", from, (char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && last_match_end == (long)me) {
            /* An empty match right after the previous match is skipped. */
            from += char_len_at(s, n, from);
            continue;
        }
        if (ms != prev) st = tk_spans_push(out, (uint32_t)prev, (uint32_t)ms, false);
        if (st == HR_OK) st = tk_spans_push(out, (uint32_t)ms, (uint32_t)me, true);
        if (st != HR_OK) break;
        prev = me;
        from = me;
        last_match_end = (long)me;
    }
    pcre2_match_data_free(md);
    if (st == HR_OK && prev != n) st = tk_spans_push(out, (uint32_t)prev, (uint32_t)n, false);
    return st;
}

hr_status tk_pattern_parse(const cJSON *j, const char *what, tk_regex **out) {
    const cJSON *s = tk_json_get(j, "String"), *r = tk_json_get(j, "Regex");
    if (cJSON_IsString(s)) return tk_regex_compile(s->valuestring, strlen(s->valuestring), true, out);
    if (cJSON_IsString(r)) return tk_regex_compile(r->valuestring, strlen(r->valuestring), false, out);
    return hr_error(HR_ERR_FORMAT, "%s: field 'pattern' must be {\"String\": ...} or {\"Regex\": ...}", what);
}
