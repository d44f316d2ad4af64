/* Shape and dtype inference for the image ops: conv2d, group_norm and
 * upsample_nearest, all on NCHW tensors as torch lays them out. dispatch
 * prefixes "op 'name': " to every message. */
#include "core/error.h"
#include "ops/op_impl.h"

static const hr_attrs_conv2d conv_default = {1, 1, 0, 0, 1, 1, 1};

/* The output extent of one spatial dim, or -1 when the window does not fit. */
static int64_t conv_extent(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
    int64_t span = dil * (k - 1) + 1, padded = in + 2 * pad;
    return padded < span ? -1 : (padded - span) / stride + 1;
}

static hr_status infer_conv2d(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                              int n_out) {
    const hr_attrs_conv2d *a = attrs ? attrs : &conv_default;
    const hr_tensor *x = in[0], *w = in[1];
    char sx[160], sw[160];
    HR_TRY(hr_require_float("conv2d", "x", x));
    HR_TRY(hr_require_float("conv2d", "weight", w));
    if (w->dtype != x->dtype)
        return hr_error(HR_ERR_DTYPE, "weight %s must have x's dtype %s", hr_dtype_name(w->dtype),
                        hr_dtype_name(x->dtype));
    if (x->ndim != 4 || w->ndim != 4)
        return hr_error(HR_ERR_SHAPE, "x %s must be [n, c, h, w] and weight %s [o, c / groups, kh, kw]",
                        hr_shape_str(x->ndim, x->shape, sx, sizeof sx), hr_shape_str(w->ndim, w->shape, sw, sizeof sw));
    if (a->stride_h < 1 || a->stride_w < 1 || a->dilation_h < 1 || a->dilation_w < 1 || a->pad_h < 0 ||
        a->pad_w < 0 || a->groups < 1)
        return hr_error(HR_ERR_INVALID_ARG,
                        "stride (%lld, %lld) and dilation (%lld, %lld) must be >= 1, padding (%lld, %lld) >= 0, "
                        "groups %lld >= 1",
                        (long long)a->stride_h, (long long)a->stride_w, (long long)a->dilation_h,
                        (long long)a->dilation_w, (long long)a->pad_h, (long long)a->pad_w, (long long)a->groups);
    int64_t c = x->shape[1], o = w->shape[0];
    if (c % a->groups || o % a->groups || w->shape[1] * a->groups != c)
        return hr_error(HR_ERR_SHAPE, "weight %s does not fit x %s in %lld groups (channels %lld and %lld must "
                        "divide by groups, weight dim 1 = channels / groups)",
                        hr_shape_str(w->ndim, w->shape, sw, sizeof sw), hr_shape_str(x->ndim, x->shape, sx, sizeof sx),
                        (long long)a->groups, (long long)c, (long long)o);
    int64_t ho = conv_extent(x->shape[2], w->shape[2], a->stride_h, a->pad_h, a->dilation_h);
    int64_t wo = conv_extent(x->shape[3], w->shape[3], a->stride_w, a->pad_w, a->dilation_w);
    if (ho < 1 || wo < 1 || w->shape[2] < 1 || w->shape[3] < 1)
        return hr_error(HR_ERR_SHAPE, "kernel %s does not fit the padded input %s",
                        hr_shape_str(w->ndim, w->shape, sw, sizeof sw), hr_shape_str(x->ndim, x->shape, sx, sizeof sx));
    if (n_in > 2) {
        const hr_tensor *b = in[2];
        HR_TRY(hr_require_float("conv2d", "bias", b));
        if (b->ndim != 1 || b->shape[0] != o)
            return hr_error(HR_ERR_SHAPE, "bias %s != [%lld], the output channels",
                            hr_shape_str(b->ndim, b->shape, sw, sizeof sw), (long long)o);
    }
    *out = (hr_tensor_meta){.dtype = x->dtype, .ndim = 4, .shape = {x->shape[0], o, ho, wo}};
    return HR_OK;
}

static hr_status infer_group_norm(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                                  int n_out) {
    static const char *const what[] = {"x", "weight", "bias"};
    const hr_attrs_group_norm *a = attrs;
    const hr_tensor *x = in[0];
    char sx[160], sw[160];
    HR_TRY(hr_require_float("group_norm", "x", x));
    if (x->ndim < 2)
        return hr_error(HR_ERR_SHAPE, "x %s must be [n, c, ...]", hr_shape_str(x->ndim, x->shape, sx, sizeof sx));
    int64_t c = x->shape[1], g = a ? a->groups : 0;
    if (g < 1 || c % g)
        return hr_error(HR_ERR_SHAPE, "groups %lld must be >= 1 and divide the %lld channels of x %s", (long long)g,
                        (long long)c, hr_shape_str(x->ndim, x->shape, sx, sizeof sx));
    for (int i = 1; i < n_in; i++) {
        HR_TRY(hr_require_float("group_norm", what[i], in[i]));
        if (in[i]->ndim != 1 || in[i]->shape[0] != c)
            return hr_error(HR_ERR_SHAPE, "%s %s != [%lld], the channels of x", what[i],
                            hr_shape_str(in[i]->ndim, in[i]->shape, sw, sizeof sw), (long long)c);
    }
    hr_meta_of(x, out);
    return HR_OK;
}

static hr_status infer_upsample_nearest(const void *attrs, const hr_tensor *const *in, int n_in,
                                        hr_tensor_meta *out, int n_out) {
    const hr_attrs_upsample *a = attrs;
    const hr_tensor *x = in[0];
    char sx[160];
    if (x->ndim != 4)
        return hr_error(HR_ERR_SHAPE, "x %s must be [n, c, h, w]", hr_shape_str(x->ndim, x->shape, sx, sizeof sx));
    int64_t s = a ? a->scale : 0;
    if (s < 1 || s > 64) return hr_error(HR_ERR_INVALID_ARG, "scale %lld must be in [1, 64]", (long long)s);
    hr_meta_of(x, out);
    out->shape[2] *= s;
    out->shape[3] *= s;
    return HR_OK;
}

void hr_infer_register_image(hr_infer_fn *table) {
    table[HR_OP_conv2d] = infer_conv2d;
    table[HR_OP_group_norm] = infer_group_norm;
    table[HR_OP_upsample_nearest] = infer_upsample_nearest;
}
