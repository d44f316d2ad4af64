/* The chat-template evaluator: statements and expressions over the tree.
 *
 * Scoping follows Jinja2's compiled code: a for loop's body gets a fresh
 * scope each iteration (a `set` inside never reaches the next iteration or
 * the outside, hence namespace()), a macro call gets a scope whose parent
 * is where the macro was defined, and `if` opens none. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

#define JJ_MAX_ARGS 16

struct jj_scope {
    jj_scope *parent;
    jj_dict *vars;
    bool captured; /* a macro defined here keeps it: it cannot be reused */
};

struct jj_macro {
    const jj_node *def;
    jj_scope *closure;
};

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

hr_status jj_fail(jj_ctx *cx, const jj_node *at, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jj_error_at(cx->src, at ? at->pos : 0, HR_ERR_FORMAT, "%s", msg);
}

hr_status jj_oom(jj_ctx *cx, const jj_node *at) {
    return jj_error_at(cx->src, at ? at->pos : 0, HR_ERR_OOM,
                       "out of memory (a render may use at most %zu MiB)", JJ_MAX_ARENA >> 20);
}

static jj_scope *scope_new(jj_ctx *cx, jj_scope *parent) {
    jj_scope *s = jj_alloc(cx->arena, sizeof *s);
    if (!s) return NULL;
    s->parent = parent;
    s->vars = jj_dict_new(cx->arena, 4);
    return s->vars ? s : NULL;
}

static hr_status scope_set(jj_ctx *cx, const jj_node *at, const char *name, jv v) {
    if (!jj_dict_set(cx->arena, cx->scope->vars, jv_strn(name, strlen(name)), v)) return jj_oom(cx, at);
    return HR_OK;
}

static const struct { const char *name; int fn; } GLOBAL_FUNCS[] = {
    {"range", JF_RANGE}, {"namespace", JF_NAMESPACE}, {"dict", JF_DICT},
    {"raise_exception", JF_RAISE}, {"strftime_now", JF_STRFTIME},
};

static jv lookup(jj_ctx *cx, const char *name) {
    jv key = jv_strn(name, strlen(name));
    for (jj_scope *s = cx->scope; s; s = s->parent) {
        const jv *v = jj_dict_get(s->vars, key);
        if (v) return *v;
    }
    for (size_t k = 0; k < sizeof GLOBAL_FUNCS / sizeof GLOBAL_FUNCS[0]; k++)
        if (!strcmp(GLOBAL_FUNCS[k].name, name)) {
            jv f = {.kind = JV_FUNC};
            f.u.fn = GLOBAL_FUNCS[k].fn;
            return f;
        }
    return jv_undef(name);
}

static hr_status emit(jj_ctx *cx, const jj_node *at, const char *p, size_t n) {
    jj_buf_put(cx->out, p, n);
    if (cx->out->oom)
        return jj_fail(cx, at, "output over %zu MiB, out of memory, or a value nested too deeply to print",
                       JJ_MAX_OUTPUT >> 20);
    return HR_OK;
}

static hr_status exec(jj_ctx *cx, const jj_node *s, int *flow);

static hr_status exec_body(jj_ctx *cx, const jj_node *body, int *flow) {
    for (size_t i = 0; i < body->n_args; i++) {
        HR_TRY(exec(cx, body->args[i], flow));
        if (*flow != FLOW_NEXT) return HR_OK;
    }
    return HR_OK;
}

/* Renders `body` into a string instead of the output (macros, set blocks, filter blocks). */
static hr_status capture(jj_ctx *cx, const jj_node *body, jv *out) {
    if (++cx->depth > JJ_MAX_DEPTH) return jj_fail(cx, body, "nested deeper than %d calls or blocks", JJ_MAX_DEPTH);
    jj_buf b = {0}, *saved = cx->out;
    cx->out = &b;
    int flow = FLOW_NEXT;
    hr_status st = exec_body(cx, body, &flow);
    cx->out = saved;
    cx->depth--;
    if (st == HR_OK) {
        bool oom = b.oom;
        *out = jv_str_copy(cx->arena, b.p ? b.p : "", b.n, &oom);
        if (oom) st = jj_oom(cx, body);
    }
    jj_buf_free(&b);
    return st;
}

/* ---- calls ---- */
typedef struct argv_ {
    jv pos[JJ_MAX_ARGS], kw[JJ_MAX_ARGS];
    const char *kw_names[JJ_MAX_ARGS];
    jj_args a;
} argv_;

