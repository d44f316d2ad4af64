/* StableHLO module builder: MLIR text in the generic op form, which every
 * StableHLO version parses the same way. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/pjrt/shlo.h"
#include "core/error.h"

static const hr_shlo_value bad_value = {.id = -1};

void hr_shlo_init(hr_shlo_builder *b) {
    memset(b, 0, sizeof *b);
    b->num_replicas = 1;
}

void hr_shlo_free(hr_shlo_builder *b) {
    free(b->body);
    free(b->sig);
    memset(b, 0, sizeof *b);
}

hr_status hr_shlo_fail(hr_shlo_builder *b, hr_status code, const char *fmt, ...) {
    if (b->status != HR_OK) return b->status;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b->status = code;
    return hr_error(code, "%s", msg);
}

static void vappend(hr_shlo_builder *b, char **buf, size_t *len, size_t *cap, const char *fmt,
                    va_list ap) {
    if (b->status != HR_OK) return;
    for (;;) {
        va_list aq;
        va_copy(aq, ap);
        size_t room = *cap - *len;
        int n = *buf ? vsnprintf(*buf + *len, room, fmt, aq) : -1;
        va_end(aq);
        if (n >= 0 && (size_t)n < room) {
            *len += (size_t)n;
            return;
        }
        size_t want = *cap ? *cap * 2 : 4096;
        if (n >= 0 && want < *len + (size_t)n + 1) want = *len + (size_t)n + 1;
        char *p = realloc(*buf, want);
        if (!p) {
            hr_shlo_fail(b, HR_ERR_OOM, "StableHLO builder: out of memory");
            return;
        }
        *buf = p;
        *cap = want;
    }
}

void hr_shlo_text(hr_shlo_builder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vappend(b, &b->body, &b->len, &b->cap, fmt, ap);
    va_end(ap);
}

static void sig_text(hr_shlo_builder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vappend(b, &b->sig, &b->sig_len, &b->sig_cap, fmt, ap);
    va_end(ap);
}

const char *hr_shlo_elem(hr_dtype dt) {
    switch (dt) {
    case HR_F32: return "f32";
    case HR_BF16: return "bf16";
    case HR_F16: return "f16";
    case HR_F64: return "f64";
    case HR_I64: return "i64";
    case HR_I32: return "i32";
    case HR_I16: return "i16";
    case HR_I8: return "i8";
    case HR_U8: return "ui8";
    case HR_BOOL: return "i1";
    default: return "?";
    }
}

const char *hr_shlo_type(char *buf, size_t n, hr_dtype dt, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, n, "tensor<");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%lldx", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, "%s>", hr_shlo_elem(dt));
    return buf;
}

const char *hr_shlo_vtype(char *buf, size_t n, const hr_shlo_value *v) {
    return hr_shlo_type(buf, n, v->dt, v->ndim, v->shape);
}

int hr_shlo_new_id(hr_shlo_builder *b) { return b->next_id++; }

hr_shlo_value hr_shlo_named(int id, hr_dtype dt, int ndim, const int64_t *shape) {
    hr_shlo_value v = {.id = id, .dt = dt, .ndim = ndim};
    if (ndim) memcpy(v.shape, shape, sizeof(int64_t) * (size_t)ndim);
    return v;
}

hr_dtype hr_shlo_compute_dtype(hr_dtype dt) { return dt == HR_BF16 || dt == HR_F16 ? HR_F32 : dt; }

static bool ok(hr_shlo_builder *b, const hr_shlo_value *ins, int n) {
    if (b->status != HR_OK) return false;
    for (int i = 0; i < n; i++)
        if (ins[i].id < 0) return false;
    return true;
}

static hr_shlo_value arg_with(hr_shlo_builder *b, hr_dtype dt, int ndim, const int64_t *shape, const char *attr) {
    hr_shlo_value v = hr_shlo_named(hr_shlo_new_id(b), dt, ndim, shape);
    char t[256];
    sig_text(b, "%s%%v%d: %s%s", b->n_args ? ", " : "", v.id, hr_shlo_vtype(t, sizeof t, &v), attr);
    b->n_args++;
    return v;
}

hr_shlo_value hr_shlo_arg(hr_shlo_builder *b, hr_dtype dt, int ndim, const int64_t *shape) {
    return arg_with(b, dt, ndim, shape, "");
}

hr_shlo_value hr_shlo_arg_donated(hr_shlo_builder *b, hr_dtype dt, int ndim, const int64_t *shape, int result) {
    char attr[64];
    snprintf(attr, sizeof attr, " {tf.aliasing_output = %d : i32}", result);
    return arg_with(b, dt, ndim, shape, attr);
}

hr_shlo_value hr_shlo_op(hr_shlo_builder *b, const char *name, const hr_shlo_value *ins, int n,
                         const char *attrs, hr_dtype dt, int ndim, const int64_t *shape) {
    if (!ok(b, ins, n)) return bad_value;
    hr_shlo_value r = hr_shlo_named(hr_shlo_new_id(b), dt, ndim, shape);
    char t[256];
    hr_shlo_text(b, "    %%v%d = \"stablehlo.%s\"(", r.id, name);
    for (int i = 0; i < n; i++) hr_shlo_text(b, "%s%%v%d", i ? ", " : "", ins[i].id);
    hr_shlo_text(b, ")%s%s%s : (", attrs && *attrs ? " {" : "", attrs ? attrs : "",
                 attrs && *attrs ? "}" : "");
    for (int i = 0; i < n; i++) hr_shlo_text(b, "%s%s", i ? ", " : "", hr_shlo_vtype(t, sizeof t, &ins[i]));
    hr_shlo_text(b, ") -> %s\n", hr_shlo_vtype(t, sizeof t, &r));
    return r;
}

hr_shlo_value hr_shlo_concat(hr_shlo_builder *b, const hr_shlo_value *ins, int n, int dim, hr_dtype dt, int ndim,
                             const int64_t *shape) {
    char attr[64];
    snprintf(attr, sizeof attr, "dimension = %d : i64", dim);
    return hr_shlo_op(b, "concatenate", ins, n, attr, dt, ndim, shape);
}

/* A float literal MLIR parses back exactly; inf and nan as hex bit patterns. */
static void float_literal(char *buf, size_t n, hr_dtype dt, double value) {
    if (isfinite(value)) {
        snprintf(buf, n, "%.17g", dt == HR_F64 ? value : (double)(float)value);
        if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", n - strlen(buf) - 1);
        return;
    }
    bool neg = signbit(value);
    if (dt == HR_F64)
        snprintf(buf, n, "0x%s", isnan(value) ? "7FF8000000000000" : neg ? "FFF0000000000000" : "7FF0000000000000");
    else
        snprintf(buf, n, "0x%s", isnan(value) ? "7FC00000" : neg ? "FF800000" : "7F800000");
}

