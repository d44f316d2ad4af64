/* Shape and dtype inference for the collectives: all_reduce keeps x's
 * shape in its attrs' dtype; all_gather joins the ranks' parts along a
 * dim; broadcast keeps x's shape and dtype. What the parts hold is data,
 * checked by the kernels (the root against the group's size). */
#include "core/error.h"
#include "ops/collective.h"
#include "ops/op_impl.h"

static hr_status infer_all_reduce(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                                  int n_out) {
    const hr_attrs_cast *a = attrs;
    if (!a) return hr_error(HR_ERR_INVALID_ARG, "all_reduce: attrs (the output dtype) are required");
    if ((unsigned)a->dtype >= HR_DTYPE_COUNT || !hr_dtype_is_float((hr_dtype)a->dtype) ||
        hr_dtype_is_quantized((hr_dtype)a->dtype))
        return hr_error(HR_ERR_DTYPE, "all_reduce: dtype %lld is not f32, bf16 or f16", (long long)a->dtype);
    const hr_tensor *x = in[0];
    if (!hr_dtype_is_float(x->dtype))
        return hr_error(HR_ERR_DTYPE, "all_reduce: x is %s; the sum is of floats", hr_dtype_name(x->dtype));
    if (n_in == 2) {
        int nd;
        int64_t sh[HR_MAX_DIMS];
        HR_TRY(hr_broadcast_shapes("all_reduce", x->ndim, x->shape, in[1]->ndim, in[1]->shape, &nd, sh));
        char a1[160], a2[160];
        if (nd != x->ndim || hr_shape_numel(nd, sh) != hr_tensor_numel(x))
            return hr_error(HR_ERR_SHAPE, "all_reduce: bias %s does not broadcast to x %s",
                            hr_shape_str(in[1]->ndim, in[1]->shape, a1, sizeof a1),
                            hr_shape_str(x->ndim, x->shape, a2, sizeof a2));
        if (!hr_dtype_is_float(in[1]->dtype))
            return hr_error(HR_ERR_DTYPE, "all_reduce: bias is %s, not a float", hr_dtype_name(in[1]->dtype));
    }
    hr_meta_of(x, out);
    out->dtype = (hr_dtype)a->dtype;
    return HR_OK;
}

static hr_status infer_all_gather(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                                  int n_out) {
    const hr_attrs_all_gather *a = attrs;
    if (!a) return hr_error(HR_ERR_INVALID_ARG, "all_gather: attrs (dim, total) are required");
    const hr_tensor *x = in[0];
    int dim;
    HR_TRY(hr_norm_dim(a->dim, x->ndim, "all_gather", &dim));
    if (a->total < x->shape[dim])
        return hr_error(HR_ERR_SHAPE, "all_gather: total %lld is less than this rank's part %lld along dim %d",
                        (long long)a->total, (long long)x->shape[dim], dim);
    if (hr_dtype_is_quantized(x->dtype))
        return hr_error(HR_ERR_DTYPE, "all_gather: x is block-quantized (%s)", hr_dtype_name(x->dtype));
    hr_meta_of(x, out);
    out->shape[dim] = a->total;
    return HR_OK;
}

static hr_status infer_broadcast(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                                 int n_out) {
    const hr_attrs_broadcast *a = attrs;
    if (!a) return hr_error(HR_ERR_INVALID_ARG, "broadcast: attrs (root) are required");
    if (a->root < 0) return hr_error(HR_ERR_INVALID_ARG, "broadcast: root %lld is negative", (long long)a->root);
    if (hr_dtype_is_quantized(in[0]->dtype))
        return hr_error(HR_ERR_DTYPE, "broadcast: x is block-quantized (%s)", hr_dtype_name(in[0]->dtype));
    hr_meta_of(in[0], out);
    return HR_OK;
}

void hr_infer_register_collective(hr_infer_fn *table) {
    table[HR_OP_broadcast] = infer_broadcast;
    table[HR_OP_all_reduce] = infer_all_reduce;
    table[HR_OP_all_gather] = infer_all_gather;
}
