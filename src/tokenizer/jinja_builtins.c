/* Filters, tests, methods and global functions of the chat-template
 * engine: Jinja2's built-ins (jinja2/filters.py, tests.py) with the
 * overrides transformers installs (tojson as json.dumps, raise_exception,
 * strftime_now, namespace that refuses underscore names). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

/* Argument i by position, else by keyword `name`; NULL when not given. */
static const jv *arg(const jj_args *a, size_t i, const char *name) {
    if (i < a->n_pos) return &a->pos[i];
    for (size_t k = 0; name && k < a->n_kw; k++)
        if (!strcmp(a->kw_names[k], name)) return &a->kw[k];
    return NULL;
}

static hr_status want_str(jj_ctx *cx, const jj_node *at, const jv *v, const char *what) {
    if (v && v->kind != JV_STR) return jj_fail(cx, at, "%s must be a string, not %s", what, jv_type_name(*v));
    return HR_OK;
}

static hr_status want_int(jj_ctx *cx, const jj_node *at, const jv *v, const char *what, int64_t *out) {
    if (v->kind == JV_BOOL) *out = v->u.b;
    else if (v->kind == JV_INT) *out = v->u.i;
    else return jj_fail(cx, at, "%s must be an integer, not %s", what, jv_type_name(*v));
    return HR_OK;
}

static hr_status buf_result(jj_ctx *cx, const jj_node *at, jj_buf *b, jv *out) {
    bool oom = b->oom;
    *out = jv_str_copy(cx->arena, b->p ? b->p : "", b->n, &oom);
    jj_buf_free(b);
    return oom ? jj_oom(cx, at) : HR_OK;
}

static jv list_value(jj_list *l, uint8_t flag) {
    jv v = {.kind = JV_LIST, .flag = flag};
    v.u.l = l;
    return v;
}

/* ---- tojson ---- */
static hr_status f_tojson(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, jv *out) {
    const jv *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"),
             *sk = arg(a, 3, "sort_keys");
    int indent = -1;
    char indent_buf[64];
    const char *indent_str = NULL;
    if (ind && ind->kind != JV_NONE) {
        if (ind->kind == JV_STR) {
            if (ind->u.s.n >= sizeof indent_buf) return jj_fail(cx, at, "tojson: indent string too long");
            memcpy(indent_buf, ind->u.s.p, ind->u.s.n);
            indent_buf[ind->u.s.n] = 0;
        } else {
            int64_t w = 0;
            HR_TRY(want_int(cx, at, ind, "tojson indent", &w));
            if (w < 0) w = 0;
            if (w >= (int64_t)sizeof indent_buf) return jj_fail(cx, at, "tojson: indent too large");
            memset(indent_buf, ' ', (size_t)w);
            indent_buf[w] = 0;
        }
        indent = 0;
        indent_str = indent_buf;
    }
    char item_sep[32], key_sep[32];
    const char *is = NULL, *ks = NULL;
    if (sep && sep->kind != JV_NONE) {
        if (sep->kind != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].kind != JV_STR || sep->u.l->v[1].kind != JV_STR ||
            sep->u.l->v[0].u.s.n >= sizeof item_sep || sep->u.l->v[1].u.s.n >= sizeof key_sep)
            return jj_fail(cx, at, "tojson: separators must be a pair of short strings");
        memcpy(item_sep, sep->u.l->v[0].u.s.p, sep->u.l->v[0].u.s.n);
        item_sep[sep->u.l->v[0].u.s.n] = 0;
        memcpy(key_sep, sep->u.l->v[1].u.s.p, sep->u.l->v[1].u.s.n);
        key_sep[sep->u.l->v[1].u.s.n] = 0;
        is = item_sep;
        ks = key_sep;
    }
    jj_buf b = {0};
    const char *why = NULL;
    if (!jj_json_dump(&b, in, ea && jv_truthy(*ea), indent, indent_str, is, ks, sk && jv_truthy(*sk), &why)) {
        jj_buf_free(&b);
        return jj_fail(cx, at, "tojson: %s", why ? why : "cannot serialise");
    }
    return buf_result(cx, at, &b, out);
}

/* ---- sequences ---- */
static hr_status length_of(jj_ctx *cx, const jj_node *at, jv in, int64_t *n) {
    switch (in.kind) {
    case JV_UNDEF: *n = 0; return HR_OK;
    case JV_STR: *n = (int64_t)jj_str_len(in); return HR_OK;
    case JV_LIST: *n = (int64_t)in.u.l->n; return HR_OK;
    case JV_DICT: *n = (int64_t)in.u.d->n; return HR_OK;
    default: return jj_fail(cx, at, "object of type '%s' has no len()", jv_type_name(in));
    }
}

/* Jinja's attribute getter for filters: "a.b.0" looks up each part as an item. */
static hr_status attr_path(jj_ctx *cx, const jj_node *at, jv item, jv path, jv *out) {
    if (path.kind == JV_INT) return jj_getitem(cx, at, item, path, out);
    if (path.kind != JV_STR) return jj_fail(cx, at, "attribute must be a string");
    size_t start = 0;
    jv v = item;
    for (size_t i = 0; i <= path.u.s.n; i++) {
        if (i < path.u.s.n && path.u.s.p[i] != '.') continue;
        jv key = jv_strn(path.u.s.p + start, i - start);
        bool digits = key.u.s.n > 0;
        int64_t num = 0;
        for (size_t k = 0; k < key.u.s.n; k++) {
            if (key.u.s.p[k] < '0' || key.u.s.p[k] > '9' || num > INT64_MAX / 10) { digits = false; break; }
            num = num * 10 + (key.u.s.p[k] - '0');
        }
        if (v.kind == JV_UNDEF) return jj_fail(cx, at, "'%.*s' is undefined", (int)key.u.s.n, key.u.s.p);
        HR_TRY(jj_getitem(cx, at, v, digits ? jv_int(num) : key, &v));
        start = i + 1;
    }
    *out = v;
    return HR_OK;
}

