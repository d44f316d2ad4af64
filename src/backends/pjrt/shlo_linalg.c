/* StableHLO lowerings of matmul, linear and scaled dot-product attention:
 * dot_general in f32 (f64 stays f64; bf16 operands of linear and of the
 * attention scores stay bf16 with an f32 result), results stored in the
 * input dtype. */
#include <math.h>
#include <stdio.h>

#include "backends/pjrt/shlo.h"
#include "core/error.h"

static hr_shlo_value up(hr_shlo_builder *b, hr_shlo_value v) { return hr_shlo_up(b, v); }

#define dot hr_shlo_dot

hr_shlo_value hr_shlo_dot(hr_shlo_builder *b, hr_shlo_value x, hr_shlo_value y, int nb, int lc, int rc) {
    int64_t shape[HR_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < nb; i++) shape[n++] = x.shape[i];
    for (int i = nb; i < x.ndim; i++)
        if (i != lc) shape[n++] = x.shape[i];
    for (int i = nb; i < y.ndim; i++)
        if (i != rc) shape[n++] = y.shape[i];
    char batch[64] = "", attr[384];
    size_t used = 0;
    for (int i = 0; i < nb; i++) used += (size_t)snprintf(batch + used, sizeof batch - used, "%s%d", i ? ", " : "", i);
    snprintf(attr, sizeof attr,
             "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [%s], rhs_batching_dimensions = [%s], "
             "lhs_contracting_dimensions = [%d], rhs_contracting_dimensions = [%d]>",
             batch, batch, lc, rc);
    hr_shlo_value in[2] = {x, y};
    return hr_shlo_op(b, "dot_general", in, 2, attr, hr_shlo_compute_dtype(x.dt), n, shape);
}

/* torch.matmul: 1-d operands gain a dim that the result drops; batch dims
 * broadcast. */
static hr_status lower_matmul(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                              const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    hr_shlo_value x = up(b, in[0]), y = up(b, in[1]);
    if (x.ndim == 1) x = hr_shlo_reshape(b, x, 2, (int64_t[]){1, x.shape[0]});
    if (y.ndim == 1) y = hr_shlo_reshape(b, y, 2, (int64_t[]){y.shape[0], 1});
    int nb = (x.ndim > y.ndim ? x.ndim : y.ndim) - 2;
    int64_t xs[HR_MAX_DIMS], ys[HR_MAX_DIMS];
    for (int i = 0; i < nb; i++) {
        int xi = i - (nb - (x.ndim - 2)), yi = i - (nb - (y.ndim - 2));
        int64_t dx = xi >= 0 ? x.shape[xi] : 1, dy = yi >= 0 ? y.shape[yi] : 1;
        xs[i] = ys[i] = dx == 1 ? dy : dx;
    }
    xs[nb] = x.shape[x.ndim - 2], xs[nb + 1] = x.shape[x.ndim - 1];
    ys[nb] = y.shape[y.ndim - 2], ys[nb + 1] = y.shape[y.ndim - 1];
    x = hr_shlo_bcast(b, x, nb + 2, xs);
    y = hr_shlo_bcast(b, y, nb + 2, ys);
    hr_shlo_value r = dot(b, x, y, nb, nb + 1, nb);
    out[0] = hr_shlo_convert(b, hr_shlo_reshape(b, r, m->ndim, m->shape), m->dtype);
    return b->status;
}

/* x [..., in] @ weight [out, in]^T (+ bias [out]), computed as weight @
 * x^T: with the weight on the left XLA reads its rows in place; on the
 * right it transposes the weight first, and where it fuses that transpose
 * into a matrix-vector product (decode) the weight is read column by
 * column, several times slower. bf16 operands stay bf16 with an f32
 * result (the same products and f32 sums as converting both first):
 * converted, XLA materializes an f32 copy of every weight per call. */
static hr_status lower_linear(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                              const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    bool bf16 = in[0].dt == HR_BF16 && in[1].dt == HR_BF16;
    hr_shlo_value x = bf16 ? in[0] : up(b, in[0]), w = bf16 ? in[1] : up(b, in[1]);
    int64_t k = x.shape[x.ndim - 1], rows[2] = {k ? hr_shape_numel(x.ndim, x.shape) / k : 0, k};
    hr_shlo_value wx = dot(b, w, hr_shlo_reshape(b, x, 2, rows), 0, 1, 1); /* [out, rows] */
    hr_shlo_value r = hr_shlo_reshape(b, hr_shlo_transpose(b, wx, (int[]){1, 0}), m->ndim, m->shape);
    if (n_in > 2 && in[2].id >= 0) r = hr_shlo_binary(b, "add", r, hr_shlo_bcast(b, up(b, in[2]), r.ndim, r.shape));
    out[0] = hr_shlo_convert(b, r, m->dtype);
    return b->status;
}

