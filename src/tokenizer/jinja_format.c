/* String formatting of the chat-template engine, as Python does it:
 * printf-style `"%s" % x` and Jinja's `format` filter, `str.format`, and
 * the filters `escape` (markupsafe's escapes), `batch` and `dictsort`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

static hr_status done(jj_ctx *cx, const jj_node *at, jj_buf *b, jv *out) {
    bool oom = b->oom;
    *out = jv_str_copy(cx->arena, b->p ? b->p : "", b->n, &oom);
    jj_buf_free(b);
    return oom ? jj_oom(cx, at) : HR_OK;
}

static hr_status fail_free(jj_ctx *cx, const jj_node *at, jj_buf *b, const char *msg, char conv) {
    jj_buf_free(b);
    return jj_fail(cx, at, msg, conv);
}

/* A number for an integer conversion: ints and bools as they are, floats
 * truncated (Python's %d of 2.7 is 2). */
static bool as_int(jv v, long long *out) {
    if (v.kind == JV_INT || v.kind == JV_BOOL) {
        *out = v.kind == JV_BOOL ? v.u.b : v.u.i;
        return true;
    }
    if (v.kind == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) {
        *out = (long long)v.u.f;
        return true;
    }
    return false;
}

/* One conversion of value v under flags/width/precision, appended to b. */
static hr_status convert(jj_ctx *cx, const jj_node *at, jj_buf *b, char conv, const char *flags, int width, int prec,
                         jv v) {
    char spec[32], tmp[512];
    if (conv == 's' || conv == 'r' || conv == 'a') {
        jj_buf s = {0};
        if (conv == 's') jv_str(&s, v);
        else jv_repr(&s, v);
        size_t n = s.n;
        if (prec >= 0 && (size_t)prec < n) n = (size_t)prec; /* (bytes: the templates' texts are short) */
        bool left = strchr(flags, '-') != NULL;
        size_t pad = width > 0 && (size_t)width > n ? (size_t)width - n : 0;
        for (size_t i = 0; !left && i < pad; i++) jj_buf_putc(b, ' ');
        jj_buf_put(b, s.p ? s.p : "", n);
        for (size_t i = 0; left && i < pad; i++) jj_buf_putc(b, ' ');
        bool oom = s.oom;
        jj_buf_free(&s);
        return oom ? jj_oom(cx, at) : HR_OK;
    }
    int k = snprintf(spec, sizeof spec, "%%%s", flags);
    if (width >= 0) k += snprintf(spec + k, sizeof spec - (size_t)k, "%d", width);
    if (prec >= 0) k += snprintf(spec + k, sizeof spec - (size_t)k, ".%d", prec);
    int n;
    if (strchr("diuxXoc", conv)) {
        long long x;
        if (conv == 'c' && v.kind == JV_STR && v.u.s.n >= 1) {
            jj_buf_put(b, v.u.s.p, v.u.s.n);
            return HR_OK;
        }
        if (!as_int(v, &x)) return jj_fail(cx, at, "%%%c format: a real number is required, not %s", conv, jv_type_name(v));
        snprintf(spec + k, sizeof spec - (size_t)k, "ll%c", conv == 'i' || conv == 'u' ? 'd' : conv);
        if (conv == 'c') snprintf(spec + k, sizeof spec - (size_t)k, "c");
        n = conv == 'c' ? snprintf(tmp, sizeof tmp, spec, (int)x) : snprintf(tmp, sizeof tmp, spec, x);
    } else {
        if (!jv_is_number(v)) return jj_fail(cx, at, "must be real number, not %s", jv_type_name(v));
        snprintf(spec + k, sizeof spec - (size_t)k, "%c", conv);
        n = snprintf(tmp, sizeof tmp, spec, jv_as_double(v));
    }
    if (n < 0 || (size_t)n >= sizeof tmp) return jj_fail(cx, at, "formatted number too long");
    jj_buf_put(b, tmp, (size_t)n);
    return HR_OK;
}