/* select, reject, selectattr, rejectattr. */
static hr_status f_select(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, bool by_attr, bool keep, jv *out) {
    jj_list *items;
    HR_TRY(jj_iterate(cx, at, in, &items));
    size_t first = by_attr ? 1 : 0;
    const jv *attr = by_attr ? arg(a, 0, NULL) : NULL;
    if (by_attr && !attr) return jj_fail(cx, at, "selectattr/rejectattr need an attribute name");
    const jv *test = arg(a, first, NULL);
    HR_TRY(want_str(cx, at, test, "test name"));
    char tname[64] = "";
    if (test) {
        if (test->u.s.n >= sizeof tname) return jj_fail(cx, at, "no test named '%.*s'", 40, test->u.s.p);
        memcpy(tname, test->u.s.p, test->u.s.n);
        tname[test->u.s.n] = 0;
    }
    jj_args targs = {.pos = a->pos + (test ? first + 1 : a->n_pos), .n_pos = test ? a->n_pos - first - 1 : 0};
    jj_list *res = jj_list_new(cx->arena, items->n);
    if (!res) return jj_oom(cx, at);
    res->n = 0;
    for (size_t i = 0; i < items->n; i++) {
        if (++cx->iterations > JJ_MAX_ITERATIONS) return jj_fail(cx, at, "more than %u loop iterations", JJ_MAX_ITERATIONS);
        jv v = items->v[i];
        if (by_attr) HR_TRY(attr_path(cx, at, items->v[i], *attr, &v));
        bool r;
        if (test) HR_TRY(jj_test(cx, at, tname, v, &targs, &r));
        else r = jv_truthy(v);
        if (r == keep) res->v[res->n++] = items->v[i];
    }
    *out = list_value(res, 0);
    return HR_OK;
}

static hr_status f_map(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, jv *out) {
    jj_list *items;
    HR_TRY(jj_iterate(cx, at, in, &items));
    const jv *attr = arg(a, a->n_pos, "attribute"), *def = arg(a, a->n_pos, "default");
    const jv *fname = a->n_pos ? &a->pos[0] : NULL;
    if (!attr && !fname) return jj_fail(cx, at, "map needs a filter name or attribute=");
    if (!attr) HR_TRY(want_str(cx, at, fname, "filter name"));
    char name[64] = "";
    if (!attr) {
        if (fname->u.s.n >= sizeof name) return jj_fail(cx, at, "no filter named '%.*s'", 40, fname->u.s.p);
        memcpy(name, fname->u.s.p, fname->u.s.n);
        name[fname->u.s.n] = 0;
    }
    jj_args fargs = {.pos = a->pos + 1, .n_pos = a->n_pos ? a->n_pos - 1 : 0, .kw_names = a->kw_names, .kw = a->kw,
                     .n_kw = a->n_kw};
    jj_list *res = jj_list_new(cx->arena, items->n);
    if (!res) return jj_oom(cx, at);
    for (size_t i = 0; i < items->n; i++) {
        if (++cx->iterations > JJ_MAX_ITERATIONS) return jj_fail(cx, at, "more than %u loop iterations", JJ_MAX_ITERATIONS);
        if (attr) {
            HR_TRY(attr_path(cx, at, items->v[i], *attr, &res->v[i]));
            if (def && res->v[i].kind == JV_UNDEF) res->v[i] = *def;
        } else {
            HR_TRY(jj_filter(cx, at, name, items->v[i], &fargs, &res->v[i]));
        }
    }
    *out = list_value(res, 0);
    return HR_OK;
}

static hr_status f_join(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, jv *out) {
    const jv *d = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    jv sep = jv_strn("", 0);
    if (d) HR_TRY(jj_to_str(cx, at, *d, &sep));
    jj_list *items;
    HR_TRY(jj_iterate(cx, at, in, &items));
    jj_buf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        jv v = items->v[i], s;
        hr_status st = attr ? attr_path(cx, at, v, *attr, &v) : HR_OK;
        if (st == HR_OK) st = jj_to_str(cx, at, v, &s);
        if (st != HR_OK) { jj_buf_free(&b); return st; }
        if (i) jj_buf_put(&b, sep.u.s.p, sep.u.s.n);
        jj_buf_put(&b, s.u.s.p, s.u.s.n);
    }
    return buf_result(cx, at, &b, out);
}

/* Sort key for sort/unique: strings fold case unless case_sensitive. */
static hr_status fold_key(jj_ctx *cx, const jj_node *at, jv v, bool case_sensitive, jv *out) {
    if (v.kind != JV_STR || case_sensitive) {
        *out = v;
        return HR_OK;
    }
    jj_buf b = {0};
    jj_str_case(&b, v, 'l');
    return buf_result(cx, at, &b, out);
}

static hr_status f_unique(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, jv *out) {
    const jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    jj_list *items;
    HR_TRY(jj_iterate(cx, at, in, &items));
    jj_list *res = jj_list_new(cx->arena, items->n), *keys = jj_list_new(cx->arena, items->n);
    if (!res || !keys) return jj_oom(cx, at);
    res->n = 0;
    for (size_t i = 0; i < items->n; i++) {
        if (++cx->iterations > JJ_MAX_ITERATIONS) return jj_fail(cx, at, "more than %u loop iterations", JJ_MAX_ITERATIONS);
        jv k = items->v[i];
        if (attr) HR_TRY(attr_path(cx, at, k, *attr, &k));
        HR_TRY(fold_key(cx, at, k, cs && jv_truthy(*cs), &k));
        bool seen = false;
        for (size_t j = 0; j < res->n && !seen; j++) seen = jv_equal(keys->v[j], k);
        if (!seen) {
            keys->v[res->n] = k;
            res->v[res->n++] = items->v[i];
        }
    }
    *out = list_value(res, 0);
    return HR_OK;
}

