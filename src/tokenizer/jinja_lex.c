/* The chat-template lexer: Jinja2's, with transformers' settings.
 *
 * The rules follow jinja2/lexer.py: newlines are normalised and one
 * trailing newline dropped; `{%-`/`-%}` strip all whitespace on their side;
 * trim_blocks drops the first newline after a block or comment tag;
 * lstrip_blocks drops the spaces and tabs before a block or comment tag
 * that starts its line (never before `{{`); `+` turns either off for one
 * tag; `}}` and `%}` end a tag only where brackets are balanced. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

hr_status jj_error_at(const jj_source *src, uint32_t pos, hr_status code, const char *fmt, ...) {
    unsigned line = 1, col = 1;
    for (size_t i = 0; i < pos && i < src->len; i++) {
        unsigned char c = (unsigned char)src->text[i];
        if (c == '\n') {
            line++;
            col = 1;
        } else if ((c & 0xc0) != 0x80) {
            col++; /* columns count characters, not bytes */
        }
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return hr_error(code, "chat template line %u, column %u: %s", line, col, msg);
}

typedef struct lexer {
    jj_arena *a;
    jj_source *src;
    const char *s;
    size_t n, i;
    jj_buf toks; /* jj_token records */
    bool line_starting;
} lexer;

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name(char c) { return is_name_start(c) || is_digit(c); }

static void emit(lexer *lx, jt_kind kind, size_t pos, const char *p, size_t n) {
    jj_token t = {.kind = (uint8_t)kind, .pos = (uint32_t)pos, .p = p, .n = n};
    jj_buf_put(&lx->toks, (const char *)&t, sizeof t);
}

static jj_token *last(lexer *lx) { return (jj_token *)(lx->toks.p + lx->toks.n - sizeof(jj_token)); }

static bool at(const lexer *lx, size_t i, const char *w) {
    size_t n = strlen(w);
    return i + n <= lx->n && !memcmp(lx->s + i, w, n);
}

static size_t skip_ws(const lexer *lx, size_t i) {
    while (i < lx->n && is_space(lx->s[i])) i++;
    return i;
}

/* Data text before a tag at `tag` (the tag's sign is s[tag + 2]), stripped
 * as `-` or lstrip_blocks say. */
static void emit_text(lexer *lx, size_t start, size_t tag, bool is_var) {
    size_t end = tag;
    char sign = tag + 2 < lx->n ? lx->s[tag + 2] : 0;
    if (sign == '-') {
        while (end > start && is_space(lx->s[end - 1])) end--;
    } else if (sign != '+' && !is_var) {
        size_t l = end;
        while (l > start && lx->s[l - 1] != '\n') l--;
        bool only_ws = l < end;
        for (size_t k = l; k < end; k++)
            if (!is_space(lx->s[k])) only_ws = false;
        if (only_ws && (l > start || lx->line_starting)) end = l;
    }
    if (end > start) emit(lx, JT_TEXT, start, lx->s + start, end - start);
}

/* `{% raw %}` at i: true (and *after set past the tag) when it is one. */
static bool raw_begin(const lexer *lx, size_t i, size_t *after) {
    size_t j = i + 2;
    if (j < lx->n && (lx->s[j] == '-' || lx->s[j] == '+')) j++;
    j = skip_ws(lx, j);
    if (!at(lx, j, "raw")) return false;
    j = skip_ws(lx, j + 3);
    if (at(lx, j, "-%}")) { *after = skip_ws(lx, j + 3); return true; }
    if (at(lx, j, "%}")) { *after = j + 2; return true; }
    return false;
}