/* Each member as linear lowers it, its product stored in x's dtype, then
 * the epilogue as its own op lowers: the separate ops' arithmetic (XLA
 * fuses them as it sees fit). */
static hr_status lower_linear_group(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                    const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_linear_group *a = attrs;
    int n = (int)a->n;
    hr_shlo_value y[3];
    for (int j = 0; j < n; j++) {
        hr_shlo_value mem[3] = {in[0], in[1 + j], a->bias ? in[1 + n + j] : in[0]};
        hr_tensor_meta mj = {.dtype = m[0].dtype, .ndim = in[0].ndim};
        for (int d = 0; d + 1 < mj.ndim; d++) mj.shape[d] = in[0].shape[d];
        mj.shape[mj.ndim - 1] = in[1 + j].shape[0];
        HR_TRY(lower_linear(b, NULL, mem, a->bias ? 3 : 2, &mj, &y[j], 1));
    }
    if (a->epilogue == HR_LINEAR_STORE) {
        for (int j = 0; j < n; j++) out[j] = y[j];
        return b->status;
    }
    if (a->epilogue == HR_LINEAR_RESIDUAL) {
        hr_shlo_value xs[2] = {y[0], in[n_in - 1]};
        return hr_shlo_lowering_get(HR_OP_add)->lower(b, NULL, xs, 2, m, out, 1);
    }
    hr_attrs_gelu ga = {.approximate = HR_GELU_TANH};
    hr_op act = a->epilogue == HR_LINEAR_SILU_MUL ? HR_OP_silu_mul : HR_OP_gelu_mul;
    return hr_shlo_lowering_get(act)->lower(b, &ga, y, 2, m, out, 1);
}

/* [b, h, s, x] <-> [b, hkv, (h / hkv) s, x]: query head h = kv g + j is
 * row j s + i of its kv head's group, a reshape only (dims split and
 * merged in order). */
static hr_shlo_value heads_as(hr_shlo_builder *b, hr_shlo_value v, int64_t h, int64_t rows) {
    return hr_shlo_reshape(b, v, 4, (int64_t[]){v.shape[0], h, rows, v.shape[3]});
}

/* k/v [b, hkv, t, d] -> [b, hq, t, d]: head h reads kv head h / (hq / hkv). */
static hr_shlo_value repeat_kv(hr_shlo_builder *b, hr_shlo_value kv, int64_t hq) {
    int64_t g = hq / kv.shape[1];
    if (g == 1) return kv;
    int64_t s5[5] = {kv.shape[0], kv.shape[1], g, kv.shape[2], kv.shape[3]};
    int dims[4] = {0, 1, 3, 4};
    hr_shlo_value e = hr_shlo_bcast_dims(b, kv, dims, 5, s5);
    return hr_shlo_reshape(b, e, 4, (int64_t[]){kv.shape[0], hq, kv.shape[2], kv.shape[3]});
}

/* Scores in f32, then softcap, user mask, causal and window masks in the
 * cpu kernel's order; a row with every key masked gives zeros like it. */