static hr_status key_less(jj_ctx *cx, const jj_node *at, jv x, jv y, bool *less) {
    jv r;
    HR_TRY(jj_binop(cx, at, JOP_LT, x, y, &r));
    *less = r.u.b;
    return HR_OK;
}

static hr_status sort_by_keys(jj_ctx *cx, const jj_node *at, jj_list *res, jj_list *keys, bool descending);

static hr_status f_sort(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, jv *out) {
    const jv *rev = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *attr = arg(a, 2, "attribute");
    jj_list *items;
    HR_TRY(jj_iterate(cx, at, in, &items));
    size_t n = items->n;
    jj_list *res = jj_list_new(cx->arena, n), *keys = jj_list_new(cx->arena, n);
    if (!res || !keys) return jj_oom(cx, at);
    for (size_t i = 0; i < n; i++) {
        jv k = items->v[i];
        if (attr) HR_TRY(attr_path(cx, at, k, *attr, &k));
        HR_TRY(fold_key(cx, at, k, cs && jv_truthy(*cs), &keys->v[i]));
        res->v[i] = items->v[i];
    }
    HR_TRY(sort_by_keys(cx, at, res, keys, rev && jv_truthy(*rev)));
    *out = list_value(res, 0);
    return HR_OK;
}

/* Sorts res by keys (both reordered): an insertion sort, stable like
 * Python's, and bounded by the iteration limit. */
static hr_status sort_by_keys(jj_ctx *cx, const jj_node *at, jj_list *res, jj_list *keys, bool descending) {
    size_t n = res->n;
    for (size_t i = 1; i < n; i++) {
        jv k = keys->v[i], v = res->v[i];
        size_t j = i;
        while (j > 0) {
            if (++cx->iterations > JJ_MAX_ITERATIONS) return jj_fail(cx, at, "more than %u loop iterations", JJ_MAX_ITERATIONS);
            bool less;
            HR_TRY(descending ? key_less(cx, at, keys->v[j - 1], k, &less) : key_less(cx, at, k, keys->v[j - 1], &less));
            if (!less) break;
            keys->v[j] = keys->v[j - 1];
            res->v[j] = res->v[j - 1];
            j--;
        }
        keys->v[j] = k;
        res->v[j] = v;
    }
    return HR_OK;
}

/* dictsort(case_sensitive=False, by='key', reverse=False): the items,
 * sorted by key or value. */
static hr_status f_dictsort(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, jv *out) {
    const jv *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rev = arg(a, 2, "reverse");
    if (in.kind != JV_DICT) return jj_fail(cx, at, "dictsort needs a mapping, not %s", jv_type_name(in));
    HR_TRY(want_str(cx, at, by, "dictsort by"));
    int pos = 0;
    if (by && by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5)) pos = 1;
    else if (by && !(by->u.s.n == 3 && !memcmp(by->u.s.p, "key", 3)))
        return jj_fail(cx, at, "You can only sort by either \"key\" or \"value\"");
    static const jj_args none = {0};
    jv items;
    HR_TRY(jj_call_method(cx, at, in, "items", &none, &items));
    jj_list *res = items.u.l, *keys = jj_list_new(cx->arena, res->n);
    if (!keys) return jj_oom(cx, at);
    for (size_t i = 0; i < res->n; i++) HR_TRY(fold_key(cx, at, res->v[i].u.l->v[pos], cs && jv_truthy(*cs), &keys->v[i]));
    HR_TRY(sort_by_keys(cx, at, res, keys, rev && jv_truthy(*rev)));
    *out = list_value(res, 0);
    return HR_OK;
}

static hr_status f_indent(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, jv *out) {
    const jv *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    jv s, ind = jv_strn("    ", 4);
    HR_TRY(jj_to_str(cx, at, in, &s));
    jj_buf ib = {0};
    if (w && w->kind == JV_STR) ind = *w;
    else if (w) {
        int64_t n = 0;
        HR_TRY(want_int(cx, at, w, "indent width", &n));
        for (int64_t k = 0; k < n && k < 4096; k++) jj_buf_putc(&ib, ' ');
        ind = jv_strn(ib.p ? ib.p : "", ib.n);
    }
    /* Jinja appends a newline and then splits lines: every piece between newlines is a line. */
    jj_buf b = {0};
    if (first && jv_truthy(*first)) jj_buf_put(&b, ind.u.s.p, ind.u.s.n);
    size_t start = 0;
    bool line0 = true;
    for (size_t i = 0; i <= s.u.s.n; i++) {
        if (i < s.u.s.n && s.u.s.p[i] != '\n') continue;
        size_t len = i - start;
        if (!line0) {
            jj_buf_putc(&b, '\n');
            if (len || (blank && jv_truthy(*blank))) jj_buf_put(&b, ind.u.s.p, ind.u.s.n);
        }
        jj_buf_put(&b, s.u.s.p + start, len);
        line0 = false;
        start = i + 1;
    }
    jj_buf_free(&ib);
    return buf_result(cx, at, &b, out);
}

