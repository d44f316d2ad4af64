/* Python's data model as Jinja's sandbox exposes it to a chat template:
 * attribute and item lookup (a miss is undefined, and only using an
 * undefined fails), iteration, slicing, and the arithmetic and comparison
 * operators with Python's rules (str + int is an error, 7 // -2 is -4,
 * 3 / 2 is 1.5). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

hr_status jj_undefined(jj_ctx *cx, const jj_node *at, jv v) {
    if (v.u.undef && v.flag == JV_UNDEF_MESSAGE) return jj_fail(cx, at, "%s", v.u.undef);
    if (v.u.undef) return jj_fail(cx, at, "'%s' is undefined", v.u.undef);
    return jj_fail(cx, at, "a value is undefined");
}

#define undefined_error jj_undefined

/* Jinja's object_type_repr: "dict object", "list object", ...; NULL for None. */
static const char *type_name(jv obj) {
    switch (obj.kind) {
    case JV_DICT: return "dict";
    case JV_LIST: return obj.flag & JV_TUPLE ? "tuple" : "list";
    case JV_STR: return "str";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_BOOL: return "bool";
    case JV_NS: return "Namespace";
    default: return NULL;
    }
}

/* The undefined a missed lookup gives, carrying Jinja's message for it:
 * "'list object' has no attribute 'x'" (a name), "list object has no
 * element 5" (an index). */
static jv missing(jj_ctx *cx, jv obj, const char *name, int64_t index) {
    const char *t = type_name(obj);
    size_t n = (name ? strlen(name) : 0) + 64;
    char *msg = jj_alloc(cx->arena, n);
    if (!msg) return jv_undef(name);
    if (name && !t) snprintf(msg, n, "'None' has no attribute '%s'", name);
    else if (name) snprintf(msg, n, "'%s object' has no attribute '%s'", t, name);
    else if (t) snprintf(msg, n, "%s object has no element %lld", t, (long long)index);
    else snprintf(msg, n, "None has no element %lld", (long long)index);
    jv v = jv_undef(msg);
    v.flag = JV_UNDEF_MESSAGE;
    return v;
}

/* Offsets of each code point of a string, plus its end: *n code points. */
static size_t *char_offsets(jj_ctx *cx, jv s, size_t *n) {
    size_t count = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t len;
        jj_utf8_next((const unsigned char *)s.u.s.p + i, s.u.s.n - i, &len);
        i += len;
        count++;
    }
    size_t *off = jj_alloc(cx->arena, (count + 1) * sizeof *off);
    if (!off) return NULL;
    count = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t len;
        off[count++] = i;
        jj_utf8_next((const unsigned char *)s.u.s.p + i, s.u.s.n - i, &len);
        i += len;
    }
    off[count] = s.u.s.n;
    *n = count;
    return off;
}

hr_status jj_getattr(jj_ctx *cx, const jj_node *at, jv obj, const char *name, jv *out) {
    switch (obj.kind) {
    case JV_UNDEF: return undefined_error(cx, at, obj);
    case JV_DICT:
    case JV_NS: {
        if (obj.kind == JV_DICT && jj_has_method(obj, name)) break;
        const jv *v = jj_dict_get_str(obj.u.d, name);
        *out = v ? *v : obj.kind == JV_DICT ? missing(cx, obj, name, 0) : jv_undef(name);
        return HR_OK;
    }
    case JV_LOOP: {
        const jj_loop *l = obj.u.loop;
        int64_t i = l->index0, n = l->length;
        if (!strcmp(name, "index")) *out = jv_int(i + 1);
        else if (!strcmp(name, "index0")) *out = jv_int(i);
        else if (!strcmp(name, "revindex")) *out = jv_int(n - i);
        else if (!strcmp(name, "revindex0")) *out = jv_int(n - i - 1);
        else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
        else if (!strcmp(name, "last")) *out = jv_bool(i == n - 1);
        else if (!strcmp(name, "length")) *out = jv_int(n);
        else if (!strcmp(name, "depth")) *out = jv_int(1);
        else if (!strcmp(name, "depth0")) *out = jv_int(0);
        else if (!strcmp(name, "previtem")) *out = i > 0 ? l->items->v[i - 1] : jv_undef("there is no previous item");
        else if (!strcmp(name, "nextitem")) *out = i + 1 < n ? l->items->v[i + 1] : jv_undef("there is no next item");
        else if (!strcmp(name, "cycle")) break;
        else *out = jv_undef(name);
        return HR_OK;
    }
    default:
        if (jj_has_method(obj, name)) break;
        *out = missing(cx, obj, name, 0);
        return HR_OK;
    }
    jj_method *m = jj_alloc(cx->arena, sizeof *m);
    if (!m) return jj_oom(cx, at);
    m->self = obj;
    m->name = name;
    out->kind = JV_METHOD;
    out->flag = 0;
    out->u.meth = m;
    return HR_OK;
}