hr_shlo_value hr_shlo_const(hr_shlo_builder *b, hr_dtype dt, double value) {
    if (b->status != HR_OK) return bad_value;
    /* bf16/f16 literals are built in f32 and converted, so rounding is XLA's. */
    hr_dtype lit = dt == HR_BF16 || dt == HR_F16 ? HR_F32 : dt;
    char text[64];
    if (lit == HR_F32 || lit == HR_F64)
        float_literal(text, sizeof text, lit, value);
    else if (lit == HR_BOOL)
        snprintf(text, sizeof text, "%s", value != 0 ? "true" : "false");
    else
        snprintf(text, sizeof text, "%lld", (long long)value);
    hr_shlo_value r = hr_shlo_named(hr_shlo_new_id(b), lit, 0, NULL);
    hr_shlo_text(b, "    %%v%d = stablehlo.constant dense<%s> : tensor<%s>\n", r.id, text, hr_shlo_elem(lit));
    return lit == dt ? r : hr_shlo_convert(b, r, dt);
}

hr_shlo_value hr_shlo_const_i64(hr_shlo_builder *b, int64_t value) {
    if (b->status != HR_OK) return bad_value;
    hr_shlo_value r = hr_shlo_named(hr_shlo_new_id(b), HR_I64, 0, NULL);
    hr_shlo_text(b, "    %%v%d = stablehlo.constant dense<%lld> : tensor<i64>\n", r.id, (long long)value);
    return r;
}

static void dims_attr(char *buf, size_t n, const char *name, const int64_t *v, int k) {
    size_t used = (size_t)snprintf(buf, n, "%s = array<i64%s", name, k ? ": " : "");
    for (int i = 0; i < k && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)v[i]);
    if (used < n) snprintf(buf + used, n - used, ">");
}