static bool parse_number(jv s, bool want_int, jv *out) {
    char tmp[128];
    jv t = jj_str_strip(s, NULL, true, true);
    if (t.u.s.n == 0 || t.u.s.n >= sizeof tmp) return false;
    size_t k = 0;
    for (size_t i = 0; i < t.u.s.n; i++)
        if (t.u.s.p[i] != '_') tmp[k++] = t.u.s.p[i];
    tmp[k] = 0;
    char *end;
    if (want_int) {
        long long v = strtoll(tmp, &end, 10);
        if (*end) return false;
        *out = jv_int(v);
        return true;
    }
    double f = strtod(tmp, &end);
    if (*end) return false;
    *out = jv_float(f);
    return true;
}

static hr_status f_int_float(jj_ctx *cx, const jj_node *at, jv in, const jj_args *a, bool is_int, jv *out) {
    const jv *def = arg(a, 0, "default");
    jv d = def ? *def : is_int ? jv_int(0) : jv_float(0.0);
    switch (in.kind) {
    case JV_BOOL: *out = is_int ? jv_int(in.u.b) : jv_float(in.u.b); return HR_OK;
    case JV_INT: *out = is_int ? in : jv_float((double)in.u.i); return HR_OK;
    case JV_FLOAT:
        if (!is_int) *out = in;
        else if (isfinite(in.u.f) && fabs(in.u.f) < 9.2e18) *out = jv_int((int64_t)in.u.f);
        else *out = d;
        return HR_OK;
    case JV_STR: {
        jv v;
        if (parse_number(in, is_int, &v)) *out = v;
        else if (is_int && parse_number(in, false, &v) && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18)
            *out = jv_int((int64_t)v.u.f);
        else *out = d;
        return HR_OK;
    }
    default: *out = d; return HR_OK;
    }
}