hr_status jj_getitem(jj_ctx *cx, const jj_node *at, jv obj, jv key, jv *out) {
    if (obj.kind == JV_UNDEF) return undefined_error(cx, at, obj);
    if (obj.kind == JV_DICT || obj.kind == JV_NS) {
        const jv *v = jj_dict_get(obj.u.d, key);
        if (v) {
            *out = *v;
            return HR_OK;
        }
    } else if ((obj.kind == JV_LIST || obj.kind == JV_STR) && (key.kind == JV_INT || key.kind == JV_BOOL)) {
        int64_t i = key.kind == JV_BOOL ? key.u.b : key.u.i;
        if (obj.kind == JV_LIST) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            *out = i >= 0 && i < n ? obj.u.l->v[i] : missing(cx, obj, NULL, key.kind == JV_BOOL ? key.u.b : key.u.i);
            return HR_OK;
        }
        size_t n;
        size_t *off = char_offsets(cx, obj, &n);
        if (!off) return jj_oom(cx, at);
        if (i < 0) i += (int64_t)n;
        if (i < 0 || i >= (int64_t)n) {
            *out = jv_undef("string index out of range");
            return HR_OK;
        }
        *out = jv_strn(obj.u.s.p + off[i], off[i + 1] - off[i]);
        return HR_OK;
    }
    /* Jinja falls back to the attribute of that name. */
    if (key.kind == JV_STR && obj.kind != JV_DICT) {
        char *name = jj_alloc(cx->arena, key.u.s.n + 1);
        if (!name) return jj_oom(cx, at);
        memcpy(name, key.u.s.p, key.u.s.n);
        return jj_getattr(cx, at, obj, name, out);
    }
    if (key.kind == JV_STR && obj.kind == JV_DICT) {
        char *name = jj_alloc(cx->arena, key.u.s.n + 1);
        if (!name) return jj_oom(cx, at);
        memcpy(name, key.u.s.p, key.u.s.n);
        *out = missing(cx, obj, name, 0);
        return HR_OK;
    }
    *out = jv_undef(NULL);
    return HR_OK;
}

/* Python's slice.indices: clamps start and stop for a sequence of n. */
static void slice_bounds(int64_t n, const jv *lo, const jv *hi, int64_t step, int64_t *start, int64_t *stop) {
    int64_t def_start = step > 0 ? 0 : n - 1, def_stop = step > 0 ? n : -1;
    *start = def_start;
    *stop = def_stop;
    if (lo) {
        int64_t v = lo->u.i;
        if (v < 0) v += n;
        if (step > 0) *start = v < 0 ? 0 : v > n ? n : v;
        else *start = v < 0 ? -1 : v >= n ? n - 1 : v;
    }
    if (hi) {
        int64_t v = hi->u.i;
        if (v < 0) v += n;
        if (step > 0) *stop = v < 0 ? 0 : v > n ? n : v;
        else *stop = v < -1 ? -1 : v >= n ? n - 1 : v;
    }
}

