/* Values of the chat-template engine: the arena they live in, lists and
 * ordered dicts, and Python's truth, equality, str() and repr(), which is
 * what Jinja prints for them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/jinja.h"

/* ---- arena ---- */
struct jj_chunk {
    jj_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

#define JJ_CHUNK ((size_t)64 << 10)

void *jj_alloc(jj_arena *a, size_t n) {
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0) n = sizeof(max_align_t);
    jj_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > JJ_CHUNK / 2 ? n : JJ_CHUNK;
        if (n > JJ_MAX_ARENA || a->total + cap > JJ_MAX_ARENA) return NULL;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        a->total += cap;
        /* A big block goes behind the head so the head's free space stays usable. */
        if (cap > JJ_CHUNK && a->head) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void jj_arena_free(jj_arena *a) {
    for (jj_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- buffers ---- */
void jj_buf_put(jj_buf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n > JJ_MAX_OUTPUT) {
        b->oom = true;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jj_buf_puts(jj_buf *b, const char *s) { jj_buf_put(b, s, strlen(s)); }
void jj_buf_putc(jj_buf *b, char c) { jj_buf_put(b, &c, 1); }

void jj_buf_free(jj_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- containers ---- */
jv jv_str_copy(jj_arena *a, const char *p, size_t n, bool *oom) {
    char *q = jj_alloc(a, n + 1);
    if (!q) {
        *oom = true;
        return jv_strn("", 0);
    }
    if (n) memcpy(q, p, n);
    return jv_strn(q, n);
}

jj_list *jj_list_new(jj_arena *a, size_t n) {
    jj_list *l = jj_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (n > JJ_MAX_ARENA / sizeof(jv)) return NULL;
    l->v = jj_alloc(a, n * sizeof(jv));
    if (!l->v) return NULL;
    l->n = n;
    return l;
}

jj_dict *jj_dict_new(jj_arena *a, size_t cap) {
    jj_dict *d = jj_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap < 4) cap = 4;
    if (cap > JJ_MAX_ARENA / (2 * sizeof(jv))) return NULL;
    d->k = jj_alloc(a, cap * sizeof(jv));
    d->v = jj_alloc(a, cap * sizeof(jv));
    if (!d->k || !d->v) return NULL;
    d->cap = cap;
    return d;
}

static bool key_equal(jv a, jv b) {
    if (a.kind == JV_STR && b.kind == JV_STR) return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    return jv_equal(a, b);
}

const jv *jj_dict_get(const jj_dict *d, jv k) {
    for (size_t i = 0; i < d->n; i++)
        if (key_equal(d->k[i], k)) return &d->v[i];
    return NULL;
}

const jv *jj_dict_get_str(const jj_dict *d, const char *k) { return jj_dict_get(d, jv_strn(k, strlen(k))); }

bool jj_dict_set(jj_arena *a, jj_dict *d, jv k, jv v) {
    for (size_t i = 0; i < d->n; i++)
        if (key_equal(d->k[i], k)) {
            d->v[i] = v;
            return true;
        }
    if (d->n == d->cap) {
        /* The old arrays stay in the arena: growth doubles, so the waste is bounded by the live size. */
        size_t cap = d->cap * 2;
        jv *nk = jj_alloc(a, cap * sizeof(jv)), *nv = jj_alloc(a, cap * sizeof(jv));
        if (!nk || !nv) return false;
        memcpy(nk, d->k, d->n * sizeof(jv));
        memcpy(nv, d->v, d->n * sizeof(jv));
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return true;
}

/* ---- Python semantics ---- */
bool jv_truthy(jv v) {
    switch (v.kind) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

bool jv_is_number(jv v) { return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL; }

double jv_as_double(jv v) {
    switch (v.kind) {
    case JV_BOOL: return v.u.b;
    case JV_INT: return (double)v.u.i;
    case JV_FLOAT: return v.u.f;
    default: return 0;
    }
}

#define JJ_VALUE_MAX_DEPTH 200 /* values nested deeper (built by a loop) are refused, not recursed into */

static bool equal_at(jv a, jv b, int depth);

bool jv_equal(jv a, jv b) { return equal_at(a, b, 0); }

static bool equal_at(jv a, jv b, int depth) {
    if (depth > JJ_VALUE_MAX_DEPTH) return false;
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) {
            int64_t x = a.kind == JV_BOOL ? a.u.b : a.u.i, y = b.kind == JV_BOOL ? b.u.b : b.u.i;
            return x == y;
        }
        return jv_as_double(a) == jv_as_double(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if ((a.flag & JV_TUPLE) != (b.flag & JV_TUPLE) || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal_at(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            const jv *o = jj_dict_get(b.u.d, a.u.d->k[i]);
            if (!o || !equal_at(a.u.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

const char *jv_type_name(jv v) {
    switch (v.kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.flag & JV_TUPLE ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_LOOP: return "LoopContext";
    default: return "function";
    }
}

/* Python's float repr: repr() picks the shortest digits that read back the
 * same double, then writes them positionally when the exponent is in
 * [-4, 16) (with ".0" for whole numbers), else as d.ddde+XX. */
void jj_float_repr(jj_buf *b, double f) {
    if (isnan(f)) { jj_buf_puts(b, "nan"); return; }
    if (isinf(f)) { jj_buf_puts(b, f < 0 ? "-inf" : "inf"); return; }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) jj_buf_putc(b, '-');
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            jj_buf_puts(b, "0.");
            for (int i = 0; i < -exp - 1; i++) jj_buf_putc(b, '0');
            jj_buf_put(b, digits, (size_t)nd);
        } else if (nd <= exp + 1) {
            jj_buf_put(b, digits, (size_t)nd);
            for (int i = nd; i < exp + 1; i++) jj_buf_putc(b, '0');
            jj_buf_puts(b, ".0");
        } else {
            jj_buf_put(b, digits, (size_t)exp + 1);
            jj_buf_putc(b, '.');
            jj_buf_put(b, digits + exp + 1, (size_t)(nd - exp - 1));
        }
    } else {
        jj_buf_putc(b, digits[0]);
        if (nd > 1) {
            jj_buf_putc(b, '.');
            jj_buf_put(b, digits + 1, (size_t)nd - 1);
        }
        snprintf(tmp, sizeof tmp, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        jj_buf_puts(b, tmp);
    }
}

/* Decodes one UTF-8 sequence at s (n bytes left); *len its length. Invalid
 * bytes come back as themselves, one at a time. */
uint32_t jj_utf8_next(const unsigned char *s, size_t n, size_t *len) {
    uint32_t c = s[0];
    size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (k == 0 || k > n) { *len = 1; return c; }
    if (k == 1) { *len = 1; return c; }
    c &= 0x7fu >> k;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) { *len = 1; return s[0]; }
        c = c << 6 | (s[i] & 0x3f);
    }
    *len = k;
    return c;
}

/* Python's str.isprintable: not the categories Cc, Cf, Cs, Co, Cn, Zl, Zp,
 * nor Zs other than the space. */
static bool py_printable(uint32_t c) {
    if (c == ' ') return true;
    if (c > 0x10ffff) return false;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default: return true;
    }
}

static void str_repr(jj_buf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jj_buf_putc(b, q);
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t c = jj_utf8_next((const unsigned char *)s + i, n - i, &len);
        char tmp[16];
        if (c == (uint32_t)q || c == '\\') {
            jj_buf_putc(b, '\\');
            jj_buf_putc(b, (char)c);
        } else if (c == '\n') jj_buf_puts(b, "\\n");
        else if (c == '\r') jj_buf_puts(b, "\\r");
        else if (c == '\t') jj_buf_puts(b, "\\t");
        else if (py_printable(c)) jj_buf_put(b, s + i, len);
        else {
            if (c <= 0xff) snprintf(tmp, sizeof tmp, "\\x%02x", c);
            else if (c <= 0xffff) snprintf(tmp, sizeof tmp, "\\u%04x", c);
            else snprintf(tmp, sizeof tmp, "\\U%08x", c);
            jj_buf_puts(b, tmp);
        }
        i += len;
    }
    jj_buf_putc(b, q);
}

static void repr_at(jj_buf *b, jv v, int depth);
static void str_at(jj_buf *b, jv v, int depth);

static void seq_repr(jj_buf *b, jv v, int depth) {
    bool tuple = v.flag & JV_TUPLE;
    jj_buf_putc(b, tuple ? '(' : '[');
    for (size_t i = 0; i < v.u.l->n; i++) {
        if (i) jj_buf_puts(b, ", ");
        repr_at(b, v.u.l->v[i], depth + 1);
    }
    if (tuple && v.u.l->n == 1) jj_buf_putc(b, ',');
    jj_buf_putc(b, tuple ? ')' : ']');
}

static void dict_repr(jj_buf *b, const jj_dict *d, int depth) {
    jj_buf_putc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) jj_buf_puts(b, ", ");
        repr_at(b, d->k[i], depth + 1);
        jj_buf_puts(b, ": ");
        repr_at(b, d->v[i], depth + 1);
    }
    jj_buf_putc(b, '}');
}

void jv_repr(jj_buf *b, jv v) { repr_at(b, v, 0); }
void jv_str(jj_buf *b, jv v) { str_at(b, v, 0); }

static void repr_at(jj_buf *b, jv v, int depth) {
    switch (v.kind) {
    case JV_UNDEF: jj_buf_puts(b, "Undefined"); return;
    case JV_STR: str_repr(b, v.u.s.p, v.u.s.n); return;
    default: str_at(b, v, depth); return;
    }
}

static void str_at(jj_buf *b, jv v, int depth) {
    char tmp[32];
    if (depth > JJ_VALUE_MAX_DEPTH) {
        b->oom = true; /* the caller reports the cut output */
        return;
    }
    switch (v.kind) {
    case JV_UNDEF: return;
    case JV_NONE: jj_buf_puts(b, "None"); return;
    case JV_BOOL: jj_buf_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i); jj_buf_puts(b, tmp); return;
    case JV_FLOAT: jj_float_repr(b, v.u.f); return;
    case JV_STR: jj_buf_put(b, v.u.s.p, v.u.s.n); return;
    case JV_LIST: seq_repr(b, v, depth); return;
    case JV_DICT: dict_repr(b, v.u.d, depth); return;
    case JV_NS: jj_buf_puts(b, "<Namespace "); dict_repr(b, v.u.d, depth); jj_buf_putc(b, '>'); return;
    case JV_MACRO: jj_buf_puts(b, "<Macro>"); return;
    case JV_LOOP: jj_buf_puts(b, "<LoopContext>"); return;
    default: jj_buf_puts(b, "<built-in function>"); return;
    }
}