/* ---- filters ---- */
hr_status jj_filter(jj_ctx *cx, const jj_node *at, const char *name, jv in, const jj_args *a, jv *out) {
    jj_buf b = {0};
    jv s;
    if (!strcmp(name, "tojson")) return f_tojson(cx, at, in, a, out);
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        int64_t n = 0;
        HR_TRY(length_of(cx, at, in, &n));
        *out = jv_int(n);
        return HR_OK;
    }
    if (!strcmp(name, "string")) return jj_to_str(cx, at, in, out);
    if (!strcmp(name, "safe")) { *out = in; return HR_OK; }
    if (!strcmp(name, "trim")) {
        const jv *chars = arg(a, 0, "chars");
        if (chars && chars->kind == JV_NONE) chars = NULL;
        HR_TRY(want_str(cx, at, chars, "trim chars"));
        HR_TRY(jj_to_str(cx, at, in, &s));
        *out = jj_str_strip(s, chars, true, true);
        return HR_OK;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper") || !strcmp(name, "capitalize")) {
        HR_TRY(jj_to_str(cx, at, in, &s));
        jj_str_case(&b, s, name[0] == 'l' ? 'l' : name[0] == 'u' ? 'u' : 'c');
        return buf_result(cx, at, &b, out);
    }
    if (!strcmp(name, "title")) {
        /* Jinja's title: each word (split at spaces, dashes and opening brackets) capitalised. */
        HR_TRY(jj_to_str(cx, at, in, &s));
        size_t i = 0;
        while (i < s.u.s.n) {
            size_t j = i;
            bool sepr = strchr("-({[< \t\n\r\v\f", s.u.s.p[i]) != NULL && s.u.s.p[i];
            while (j < s.u.s.n && (strchr("-({[< \t\n\r\v\f", s.u.s.p[j]) != NULL && s.u.s.p[j]) == sepr) j++;
            jv part = jv_strn(s.u.s.p + i, j - i);
            if (sepr) jj_buf_put(&b, part.u.s.p, part.u.s.n);
            else jj_str_case(&b, part, 'c');
            i = j;
        }
        return buf_result(cx, at, &b, out);
    }
    if (!strcmp(name, "replace")) {
        const jv *old = arg(a, 0, "old"), *nw = arg(a, 1, "new"), *cnt = arg(a, 2, "count");
        if (!old || !nw) return jj_fail(cx, at, "replace needs old and new");
        jv o, n2;
        int64_t c = -1;
        HR_TRY(jj_to_str(cx, at, in, &s));
        HR_TRY(jj_to_str(cx, at, *old, &o));
        HR_TRY(jj_to_str(cx, at, *nw, &n2));
        if (cnt && cnt->kind != JV_NONE) HR_TRY(want_int(cx, at, cnt, "replace count", &c));
        jj_str_replace(&b, s, o, n2, c);
        return buf_result(cx, at, &b, out);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        const jv *def = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
        bool use = in.kind == JV_UNDEF || (boolean && jv_truthy(*boolean) && !jv_truthy(in));
        *out = use ? (def ? *def : jv_strn("", 0)) : in;
        return HR_OK;
    }
    if (!strcmp(name, "items")) {
        if (in.kind == JV_UNDEF) {
            jj_list *l = jj_list_new(cx->arena, 0);
            if (!l) return jj_oom(cx, at);
            *out = list_value(l, 0);
            return HR_OK;
        }
        if (in.kind != JV_DICT) return jj_fail(cx, at, "can only get item pairs from a mapping");
        return jj_call_method(cx, at, in, "items", a, out);
    }
    if (!strcmp(name, "list")) {
        jj_list *l;
        HR_TRY(jj_iterate(cx, at, in, &l));
        *out = list_value(l, 0);
        return HR_OK;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jj_list *l;
        if (in.kind == JV_UNDEF || in.kind == JV_NONE) {
            *out = jv_undef(name[0] == 'f' ? "no first item" : "no last item");
            return HR_OK;
        }
        HR_TRY(jj_iterate(cx, at, in, &l));
        *out = l->n ? l->v[name[0] == 'f' ? 0 : l->n - 1] : jv_undef(name[0] == 'f' ? "no first item" : "no last item");
        return HR_OK;
    }
    if (!strcmp(name, "reverse")) {
        jj_list *l;
        HR_TRY(jj_iterate(cx, at, in, &l));
        jj_list *r = jj_list_new(cx->arena, l->n);
        if (!r) return jj_oom(cx, at);
        for (size_t i = 0; i < l->n; i++) r->v[i] = l->v[l->n - 1 - i];
        if (in.kind != JV_STR) {
            *out = list_value(r, 0);
            return HR_OK;
        }
        for (size_t i = 0; i < r->n; i++) jj_buf_put(&b, r->v[i].u.s.p, r->v[i].u.s.n);
        return buf_result(cx, at, &b, out);
    }
    if (!strcmp(name, "select") || !strcmp(name, "reject")) return f_select(cx, at, in, a, false, name[0] == 's', out);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return f_select(cx, at, in, a, true, name[0] == 's', out);
    if (!strcmp(name, "map")) return f_map(cx, at, in, a, out);
    if (!strcmp(name, "dictsort")) return f_dictsort(cx, at, in, a, out);
    if (!strcmp(name, "escape") || !strcmp(name, "e") || !strcmp(name, "forceescape")) return jj_escape(cx, at, in, out);
    if (!strcmp(name, "format")) {
        if (a->n_pos && a->n_kw) return jj_fail(cx, at, "can't handle positional and keyword arguments at the same time");
        HR_TRY(jj_to_str(cx, at, in, &s));
        if (a->n_kw) {
            jj_dict *d = jj_dict_new(cx->arena, a->n_kw);
            if (!d) return jj_oom(cx, at);
            for (size_t k = 0; k < a->n_kw; k++) {
                bool oom = false;
                jv key = jv_str_copy(cx->arena, a->kw_names[k], strlen(a->kw_names[k]), &oom);
                if (oom || !jj_dict_set(cx->arena, d, key, a->kw[k])) return jj_oom(cx, at);
            }
            return jj_percent_format(cx, at, s, (jv){.kind = JV_DICT, .u.d = d}, out);
        }
        jj_list *l = jj_list_new(cx->arena, a->n_pos);
        if (!l) return jj_oom(cx, at);
        for (size_t i = 0; i < a->n_pos; i++) l->v[i] = a->pos[i];
        return jj_percent_format(cx, at, s, list_value(l, JV_TUPLE), out);
    }
    if (!strcmp(name, "batch")) {
        const jv *cnt = arg(a, 0, "linecount"), *fill = arg(a, 1, "fill_with");
        int64_t size = 0;
        if (!cnt) return jj_fail(cx, at, "batch needs a size");
        HR_TRY(want_int(cx, at, cnt, "batch size", &size));
        return jj_batch(cx, at, in, size, fill && fill->kind != JV_NONE ? fill : NULL, out);
    }
    if (!strcmp(name, "join")) return f_join(cx, at, in, a, out);
    if (!strcmp(name, "unique")) return f_unique(cx, at, in, a, out);
    if (!strcmp(name, "sort")) return f_sort(cx, at, in, a, out);
    if (!strcmp(name, "indent")) return f_indent(cx, at, in, a, out);
    if (!strcmp(name, "int")) return f_int_float(cx, at, in, a, true, out);
    if (!strcmp(name, "float")) return f_int_float(cx, at, in, a, false, out);
    if (!strcmp(name, "abs")) {
        if (in.kind == JV_FLOAT) *out = jv_float(fabs(in.u.f));
        else if (in.kind == JV_INT && in.u.i != INT64_MIN) *out = jv_int(in.u.i < 0 ? -in.u.i : in.u.i);
        else if (in.kind == JV_BOOL) *out = jv_int(in.u.b);
        else return jj_fail(cx, at, "bad operand type for abs(): '%s'", jv_type_name(in));
        return HR_OK;
    }
    if (!strcmp(name, "round")) {
        const jv *prec = arg(a, 0, "precision"), *method = arg(a, 1, "method");
        int64_t p = 0;
        if (prec) HR_TRY(want_int(cx, at, prec, "round precision", &p));
        if (!jv_is_number(in)) return jj_fail(cx, at, "round needs a number, not %s", jv_type_name(in));
        if (p < -20 || p > 20) return jj_fail(cx, at, "round precision out of range");
        double x = jv_as_double(in), m = pow(10.0, (double)p);
        char meth = method && method->kind == JV_STR && method->u.s.n ? method->u.s.p[0] : 'c';
        double r = meth == 'f' ? floor(x * m) / m : meth == 'c' && method && method->u.s.n > 1 && method->u.s.p[1] == 'e'
                 ? ceil(x * m) / m : nearbyint(x * m) / m;
        *out = jv_float(r);
        return HR_OK;
    }
    if (!strcmp(name, "sum") || !strcmp(name, "min") || !strcmp(name, "max")) {
        jj_list *l;
        HR_TRY(jj_iterate(cx, at, in, &l));
        if (name[1] == 'u') {
            const jv *attr = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
            jv acc = start ? *start : jv_int(0);
            for (size_t i = 0; i < l->n; i++) {
                jv v = l->v[i];
                if (attr) HR_TRY(attr_path(cx, at, v, *attr, &v));
                HR_TRY(jj_binop(cx, at, JOP_ADD, acc, v, &acc));
            }
            *out = acc;
            return HR_OK;
        }
        if (!l->n) {
            *out = jv_undef("no items");
            return HR_OK;
        }
        jv best = l->v[0];
        for (size_t i = 1; i < l->n; i++) {
            bool less;
            HR_TRY(name[1] == 'i' ? key_less(cx, at, l->v[i], best, &less) : key_less(cx, at, best, l->v[i], &less));
            if (less) best = l->v[i];
        }
        *out = best;
        return HR_OK;
    }
    if (!strcmp(name, "wordcount")) {
        HR_TRY(jj_to_str(cx, at, in, &s));
        jj_list *w = jj_str_split(cx->arena, s, NULL, -1, false);
        if (!w) return jj_oom(cx, at);
        *out = jv_int((int64_t)w->n);
        return HR_OK;
    }
    return jj_fail(cx, at, "unknown filter '%s'", name);
}

