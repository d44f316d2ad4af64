/* Shape and dtype inference for the reduce ops: sum, mean, max, min,
 * argmax (over one dim, keepdim or not), softmax, log_softmax, cumsum
 * (same shape) and topk (dim shrunk to k, values + i64 indices).
 *
 * dtype rules follow torch: sum and cumsum of integers (and bool) give
 * i64; max/min keep the dtype; argmax gives i64; mean, softmax and
 * log_softmax need a floating input. dispatch prefixes "op 'name': ". */
#include "core/error.h"
#include "ops/op_impl.h"

static bool is_integral(hr_dtype dt) {
    return dt == HR_I64 || dt == HR_I32 || dt == HR_I16 || dt == HR_I8 || dt == HR_U8 || dt == HR_BOOL;
}

/* The reduced shape of x over `dim` into m (dtype set by the caller). A
 * 0-dim x reduces over its single element, as torch allows dim 0 / -1. */
static hr_status reduced_shape(const hr_tensor *x, int64_t dim, bool keepdim, hr_tensor_meta *m) {
    int nd = x->ndim ? x->ndim : 1;
    int d;
    HR_TRY(hr_norm_dim(dim, nd, "x", &d));
    m->ndim = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i == d && !keepdim) continue;
        m->shape[m->ndim++] = i == d ? 1 : x->shape[i];
    }
    return HR_OK;
}

static hr_status infer_reduce(hr_op op, const void *attrs, const hr_tensor *const *in, hr_tensor_meta *out) {
    const hr_attrs_reduce *a = attrs;
    const hr_tensor *x = in[0];
    if (!a) return hr_error(HR_ERR_INVALID_ARG, "attrs are NULL (dim is required)");
    int nd = x->ndim ? x->ndim : 1;
    int d;
    HR_TRY(hr_norm_dim(a->dim, nd, "x", &d));
    if (x->ndim && x->shape[d] == 0 && op != HR_OP_sum && op != HR_OP_mean) {
        char s[160];
        return hr_error(HR_ERR_SHAPE, "x %s is empty along dim %d and the op has no identity",
                        hr_shape_str(x->ndim, x->shape, s, sizeof s), d);
    }
    HR_TRY(reduced_shape(x, a->dim, a->keepdim, out));
    switch (op) {
    case HR_OP_sum: out->dtype = is_integral(x->dtype) ? HR_I64 : x->dtype; break;
    case HR_OP_mean:
        HR_TRY(hr_require_float("mean", "x", x));
        out->dtype = x->dtype;
        break;
    case HR_OP_argmax: out->dtype = HR_I64; break;
    default: out->dtype = x->dtype; break; /* max, min */
    }
    return HR_OK;
}

#define REDUCE_INFER_(name)                                                                        \
    static hr_status infer_##name(const void *attrs, const hr_tensor *const *in, int n_in,        \
                                  hr_tensor_meta *out, int n_out) {                                \
        return infer_reduce(HR_OP_##name, attrs, in, out);                                         \
    }
REDUCE_INFER_(sum)
REDUCE_INFER_(mean)
REDUCE_INFER_(max)
REDUCE_INFER_(min)
REDUCE_INFER_(argmax)

static hr_status infer_along_dim(const char *op, const void *attrs, const hr_tensor *x, bool need_float,
                                 hr_tensor_meta *out) {
    const hr_attrs_dim *a = attrs;
    if (!a) return hr_error(HR_ERR_INVALID_ARG, "attrs are NULL (dim is required)");
    int d;
    HR_TRY(hr_norm_dim(a->dim, x->ndim ? x->ndim : 1, "x", &d));
    if (need_float) HR_TRY(hr_require_float(op, "x", x));
    hr_meta_of(x, out);
    return HR_OK;
}

static hr_status infer_softmax(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                               int n_out) {
    return infer_along_dim("softmax", attrs, in[0], true, out);
}

static hr_status infer_log_softmax(const void *attrs, const hr_tensor *const *in, int n_in,
                                   hr_tensor_meta *out, int n_out) {
    return infer_along_dim("log_softmax", attrs, in[0], true, out);
}

static hr_status infer_cumsum(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                              int n_out) {
    HR_TRY(infer_along_dim("cumsum", attrs, in[0], false, out));
    if (is_integral(in[0]->dtype)) out->dtype = HR_I64;
    return HR_OK;
}

static hr_status infer_topk(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                            int n_out) {
    const hr_attrs_topk *a = attrs;
    const hr_tensor *x = in[0];
    if (!a) return hr_error(HR_ERR_INVALID_ARG, "attrs are NULL (k and dim are required)");
    int d;
    HR_TRY(hr_norm_dim(a->dim, x->ndim ? x->ndim : 1, "x", &d));
    int64_t size = x->ndim ? x->shape[d] : 1;
    if (a->k < 0 || a->k > size) {
        char s[160];
        return hr_error(HR_ERR_INVALID_ARG, "k=%lld is out of range for x %s along dim %d (size %lld)",
                        (long long)a->k, hr_shape_str(x->ndim, x->shape, s, sizeof s), d, (long long)size);
    }
    hr_meta_of(x, &out[0]);
    if (x->ndim) out[0].shape[d] = a->k;
    out[1] = out[0];
    out[1].dtype = HR_I64;
    return HR_OK;
}

void hr_infer_register_reduce(hr_infer_fn *table) {
    table[HR_OP_sum] = infer_sum;
    table[HR_OP_mean] = infer_mean;
    table[HR_OP_max] = infer_max;
    table[HR_OP_min] = infer_min;
    table[HR_OP_argmax] = infer_argmax;
    table[HR_OP_softmax] = infer_softmax;
    table[HR_OP_log_softmax] = infer_log_softmax;
    table[HR_OP_cumsum] = infer_cumsum;
    table[HR_OP_topk] = infer_topk;
}
