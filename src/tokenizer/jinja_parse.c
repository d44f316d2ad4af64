/* The chat-template parser: tokens to a tree, following jinja2/parser.py's
 * grammar and precedence (so `not x is defined` is `not (x is defined)`,
 * `-x|abs` is `(-x)|abs`, `a ** b ** c` groups to the left, and `for x in
 * xs if c` filters rather than starting a conditional expression). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

typedef struct parser {
    jj_arena *a;
    const jj_source *src;
    const jj_token *t;
    size_t n, i;
    int depth;
} parser;

#define P_MAX_DEPTH 200 /* nesting of expressions and blocks: keeps recursion off the stack limit */

static const jj_token *cur(const parser *p) { return &p->t[p->i]; }
static const jj_token *peek(const parser *p, size_t k) { return &p->t[p->i + k < p->n ? p->i + k : p->n - 1]; }
static void advance(parser *p) { if (p->i + 1 < p->n) p->i++; }

static bool tok_is(const jj_token *t, jt_kind kind, const char *text) {
    if (t->kind != kind) return false;
    if (!text) return true;
    size_t n = strlen(text);
    return t->n == n && !memcmp(t->p, text, n);
}
static bool is_op(const parser *p, const char *op) { return tok_is(cur(p), JT_OP, op); }
static bool is_kw(const parser *p, const char *w) { return tok_is(cur(p), JT_NAME, w); }

static const char *tok_desc(const jj_token *t) {
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_END: return "end of statement block";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    default: return NULL;
    }
}

static hr_status fail_at(parser *p, const char *what) {
    const jj_token *t = cur(p);
    const char *d = tok_desc(t);
    if (d) return jj_error_at(p->src, t->pos, HR_ERR_FORMAT, "%s, got %s", what, d);
    return jj_error_at(p->src, t->pos, HR_ERR_FORMAT, "%s, got '%.*s'", what, (int)(t->n > 40 ? 40 : t->n), t->p);
}

static hr_status expect_op(parser *p, const char *op) {
    if (!is_op(p, op)) {
        char what[32];
        snprintf(what, sizeof what, "expected '%s'", op);
        return fail_at(p, what);
    }
    advance(p);
    return HR_OK;
}

static hr_status oom(void) { return hr_error(HR_ERR_OOM, "chat template: out of memory"); }

static jj_node *node(parser *p, jn_kind kind, uint32_t pos) {
    jj_node *e = jj_alloc(p->a, sizeof *e);
    if (e) {
        e->kind = (uint8_t)kind;
        e->pos = pos;
    }
    return e;
}

static const char *tok_name(parser *p, const jj_token *t) {
    char *s = jj_alloc(p->a, t->n + 1);
    if (s) memcpy(s, t->p, t->n);
    return s;
}

/* Growable node lists, moved into the arena when done. */
typedef struct nlist {
    jj_buf b;
} nlist;
static void nl_push(nlist *l, jj_node *e) { jj_buf_put(&l->b, (const char *)&e, sizeof e); }
static void nl_push_name(nlist *l, const char *s) { jj_buf_put(&l->b, (const char *)&s, sizeof s); }
static hr_status nl_take(parser *p, nlist *l, void *out, size_t *n) {
    *n = l->b.n / sizeof(void *);
    void **arr = NULL;
    if (!l->b.oom && *n) {
        arr = jj_alloc(p->a, l->b.n);
        if (arr) memcpy(arr, l->b.p, l->b.n);
    }
    bool bad = l->b.oom || (*n && !arr);
    jj_buf_free(&l->b);
    memcpy(out, &arr, sizeof arr);
    return bad ? oom() : HR_OK;
}

static hr_status parse_expr(parser *p, bool with_cond, jj_node **out);
static hr_status parse_or(parser *p, jj_node **out);
static hr_status parse_unary(parser *p, bool with_filter, jj_node **out);
static hr_status parse_primary(parser *p, jj_node **out);
static hr_status parse_postfix(parser *p, jj_node *e, jj_node **out);

static bool tuple_end(const parser *p, const char *extra) {
    const jj_token *t = cur(p);
    if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || t->kind == JT_EOF || tok_is(t, JT_OP, ")")) return true;
    return extra && tok_is(t, JT_NAME, extra);
}