hr_shlo_value hr_shlo_bcast_dims(hr_shlo_builder *b, hr_shlo_value v, const int *dims, int ndim,
                                 const int64_t *shape) {
    int64_t d[HR_MAX_DIMS];
    for (int i = 0; i < v.ndim; i++) d[i] = dims[i];
    char attr[256];
    dims_attr(attr, sizeof attr, "broadcast_dimensions", d, v.ndim);
    return hr_shlo_op(b, "broadcast_in_dim", &v, 1, attr, v.dt, ndim, shape);
}

hr_shlo_value hr_shlo_bcast(hr_shlo_builder *b, hr_shlo_value v, int ndim, const int64_t *shape) {
    bool same = v.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = v.shape[i] == shape[i];
    if (same) return v;
    int dims[HR_MAX_DIMS];
    for (int i = 0; i < v.ndim; i++) dims[i] = ndim - v.ndim + i;
    return hr_shlo_bcast_dims(b, v, dims, ndim, shape);
}

hr_shlo_value hr_shlo_splat(hr_shlo_builder *b, hr_dtype dt, double value, int ndim, const int64_t *shape) {
    return hr_shlo_bcast(b, hr_shlo_const(b, dt, value), ndim, shape);
}

hr_shlo_value hr_shlo_convert(hr_shlo_builder *b, hr_shlo_value v, hr_dtype dt) {
    if (v.dt == dt) return v;
    /* XLA converts floats to bool by truncation; torch means "nonzero". */
    if (dt == HR_BOOL) return hr_shlo_compare(b, "NE", v, hr_shlo_splat(b, v.dt, 0, v.ndim, v.shape));
    return hr_shlo_op(b, "convert", &v, 1, NULL, dt, v.ndim, v.shape);
}

hr_shlo_value hr_shlo_reshape(hr_shlo_builder *b, hr_shlo_value v, int ndim, const int64_t *shape) {
    bool same = v.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = v.shape[i] == shape[i];
    if (same) return v;
    return hr_shlo_op(b, "reshape", &v, 1, NULL, v.dt, ndim, shape);
}

hr_shlo_value hr_shlo_transpose(hr_shlo_builder *b, hr_shlo_value v, const int *perm) {
    int64_t p[HR_MAX_DIMS], shape[HR_MAX_DIMS];
    bool identity = true;
    for (int i = 0; i < v.ndim; i++) {
        p[i] = perm[i];
        shape[i] = v.shape[perm[i]];
        identity &= perm[i] == i;
    }
    if (identity) return v;
    char attr[256];
    dims_attr(attr, sizeof attr, "permutation", p, v.ndim);
    return hr_shlo_op(b, "transpose", &v, 1, attr, v.dt, v.ndim, shape);
}

hr_shlo_value hr_shlo_unary(hr_shlo_builder *b, const char *name, hr_shlo_value x) {
    return hr_shlo_op(b, name, &x, 1, NULL, x.dt, x.ndim, x.shape);
}

hr_shlo_value hr_shlo_binary(hr_shlo_builder *b, const char *name, hr_shlo_value x, hr_shlo_value y) {
    hr_shlo_value in[2] = {x, y};
    return hr_shlo_op(b, name, in, 2, NULL, x.dt, x.ndim, x.shape);
}

hr_shlo_value hr_shlo_compare(hr_shlo_builder *b, const char *dir, hr_shlo_value x, hr_shlo_value y) {
    hr_shlo_value in[2] = {x, y};
    char attr[128];
    /* Float compares are total-order free (IEEE): NaN != NaN like torch. */
    const char *type = x.dt == HR_F32 || x.dt == HR_F64 || x.dt == HR_BF16 || x.dt == HR_F16 ? "FLOAT"
                       : x.dt == HR_U8 || x.dt == HR_BOOL                                        ? "UNSIGNED"
                                                                                                 : "SIGNED";
    snprintf(attr, sizeof attr,
             "comparison_direction = #stablehlo<comparison_direction %s>, compare_type = "
             "#stablehlo<comparison_type %s>",
             dir, type);
    return hr_shlo_op(b, "compare", in, 2, attr, HR_BOOL, x.ndim, x.shape);
}

