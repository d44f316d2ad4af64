/* StableHLO lowerings of the elementwise ops, and the lowering table.
 *
 * Floating ops compute in f32 for bf16/f16 (like the cpu kernels) and store
 * in the output dtype; integer ops compute in i64, then wrap to the output
 * dtype as the cpu kernels' stores do. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "backends/pjrt/shlo.h"
#include "core/error.h"

static hr_shlo_lowering g_table[HR_OP_COUNT];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
    hr_shlo_register_eltwise(g_table);
    hr_shlo_register_reduce(g_table);
    hr_shlo_register_linalg(g_table);
    hr_shlo_register_index(g_table);
    hr_shlo_register_nn(g_table);
    hr_shlo_register_moe(g_table);
    hr_shlo_register_image(g_table);
    hr_shlo_register_collective(g_table);
}

const hr_shlo_lowering *hr_shlo_lowering_get(hr_op op) {
    if ((unsigned)op >= HR_OP_COUNT) return NULL;
    pthread_once(&g_once, build_table);
    return &g_table[op];
}

/* The dtype an op computes in for results stored as dt. */
static hr_dtype work_dtype(hr_dtype dt) { return hr_dtype_is_float(dt) ? hr_shlo_compute_dtype(dt) : HR_I64; }

/* Input value converted to the work dtype and broadcast to the result shape. */
static hr_shlo_value operand(hr_shlo_builder *b, hr_shlo_value v, const hr_tensor_meta *m) {
    return hr_shlo_bcast(b, hr_shlo_convert(b, v, work_dtype(m->dtype)), m->ndim, m->shape);
}

static hr_shlo_value splat_like(hr_shlo_builder *b, hr_shlo_value like, double value) {
    return hr_shlo_splat(b, like.dt, value, like.ndim, like.shape);
}

/* erf(x) for f32/f64 as a rational polynomial on [-4, 4] (the Eigen/XLA
 * f32 approximation, a few ulp), since StableHLO has no erf op. */
static hr_shlo_value emit_erf(hr_shlo_builder *b, hr_shlo_value x) {
    static const double alpha[7] = {-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                                    -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                    -1.60960333262415e-02};
    static const double beta[5] = {-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                   -7.37332916720468e-03, -1.42647390514189e-02};
    hr_shlo_value in[3] = {splat_like(b, x, -4.0), x, splat_like(b, x, 4.0)};
    hr_shlo_value xc = hr_shlo_op(b, "clamp", in, 3, NULL, x.dt, x.ndim, x.shape);
    hr_shlo_value x2 = hr_shlo_binary(b, "multiply", xc, xc);
    hr_shlo_value p = splat_like(b, x, alpha[0]);
    for (int i = 1; i < 7; i++)
        p = hr_shlo_binary(b, "add", hr_shlo_binary(b, "multiply", p, x2), splat_like(b, x, alpha[i]));
    hr_shlo_value q = splat_like(b, x, beta[0]);
    for (int i = 1; i < 5; i++)
        q = hr_shlo_binary(b, "add", hr_shlo_binary(b, "multiply", q, x2), splat_like(b, x, beta[i]));
    return hr_shlo_binary(b, "divide", hr_shlo_binary(b, "multiply", xc, p), q);
}

static hr_shlo_value emit_gelu(hr_shlo_builder *b, hr_shlo_value x, int64_t approx) {
    hr_shlo_value inner;
    if (approx == HR_GELU_TANH) {
        hr_shlo_value x3 = hr_shlo_binary(b, "multiply", hr_shlo_binary(b, "multiply", x, x), x);
        hr_shlo_value t = hr_shlo_binary(b, "add", x, hr_shlo_binary(b, "multiply", x3, splat_like(b, x, 0.044715)));
        t = hr_shlo_binary(b, "multiply", t, splat_like(b, x, 0.79788456080286535588));
        inner = hr_shlo_unary(b, "tanh", t);
    } else {
        inner = emit_erf(b, hr_shlo_binary(b, "multiply", x, splat_like(b, x, 0.70710678118654752440)));
    }
    hr_shlo_value half_x = hr_shlo_binary(b, "multiply", x, splat_like(b, x, 0.5));
    return hr_shlo_binary(b, "multiply", half_x, hr_shlo_binary(b, "add", inner, splat_like(b, x, 1.0)));
}