/* Comma-separated expressions: one is itself, several (or a trailing comma) a tuple. */
static hr_status parse_tuple(parser *p, bool with_cond, const char *extra_end, bool parens, jj_node **out) {
    uint32_t pos = cur(p)->pos;
    nlist items = {0};
    bool is_tuple = false;
    hr_status st = HR_OK;
    size_t count = 0;
    for (;;) {
        if (count && (st = expect_op(p, ",")) != HR_OK) break;
        if (tuple_end(p, extra_end)) break;
        jj_node *e;
        if ((st = parse_expr(p, with_cond, &e)) != HR_OK) break;
        nl_push(&items, e);
        count++;
        if (is_op(p, ",")) is_tuple = true;
        else break;
    }
    if (st != HR_OK) { jj_buf_free(&items.b); return st; }
    if (!is_tuple && count == 1) {
        *out = *(jj_node **)items.b.p;
        jj_buf_free(&items.b);
        return HR_OK;
    }
    if (!is_tuple && !parens) { jj_buf_free(&items.b); return fail_at(p, "expected an expression"); }
    jj_node *t = node(p, JN_TUPLE, pos);
    if (!t) { jj_buf_free(&items.b); return oom(); }
    HR_TRY(nl_take(p, &items, &t->args, &t->n_args));
    *out = t;
    return HR_OK;
}

/* Call arguments after '(' : positional, then name=value. */
static hr_status parse_call_args(parser *p, jj_node *call) {
    HR_TRY(expect_op(p, "("));
    nlist pos = {0}, kwn = {0}, kwv = {0};
    hr_status st = HR_OK;
    bool first = true;
    while (!is_op(p, ")")) {
        if (!first && (st = expect_op(p, ",")) != HR_OK) break;
        if (is_op(p, ")")) break;
        first = false;
        if (is_op(p, "*") || is_op(p, "**")) { st = fail_at(p, "*args and **kwargs are not supported"); break; }
        jj_node *e;
        if (cur(p)->kind == JT_NAME && tok_is(peek(p, 1), JT_OP, "=")) {
            const char *name = tok_name(p, cur(p));
            if (!name) { st = oom(); break; }
            advance(p);
            advance(p);
            if ((st = parse_expr(p, true, &e)) != HR_OK) break;
            nl_push_name(&kwn, name);
            nl_push(&kwv, e);
        } else {
            if (kwn.b.n) { st = fail_at(p, "positional argument after keyword argument"); break; }
            if ((st = parse_expr(p, true, &e)) != HR_OK) break;
            nl_push(&pos, e);
        }
    }
    if (st == HR_OK) st = expect_op(p, ")");
    size_t nk;
    hr_status s1 = nl_take(p, &pos, &call->args, &call->n_args);
    hr_status s2 = nl_take(p, &kwn, &call->kw_names, &call->n_kw);
    hr_status s3 = nl_take(p, &kwv, &call->kw, &nk);
    if (st != HR_OK) return st;
    return s1 != HR_OK ? s1 : s2 != HR_OK ? s2 : s3;
}

static hr_status parse_filter(parser *p, jj_node *in, jj_node **out) {
    /* at the name after '|' */
    for (;;) {
        if (cur(p)->kind != JT_NAME) return fail_at(p, "expected a filter name");
        jj_node *f = node(p, JN_FILTER, cur(p)->pos);
        if (!f || !(f->name = tok_name(p, cur(p)))) return oom();
        advance(p);
        f->a = in;
        if (is_op(p, "(")) HR_TRY(parse_call_args(p, f));
        in = f;
        if (!is_op(p, "|")) break;
        advance(p);
    }
    *out = in;
    return HR_OK;
}

