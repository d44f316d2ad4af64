/* The blocks of blocks.h. Each one runs catalog ops into the forward's
 * named activations (models/scratch.h), so a decode step allocates
 * nothing and a compiled forward captures the same ops. */
#include "models/blocks.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/half.h"

#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})

hr_status hr_fwd_act(hr_fwd *f, const char *name, int ndim, const int64_t *shape, hr_tensor **out) {
    return hr_scratch_get(f->sc, f->m->dev, name, f->m->dtype, ndim, shape, out);
}

#define ACT_(f, name, out, ...)                                                                       \
    hr_fwd_act((f), (name), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}, \
               (out))

/* ---- norms and residuals ---------------------------------------------------- */

hr_status hr_build_norm(hr_fwd *f, const hr_tensor *x, const hr_tensor *w, double offset, hr_tensor *out) {
    hr_attrs_norm a = {.eps = f->m->cfg.rms_norm_eps, .weight_offset = offset};
    hr_tensor *o[1] = {out};
    return hr_op_run(HR_OP_rms_norm, &a, IN_(x, w), 2, o, 1);
}

hr_status hr_build_add_norm(hr_fwd *f, hr_tensor *x, const hr_tensor *y, const hr_tensor *w, double offset,
                            hr_tensor *out) {
    hr_attrs_norm a = {.eps = f->m->cfg.rms_norm_eps, .weight_offset = offset};
    hr_tensor *o[2] = {out, x};
    return hr_op_run(HR_OP_add_rms_norm, &a, IN_(y, x, w), 3, o, 2);
}

/* ---- attention --------------------------------------------------------------- */

/* [b, s, n*d] -> view [b, s, n, d] */
static hr_status split_heads(const hr_tensor *t, int64_t n, int64_t d, hr_tensor **out) {
    const int64_t *sh = hr_tensor_shape(t);
    return hr_tensor_view(t, 4, (int64_t[]){sh[0], sh[1], n, d}, out);
}

/* q/k: [b, s, n*d] -> optional per-head norm (into activation `normed`)
 * -> [b, n, s, d] view, roped into dst. */
static hr_status project_rope(hr_fwd *f, const hr_tensor *proj, int64_t n, const char *normed,
                              const hr_tensor *norm_w, double offset, hr_layer_kind kind, hr_tensor *dst) {
    int64_t d = f->m->cfg.kind_head_dim[kind];
    hr_tensor *heads = NULL, *bnsd = NULL, *nt = NULL;
    hr_status s = split_heads(proj, n, d, &heads);
    if (s == HR_OK && norm_w) {
        s = ACT_(f, normed, &nt, f->b, f->s, n, d);
        if (s == HR_OK) s = hr_build_norm(f, heads, norm_w, offset, nt);
        hr_tensor_free(heads);
        heads = NULL;
        if (s == HR_OK) s = hr_tensor_alias(nt, &heads);
    }
    if (s == HR_OK) s = hr_tensor_transpose(heads, 1, 2, &bnsd);
    if (s == HR_OK) {
        hr_tensor *o[1] = {dst};
        s = hr_op_run(HR_OP_rope, NULL, IN_(bnsd, f->cos[kind], f->sin[kind]), 3, o, 1);
    }
    hr_tensor_free(heads);
    hr_tensor_free(bnsd);
    return s;
}

/* The name of an attention activation of layers of `kind` (buf: 24
 * bytes). Where the kinds' heads differ in shape, the full layers' have
 * their own names, so alternating layers do not reshape one scratch slot
 * each time; where layers read another's keys, the ring's concatenations
 * are the kind's own, kept for them. */
static const char *kind_name(const hr_fwd *f, hr_layer_kind kind, const char *base, char *buf) {
    const hr_model_config *c = &f->m->cfg;
    bool own = c->kind_head_dim[0] != c->kind_head_dim[1] || c->kind_kv_heads[0] != c->kind_kv_heads[1] ||
               c->kv_source;
    if (!own || kind != HR_LAYER_FULL) return base;
    snprintf(buf, 24, "%s.full", base);
    return buf;
}

/* The views a call's attention reads and writes, freed together. */
typedef struct attn_views {
    hr_tensor *t[16];
    int n;
} attn_views;

