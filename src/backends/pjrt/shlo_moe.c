/* StableHLO lowering of experts (ops.h), in one of two formulations that
 * XLA's CPU plugin takes as plain gathers and dots (no ragged dot), chosen
 * by the shapes:
 * - gather, when the rows' slots are fewer than the experts (T k < E:
 *   decode): each slot's expert weights gathered ([T k, 2I, H] and
 *   [T k, H, I]) and applied to its row by batched dot_generals, so a step
 *   reads the chosen experts only; a slot whose index is outside [0, E)
 *   (a sentinel) adds nothing;
 * - dense otherwise: every expert over every row, [E, 2I, H] x [H, T] as
 *   one batched dot_general, then a routing matrix R [E, T] (the row's
 *   weight where the router chose the expert, 0 elsewhere) weights and
 *   sums the experts' outputs; E / k times the arithmetic of the chosen
 *   experts alone, but no copy of any weight.
 * Products are rounded to x's dtype where the CPU kernel rounds them; a
 * row's weighted sum is in f32 (per_expert's rounding after each add is
 * not reproduced: the same bits in f32). An expert a row did not choose
 * contributes nothing, not even a NaN of its own (selected away, not
 * multiplied by 0). */
#include "backends/pjrt/shlo.h"
#include "core/error.h"

/* act(gate) * up over g [..., 2I] (rounded to dt): the op's activation on
 * its two halves along dim `d`, into *av (dt). */
static hr_status activation(hr_shlo_builder *b, const hr_attrs_experts *a, hr_shlo_value g, int d, hr_dtype dt,
                            hr_shlo_value *av) {
    hr_dtype cdt = hr_shlo_compute_dtype(dt);
    int64_t lo[3] = {0, 0, 0}, mid[3] = {0, 0, 0}, hi[3], step[3] = {1, 1, 1}, sa[3];
    int nd = g.ndim;
    for (int j = 0; j < nd; j++) hi[j] = sa[j] = g.shape[j];
    int64_t i = g.shape[d] / 2;
    mid[d] = i, sa[d] = i;
    int64_t hi_gate[3] = {hi[0], hi[1], hi[2]};
    hi_gate[d] = i;
    hr_shlo_value gate_up[2] = {hr_shlo_slice(b, g, lo, hi_gate, step), hr_shlo_slice(b, g, mid, hi, step)};
    if (a->act == HR_EXPERTS_GPT_OSS) {
        /* (u' + 1) * g' * sigmoid(alpha g') with g' = min(g, limit) and u' = u clamped to [-limit, limit] */
        hr_shlo_value lim = hr_shlo_splat(b, cdt, a->limit, nd, sa);
        hr_shlo_value g2 = hr_shlo_binary(b, "minimum", hr_shlo_up(b, gate_up[0]), lim);
        hr_shlo_value u = hr_shlo_binary(b, "minimum", hr_shlo_up(b, gate_up[1]), lim);
        u = hr_shlo_binary(b, "maximum", u, hr_shlo_splat(b, cdt, -a->limit, nd, sa));
        hr_shlo_value sig = hr_shlo_unary(
            b, "logistic", hr_shlo_binary(b, "multiply", g2, hr_shlo_splat(b, cdt, a->alpha, nd, sa)));
        hr_shlo_value glu = hr_shlo_binary(b, "multiply", g2, sig);
        *av = hr_shlo_convert(
            b, hr_shlo_binary(b, "multiply", hr_shlo_binary(b, "add", u, hr_shlo_splat(b, cdt, 1, nd, sa)), glu), dt);
        return b->status;
    }
    hr_tensor_meta am = {.dtype = dt, .ndim = nd};
    for (int j = 0; j < nd; j++) am.shape[j] = sa[j];
    hr_attrs_gelu ga = {.approximate = HR_GELU_TANH};
    hr_op act = a->act == HR_EXPERTS_GELU_TANH ? HR_OP_gelu_mul : HR_OP_silu_mul;
    return hr_shlo_lowering_get(act)->lower(b, &ga, gate_up, 2, &am, av, 1);
}