static hr_status parse_test(parser *p, jj_node *in, jj_node **out) {
    jj_node *t = node(p, JN_TEST, cur(p)->pos);
    if (!t) return oom();
    advance(p); /* is */
    if (is_kw(p, "not")) {
        t->op = 1;
        advance(p);
    }
    if (cur(p)->kind != JT_NAME) return fail_at(p, "expected a test name");
    if (!(t->name = tok_name(p, cur(p)))) return oom();
    t->pos = cur(p)->pos;
    advance(p);
    t->a = in;
    const jj_token *c = cur(p);
    if (is_op(p, "(")) {
        HR_TRY(parse_call_args(p, t));
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                tok_is(c, JT_OP, "[") || tok_is(c, JT_OP, "{")) &&
               !is_kw(p, "else") && !is_kw(p, "or") && !is_kw(p, "and")) {
        if (is_kw(p, "is")) return fail_at(p, "you cannot chain multiple tests with is");
        jj_node *arg;
        HR_TRY(parse_primary(p, &arg));
        HR_TRY(parse_postfix(p, arg, &arg));
        t->args = jj_alloc(p->a, sizeof *t->args);
        if (!t->args) return oom();
        t->args[0] = arg;
        t->n_args = 1;
    }
    *out = t;
    return HR_OK;
}

static hr_status parse_subscript(parser *p, jj_node *obj, jj_node **out) {
    uint32_t pos = cur(p)->pos;
    if (is_op(p, ".")) {
        advance(p);
        if (cur(p)->kind == JT_NAME) {
            jj_node *e = node(p, JN_ATTR, cur(p)->pos);
            if (!e || !(e->name = tok_name(p, cur(p)))) return oom();
            e->a = obj;
            advance(p);
            *out = e;
            return HR_OK;
        }
        if (cur(p)->kind == JT_INT) {
            jj_node *e = node(p, JN_ITEM, pos), *k = node(p, JN_CONST, cur(p)->pos);
            if (!e || !k) return oom();
            k->lit = jv_int(cur(p)->i);
            e->a = obj;
            e->b = k;
            advance(p);
            *out = e;
            return HR_OK;
        }
        return fail_at(p, "expected a name or number after '.'");
    }
    advance(p); /* [ */
    jj_node *parts[3] = {NULL, NULL, NULL};
    int colons = 0;
    while (!is_op(p, "]")) {
        if (is_op(p, ":")) {
            if (++colons > 2) return fail_at(p, "expected ']'");
            advance(p);
            continue;
        }
        if (parts[colons]) return fail_at(p, "expected ']'");
        HR_TRY(parse_expr(p, true, &parts[colons]));
        if (colons == 0 && is_op(p, ",")) return fail_at(p, "tuple subscripts are not supported");
    }
    advance(p);
    jj_node *e = node(p, colons ? JN_SLICE : JN_ITEM, pos);
    if (!e) return oom();
    e->a = obj;
    e->b = parts[0];
    e->c = parts[1];
    e->d = parts[2];
    if (!colons && !parts[0]) return jj_error_at(p->src, pos, HR_ERR_FORMAT, "expected an expression in []");
    *out = e;
    return HR_OK;
}

/* e(...): a call node over the callee e. */
static hr_status parse_call(parser *p, jj_node *e, jj_node **out) {
    jj_node *c = node(p, JN_CALL, cur(p)->pos);
    if (!c) return oom();
    c->a = e;
    HR_TRY(parse_call_args(p, c));
    *out = c;
    return HR_OK;
}

static hr_status parse_postfix(parser *p, jj_node *e, jj_node **out) {
    for (;;) {
        if (is_op(p, ".") || is_op(p, "[")) {
            HR_TRY(parse_subscript(p, e, &e));
        } else if (is_op(p, "(")) {
            HR_TRY(parse_call(p, e, &e));
        } else {
            break;
        }
    }
    *out = e;
    return HR_OK;
}

static hr_status parse_filter_expr(parser *p, jj_node *e, jj_node **out) {
    for (;;) {
        if (is_op(p, "|")) {
            advance(p);
            HR_TRY(parse_filter(p, e, &e));
        } else if (is_kw(p, "is")) {
            HR_TRY(parse_test(p, e, &e));
        } else if (is_op(p, "(")) {
            HR_TRY(parse_call(p, e, &e));
        } else {
            break;
        }
    }
    *out = e;
    return HR_OK;
}

