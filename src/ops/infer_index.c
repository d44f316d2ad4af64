/* Shape and dtype inference for the index ops. Index values are data:
 * their range is checked by the kernels, which name the bad value. */
#include "core/error.h"
#include "ops/op_impl.h"

static hr_status need_attrs(const char *op, const void *attrs) {
    return attrs ? HR_OK : hr_error(HR_ERR_INVALID_ARG, "%s: attrs are required", op);
}

/* An index list along one dim is 1-D, or 0-D meaning one entry. */
static hr_status check_index_list(const char *op, const hr_tensor *index) {
    HR_TRY(hr_require_index(op, "index", index));
    if (index->ndim > 1) {
        char s[160];
        return hr_error(HR_ERR_SHAPE, "%s: index must be 0-D or 1-D, got %s", op,
                        hr_shape_str(index->ndim, index->shape, s, sizeof s));
    }
    return HR_OK;
}

static int64_t index_len(const hr_tensor *index) { return index->ndim ? index->shape[0] : 1; }

/* embedding(weight [V, H], ids [...]) -> [..., H] */
static hr_status infer_embedding(const void *attrs, const hr_tensor *const *in, int n_in,
                                 hr_tensor_meta *out, int n_out) {
    const hr_tensor *w = in[0], *ids = in[1];
    if (w->ndim != 2) {
        char s[160];
        return hr_error(HR_ERR_SHAPE, "embedding: weight must be 2-D [vocab, hidden], got %s",
                        hr_shape_str(w->ndim, w->shape, s, sizeof s));
    }
    HR_TRY(hr_require_index("embedding", "ids", ids));
    const hr_attrs_embedding *a = attrs;
    if (a && a->sharded && a->first < 0)
        return hr_error(HR_ERR_INVALID_ARG, "embedding: first row %lld of a sharded table is negative",
                        (long long)a->first);
    if (ids->ndim >= HR_MAX_DIMS)
        return hr_error(HR_ERR_SHAPE, "embedding: ids have %d dims; at most %d allowed", ids->ndim,
                        HR_MAX_DIMS - 1);
    hr_meta_of(ids, out);
    /* a block-quantized table's rows come out dequantized to f32 */
    out->dtype = hr_dtype_is_quantized(w->dtype) ? HR_F32 : w->dtype;
    out->shape[out->ndim++] = w->shape[1];
    return HR_OK;
}

static hr_status infer_index_select(const void *attrs, const hr_tensor *const *in, int n_in,
                                    hr_tensor_meta *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    HR_TRY(need_attrs("index_select", attrs));
    int dim;
    HR_TRY(hr_norm_dim(a->dim, in[0]->ndim, "index_select", &dim));
    HR_TRY(check_index_list("index_select", in[1]));
    hr_meta_of(in[0], out);
    out->shape[dim] = index_len(in[1]);
    return HR_OK;
}

/* torch.gather: index has x's rank and fits inside x off `dim`; the
 * result has index's shape. */
static hr_status infer_gather(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                              int n_out) {
    const hr_attrs_dim *a = attrs;
    const hr_tensor *x = in[0], *index = in[1];
    HR_TRY(need_attrs("gather", attrs));
    HR_TRY(hr_require_index("gather", "index", index));
    int dim = 0;
    if (x->ndim > 0 || (a->dim != 0 && a->dim != -1)) HR_TRY(hr_norm_dim(a->dim, x->ndim, "gather", &dim));
    char sx[160], si[160];
    if (index->ndim != x->ndim)
        return hr_error(HR_ERR_SHAPE, "gather: index %s must have the rank of input %s",
                        hr_shape_str(index->ndim, index->shape, si, sizeof si),
                        hr_shape_str(x->ndim, x->shape, sx, sizeof sx));
    for (int d = 0; d < x->ndim; d++)
        if (d != dim && index->shape[d] > x->shape[d])
            return hr_error(HR_ERR_SHAPE, "gather: index %s is larger than input %s at dim %d",
                            hr_shape_str(index->ndim, index->shape, si, sizeof si),
                            hr_shape_str(x->ndim, x->shape, sx, sizeof sx), d);
    hr_meta_of(index, out);
    out->dtype = x->dtype;
    return HR_OK;
}

/* index_copy(dst, index, src; dim) -> dst with dst[.., index[i], ..] = src[.., i, ..] */
static hr_status infer_index_copy(const void *attrs, const hr_tensor *const *in, int n_in,
                                  hr_tensor_meta *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    const hr_tensor *dst = in[0], *index = in[1], *src = in[2];
    HR_TRY(need_attrs("index_copy", attrs));
    int dim;
    HR_TRY(hr_norm_dim(a->dim, dst->ndim, "index_copy", &dim));
    HR_TRY(check_index_list("index_copy", index));
    if (src->dtype != dst->dtype)
        return hr_error(HR_ERR_DTYPE, "index_copy: src is %s but dst is %s", hr_dtype_name(src->dtype),
                        hr_dtype_name(dst->dtype));
    bool ok = src->ndim == dst->ndim && src->shape[dim] == index_len(index);
    for (int d = 0; ok && d < dst->ndim; d++) ok = d == dim || src->shape[d] == dst->shape[d];
    if (!ok) {
        char sd[160], ss[160];
        return hr_error(HR_ERR_SHAPE,
                        "index_copy: src %s must match dst %s except at dim %d, where it must equal the "
                        "index length %lld",
                        hr_shape_str(src->ndim, src->shape, ss, sizeof ss),
                        hr_shape_str(dst->ndim, dst->shape, sd, sizeof sd), dim, (long long)index_len(index));
    }
    hr_meta_of(dst, out);
    return HR_OK;
}

static hr_status infer_cat(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                           int n_out) {
    const hr_attrs_dim *a = attrs;
    HR_TRY(need_attrs("cat", attrs));
    const hr_tensor *x0 = in[0];
    if (x0->ndim == 0) return hr_error(HR_ERR_SHAPE, "cat: input 0 is 0-dim and cannot be concatenated");
    int dim;
    HR_TRY(hr_norm_dim(a->dim, x0->ndim, "cat", &dim));
    hr_meta_of(x0, out);
    for (int k = 1; k < n_in; k++) {
        const hr_tensor *x = in[k];
        if (x->dtype != x0->dtype)
            return hr_error(HR_ERR_DTYPE, "cat: input %d is %s but input 0 is %s", k, hr_dtype_name(x->dtype),
                            hr_dtype_name(x0->dtype));
        bool ok = x->ndim == x0->ndim;
        for (int d = 0; ok && d < x0->ndim; d++) ok = d == dim || x->shape[d] == x0->shape[d];
        if (!ok) {
            char s0[160], sk[160];
            return hr_error(HR_ERR_SHAPE, "cat: input %d %s does not match input 0 %s outside dim %d", k,
                            hr_shape_str(x->ndim, x->shape, sk, sizeof sk),
                            hr_shape_str(x0->ndim, x0->shape, s0, sizeof s0), dim);
        }
        out->shape[dim] += x->shape[dim];
    }
    return HR_OK;
}

void hr_infer_register_index(hr_infer_fn *table) {
    table[HR_OP_embedding] = infer_embedding;
    table[HR_OP_index_select] = infer_index_select;
    table[HR_OP_gather] = infer_gather;
    table[HR_OP_index_copy] = infer_index_copy;
    table[HR_OP_cat] = infer_cat;
}
