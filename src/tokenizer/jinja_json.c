/* JSON for the chat-template engine: reading the render's context, and
 * tojson, which transformers defines as Python's json.dumps (so the text
 * must match json.dumps byte for byte: its separators, its escapes, its
 * float repr).
 *
 * The reader is our own rather than cJSON because Python tells 1 from 1.0
 * (and prints them differently), keeps integers past 2^53 exact, and keeps
 * object keys in order; cJSON keeps only a double. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

#define JJ_JSON_MAX_DEPTH 200 /* deeper than any chat; keeps recursion off the stack limit */

typedef struct reader {
    jj_arena *a;
    const char *s;
    size_t n, i;
    const char *err;
} reader;

static void skip_ws(reader *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

static int hex4(const char *p) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static void put_utf8(jj_buf *b, uint32_t c) {
    char t[4];
    if (c < 0x80) { t[0] = (char)c; jj_buf_put(b, t, 1); }
    else if (c < 0x800) { t[0] = (char)(0xc0 | c >> 6); t[1] = (char)(0x80 | (c & 0x3f)); jj_buf_put(b, t, 2); }
    else if (c < 0x10000) {
        t[0] = (char)(0xe0 | c >> 12); t[1] = (char)(0x80 | ((c >> 6) & 0x3f)); t[2] = (char)(0x80 | (c & 0x3f));
        jj_buf_put(b, t, 3);
    } else {
        t[0] = (char)(0xf0 | c >> 18); t[1] = (char)(0x80 | ((c >> 12) & 0x3f));
        t[2] = (char)(0x80 | ((c >> 6) & 0x3f)); t[3] = (char)(0x80 | (c & 0x3f));
        jj_buf_put(b, t, 4);
    }
}

static bool read_string(reader *r, jv *out) {
    jj_buf b = {0};
    r->i++; /* opening quote */
    while (r->i < r->n && r->s[r->i] != '"') {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c < 0x20) { r->err = "control character in string"; goto fail; }
        if (c != '\\') {
            size_t j = r->i;
            while (j < r->n && r->s[j] != '"' && r->s[j] != '\\' && (unsigned char)r->s[j] >= 0x20) j++;
            jj_buf_put(&b, r->s + r->i, j - r->i);
            r->i = j;
            continue;
        }
        if (r->i + 1 >= r->n) break;
        char e = r->s[r->i + 1];
        r->i += 2;
        switch (e) {
        case '"': jj_buf_putc(&b, '"'); break;
        case '\\': jj_buf_putc(&b, '\\'); break;
        case '/': jj_buf_putc(&b, '/'); break;
        case 'b': jj_buf_putc(&b, '\b'); break;
        case 'f': jj_buf_putc(&b, '\f'); break;
        case 'n': jj_buf_putc(&b, '\n'); break;
        case 'r': jj_buf_putc(&b, '\r'); break;
        case 't': jj_buf_putc(&b, '\t'); break;
        case 'u': {
            int u = r->i + 4 <= r->n ? hex4(r->s + r->i) : -1;
            if (u < 0) { r->err = "bad \\u escape"; goto fail; }
            r->i += 4;
            uint32_t cp = (uint32_t)u;
            if (u >= 0xd800 && u < 0xdc00 && r->i + 6 <= r->n && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u') {
                int lo = hex4(r->s + r->i + 2);
                if (lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + (((uint32_t)u - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
                    r->i += 6;
                }
            }
            put_utf8(&b, cp);
            break;
        }
        default: r->err = "bad escape in string"; goto fail;
        }
    }
    if (r->i >= r->n) { r->err = "unterminated string"; goto fail; }
    r->i++;
    bool oom = b.oom;
    *out = jv_str_copy(r->a, b.p ? b.p : "", b.n, &oom);
    jj_buf_free(&b);
    if (oom) r->err = "out of memory";
    return !oom;
fail:
    jj_buf_free(&b);
    return false;
}

static bool read_number(reader *r, jv *out) {
    size_t j = r->i;
    bool is_float = false;
    if (j < r->n && r->s[j] == '-') j++;
    if (j + 8 <= r->n && !memcmp(r->s + j, "Infinity", 8)) {
        *out = jv_float(r->s[r->i] == '-' ? -INFINITY : INFINITY);
        r->i = j + 8;
        return true;
    }
    size_t d0 = j;
    while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9') j++;
    if (j == d0) { r->err = "bad value"; return false; }
    if (j < r->n && r->s[j] == '.') {
        is_float = true;
        j++;
        while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9') j++;
    }
    if (j < r->n && (r->s[j] == 'e' || r->s[j] == 'E')) {
        is_float = true;
        j++;
        if (j < r->n && (r->s[j] == '+' || r->s[j] == '-')) j++;
        while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9') j++;
    }
    char tmp[64];
    size_t len = j - r->i;
    if (len >= sizeof tmp) { r->err = "number too long"; return false; }
    memcpy(tmp, r->s + r->i, len);
    tmp[len] = 0;
    r->i = j;
    if (!is_float) {
        char *end;
        long long v = strtoll(tmp, &end, 10);
        /* Python's ints have no bound; past int64 the value goes on as a float. */
        if ((v == LLONG_MAX || v == LLONG_MIN) && strcmp(tmp, "9223372036854775807") && strcmp(tmp, "-9223372036854775808"))
            is_float = true;
        else {
            *out = jv_int(v);
            return true;
        }
    }
    *out = jv_float(strtod(tmp, NULL));
    return true;
}

static bool read_value(reader *r, jv *out, int depth);

static bool read_container(reader *r, jv *out, int depth, bool object) {
    if (depth > JJ_JSON_MAX_DEPTH) { r->err = "nested too deeply"; return false; }
    r->i++;
    jj_dict *d = object ? jj_dict_new(r->a, 4) : NULL;
    jj_buf items = {0}; /* list items gathered as raw jv bytes */
    if (object && !d) { r->err = "out of memory"; return false; }
    skip_ws(r);
    char close = object ? '}' : ']';
    if (r->i < r->n && r->s[r->i] == close) {
        r->i++;
        goto done;
    }
    for (;;) {
        skip_ws(r);
        jv k, v;
        if (object) {
            if (r->i >= r->n || r->s[r->i] != '"') { r->err = "expected a key"; goto fail; }
            if (!read_string(r, &k)) goto fail;
            skip_ws(r);
            if (r->i >= r->n || r->s[r->i] != ':') { r->err = "expected ':'"; goto fail; }
            r->i++;
        }
        if (!read_value(r, &v, depth + 1)) goto fail;
        if (object) {
            if (!jj_dict_set(r->a, d, k, v)) { r->err = "out of memory"; goto fail; }
        } else {
            jj_buf_put(&items, (const char *)&v, sizeof v);
        }
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') { r->i++; continue; }
        if (r->i < r->n && r->s[r->i] == close) { r->i++; break; }
        r->err = object ? "expected ',' or '}'" : "expected ',' or ']'";
        goto fail;
    }
done:
    if (items.oom) { r->err = "out of memory"; goto fail; }
    if (object) {
        out->kind = JV_DICT;
        out->flag = 0;
        out->u.d = d;
    } else {
        size_t n = items.n / sizeof(jv);
        jj_list *l = jj_list_new(r->a, n);
        if (!l) { r->err = "out of memory"; goto fail; }
        if (n) memcpy(l->v, items.p, n * sizeof(jv));
        out->kind = JV_LIST;
        out->flag = 0;
        out->u.l = l;
    }
    jj_buf_free(&items);
    return true;
fail:
    jj_buf_free(&items);
    return false;
}

static bool read_value(reader *r, jv *out, int depth) {
    skip_ws(r);
    if (r->i >= r->n) { r->err = "unexpected end"; return false; }
    char c = r->s[r->i];
    if (c == '{' || c == '[') return read_container(r, out, depth, c == '{');
    if (c == '"') return read_string(r, out);
    static const struct { const char *w; int kind; } words[] = {
        {"true", 1}, {"false", 2}, {"null", 3}, {"NaN", 4},
    };
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++) {
        size_t len = strlen(words[k].w);
        if (r->i + len <= r->n && !memcmp(r->s + r->i, words[k].w, len)) {
            r->i += len;
            *out = words[k].kind == 1 ? jv_bool(true) : words[k].kind == 2 ? jv_bool(false)
                 : words[k].kind == 3 ? jv_none() : jv_float(NAN);
            return true;
        }
    }
    return read_number(r, out);
}

hr_status jj_json_parse(jj_arena *a, const char *text, size_t len, jv *out) {
    reader r = {.a = a, .s = text, .n = len};
    if (!read_value(&r, out, 0))
        return hr_error(r.err && !strcmp(r.err, "out of memory") ? HR_ERR_OOM : HR_ERR_FORMAT,
                        "chat template context: %s at byte %zu", r.err ? r.err : "bad JSON", r.i);
    skip_ws(&r);
    if (r.i != r.n) return hr_error(HR_ERR_FORMAT, "chat template context: extra data at byte %zu", r.i);
    return HR_OK;
}

/* ---- json.dumps ---- */
typedef struct dumper {
    jj_buf *b;
    bool ascii, sort;
    int indent; /* < 0: None */
    const char *indent_str, *item_sep, *key_sep;
    const char *why;
} dumper;

static void dump_string(dumper *d, const char *s, size_t n) {
    jj_buf *b = d->b;
    jj_buf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[16];
        switch (c) {
        case '"': jj_buf_puts(b, "\\\""); continue;
        case '\\': jj_buf_puts(b, "\\\\"); continue;
        case '\n': jj_buf_puts(b, "\\n"); continue;
        case '\r': jj_buf_puts(b, "\\r"); continue;
        case '\t': jj_buf_puts(b, "\\t"); continue;
        case '\b': jj_buf_puts(b, "\\b"); continue;
        case '\f': jj_buf_puts(b, "\\f"); continue;
        default: break;
        }
        if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            jj_buf_puts(b, tmp);
        } else if (c < 0x80 || !d->ascii) {
            jj_buf_putc(b, (char)c);
        } else {
            /* ensure_ascii: \uXXXX per UTF-16 unit. */
            uint32_t cp = c;
            size_t k = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
            if (k > 1 && i + k <= n) {
                cp &= 0x7fu >> k;
                for (size_t j = 1; j < k; j++) cp = cp << 6 | ((unsigned char)s[i + j] & 0x3f);
                i += k - 1;
            }
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            }
            jj_buf_puts(b, tmp);
        }
    }
    jj_buf_putc(b, '"');
}

