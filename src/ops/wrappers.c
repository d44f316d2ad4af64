/* Typed wrappers over hr_op_run: each builds the attrs struct of its op. */
#include <string.h>

#include "core/error.h"
#include "ops/op_impl.h"

#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})

static hr_status run1(hr_op op, const void *attrs, const hr_tensor *const *in, int n_in,
                      hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "op '%s': out is NULL", hr_op_name(op));
    *out = NULL;
    return hr_op_run(op, attrs, in, n_in, out, 1);
}

#define BINARY_(name) \
    hr_status hr_##name(const hr_tensor *a, const hr_tensor *b, hr_tensor **out) { \
        return run1(HR_OP_##name, NULL, IN_(a, b), 2, out);                        \
    }
#define UNARY_(name) \
    hr_status hr_##name(const hr_tensor *x, hr_tensor **out) { return run1(HR_OP_##name, NULL, IN_(x), 1, out); }

BINARY_(add)
BINARY_(sub)
BINARY_(mul)
BINARY_(div)
BINARY_(pow)
BINARY_(maximum)
BINARY_(minimum)
BINARY_(silu_mul)
BINARY_(matmul)
UNARY_(neg)
UNARY_(exp)
hr_status hr_ln(const hr_tensor *x, hr_tensor **out) { return run1(HR_OP_log, NULL, IN_(x), 1, out); }
UNARY_(sqrt)
UNARY_(rsqrt)
UNARY_(abs)
UNARY_(relu)
UNARY_(sigmoid)
UNARY_(tanh)
UNARY_(silu)

hr_status hr_contiguous(const hr_tensor *x, hr_tensor **out) {
    if (x && hr_tensor_is_contiguous(x)) return hr_tensor_alias(x, out);
    return run1(HR_OP_copy, NULL, IN_(x), 1, out);
}

hr_status hr_gelu(const hr_tensor *x, hr_gelu_approx approx, hr_tensor **out) {
    hr_attrs_gelu a = {.approximate = approx};
    return run1(HR_OP_gelu, &a, IN_(x), 1, out);
}

hr_status hr_clamp(const hr_tensor *x, const double *min, const double *max, hr_tensor **out) {
    hr_attrs_clamp a = {.min = min ? *min : 0, .max = max ? *max : 0, .has_min = min, .has_max = max};
    return run1(HR_OP_clamp, &a, IN_(x), 1, out);
}

hr_status hr_scale(const hr_tensor *x, double mul, double add, hr_tensor **out) {
    hr_attrs_scale a = {.mul = mul, .add = add};
    return run1(HR_OP_scale, &a, IN_(x), 1, out);
}

hr_status hr_where(const hr_tensor *cond, const hr_tensor *a, const hr_tensor *b, hr_tensor **out) {
    return run1(HR_OP_where, NULL, IN_(cond, a, b), 3, out);
}

#define REDUCE_(name) \
    hr_status hr_##name(const hr_tensor *x, int64_t dim, bool keepdim, hr_tensor **out) { \
        hr_attrs_reduce a = {.dim = dim, .keepdim = keepdim};                             \
        return run1(HR_OP_##name, &a, IN_(x), 1, out);                                    \
    }
REDUCE_(sum)
REDUCE_(mean)
REDUCE_(max)
REDUCE_(min)
REDUCE_(argmax)

#define DIM_(name) \
    hr_status hr_##name(const hr_tensor *x, int64_t dim, hr_tensor **out) { \
        hr_attrs_dim a = {.dim = dim};                                      \
        return run1(HR_OP_##name, &a, IN_(x), 1, out);                      \
    }
DIM_(softmax)
DIM_(log_softmax)
DIM_(cumsum)

hr_status hr_topk(const hr_tensor *x, int64_t k, int64_t dim, bool largest, hr_tensor **values,
                  hr_tensor **indices) {
    if (!values || !indices) return hr_error(HR_ERR_INVALID_ARG, "op 'topk': outputs are NULL");
    hr_attrs_topk a = {.k = k, .dim = dim, .largest = largest, .sorted = true};
    hr_tensor *outs[2] = {NULL, NULL};
    hr_status s = hr_op_run(HR_OP_topk, &a, IN_(x), 1, outs, 2);
    *values = outs[0];
    *indices = outs[1];
    return s;
}

hr_status hr_linear(const hr_tensor *x, const hr_tensor *weight, const hr_tensor *bias, hr_tensor **out) {
    return run1(HR_OP_linear, NULL, IN_(x, weight, bias), bias ? 3 : 2, out);
}