/* ---- tests ---- */
hr_status jj_test(jj_ctx *cx, const jj_node *at, const char *name, jv in, const jj_args *a, bool *out) {
    const jv *other = arg(a, 0, NULL);
    jv r;
    if (!strcmp(name, "defined")) *out = in.kind != JV_UNDEF;
    else if (!strcmp(name, "undefined")) *out = in.kind == JV_UNDEF;
    else if (!strcmp(name, "none")) *out = in.kind == JV_NONE;
    else if (!strcmp(name, "boolean")) *out = in.kind == JV_BOOL;
    else if (!strcmp(name, "true")) *out = in.kind == JV_BOOL && in.u.b;
    else if (!strcmp(name, "false")) *out = in.kind == JV_BOOL && !in.u.b;
    else if (!strcmp(name, "integer")) *out = in.kind == JV_INT;
    else if (!strcmp(name, "float")) *out = in.kind == JV_FLOAT;
    else if (!strcmp(name, "number")) *out = jv_is_number(in);
    else if (!strcmp(name, "string")) *out = in.kind == JV_STR;
    else if (!strcmp(name, "mapping")) *out = in.kind == JV_DICT;
    else if (!strcmp(name, "iterable")) *out = in.kind == JV_LIST || in.kind == JV_DICT || in.kind == JV_STR || in.kind == JV_UNDEF;
    else if (!strcmp(name, "sequence")) *out = in.kind == JV_LIST || in.kind == JV_DICT || in.kind == JV_STR || in.kind == JV_UNDEF;
    else if (!strcmp(name, "callable")) *out = in.kind == JV_MACRO || in.kind == JV_FUNC || in.kind == JV_METHOD;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper"))
        *out = in.kind == JV_STR && jj_str_is(in, name[0] == 'l' ? "islower" : "isupper");
    else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        int64_t v = 0;
        HR_TRY(want_int(cx, at, &in, name, &v));
        *out = (v % 2 != 0) == (name[0] == 'o');
    } else if (!strcmp(name, "divisibleby")) {
        int64_t v = 0, d = 0;
        if (!other) return jj_fail(cx, at, "divisibleby needs a number");
        HR_TRY(want_int(cx, at, &in, name, &v));
        HR_TRY(want_int(cx, at, other, name, &d));
        if (d == 0) return jj_fail(cx, at, "integer division or modulo by zero");
        *out = d == -1 || v % d == 0;
    } else if (!strcmp(name, "sameas")) {
        if (!other) return jj_fail(cx, at, "sameas needs a value");
        *out = in.kind == other->kind && (in.kind == JV_NONE || in.kind == JV_UNDEF || jv_equal(in, *other)) &&
               (in.kind != JV_LIST || in.u.l == other->u.l) && (in.kind != JV_DICT || in.u.d == other->u.d);
    } else {
        static const struct { const char *a, *b; int op; } CMP[] = {
            {"eq", "equalto", JOP_EQ}, {"==", NULL, JOP_EQ}, {"ne", "!=", JOP_NE}, {"lt", "lessthan", JOP_LT},
            {"<", NULL, JOP_LT}, {"le", "<=", JOP_LE}, {"gt", "greaterthan", JOP_GT}, {">", NULL, JOP_GT},
            {"ge", ">=", JOP_GE}, {"in", NULL, JOP_IN},
        };
        for (size_t k = 0; k < sizeof CMP / sizeof CMP[0]; k++)
            if (!strcmp(name, CMP[k].a) || (CMP[k].b && !strcmp(name, CMP[k].b))) {
                if (!other) return jj_fail(cx, at, "test '%s' needs a value to compare with", name);
                HR_TRY(jj_binop(cx, at, CMP[k].op, in, *other, &r));
                *out = r.u.b;
                return HR_OK;
            }
        return jj_fail(cx, at, "unknown test '%s'", name);
    }
    return HR_OK;
}

/* ---- methods ---- */
static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace", "upper", "lower",
    "title", "capitalize", "find", "rfind", "count", "join", "isdigit", "isalpha", "isalnum", "isspace",
    "isupper", "islower", "splitlines", "format", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};

static bool in_names(const char *const *names, const char *name) {
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return true;
    return false;
}

bool jj_has_method(jv self, const char *name) {
    switch (self.kind) {
    case JV_STR: return in_names(STR_METHODS, name);
    case JV_DICT: return in_names(DICT_METHODS, name);
    case JV_LOOP: return !strcmp(name, "cycle");
    default: return false;
    }
}

static hr_status affix(jj_ctx *cx, const jj_node *at, jv s, const jv *p, bool end, bool *out) {
    if (!p) return jj_fail(cx, at, "startswith/endswith need an argument");
    if (p->kind == JV_LIST && (p->flag & JV_TUPLE)) {
        *out = false;
        for (size_t i = 0; i < p->u.l->n && !*out; i++) HR_TRY(affix(cx, at, s, &p->u.l->v[i], end, out));
        return HR_OK;
    }
    if (p->kind != JV_STR)
        return jj_fail(cx, at, "startswith/endswith first arg must be str or a tuple of str, not %s", jv_type_name(*p));
    size_t n = p->u.s.n;
    *out = n <= s.u.s.n && !memcmp(s.u.s.p + (end ? s.u.s.n - n : 0), p->u.s.p, n);
    return HR_OK;
}