static hr_tensor **view_slot(attn_views *v) { return &v->t[v->n++]; }

static void views_free(attn_views *v) {
    for (int i = 0; i < v->n; i++) hr_tensor_free(v->t[i]);
}

/* slots [from, from + n) of a cache tensor [b, hkv, slots, d] */
static hr_status slots_of(const hr_tensor *cache, int64_t from, int64_t n, attn_views *v, hr_tensor **out) {
    hr_tensor **slot = view_slot(v);
    HR_TRY(hr_tensor_narrow(cache, 2, from, n, slot));
    *out = *slot;
    return HR_OK;
}

/* The last `keep` new rows of src [b, hkv, s, d] into the ring's slots
 * [at, at + keep) mod its size: one copy, or two where the range wraps. */
static hr_status ring_write(hr_fwd *f, hr_tensor *ring, const hr_tensor *src, int64_t keep, int64_t at,
                            attn_views *v) {
    int64_t size = ring->shape[2], first = keep < size - at ? keep : size - at;
    hr_tensor *dst = NULL, *from = NULL;
    HR_TRY(slots_of(ring, at, first, v, &dst));
    HR_TRY(slots_of(src, f->s - keep, first, v, &from));
    HR_TRY(hr_copy_(dst, from));
    if (first == keep) return HR_OK;
    HR_TRY(slots_of(ring, 0, keep - first, v, &dst));
    HR_TRY(slots_of(src, f->s - keep + first, keep - first, v, &from));
    return hr_copy_(dst, from);
}

/* The ring's filled slots in position order, then the new rows, into the
 * activation `name` [b, hkv, n_ring + s, d]. */
static hr_status ring_cat(hr_fwd *f, const hr_kv_plan *p, const hr_tensor *ring, const hr_tensor *fresh,
                          const char *name, attn_views *v, hr_tensor **out) {
    const hr_tensor *parts[3];
    int n = 0;
    hr_tensor *t = NULL;
    if (p->n_ring > p->split) {
        HR_TRY(slots_of(ring, p->split, p->n_ring - p->split, v, &t));
        parts[n++] = t;
    }
    if (p->split > 0) {
        HR_TRY(slots_of(ring, 0, p->split, v, &t));
        parts[n++] = t;
    }
    parts[n++] = fresh;
    HR_TRY(ACT_(f, name, out, f->b, fresh->shape[1], p->n_ring + f->s, fresh->shape[3]));
    hr_attrs_dim a = {.dim = 2};
    return hr_op_run(HR_OP_cat, &a, parts, n, out, 1);
}

/* The whole ring then the new rows (static shapes), into `name`. */
static hr_status whole_cat(hr_fwd *f, const hr_tensor *ring, const hr_tensor *fresh, const char *name,
                           hr_tensor **out) {
    HR_TRY(ACT_(f, name, out, f->b, fresh->shape[1], ring->shape[2] + f->s, fresh->shape[3]));
    hr_attrs_dim a = {.dim = 2};
    return hr_op_run(HR_OP_cat, &a, IN_(ring, fresh), 2, out, 1);
}

/* Writes the new keys k (roped: written by rope_k into wherever this
 * plan puts them) and values vt [b, hkv, s, d] into the cache, and gives
 * the keys and values attention reads. */