hr_shlo_value hr_shlo_select(hr_shlo_builder *b, hr_shlo_value pred, hr_shlo_value t, hr_shlo_value f) {
    hr_shlo_value in[3] = {pred, t, f};
    return hr_shlo_op(b, "select", in, 3, NULL, t.dt, t.ndim, t.shape);
}

hr_shlo_value hr_shlo_iota(hr_shlo_builder *b, hr_dtype dt, int dim, int ndim, const int64_t *shape) {
    char attr[64];
    snprintf(attr, sizeof attr, "iota_dimension = %d : i64", dim);
    return hr_shlo_op(b, "iota", NULL, 0, attr, dt, ndim, shape);
}

hr_shlo_value hr_shlo_slice(hr_shlo_builder *b, hr_shlo_value v, const int64_t *start, const int64_t *limit,
                            const int64_t *stride) {
    int64_t shape[HR_MAX_DIMS], ones[HR_MAX_DIMS];
    bool identity = true;
    for (int i = 0; i < v.ndim; i++) {
        ones[i] = 1;
        int64_t st = stride ? stride[i] : 1;
        shape[i] = limit[i] > start[i] ? (limit[i] - start[i] + st - 1) / st : 0;
        identity &= start[i] == 0 && limit[i] == v.shape[i] && st == 1;
    }
    if (identity) return v;
    char attr[800], a1[256], a2[256], a3[256];
    dims_attr(a1, sizeof a1, "start_indices", start, v.ndim);
    dims_attr(a2, sizeof a2, "limit_indices", limit, v.ndim);
    dims_attr(a3, sizeof a3, "strides", stride ? stride : ones, v.ndim);
    snprintf(attr, sizeof attr, "%s, %s, %s", a1, a2, a3);
    return hr_shlo_op(b, "slice", &v, 1, attr, v.dt, v.ndim, shape);
}

void hr_shlo_region(hr_shlo_builder *b, hr_dtype dt, const char *fn) {
    int a = hr_shlo_new_id(b), c = hr_shlo_new_id(b), r = hr_shlo_new_id(b);
    const char *t = hr_shlo_elem(dt);
    hr_shlo_text(b, "    ^bb0(%%v%d: tensor<%s>, %%v%d: tensor<%s>):\n", a, t, c, t);
    if (fn)
        hr_shlo_text(b, "      %%v%d = \"stablehlo.%s\"(%%v%d, %%v%d) : (tensor<%s>, tensor<%s>) -> tensor<%s>\n", r,
                     fn, a, c, t, t, t);
    hr_shlo_text(b, "      \"stablehlo.return\"(%%v%d) : (tensor<%s>) -> ()\n", fn ? r : c, t);
}

hr_shlo_value hr_shlo_reduce(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value init, const char *fn,
                             const bool *dims) {
    hr_shlo_value in[2] = {v, init};
    if (!ok(b, in, 2)) return bad_value;
    int64_t shape[HR_MAX_DIMS], rd[HR_MAX_DIMS];
    int n = 0, nr = 0;
    for (int i = 0; i < v.ndim; i++) {
        if (dims[i])
            rd[nr++] = i;
        else
            shape[n++] = v.shape[i];
    }
    if (nr == 0) return v;
    hr_shlo_value r = hr_shlo_named(hr_shlo_new_id(b), v.dt, n, shape);
    char t1[256], t2[256], t3[256], attr[256];
    hr_shlo_text(b, "    %%v%d = \"stablehlo.reduce\"(%%v%d, %%v%d) ({\n", r.id, v.id, init.id);
    hr_shlo_region(b, v.dt, fn);
    dims_attr(attr, sizeof attr, "dimensions", rd, nr);
    hr_shlo_text(b, "    }) {%s} : (%s, %s) -> %s\n", attr, hr_shlo_vtype(t1, sizeof t1, &v),
                 hr_shlo_vtype(t2, sizeof t2, &init), hr_shlo_vtype(t3, sizeof t3, &r));
    return r;
}

hr_shlo_value hr_shlo_gather_flat(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value idx) {
    hr_shlo_value in[2] = {v, idx};
    char attr[384];
    snprintf(attr, sizeof attr,
             "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
             "index_vector_dim = %d>, indices_are_sorted = false, slice_sizes = array<i64: 1>",
             idx.ndim);
    return hr_shlo_op(b, "gather", in, 2, attr, v.dt, idx.ndim, idx.shape);
}