static hr_status str_method(jj_ctx *cx, const jj_node *at, jv s, const char *name, const jj_args *a, jv *out) {
    jj_buf b = {0};
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        const jv *chars = arg(a, 0, "chars");
        if (chars && chars->kind == JV_NONE) chars = NULL;
        HR_TRY(want_str(cx, at, chars, "strip chars"));
        *out = jj_str_strip(s, chars, name[0] != 'r', name[0] != 'l');
        return HR_OK;
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        const jv *sep = arg(a, 0, "sep"), *maxs = arg(a, 1, "maxsplit");
        int64_t m = -1;
        if (sep && sep->kind == JV_NONE) sep = NULL;
        HR_TRY(want_str(cx, at, sep, "split separator"));
        if (sep && sep->u.s.n == 0) return jj_fail(cx, at, "empty separator");
        if (maxs) HR_TRY(want_int(cx, at, maxs, "maxsplit", &m));
        jj_list *l = jj_str_split(cx->arena, s, sep, m, name[0] == 'r');
        if (!l) return jj_oom(cx, at);
        *out = list_value(l, 0);
        return HR_OK;
    }
    if (!strcmp(name, "splitlines")) {
        jv nl = jv_strn("\n", 1);
        jj_list *l = jj_str_split(cx->arena, s, &nl, -1, false);
        if (!l) return jj_oom(cx, at);
        if (l->n && l->v[l->n - 1].u.s.n == 0) l->n--;
        *out = list_value(l, 0);
        return HR_OK;
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        bool r;
        HR_TRY(affix(cx, at, s, arg(a, 0, NULL), name[0] == 'e', &r));
        *out = jv_bool(r);
        return HR_OK;
    }
    if (!strcmp(name, "replace")) {
        const jv *old = arg(a, 0, NULL), *nw = arg(a, 1, NULL), *cnt = arg(a, 2, "count");
        int64_t c = -1;
        if (!old || !nw) return jj_fail(cx, at, "replace needs old and new");
        HR_TRY(want_str(cx, at, old, "replace old"));
        HR_TRY(want_str(cx, at, nw, "replace new"));
        if (cnt) HR_TRY(want_int(cx, at, cnt, "replace count", &c));
        jj_str_replace(&b, s, *old, *nw, c);
        return buf_result(cx, at, &b, out);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
        jj_str_case(&b, s, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 't' ? 't' : 'c');
        return buf_result(cx, at, &b, out);
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "count")) {
        const jv *sub = arg(a, 0, NULL);
        if (!sub) return jj_fail(cx, at, "%s needs an argument", name);
        HR_TRY(want_str(cx, at, sub, name));
        if (name[0] != 'c') {
            *out = jv_int(jj_str_find(s, *sub, name[0] == 'r'));
            return HR_OK;
        }
        int64_t n = 0;
        if (sub->u.s.n == 0) n = (int64_t)jj_str_len(s) + 1;
        else
            for (size_t i = 0; i + sub->u.s.n <= s.u.s.n;)
                if (!memcmp(s.u.s.p + i, sub->u.s.p, sub->u.s.n)) { n++; i += sub->u.s.n; }
                else i++;
        *out = jv_int(n);
        return HR_OK;
    }
    if (!strcmp(name, "format")) return jj_str_format(cx, at, s, a, out);
    if (!strcmp(name, "join")) {
        const jv *it = arg(a, 0, NULL);
        if (!it) return jj_fail(cx, at, "join needs an iterable");
        jj_list *l;
        HR_TRY(jj_iterate(cx, at, *it, &l));
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].kind != JV_STR) {
                jj_buf_free(&b);
                return jj_fail(cx, at, "sequence item %zu: expected str instance, %s found", i, jv_type_name(l->v[i]));
            }
            if (i) jj_buf_put(&b, s.u.s.p, s.u.s.n);
            jj_buf_put(&b, l->v[i].u.s.p, l->v[i].u.s.n);
        }
        return buf_result(cx, at, &b, out);
    }
    *out = jv_bool(jj_str_is(s, name));
    return HR_OK;
}

hr_status jj_call_method(jj_ctx *cx, const jj_node *at, jv self, const char *name, const jj_args *a, jv *out) {
    if (self.kind == JV_STR) return str_method(cx, at, self, name, a, out);
    if (self.kind == JV_LOOP) {
        if (!a->n_pos) return jj_fail(cx, at, "no items for cycling given");
        *out = a->pos[self.u.loop->index0 % (int64_t)a->n_pos];
        return HR_OK;
    }
    if (self.kind != JV_DICT) return jj_fail(cx, at, "'%s' object has no method '%s'", jv_type_name(self), name);
    const jj_dict *d = self.u.d;
    if (!strcmp(name, "get")) {
        const jv *k = arg(a, 0, NULL), *def = arg(a, 1, NULL);
        if (!k) return jj_fail(cx, at, "get expected at least 1 argument");
        const jv *v = jj_dict_get(d, *k);
        *out = v ? *v : def ? *def : jv_none();
        return HR_OK;
    }
    jj_list *l = jj_list_new(cx->arena, d->n);
    if (!l) return jj_oom(cx, at);
    for (size_t i = 0; i < d->n; i++) {
        if (name[0] == 'k') l->v[i] = d->k[i];
        else if (name[0] == 'v') l->v[i] = d->v[i];
        else {
            jj_list *pair = jj_list_new(cx->arena, 2);
            if (!pair) return jj_oom(cx, at);
            pair->v[0] = d->k[i];
            pair->v[1] = d->v[i];
            l->v[i] = list_value(pair, JV_TUPLE);
        }
    }
    *out = list_value(l, 0);
    return HR_OK;
}