hr_status jj_percent_format(jj_ctx *cx, const jj_node *at, jv fmt, jv args, jv *out) {
    const jv *list = NULL;
    size_t n_args = 1, used = 0;
    if (args.kind == JV_LIST && (args.flag & JV_TUPLE)) list = args.u.l->v, n_args = args.u.l->n;
    else list = &args;
    jj_buf b = {0};
    const char *p = fmt.u.s.p, *end = p + fmt.u.s.n;
    while (p < end) {
        const char *pc = memchr(p, '%', (size_t)(end - p));
        if (!pc) {
            jj_buf_put(&b, p, (size_t)(end - p));
            break;
        }
        jj_buf_put(&b, p, (size_t)(pc - p));
        p = pc + 1;
        jv v = {0};
        bool named = false;
        if (p < end && *p == '(') { /* %(name)s over a mapping */
            const char *close = memchr(p, ')', (size_t)(end - p));
            if (!close) return fail_free(cx, at, &b, "incomplete format key%c", ' ');
            if (args.kind != JV_DICT) return fail_free(cx, at, &b, "format requires a mapping%c", ' ');
            const jv *x = jj_dict_get(args.u.d, jv_strn(p + 1, (size_t)(close - p - 1)));
            if (!x) return fail_free(cx, at, &b, "key not found in the format mapping%c", ' ');
            v = *x;
            named = true;
            p = close + 1;
        }
        char flags[8] = {0};
        int nf = 0, width = -1, prec = -1;
        while (p < end && strchr("-+ #0", *p) && nf < 7) flags[nf++] = *p++;
        while (p < end && *p >= '0' && *p <= '9') width = (width < 0 ? 0 : width * 10) + (*p++ - '0');
        if (p < end && *p == '.') {
            prec = 0;
            for (p++; p < end && *p >= '0' && *p <= '9';) prec = prec * 10 + (*p++ - '0');
        }
        if (width > 4096 || prec > 4096) return fail_free(cx, at, &b, "format width too large%c", ' ');
        if (p >= end) return fail_free(cx, at, &b, "incomplete format%c", ' ');
        char conv = *p++;
        if (conv == '%') {
            jj_buf_putc(&b, '%');
            continue;
        }
        if (!strchr("sradiuxXocfFeEgG", conv)) return fail_free(cx, at, &b, "unsupported format character '%c'", conv);
        if (!named) {
            if (args.kind == JV_DICT && !list) v = args;
            else if (used >= n_args) return fail_free(cx, at, &b, "not enough arguments for format string%c", ' ');
            else v = list[used++];
        }
        hr_status s = convert(cx, at, &b, conv, flags, width, prec, v);
        if (s != HR_OK) {
            jj_buf_free(&b);
            return s;
        }
    }
    if (args.kind != JV_DICT && used < n_args)
        return fail_free(cx, at, &b, "not all arguments converted during string formatting%c", ' ');
    return done(cx, at, &b, out);
}

/* ---- str.format ---------------------------------------------------------------- */

static const jv *kwarg(const jj_args *a, const char *name, size_t n) {
    for (size_t k = 0; k < a->n_kw; k++)
        if (strlen(a->kw_names[k]) == n && !memcmp(a->kw_names[k], name, n)) return &a->kw[k];
    return NULL;
}

/* A format spec [[fill]align][sign][0][width][.precision][type] of the
 * kinds templates use; anything else is refused by name. */
static hr_status format_spec(jj_ctx *cx, const jj_node *at, jj_buf *b, const char *s, size_t n, jv v) {
    size_t i = 0;
    char fill = ' ', align = 0;
    if (n >= 2 && strchr("<>^", s[1])) fill = s[0], align = s[1], i = 2;
    else if (n >= 1 && strchr("<>^", s[0])) align = s[0], i = 1;
    char flags[4] = {0};
    int nf = 0, width = -1, prec = -1;
    if (i < n && strchr("+- ", s[i])) flags[nf++] = s[i++];
    if (i < n && s[i] == '0' && !align) flags[nf++] = '0', i++;
    while (i < n && s[i] >= '0' && s[i] <= '9') width = (width < 0 ? 0 : width * 10) + (s[i++] - '0');
    if (i < n && s[i] == '.')
        for (prec = 0, i++; i < n && s[i] >= '0' && s[i] <= '9';) prec = prec * 10 + (s[i++] - '0');
    char type = i < n ? s[i++] : 0;
    if (i != n || (type && !strchr("sdfFeEgGxXo%", type)) || width > 4096 || prec > 4096)
        return jj_fail(cx, at, "unsupported format spec '%.*s'", (int)n, s);
    jj_buf body = {0};
    hr_status st = HR_OK;
    if (type == '%') {
        if (!jv_is_number(v)) st = jj_fail(cx, at, "unknown format code '%%' for %s", jv_type_name(v));
        else {
            jv pct = {.kind = JV_FLOAT};
            pct.u.f = jv_as_double(v) * 100;
            st = convert(cx, at, &body, 'f', flags, -1, prec < 0 ? 6 : prec, pct);
            jj_buf_putc(&body, '%');
        }
    } else if (!type) {
        if (jv_is_number(v) && (nf || prec >= 0)) st = convert(cx, at, &body, v.kind == JV_FLOAT ? 'g' : 'd', flags, -1, prec, v);
        else jv_str(&body, v);
    } else {
        if (type == 's' && v.kind != JV_STR) st = jj_fail(cx, at, "unknown format code 's' for %s", jv_type_name(v));
        else if (type != 's' && !jv_is_number(v))
            st = jj_fail(cx, at, "unknown format code '%c' for %s", type, jv_type_name(v));
        else st = convert(cx, at, &body, type, flags, -1, type == 's' ? prec : type == 'd' ? -1 : prec < 0 && strchr("fFeE", type) ? 6 : prec, v);
    }
    if (st == HR_OK) {
        /* numbers align right by default, text left; '0' pads numbers after the sign */
        if (!align) align = jv_is_number(v) && v.kind != JV_BOOL ? '>' : '<';
        size_t len = body.n, pad = width > 0 && (size_t)width > len ? (size_t)width - len : 0;
        bool zero = strchr(flags, '0') != NULL && jv_is_number(v);
        size_t lead = align == '>' ? pad : align == '^' ? pad / 2 : 0, sign = 0;
        if (zero && len && strchr("+- ", body.p[0])) jj_buf_putc(b, body.p[0]), sign = 1;
        for (size_t k = 0; k < lead; k++) jj_buf_putc(b, zero ? '0' : fill);
        jj_buf_put(b, body.p ? body.p + sign : "", len - sign);
        for (size_t k = lead; k < pad; k++) jj_buf_putc(b, fill);
    }
    jj_buf_free(&body);
    return st;
}