static hr_status parse_list_like(parser *p, bool dict, jj_node **out) {
    jj_node *e = node(p, dict ? JN_DICT : JN_LIST, cur(p)->pos);
    if (!e) return oom();
    advance(p);
    const char *close = dict ? "}" : "]";
    nlist items = {0};
    hr_status st = HR_OK;
    bool first = true;
    while (!is_op(p, close)) {
        if (!first && (st = expect_op(p, ",")) != HR_OK) break;
        if (is_op(p, close)) break;
        first = false;
        jj_node *x;
        if ((st = parse_expr(p, true, &x)) != HR_OK) break;
        nl_push(&items, x);
        if (dict) {
            if ((st = expect_op(p, ":")) != HR_OK) break;
            if ((st = parse_expr(p, true, &x)) != HR_OK) break;
            nl_push(&items, x);
        }
    }
    if (st == HR_OK) st = expect_op(p, close);
    hr_status s2 = nl_take(p, &items, &e->args, &e->n_args);
    if (st != HR_OK) return st;
    *out = e;
    return s2;
}

static hr_status parse_primary(parser *p, jj_node **out) {
    const jj_token *t = cur(p);
    if (++p->depth > P_MAX_DEPTH) return jj_error_at(p->src, t->pos, HR_ERR_FORMAT, "expression nested too deeply");
    hr_status st = HR_OK;
    jj_node *e = NULL;
    if (t->kind == JT_NAME) {
        e = node(p, JN_CONST, t->pos);
        if (!e) return oom();
        if (tok_is(t, JT_NAME, "true") || tok_is(t, JT_NAME, "True")) e->lit = jv_bool(true);
        else if (tok_is(t, JT_NAME, "false") || tok_is(t, JT_NAME, "False")) e->lit = jv_bool(false);
        else if (tok_is(t, JT_NAME, "none") || tok_is(t, JT_NAME, "None")) e->lit = jv_none();
        else {
            e->kind = JN_NAME;
            if (!(e->name = tok_name(p, t))) return oom();
        }
        advance(p);
    } else if (t->kind == JT_STRING) {
        /* Adjacent string literals join, as in Python. */
        jj_buf b = {0};
        uint32_t pos = t->pos;
        while (cur(p)->kind == JT_STRING) {
            jj_buf_put(&b, cur(p)->p, cur(p)->n);
            advance(p);
        }
        bool bad = b.oom;
        e = node(p, JN_CONST, pos);
        if (e) e->lit = jv_str_copy(p->a, b.p ? b.p : "", b.n, &bad);
        jj_buf_free(&b);
        if (!e || bad) return oom();
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        e = node(p, JN_CONST, t->pos);
        if (!e) return oom();
        e->lit = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
        advance(p);
    } else if (tok_is(t, JT_OP, "(")) {
        advance(p);
        st = parse_tuple(p, true, NULL, true, &e);
        if (st == HR_OK) st = expect_op(p, ")");
    } else if (tok_is(t, JT_OP, "[")) {
        st = parse_list_like(p, false, &e);
    } else if (tok_is(t, JT_OP, "{")) {
        st = parse_list_like(p, true, &e);
    } else {
        st = fail_at(p, "unexpected token in expression");
    }
    p->depth--;
    *out = e;
    return st;
}

static hr_status parse_unary(parser *p, bool with_filter, jj_node **out) {
    jj_node *e = NULL;
    if (is_op(p, "-") || is_op(p, "+")) {
        e = node(p, is_op(p, "-") ? JN_NEG : JN_POS, cur(p)->pos);
        if (!e) return oom();
        advance(p);
        if (++p->depth > P_MAX_DEPTH) return fail_at(p, "expression nested too deeply");
        HR_TRY(parse_unary(p, false, &e->a));
        p->depth--;
    } else {
        HR_TRY(parse_primary(p, &e));
    }
    HR_TRY(parse_postfix(p, e, &e));
    if (with_filter) HR_TRY(parse_filter_expr(p, e, &e));
    *out = e;
    return HR_OK;
}

static hr_status binop(parser *p, int op, uint32_t pos, jj_node *a, jj_node *b, jj_node **out) {
    jj_node *e = node(p, JN_BINOP, pos);
    if (!e) return oom();
    e->op = op;
    e->a = a;
    e->b = b;
    *out = e;
    return HR_OK;
}

static hr_status parse_pow(parser *p, jj_node **out) {
    jj_node *e, *r;
    HR_TRY(parse_unary(p, true, &e));
    while (is_op(p, "**")) {
        uint32_t pos = cur(p)->pos;
        advance(p);
        HR_TRY(parse_unary(p, true, &r));
        HR_TRY(binop(p, JOP_POW, pos, e, r, &e));
    }
    *out = e;
    return HR_OK;
}