static hr_status eval_args(jj_ctx *cx, const jj_node *call, const jv *first, argv_ *av) {
    size_t np = call->n_args + (first != NULL);
    if (np > JJ_MAX_ARGS || call->n_kw > JJ_MAX_ARGS) return jj_fail(cx, call, "too many arguments");
    size_t k = 0;
    if (first) av->pos[k++] = *first;
    for (size_t i = 0; i < call->n_args; i++) HR_TRY(jj_eval(cx, call->args[i], &av->pos[k++]));
    for (size_t i = 0; i < call->n_kw; i++) {
        av->kw_names[i] = call->kw_names[i];
        HR_TRY(jj_eval(cx, call->kw[i], &av->kw[i]));
    }
    av->a = (jj_args){.pos = av->pos, .n_pos = np, .kw_names = av->kw_names, .kw = av->kw, .n_kw = call->n_kw};
    return HR_OK;
}

static hr_status call_macro(jj_ctx *cx, const jj_node *at, const jj_macro *m, const jj_args *args, jv *out) {
    const jj_node *def = m->def;
    jj_scope *sc = scope_new(cx, m->closure);
    if (!sc) return jj_oom(cx, at);
    jj_scope *saved = cx->scope;
    cx->scope = sc;
    hr_status st = HR_OK;
    jj_list *extra = jj_list_new(cx->arena, args->n_pos > def->n_kw ? args->n_pos - def->n_kw : 0);
    jj_dict *kwargs = jj_dict_new(cx->arena, 4);
    if (!extra || !kwargs) st = jj_oom(cx, at);
    for (size_t i = 0; st == HR_OK && i < args->n_kw; i++) {
        size_t p;
        for (p = 0; p < def->n_kw; p++)
            if (!strcmp(def->kw_names[p], args->kw_names[i])) break;
        if (p < def->n_kw && p < args->n_pos)
            st = jj_fail(cx, at, "macro '%s' got multiple values for argument '%s'", def->name, args->kw_names[i]);
        else if (p == def->n_kw &&
                 !jj_dict_set(cx->arena, kwargs, jv_strn(args->kw_names[i], strlen(args->kw_names[i])), args->kw[i]))
            st = jj_oom(cx, at);
    }
    /* Parameters in order: defaults see the parameters before them. */
    for (size_t p = 0; st == HR_OK && p < def->n_kw; p++) {
        jv v = jv_undef(def->kw_names[p]);
        bool set = false;
        if (p < args->n_pos) {
            v = args->pos[p];
            set = true;
        }
        for (size_t i = 0; !set && i < args->n_kw; i++)
            if (!strcmp(def->kw_names[p], args->kw_names[i])) {
                v = args->kw[i];
                set = true;
            }
        if (!set && def->kw[p]) st = jj_eval(cx, def->kw[p], &v);
        if (st == HR_OK) st = scope_set(cx, at, def->kw_names[p], v);
    }
    for (size_t i = def->n_kw; st == HR_OK && i < args->n_pos; i++) extra->v[i - def->n_kw] = args->pos[i];
    if (st == HR_OK) {
        jv va = {.kind = JV_LIST, .flag = JV_TUPLE}, kw = {.kind = JV_DICT};
        va.u.l = extra;
        kw.u.d = kwargs;
        st = scope_set(cx, at, "varargs", va);
        if (st == HR_OK) st = scope_set(cx, at, "kwargs", kw);
    }
    if (st == HR_OK) st = capture(cx, def->b, out);
    cx->scope = saved;
    return st;
}

static hr_status call_value(jj_ctx *cx, const jj_node *at, jv callee, const jj_args *args, jv *out) {
    switch (callee.kind) {
    case JV_MACRO: return call_macro(cx, at, callee.u.m, args, out);
    case JV_FUNC: return jj_call_func(cx, at, callee.u.fn, args, out);
    case JV_METHOD: return jj_call_method(cx, at, callee.u.meth->self, callee.u.meth->name, args, out);
    case JV_UNDEF:
        if (callee.u.undef) return jj_undefined(cx, at, callee);
        return jj_fail(cx, at, "called an undefined value");
    default: return jj_fail(cx, at, "'%s' object is not callable", jv_type_name(callee));
    }
}