static hr_status lower_sdpa(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                            const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    static const hr_attrs_sdpa none = {0};
    const hr_attrs_sdpa *a = attrs ? attrs : &none;
    int64_t hq = in[0].shape[1], s = in[0].shape[2], t = in[1].shape[2], d = in[0].shape[3];
    int64_t hkv = in[1].shape[1], g = hkv > 0 ? hq / hkv : 1;
    /* Grouped query heads: each kv head's g query heads are one [g s, d]
     * block against its keys and values, which are read once, not
     * repeated g times into copies. bf16 q and k stay bf16 with f32 scores
     * (the same products and f32 sums as converting both first). */
    bool grouped = g > 1 && g * hkv == hq && in[2].shape[1] == hkv;
    bool bf16 = in[0].dt == HR_BF16 && in[1].dt == HR_BF16;
    hr_shlo_value q = bf16 ? in[0] : up(b, in[0]), k = bf16 ? in[1] : up(b, in[1]), v = up(b, in[2]);
    hr_shlo_value sc;
    if (grouped) {
        sc = dot(b, heads_as(b, q, hkv, g * s), k, 2, 3, 3); /* [b, hkv, g s, t] */
        sc = heads_as(b, sc, hq, s);
    } else {
        sc = dot(b, q, repeat_kv(b, k, hq), 2, 3, 3); /* [b, hq, s, t] */
        v = repeat_kv(b, v, hq);
    }
    double scale = a->scale != 0 ? a->scale : 1.0 / sqrt((double)(d ? d : 1));
    sc = hr_shlo_binary(b, "multiply", sc, hr_shlo_splat(b, sc.dt, scale, sc.ndim, sc.shape));
    if (a->softcap > 0) {
        hr_shlo_value cap = hr_shlo_splat(b, sc.dt, a->softcap, sc.ndim, sc.shape);
        sc = hr_shlo_binary(b, "multiply", hr_shlo_unary(b, "tanh", hr_shlo_binary(b, "divide", sc, cap)), cap);
    }
    hr_shlo_value ninf = hr_shlo_splat(b, sc.dt, -INFINITY, sc.ndim, sc.shape);
    if (n_in - a->sinks > 3) {
        if (in[3].dt == HR_BOOL)
            sc = hr_shlo_select(b, hr_shlo_bcast(b, in[3], sc.ndim, sc.shape), sc, ninf);
        else
            sc = hr_shlo_binary(b, "add", sc, hr_shlo_bcast(b, hr_shlo_convert(b, in[3], sc.dt), sc.ndim, sc.shape));
    }
    if (a->is_causal || a->window > 0) {
        /* query i sits at position t - s + i */
        hr_shlo_value qpos = hr_shlo_binary(b, "add", hr_shlo_iota(b, HR_I64, 2, sc.ndim, sc.shape),
                                            hr_shlo_splat(b, HR_I64, (double)(t - s), sc.ndim, sc.shape));
        hr_shlo_value kpos = hr_shlo_iota(b, HR_I64, 3, sc.ndim, sc.shape);
        if (a->is_causal) sc = hr_shlo_select(b, hr_shlo_compare(b, "GT", kpos, qpos), ninf, sc);
        if (a->window > 0) {
            hr_shlo_value dist = hr_shlo_binary(b, "subtract", qpos, kpos);
            hr_shlo_value w = hr_shlo_splat(b, HR_I64, (double)a->window, sc.ndim, sc.shape);
            sc = hr_shlo_select(b, hr_shlo_compare(b, "GE", dist, w), ninf, sc);
        }
    }
    bool dims[4] = {false, false, false, true};
    hr_shlo_value mx = hr_shlo_reduce(b, sc, hr_shlo_const(b, sc.dt, -INFINITY), "maximum", dims);
    int64_t keep[4] = {sc.shape[0], sc.shape[1], sc.shape[2], 1};
    mx = hr_shlo_reshape(b, mx, 4, keep);
    hr_shlo_value sink; /* [b, hq, s, 1]: each head's sink logit, a key of its own */
    if (a->sinks) {
        sink = hr_shlo_bcast_dims(b, hr_shlo_convert(b, in[n_in - 1], sc.dt), (int[]){1}, 4, keep);
        mx = hr_shlo_binary(b, "maximum", mx, sink);
    }
    mx = hr_shlo_select(b, hr_shlo_compare(b, "EQ", mx, hr_shlo_splat(b, sc.dt, -INFINITY, 4, keep)),
                        hr_shlo_splat(b, sc.dt, 0, 4, keep), mx);
    hr_shlo_value zero = hr_shlo_splat(b, sc.dt, 0, 4, sc.shape);
    hr_shlo_value e = hr_shlo_unary(b, "exponential", hr_shlo_binary(b, "subtract", sc, hr_shlo_bcast(b, mx, 4, sc.shape)));
    hr_shlo_value sum = hr_shlo_reshape(b, hr_shlo_reduce(b, e, hr_shlo_const(b, sc.dt, 0), "add", dims), 4, keep);
    if (a->sinks)
        sum = hr_shlo_binary(b, "add", sum, hr_shlo_unary(b, "exponential", hr_shlo_binary(b, "subtract", sink, mx)));
    sum = hr_shlo_bcast(b, sum, 4, sc.shape);
    hr_shlo_value one = hr_shlo_splat(b, sc.dt, 1, 4, sc.shape);
    sum = hr_shlo_select(b, hr_shlo_compare(b, "EQ", sum, zero), one, sum);
    hr_shlo_value p = hr_shlo_binary(b, "divide", e, sum);
    hr_shlo_value o = grouped ? heads_as(b, dot(b, heads_as(b, p, hkv, g * s), v, 2, 3, 2), hq, s)
                              : dot(b, p, v, 2, 3, 2);
    out[0] = hr_shlo_convert(b, o, m->dtype);
    return b->status;
}

void hr_shlo_register_linalg(hr_shlo_lowering *t) {
    t[HR_OP_matmul].lower = lower_matmul;
    t[HR_OP_linear].lower = lower_linear;
    t[HR_OP_linear_group].lower = lower_linear_group;
    t[HR_OP_sdpa].lower = lower_sdpa;
}
