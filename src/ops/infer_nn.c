/* Shape and dtype inference for the nn ops: rms_norm, add_rms_norm,
 * layer_norm, rope_cos_sin and rope (sdpa has its own file). dispatch prefixes
 * "op 'name': " to every message. */
#include "core/error.h"
#include "ops/op_impl.h"

/* Norm inputs: x [..., h] floating; optional weight/bias [h], floating. */
static hr_status infer_norm(const char *op, const hr_tensor *const *in, int n_in, hr_tensor_meta *out) {
    static const char *const what[] = {"x", "weight", "bias"};
    const hr_tensor *x = in[0];
    HR_TRY(hr_require_float(op, "x", x));
    if (x->ndim < 1) return hr_error(HR_ERR_SHAPE, "x must have at least 1 dim (the normalized one), got 0-dim");
    int64_t h = x->shape[x->ndim - 1];
    for (int i = 1; i < n_in; i++) {
        const hr_tensor *w = in[i];
        HR_TRY(hr_require_float(op, what[i], w));
        if (w->ndim != 1 || w->shape[0] != h) {
            char sw[160], sx[160];
            return hr_error(HR_ERR_SHAPE, "%s shape %s != [%lld], the last dim of x %s", what[i],
                            hr_shape_str(w->ndim, w->shape, sw, sizeof sw), (long long)h,
                            hr_shape_str(x->ndim, x->shape, sx, sizeof sx));
        }
    }
    hr_meta_of(x, out);
    return HR_OK;
}

static hr_status infer_rms_norm(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                                int n_out) {
    return infer_norm("rms_norm", in, n_in, out);
}

/* x, residual [..., h] of one shape and dtype; optional weight [h]
 * -> normed, sum [..., h] in that dtype. */
static hr_status infer_add_rms_norm(const void *attrs, const hr_tensor *const *in, int n_in,
                                    hr_tensor_meta *out, int n_out) {
    const hr_tensor *x = in[0], *r = in[1];
    HR_TRY(hr_require_float("add_rms_norm", "x", x));
    HR_TRY(hr_require_float("add_rms_norm", "residual", r));
    bool same = x->ndim == r->ndim && x->dtype == r->dtype;
    for (int i = 0; same && i < x->ndim; i++) same = x->shape[i] == r->shape[i];
    if (!same) {
        char sx[160], sr[160];
        return hr_error(HR_ERR_SHAPE, "residual %s %s must have the shape and dtype of x %s %s",
                        hr_shape_str(r->ndim, r->shape, sr, sizeof sr), hr_dtype_name(r->dtype),
                        hr_shape_str(x->ndim, x->shape, sx, sizeof sx), hr_dtype_name(x->dtype));
    }
    const hr_tensor *xw[2] = {x, n_in > 2 ? in[2] : NULL};
    HR_TRY(infer_norm("add_rms_norm", xw, n_in - 1, &out[0]));
    out[1] = out[0];
    return HR_OK;
}

static hr_status infer_layer_norm(const void *attrs, const hr_tensor *const *in, int n_in,
                                  hr_tensor_meta *out, int n_out) {
    return infer_norm("layer_norm", in, n_in, out);
}

