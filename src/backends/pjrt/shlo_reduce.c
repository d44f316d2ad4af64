/* StableHLO lowerings of the reductions: sum, mean, max, min, argmax,
 * softmax, log_softmax, cumsum, topk. Floating data reduces in f32 (f64
 * stays f64); integer sums in i64, as the dtype rules say. */
#include <math.h>
#include <stdio.h>

#include "backends/pjrt/shlo.h"
#include "core/error.h"

/* The reduced dim of x (a 0-dim x reduces over its one element: -1). */
static int reduce_dim(const hr_shlo_value *x, int64_t dim) {
    if (x->ndim == 0) return -1;
    return (int)(dim < 0 ? dim + x->ndim : dim);
}

static hr_dtype accum_dtype(hr_dtype dt) {
    if (dt == HR_F64) return HR_F64;
    return hr_dtype_is_float(dt) ? HR_F32 : HR_I64;
}

/* +-inf for floats, the dtype's extremes for integers. */
static double lowest(hr_dtype dt) {
    switch (dt) {
    case HR_I64: return -9223372036854775808.0;
    case HR_I32: return -2147483648.0;
    case HR_I16: return -32768.0;
    case HR_I8: return -128.0;
    case HR_U8: case HR_BOOL: return 0;
    default: return -INFINITY;
    }
}

static double highest(hr_dtype dt) {
    switch (dt) {
    case HR_I64: return 9223372036854775807.0;
    case HR_I32: return 2147483647.0;
    case HR_I16: return 32767.0;
    case HR_I8: return 127.0;
    case HR_U8: return 255.0;
    case HR_BOOL: return 1;
    default: return INFINITY;
    }
}

/* Reduces x over dim d with fn, from init; result keeps the dim as size 1
 * when keep, so it broadcasts back against x. */
static hr_shlo_value reduce_over(hr_shlo_builder *b, hr_shlo_value x, int d, const char *fn, double init,
                                 bool keep) {
    bool dims[HR_MAX_DIMS] = {0};
    dims[d] = true;
    hr_shlo_value init_v = x.dt == HR_I64 && fabs(init) > 9e18 ? hr_shlo_const_i64(b, init < 0 ? INT64_MIN : INT64_MAX)
                                                               : hr_shlo_const(b, x.dt, init);
    hr_shlo_value r = hr_shlo_reduce(b, x, init_v, fn, dims);
    if (!keep) return r;
    int64_t shape[HR_MAX_DIMS];
    for (int i = 0; i < x.ndim; i++) shape[i] = i == d ? 1 : x.shape[i];
    return hr_shlo_reshape(b, r, x.ndim, shape);
}

static hr_status lower_reduce(hr_op op, hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in,
                              const hr_tensor_meta *m, hr_shlo_value *out) {
    const hr_attrs_reduce *a = attrs;
    hr_shlo_value x = in[0];
    int d = reduce_dim(&x, a->dim);
    hr_shlo_value r;
    if (op == HR_OP_argmax) {
        if (d < 0) {
            out[0] = hr_shlo_splat(b, HR_I64, 0, m->ndim, m->shape);
            return b->status;
        }
        /* The first index holding the max: min over (x == max ? i : n). */
        hr_shlo_value xc = hr_shlo_convert(b, x, accum_dtype(x.dt) == HR_I64 ? x.dt : accum_dtype(x.dt));
        hr_shlo_value mx = hr_shlo_bcast(b, reduce_over(b, xc, d, "maximum", lowest(xc.dt), true), x.ndim, x.shape);
        hr_shlo_value idx = hr_shlo_iota(b, HR_I64, d, x.ndim, x.shape);
        hr_shlo_value big = hr_shlo_splat(b, HR_I64, (double)x.shape[d], x.ndim, x.shape);
        hr_shlo_value cand = hr_shlo_select(b, hr_shlo_compare(b, "EQ", xc, mx), idx, big);
        bool dims[HR_MAX_DIMS] = {0};
        dims[d] = true;
        r = hr_shlo_reduce(b, cand, hr_shlo_const_i64(b, INT64_MAX), "minimum", dims);
        out[0] = hr_shlo_reshape(b, r, m->ndim, m->shape);
        return b->status;
    }
    hr_dtype acc = op == HR_OP_max || op == HR_OP_min ? (hr_dtype_is_float(x.dt) ? accum_dtype(x.dt) : x.dt)
                                                      : accum_dtype(x.dt);
    hr_shlo_value xc = hr_shlo_convert(b, x, acc);
    if (d < 0) {
        r = xc;
    } else if (op == HR_OP_max || op == HR_OP_min) {
        /* NaN propagates through StableHLO max/min, as in torch. */
        r = reduce_over(b, xc, d, op == HR_OP_max ? "maximum" : "minimum",
                        op == HR_OP_max ? lowest(acc) : highest(acc), false);
    } else {
        r = reduce_over(b, xc, d, "add", 0, false);
        if (op == HR_OP_mean)
            r = hr_shlo_binary(b, "divide", r, hr_shlo_splat(b, acc, (double)x.shape[d], r.ndim, r.shape));
    }
    out[0] = hr_shlo_convert(b, hr_shlo_reshape(b, r, m->ndim, m->shape), m->dtype);
    return b->status;
}