static hr_status cache_step(hr_fwd *f, int64_t il, const hr_kv_plan *p, const hr_tensor *k_proj,
                            const hr_tensor *k_norm, double offset, const hr_tensor *vt, attn_views *v,
                            const hr_tensor **k_all, const hr_tensor **v_all) {
    const hr_model_config *c = &f->m->cfg;
    hr_layer_kind kind = hr_model_layer_kind(f->m, il);
    int64_t hkv = c->kind_kv_heads[kind], d = c->kind_head_dim[kind];
    char nb[4][24];
    const char *kn = kind_name(f, kind, "kn", nb[0]), *kcat = kind_name(f, kind, "kcat", nb[1]),
               *vcat = kind_name(f, kind, "vcat", nb[2]);
    hr_tensor *kc = f->cache->k[il], *vc = f->cache->v[il], *dst = NULL, *kv[2] = {0};
    switch (p->mode) {
    case HR_KV_APPEND:
    case HR_KV_RING_STEP:
        /* the new keys are roped straight into their cache slots */
        HR_TRY(slots_of(kc, p->at, f->s, v, &dst));
        HR_TRY(project_rope(f, k_proj, hkv, kn, k_norm, offset, kind, dst));
        HR_TRY(slots_of(vc, p->at, f->s, v, &dst));
        HR_TRY(hr_copy_(dst, vt));
        if (p->mode == HR_KV_RING_STEP) {
            *k_all = kc, *v_all = vc;
            return HR_OK;
        }
        HR_TRY(slots_of(kc, 0, p->n_attend, v, &kv[0]));
        HR_TRY(slots_of(vc, 0, p->n_attend, v, &kv[1]));
        *k_all = kv[0], *v_all = kv[1];
        return HR_OK;
    default:
        break;
    }
    hr_tensor *kr = NULL;
    HR_TRY(ACT_(f, kind_name(f, kind, "kr", nb[3]), &kr, f->b, hkv, f->s, d));
    HR_TRY(project_rope(f, k_proj, hkv, kn, k_norm, offset, kind, kr));
    if (p->mode == HR_KV_INDEX) {
        HR_TRY(hr_index_copy_(kc, 2, p->slots, kr));
        HR_TRY(hr_index_copy_(vc, 2, p->slots, vt));
        *k_all = kc, *v_all = vc;
        return HR_OK;
    }
    if (p->mode == HR_KV_RING_CAT) {
        HR_TRY(ring_cat(f, p, kc, kr, kcat, v, &kv[0]));
        HR_TRY(ring_cat(f, p, vc, vt, vcat, v, &kv[1]));
        /* read before the ring is overwritten: the cats copied it */
        HR_TRY(ring_write(f, kc, kr, p->keep, p->keep_at, v));
        HR_TRY(ring_write(f, vc, vt, p->keep, p->keep_at, v));
    } else { /* HR_KV_INDEX_CAT */
        HR_TRY(whole_cat(f, kc, kr, kcat, &kv[0]));
        HR_TRY(whole_cat(f, vc, vt, vcat, &kv[1]));
        hr_tensor *kk = NULL, *vk = NULL;
        HR_TRY(slots_of(kr, f->s - p->keep, p->keep, v, &kk));
        HR_TRY(slots_of(vt, f->s - p->keep, p->keep, v, &vk));
        HR_TRY(hr_index_copy_(kc, 2, p->slots, kk));
        HR_TRY(hr_index_copy_(vc, 2, p->slots, vk));
    }
    *k_all = kv[0], *v_all = kv[1];
    return HR_OK;
}

/* The keys and values a layer that reads its source layer's (kv_source)
 * attends over: what the source attended over in this call, the cache's
 * slots or the kind's concatenations it left, written by nobody since
 * (sources are the last of their kind before the sharing layers). */
static hr_status shared_step(hr_fwd *f, int64_t il, const hr_kv_plan *p, attn_views *v, const hr_tensor **k_all,
                             const hr_tensor **v_all) {
    const hr_model_config *c = &f->m->cfg;
    hr_layer_kind kind = hr_model_layer_kind(f->m, il);
    int64_t hkv = c->kind_kv_heads[kind], d = c->kind_head_dim[kind];
    hr_tensor *kc = f->cache->k[il], *vc = f->cache->v[il], *kv[2] = {0};
    char nb[2][24];
    switch (p->mode) {
    case HR_KV_APPEND:
        HR_TRY(slots_of(kc, 0, p->n_attend, v, &kv[0]));
        HR_TRY(slots_of(vc, 0, p->n_attend, v, &kv[1]));
        break;
    case HR_KV_RING_STEP:
    case HR_KV_INDEX: *k_all = kc, *v_all = vc; return HR_OK;
    case HR_KV_RING_CAT:
    case HR_KV_INDEX_CAT: {
        int64_t keys = (p->mode == HR_KV_RING_CAT ? p->n_ring : kc->shape[2]) + f->s;
        HR_TRY(ACT_(f, kind_name(f, kind, "kcat", nb[0]), &kv[0], f->b, hkv, keys, d));
        HR_TRY(ACT_(f, kind_name(f, kind, "vcat", nb[1]), &kv[1], f->b, hkv, keys, d));
        break;
    }
    }
    *k_all = kv[0], *v_all = kv[1];
    return HR_OK;
}