/* positions [..., s] (i64/i32), inv_freq [rot/2] -> cos, sin [..., s, rot]. */
static hr_status infer_rope_cos_sin(const void *attrs, const hr_tensor *const *in, int n_in,
                                    hr_tensor_meta *out, int n_out) {
    const hr_attrs_rope_cos_sin *a = attrs;
    const hr_tensor *pos = in[0], *inv = in[1];
    hr_dtype dt = a ? (hr_dtype)a->dtype : HR_F32;
    HR_TRY(hr_require_index("rope_cos_sin", "positions", pos));
    HR_TRY(hr_require_float("rope_cos_sin", "inv_freq", inv));
    if (dt != HR_F32 && dt != HR_BF16 && dt != HR_F16)
        return hr_error(HR_ERR_DTYPE, "attrs.dtype must be f32, bf16 or f16, got %s",
                        (unsigned)dt < HR_DTYPE_COUNT ? hr_dtype_name(dt) : "an invalid dtype");
    if (inv->ndim != 1 || inv->shape[0] < 1) {
        char s[160];
        return hr_error(HR_ERR_SHAPE, "inv_freq must be 1-dim [rot/2] with rot/2 >= 1, got %s",
                        hr_shape_str(inv->ndim, inv->shape, s, sizeof s));
    }
    if (pos->ndim >= HR_MAX_DIMS)
        return hr_error(HR_ERR_SHAPE, "positions has %d dims; the result needs one more (max %d)", pos->ndim,
                        HR_MAX_DIMS);
    hr_meta_of(pos, &out[0]);
    out[0].shape[out[0].ndim++] = 2 * inv->shape[0];
    out[0].dtype = dt;
    out[1] = out[0];
    return HR_OK;
}

/* x [..., d]; cos, sin [..., rot] broadcast to x[..., :rot], rot even <= d. */
static hr_status infer_rope(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                            int n_out) {
    const hr_tensor *x = in[0], *c = in[1], *s = in[2];
    char sx[160], sc[160];
    HR_TRY(hr_require_float("rope", "x", x));
    HR_TRY(hr_require_float("rope", "cos", c));
    HR_TRY(hr_require_float("rope", "sin", s));
    if (x->ndim < 1 || c->ndim < 1)
        return hr_error(HR_ERR_SHAPE, "x %s and cos %s need at least 1 dim", hr_shape_str(x->ndim, x->shape, sx, sizeof sx),
                        hr_shape_str(c->ndim, c->shape, sc, sizeof sc));
    bool same = c->ndim == s->ndim && c->dtype == s->dtype;
    for (int i = 0; same && i < c->ndim; i++) same = c->shape[i] == s->shape[i];
    if (!same) {
        char ss[160];
        return hr_error(HR_ERR_SHAPE, "cos %s %s and sin %s %s must match", hr_shape_str(c->ndim, c->shape, sc, sizeof sc),
                        hr_dtype_name(c->dtype), hr_shape_str(s->ndim, s->shape, ss, sizeof ss), hr_dtype_name(s->dtype));
    }
    int64_t rot = c->shape[c->ndim - 1], d = x->shape[x->ndim - 1];
    if (rot < 2 || rot % 2 || rot > d)
        return hr_error(HR_ERR_SHAPE, "cos %s: the rotary dim %lld must be even, >= 2 and <= the last dim of x %s",
                        hr_shape_str(c->ndim, c->shape, sc, sizeof sc), (long long)rot,
                        hr_shape_str(x->ndim, x->shape, sx, sizeof sx));
    /* cos must broadcast to x[..., :rot] without enlarging it. */
    int64_t xr[HR_MAX_DIMS], bshape[HR_MAX_DIMS];
    int nb;
    for (int i = 0; i < x->ndim; i++) xr[i] = x->shape[i];
    xr[x->ndim - 1] = rot;
    HR_TRY(hr_broadcast_shapes("rope", x->ndim, xr, c->ndim, c->shape, &nb, bshape));
    bool fits = nb == x->ndim;
    for (int i = 0; fits && i < nb; i++) fits = bshape[i] == xr[i];
    if (!fits)
        return hr_error(HR_ERR_SHAPE, "cos %s does not broadcast to x[..., :%lld] of x %s",
                        hr_shape_str(c->ndim, c->shape, sc, sizeof sc), (long long)rot,
                        hr_shape_str(x->ndim, x->shape, sx, sizeof sx));
    hr_meta_of(x, out);
    return HR_OK;
}

void hr_infer_register_nn(hr_infer_fn *table) {
    table[HR_OP_rms_norm] = infer_rms_norm;
    table[HR_OP_add_rms_norm] = infer_add_rms_norm;
    table[HR_OP_layer_norm] = infer_layer_norm;
    table[HR_OP_rope_cos_sin] = infer_rope_cos_sin;
    table[HR_OP_rope] = infer_rope;
}