hr_status hr_experts(const hr_tensor *x, const hr_tensor *weights, const hr_tensor *indices,
                     const hr_tensor *gate_up, const hr_tensor *down, const hr_tensor *gate_up_bias,
                     const hr_tensor *down_bias, const hr_attrs_experts *attrs, hr_tensor **out) {
    if ((gate_up_bias == NULL) != (down_bias == NULL))
        return hr_error(HR_ERR_INVALID_ARG, "op 'experts': give both biases or neither");
    hr_attrs_experts none = {0};
    return run1(HR_OP_experts, attrs ? attrs : &none, IN_(x, weights, indices, gate_up, down, gate_up_bias, down_bias),
                gate_up_bias ? 7 : 5, out);
}

hr_status hr_rms_norm(const hr_tensor *x, const hr_tensor *weight, double eps, double weight_offset,
                      hr_tensor **out) {
    hr_attrs_norm a = {.eps = eps, .weight_offset = weight_offset};
    return run1(HR_OP_rms_norm, &a, IN_(x, weight), weight ? 2 : 1, out);
}

hr_status hr_add_rms_norm(const hr_tensor *x, const hr_tensor *residual, const hr_tensor *weight, double eps,
                          double weight_offset, hr_tensor **out, hr_tensor **sum) {
    if (!out || !sum) return hr_error(HR_ERR_INVALID_ARG, "op 'add_rms_norm': outputs are NULL");
    hr_attrs_norm a = {.eps = eps, .weight_offset = weight_offset};
    hr_tensor *outs[2] = {NULL, NULL};
    hr_status s = hr_op_run(HR_OP_add_rms_norm, &a, IN_(x, residual, weight), weight ? 3 : 2, outs, 2);
    *out = outs[0];
    *sum = outs[1];
    return s;
}

hr_status hr_layer_norm(const hr_tensor *x, const hr_tensor *weight, const hr_tensor *bias, double eps,
                        hr_tensor **out) {
    if (bias && !weight) return hr_error(HR_ERR_INVALID_ARG, "op 'layer_norm': bias given without weight");
    hr_attrs_norm a = {.eps = eps};
    return run1(HR_OP_layer_norm, &a, IN_(x, weight, bias), bias ? 3 : weight ? 2 : 1, out);
}

hr_status hr_rope_cos_sin(const hr_tensor *positions, const hr_tensor *inv_freq, double attention_scaling,
                          hr_dtype dtype, hr_tensor **cos, hr_tensor **sin) {
    if (!cos || !sin) return hr_error(HR_ERR_INVALID_ARG, "op 'rope_cos_sin': outputs are NULL");
    hr_attrs_rope_cos_sin a = {.attention_scaling = attention_scaling, .dtype = dtype};
    hr_tensor *outs[2] = {NULL, NULL};
    hr_status s = hr_op_run(HR_OP_rope_cos_sin, &a, IN_(positions, inv_freq), 2, outs, 2);
    *cos = outs[0];
    *sin = outs[1];
    return s;
}

hr_status hr_rope(const hr_tensor *x, const hr_tensor *cos, const hr_tensor *sin, hr_tensor **out) {
    return run1(HR_OP_rope, NULL, IN_(x, cos, sin), 3, out);
}

hr_status hr_sdpa(const hr_tensor *q, const hr_tensor *k, const hr_tensor *v, const hr_tensor *mask,
                  const hr_attrs_sdpa *attrs, hr_tensor **out) {
    hr_attrs_sdpa a = {0};
    if (attrs) a = *attrs;
    if (a.sinks)
        return hr_error(HR_ERR_INVALID_ARG, "hr_sdpa: attr sinks takes a sinks input: call hr_op_run(HR_OP_sdpa, ...) "
                        "with q, k, v, [mask], sinks");
    return run1(HR_OP_sdpa, &a, IN_(q, k, v, mask), mask ? 4 : 3, out);
}

hr_status hr_embedding(const hr_tensor *weight, const hr_tensor *ids, hr_tensor **out) {
    return run1(HR_OP_embedding, NULL, IN_(weight, ids), 2, out);
}

hr_status hr_index_select(const hr_tensor *x, int64_t dim, const hr_tensor *index, hr_tensor **out) {
    hr_attrs_dim a = {.dim = dim};
    return run1(HR_OP_index_select, &a, IN_(x, index), 2, out);
}