static hr_status lex_raw(lexer *lx, size_t start) {
    for (size_t i = start; i + 1 < lx->n; i++) {
        if (lx->s[i] != '{' || lx->s[i + 1] != '%') continue;
        size_t j = i + 2;
        if (j < lx->n && (lx->s[j] == '-' || lx->s[j] == '+')) j++;
        j = skip_ws(lx, j);
        if (!at(lx, j, "endraw")) continue;
        j = skip_ws(lx, j + 6);
        size_t after;
        if (at(lx, j, "+%}")) after = j + 3;
        else if (at(lx, j, "-%}")) after = skip_ws(lx, j + 3);
        else if (at(lx, j, "%}")) after = j + 2 + (at(lx, j + 2, "\n") ? 1 : 0);
        else continue;
        emit_text(lx, start, i, false);
        lx->line_starting = after > 0 && lx->s[after - 1] == '\n';
        lx->i = after;
        return HR_OK;
    }
    return jj_error_at(lx->src, (uint32_t)start, HR_ERR_FORMAT, "missing end of raw directive");
}

/* A string literal at i, decoded as Python's unicode-escape does. */
static hr_status lex_string(lexer *lx, size_t i, size_t *end) {
    char q = lx->s[i];
    size_t j = i + 1;
    while (j < lx->n && lx->s[j] != q) j += lx->s[j] == '\\' ? 2 : 1;
    if (j >= lx->n) return jj_error_at(lx->src, (uint32_t)i, HR_ERR_FORMAT, "unexpected end of string");
    jj_buf b = {0};
    for (size_t k = i + 1; k < j; k++) {
        char c = lx->s[k];
        if (c != '\\') { jj_buf_putc(&b, c); continue; }
        char e = lx->s[++k];
        int hex = 0;
        switch (e) {
        case '\n': break;
        case '\\': jj_buf_putc(&b, '\\'); break;
        case '\'': jj_buf_putc(&b, '\''); break;
        case '"': jj_buf_putc(&b, '"'); break;
        case 'a': jj_buf_putc(&b, '\a'); break;
        case 'b': jj_buf_putc(&b, '\b'); break;
        case 'f': jj_buf_putc(&b, '\f'); break;
        case 'n': jj_buf_putc(&b, '\n'); break;
        case 'r': jj_buf_putc(&b, '\r'); break;
        case 't': jj_buf_putc(&b, '\t'); break;
        case 'v': jj_buf_putc(&b, '\v'); break;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                unsigned v = 0;
                int nd = 0;
                while (nd < 3 && k < j && lx->s[k] >= '0' && lx->s[k] <= '7') v = v * 8 + (unsigned)(lx->s[k++] - '0'), nd++;
                k--;
                char tmp[2];
                size_t tn = 0;
                if (v < 0x80) tmp[tn++] = (char)v;
                else { tmp[tn++] = (char)(0xc0 | v >> 6); tmp[tn++] = (char)(0x80 | (v & 0x3f)); }
                jj_buf_put(&b, tmp, tn);
            } else {
                jj_buf_putc(&b, '\\'); /* Python keeps unknown escapes as written */
                jj_buf_putc(&b, e);
            }
        }
        if (hex) {
            uint32_t v = 0;
            for (int h = 0; h < hex; h++) {
                char d = k + 1 + (size_t)h < j ? lx->s[k + 1 + (size_t)h] : 0;
                int x = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10 : d >= 'A' && d <= 'F' ? d - 'A' + 10 : -1;
                if (x < 0 || v > 0x10ffff) {
                    jj_buf_free(&b);
                    return jj_error_at(lx->src, (uint32_t)k, HR_ERR_FORMAT, "truncated \\%c escape in string", e);
                }
                v = v * 16 + (uint32_t)x;
            }
            if (v > 0x10ffff) {
                jj_buf_free(&b);
                return jj_error_at(lx->src, (uint32_t)k, HR_ERR_FORMAT, "illegal Unicode character in string");
            }
            k += (size_t)hex;
            char tmp[4];
            size_t tn;
            if (v < 0x80) { tmp[0] = (char)v; tn = 1; }
            else if (v < 0x800) { tmp[0] = (char)(0xc0 | v >> 6); tmp[1] = (char)(0x80 | (v & 0x3f)); tn = 2; }
            else if (v < 0x10000) {
                tmp[0] = (char)(0xe0 | v >> 12); tmp[1] = (char)(0x80 | ((v >> 6) & 0x3f)); tmp[2] = (char)(0x80 | (v & 0x3f)); tn = 3;
            } else {
                tmp[0] = (char)(0xf0 | v >> 18); tmp[1] = (char)(0x80 | ((v >> 12) & 0x3f));
                tmp[2] = (char)(0x80 | ((v >> 6) & 0x3f)); tmp[3] = (char)(0x80 | (v & 0x3f)); tn = 4;
            }
            jj_buf_put(&b, tmp, tn);
        }
    }
    bool oom = b.oom;
    jv v = jv_str_copy(lx->a, b.p ? b.p : "", b.n, &oom);
    jj_buf_free(&b);
    if (oom) return hr_error(HR_ERR_OOM, "chat template: out of memory");
    emit(lx, JT_STRING, i, v.u.s.p, v.u.s.n);
    *end = j + 1;
    return HR_OK;
}

