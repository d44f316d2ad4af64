/* Shape and dtype inference for scaled dot-product attention. */
#include <math.h>

#include "core/error.h"
#include "ops/op_impl.h"

/* q [b, hq, s, d], k [b, hkv, t, d], v [b, hkv, t, dv], mask broadcastable
 * to [b, hq, s, t] (bool, or additive in q's dtype or f32) -> [b, hq, s, dv] */
static hr_status infer_sdpa(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                            int n_out) {
    bool has_sinks = attrs && ((const hr_attrs_sdpa *)attrs)->sinks;
    if (has_sinks && n_in < 4) return hr_error(HR_ERR_INVALID_ARG, "sdpa: attr sinks set but no sinks input");
    if (!has_sinks && n_in > 4)
        return hr_error(HR_ERR_INVALID_ARG, "sdpa: 5 inputs take attr sinks (q, k, v, mask, sinks)");
    const hr_tensor *q = in[0], *k = in[1], *v = in[2], *mask = n_in - has_sinks > 3 ? in[3] : NULL;
    const hr_tensor *sinks = has_sinks ? in[n_in - 1] : NULL;
    static const char *const names[] = {"input 0 (q)", "input 1 (k)", "input 2 (v)"};
    char s0[160], s1[160];
    for (int i = 0; i < 3; i++) {
        HR_TRY(hr_require_float("sdpa", names[i], in[i]));
        if (in[i]->ndim != 4)
            return hr_error(HR_ERR_SHAPE, "sdpa: %s must be 4-d [batch, heads, seq, head_dim], got %s", names[i],
                            hr_shape_str(in[i]->ndim, in[i]->shape, s0, sizeof s0));
        if (in[i]->dtype != q->dtype)
            return hr_error(HR_ERR_DTYPE, "sdpa: %s is %s but q is %s", names[i], hr_dtype_name(in[i]->dtype),
                            hr_dtype_name(q->dtype));
    }
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0])
        return hr_error(HR_ERR_SHAPE, "sdpa: batch sizes differ: q %lld, k %lld, v %lld", (long long)q->shape[0],
                        (long long)k->shape[0], (long long)v->shape[0]);
    if (k->shape[1] != v->shape[1] || k->shape[2] != v->shape[2])
        return hr_error(HR_ERR_SHAPE, "sdpa: k %s and v %s differ in heads or length",
                        hr_shape_str(4, k->shape, s0, sizeof s0), hr_shape_str(4, v->shape, s1, sizeof s1));
    if (k->shape[1] == 0 || q->shape[1] % k->shape[1] != 0)
        return hr_error(HR_ERR_SHAPE, "sdpa: q has %lld heads, not a multiple of k/v's %lld heads",
                        (long long)q->shape[1], (long long)k->shape[1]);
    if (k->shape[3] != q->shape[3])
        return hr_error(HR_ERR_SHAPE, "sdpa: q head_dim %lld != k head_dim %lld", (long long)q->shape[3],
                        (long long)k->shape[3]);
    if (mask) {
        if (mask->dtype != HR_BOOL && mask->dtype != q->dtype && mask->dtype != HR_F32)
            return hr_error(HR_ERR_DTYPE, "sdpa: input 3 (mask) must be bool, f32 or q's dtype %s, got %s",
                            hr_dtype_name(q->dtype), hr_dtype_name(mask->dtype));
        int64_t want[4] = {q->shape[0], q->shape[1], q->shape[2], k->shape[2]};
        bool ok = mask->ndim <= 4;
        for (int i = 0; ok && i < mask->ndim; i++) {
            int64_t m = mask->shape[mask->ndim - 1 - i];
            ok = m == 1 || m == want[3 - i];
        }
        if (!ok)
            return hr_error(HR_ERR_SHAPE, "sdpa: input 3 (mask) %s does not broadcast to [b, hq, s, t] = %s",
                            hr_shape_str(mask->ndim, mask->shape, s0, sizeof s0), hr_shape_str(4, want, s1, sizeof s1));
    }
    if (sinks) {
        HR_TRY(hr_require_float("sdpa", "the sinks input", sinks));
        if (sinks->ndim != 1 || sinks->shape[0] != q->shape[1])
            return hr_error(HR_ERR_SHAPE, "sdpa: the sinks input must be [%lld] (one per q head), got %s",
                            (long long)q->shape[1], hr_shape_str(sinks->ndim, sinks->shape, s0, sizeof s0));
    }
    if (attrs) {
        const hr_attrs_sdpa *a = attrs;
        if (a->window < 0) return hr_error(HR_ERR_INVALID_ARG, "sdpa: window %lld is negative", (long long)a->window);
        if (!(a->softcap >= 0) || !isfinite(a->softcap))
            return hr_error(HR_ERR_INVALID_ARG, "sdpa: softcap %g must be finite and >= 0", a->softcap);
        if (!isfinite(a->scale))
            return hr_error(HR_ERR_INVALID_ARG, "sdpa: scale %g must be finite (0 = 1/sqrt(d))", a->scale);
    }
    out->dtype = q->dtype;
    out->ndim = 4;
    out->shape[0] = q->shape[0];
    out->shape[1] = q->shape[1];
    out->shape[2] = q->shape[2];
    out->shape[3] = v->shape[3];
    return HR_OK;
}

void hr_infer_register_attention(hr_infer_fn *table) { table[HR_OP_sdpa] = infer_sdpa; }