hr_status jj_str_format(jj_ctx *cx, const jj_node *at, jv fmt, const jj_args *a, jv *out) {
    jj_buf b = {0};
    const char *p = fmt.u.s.p, *end = p + fmt.u.s.n;
    size_t auto_i = 0;
    hr_status st = HR_OK;
    while (p < end && st == HR_OK) {
        if (*p == '{' && p + 1 < end && p[1] == '{') jj_buf_putc(&b, '{'), p += 2;
        else if (*p == '}' && p + 1 < end && p[1] == '}') jj_buf_putc(&b, '}'), p += 2;
        else if (*p == '}') st = jj_fail(cx, at, "Single '}' encountered in format string");
        else if (*p != '{') jj_buf_putc(&b, *p++);
        else {
            const char *close = memchr(p, '}', (size_t)(end - p));
            if (!close) {
                st = jj_fail(cx, at, "Single '{' encountered in format string");
                break;
            }
            const char *field = p + 1, *colon = memchr(field, ':', (size_t)(close - field));
            const char *fe = colon ? colon : close;
            size_t fl = (size_t)(fe - field);
            const jv *v = NULL;
            if (memchr(field, '.', fl) || memchr(field, '[', fl) || memchr(field, '!', fl)) {
                st = jj_fail(cx, at, "format fields with attributes, indexes or conversions are not supported");
                break;
            }
            if (!fl) v = auto_i < a->n_pos ? &a->pos[auto_i++] : NULL;
            else if (field[0] >= '0' && field[0] <= '9') {
                size_t i = (size_t)strtoul(field, NULL, 10);
                v = i < a->n_pos ? &a->pos[i] : NULL;
            } else v = kwarg(a, field, fl);
            if (!v) {
                st = jj_fail(cx, at, "format field '%.*s' has no value", (int)fl, field);
                break;
            }
            if (colon) st = format_spec(cx, at, &b, colon + 1, (size_t)(close - colon - 1), *v);
            else jv_str(&b, *v);
            p = close + 1;
        }
    }
    if (st != HR_OK) {
        jj_buf_free(&b);
        return st;
    }
    return done(cx, at, &b, out);
}

/* ---- filters ------------------------------------------------------------------- */

hr_status jj_escape(jj_ctx *cx, const jj_node *at, jv in, jv *out) {
    jj_buf s = {0}, b = {0};
    jv_str(&s, in);
    for (size_t i = 0; i < s.n; i++) {
        switch (s.p[i]) {
        case '&': jj_buf_puts(&b, "&amp;"); break;
        case '<': jj_buf_puts(&b, "&lt;"); break;
        case '>': jj_buf_puts(&b, "&gt;"); break;
        case '"': jj_buf_puts(&b, "&#34;"); break;
        case '\'': jj_buf_puts(&b, "&#39;"); break;
        default: jj_buf_putc(&b, s.p[i]);
        }
    }
    b.oom |= s.oom;
    jj_buf_free(&s);
    return done(cx, at, &b, out);
}

/* Jinja's do_batch, step for step: a group goes out when it holds size
 * items and another comes (so size 0 starts with an empty group, and a
 * negative size never closes one); the last is padded with fill to size. */
hr_status jj_batch(jj_ctx *cx, const jj_node *at, jv in, int64_t size, const jv *fill, jv *out) {
    jj_list *items;
    HR_TRY(jj_iterate(cx, at, in, &items));
    size_t groups = items->n + 1, closed = 0, start = 0;
    jj_list *res = jj_list_new(cx->arena, groups);
    if (!res) return jj_oom(cx, at);
    for (size_t i = 0; i <= items->n; i++) {
        bool last = i == items->n;
        if (!last && (int64_t)(i - start) != size) continue;
        if (last && i == start) break; /* nothing left */
        size_t n = i - start, pad = last && fill && size > 0 && (int64_t)n < size ? (size_t)size - n : 0;
        jj_list *g = jj_list_new(cx->arena, n + pad);
        if (!g) return jj_oom(cx, at);
        for (size_t k = 0; k < n + pad; k++) g->v[k] = k < n ? items->v[start + k] : *fill;
        res->v[closed++] = (jv){.kind = JV_LIST, .u.l = g};
        start = i;
    }
    res->n = closed;
    *out = (jv){.kind = JV_LIST, .u.l = res};
    return HR_OK;
}