/* ---- global functions ---- */
static hr_status fn_strftime(jj_ctx *cx, const jj_node *at, const jj_args *a, jv *out) {
    const jv *f = arg(a, 0, "format");
    if (!f || f->kind != JV_STR) return jj_fail(cx, at, "strftime_now needs a format string");
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    if (cx->now) {
        int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
        if (sscanf(cx->now, "%d-%d-%dT%d:%d:%d", &y, &mo, &d, &h, &mi, &sec) < 3)
            return jj_fail(cx, at, "HUBRT_CHAT_DATE must be YYYY-MM-DD[THH:MM:SS], not '%s'", cx->now);
        tm.tm_year = y - 1900;
        tm.tm_mon = mo - 1;
        tm.tm_mday = d;
        tm.tm_hour = h;
        tm.tm_min = mi;
        tm.tm_sec = sec;
        time_t t = timegm(&tm); /* fills the weekday and the day of the year */
        gmtime_r(&t, &tm);
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &tm); /* datetime.now(): local time */
    }
    char fmt[256], res[512];
    if (f->u.s.n >= sizeof fmt) return jj_fail(cx, at, "strftime_now: format too long");
    memcpy(fmt, f->u.s.p, f->u.s.n);
    fmt[f->u.s.n] = 0;
    size_t n = f->u.s.n ? strftime(res, sizeof res, fmt, &tm) : 0;
    bool oom = false;
    *out = jv_str_copy(cx->arena, res, n, &oom);
    return oom ? jj_oom(cx, at) : HR_OK;
}

static hr_status fn_namespace(jj_ctx *cx, const jj_node *at, const jj_args *a, bool is_ns, jv *out) {
    jj_dict *d = jj_dict_new(cx->arena, 4);
    if (!d) return jj_oom(cx, at);
    if (a->n_pos > 1) return jj_fail(cx, at, "%s expected at most 1 positional argument", is_ns ? "namespace" : "dict");
    if (a->n_pos == 1) {
        jv src = a->pos[0];
        if (src.kind == JV_DICT) {
            for (size_t i = 0; i < src.u.d->n; i++)
                if (!jj_dict_set(cx->arena, d, src.u.d->k[i], src.u.d->v[i])) return jj_oom(cx, at);
        } else if (src.kind == JV_LIST) {
            for (size_t i = 0; i < src.u.l->n; i++) {
                jv p = src.u.l->v[i];
                if (p.kind != JV_LIST || p.u.l->n != 2) return jj_fail(cx, at, "dictionary update sequence element has wrong length");
                if (!jj_dict_set(cx->arena, d, p.u.l->v[0], p.u.l->v[1])) return jj_oom(cx, at);
            }
        } else {
            return jj_fail(cx, at, "'%s' object is not iterable", jv_type_name(src));
        }
    }
    for (size_t i = 0; i < a->n_kw; i++)
        if (!jj_dict_set(cx->arena, d, jv_strn(a->kw_names[i], strlen(a->kw_names[i])), a->kw[i])) return jj_oom(cx, at);
    for (size_t i = 0; is_ns && i < d->n; i++)
        if (d->k[i].kind == JV_STR && d->k[i].u.s.n && d->k[i].u.s.p[0] == '_')
            return jj_fail(cx, at, "chat templates cannot store underscore-prefixed attributes on a namespace");
    out->kind = is_ns ? JV_NS : JV_DICT;
    out->flag = 0;
    out->u.d = d;
    return HR_OK;
}

hr_status jj_call_func(jj_ctx *cx, const jj_node *at, int fn, const jj_args *a, jv *out) {
    switch (fn) {
    case JF_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (a->n_pos < 1 || a->n_pos > 3) return jj_fail(cx, at, "range expected 1 to 3 arguments");
        for (size_t i = 0; i < a->n_pos; i++) HR_TRY(want_int(cx, at, &a->pos[i], "range argument", &v[i]));
        int64_t start = a->n_pos == 1 ? 0 : v[0], stop = a->n_pos == 1 ? v[0] : v[1], step = a->n_pos == 3 ? v[2] : 1;
        if (step == 0) return jj_fail(cx, at, "range() arg 3 must not be zero");
        double count = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                                : ceil(((double)start - (double)stop) / (double)-step);
        if (count < 0) count = 0;
        /* Jinja's sandbox refuses ranges over MAX_RANGE (100000). */
        if (count > 100000) return jj_fail(cx, at, "range too big: the sandbox allows at most 100000 items");
        jj_list *l = jj_list_new(cx->arena, (size_t)count);
        if (!l) return jj_oom(cx, at);
        for (size_t i = 0; i < l->n; i++) l->v[i] = jv_int(start + (int64_t)i * step);
        *out = list_value(l, 0);
        return HR_OK;
    }
    case JF_NAMESPACE: return fn_namespace(cx, at, a, true, out);
    case JF_DICT: return fn_namespace(cx, at, a, false, out);
    case JF_RAISE: {
        jv msg = jv_strn("", 0);
        if (a->n_pos) HR_TRY(jj_to_str(cx, at, a->pos[0], &msg));
        return jj_error_at(cx->src, at->pos, HR_ERR_INVALID_ARG, "%.*s", (int)(msg.u.s.n > 400 ? 400 : msg.u.s.n),
                           msg.u.s.p);
    }
    case JF_STRFTIME: return fn_strftime(cx, at, a, out);
    default: return jj_fail(cx, at, "unknown function");
    }
}