/* out = x @ w^T + bias; split (tensor parallel, rowwise): x and w hold
 * this rank's columns, and the partial products are summed over the
 * ranks, the bias added once after the sum. */
static hr_status row_split_linear(hr_fwd *f, bool split, const hr_tensor *x, const hr_tensor *w,
                                  const hr_tensor *bias, hr_tensor *out) {
    hr_tensor *o[1] = {out};
    if (!split) {
        if (bias) return hr_op_run(HR_OP_linear, NULL, IN_(x, w, bias), 3, o, 1);
        return hr_op_run(HR_OP_linear, NULL, IN_(x, w), 2, o, 1);
    }
    HR_TRY(hr_op_run(HR_OP_linear, NULL, IN_(x, w), 2, o, 1));
    hr_attrs_cast a = {.dtype = out->dtype};
    if (bias) return hr_op_run(HR_OP_all_reduce, &a, IN_(out, bias), 2, o, 1);
    return hr_op_run(HR_OP_all_reduce, &a, IN_(out), 1, o, 1);
}

hr_status hr_build_attention(hr_fwd *f, int64_t il, const hr_attn_weights *w, const hr_attn_opts *o,
                             const hr_tensor *h, hr_tensor *out) {
    const hr_model_config *c = &f->m->cfg;
    hr_layer_kind kind = hr_model_layer_kind(f->m, il);
    int64_t b = f->b, s = f->s, d = c->kind_head_dim[kind], hq = c->n_heads, hkv = c->kind_kv_heads[kind];
    const hr_kv_plan *p = &f->kv[kind];
    bool shared = f->cache->source[il] != il;
    char nb[7][24];
    hr_tensor *q = NULL, *k = NULL, *vp = NULL, *qr = NULL, *attn = NULL;
    HR_TRY(ACT_(f, kind_name(f, kind, "q", nb[0]), &q, b, s, hq * d));
    HR_TRY(ACT_(f, kind_name(f, kind, "qr", nb[1]), &qr, b, hq, s, d));
    HR_TRY(ACT_(f, kind_name(f, kind, "attn", nb[2]), &attn, b, s, hq, d));
    if (shared) {
        /* the queries alone: keys and values are the source layer's */
        hr_tensor *qo[1] = {q};
        if (w->bq) HR_TRY(hr_op_run(HR_OP_linear, NULL, IN_(h, w->wq, w->bq), 3, qo, 1));
        else HR_TRY(hr_op_run(HR_OP_linear, NULL, IN_(h, w->wq), 2, qo, 1));
    } else {
        HR_TRY(ACT_(f, kind_name(f, kind, "k", nb[3]), &k, b, s, hkv * d));
        if (w->wv) HR_TRY(ACT_(f, kind_name(f, kind, "v", nb[4]), &vp, b, s, hkv * d));
        /* q, k and v in one op: decode rows stream the three weights in one
         * pass; without wv (attention_k_eq_v) the values are k's projection */
        int n = w->wv ? 3 : 2;
        hr_attrs_linear_group g = {.n = n, .epilogue = HR_LINEAR_STORE, .bias = w->bq != NULL};
        hr_tensor *qkv[3] = {q, k, vp};
        const hr_tensor *in[7] = {h, w->wq, w->wk, w->wv, w->bq, w->bk, w->bv};
        if (!w->wv) in[3] = w->bq, in[4] = w->bk;
        HR_TRY(hr_op_run(HR_OP_linear_group, &g, in, 1 + n * (w->bq ? 2 : 1), qkv, n));
        if (!w->wv) vp = k;
    }
    attn_views v = {0};
    hr_tensor *v_heads = NULL, *vn = NULL, *vt = NULL, *attn_t = NULL, *attn_flat = NULL;
    const hr_tensor *k_all = NULL, *v_all = NULL;
    hr_status st = project_rope(f, q, hq, kind_name(f, kind, "qn", nb[5]), w->q_norm, o->norm_offset, kind, qr);
    if (shared) {
        if (st == HR_OK) st = shared_step(f, il, p, &v, &k_all, &v_all);
    } else {
        if (st == HR_OK) st = split_heads(vp, hkv, d, &v_heads);
        if (st == HR_OK && o->v_norm) {
            /* Gemma 4's v_norm: each value head RMS-normalised, no weight */
            hr_attrs_norm na = {.eps = c->rms_norm_eps};
            st = ACT_(f, kind_name(f, kind, "vn", nb[6]), &vn, b, s, hkv, d);
            hr_tensor *no[1] = {vn};
            if (st == HR_OK) st = hr_op_run(HR_OP_rms_norm, &na, IN_(v_heads), 1, no, 1);
            hr_tensor_free(v_heads);
            v_heads = NULL;
            if (st == HR_OK) st = hr_tensor_alias(vn, &v_heads);
        }
        if (st == HR_OK) st = hr_tensor_transpose(v_heads, 1, 2, &vt);
        if (st == HR_OK) st = cache_step(f, il, p, k, w->k_norm, o->norm_offset, vt, &v, &k_all, &v_all);
    }
    /* sdpa writes [b, hq, s, d] through a transposed view of [b, s, hq, d],
     * so o_proj reads heads already concatenated */
    if (st == HR_OK) st = hr_tensor_transpose(attn, 1, 2, &attn_t);
    if (st == HR_OK) {
        hr_attrs_sdpa a = {.scale = o->scale, .softcap = o->softcap, .window = p->window, .is_causal = p->causal,
                           .exact = p->exact, .exact_from = p->exact_from, .sinks = w->sinks != NULL};
        hr_tensor *ot[1] = {attn_t};
        const hr_tensor *in[5] = {qr, k_all, v_all};
        int n_in = 3;
        if (p->mask) in[n_in++] = p->mask;
        if (w->sinks) in[n_in++] = w->sinks;
        st = hr_op_run(HR_OP_sdpa, &a, in, n_in, ot, 1);
    }
    if (st == HR_OK) st = hr_tensor_view(attn, 3, (int64_t[]){b, s, hq * d}, &attn_flat);
    if (st == HR_OK) st = row_split_linear(f, f->m->tp.attn, attn_flat, w->wo, w->bo, out);
    views_free(&v);
    hr_tensor_free(v_heads);
    hr_tensor_free(vt);
    hr_tensor_free(attn_t);
    hr_tensor_free(attn_flat);
    return st;
}