static hr_status eval_call(jj_ctx *cx, const jj_node *e, jv *out) {
    argv_ av;
    jv callee;
    if (e->a->kind == JN_ATTR) {
        /* obj.method(...): call the method without making a bound value. */
        jv obj;
        HR_TRY(jj_eval(cx, e->a->a, &obj));
        if (obj.kind != JV_UNDEF && obj.kind != JV_NS && obj.kind != JV_DICT && jj_has_method(obj, e->a->name)) {
            HR_TRY(eval_args(cx, e, NULL, &av));
            return jj_call_method(cx, e, obj, e->a->name, &av.a, out);
        }
        HR_TRY(jj_getattr(cx, e->a, obj, e->a->name, &callee));
    } else {
        HR_TRY(jj_eval(cx, e->a, &callee));
    }
    HR_TRY(eval_args(cx, e, NULL, &av));
    return call_value(cx, e, callee, &av.a, out);
}

static hr_status apply_filters(jj_ctx *cx, const jj_node *f, jv in, jv *out) {
    /* The innermost operand is an expression, or NULL in set and filter
     * blocks, where the block's text `in` takes its place. */
    if (!f) {
        *out = in;
        return HR_OK;
    }
    if (f->kind != JN_FILTER) return jj_eval(cx, f, out);
    jv x;
    HR_TRY(apply_filters(cx, f->a, in, &x));
    argv_ av;
    HR_TRY(eval_args(cx, f, NULL, &av));
    return jj_filter(cx, f, f->name, x, &av.a, out);
}

static hr_status make_list(jj_ctx *cx, const jj_node *e, uint8_t flag, jv *out) {
    jj_list *l = jj_list_new(cx->arena, e->n_args);
    if (!l) return jj_oom(cx, e);
    for (size_t i = 0; i < e->n_args; i++) HR_TRY(jj_eval(cx, e->args[i], &l->v[i]));
    out->kind = JV_LIST;
    out->flag = flag;
    out->u.l = l;
    return HR_OK;
}

hr_status jj_eval(jj_ctx *cx, const jj_node *e, jv *out) {
    jv a, b;
    switch (e->kind) {
    case JN_CONST: *out = e->lit; return HR_OK;
    case JN_NAME: *out = lookup(cx, e->name); return HR_OK;
    case JN_LIST: return make_list(cx, e, 0, out);
    case JN_TUPLE: return make_list(cx, e, JV_TUPLE, out);
    case JN_DICT: {
        jj_dict *d = jj_dict_new(cx->arena, e->n_args / 2);
        if (!d) return jj_oom(cx, e);
        for (size_t i = 0; i + 1 < e->n_args; i += 2) {
            HR_TRY(jj_eval(cx, e->args[i], &a));
            HR_TRY(jj_eval(cx, e->args[i + 1], &b));
            if (a.kind == JV_LIST && !(a.flag & JV_TUPLE)) return jj_fail(cx, e->args[i], "unhashable type: 'list'");
            if (a.kind == JV_DICT || a.kind == JV_NS) return jj_fail(cx, e->args[i], "unhashable type: 'dict'");
            if (!jj_dict_set(cx->arena, d, a, b)) return jj_oom(cx, e);
        }
        out->kind = JV_DICT;
        out->flag = 0;
        out->u.d = d;
        return HR_OK;
    }
    case JN_ATTR:
        HR_TRY(jj_eval(cx, e->a, &a));
        return jj_getattr(cx, e, a, e->name, out);
    case JN_ITEM:
        HR_TRY(jj_eval(cx, e->a, &a));
        HR_TRY(jj_eval(cx, e->b, &b));
        return jj_getitem(cx, e, a, b, out);
    case JN_SLICE: {
        jv lo, hi, step;
        HR_TRY(jj_eval(cx, e->a, &a));
        if (e->b) HR_TRY(jj_eval(cx, e->b, &lo));
        if (e->c) HR_TRY(jj_eval(cx, e->c, &hi));
        if (e->d) HR_TRY(jj_eval(cx, e->d, &step));
        return jj_slice(cx, e, a, e->b ? &lo : NULL, e->c ? &hi : NULL, e->d ? &step : NULL, out);
    }
    case JN_CALL: return eval_call(cx, e, out);
    case JN_FILTER: return apply_filters(cx, e, jv_undef(NULL), out);
    case JN_TEST: {
        argv_ av;
        bool r;
        HR_TRY(jj_eval(cx, e->a, &a));
        HR_TRY(eval_args(cx, e, NULL, &av));
        HR_TRY(jj_test(cx, e, e->name, a, &av.a, &r));
        *out = jv_bool(e->op ? !r : r);
        return HR_OK;
    }
    case JN_NEG:
    case JN_POS:
        HR_TRY(jj_eval(cx, e->a, &a));
        if (!jv_is_number(a)) return jj_fail(cx, e, "bad operand type for unary %c: '%s'", e->kind == JN_NEG ? '-' : '+',
                                             jv_type_name(a));
        if (e->kind == JN_POS) *out = a.kind == JV_BOOL ? jv_int(a.u.b) : a;
        else if (a.kind == JV_FLOAT) *out = jv_float(-a.u.f);
        else if (a.kind == JV_INT && a.u.i == INT64_MIN) return jj_fail(cx, e, "integer overflow");
        else *out = jv_int(a.kind == JV_BOOL ? -(int64_t)a.u.b : -a.u.i);
        return HR_OK;
    case JN_NOT:
        HR_TRY(jj_eval(cx, e->a, &a));
        *out = jv_bool(!jv_truthy(a));
        return HR_OK;
    case JN_AND:
    case JN_OR:
        HR_TRY(jj_eval(cx, e->a, &a));
        if (jv_truthy(a) == (e->kind == JN_OR)) {
            *out = a;
            return HR_OK;
        }
        return jj_eval(cx, e->b, out);
    case JN_BINOP:
        HR_TRY(jj_eval(cx, e->a, &a));
        HR_TRY(jj_eval(cx, e->b, &b));
        return jj_binop(cx, e, e->op, a, b, out);
    case JN_COMPARE:
        /* Python's chain: a < b < c is a < b and b < c, b evaluated once. */
        HR_TRY(jj_eval(cx, e->args[0], &a));
        for (size_t i = 0; i + 1 < e->n_args; i++) {
            jv r;
            HR_TRY(jj_eval(cx, e->args[i + 1], &b));
            HR_TRY(jj_binop(cx, e, e->ops[i], a, b, &r));
            if (!r.u.b) {
                *out = r;
                return HR_OK;
            }
            a = b;
        }
        *out = jv_bool(true);
        return HR_OK;
    case JN_COND:
        HR_TRY(jj_eval(cx, e->b, &a));
        if (jv_truthy(a)) return jj_eval(cx, e->a, out);
        if (e->c) return jj_eval(cx, e->c, out);
        *out = jv_undef("the inline if-expression evaluated to false and no else section was defined");
        return HR_OK;
    default: return jj_fail(cx, e, "not an expression");
    }
}