bool hr_shlo_float16(hr_dtype dt) { return dt == HR_BF16 || dt == HR_F16; }

hr_shlo_value hr_shlo_bits(hr_shlo_builder *b, hr_shlo_value v) {
    return hr_shlo_float16(v.dt) ? hr_shlo_op(b, "bitcast_convert", &v, 1, NULL, HR_I16, v.ndim, v.shape) : v;
}

hr_shlo_value hr_shlo_bits_as(hr_shlo_builder *b, hr_shlo_value v, hr_dtype dt) {
    if (v.dt != HR_I16 || !hr_shlo_float16(dt)) return v;
    return hr_shlo_op(b, "bitcast_convert", &v, 1, NULL, dt, v.ndim, v.shape);
}

hr_shlo_value hr_shlo_scatter(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value idx, hr_shlo_value upd,
                              const int *window_dims, int n_window, int dim, int index_vector_dim) {
    hr_shlo_value in[3] = {v, idx, upd};
    if (!ok(b, in, 3)) return bad_value;
    if (hr_shlo_float16(v.dt) && upd.dt == v.dt) /* an overwrite moves bits */
        return hr_shlo_bits_as(
            b, hr_shlo_scatter(b, hr_shlo_bits(b, v), idx, hr_shlo_bits(b, upd), window_dims, n_window, dim,
                               index_vector_dim),
            v.dt);
    hr_shlo_value r = hr_shlo_named(hr_shlo_new_id(b), v.dt, v.ndim, v.shape);
    char t1[256], t2[256], t3[256], wd[128] = "";
    size_t used = 0;
    for (int i = 0; i < n_window; i++)
        used += (size_t)snprintf(wd + used, sizeof wd - used, i ? ", %d" : "%d", window_dims[i]);
    hr_shlo_text(b, "    %%v%d = \"stablehlo.scatter\"(%%v%d, %%v%d, %%v%d) ({\n", r.id, v.id, idx.id, upd.id);
    hr_shlo_region(b, v.dt, NULL);
    hr_shlo_vtype(t1, sizeof t1, &v);
    hr_shlo_vtype(t2, sizeof t2, &idx);
    hr_shlo_vtype(t3, sizeof t3, &upd);
    hr_shlo_text(b,
                 "    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<"
                 "update_window_dims = [%s], inserted_window_dims = [%d], scatter_dims_to_operand_dims = [%d], "
                 "index_vector_dim = %d>, unique_indices = false} : (%s, %s, %s) -> %s\n",
                 wd, dim, dim, index_vector_dim, t1, t2, t3, t1);
    return r;
}

hr_shlo_value hr_shlo_scatter_flat(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value idx, hr_shlo_value upd) {
    return hr_shlo_scatter(b, v, idx, upd, NULL, 0, 0, idx.ndim);
}

char *hr_shlo_finish(hr_shlo_builder *b, const char *name, const hr_shlo_value *results, int n) {
    if (!ok(b, results, n)) {
        if (b->status == HR_OK) hr_shlo_fail(b, HR_ERR_INTERNAL, "StableHLO builder: invalid result value");
        return NULL;
    }
    char t[256];
    hr_shlo_builder m;
    hr_shlo_init(&m);
    hr_shlo_text(&m, "module @%s attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = %d : i32} {\n",
                 name, b->num_replicas);
    hr_shlo_text(&m, "  func.func public @main(%s) -> (", b->sig ? b->sig : "");
    for (int i = 0; i < n; i++) hr_shlo_text(&m, "%s%s", i ? ", " : "", hr_shlo_vtype(t, sizeof t, &results[i]));
    hr_shlo_text(&m, ") {\n%s    \"func.return\"(", b->body ? b->body : "");
    for (int i = 0; i < n; i++) hr_shlo_text(&m, "%s%%v%d", i ? ", " : "", results[i].id);
    hr_shlo_text(&m, ") : (");
    for (int i = 0; i < n; i++) hr_shlo_text(&m, "%s%s", i ? ", " : "", hr_shlo_vtype(t, sizeof t, &results[i]));
    hr_shlo_text(&m, ") -> ()\n  }\n}\n");
    if (m.status != HR_OK) {
        b->status = m.status;
        hr_shlo_free(&m);
        return NULL;
    }
    free(m.sig);
    return m.body;
}