/* ---- MLP --------------------------------------------------------------------- */

hr_status hr_build_gated_mlp(hr_fwd *f, const hr_mlp_weights *w, hr_linear_epilogue act, const hr_tensor *h,
                             hr_tensor *out) {
    hr_tensor *a = NULL, *o[1] = {NULL};
    /* the gate's rows: a layer may be wider than intermediate_size (Gemma 4's double-wide MLPs) */
    int64_t inter = w->gate->shape[0];
    HR_TRY(ACT_(f, inter == f->m->cfg.intermediate_size ? "act" : "act.wide", &a, f->b, f->s, inter));
    /* gate and up in one op, the activation applied before either is stored */
    hr_attrs_linear_group g = {.n = 2, .epilogue = act, .bias = w->b_gate != NULL};
    o[0] = a;
    if (w->b_gate)
        HR_TRY(hr_op_run(HR_OP_linear_group, &g, IN_(h, w->gate, w->up, w->b_gate, w->b_up), 5, o, 1));
    else
        HR_TRY(hr_op_run(HR_OP_linear_group, &g, IN_(h, w->gate, w->up), 3, o, 1));
    return row_split_linear(f, f->m->tp.mlp, a, w->down, w->b_down, out);
}

/* ---- embedding and head -------------------------------------------------------- */

/* v as a tensor of dtype dt holds it (what multiplying by such a tensor
 * uses). */