static hr_status parse_math2(parser *p, jj_node **out) {
    jj_node *e, *r;
    HR_TRY(parse_pow(p, &e));
    for (;;) {
        int op = is_op(p, "*") ? JOP_MUL : is_op(p, "/") ? JOP_DIV : is_op(p, "//") ? JOP_FLOORDIV
               : is_op(p, "%") ? JOP_MOD : -1;
        if (op < 0) break;
        uint32_t pos = cur(p)->pos;
        advance(p);
        HR_TRY(parse_pow(p, &r));
        HR_TRY(binop(p, op, pos, e, r, &e));
    }
    *out = e;
    return HR_OK;
}

static hr_status parse_concat(parser *p, jj_node **out) {
    jj_node *e, *r;
    HR_TRY(parse_math2(p, &e));
    while (is_op(p, "~")) {
        uint32_t pos = cur(p)->pos;
        advance(p);
        HR_TRY(parse_math2(p, &r));
        HR_TRY(binop(p, JOP_CONCAT, pos, e, r, &e));
    }
    *out = e;
    return HR_OK;
}

static hr_status parse_math1(parser *p, jj_node **out) {
    jj_node *e, *r;
    HR_TRY(parse_concat(p, &e));
    for (;;) {
        int op = is_op(p, "+") ? JOP_ADD : is_op(p, "-") ? JOP_SUB : -1;
        if (op < 0) break;
        uint32_t pos = cur(p)->pos;
        advance(p);
        HR_TRY(parse_concat(p, &r));
        HR_TRY(binop(p, op, pos, e, r, &e));
    }
    *out = e;
    return HR_OK;
}

static hr_status parse_compare(parser *p, jj_node **out) {
    jj_node *e = NULL;
    uint32_t pos = cur(p)->pos;
    HR_TRY(parse_math1(p, &e));
    nlist operands = {0};
    jj_buf ops = {0};
    hr_status st = HR_OK;
    for (;;) {
        int op = is_op(p, "==") ? JOP_EQ : is_op(p, "!=") ? JOP_NE : is_op(p, "<") ? JOP_LT : is_op(p, "<=") ? JOP_LE
               : is_op(p, ">") ? JOP_GT : is_op(p, ">=") ? JOP_GE : is_kw(p, "in") ? JOP_IN : -1;
        if (op < 0 && is_kw(p, "not") && tok_is(peek(p, 1), JT_NAME, "in")) {
            op = JOP_NOTIN;
            advance(p);
        }
        if (op < 0) break;
        advance(p);
        if (!operands.b.n) nl_push(&operands, e);
        jj_node *r;
        if ((st = parse_math1(p, &r)) != HR_OK) break;
        nl_push(&operands, r);
        jj_buf_put(&ops, (const char *)&op, sizeof op);
    }
    if (st != HR_OK || !operands.b.n) {
        jj_buf_free(&operands.b);
        jj_buf_free(&ops);
        *out = e;
        return st;
    }
    jj_node *c = node(p, JN_COMPARE, pos);
    if (c && !ops.oom) {
        c->ops = jj_alloc(p->a, ops.n);
        if (c->ops) memcpy(c->ops, ops.p, ops.n);
    }
    bool bad = !c || !c->ops || ops.oom;
    jj_buf_free(&ops);
    if (bad) { jj_buf_free(&operands.b); return oom(); }
    HR_TRY(nl_take(p, &operands, &c->args, &c->n_args));
    *out = c;
    return HR_OK;
}

static hr_status parse_not(parser *p, jj_node **out) {
    if (is_kw(p, "not")) {
        jj_node *e = node(p, JN_NOT, cur(p)->pos);
        if (!e) return oom();
        advance(p);
        if (++p->depth > P_MAX_DEPTH) return fail_at(p, "expression nested too deeply");
        HR_TRY(parse_not(p, &e->a));
        p->depth--;
        *out = e;
        return HR_OK;
    }
    return parse_compare(p, out);
}

static hr_status parse_and(parser *p, jj_node **out) {
    jj_node *e = NULL;
    HR_TRY(parse_not(p, &e));
    while (is_kw(p, "and")) {
        jj_node *x = node(p, JN_AND, cur(p)->pos);
        if (!x) return oom();
        advance(p);
        x->a = e;
        HR_TRY(parse_not(p, &x->b));
        e = x;
    }
    *out = e;
    return HR_OK;
}