static hr_shlo_value emit_silu(hr_shlo_builder *b, hr_shlo_value x) {
    return hr_shlo_binary(b, "multiply", x, hr_shlo_unary(b, "logistic", x));
}

/* ---- binary ---- */

static const char *binary_name(hr_op op) {
    switch (op) {
    case HR_OP_add: return "add";
    case HR_OP_sub: return "subtract";
    case HR_OP_mul: return "multiply";
    case HR_OP_div: return "divide";
    case HR_OP_pow: return "power";
    case HR_OP_maximum: return "maximum";
    case HR_OP_minimum: return "minimum";
    default: return NULL;
    }
}

static hr_status lower_binary(hr_op op, hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in,
                              const hr_tensor_meta *m, hr_shlo_value *out) {
    hr_shlo_value x = operand(b, in[0], m), y = operand(b, in[1], m), r;
    if (op == HR_OP_silu_mul)
        r = hr_shlo_binary(b, "multiply", emit_silu(b, x), y);
    else if (op == HR_OP_gelu_mul)
        r = hr_shlo_binary(b, "multiply", emit_gelu(b, x, ((const hr_attrs_gelu *)attrs)->approximate), y);
    else
        r = hr_shlo_binary(b, binary_name(op), x, y);
    out[0] = hr_shlo_convert(b, r, m->dtype);
    return b->status;
}