static const char *const OPS[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                  "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};

/* The inside of a `{{ }}` or `{% %}` tag starting at i (past its opener). */
static hr_status lex_tag(lexer *lx, size_t open, bool is_var) {
    char stack[64];
    int depth = 0;
    size_t i = lx->i;
    for (;;) {
        i = skip_ws(lx, i);
        if (i >= lx->n)
            return jj_error_at(lx->src, (uint32_t)open, HR_ERR_FORMAT, "unexpected end of template: '%s' never closed",
                               is_var ? "{{" : "{%");
        if (depth == 0) {
            size_t after = 0;
            if (is_var) {
                if (at(lx, i, "-}}")) after = skip_ws(lx, i + 3);
                else if (at(lx, i, "}}")) after = i + 2;
            } else {
                if (at(lx, i, "+%}")) after = i + 3;
                else if (at(lx, i, "-%}")) after = skip_ws(lx, i + 3);
                else if (at(lx, i, "%}")) after = i + 2 + (at(lx, i + 2, "\n") ? 1 : 0);
            }
            if (after) {
                emit(lx, is_var ? JT_VAR_END : JT_BLOCK_END, i, NULL, 0);
                lx->line_starting = lx->s[after - 1] == '\n';
                lx->i = after;
                return HR_OK;
            }
        }
        char c = lx->s[i];
        if (is_digit(c)) {
            size_t j = i;
            while (j < lx->n && is_digit(lx->s[j])) j++;
            bool is_float = false;
            bool after_dot = i > 0 && lx->s[i - 1] == '.';
            if (!after_dot && j + 1 < lx->n && lx->s[j] == '.' && is_digit(lx->s[j + 1])) {
                is_float = true;
                j++;
                while (j < lx->n && is_digit(lx->s[j])) j++;
            }
            if (!after_dot && j < lx->n && (lx->s[j] == 'e' || lx->s[j] == 'E')) {
                size_t k = j + 1;
                if (k < lx->n && (lx->s[k] == '+' || lx->s[k] == '-')) k++;
                if (k < lx->n && is_digit(lx->s[k])) {
                    is_float = true;
                    while (k < lx->n && is_digit(lx->s[k])) k++;
                    j = k;
                }
            }
            char tmp[64];
            size_t len = j - i < sizeof tmp - 1 ? j - i : sizeof tmp - 1;
            memcpy(tmp, lx->s + i, len);
            tmp[len] = 0;
            emit(lx, is_float ? JT_FLOAT : JT_INT, i, lx->s + i, j - i);
            if (is_float) last(lx)->f = strtod(tmp, NULL);
            else {
                unsigned long long v = strtoull(tmp, NULL, 10);
                if (len > 18 && v > (unsigned long long)INT64_MAX)
                    return jj_error_at(lx->src, (uint32_t)i, HR_ERR_UNSUPPORTED, "integer literal too large");
                last(lx)->i = (int64_t)v;
            }
            i = j;
            continue;
        }
        if (is_name_start(c)) {
            size_t j = i;
            while (j < lx->n && is_name(lx->s[j])) j++;
            emit(lx, JT_NAME, i, lx->s + i, j - i);
            i = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            HR_TRY(lex_string(lx, i, &i));
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof OPS / sizeof OPS[0]; k++)
            if (at(lx, i, OPS[k])) break;
        if (k == sizeof OPS / sizeof OPS[0])
            return jj_error_at(lx->src, (uint32_t)i, HR_ERR_FORMAT, "unexpected char '%c'", c);
        const char *op = OPS[k];
        if (op[0] == '(' || op[0] == '[' || op[0] == '{') {
            if (depth == (int)sizeof stack)
                return jj_error_at(lx->src, (uint32_t)i, HR_ERR_FORMAT, "brackets nested too deeply");
            stack[depth++] = op[0] == '(' ? ')' : op[0] == '[' ? ']' : '}';
        } else if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
            if (depth == 0) return jj_error_at(lx->src, (uint32_t)i, HR_ERR_FORMAT, "unexpected '%c'", op[0]);
            if (stack[--depth] != op[0])
                return jj_error_at(lx->src, (uint32_t)i, HR_ERR_FORMAT, "unexpected '%c', expected '%c'", op[0],
                                   stack[depth]);
        }
        emit(lx, JT_OP, i, op, strlen(op));
        i += strlen(op);
    }
}