static void dump_float(jj_buf *b, double f) {
    if (isnan(f)) jj_buf_puts(b, "NaN");
    else if (isinf(f)) jj_buf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    else jj_float_repr(b, f);
}

static void newline_indent(dumper *d, int level) {
    jj_buf_putc(d->b, '\n');
    for (int i = 0; i < level; i++) jj_buf_puts(d->b, d->indent_str);
}

/* Dict keys as json.dumps writes them: str as is, numbers, bools and None as text. */
static bool key_text(dumper *d, jv k, jj_buf *kb) {
    switch (k.kind) {
    case JV_STR: jj_buf_put(kb, k.u.s.p, k.u.s.n); return true;
    case JV_BOOL: jj_buf_puts(kb, k.u.b ? "true" : "false"); return true;
    case JV_NONE: jj_buf_puts(kb, "null"); return true;
    case JV_INT: jv_str(kb, k); return true;
    case JV_FLOAT: dump_float(kb, k.u.f); return true;
    default: d->why = "keys must be str, int, float, bool or None"; return false;
    }
}

static int cmp_bytes(const char *a, size_t an, const char *b, size_t bn) {
    int c = memcmp(a, b, an < bn ? an : bn);
    return c ? c : (an > bn) - (an < bn);
}

static bool dump(dumper *d, jv v, int level);