/* rows [n, ...] of v picked by idx [n'] (index_select's lowering). */
static hr_shlo_value pick(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value idx) {
    hr_tensor_meta pm = {.dtype = v.dt, .ndim = v.ndim};
    for (int j = 0; j < v.ndim; j++) pm.shape[j] = v.shape[j];
    pm.shape[0] = idx.shape[0];
    hr_attrs_dim d0 = {.dim = 0};
    hr_shlo_value in[2] = {v, idx}, out = {0};
    if (hr_shlo_lowering_get(HR_OP_index_select)->lower(b, &d0, in, 2, &pm, &out, 1) != HR_OK) return v;
    return out;
}

/* The gather formulation: slot s = (t, j) takes expert idx[s]'s weights
 * through its row. */
static hr_status lower_gathered(hr_shlo_builder *b, const hr_attrs_experts *a, const hr_shlo_value *in, int n_in,
                                const hr_tensor_meta *m, hr_shlo_value *out) {
    hr_dtype dt = m->dtype, cdt = hr_shlo_compute_dtype(dt);
    hr_shlo_value x = in[0], gu = in[3], dn = in[4];
    int64_t h = x.shape[x.ndim - 1], k = in[1].shape[in[1].ndim - 1], e = gu.shape[0];
    int64_t t = h ? hr_shape_numel(x.ndim, x.shape) / h : 0, s = t * k;
    bool bf16 = dt == HR_BF16;
    hr_shlo_value idx = hr_shlo_reshape(b, hr_shlo_convert(b, in[2], HR_I64), 1, &s);
    hr_shlo_value valid = hr_shlo_binary(b, "and", hr_shlo_compare(b, "GE", idx, hr_shlo_splat(b, HR_I64, 0, 1, &s)),
                                         hr_shlo_compare(b, "LT", idx, hr_shlo_splat(b, HR_I64, (double)e, 1, &s)));
    idx = hr_shlo_select(b, valid, idx, hr_shlo_splat(b, HR_I64, 0, 1, &s));
    /* each slot's row: x [T, H] -> [T, k, H] -> [S, H] */
    x = hr_shlo_reshape(b, bf16 ? x : hr_shlo_up(b, x), 2, (int64_t[]){t, h});
    x = hr_shlo_reshape(b, hr_shlo_bcast_dims(b, x, (int[]){0, 2}, 3, (int64_t[]){t, k, h}), 2, (int64_t[]){s, h});
    hr_shlo_value gus = pick(b, gu, idx), dns = pick(b, dn, idx);
    if (!bf16) gus = hr_shlo_up(b, gus), dns = hr_shlo_up(b, dns);
    /* [S, 2I, H] . [S, H] -> [S, 2I] */
    hr_shlo_value g = hr_shlo_dot(b, gus, x, 1, 2, 1);
    if (n_in > 5) g = hr_shlo_binary(b, "add", g, hr_shlo_up(b, pick(b, in[5], idx)));
    hr_shlo_value av;
    HR_TRY(activation(b, a, hr_shlo_convert(b, g, dt), 1, dt, &av));
    if (!bf16) av = hr_shlo_up(b, av);
    /* [S, H, I] . [S, I] -> [S, H] */
    hr_shlo_value d = hr_shlo_dot(b, dns, av, 1, 2, 1);
    if (n_in > 5) d = hr_shlo_binary(b, "add", d, hr_shlo_up(b, pick(b, in[6], idx)));
    d = hr_shlo_up(b, hr_shlo_convert(b, d, dt));
    hr_shlo_value w = in[1];
    if (a->per_expert) w = hr_shlo_convert(b, w, dt);
    w = hr_shlo_reshape(b, hr_shlo_convert(b, w, cdt), 1, &s);
    int64_t sh[2] = {s, h};
    hr_shlo_value wd = hr_shlo_binary(b, "multiply", d, hr_shlo_bcast_dims(b, w, (int[]){0}, 2, sh));
    wd = hr_shlo_select(b, hr_shlo_bcast_dims(b, valid, (int[]){0}, 2, sh), wd, hr_shlo_splat(b, cdt, 0, 2, sh));
    hr_shlo_value y = hr_shlo_reduce(b, hr_shlo_reshape(b, wd, 3, (int64_t[]){t, k, h}), hr_shlo_const(b, cdt, 0),
                                     "add", (bool[]){false, true, false});
    *out = hr_shlo_convert(b, hr_shlo_reshape(b, y, m->ndim, m->shape), dt);
    return b->status;
}