/* ---- statements ---- */
static hr_status assign(jj_ctx *cx, const jj_node *at, const char *const *names, size_t n, jv v) {
    if (n == 1) return scope_set(cx, at, names[0], v);
    jj_list *items;
    HR_TRY(jj_iterate(cx, at, v, &items));
    if (items->n != n)
        return jj_fail(cx, at, items->n > n ? "too many values to unpack (expected %zu)"
                                            : "not enough values to unpack (expected %zu)", n);
    for (size_t i = 0; i < n; i++) HR_TRY(scope_set(cx, at, names[i], items->v[i]));
    return HR_OK;
}

static hr_status exec_for(jj_ctx *cx, const jj_node *s) {
    jv seq;
    jj_list *items;
    HR_TRY(jj_eval(cx, s->a, &seq));
    HR_TRY(jj_iterate(cx, s->a, seq, &items));
    jj_scope *outer = cx->scope;
    hr_status st = HR_OK;
    if (s->d) {
        /* `for x in xs if cond`: filtered first, so loop.length and loop.last count what is kept. */
        jj_list *kept = jj_list_new(cx->arena, items->n);
        if (!kept) return jj_oom(cx, s);
        kept->n = 0;
        jj_scope *probe = NULL; /* the filter cannot define macros: one scope serves every item */
        for (size_t i = 0; i < items->n && st == HR_OK; i++) {
            if (++cx->iterations > JJ_MAX_ITERATIONS) { st = jj_fail(cx, s, "more than %u loop iterations", JJ_MAX_ITERATIONS); break; }
            jv c;
            if (!probe) probe = scope_new(cx, outer);
            else probe->vars->n = 0;
            cx->scope = probe;
            if (!probe) { st = jj_oom(cx, s); break; }
            st = assign(cx, s, s->kw_names, s->n_kw, items->v[i]);
            if (st == HR_OK) st = jj_eval(cx, s->d, &c);
            if (st == HR_OK && jv_truthy(c)) kept->v[kept->n++] = items->v[i];
        }
        cx->scope = outer;
        HR_TRY(st);
        items = kept;
    }
    jj_loop *loop = jj_alloc(cx->arena, sizeof *loop);
    if (!loop) return jj_oom(cx, s);
    loop->length = (int64_t)items->n;
    loop->items = items;
    jv lv = {.kind = JV_LOOP};
    lv.u.loop = loop;
    jj_scope *body = NULL;
    for (size_t i = 0; i < items->n; i++) {
        if (++cx->iterations > JJ_MAX_ITERATIONS) { st = jj_fail(cx, s, "more than %u loop iterations", JJ_MAX_ITERATIONS); break; }
        loop->index0 = (int64_t)i;
        /* Each iteration starts from an empty scope; the last one's is
         * emptied and reused unless a macro closed over it. */
        if (body && !body->captured) body->vars->n = 0;
        else body = scope_new(cx, outer);
        cx->scope = body;
        if (!body) { st = jj_oom(cx, s); break; }
        st = scope_set(cx, s, "loop", lv);
        if (st == HR_OK) st = assign(cx, s, s->kw_names, s->n_kw, items->v[i]);
        int flow = FLOW_NEXT;
        if (st == HR_OK) st = exec_body(cx, s->b, &flow);
        if (st != HR_OK || flow == FLOW_BREAK) break;
    }
    cx->scope = outer;
    HR_TRY(st);
    if (items->n == 0 && s->c) {
        int flow = FLOW_NEXT;
        return exec_body(cx, s->c, &flow);
    }
    return HR_OK;
}