#define LOWER_REDUCE_(name)                                                                                 \
    static hr_status lower_##name(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in, \
                                  const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {                 \
        return lower_reduce(HR_OP_##name, b, attrs, in, m, out);                                            \
    }
LOWER_REDUCE_(sum)
LOWER_REDUCE_(mean)
LOWER_REDUCE_(max)
LOWER_REDUCE_(min)
LOWER_REDUCE_(argmax)

static hr_status lower_softmax_any(bool log, hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in,
                                   const hr_tensor_meta *m, hr_shlo_value *out) {
    const hr_attrs_dim *a = attrs;
    hr_shlo_value x = hr_shlo_convert(b, in[0], accum_dtype(in[0].dt));
    int d = reduce_dim(&x, a->dim);
    if (d < 0) { /* one element: softmax 1, log_softmax 0 (NaN stays NaN) */
        hr_shlo_value zero = hr_shlo_binary(b, "subtract", x, x);
        out[0] = hr_shlo_convert(b, log ? zero : hr_shlo_unary(b, "exponential", zero), m->dtype);
        return b->status;
    }
    hr_shlo_value mx = hr_shlo_bcast(b, reduce_over(b, x, d, "maximum", -INFINITY, true), x.ndim, x.shape);
    hr_shlo_value sh = hr_shlo_binary(b, "subtract", x, mx);
    hr_shlo_value e = hr_shlo_unary(b, "exponential", sh);
    hr_shlo_value s = hr_shlo_bcast(b, reduce_over(b, e, d, "add", 0, true), x.ndim, x.shape);
    hr_shlo_value r = log ? hr_shlo_binary(b, "subtract", sh, hr_shlo_unary(b, "log", s))
                          : hr_shlo_binary(b, "divide", e, s);
    out[0] = hr_shlo_convert(b, r, m->dtype);
    return b->status;
}

static hr_status lower_softmax(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                               const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    return lower_softmax_any(false, b, attrs, in, m, out);
}

static hr_status lower_log_softmax(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                   const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    return lower_softmax_any(true, b, attrs, in, m, out);
}

/* cumsum as a reduce_window whose window reaches back over the whole dim. */
static hr_status lower_cumsum(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                              const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    hr_shlo_value x = hr_shlo_convert(b, in[0], accum_dtype(in[0].dt));
    int d = reduce_dim(&x, a->dim);
    if (d < 0 || x.shape[d] <= 1) {
        out[0] = hr_shlo_convert(b, x, m->dtype);
        return b->status;
    }
    hr_shlo_value init = hr_shlo_const(b, x.dt, 0);
    hr_shlo_value r = hr_shlo_named(hr_shlo_new_id(b), x.dt, x.ndim, x.shape);
    char t[256], win[256], pad[512];
    size_t wn = 0, pn = 0;
    for (int i = 0; i < x.ndim; i++) {
        long long w = i == d ? (long long)x.shape[d] : 1;
        wn += (size_t)snprintf(win + wn, sizeof win - wn, "%s%lld", i ? ", " : "", w);
        pn += (size_t)snprintf(pad + pn, sizeof pad - pn, "%s[%lld, 0]", i ? ", " : "",
                               (long long)(i == d ? x.shape[d] - 1 : 0));
    }
    hr_shlo_text(b, "    %%v%d = \"stablehlo.reduce_window\"(%%v%d, %%v%d) ({\n", r.id, x.id, init.id);
    hr_shlo_region(b, x.dt, "add");
    hr_shlo_text(b, "    }) {padding = dense<[%s]> : tensor<%dx2xi64>, window_dimensions = array<i64: %s>} : (%s, ",
                 pad, x.ndim, win, hr_shlo_vtype(t, sizeof t, &x));
    hr_shlo_text(b, "tensor<%s>) -> %s\n", hr_shlo_elem(x.dt), hr_shlo_vtype(t, sizeof t, &r));
    out[0] = hr_shlo_convert(b, r, m->dtype);
    return b->status;
}

/* topk: a stable sort of (value, index) along dim, then the first k. */
static hr_status lower_topk(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                            const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_topk *a = attrs;
    hr_shlo_value x = in[0];
    if (x.ndim == 0) x = hr_shlo_reshape(b, x, 1, (int64_t[]){1});
    int d = (int)(a->dim < 0 ? a->dim + x.ndim : a->dim);
    hr_shlo_value idx = hr_shlo_iota(b, HR_I64, d, x.ndim, x.shape);
    int r1 = hr_shlo_new_id(b);
    char t1[256], t2[256];
    const char *elem = hr_shlo_elem(x.dt);
    int e0 = hr_shlo_new_id(b), e1 = hr_shlo_new_id(b), e2 = hr_shlo_new_id(b), e3 = hr_shlo_new_id(b),
        ec = hr_shlo_new_id(b);
    const char *type = hr_dtype_is_float(x.dt) ? "FLOAT" : x.dt == HR_U8 ? "UNSIGNED" : "SIGNED";
    hr_shlo_text(b, "    %%v%d:2 = \"stablehlo.sort\"(%%v%d, %%v%d) ({\n", r1, x.id, idx.id);
    hr_shlo_text(b, "    ^bb0(%%v%d: tensor<%s>, %%v%d: tensor<%s>, %%v%d: tensor<i64>, %%v%d: tensor<i64>):\n",
                 e0, elem, e1, elem, e2, e3);
    hr_shlo_text(b,
                 "      %%v%d = \"stablehlo.compare\"(%%v%d, %%v%d) {comparison_direction = "
                 "#stablehlo<comparison_direction %s>, compare_type = #stablehlo<comparison_type %s>} : "
                 "(tensor<%s>, tensor<%s>) -> tensor<i1>\n",
                 ec, e0, e1, a->largest ? "GT" : "LT", type, elem, elem);
    hr_shlo_text(b, "      \"stablehlo.return\"(%%v%d) : (tensor<i1>) -> ()\n", ec);
    hr_shlo_vtype(t1, sizeof t1, &x);
    hr_shlo_vtype(t2, sizeof t2, &idx);
    hr_shlo_text(b, "    }) {dimension = %d : i64, is_stable = true} : (%s, %s) -> (%s, %s)\n", d, t1, t2, t1, t2);
    /* %vN#0 / %vN#1 are renamed to plain values for the helpers. */
    hr_shlo_value sv = hr_shlo_named(hr_shlo_new_id(b), x.dt, x.ndim, x.shape);
    hr_shlo_value si = hr_shlo_named(hr_shlo_new_id(b), HR_I64, x.ndim, x.shape);
    hr_shlo_text(b, "    %%v%d = \"stablehlo.reshape\"(%%v%d#0) : (%s) -> %s\n", sv.id, r1, t1, t1);
    hr_shlo_text(b, "    %%v%d = \"stablehlo.reshape\"(%%v%d#1) : (%s) -> %s\n", si.id, r1, t2, t2);
    int64_t start[HR_MAX_DIMS] = {0}, limit[HR_MAX_DIMS];
    for (int i = 0; i < x.ndim; i++) limit[i] = i == d ? a->k : x.shape[i];
    out[0] = hr_shlo_reshape(b, hr_shlo_slice(b, sv, start, limit, NULL), m[0].ndim, m[0].shape);
    out[1] = hr_shlo_reshape(b, hr_shlo_slice(b, si, start, limit, NULL), m[1].ndim, m[1].shape);
    return b->status;
}

/* Bool data has no ordered compare here; the cpu sorts it as bytes. */
static bool check_topk(const void *attrs, const hr_tensor *const *in, int n_in) {
    return in[0]->dtype != HR_BOOL;
}

void hr_shlo_register_reduce(hr_shlo_lowering *t) {
#define REG_(name) t[HR_OP_##name].lower = lower_##name;
    REG_(sum) REG_(mean) REG_(max) REG_(min) REG_(argmax) REG_(softmax) REG_(log_softmax) REG_(cumsum)
    REG_(topk)
#undef REG_
    t[HR_OP_topk].check = check_topk;
}