static hr_status lower_experts(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                               const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    static const hr_attrs_experts none = {0};
    const hr_attrs_experts *a = attrs ? attrs : &none;
    hr_dtype dt = m->dtype, cdt = hr_shlo_compute_dtype(dt);
    hr_shlo_value x = in[0], gu = in[3], dn = in[4];
    int64_t h = x.shape[x.ndim - 1], k = in[1].shape[in[1].ndim - 1], e = gu.shape[0], i = gu.shape[1] / 2;
    int64_t t = h ? hr_shape_numel(x.ndim, x.shape) / h : 0;
    if (t * k < e) return lower_gathered(b, a, in, n_in, m, &out[0]);
    bool bf16 = dt == HR_BF16;
    x = hr_shlo_reshape(b, bf16 ? x : hr_shlo_up(b, x), 2, (int64_t[]){t, h});
    if (!bf16) gu = hr_shlo_up(b, gu), dn = hr_shlo_up(b, dn);
    /* gate_up [E, 2I, T], weight on the left as linear lowers it */
    int64_t sg[3] = {e, 2 * i, t};
    hr_shlo_value g = hr_shlo_dot(b, gu, x, 0, 2, 1);
    if (n_in > 5) g = hr_shlo_binary(b, "add", g, hr_shlo_bcast_dims(b, hr_shlo_up(b, in[5]), (int[]){0, 1}, 3, sg));
    hr_shlo_value av;
    HR_TRY(activation(b, a, hr_shlo_convert(b, g, dt), 1, dt, &av));
    if (!bf16) av = hr_shlo_up(b, av);
    /* down [E, H, T] */
    int64_t sd[3] = {e, h, t};
    hr_shlo_value d = hr_shlo_dot(b, dn, av, 1, 2, 1);
    if (n_in > 5) d = hr_shlo_binary(b, "add", d, hr_shlo_bcast_dims(b, hr_shlo_up(b, in[6]), (int[]){0, 1}, 3, sd));
    d = hr_shlo_up(b, hr_shlo_convert(b, d, dt));
    /* routing: chose[e, t, j] = indices[t, j] == e; R[e, t] = sum_j chose * w */
    int64_t se[3] = {e, t, k};
    hr_shlo_value idx = hr_shlo_reshape(b, hr_shlo_convert(b, in[2], HR_I64), 2, (int64_t[]){t, k});
    hr_shlo_value w = in[1];
    if (a->per_expert) w = hr_shlo_convert(b, w, dt);
    w = hr_shlo_reshape(b, hr_shlo_convert(b, w, cdt), 2, (int64_t[]){t, k});
    hr_shlo_value chose = hr_shlo_compare(b, "EQ", hr_shlo_bcast_dims(b, idx, (int[]){1, 2}, 3, se),
                                          hr_shlo_iota(b, HR_I64, 0, 3, se));
    hr_shlo_value zero = hr_shlo_splat(b, cdt, 0, 3, se);
    hr_shlo_value rw = hr_shlo_select(b, chose, hr_shlo_bcast_dims(b, w, (int[]){1, 2}, 3, se), zero);
    hr_shlo_value hits = hr_shlo_select(b, chose, hr_shlo_splat(b, cdt, 1, 3, se), zero);
    hr_shlo_value r = hr_shlo_reduce(b, rw, hr_shlo_const(b, cdt, 0), "add", (bool[]){false, false, true});
    hits = hr_shlo_reduce(b, hits, hr_shlo_const(b, cdt, 0), "add", (bool[]){false, false, true});
    hr_shlo_value used = hr_shlo_compare(b, "GT", hits, hr_shlo_splat(b, cdt, 0, 2, (int64_t[]){e, t}));
    hr_shlo_value wd = hr_shlo_binary(b, "multiply", d, hr_shlo_bcast_dims(b, r, (int[]){0, 2}, 3, sd));
    wd = hr_shlo_select(b, hr_shlo_bcast_dims(b, used, (int[]){0, 2}, 3, sd), wd, hr_shlo_splat(b, cdt, 0, 3, sd));
    hr_shlo_value y = hr_shlo_reduce(b, wd, hr_shlo_const(b, cdt, 0), "add", (bool[]){true, false, false});
    y = hr_shlo_transpose(b, y, (int[]){1, 0}); /* [T, H] */
    out[0] = hr_shlo_convert(b, hr_shlo_reshape(b, y, m->ndim, m->shape), dt);
    return b->status;
}

void hr_shlo_register_moe(hr_shlo_lowering *t) { t[HR_OP_experts].lower = lower_experts; }
