/* StableHLO lowerings of the nn ops: rms_norm, layer_norm, rope_cos_sin,
 * rope. They compute in f32 and round where the cpu kernels (and
 * transformers) round, so bf16 results agree with them. */
#include <stdio.h>

#include "backends/pjrt/shlo.h"
#include "core/error.h"

/* v (f32) rounded to dt's precision, kept in f32. */
static hr_shlo_value round_to(hr_shlo_builder *b, hr_shlo_value v, hr_dtype dt) {
    if (dt == v.dt || !hr_dtype_is_float(dt)) return v;
    return hr_shlo_convert(b, hr_shlo_convert(b, v, dt), v.dt);
}

/* mean over the last dim, kept as size 1 and broadcast back to v's shape. */
static hr_shlo_value row_mean(hr_shlo_builder *b, hr_shlo_value v) {
    bool dims[HR_MAX_DIMS] = {0};
    dims[v.ndim - 1] = true;
    hr_shlo_value s = hr_shlo_reduce(b, v, hr_shlo_const(b, v.dt, 0), "add", dims);
    s = hr_shlo_binary(b, "divide", s, hr_shlo_splat(b, v.dt, (double)v.shape[v.ndim - 1], s.ndim, s.shape));
    int64_t keep[HR_MAX_DIMS];
    for (int i = 0; i < v.ndim; i++) keep[i] = i == v.ndim - 1 ? 1 : v.shape[i];
    return hr_shlo_bcast(b, hr_shlo_reshape(b, s, v.ndim, keep), v.ndim, v.shape);
}

static hr_status lower_norm(bool rms, hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                            const hr_tensor_meta *m, hr_shlo_value *out) {
    static const hr_attrs_norm none = {0};
    const hr_attrs_norm *a = attrs ? attrs : &none;
    hr_shlo_value x = hr_shlo_up(b, in[0]);
    if (!rms) x = hr_shlo_binary(b, "subtract", x, row_mean(b, x));
    hr_shlo_value ms = row_mean(b, hr_shlo_binary(b, "multiply", x, x));
    hr_shlo_value eps = hr_shlo_splat(b, x.dt, (double)(float)a->eps, x.ndim, x.shape);
    hr_shlo_value y = hr_shlo_binary(b, "multiply", x, hr_shlo_unary(b, "rsqrt", hr_shlo_binary(b, "add", ms, eps)));
    if (n_in > 1) {
        hr_shlo_value w = hr_shlo_bcast(b, hr_shlo_convert(b, in[1], x.dt), x.ndim, x.shape);
        if (rms && a->weight_offset == 0) /* LlamaRMSNorm: back to x's dtype, then times weight */
            y = round_to(b, y, in[0].dt);
        else
            w = hr_shlo_binary(b, "add", w, hr_shlo_splat(b, x.dt, (double)(float)a->weight_offset, x.ndim, x.shape));
        y = hr_shlo_binary(b, "multiply", y, w);
    }
    if (n_in > 2) y = hr_shlo_binary(b, "add", y, hr_shlo_bcast(b, hr_shlo_convert(b, in[2], x.dt), x.ndim, x.shape));
    out[0] = hr_shlo_convert(b, y, m->dtype);
    return b->status;
}

static hr_status lower_rms_norm(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    return lower_norm(true, b, attrs, in, n_in, m, out);
}

/* sum = x + residual rounded to their dtype (out[1]), then rms_norm of
 * that sum (out[0]), as the cpu kernel. */
static hr_status lower_add_rms_norm(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                    const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    hr_shlo_value sum = hr_shlo_binary(b, "add", hr_shlo_up(b, in[0]), hr_shlo_up(b, in[1]));
    out[1] = hr_shlo_convert(b, sum, m[1].dtype);
    hr_shlo_value xw[2] = {out[1], n_in > 2 ? in[2] : out[1]};
    return lower_norm(true, b, attrs, xw, n_in - 1, &m[0], &out[0]);
}

static hr_status lower_layer_norm(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                  const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    return lower_norm(false, b, attrs, in, n_in, m, out);
}

/* positions [..., s], inv_freq [h] -> cos, sin [..., s, 2h]: the HF layout
 * cat(freqs, freqs) with freqs = f32(position) * inv_freq in f32. */