static bool dump_dict(dumper *d, const jj_dict *o, int level) {
    if (o->n == 0) { jj_buf_puts(d->b, "{}"); return true; }
    size_t *order = malloc(o->n * sizeof *order);
    if (!order) { d->why = "out of memory"; return false; }
    for (size_t i = 0; i < o->n; i++) order[i] = i;
    if (d->sort) {
        for (size_t i = 0; i < o->n; i++)
            if (o->k[i].kind != JV_STR) {
                free(order);
                d->why = "sort_keys needs str keys";
                return false;
            }
        /* Insertion sort: stable, and dicts in chat templates are small. */
        for (size_t i = 1; i < o->n; i++) {
            size_t x = order[i], j = i;
            while (j > 0 && cmp_bytes(o->k[order[j - 1]].u.s.p, o->k[order[j - 1]].u.s.n, o->k[x].u.s.p,
                                      o->k[x].u.s.n) > 0) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
    }
    bool ok = true;
    jj_buf_putc(d->b, '{');
    for (size_t i = 0; i < o->n && ok; i++) {
        size_t at = order[i];
        if (i) jj_buf_puts(d->b, d->item_sep);
        if (d->indent >= 0) newline_indent(d, level + 1);
        jj_buf kb = {0};
        ok = key_text(d, o->k[at], &kb);
        if (ok) dump_string(d, kb.p ? kb.p : "", kb.n);
        jj_buf_free(&kb);
        if (!ok) break;
        jj_buf_puts(d->b, d->key_sep);
        ok = dump(d, o->v[at], level + 1);
    }
    free(order);
    if (!ok) return false;
    if (d->indent >= 0) newline_indent(d, level);
    jj_buf_putc(d->b, '}');
    return true;
}

static bool dump(dumper *d, jv v, int level) {
    if (level > JJ_JSON_MAX_DEPTH) { d->why = "nested too deeply"; return false; }
    switch (v.kind) {
    case JV_NONE: jj_buf_puts(d->b, "null"); return true;
    case JV_BOOL: jj_buf_puts(d->b, v.u.b ? "true" : "false"); return true;
    case JV_INT: jv_str(d->b, v); return true;
    case JV_FLOAT: dump_float(d->b, v.u.f); return true;
    case JV_STR: dump_string(d, v.u.s.p, v.u.s.n); return true;
    case JV_LIST:
        if (v.u.l->n == 0) { jj_buf_puts(d->b, "[]"); return true; }
        jj_buf_putc(d->b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jj_buf_puts(d->b, d->item_sep);
            if (d->indent >= 0) newline_indent(d, level + 1);
            if (!dump(d, v.u.l->v[i], level + 1)) return false;
        }
        if (d->indent >= 0) newline_indent(d, level);
        jj_buf_putc(d->b, ']');
        return true;
    case JV_DICT: return dump_dict(d, v.u.d, level);
    default:
        d->why = v.kind == JV_UNDEF ? "Object of type Undefined is not JSON serializable"
               : v.kind == JV_NS ? "Object of type Namespace is not JSON serializable"
               : "Object of this type is not JSON serializable";
        return false;
    }
}

bool jj_json_dump(jj_buf *b, jv v, bool ensure_ascii, int indent, const char *indent_str, const char *item_sep,
                  const char *key_sep, bool sort_keys, const char **why) {
    dumper d = {.b = b, .ascii = ensure_ascii, .sort = sort_keys, .indent = indent,
                .indent_str = indent_str ? indent_str : "", .item_sep = item_sep, .key_sep = key_sep};
    if (!d.item_sep) d.item_sep = indent >= 0 ? "," : ", ";
    if (!d.key_sep) d.key_sep = ": ";
    bool ok = dump(&d, v, 0);
    *why = d.why;
    return ok;
}