static hr_status parse_or(parser *p, jj_node **out) {
    jj_node *e = NULL;
    HR_TRY(parse_and(p, &e));
    while (is_kw(p, "or")) {
        jj_node *x = node(p, JN_OR, cur(p)->pos);
        if (!x) return oom();
        advance(p);
        x->a = e;
        HR_TRY(parse_and(p, &x->b));
        e = x;
    }
    *out = e;
    return HR_OK;
}

static hr_status parse_expr(parser *p, bool with_cond, jj_node **out) {
    if (++p->depth > P_MAX_DEPTH) return fail_at(p, "expression nested too deeply");
    jj_node *e = NULL;
    HR_TRY(parse_or(p, &e));
    while (with_cond && is_kw(p, "if")) {
        jj_node *c = node(p, JN_COND, cur(p)->pos);
        if (!c) return oom();
        advance(p);
        c->a = e;
        HR_TRY(parse_or(p, &c->b));
        if (is_kw(p, "else")) {
            advance(p);
            HR_TRY(parse_expr(p, true, &c->c));
        }
        e = c;
    }
    p->depth--;
    *out = e;
    return HR_OK;
}

/* ---- statements ---- */
static hr_status parse_body(parser *p, const char *const *ends, jj_node **out);

static hr_status expect_block_end(parser *p) {
    if (cur(p)->kind != JT_BLOCK_END) return fail_at(p, "expected end of statement block");
    advance(p);
    return HR_OK;
}

/* Names of an assignment target: `x`, `a, b` or `(a, b)`. */
static hr_status parse_targets(parser *p, jj_node *st) {
    nlist names = {0};
    bool paren = is_op(p, "(");
    if (paren) advance(p);
    hr_status s = HR_OK;
    for (;;) {
        if (cur(p)->kind != JT_NAME) { s = fail_at(p, "expected a name to assign to"); break; }
        const char *n = tok_name(p, cur(p));
        if (!n) { s = oom(); break; }
        nl_push_name(&names, n);
        advance(p);
        if (!is_op(p, ",")) break;
        advance(p);
        if (paren && is_op(p, ")")) break;
    }
    if (s == HR_OK && paren) s = expect_op(p, ")");
    hr_status s2 = nl_take(p, &names, &st->kw_names, &st->n_kw);
    return s != HR_OK ? s : s2;
}

static hr_status parse_if(parser *p, uint32_t pos, jj_node **out) {
    jj_node *e = node(p, JN_IF, pos);
    if (!e) return oom();
    HR_TRY(parse_tuple(p, true, NULL, false, &e->a));
    HR_TRY(expect_block_end(p));
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    HR_TRY(parse_body(p, ends, &e->b));
    if (is_kw(p, "elif")) {
        uint32_t epos = cur(p)->pos;
        advance(p);
        HR_TRY(parse_if(p, epos, &e->c));
        *out = e;
        return HR_OK;
    }
    if (is_kw(p, "else")) {
        advance(p);
        HR_TRY(expect_block_end(p));
        static const char *const ends2[] = {"endif", NULL};
        HR_TRY(parse_body(p, ends2, &e->c));
    }
    advance(p); /* endif */
    HR_TRY(expect_block_end(p));
    *out = e;
    return HR_OK;
}

static hr_status parse_for(parser *p, uint32_t pos, jj_node **out) {
    jj_node *e = node(p, JN_FOR, pos);
    if (!e) return oom();
    HR_TRY(parse_targets(p, e));
    if (!is_kw(p, "in")) return fail_at(p, "expected 'in'");
    advance(p);
    HR_TRY(parse_tuple(p, false, "recursive", false, &e->a));
    if (is_kw(p, "if")) {
        advance(p);
        HR_TRY(parse_expr(p, true, &e->d));
    }
    if (is_kw(p, "recursive")) return fail_at(p, "recursive loops are not supported");
    HR_TRY(expect_block_end(p));
    static const char *const ends[] = {"endfor", "else", NULL};
    HR_TRY(parse_body(p, ends, &e->b));
    if (is_kw(p, "else")) {
        advance(p);
        HR_TRY(expect_block_end(p));
        static const char *const ends2[] = {"endfor", NULL};
        HR_TRY(parse_body(p, ends2, &e->c));
    }
    advance(p);
    HR_TRY(expect_block_end(p));
    *out = e;
    return HR_OK;
}