static hr_status lower_rope_cos_sin(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                    const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_rope_cos_sin *a = attrs;
    hr_shlo_value pos = hr_shlo_convert(b, in[0], HR_F32), inv = hr_shlo_convert(b, in[1], HR_F32);
    int64_t h = inv.shape[0], shape[HR_MAX_DIMS];
    int nd = pos.ndim + 1, dims[HR_MAX_DIMS], last = nd - 1;
    for (int i = 0; i < pos.ndim; i++) shape[i] = pos.shape[i], dims[i] = i;
    shape[last] = h;
    hr_shlo_value freqs = hr_shlo_binary(b, "multiply", hr_shlo_bcast_dims(b, pos, dims, nd, shape),
                                         hr_shlo_bcast_dims(b, inv, &last, nd, shape));
    double scale = a && a->attention_scaling != 0 ? (double)(float)a->attention_scaling : 1.0;
    const char *fn[2] = {"cosine", "sine"};
    for (int k = 0; k < 2; k++) {
        hr_shlo_value v = hr_shlo_unary(b, fn[k], freqs);
        if (scale != 1.0) v = hr_shlo_binary(b, "multiply", v, hr_shlo_splat(b, HR_F32, scale, nd, shape));
        hr_shlo_value both[2] = {v, v};
        hr_shlo_value c = hr_shlo_concat(b, both, 2, last, HR_F32, m[k].ndim, m[k].shape);
        out[k] = hr_shlo_convert(b, c, m[k].dtype);
    }
    return b->status;
}

/* The last dim of v sliced to [lo, hi). */
static hr_shlo_value last_slice(hr_shlo_builder *b, hr_shlo_value v, int64_t lo, int64_t hi) {
    int64_t start[HR_MAX_DIMS] = {0}, limit[HR_MAX_DIMS];
    for (int i = 0; i < v.ndim; i++) limit[i] = v.shape[i];
    start[v.ndim - 1] = lo;
    limit[v.ndim - 1] = hi;
    return hr_shlo_slice(b, v, start, limit, NULL);
}

/* HF rotate-half on x[..., :rot]: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2,
 * each product rounded to the dtype torch multiplies in. */
static hr_status lower_rope(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                            const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    hr_shlo_value x = hr_shlo_convert(b, in[0], HR_F32);
    hr_dtype mid = in[1].dt == in[0].dt ? in[0].dt : HR_F32;
    int64_t d = x.shape[x.ndim - 1], rot = in[1].shape[in[1].ndim - 1], half = rot / 2;
    int64_t cshape[HR_MAX_DIMS];
    for (int i = 0; i < x.ndim; i++) cshape[i] = i == x.ndim - 1 ? rot : x.shape[i];
    hr_shlo_value c = hr_shlo_bcast(b, hr_shlo_convert(b, in[1], HR_F32), x.ndim, cshape);
    hr_shlo_value s = hr_shlo_bcast(b, hr_shlo_convert(b, in[2], HR_F32), x.ndim, cshape);
    hr_shlo_value x1 = last_slice(b, x, 0, half), x2 = last_slice(b, x, half, rot);
    hr_shlo_value c1 = last_slice(b, c, 0, half), c2 = last_slice(b, c, half, rot);
    hr_shlo_value s1 = last_slice(b, s, 0, half), s2 = last_slice(b, s, half, rot);
    hr_shlo_value minus_x2 = hr_shlo_unary(b, "negate", x2);
    hr_shlo_value y1 = hr_shlo_binary(b, "add", round_to(b, hr_shlo_binary(b, "multiply", c1, x1), mid),
                                      round_to(b, hr_shlo_binary(b, "multiply", s1, minus_x2), mid));
    hr_shlo_value y2 = hr_shlo_binary(b, "add", round_to(b, hr_shlo_binary(b, "multiply", c2, x2), mid),
                                      round_to(b, hr_shlo_binary(b, "multiply", s2, x1), mid));
    hr_shlo_value parts[3] = {y1, y2, last_slice(b, x, rot, d)};
    hr_shlo_value y = hr_shlo_concat(b, parts, rot < d ? 3 : 2, x.ndim - 1, HR_F32, x.ndim, x.shape);
    out[0] = hr_shlo_convert(b, y, m->dtype);
    return b->status;
}

void hr_shlo_register_nn(hr_shlo_lowering *t) {
    t[HR_OP_rms_norm].lower = lower_rms_norm;
    t[HR_OP_add_rms_norm].lower = lower_add_rms_norm;
    t[HR_OP_layer_norm].lower = lower_layer_norm;
    t[HR_OP_rope_cos_sin].lower = lower_rope_cos_sin;
    t[HR_OP_rope].lower = lower_rope;
}
