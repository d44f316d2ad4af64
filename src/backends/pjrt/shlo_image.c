/* StableHLO lowerings of the image ops: conv2d (stablehlo.convolution in
 * f32, bias added in f32, rounded once), group_norm (the groups' means and
 * variances by reductions in f32) and upsample_nearest (a broadcast and a
 * reshape), computing where the cpu kernels compute. */
#include <stdio.h>

#include "backends/pjrt/shlo.h"
#include "core/error.h"

static const hr_attrs_conv2d conv_default = {1, 1, 0, 0, 1, 1, 1};

static hr_status lower_conv2d(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                              const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_conv2d *a = attrs ? attrs : &conv_default;
    hr_shlo_value x = hr_shlo_convert(b, in[0], HR_F32), w = hr_shlo_convert(b, in[1], HR_F32);
    char attr[640];
    snprintf(attr, sizeof attr,
             "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>, "
             "feature_group_count = %lld : i64, lhs_dilation = array<i64: 1, 1>, "
             "padding = dense<[[%lld, %lld], [%lld, %lld]]> : tensor<2x2xi64>, rhs_dilation = array<i64: %lld, %lld>, "
             "window_strides = array<i64: %lld, %lld>",
             (long long)a->groups, (long long)a->pad_h, (long long)a->pad_h, (long long)a->pad_w, (long long)a->pad_w,
             (long long)a->dilation_h, (long long)a->dilation_w, (long long)a->stride_h, (long long)a->stride_w);
    hr_shlo_value xw[2] = {x, w};
    hr_shlo_value y = hr_shlo_op(b, "convolution", xw, 2, attr, HR_F32, m->ndim, m->shape);
    if (n_in > 2) {
        int ch = 1;
        y = hr_shlo_binary(b, "add", y, hr_shlo_bcast_dims(b, hr_shlo_convert(b, in[2], HR_F32), &ch, y.ndim, y.shape));
    }
    out[0] = hr_shlo_convert(b, y, m->dtype);
    return b->status;
}

/* mean over the last dim of v [n, g, k], broadcast back to v's shape */
static hr_shlo_value group_mean(hr_shlo_builder *b, hr_shlo_value v) {
    bool dims[HR_MAX_DIMS] = {false, false, true};
    hr_shlo_value s = hr_shlo_reduce(b, v, hr_shlo_const(b, v.dt, 0), "add", dims);
    s = hr_shlo_binary(b, "divide", s, hr_shlo_splat(b, v.dt, (double)v.shape[2], s.ndim, s.shape));
    return hr_shlo_bcast_dims(b, s, (int[]){0, 1}, 3, v.shape);
}

static hr_status lower_group_norm(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                  const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_group_norm *a = attrs;
    hr_shlo_value x = hr_shlo_convert(b, in[0], HR_F32);
    int64_t n = x.shape[0], c = x.shape[1], nc = n * c, per = nc ? hr_shape_numel(x.ndim, x.shape) / nc : 0;
    int64_t gshape[3] = {n, a->groups, c / a->groups * per};
    hr_shlo_value g = hr_shlo_reshape(b, x, 3, gshape);
    hr_shlo_value d = hr_shlo_binary(b, "subtract", g, group_mean(b, g));
    hr_shlo_value var = group_mean(b, hr_shlo_binary(b, "multiply", d, d));
    hr_shlo_value eps = hr_shlo_splat(b, HR_F32, (double)(float)a->eps, 3, gshape);
    hr_shlo_value y = hr_shlo_binary(b, "multiply", d, hr_shlo_unary(b, "rsqrt", hr_shlo_binary(b, "add", var, eps)));
    y = hr_shlo_reshape(b, y, x.ndim, x.shape);
    int ch = 1;
    if (n_in > 1)
        y = hr_shlo_binary(b, "multiply", y, hr_shlo_bcast_dims(b, hr_shlo_convert(b, in[1], HR_F32), &ch, y.ndim, y.shape));
    if (n_in > 2)
        y = hr_shlo_binary(b, "add", y, hr_shlo_bcast_dims(b, hr_shlo_convert(b, in[2], HR_F32), &ch, y.ndim, y.shape));
    out[0] = hr_shlo_convert(b, y, m->dtype);
    return b->status;
}

/* x [n, c, h, w] -> [n, c, h, s, w, s] (each pixel repeated) -> [n, c, h s, w s] */
static hr_status lower_upsample_nearest(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                        const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_upsample *a = attrs;
    hr_shlo_value x = in[0];
    int64_t big[6] = {x.shape[0], x.shape[1], x.shape[2], a->scale, x.shape[3], a->scale};
    hr_shlo_value r = hr_shlo_bcast_dims(b, x, (int[]){0, 1, 2, 4}, 6, big);
    out[0] = hr_shlo_reshape(b, r, m->ndim, m->shape);
    return b->status;
}

void hr_shlo_register_image(hr_shlo_lowering *t) {
    t[HR_OP_conv2d].lower = lower_conv2d;
    t[HR_OP_group_norm].lower = lower_group_norm;
    t[HR_OP_upsample_nearest].lower = lower_upsample_nearest;
}