hr_status jj_slice(jj_ctx *cx, const jj_node *at, jv obj, const jv *lo, const jv *hi, const jv *step_v, jv *out) {
    if (obj.kind == JV_UNDEF) return undefined_error(cx, at, obj);
    const jv *b[3] = {lo, hi, step_v};
    jv conv[3];
    for (int k = 0; k < 3; k++) {
        if (!b[k] || b[k]->kind == JV_NONE) { b[k] = NULL; continue; }
        if (b[k]->kind == JV_BOOL) { conv[k] = jv_int(b[k]->u.b); b[k] = &conv[k]; }
        if (b[k]->kind != JV_INT) return jj_fail(cx, at, "slice indices must be integers or None");
    }
    int64_t step = b[2] ? b[2]->u.i : 1;
    if (step == 0) return jj_fail(cx, at, "slice step cannot be zero");
    if (obj.kind != JV_LIST && obj.kind != JV_STR) {
        *out = jv_undef(NULL);
        return HR_OK;
    }
    size_t *off = NULL;
    int64_t n;
    if (obj.kind == JV_STR) {
        size_t cn;
        if (!(off = char_offsets(cx, obj, &cn))) return jj_oom(cx, at);
        n = (int64_t)cn;
    } else {
        n = (int64_t)obj.u.l->n;
    }
    int64_t start, stop;
    slice_bounds(n, b[0], b[1], step, &start, &stop);
    int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop + (-step) - 1) / (-step) : 0);
    if (obj.kind == JV_LIST) {
        jj_list *l = jj_list_new(cx->arena, (size_t)count);
        if (!l) return jj_oom(cx, at);
        for (int64_t k = 0; k < count; k++) l->v[k] = obj.u.l->v[start + k * step];
        out->kind = JV_LIST;
        out->flag = obj.flag;
        out->u.l = l;
        return HR_OK;
    }
    if (step == 1) {
        *out = jv_strn(obj.u.s.p + off[start], off[stop] - off[start]);
        return HR_OK;
    }
    char *s = jj_alloc(cx->arena, obj.u.s.n + 1);
    if (!s) return jj_oom(cx, at);
    size_t len = 0;
    for (int64_t k = 0; k < count; k++) {
        int64_t c = start + k * step;
        memcpy(s + len, obj.u.s.p + off[c], off[c + 1] - off[c]);
        len += off[c + 1] - off[c];
    }
    *out = jv_strn(s, len);
    return HR_OK;
}

hr_status jj_iterate(jj_ctx *cx, const jj_node *at, jv v, jj_list **out) {
    static jj_list empty = {0, NULL};
    switch (v.kind) {
    case JV_UNDEF: *out = &empty; return HR_OK;
    case JV_LIST: *out = v.u.l; return HR_OK;
    case JV_DICT: {
        jj_list *l = jj_list_new(cx->arena, v.u.d->n);
        if (!l) return jj_oom(cx, at);
        for (size_t i = 0; i < v.u.d->n; i++) l->v[i] = v.u.d->k[i];
        *out = l;
        return HR_OK;
    }
    case JV_STR: {
        size_t n;
        size_t *off = char_offsets(cx, v, &n);
        jj_list *l = off ? jj_list_new(cx->arena, n) : NULL;
        if (!l) return jj_oom(cx, at);
        for (size_t i = 0; i < n; i++) l->v[i] = jv_strn(v.u.s.p + off[i], off[i + 1] - off[i]);
        *out = l;
        return HR_OK;
    }
    default: return jj_fail(cx, at, "'%s' object is not iterable", jv_type_name(v));
    }
}

hr_status jj_to_str(jj_ctx *cx, const jj_node *at, jv v, jv *out) {
    if (v.kind == JV_STR) {
        *out = v;
        return HR_OK;
    }
    jj_buf b = {0};
    jv_str(&b, v);
    bool oom = b.oom;
    *out = jv_str_copy(cx->arena, b.p ? b.p : "", b.n, &oom);
    jj_buf_free(&b);
    return oom ? jj_oom(cx, at) : HR_OK;
}

static jv make_list(jj_list *l, uint8_t flag) {
    jv v = {.kind = JV_LIST, .flag = flag};
    v.u.l = l;
    return v;
}

static hr_status concat_str(jj_ctx *cx, const jj_node *at, jv a, jv b, jv *out) {
    if (a.u.s.n + b.u.s.n > JJ_MAX_OUTPUT) return jj_fail(cx, at, "string longer than 16 MiB");
    char *s = jj_alloc(cx->arena, a.u.s.n + b.u.s.n + 1);
    if (!s) return jj_oom(cx, at);
    memcpy(s, a.u.s.p, a.u.s.n);
    memcpy(s + a.u.s.n, b.u.s.p, b.u.s.n);
    *out = jv_strn(s, a.u.s.n + b.u.s.n);
    return HR_OK;
}