static hr_status parse_set(parser *p, uint32_t pos, jj_node **out) {
    jj_node *e = node(p, JN_SET, pos);
    if (!e) return oom();
    if (cur(p)->kind == JT_NAME && tok_is(peek(p, 1), JT_OP, ".")) {
        /* namespace attribute: set ns.attr = value */
        jj_node *obj = node(p, JN_NAME, cur(p)->pos);
        if (!obj || !(obj->name = tok_name(p, cur(p)))) return oom();
        advance(p);
        advance(p);
        if (cur(p)->kind != JT_NAME) return fail_at(p, "expected an attribute name");
        if (!(e->name = tok_name(p, cur(p)))) return oom();
        advance(p);
        e->d = obj;
    } else {
        HR_TRY(parse_targets(p, e));
    }
    if (is_op(p, "=")) {
        advance(p);
        HR_TRY(parse_tuple(p, true, NULL, false, &e->a));
        HR_TRY(expect_block_end(p));
        *out = e;
        return HR_OK;
    }
    if (e->d || e->n_kw != 1) return fail_at(p, "expected '='");
    e->kind = JN_SET_BLOCK;
    if (is_op(p, "|")) {
        advance(p);
        HR_TRY(parse_filter(p, NULL, &e->c));
    }
    HR_TRY(expect_block_end(p));
    static const char *const ends[] = {"endset", NULL};
    HR_TRY(parse_body(p, ends, &e->b));
    advance(p);
    HR_TRY(expect_block_end(p));
    *out = e;
    return HR_OK;
}

static hr_status parse_macro(parser *p, uint32_t pos, jj_node **out) {
    jj_node *e = node(p, JN_MACRO, pos);
    if (!e) return oom();
    if (cur(p)->kind != JT_NAME) return fail_at(p, "expected a macro name");
    if (!(e->name = tok_name(p, cur(p)))) return oom();
    advance(p);
    HR_TRY(expect_op(p, "("));
    nlist names = {0}, defs = {0};
    hr_status st = HR_OK;
    while (!is_op(p, ")")) {
        if (names.b.n && (st = expect_op(p, ",")) != HR_OK) break;
        if (is_op(p, ")")) break;
        if (cur(p)->kind != JT_NAME) { st = fail_at(p, "expected a parameter name"); break; }
        const char *n = tok_name(p, cur(p));
        if (!n) { st = oom(); break; }
        advance(p);
        jj_node *def = NULL;
        if (is_op(p, "=")) {
            advance(p);
            if ((st = parse_expr(p, true, &def)) != HR_OK) break;
        } else if (defs.b.n) {
            /* Jinja: a parameter without a default after one with: the same rule as Python. */
            bool any = false;
            for (size_t k = 0; k < defs.b.n / sizeof(jj_node *); k++) any |= ((jj_node **)defs.b.p)[k] != NULL;
            if (any) { st = fail_at(p, "non-default argument follows default argument"); break; }
        }
        nl_push_name(&names, n);
        nl_push(&defs, def);
    }
    if (st == HR_OK) st = expect_op(p, ")");
    size_t nd;
    hr_status s1 = nl_take(p, &names, &e->kw_names, &e->n_kw);
    hr_status s2 = nl_take(p, &defs, &e->kw, &nd);
    if (st != HR_OK) return st;
    if (s1 != HR_OK || s2 != HR_OK) return oom();
    HR_TRY(expect_block_end(p));
    static const char *const ends[] = {"endmacro", NULL};
    HR_TRY(parse_body(p, ends, &e->b));
    advance(p);
    if (cur(p)->kind == JT_NAME) advance(p); /* {% endmacro name %} */
    HR_TRY(expect_block_end(p));
    *out = e;
    return HR_OK;
}

