/* The chat-template engine: the subset of Jinja2 that Hugging Face chat
 * templates use, with the semantics transformers gives it
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
 * raise_exception, strftime_now, a json.dumps tojson).
 *
 * Every value of one render lives in one arena that is freed at the end:
 * the sandbox makes lists and dicts immutable (only namespaces change), so
 * values can be shared freely and need no reference counts. The arena, the
 * loop iterations, the recursion depth and the output are all bounded, so
 * a hostile template fails with a message instead of exhausting the host. */
#ifndef HR_TOKENIZER_JINJA_H
#define HR_TOKENIZER_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hubrt/base.h"

#define JJ_MAX_ITERATIONS 1000000u    /* loop iterations in one render, all loops together */
#define JJ_MAX_DEPTH 64               /* nested macro calls and nested expressions/blocks */
#define JJ_MAX_OUTPUT ((size_t)16 << 20)
#define JJ_MAX_ARENA ((size_t)192 << 20) /* every value, node and token of one render */

/* ---- arena ---- */
typedef struct jj_chunk jj_chunk;
typedef struct jj_arena {
    jj_chunk *head;
    size_t total; /* bytes taken from malloc so far */
} jj_arena;

void *jj_alloc(jj_arena *a, size_t n); /* zeroed; NULL when the cap is reached */
void jj_arena_free(jj_arena *a);

/* ---- values ---- */
typedef enum jv_kind {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR,
    JV_LIST,   /* also tuples (flag JV_TUPLE): they print with () */
    JV_DICT, JV_NS, JV_MACRO, JV_FUNC, JV_METHOD, JV_LOOP,
} jv_kind;

#define JV_TUPLE 1

typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jj_macro jj_macro;
typedef struct jj_method jj_method;
typedef struct jj_loop jj_loop;

typedef struct jv {
    uint8_t kind;
    uint8_t flag;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        jj_list *l;
        jj_dict *d; /* JV_DICT and JV_NS (a namespace is a dict that may change) */
        jj_macro *m;
        jj_method *meth;
        jj_loop *loop;
        int fn;            /* JV_FUNC: a global function, enum jj_func */
        const char *undef; /* JV_UNDEF: the name it stands for (for messages), or NULL */
    } u;
} jv;

struct jj_list {
    size_t n;
    jv *v;
};
struct jj_dict {
    size_t n, cap;
    jv *k, *v; /* insertion order, as Python's dict */
};
struct jj_loop { /* the `loop` variable of one for loop, updated each iteration */
    int64_t index0, length;
    const jj_list *items;
};
struct jj_method { /* a str or dict method read as an attribute, not yet called */
    jv self;
    const char *name;
};

static inline jv jv_undef(const char *name) { jv v = {.kind = JV_UNDEF}; v.u.undef = name; return v; }
/* An undefined whose u.undef is Jinja's whole message ("'dict object' has no attribute 'x'"). */
#define JV_UNDEF_MESSAGE 2
static inline jv jv_none(void) { jv v = {.kind = JV_NONE}; return v; }
static inline jv jv_bool(bool b) { jv v = {.kind = JV_BOOL}; v.u.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {.kind = JV_INT}; v.u.i = i; return v; }
static inline jv jv_float(double f) { jv v = {.kind = JV_FLOAT}; v.u.f = f; return v; }
static inline jv jv_strn(const char *p, size_t n) { jv v = {.kind = JV_STR}; v.u.s.p = p; v.u.s.n = n; return v; }

/* A growable byte buffer on malloc (output and scratch strings). */
typedef struct jj_buf {
    char *p;
    size_t n, cap;
    bool oom;   /* an append failed or passed JJ_MAX_OUTPUT; the content is cut */
} jj_buf;

void jj_buf_put(jj_buf *b, const char *s, size_t n);
void jj_buf_puts(jj_buf *b, const char *s);
void jj_buf_putc(jj_buf *b, char c);
void jj_buf_free(jj_buf *b);

jv jv_str_copy(jj_arena *a, const char *p, size_t n, bool *oom); /* empty string on oom */
jj_list *jj_list_new(jj_arena *a, size_t n);                     /* n items, all undefined */
jj_dict *jj_dict_new(jj_arena *a, size_t cap);
/* Sets d[k] = v (replacing in place when k is there); false when out of memory. */
bool jj_dict_set(jj_arena *a, jj_dict *d, jv k, jv v);
const jv *jj_dict_get(const jj_dict *d, jv k);
const jv *jj_dict_get_str(const jj_dict *d, const char *k);

bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
bool jv_is_number(jv v); /* int, float or bool, as Python's numbers */
double jv_as_double(jv v);
const char *jv_type_name(jv v); /* Python's type names, for messages */
/* Python's str(v) (the way {{ v }} prints), and repr(v). */
void jv_str(jj_buf *b, jv v);
void jv_repr(jj_buf *b, jv v);
/* Python's repr of a float: the shortest text that reads back the same. */
void jj_float_repr(jj_buf *b, double f);

/* Decodes one UTF-8 sequence of s[0..n) (n > 0); *len gets its length.
 * An invalid byte comes back as itself, one byte long. */
uint32_t jj_utf8_next(const unsigned char *s, size_t n, size_t *len);

/* Python's str methods (jinja_str.c). */
bool jj_py_space(uint32_t c);
jv jj_str_strip(jv s, const jv *chars, bool left, bool right); /* chars NULL: whitespace */
jj_list *jj_str_split(jj_arena *a, jv s, const jv *sep, int64_t maxsplit, bool from_right);
bool jj_str_replace(jj_buf *b, jv s, jv old, jv new_, int64_t count); /* count < 0: all */
bool jj_str_case(jj_buf *b, jv s, char mode); /* 'u'pper, 'l'ower, 't'itle, 'c'apitalize */
bool jj_str_is(jv s, const char *what);        /* "isdigit", "isalpha", ... */
size_t jj_str_len(jv s);                       /* in code points */
int64_t jj_str_find(jv s, jv sub, bool last);  /* code point index, or -1 */

/* ---- JSON ---- */
/* Parses JSON text to values (ints stay ints, object order kept; a repeated
 * key keeps its first place and its last value, as json.loads). */
hr_status jj_json_parse(jj_arena *a, const char *text, size_t len, jv *out);
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys); indent < 0: None.
 * item_sep/key_sep NULL: Python's defaults for the indent. Returns false with
 * *why set when v holds something JSON cannot hold. */
bool jj_json_dump(jj_buf *b, jv v, bool ensure_ascii, int indent, const char *indent_str, const char *item_sep,
                  const char *key_sep, bool sort_keys, const char **why);

/* ---- tokens and syntax ---- */
typedef enum jt_kind {
    JT_EOF, JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP,
} jt_kind;

typedef struct jj_token {
    uint8_t kind;
    uint32_t pos; /* byte offset in the normalised source */
    const char *p; /* text (the decoded value for strings and text) */
    size_t n;
    int64_t i;
    double f;
} jj_token;

typedef struct jj_source {
    const char *text; /* newlines normalised, one trailing newline removed */
    size_t len;
} jj_source;

/* Formats "chat template line L, column C: " + message into hr_error. */
hr_status jj_error_at(const jj_source *src, uint32_t pos, hr_status code, const char *fmt, ...) HR_PRINTF(4, 5);

hr_status jj_lex(jj_arena *a, const char *text, size_t len, jj_source *src, jj_token **toks, size_t *n_toks);

typedef enum jn_kind {
    /* expressions */
    JN_CONST, JN_NAME, JN_LIST, JN_TUPLE, JN_DICT, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST,
    JN_NEG, JN_POS, JN_NOT, JN_AND, JN_OR, JN_BINOP, JN_COMPARE, JN_COND,
    /* statements */
    JN_BODY, JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SET_BLOCK, JN_MACRO, JN_CALL_BLOCK, JN_FILTER_BLOCK,
    JN_BREAK, JN_CONTINUE,
} jn_kind;

typedef struct jj_node jj_node;
struct jj_node {
    uint8_t kind;
    uint32_t pos;
    int op;               /* JN_BINOP, and each JN_COMPARE operator in ops */
    jv lit;               /* JN_CONST, JN_TEXT */
    const char *name;     /* NAME, ATTR, FILTER, TEST, MACRO */
    jj_node *a, *b, *c, *d;    /* operands; see the parser for each kind */
    jj_node **args;            /* positional arguments, items, statements */
    size_t n_args;
    const char **kw_names; /* keyword arguments; macro parameters; for/set target names */
    jj_node **kw;               /* keyword values; macro defaults (NULL: none) */
    size_t n_kw;
    int *ops;              /* JN_COMPARE: operator i between args[i] and args[i+1] */
};