hr_status hr_gather(const hr_tensor *x, int64_t dim, const hr_tensor *index, hr_tensor **out) {
    hr_attrs_dim a = {.dim = dim};
    return run1(HR_OP_gather, &a, IN_(x, index), 2, out);
}

hr_status hr_index_copy_(hr_tensor *dst, int64_t dim, const hr_tensor *index, const hr_tensor *src) {
    hr_attrs_dim a = {.dim = dim};
    hr_tensor *outs[1] = {dst};
    if (!dst) return hr_error(HR_ERR_INVALID_ARG, "op 'index_copy': dst is NULL");
    return hr_op_run(HR_OP_index_copy, &a, IN_(dst, index, src), 3, outs, 1);
}

hr_status hr_cat(const hr_tensor *const *xs, int n, int64_t dim, hr_tensor **out) {
    hr_attrs_dim a = {.dim = dim};
    return run1(HR_OP_cat, &a, xs, n, out);
}

hr_status hr_copy_(hr_tensor *dst, const hr_tensor *src) {
    if (!dst || !src) return hr_error(HR_ERR_INVALID_ARG, "op 'copy': NULL argument");
    hr_tensor *tmp = NULL;
    const hr_tensor *from = src;
    hr_status s = HR_OK;
    /* copy's result has src's shape and dtype; broadcast and cast first. */
    if (src->ndim != dst->ndim || memcmp(src->shape, dst->shape, sizeof(int64_t) * (size_t)dst->ndim)) {
        s = hr_tensor_expand(src, dst->ndim, dst->shape, &tmp);
        from = tmp;
    }
    if (s == HR_OK && from->dtype != dst->dtype) {
        hr_attrs_cast a = {.dtype = dst->dtype};
        hr_tensor *outs[1] = {dst};
        s = hr_op_run(HR_OP_cast, &a, IN_(from), 1, outs, 1);
    } else if (s == HR_OK) {
        hr_tensor *outs[1] = {dst};
        s = hr_op_run(HR_OP_copy, NULL, IN_(from), 1, outs, 1);
    }
    hr_tensor_free(tmp);
    return s;
}

hr_status hr_cast(const hr_tensor *x, hr_dtype dtype, hr_tensor **out) {
    hr_attrs_cast a = {.dtype = dtype};
    return run1(HR_OP_cast, &a, IN_(x), 1, out);
}

hr_status hr_fill(hr_device *dev, hr_dtype dtype, int ndim, const int64_t *shape, double value,
                  hr_tensor **out) {
    if (ndim < 0 || ndim > HR_MAX_DIMS || (ndim && !shape))
        return hr_error(HR_ERR_INVALID_ARG, "op 'fill': invalid shape");
    hr_attrs_fill a = {.shape = {.n = ndim}, .dtype = dtype, .value = value};
    if (ndim) memcpy(a.shape.v, shape, sizeof(int64_t) * (size_t)ndim);
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "op 'fill': out is NULL");
    *out = NULL;
    return hr_op_run_on(dev ? dev : hr_device_cpu(), HR_OP_fill, &a, NULL, 0, out, 1);
}

hr_status hr_arange(hr_device *dev, double start, double end, double step, hr_dtype dtype, hr_tensor **out) {
    hr_attrs_arange a = {.start = start, .end = end, .step = step, .dtype = dtype};
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "op 'arange': out is NULL");
    *out = NULL;
    return hr_op_run_on(dev ? dev : hr_device_cpu(), HR_OP_arange, &a, NULL, 0, out, 1);
}

hr_status hr_conv2d(const hr_tensor *x, const hr_tensor *weight, const hr_tensor *bias, const hr_attrs_conv2d *attrs,
                    hr_tensor **out) {
    return run1(HR_OP_conv2d, attrs, IN_(x, weight, bias), bias ? 3 : 2, out);
}

hr_status hr_group_norm(const hr_tensor *x, const hr_tensor *weight, const hr_tensor *bias, int64_t groups,
                        double eps, hr_tensor **out) {
    if (bias && !weight) return hr_error(HR_ERR_INVALID_ARG, "op 'group_norm': bias given without weight");
    hr_attrs_group_norm a = {.groups = groups, .eps = eps};
    return run1(HR_OP_group_norm, &a, IN_(x, weight, bias), bias ? 3 : weight ? 2 : 1, out);
}

hr_status hr_upsample_nearest(const hr_tensor *x, int64_t scale, hr_tensor **out) {
    hr_attrs_upsample a = {.scale = scale};
    return run1(HR_OP_upsample_nearest, &a, IN_(x), 1, out);
}
