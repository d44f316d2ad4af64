/* Shape and dtype inference for the linalg ops: matmul (torch.matmul rules,
 * 1-d operands included) and linear (HF weight layout [out, in]). */
#include "core/error.h"
#include "ops/op_impl.h"

static hr_status require_same_float(const char *op, const char *what_a, const hr_tensor *a,
                                    const char *what_b, const hr_tensor *b) {
    HR_TRY(hr_require_float(op, what_a, a));
    if (a->dtype != b->dtype)
        return hr_error(HR_ERR_DTYPE, "%s: %s is %s but %s is %s (cast one first)", op, what_a,
                        hr_dtype_name(a->dtype), what_b, hr_dtype_name(b->dtype));
    return HR_OK;
}

/* torch.matmul: a 1-d left operand is a row vector, a 1-d right operand a
 * column vector, and the added dim is removed from the result; batch dims
 * (all but the last two) broadcast. */
static hr_status infer_matmul(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                              int n_out) {
    const hr_tensor *a = in[0], *b = in[1];
    HR_TRY(require_same_float("matmul", "input 0 (a)", a, "input 1 (b)", b));
    if (a->ndim < 1 || b->ndim < 1)
        return hr_error(HR_ERR_SHAPE, "matmul: both inputs need at least 1 dim, got %d-d and %d-d", a->ndim,
                        b->ndim);
    int64_t ka = a->shape[a->ndim - 1];
    int64_t kb = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
    if (ka != kb) {
        char sa[160], sb[160];
        return hr_error(HR_ERR_SHAPE, "matmul: a %s and b %s have different contraction sizes (%lld vs %lld)",
                        hr_shape_str(a->ndim, a->shape, sa, sizeof sa), hr_shape_str(b->ndim, b->shape, sb, sizeof sb),
                        (long long)ka, (long long)kb);
    }
    int nba = a->ndim > 2 ? a->ndim - 2 : 0, nbb = b->ndim > 2 ? b->ndim - 2 : 0;
    int nb;
    int64_t batch[HR_MAX_DIMS];
    HR_TRY(hr_broadcast_shapes("matmul: batch dims", nba, a->shape, nbb, b->shape, &nb, batch));
    int n = 0;
    for (int i = 0; i < nb; i++) out->shape[n++] = batch[i];
    if (a->ndim >= 2) out->shape[n++] = a->shape[a->ndim - 2];
    if (b->ndim >= 2) out->shape[n++] = b->shape[b->ndim - 1];
    out->ndim = n;
    out->dtype = a->dtype;
    return HR_OK;
}

static hr_status infer_linear(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                              int n_out) {
    const hr_tensor *x = in[0], *w = in[1], *bias = n_in > 2 ? in[2] : NULL;
    /* a block-quantized weight (kept so at load) serves any float x */
    if (hr_dtype_is_quantized(w->dtype)) HR_TRY(hr_require_float("linear", "input 0 (x)", x));
    else HR_TRY(require_same_float("linear", "input 0 (x)", x, "input 1 (weight)", w));
    if (x->ndim < 1) return hr_error(HR_ERR_SHAPE, "linear: input 0 (x) must have at least 1 dim, got 0-d");
    char sx[160], sw[160];
    if (w->ndim != 2)
        return hr_error(HR_ERR_SHAPE, "linear: input 1 (weight) must be 2-d [out, in], got %s",
                        hr_shape_str(w->ndim, w->shape, sw, sizeof sw));
    if (w->shape[1] != x->shape[x->ndim - 1])
        return hr_error(HR_ERR_SHAPE, "linear: x %s has %lld input features but weight %s expects %lld",
                        hr_shape_str(x->ndim, x->shape, sx, sizeof sx), (long long)x->shape[x->ndim - 1],
                        hr_shape_str(w->ndim, w->shape, sw, sizeof sw), (long long)w->shape[1]);
    if (bias) {
        HR_TRY(require_same_float("linear", "input 0 (x)", x, "input 2 (bias)", bias));
        if (bias->ndim != 1 || bias->shape[0] != w->shape[0])
            return hr_error(HR_ERR_SHAPE, "linear: input 2 (bias) must be [%lld], got %s", (long long)w->shape[0],
                            hr_shape_str(bias->ndim, bias->shape, sx, sizeof sx));
    }
    hr_meta_of(x, out);
    out->shape[x->ndim - 1] = w->shape[0];
    return HR_OK;
}

/* Each member is checked as linear checks its own inputs (errors name the
 * member); then the epilogue's requirements. */
static hr_status infer_linear_group(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor_meta *out,
                                    int n_out) {
    const hr_attrs_linear_group *a = attrs;
    if (!a || a->n < 1 || a->n > 3)
        return hr_error(HR_ERR_INVALID_ARG, "linear_group: n must be 1..3, got %lld", a ? (long long)a->n : 0LL);
    int n = (int)a->n;
    bool gated = a->epilogue == HR_LINEAR_SILU_MUL || a->epilogue == HR_LINEAR_GELU_TANH_MUL;
    bool residual = a->epilogue == HR_LINEAR_RESIDUAL;
    if (!gated && !residual && a->epilogue != HR_LINEAR_STORE)
        return hr_error(HR_ERR_INVALID_ARG, "linear_group: unknown epilogue %lld", (long long)a->epilogue);
    int want = 1 + n + (a->bias ? n : 0) + residual;
    if (n_in != want)
        return hr_error(HR_ERR_INVALID_ARG, "linear_group: %d linears%s%s take %d inputs, got %d", n,
                        a->bias ? " with biases" : "", residual ? " and a residual" : "", want, n_in);
    if (gated && n != 2) return hr_error(HR_ERR_INVALID_ARG, "linear_group: a gated epilogue takes 2 linears, got %d", n);
    if (residual && n != 1)
        return hr_error(HR_ERR_INVALID_ARG, "linear_group: the residual epilogue takes 1 linear, got %d", n);
    for (int j = 0; j < n; j++) {
        const hr_tensor *mem[3] = {in[0], in[1 + j], a->bias ? in[1 + n + j] : NULL};
        hr_status s = infer_linear(NULL, mem, a->bias ? 3 : 2, &out[gated || residual ? 0 : j], 1);
        if (s != HR_OK) return hr_error_context(s, "linear_group member %d", j);
    }
    if (gated && in[2]->shape[0] != in[1]->shape[0])
        return hr_error(HR_ERR_SHAPE, "linear_group: gate and up give %lld and %lld features", (long long)in[1]->shape[0],
                        (long long)in[2]->shape[0]);
    if (residual) {
        const hr_tensor *r = in[n_in - 1];
        bool same = r->dtype == out[0].dtype && r->ndim == out[0].ndim;
        for (int d = 0; same && d < r->ndim; d++) same = r->shape[d] == out[0].shape[d];
        if (!same) {
            char sr[160], so[160];
            return hr_error(HR_ERR_SHAPE, "linear_group: the residual is %s %s, the product %s %s",
                            hr_shape_str(r->ndim, r->shape, sr, sizeof sr), hr_dtype_name(r->dtype),
                            hr_shape_str(out[0].ndim, out[0].shape, so, sizeof so), hr_dtype_name(out[0].dtype));
        }
    }
    return HR_OK;
}

void hr_infer_register_linalg(hr_infer_fn *table) {
    table[HR_OP_matmul] = infer_matmul;
    table[HR_OP_linear] = infer_linear;
    table[HR_OP_linear_group] = infer_linear_group;
}