static hr_status repeat(jj_ctx *cx, const jj_node *at, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    size_t unit = seq.kind == JV_STR ? seq.u.s.n : seq.u.l->n * sizeof(jv);
    if (unit && (uint64_t)times > JJ_MAX_OUTPUT / unit) return jj_fail(cx, at, "repeated sequence too large");
    if (seq.kind == JV_STR) {
        char *s = jj_alloc(cx->arena, unit * (size_t)times + 1);
        if (!s) return jj_oom(cx, at);
        for (int64_t k = 0; k < times; k++) memcpy(s + (size_t)k * unit, seq.u.s.p, unit);
        *out = jv_strn(s, unit * (size_t)times);
        return HR_OK;
    }
    size_t n = seq.u.l->n;
    jj_list *l = jj_list_new(cx->arena, n * (size_t)times);
    if (!l) return jj_oom(cx, at);
    for (int64_t k = 0; k < times; k++) memcpy(l->v + (size_t)k * n, seq.u.l->v, n * sizeof(jv));
    *out = make_list(l, seq.flag);
    return HR_OK;
}

static int64_t as_int(jv v) { return v.kind == JV_BOOL ? v.u.b : v.u.i; }

static const char *op_text(int op) {
    static const char *const t[] = {"+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=",
                                    "in", "not in"};
    return t[op];
}

static hr_status int_arith(jj_ctx *cx, const jj_node *at, int op, int64_t x, int64_t y, jv *out) {
    int64_t r;
    switch (op) {
    case JOP_ADD: if (__builtin_add_overflow(x, y, &r)) goto overflow; break;
    case JOP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto overflow; break;
    case JOP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto overflow; break;
    case JOP_FLOORDIV:
    case JOP_MOD:
        if (y == 0) return jj_fail(cx, at, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) goto overflow;
        r = op == JOP_FLOORDIV ? x / y : x % y;
        if (op == JOP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0))) r--;
        if (op == JOP_MOD && r != 0 && ((r < 0) != (y < 0))) r += y;
        break;
    case JOP_POW:
        if (y < 0) {
            *out = jv_float(pow((double)x, (double)y));
            return HR_OK;
        }
        r = 1;
        for (int64_t k = 0; k < y; k++) {
            if (__builtin_mul_overflow(r, x, &r)) goto overflow;
            if (r == 0 || r == 1) break;
            if (r == -1) { r = (y - k - 1) % 2 ? -r : r; break; }
        }
        break;
    default: return jj_fail(cx, at, "bad operator");
    }
    *out = jv_int(r);
    return HR_OK;
overflow:
    return jj_fail(cx, at, "integer overflow in '%s' (hubrt's integers are 64-bit)", op_text(op));
}

static hr_status float_arith(jj_ctx *cx, const jj_node *at, int op, double x, double y, jv *out) {
    double r;
    switch (op) {
    case JOP_ADD: r = x + y; break;
    case JOP_SUB: r = x - y; break;
    case JOP_MUL: r = x * y; break;
    case JOP_DIV:
        if (y == 0) return jj_fail(cx, at, "division by zero");
        r = x / y;
        break;
    case JOP_FLOORDIV:
        if (y == 0) return jj_fail(cx, at, "float floor division by zero");
        r = floor(x / y);
        break;
    case JOP_MOD:
        if (y == 0) return jj_fail(cx, at, "float modulo");
        r = fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        break;
    case JOP_POW: r = pow(x, y); break;
    default: return jj_fail(cx, at, "bad operator");
    }
    *out = jv_float(r);
    return HR_OK;
}

/* Python's <, <=, >, >= for numbers, strings and sequences; *cmp is -1, 0 or 1. */
static hr_status order(jj_ctx *cx, const jj_node *at, int op, jv a, jv b, int *cmp, int depth) {
    if (depth > 200) return jj_fail(cx, at, "values nested too deeply to compare");
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) *cmp = (as_int(a) > as_int(b)) - (as_int(a) < as_int(b));
        else {
            double x = jv_as_double(a), y = jv_as_double(b);
            *cmp = (x > y) - (x < y);
        }
        return HR_OK;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        /* UTF-8 byte order is code point order. */
        int c = memcmp(a.u.s.p, b.u.s.p, a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n);
        *cmp = c ? (c > 0) - (c < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return HR_OK;
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && (a.flag & JV_TUPLE) == (b.flag & JV_TUPLE)) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return order(cx, at, op, a.u.l->v[i], b.u.l->v[i], cmp, depth + 1);
        }
        *cmp = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return HR_OK;
    }
    if (a.kind == JV_UNDEF) return undefined_error(cx, at, a);
    if (b.kind == JV_UNDEF) return undefined_error(cx, at, b);
    return jj_fail(cx, at, "'%s' not supported between instances of '%s' and '%s'", op_text(op), jv_type_name(a),
                   jv_type_name(b));
}

