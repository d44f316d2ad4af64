/* Shape and dtype inference for the mixture-of-experts op: experts (the
 * stacked experts of a layer, given the router's weights and indices). */
#include <math.h>

#include "core/error.h"
#include "ops/op_impl.h"

static const char *shape_of(const hr_tensor *t, char *buf, size_t n) { return hr_shape_str(t->ndim, t->shape, buf, n); }

/* t is [dims...] exactly; errors name the input. */
static hr_status require_shape(const char *what, const hr_tensor *t, int ndim, const int64_t *want) {
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == want[i];
    if (same) return HR_OK;
    char a[160], b[160];
    return hr_error(HR_ERR_SHAPE, "experts: %s is %s, expected %s", what, shape_of(t, a, sizeof a),
                    hr_shape_str(ndim, want, b, sizeof b));
}

static hr_status infer_experts(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                               int n_out) {
    const hr_attrs_experts *a = attrs;
    if (a && a->act != HR_EXPERTS_SILU && a->act != HR_EXPERTS_GELU_TANH && a->act != HR_EXPERTS_GPT_OSS)
        return hr_error(HR_ERR_INVALID_ARG, "experts: unknown act %lld (0 silu, 1 gelu_tanh, 2 gpt_oss)",
                        (long long)a->act);
    if (a && a->act == HR_EXPERTS_GPT_OSS && (!(a->limit > 0) || !isfinite(a->limit) || !isfinite(a->alpha)))
        return hr_error(HR_ERR_INVALID_ARG, "experts: gpt_oss needs a finite limit > 0 and a finite alpha, got %g "
                        "and %g", a->limit, a->alpha);
    if (n_in == 6) return hr_error(HR_ERR_INVALID_ARG, "experts: give both biases (gate_up_bias, down_bias) or neither");
    const hr_tensor *x = in[0], *w = in[1], *idx = in[2], *gu = in[3], *dn = in[4];
    HR_TRY(hr_require_float("experts", "input 0 (x)", x));
    HR_TRY(hr_require_float("experts", "input 1 (weights)", w));
    HR_TRY(hr_require_index("experts", "input 2 (indices)", idx));
    char sa[160], sb[160];
    if (x->ndim < 1) return hr_error(HR_ERR_SHAPE, "experts: input 0 (x) must have at least 1 dim, got 0-d");
    if (w->ndim != x->ndim)
        return hr_error(HR_ERR_SHAPE, "experts: input 1 (weights) %s must be x's %s with its last dim the top k",
                        shape_of(w, sa, sizeof sa), shape_of(x, sb, sizeof sb));
    for (int d = 0; d + 1 < x->ndim; d++)
        if (w->shape[d] != x->shape[d])
            return hr_error(HR_ERR_SHAPE, "experts: input 1 (weights) %s must be x's %s with its last dim the top k",
                            shape_of(w, sa, sizeof sa), shape_of(x, sb, sizeof sb));
    HR_TRY(require_shape("input 2 (indices)", idx, w->ndim, w->shape));
    if (gu->ndim != 3 || gu->shape[1] % 2)
        return hr_error(HR_ERR_SHAPE, "experts: input 3 (gate_up) must be [experts, 2 x intermediate, hidden], got %s",
                        shape_of(gu, sa, sizeof sa));
    int64_t e = gu->shape[0], i2 = gu->shape[1], h = x->shape[x->ndim - 1];
    HR_TRY(require_shape("input 3 (gate_up)", gu, 3, (int64_t[]){e, i2, h}));
    HR_TRY(require_shape("input 4 (down)", dn, 3, (int64_t[]){e, h, i2 / 2}));
    const char *names[] = {"input 3 (gate_up)", "input 4 (down)", "input 5 (gate_up_bias)", "input 6 (down_bias)"};
    for (int j = 3; j < n_in; j++) {
        /* the weights may be block-quantized (the CPU kernel reads them as linear does) */
        if (j <= 4 && hr_dtype_is_quantized(in[j]->dtype)) {
            if (a && a->impl)
                return hr_error(HR_ERR_UNSUPPORTED, "experts: %s is block-quantized (%s); a hub kernel takes float "
                                "weights (load with dequantize)", names[j - 3], hr_dtype_name(in[j]->dtype));
            continue;
        }
        if (in[j]->dtype != x->dtype)
            return hr_error(HR_ERR_DTYPE, "experts: %s is %s but x is %s (cast one first)", names[j - 3],
                            hr_dtype_name(in[j]->dtype), hr_dtype_name(x->dtype));
    }
    if (n_in == 7) {
        HR_TRY(require_shape("input 5 (gate_up_bias)", in[5], 2, (int64_t[]){e, i2}));
        HR_TRY(require_shape("input 6 (down_bias)", in[6], 2, (int64_t[]){e, h}));
    }
    hr_meta_of(x, out);
    return HR_OK;
}

void hr_infer_register_moe(hr_infer_fn *table) { table[HR_OP_experts] = infer_experts; }