/* Newlines as Jinja sees them: \r\n and \r become \n, and one trailing
 * newline goes (keep_trailing_newline is off). */
static char *normalise(jj_arena *a, const char *text, size_t len, size_t *out_len) {
    char *s = jj_alloc(a, len + 1);
    if (!s) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n') i++;
        } else {
            s[n++] = text[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    *out_len = n;
    return s;
}

hr_status jj_lex(jj_arena *a, const char *text, size_t len, jj_source *src, jj_token **toks, size_t *n_toks) {
    size_t n;
    char *s = normalise(a, text, len, &n);
    if (!s) return hr_error(HR_ERR_OOM, "chat template: out of memory");
    src->text = s;
    src->len = n;
    lexer lx = {.a = a, .src = src, .s = s, .n = n, .line_starting = true};
    hr_status st = HR_OK;
    while (lx.i < n && st == HR_OK) {
        size_t start = lx.i, t = start;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= n) {
            emit(&lx, JT_TEXT, start, s + start, n - start);
            break;
        }
        char kind = s[t + 1];
        size_t after;
        if (kind == '%' && raw_begin(&lx, t, &after)) {
            emit_text(&lx, start, t, false);
            st = lex_raw(&lx, after);
            continue;
        }
        emit_text(&lx, start, t, kind == '{');
        size_t body = t + 2 + (t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+'));
        if (kind == '#') {
            size_t e = body;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) {
                st = jj_error_at(src, (uint32_t)t, HR_ERR_FORMAT, "missing end of comment tag");
                break;
            }
            if (e > body && s[e - 1] == '-') after = skip_ws(&lx, e + 2);
            else if (e > body && s[e - 1] == '+') after = e + 2;
            else after = e + 2 + (e + 2 < n && s[e + 2] == '\n');
            lx.line_starting = s[after - 1] == '\n';
            lx.i = after;
            continue;
        }
        emit(&lx, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, t, NULL, 0);
        lx.i = body;
        st = lex_tag(&lx, t, kind == '{');
    }
    emit(&lx, JT_EOF, n, NULL, 0);
    if (st == HR_OK && lx.toks.oom) st = hr_error(HR_ERR_OOM, "chat template: out of memory");
    if (st == HR_OK) {
        *n_toks = lx.toks.n / sizeof(jj_token);
        *toks = jj_alloc(a, lx.toks.n);
        if (!*toks) st = hr_error(HR_ERR_OOM, "chat template: out of memory");
        else memcpy(*toks, lx.toks.p, lx.toks.n);
    }
    jj_buf_free(&lx.toks);
    return st;
}