/* Binary and comparison operators. */
enum { JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
       JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN };

hr_status jj_parse(jj_arena *a, const jj_source *src, const jj_token *toks, size_t n_toks, jj_node **root);

/* ---- rendering ---- */
typedef struct jj_scope jj_scope;
typedef struct jj_ctx {
    jj_arena *arena;
    const jj_source *src;
    jj_buf *out;
    jj_scope *globals; /* the render's variables */
    jj_scope *scope;   /* the innermost scope: a loop body's or a macro call's */
    size_t iterations;
    int depth;
    const char *now; /* fixed "now" (ISO 8601 date-time) for strftime_now, or NULL: the clock */
} jj_ctx;

/* Global functions a template can call by name. */
enum jj_func { JF_RANGE, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME, JF_COUNT };

/* Makes `vars` the render's outermost scope. */
hr_status jj_scope_root(jj_ctx *cx, jj_dict *vars);
hr_status jj_render(jj_ctx *cx, const jj_node *root);
hr_status jj_eval(jj_ctx *cx, const jj_node *e, jv *out);
/* A failure at a node: the message names its line and column. */
hr_status jj_fail(jj_ctx *cx, const jj_node *at, const char *fmt, ...) HR_PRINTF(3, 4);
/* The error of using undefined v, in Jinja's words. */
hr_status jj_undefined(jj_ctx *cx, const jj_node *at, jv v);
hr_status jj_oom(jj_ctx *cx, const jj_node *at);

/* Calls of filters, tests, methods and global functions on evaluated
 * arguments (jinja_builtins.c). kw_names/kw are the keyword arguments. */
typedef struct jj_args {
    const jv *pos;
    size_t n_pos;
    const char *const *kw_names;
    const jv *kw;
    size_t n_kw;
} jj_args;

hr_status jj_filter(jj_ctx *cx, const jj_node *at, const char *name, jv in, const jj_args *args, jv *out);
hr_status jj_test(jj_ctx *cx, const jj_node *at, const char *name, jv in, const jj_args *args, bool *out);
hr_status jj_call_method(jj_ctx *cx, const jj_node *at, jv self, const char *name, const jj_args *args, jv *out);
hr_status jj_call_func(jj_ctx *cx, const jj_node *at, int fn, const jj_args *args, jv *out);
bool jj_has_method(jv self, const char *name);
/* Python's getattr/getitem as Jinja's sandbox does them: undefined when missing. */
hr_status jj_getattr(jj_ctx *cx, const jj_node *at, jv obj, const char *name, jv *out);
hr_status jj_getitem(jj_ctx *cx, const jj_node *at, jv obj, jv key, jv *out);
/* The items of an iterable (list, tuple, dict keys, string characters);
 * undefined iterates as empty. */
hr_status jj_iterate(jj_ctx *cx, const jj_node *at, jv v, jj_list **out);
/* The string of a value as Jinja prints it. */
hr_status jj_to_str(jj_ctx *cx, const jj_node *at, jv v, jv *out);
/* obj[lo:hi:step] (NULL: omitted), on lists, tuples and strings. */
hr_status jj_slice(jj_ctx *cx, const jj_node *at, jv obj, const jv *lo, const jv *hi, const jv *step, jv *out);
/* Python's `item in container`. */
hr_status jj_contains(jj_ctx *cx, const jj_node *at, jv item, jv container, bool *out);
/* Binary operators with Python's semantics. */
hr_status jj_binop(jj_ctx *cx, const jj_node *at, int op, jv a, jv b, jv *out);
/* jinja_format.c: Python's `fmt % args` (a tuple: its items; a dict: %(name)s;
 * else one value), str.format, and the escape and batch filters. */
hr_status jj_percent_format(jj_ctx *cx, const jj_node *at, jv fmt, jv args, jv *out);
hr_status jj_str_format(jj_ctx *cx, const jj_node *at, jv fmt, const jj_args *a, jv *out);
hr_status jj_escape(jj_ctx *cx, const jj_node *at, jv in, jv *out);
hr_status jj_batch(jj_ctx *cx, const jj_node *at, jv in, int64_t size, const jv *fill, jv *out);

#endif
