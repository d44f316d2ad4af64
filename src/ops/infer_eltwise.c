/* Shape and dtype inference for the eltwise ops.
 *
 * Arithmetic runs on f32/bf16/f16 (computed in f32); add, sub, mul,
 * maximum, minimum, neg, abs, relu and clamp also take integer dtypes
 * (computed in i64). div and pow require floats: torch's int / int is a
 * true division giving floats, and hubrt keeps an op's output dtype equal
 * to its input's, so the caller casts first. */
#include <math.h>

#include "core/error.h"
#include "ops/op_impl.h"

static bool is_int_dtype(hr_dtype dt) {
    return dt == HR_I64 || dt == HR_I32 || dt == HR_I16 || dt == HR_I8 || dt == HR_U8;
}

static hr_status check_math_dtype(const char *op, const char *what, hr_dtype dt, bool ints_ok) {
    if (dt == HR_F32 || dt == HR_BF16 || dt == HR_F16 || (ints_ok && is_int_dtype(dt))) return HR_OK;
    if (!ints_ok && is_int_dtype(dt))
        return hr_error(HR_ERR_DTYPE, "%s: %s is %s; %s needs f32, bf16 or f16 (cast first)", op, what,
                        hr_dtype_name(dt), op);
    return hr_error(HR_ERR_DTYPE, "%s: %s is %s; %s takes f32, bf16, f16%s", op, what, hr_dtype_name(dt), op,
                    ints_ok ? " or an integer dtype (i64, i32, i16, i8, u8)" : "");
}

static hr_status check_dtype_attr(const char *op, int64_t dt) {
    if (dt == HR_F8_E4M3)
        return hr_error(HR_ERR_DTYPE, "%s: f8_e4m3 is read (the Hub's FP8 weights), not written", op);
    if (dt >= 0 && dt < HR_DTYPE_COUNT) return HR_OK;
    return hr_error(HR_ERR_INVALID_ARG, "%s: dtype attribute %lld is not a hubrt dtype", op, (long long)dt);
}

static hr_status need_attrs(const char *op, const void *attrs) {
    return attrs ? HR_OK : hr_error(HR_ERR_INVALID_ARG, "%s: attrs are required", op);
}

static hr_status check_gelu_attrs(const char *op, const hr_attrs_gelu *a) {
    HR_TRY(need_attrs(op, a));
    if (a->approximate != HR_GELU_ERF && a->approximate != HR_GELU_TANH)
        return hr_error(HR_ERR_INVALID_ARG, "%s: approximate must be 0 (erf) or 1 (tanh), got %lld", op,
                        (long long)a->approximate);
    return HR_OK;
}

/* ---- binary ----------------------------------------------------------- */

static hr_status infer_binary(const char *op, bool ints_ok, const hr_tensor *const *in, hr_tensor_meta *out) {
    hr_dtype dt;
    HR_TRY(hr_binary_dtype(op, in[0], in[1], &dt));
    HR_TRY(check_math_dtype(op, "the inputs' dtype", dt, ints_ok));
    HR_TRY(hr_broadcast_shapes(op, in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape, &out->ndim,
                               out->shape));
    out->dtype = dt;
    return HR_OK;
}