static double dtype_rounded(double v, hr_dtype dt) {
    if (dt == HR_BF16) return hr_bf16_to_f32(hr_f32_to_bf16((float)v));
    if (dt == HR_F16) return hr_f16_to_f32(hr_f32_to_f16((float)v));
    return dt == HR_F32 ? (double)(float)v : v;
}

hr_status hr_build_lookup(hr_fwd *f, const hr_tensor *table, const hr_tensor *ids, double scale, hr_tensor *out) {
    hr_tensor *o[1] = {out};
    if (hr_dtype_is_quantized(table->dtype) && out->dtype != HR_F32) {
        /* a table kept in blocks gives f32 rows: cast to the model dtype */
        hr_tensor *rows = NULL;
        HR_TRY(hr_scratch_get(f->sc, f->m->dev, "lookup_f32", HR_F32, out->ndim, out->shape, &rows));
        hr_tensor *r[1] = {rows};
        HR_TRY(hr_op_run(HR_OP_embedding, NULL, IN_(table, ids), 2, r, 1));
        HR_TRY(hr_op_run(HR_OP_cast, &(hr_attrs_cast){.dtype = out->dtype}, IN_(rows), 1, o, 1));
    } else {
        /* a vocab-split table: this rank's rows, zeros for the others' ids */
        bool split = f->m->tp.embed && table == f->m->embed;
        hr_attrs_embedding e = {.first = f->m->tp.vocab0, .sharded = true};
        HR_TRY(hr_op_run(HR_OP_embedding, split ? &e : NULL, IN_(table, ids), 2, o, 1));
        if (split) {
            /* scaled before the sum: zeros stay zeros, and the one rank's row
             * is rounded as a whole table's is */
            if (scale != 1) {
                hr_attrs_scale a = {.mul = dtype_rounded(scale, f->m->dtype)};
                HR_TRY(hr_op_run(HR_OP_scale, &a, IN_(out), 1, o, 1));
            }
            hr_attrs_cast c = {.dtype = out->dtype};
            return hr_op_run(HR_OP_all_reduce, &c, IN_(out), 1, o, 1);
        }
    }
    if (scale == 1) return HR_OK;
    hr_attrs_scale a = {.mul = dtype_rounded(scale, f->m->dtype)};
    return hr_op_run(HR_OP_scale, &a, IN_(out), 1, o, 1);
}

hr_status hr_build_embedding(hr_fwd *f, const hr_tensor *ids, double scale) {
    return hr_build_lookup(f, f->m->embed, ids, scale, f->x);
}

hr_status hr_build_head(hr_fwd *f, const hr_tensor *h, double softcap, hr_tensor *out) {
    hr_tensor *o[1] = {out};
    if (f->m->tp.head) {
        /* this rank's vocab rows, then every rank's logits joined */
        hr_tensor *part = NULL;
        const int64_t *sh = out->shape;
        HR_TRY(hr_scratch_get(f->sc, f->m->dev, "head_part", out->dtype, 3,
                              (int64_t[]){sh[0], sh[1], f->m->tp.vocab_n}, &part));
        hr_tensor *po[1] = {part};
        HR_TRY(hr_op_run(HR_OP_linear, NULL, IN_(h, f->m->lm_head), 2, po, 1));
        hr_attrs_all_gather g = {.dim = 2, .total = sh[2]};
        HR_TRY(hr_op_run(HR_OP_all_gather, &g, IN_(part), 1, o, 1));
    } else {
        HR_TRY(hr_op_run(HR_OP_linear, NULL, IN_(h, f->m->lm_head), 2, o, 1));
    }
    if (!(softcap > 0)) return HR_OK;
    /* logits / cap, tanh, * cap, each in the logits' dtype as torch runs them */
    hr_tensor *cap = NULL;
    HR_TRY(hr_tensor_scalar(hr_tensor_device(out), out->dtype, softcap, &cap));
    hr_status s = hr_op_run(HR_OP_div, NULL, IN_(out, cap), 2, o, 1);
    if (s == HR_OK) s = hr_op_run(HR_OP_tanh, NULL, IN_(out), 1, o, 1);
    if (s == HR_OK) s = hr_op_run(HR_OP_mul, NULL, IN_(out, cap), 2, o, 1);
    hr_tensor_free(cap);
    return s;
}