/* One `{% ... %}` statement; the parser is past the tag's name. */
static hr_status parse_statement(parser *p, const jj_token *kw, jj_node **out) {
    uint32_t pos = kw->pos;
    if (tok_is(kw, JT_NAME, "if")) return parse_if(p, pos, out);
    if (tok_is(kw, JT_NAME, "for")) return parse_for(p, pos, out);
    if (tok_is(kw, JT_NAME, "set")) return parse_set(p, pos, out);
    if (tok_is(kw, JT_NAME, "macro")) return parse_macro(p, pos, out);
    if (tok_is(kw, JT_NAME, "break") || tok_is(kw, JT_NAME, "continue")) {
        jj_node *e = node(p, tok_is(kw, JT_NAME, "break") ? JN_BREAK : JN_CONTINUE, pos);
        if (!e) return oom();
        HR_TRY(expect_block_end(p));
        *out = e;
        return HR_OK;
    }
    if (tok_is(kw, JT_NAME, "generation")) {
        /* transformers' assistant-mask marker: its body renders as is. */
        HR_TRY(expect_block_end(p));
        static const char *const ends[] = {"endgeneration", NULL};
        HR_TRY(parse_body(p, ends, out));
        advance(p);
        return expect_block_end(p);
    }
    if (tok_is(kw, JT_NAME, "filter")) {
        jj_node *e = node(p, JN_FILTER_BLOCK, pos);
        if (!e) return oom();
        HR_TRY(parse_filter(p, NULL, &e->c));
        HR_TRY(expect_block_end(p));
        static const char *const ends[] = {"endfilter", NULL};
        HR_TRY(parse_body(p, ends, &e->b));
        advance(p);
        HR_TRY(expect_block_end(p));
        *out = e;
        return HR_OK;
    }
    return jj_error_at(p->src, pos, HR_ERR_FORMAT, "unknown tag '%.*s'", (int)(kw->n > 40 ? 40 : kw->n), kw->p);
}

/* Statements until a `{% name %}` with a name in `ends` (NULL-terminated;
 * NULL: until the end of the template). Stops on that name's token. */
static hr_status parse_body(parser *p, const char *const *ends, jj_node **out) {
    uint32_t start = cur(p)->pos;
    if (++p->depth > P_MAX_DEPTH) return fail_at(p, "blocks nested too deeply");
    jj_node *body = node(p, JN_BODY, start);
    if (!body) return oom();
    nlist items = {0};
    hr_status st = HR_OK;
    for (;;) {
        const jj_token *t = cur(p);
        if (t->kind == JT_EOF) {
            if (ends) {
                st = jj_error_at(p->src, start, HR_ERR_FORMAT,
                                 "unexpected end of template: block never closed (looking for '%s')", ends[0]);
                /* Name where the block opened: the tag just before the body. */
            }
            break;
        }
        jj_node *e = NULL;
        if (t->kind == JT_TEXT) {
            e = node(p, JN_TEXT, t->pos);
            if (e) e->lit = jv_strn(t->p, t->n);
            advance(p);
        } else if (t->kind == JT_VAR_BEGIN) {
            advance(p);
            e = node(p, JN_OUTPUT, t->pos);
            if (!e) { st = oom(); break; }
            if ((st = parse_tuple(p, true, NULL, false, &e->a)) != HR_OK) break;
            if (cur(p)->kind != JT_VAR_END) { st = fail_at(p, "expected end of print statement"); break; }
            advance(p);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            advance(p);
            const jj_token *kw = cur(p);
            if (kw->kind != JT_NAME) { st = fail_at(p, "expected a tag name"); break; }
            bool is_end = false;
            for (size_t k = 0; ends && ends[k]; k++)
                if (tok_is(kw, JT_NAME, ends[k])) is_end = true;
            if (is_end) break;
            advance(p);
            if ((st = parse_statement(p, kw, &e)) != HR_OK) break;
        } else {
            st = fail_at(p, "unexpected token");
            break;
        }
        if (!e) { st = oom(); break; }
        nl_push(&items, e);
    }
    hr_status s2 = nl_take(p, &items, &body->args, &body->n_args);
    p->depth--;
    if (st != HR_OK) return st;
    *out = body;
    return s2;
}

hr_status jj_parse(jj_arena *a, const jj_source *src, const jj_token *toks, size_t n_toks, jj_node **root) {
    parser p = {.a = a, .src = src, .t = toks, .n = n_toks};
    HR_TRY(parse_body(&p, NULL, root));
    if (cur(&p)->kind != JT_EOF) return fail_at(&p, "unexpected tag");
    return HR_OK;
}