#define INFER_BINARY(name, INTS)                                                                  \
    static hr_status infer_##name(const void *attrs, const hr_tensor *const *in, int n_in,        \
                                  hr_tensor_meta *out, int n_out) {                               \
        return infer_binary(#name, INTS, in, out);                                                \
    }
INFER_BINARY(add, true)
INFER_BINARY(sub, true)
INFER_BINARY(mul, true)
INFER_BINARY(maximum, true)
INFER_BINARY(minimum, true)
INFER_BINARY(div, false)
INFER_BINARY(pow, false)
INFER_BINARY(silu_mul, false)

static hr_status infer_gelu_mul(const void *attrs, const hr_tensor *const *in, int n_in,
                                hr_tensor_meta *out, int n_out) {
    HR_TRY(check_gelu_attrs("gelu_mul", attrs));
    return infer_binary("gelu_mul", false, in, out);
}

/* ---- unary ------------------------------------------------------------ */

static hr_status infer_unary(const char *op, bool ints_ok, const hr_tensor *const *in, hr_tensor_meta *out) {
    HR_TRY(check_math_dtype(op, "input 0", in[0]->dtype, ints_ok));
    hr_meta_of(in[0], out);
    return HR_OK;
}

#define INFER_UNARY(name, INTS)                                                                   \
    static hr_status infer_##name(const void *attrs, const hr_tensor *const *in, int n_in,        \
                                  hr_tensor_meta *out, int n_out) {                               \
        return infer_unary(#name, INTS, in, out);                                                 \
    }
INFER_UNARY(neg, true)
INFER_UNARY(abs, true)
INFER_UNARY(relu, true)
INFER_UNARY(exp, false)
INFER_UNARY(log, false)
INFER_UNARY(sqrt, false)
INFER_UNARY(rsqrt, false)
INFER_UNARY(sigmoid, false)
INFER_UNARY(tanh, false)
INFER_UNARY(silu, false)

static hr_status infer_gelu(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                            int n_out) {
    HR_TRY(check_gelu_attrs("gelu", attrs));
    return infer_unary("gelu", false, in, out);
}

static hr_status infer_clamp(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                             int n_out) {
    HR_TRY(need_attrs("clamp", attrs));
    return infer_unary("clamp", true, in, out);
}

static hr_status infer_scale(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                             int n_out) {
    HR_TRY(need_attrs("scale", attrs));
    return infer_unary("scale", false, in, out);
}

/* ---- where, copy, cast -------------------------------------------------- */

static hr_status infer_where(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                             int n_out) {
    if (in[0]->dtype != HR_BOOL && in[0]->dtype != HR_U8)
        return hr_error(HR_ERR_DTYPE, "where: input 0 (cond) must be bool or u8, got %s",
                        hr_dtype_name(in[0]->dtype));
    HR_TRY(hr_binary_dtype("where", in[1], in[2], &out->dtype));
    int n;
    int64_t shape[HR_MAX_DIMS];
    HR_TRY(hr_broadcast_shapes("where", in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape, &n, shape));
    return hr_broadcast_shapes("where", n, shape, in[2]->ndim, in[2]->shape, &out->ndim, out->shape);
}

static hr_status infer_copy(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                            int n_out) {
    hr_meta_of(in[0], out);
    return HR_OK;
}

static hr_status infer_cast(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                            int n_out) {
    const hr_attrs_cast *a = attrs;
    HR_TRY(need_attrs("cast", attrs));
    HR_TRY(check_dtype_attr("cast", a->dtype));
    hr_meta_of(in[0], out);
    out->dtype = (hr_dtype)a->dtype;
    return HR_OK;
}

/* ---- fill, arange ------------------------------------------------------- */

static hr_status infer_fill(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                            int n_out) {
    const hr_attrs_fill *a = attrs;
    HR_TRY(need_attrs("fill", attrs));
    HR_TRY(check_dtype_attr("fill", a->dtype));
    if (a->shape.n < 0 || a->shape.n > HR_MAX_DIMS)
        return hr_error(HR_ERR_SHAPE, "fill: shape has %lld dims; at most %d allowed", (long long)a->shape.n,
                        HR_MAX_DIMS);
    for (int64_t d = 0; d < a->shape.n; d++)
        if (a->shape.v[d] < 0)
            return hr_error(HR_ERR_SHAPE, "fill: shape dim %lld is negative (%lld)", (long long)d,
                            (long long)a->shape.v[d]);
    out->dtype = (hr_dtype)a->dtype;
    out->ndim = (int)a->shape.n;
    for (int d = 0; d < out->ndim; d++) out->shape[d] = a->shape.v[d];
    return HR_OK;
}

/* torch: length ceil((end - start) / step), computed in double. */
static hr_status infer_arange(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                              int n_out) {
    const hr_attrs_arange *a = attrs;
    HR_TRY(need_attrs("arange", attrs));
    HR_TRY(check_dtype_attr("arange", a->dtype));
    if (a->dtype == HR_BOOL) return hr_error(HR_ERR_DTYPE, "arange: dtype bool is not supported");
    if (!isfinite(a->start) || !isfinite(a->end) || !isfinite(a->step))
        return hr_error(HR_ERR_INVALID_ARG, "arange: start %g, end %g and step %g must be finite", a->start,
                        a->end, a->step);
    if (a->step == 0) return hr_error(HR_ERR_INVALID_ARG, "arange: step must be nonzero");
    if ((a->end - a->start) * a->step < 0)
        return hr_error(HR_ERR_INVALID_ARG, "arange: step %g has the wrong sign to go from %g to %g", a->step,
                        a->start, a->end);
    double len = ceil((a->end - a->start) / a->step);
    if (len > 9.0e18) return hr_error(HR_ERR_INVALID_ARG, "arange: %g elements is too many", len);
    out->dtype = (hr_dtype)a->dtype;
    out->ndim = 1;
    out->shape[0] = (int64_t)len;
    return HR_OK;
}

void hr_infer_register_eltwise(hr_infer_fn *table) {
    table[HR_OP_add] = infer_add;
    table[HR_OP_sub] = infer_sub;
    table[HR_OP_mul] = infer_mul;
    table[HR_OP_div] = infer_div;
    table[HR_OP_pow] = infer_pow;
    table[HR_OP_maximum] = infer_maximum;
    table[HR_OP_minimum] = infer_minimum;
    table[HR_OP_silu_mul] = infer_silu_mul;
    table[HR_OP_gelu_mul] = infer_gelu_mul;
    table[HR_OP_neg] = infer_neg;
    table[HR_OP_exp] = infer_exp;
    table[HR_OP_log] = infer_log;
    table[HR_OP_sqrt] = infer_sqrt;
    table[HR_OP_rsqrt] = infer_rsqrt;
    table[HR_OP_abs] = infer_abs;
    table[HR_OP_relu] = infer_relu;
    table[HR_OP_sigmoid] = infer_sigmoid;
    table[HR_OP_tanh] = infer_tanh;
    table[HR_OP_silu] = infer_silu;
    table[HR_OP_gelu] = infer_gelu;
    table[HR_OP_clamp] = infer_clamp;
    table[HR_OP_scale] = infer_scale;
    table[HR_OP_where] = infer_where;
    table[HR_OP_copy] = infer_copy;
    table[HR_OP_cast] = infer_cast;
    table[HR_OP_fill] = infer_fill;
    table[HR_OP_arange] = infer_arange;
}