#define LOWER_BINARY_(name)                                                                                   \
    static hr_status lower_##name(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,   \
                                  const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {                   \
        return lower_binary(HR_OP_##name, b, attrs, in, m, out);                                              \
    }
LOWER_BINARY_(add)
LOWER_BINARY_(sub)
LOWER_BINARY_(mul)
LOWER_BINARY_(div)
LOWER_BINARY_(pow)
LOWER_BINARY_(maximum)
LOWER_BINARY_(minimum)
LOWER_BINARY_(silu_mul)
LOWER_BINARY_(gelu_mul)

/* ---- unary ---- */

static hr_status lower_unary(hr_op op, hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in,
                             const hr_tensor_meta *m, hr_shlo_value *out) {
    hr_shlo_value x = operand(b, in[0], m), r;
    switch (op) {
    case HR_OP_neg: r = hr_shlo_unary(b, "negate", x); break;
    case HR_OP_exp: r = hr_shlo_unary(b, "exponential", x); break;
    case HR_OP_log: r = hr_shlo_unary(b, "log", x); break;
    case HR_OP_sqrt: r = hr_shlo_unary(b, "sqrt", x); break;
    case HR_OP_rsqrt: r = hr_shlo_unary(b, "rsqrt", x); break;
    case HR_OP_abs: r = hr_shlo_unary(b, "abs", x); break;
    case HR_OP_sigmoid: r = hr_shlo_unary(b, "logistic", x); break;
    case HR_OP_tanh: r = hr_shlo_unary(b, "tanh", x); break;
    case HR_OP_silu: r = emit_silu(b, x); break;
    case HR_OP_gelu: r = emit_gelu(b, x, ((const hr_attrs_gelu *)attrs)->approximate); break;
    case HR_OP_relu: {
        /* select, not maximum: relu(NaN) is NaN in torch. */
        hr_shlo_value zero = splat_like(b, x, 0);
        r = hr_shlo_select(b, hr_shlo_compare(b, "LT", x, zero), zero, x);
        break;
    }
    case HR_OP_scale: {
        const hr_attrs_scale *a = attrs;
        r = hr_shlo_binary(b, "add", hr_shlo_binary(b, "multiply", x, splat_like(b, x, a->mul)),
                           splat_like(b, x, a->add));
        break;
    }
    case HR_OP_clamp: {
        const hr_attrs_clamp *a = attrs;
        bool is_float = hr_dtype_is_float(m->dtype);
        r = x;
        /* Compare-and-select keeps NaN inputs NaN (torch.clamp does). */
        if (a->has_min) {
            hr_shlo_value lo = splat_like(b, x, is_float ? (double)(float)a->min : trunc(a->min));
            r = hr_shlo_select(b, hr_shlo_compare(b, "LT", r, lo), lo, r);
        }
        if (a->has_max) {
            hr_shlo_value hi = splat_like(b, x, is_float ? (double)(float)a->max : trunc(a->max));
            r = hr_shlo_select(b, hr_shlo_compare(b, "GT", r, hi), hi, r);
        }
        break;
    }
    default: return hr_shlo_fail(b, HR_ERR_INTERNAL, "lower_unary: op %s", hr_op_name(op));
    }
    out[0] = hr_shlo_convert(b, r, m->dtype);
    return b->status;
}

#define LOWER_UNARY_(name)                                                                                    \
    static hr_status lower_##name(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,   \
                                  const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {                   \
        return lower_unary(HR_OP_##name, b, attrs, in, m, out);                                               \
    }
LOWER_UNARY_(neg)
LOWER_UNARY_(exp)
LOWER_UNARY_(log)
LOWER_UNARY_(sqrt)
LOWER_UNARY_(rsqrt)
LOWER_UNARY_(abs)
LOWER_UNARY_(relu)
LOWER_UNARY_(sigmoid)
LOWER_UNARY_(tanh)
LOWER_UNARY_(silu)
LOWER_UNARY_(gelu)
LOWER_UNARY_(clamp)
LOWER_UNARY_(scale)

/* Integer clamp bounds beyond int64 would not survive the i64 splat. */
static bool check_clamp(const void *attrs, const hr_tensor *const *in, int n_in) {
    const hr_attrs_clamp *a = attrs;
    if (hr_dtype_is_float(in[0]->dtype)) return true;
    return (!a->has_min || fabs(a->min) < 9.2e18) && (!a->has_max || fabs(a->max) < 9.2e18);
}

/* ---- where, copy, cast, fill, arange ---- */

static hr_status lower_where(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                             const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    hr_shlo_value c = hr_shlo_bcast(b, hr_shlo_convert(b, in[0], HR_BOOL), m->ndim, m->shape);
    hr_shlo_value x = hr_shlo_bcast(b, hr_shlo_convert(b, in[1], m->dtype), m->ndim, m->shape);
    hr_shlo_value y = hr_shlo_bcast(b, hr_shlo_convert(b, in[2], m->dtype), m->ndim, m->shape);
    out[0] = hr_shlo_select(b, c, x, y);
    return b->status;
}

/* The view load already gathered the input; copy is its store. */
static hr_status lower_copy(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                            const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    out[0] = in[0];
    return b->status;
}

static hr_status lower_cast(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                            const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    hr_shlo_value x = in[0];
    /* Float to narrow int goes through i64 so out-of-range values wrap the
     * way the cpu's (int64 -> narrow) stores do. */
    if (hr_dtype_is_float(x.dt) && !hr_dtype_is_float(m->dtype) && m->dtype != HR_BOOL && m->dtype != HR_I64)
        x = hr_shlo_convert(b, x, HR_I64);
    out[0] = hr_shlo_convert(b, x, m->dtype);
    return b->status;
}

static hr_status lower_fill(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                            const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_fill *a = attrs;
    double v = hr_dtype_is_float(m->dtype) || m->dtype == HR_BOOL ? a->value : trunc(a->value);
    out[0] = hr_shlo_splat(b, m->dtype, v, m->ndim, m->shape);
    return b->status;
}

/* torch.arange: start + i * step in double, then cast. */
static hr_status lower_arange(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                              const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_arange *a = attrs;
    hr_shlo_value i = hr_shlo_iota(b, HR_F64, 0, 1, m->shape);
    hr_shlo_value r = hr_shlo_binary(b, "add", hr_shlo_binary(b, "multiply", i, splat_like(b, i, a->step)),
                                     splat_like(b, i, a->start));
    if (!hr_dtype_is_float(m->dtype) && m->dtype != HR_I64) r = hr_shlo_convert(b, r, HR_I64);
    out[0] = hr_shlo_convert(b, r, m->dtype);
    return b->status;
}

void hr_shlo_register_eltwise(hr_shlo_lowering *t) {
#define REG_(name) t[HR_OP_##name].lower = lower_##name;
    REG_(add) REG_(sub) REG_(mul) REG_(div) REG_(pow) REG_(maximum) REG_(minimum) REG_(silu_mul)
    REG_(gelu_mul) REG_(neg) REG_(exp) REG_(log) REG_(sqrt) REG_(rsqrt) REG_(abs) REG_(relu)
    REG_(sigmoid) REG_(tanh) REG_(silu) REG_(gelu) REG_(clamp) REG_(scale) REG_(where) REG_(copy)
    REG_(cast) REG_(fill) REG_(arange)
#undef REG_
    t[HR_OP_clamp].check = check_clamp;
}