static hr_status exec_set(jj_ctx *cx, const jj_node *s) {
    jv v;
    HR_TRY(jj_eval(cx, s->a, &v));
    if (!s->d) return assign(cx, s, s->kw_names, s->n_kw, v);
    jv ns;
    HR_TRY(jj_eval(cx, s->d, &ns));
    if (ns.kind != JV_NS) return jj_fail(cx, s, "cannot assign attribute on non-namespace object");
    if (s->name[0] == '_')
        return jj_fail(cx, s, "chat templates cannot store underscore-prefixed attributes on a namespace ('%s')",
                       s->name);
    if (!jj_dict_set(cx->arena, ns.u.d, jv_strn(s->name, strlen(s->name)), v)) return jj_oom(cx, s);
    return HR_OK;
}

static hr_status exec(jj_ctx *cx, const jj_node *s, int *flow) {
    jv v;
    switch (s->kind) {
    case JN_TEXT: return emit(cx, s, s->lit.u.s.p, s->lit.u.s.n);
    case JN_OUTPUT: {
        HR_TRY(jj_eval(cx, s->a, &v));
        if (v.kind == JV_STR) return emit(cx, s, v.u.s.p, v.u.s.n);
        jv_str(cx->out, v); /* a value nested too deeply marks the buffer cut: emit reports it */
        return emit(cx, s, "", 0);
    }
    case JN_BODY: return exec_body(cx, s, flow);
    case JN_IF:
        HR_TRY(jj_eval(cx, s->a, &v));
        if (jv_truthy(v)) return exec_body(cx, s->b, flow);
        if (!s->c) return HR_OK;
        return s->c->kind == JN_IF ? exec(cx, s->c, flow) : exec_body(cx, s->c, flow);
    case JN_FOR: return exec_for(cx, s);
    case JN_SET: return exec_set(cx, s);
    case JN_SET_BLOCK:
        HR_TRY(capture(cx, s->b, &v));
        HR_TRY(apply_filters(cx, s->c, v, &v));
        return scope_set(cx, s, s->kw_names[0], v);
    case JN_FILTER_BLOCK: {
        jv r;
        HR_TRY(capture(cx, s->b, &v));
        HR_TRY(apply_filters(cx, s->c, v, &r));
        HR_TRY(jj_to_str(cx, s, r, &r));
        return emit(cx, s, r.u.s.p, r.u.s.n);
    }
    case JN_MACRO: {
        jj_macro *m = jj_alloc(cx->arena, sizeof *m);
        if (!m) return jj_oom(cx, s);
        m->def = s;
        m->closure = cx->scope;
        cx->scope->captured = true;
        v.kind = JV_MACRO;
        v.flag = 0;
        v.u.m = m;
        return scope_set(cx, s, s->name, v);
    }
    case JN_BREAK: *flow = FLOW_BREAK; return HR_OK;
    case JN_CONTINUE: *flow = FLOW_CONTINUE; return HR_OK;
    default: return jj_fail(cx, s, "not a statement");
    }
}

hr_status jj_render(jj_ctx *cx, const jj_node *root) {
    int flow = FLOW_NEXT;
    cx->scope = cx->globals;
    return exec_body(cx, root, &flow);
}

hr_status jj_scope_root(jj_ctx *cx, jj_dict *vars) {
    cx->globals = jj_alloc(cx->arena, sizeof *cx->globals);
    if (!cx->globals) return jj_oom(cx, NULL);
    cx->globals->vars = vars;
    return HR_OK;
}