hr_status jj_contains(jj_ctx *cx, const jj_node *at, jv item, jv container, bool *out) {
    switch (container.kind) {
    case JV_STR:
        if (item.kind != JV_STR)
            return jj_fail(cx, at, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        if (item.u.s.n == 0) { *out = true; return HR_OK; }
        *out = false;
        for (size_t i = 0; i + item.u.s.n <= container.u.s.n; i++)
            if (!memcmp(container.u.s.p + i, item.u.s.p, item.u.s.n)) { *out = true; break; }
        return HR_OK;
    case JV_LIST:
        *out = false;
        for (size_t i = 0; i < container.u.l->n; i++)
            if (jv_equal(container.u.l->v[i], item)) { *out = true; break; }
        return HR_OK;
    case JV_DICT:
        *out = jj_dict_get(container.u.d, item) != NULL;
        return HR_OK;
    case JV_UNDEF: *out = false; return HR_OK; /* an undefined iterates as empty */
    default: return jj_fail(cx, at, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

hr_status jj_binop(jj_ctx *cx, const jj_node *at, int op, jv a, jv b, jv *out) {
    if (op == JOP_CONCAT) {
        jv x, y;
        HR_TRY(jj_to_str(cx, at, a, &x));
        HR_TRY(jj_to_str(cx, at, b, &y));
        return concat_str(cx, at, x, y, out);
    }
    if (op >= JOP_EQ) {
        bool r;
        int c;
        switch (op) {
        case JOP_EQ: r = jv_equal(a, b); break;
        case JOP_NE: r = !jv_equal(a, b); break;
        case JOP_IN: HR_TRY(jj_contains(cx, at, a, b, &r)); break;
        case JOP_NOTIN: HR_TRY(jj_contains(cx, at, a, b, &r)); r = !r; break;
        default:
            HR_TRY(order(cx, at, op, a, b, &c, 0));
            r = op == JOP_LT ? c < 0 : op == JOP_LE ? c <= 0 : op == JOP_GT ? c > 0 : c >= 0;
        }
        *out = jv_bool(r);
        return HR_OK;
    }
    if (a.kind == JV_UNDEF) return undefined_error(cx, at, a);
    if (b.kind == JV_UNDEF) return undefined_error(cx, at, b);
    if (op == JOP_MOD && a.kind == JV_STR) return jj_percent_format(cx, at, a, b, out);
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT && op != JOP_DIV) return int_arith(cx, at, op, as_int(a), as_int(b), out);
        return float_arith(cx, at, op, jv_as_double(a), jv_as_double(b), out);
    }
    if (op == JOP_ADD && a.kind == JV_STR && b.kind == JV_STR) return concat_str(cx, at, a, b, out);
    if (op == JOP_ADD && a.kind == JV_LIST && b.kind == JV_LIST && (a.flag & JV_TUPLE) == (b.flag & JV_TUPLE)) {
        size_t n = a.u.l->n + b.u.l->n;
        jj_list *l = jj_list_new(cx->arena, n);
        if (!l) return jj_oom(cx, at);
        if (a.u.l->n) memcpy(l->v, a.u.l->v, a.u.l->n * sizeof(jv));
        if (b.u.l->n) memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jv));
        *out = make_list(l, a.flag);
        return HR_OK;
    }
    if (op == JOP_MUL && (a.kind == JV_STR || a.kind == JV_LIST) && (b.kind == JV_INT || b.kind == JV_BOOL))
        return repeat(cx, at, a, as_int(b), out);
    if (op == JOP_MUL && (b.kind == JV_STR || b.kind == JV_LIST) && (a.kind == JV_INT || a.kind == JV_BOOL))
        return repeat(cx, at, b, as_int(a), out);
    if (op == JOP_ADD && a.kind == JV_STR)
        return jj_fail(cx, at, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    return jj_fail(cx, at, "unsupported operand type(s) for %s: '%s' and '%s'", op_text(op), jv_type_name(a),
                   jv_type_name(b));
}
