/* Shared blocks of the Llama family: weight loading by HF names, rms norm,
 * attention over the static KV cache, gated MLP. Each block writes into the
 * model's scratch tensors, so a decode step allocates nothing. */
#include <stdio.h>
#include <string.h>

#include "backends/cpu/k_fused.h"
#include "core/error.h"
#include "models/kv_cache.h"
#include "ops/capture.h"
#include "io/st_internal.h"
#include "models/model_impl.h"
#include "ops/profile.h"

#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})

/* ---- weights ----------------------------------------------------------- */

hr_status hr_model_weight(hr_model *m, const char *name, int ndim, const int64_t *shape,
                          hr_tensor **out) {
    hr_tensor_info info;
    hr_status s = hr_checkpoint_info(m->ckpt, name, &info);
    if (s == HR_ERR_NOT_FOUND) return hr_error(HR_ERR_NOT_FOUND, "checkpoint: missing tensor '%s'", name);
    HR_TRY(s);
    bool same = info.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = info.shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        return hr_error(HR_ERR_SHAPE, "checkpoint: tensor '%s' has shape %s, the config expects %s", name,
                        hr_shape_str(info.ndim, info.shape, a, sizeof a), hr_shape_str(ndim, shape, b, sizeof b));
    }
    if (!hr_dtype_is_float(info.dtype))
        return hr_error(HR_ERR_DTYPE, "checkpoint: tensor '%s' is %s, not a floating dtype", name,
                        hr_dtype_name(info.dtype));
    /* cast (GGUF: dequantized) once at load to the model dtype */
    hr_tensor *t = NULL;
    HR_TRY(hr_checkpoint_tensor_as(m->ckpt, name, m->dtype, &t));
    /* A copy made: nothing reads the stored bytes again (a reader that did
     * would fault them back in), so their pages go now; kept, an f32
     * checkpoint run in bf16 held both, 1.5x its bytes. */
    bool view = hr_checkpoint_drop_pages(m->ckpt, hr_tensor_ptr(t), 0);
    if (!view) hr_checkpoint_drop_tensor(m->ckpt, name);
    if (m->dev != hr_device_cpu()) {
        hr_tensor *n = NULL;
        s = hr_tensor_to(t, m->dev, &n);
        hr_tensor_free(t);
        if (s != HR_OK) return hr_error_context(s, "moving '%s' to %s", name, hr_device_name(m->dev));
        /* The device holds its own copy (PJRT copies during the call): a
         * view's file pages go as a copy's did; kept, the host held every
         * weight twice. */
        if (view) hr_checkpoint_drop_tensor(m->ckpt, name);
        hr_tensor_set_name(n, name);
        t = n;
    }
    *out = t;
    return HR_OK;
}

static hr_status layer_weight(hr_model *m, int64_t layer, const char *suffix, int ndim,
                              const int64_t *shape, hr_tensor **out) {
    char name[256];
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)layer, suffix);
    return hr_model_weight(m, name, ndim, shape, out);
}

hr_status hr_block_load_layer(hr_model *m, int64_t i, hr_layer_weights *lw) {
    const hr_model_config *c = &m->cfg;
    int64_t hid = c->hidden_size, d = c->head_dim, qd = c->n_heads * d, kd = c->n_kv_heads * d;
    int64_t inter = c->intermediate_size;
    bool qkv_bias = c->qkv_bias || c->attention_bias;
    HR_TRY(layer_weight(m, i, "input_layernorm.weight", 1, &hid, &lw->attn_norm));
    HR_TRY(layer_weight(m, i, "self_attn.q_proj.weight", 2, (int64_t[]){qd, hid}, &lw->wq));
    HR_TRY(layer_weight(m, i, "self_attn.k_proj.weight", 2, (int64_t[]){kd, hid}, &lw->wk));
    HR_TRY(layer_weight(m, i, "self_attn.v_proj.weight", 2, (int64_t[]){kd, hid}, &lw->wv));
    HR_TRY(layer_weight(m, i, "self_attn.o_proj.weight", 2, (int64_t[]){hid, qd}, &lw->wo));
    if (qkv_bias) {
        HR_TRY(layer_weight(m, i, "self_attn.q_proj.bias", 1, &qd, &lw->bq));
        HR_TRY(layer_weight(m, i, "self_attn.k_proj.bias", 1, &kd, &lw->bk));
        HR_TRY(layer_weight(m, i, "self_attn.v_proj.bias", 1, &kd, &lw->bv));
    }
    if (c->attention_bias) HR_TRY(layer_weight(m, i, "self_attn.o_proj.bias", 1, &hid, &lw->bo));
    if (c->qk_norm) {
        HR_TRY(layer_weight(m, i, "self_attn.q_norm.weight", 1, &d, &lw->q_norm));
        HR_TRY(layer_weight(m, i, "self_attn.k_norm.weight", 1, &d, &lw->k_norm));
    }
    HR_TRY(layer_weight(m, i, "post_attention_layernorm.weight", 1, &hid, &lw->mlp_norm));
    HR_TRY(layer_weight(m, i, "mlp.gate_proj.weight", 2, (int64_t[]){inter, hid}, &lw->w_gate));
    HR_TRY(layer_weight(m, i, "mlp.up_proj.weight", 2, (int64_t[]){inter, hid}, &lw->w_up));
    HR_TRY(layer_weight(m, i, "mlp.down_proj.weight", 2, (int64_t[]){hid, inter}, &lw->w_down));
    if (c->mlp_bias) {
        HR_TRY(layer_weight(m, i, "mlp.gate_proj.bias", 1, &inter, &lw->b_gate));
        HR_TRY(layer_weight(m, i, "mlp.up_proj.bias", 1, &inter, &lw->b_up));
        HR_TRY(layer_weight(m, i, "mlp.down_proj.bias", 1, &hid, &lw->b_down));
    }
    return HR_OK;
}

void hr_layer_weights_free(hr_layer_weights *lw) {
#define SLOT_(f) &lw->f,
    hr_tensor **all[] = {HR_LAYER_WEIGHT_FIELDS(SLOT_)};
#undef SLOT_
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        hr_tensor_free(*all[i]);
        *all[i] = NULL;
    }
}

/* ---- blocks ------------------------------------------------------------- */

/* out = linear(x, w, b) into an existing tensor. */
static hr_status linear_into(const hr_tensor *x, const hr_tensor *w, const hr_tensor *b,
                             hr_tensor *out) {
    hr_tensor *o[1] = {out};
    if (b) return hr_op_run(HR_OP_linear, NULL, IN_(x, w, b), 3, o, 1);
    return hr_op_run(HR_OP_linear, NULL, IN_(x, w), 2, o, 1);
}

/* Decode rows on the CPU: the n linears that read the same rows x (q/k/v,
 * or gate/up with silu_mul as GATED) in one pass over the thread pool
 * (k_fused_linear.c), each column the bits the separate ops give. One
 * dispatch, barrier and stream per group instead of one per linear: decode
 * at 2 threads measured 3-10% faster (docs/architecture.md, Compile);
 * HUBRT_PROFILE counts a group as one linear call. Returns false, having
 * run nothing, where the kernel does not apply: other devices, a capture
 * (the compiled plan fuses on its own), HUBRT_FUSE=0, prefill-sized rows. */
static bool fused_linears(const hr_model *m, const hr_tensor *x, hr_fused_epilogue epi, int n,
                          const hr_tensor *const *w, const hr_tensor *const *b, hr_tensor *const *out,
                          hr_status *st) {
    if (m->dev != hr_device_cpu() || hr_capture_active() || !hr_fused_linears_enabled()) return false;
    hr_fused_linear f = {.epi = epi, .n = n, .x = x};
    for (int j = 0; j < n; j++) {
        /* GATED writes silu(gate) * up to out[0] alone: each product is
         * checked against that output's shape */
        const hr_tensor *o = epi == HR_FUSED_GATED ? out[0] : out[j];
        if (!hr_fused_linear_fits(x, w[j], b[j], o)) return false;
        f.w[j] = w[j];
        f.b[j] = b[j];
        f.out[j] = epi == HR_FUSED_GATED && j > 0 ? NULL : out[j];
    }
    double t0 = hr_profile_enabled() ? hr_profile_now() : 0;
    *st = hr_cpu_fused_linear(&f);
    if (hr_profile_enabled()) hr_profile_add(HR_OP_linear, hr_profile_now() - t0);
    return true;
}

hr_status hr_block_norm(const hr_model *m, const hr_tensor *x, const hr_tensor *w, hr_tensor *out) {
    hr_attrs_norm a = {.eps = m->cfg.rms_norm_eps, .weight_offset = 0};
    hr_tensor *o[1] = {out};
    return hr_op_run(HR_OP_rms_norm, &a, IN_(x, w), 2, o, 1);
}

/* In-place residual add: x += y (same shape and strides, so every element
 * is read before it is written). */
hr_status hr_block_residual(hr_tensor *x, const hr_tensor *y) {
    hr_tensor *o[1] = {x};
    return hr_op_run(HR_OP_add, NULL, IN_(x, y), 2, o, 1);
}

/* x += y, then out = rms_norm(x) * w, in one op (add_rms_norm): the sum
 * overwrites x in place, the normed rows go to out. */
static hr_status residual_norm(const hr_model *m, hr_tensor *x, const hr_tensor *y, const hr_tensor *w,
                               hr_tensor *out) {
    hr_attrs_norm a = {.eps = m->cfg.rms_norm_eps, .weight_offset = 0};
    hr_tensor *o[2] = {out, x};
    return hr_op_run(HR_OP_add_rms_norm, &a, IN_(y, x, w), 3, o, 2);
}

/* [b, s, n*d] -> view [b, s, n, d] */
static hr_status split_heads(const hr_tensor *t, int64_t n, int64_t d, hr_tensor **out) {
    const int64_t *sh = hr_tensor_shape(t);
    return hr_tensor_view(t, 4, (int64_t[]){sh[0], sh[1], n, d}, out);
}

/* q/k: [b, s, n*d] -> optional per-head norm -> [b, n, s, d] view, roped
 * into `dst` (the scratch for q, a slice of the cache for k). */
static hr_status project_rope(const hr_model *m, const hr_tensor *proj, int64_t n,
                              hr_tensor *normed, const hr_tensor *norm_w, const hr_fwd_ctx *f,
                              hr_tensor *dst) {
    hr_tensor *heads = NULL, *bnsd = NULL;
    hr_status s = split_heads(proj, n, m->cfg.head_dim, &heads);
    if (s == HR_OK && norm_w) {
        s = hr_block_norm(m, heads, norm_w, normed);
        if (s == HR_OK) {
            hr_tensor_free(heads);
            heads = NULL;
            s = hr_tensor_alias(normed, &heads);
        }
    }
    if (s == HR_OK) s = hr_tensor_transpose(heads, 1, 2, &bnsd);
    if (s == HR_OK) {
        hr_tensor *o[1] = {dst};
        s = hr_op_run(HR_OP_rope, NULL, IN_(bnsd, f->cos, f->sin), 3, o, 1);
    }
    hr_tensor_free(heads);
    hr_tensor_free(bnsd);
    return s;
}

hr_status hr_block_attention(const hr_model *m, const hr_layer_weights *lw, int64_t layer,
                             const hr_fwd_ctx *f, const hr_tensor *h, hr_tensor *out) {
    const hr_model_config *c = &m->cfg;
    const hr_scratch *sc = &m->scratch;
    hr_kv_cache *kv = f->cache;
    int64_t b = sc->b, s = sc->s, d = c->head_dim;
    hr_status qkv = HR_OK;
    if (fused_linears(m, h, HR_FUSED_STORE, 3, IN_(lw->wq, lw->wk, lw->wv), IN_(lw->bq, lw->bk, lw->bv),
                      (hr_tensor *const[]){sc->q, sc->k, sc->v}, &qkv)) {
        HR_TRY(qkv);
    } else {
        HR_TRY(linear_into(h, lw->wq, lw->bq, sc->q));
        HR_TRY(linear_into(h, lw->wk, lw->bk, sc->k));
        HR_TRY(linear_into(h, lw->wv, lw->bv, sc->v));
    }
    hr_tensor *k_new = NULL, *v_new = NULL, *v_heads = NULL, *v_t = NULL;
    hr_tensor *k_all = NULL, *v_all = NULL, *attn_t = NULL, *attn_flat = NULL;
    hr_status st = project_rope(m, sc->q, c->n_heads, sc->qn, lw->q_norm, f, sc->qr);
    if (st == HR_OK) st = split_heads(sc->v, c->n_kv_heads, d, &v_heads);
    if (st == HR_OK) st = hr_tensor_transpose(v_heads, 1, 2, &v_t);
    if (f->cache_pos) {
        /* Static shapes: the new keys and values go to the slots cache_pos
         * names, and attention reads the whole cache under the mask. */
        if (st == HR_OK) st = hr_tensor_empty(m->dev, m->dtype, 4, (int64_t[]){b, c->n_kv_heads, s, d}, &k_new);
        if (st == HR_OK) st = project_rope(m, sc->k, c->n_kv_heads, sc->kn, lw->k_norm, f, k_new);
        if (st == HR_OK) st = hr_index_copy_(kv->k[layer], 2, f->cache_pos, k_new);
        if (st == HR_OK) st = hr_index_copy_(kv->v[layer], 2, f->cache_pos, v_t);
        if (st == HR_OK) st = hr_tensor_alias(kv->k[layer], &k_all);
        if (st == HR_OK) st = hr_tensor_alias(kv->v[layer], &v_all);
    } else {
        /* The new keys and values are written straight into their cache slots. */
        if (st == HR_OK) st = hr_tensor_narrow(kv->k[layer], 2, f->past, s, &k_new);
        if (st == HR_OK) st = project_rope(m, sc->k, c->n_kv_heads, sc->kn, lw->k_norm, f, k_new);
        if (st == HR_OK) st = hr_tensor_narrow(kv->v[layer], 2, f->past, s, &v_new);
        if (st == HR_OK) st = hr_copy_(v_new, v_t);
        if (st == HR_OK) st = hr_tensor_narrow(kv->k[layer], 2, 0, f->past + s, &k_all);
        if (st == HR_OK) st = hr_tensor_narrow(kv->v[layer], 2, 0, f->past + s, &v_all);
    }
    /* sdpa writes [b, hq, s, d] through a transposed view of [b, s, hq, d],
     * so o_proj reads heads already concatenated. */
    if (st == HR_OK) st = hr_tensor_transpose(sc->attn, 1, 2, &attn_t);
    if (st == HR_OK) {
        hr_attrs_sdpa a = {.scale = 0, .is_causal = !f->mask && s > 1};
        hr_tensor *o[1] = {attn_t};
        if (f->mask)
            st = hr_op_run(HR_OP_sdpa, &a, IN_(sc->qr, k_all, v_all, f->mask), 4, o, 1);
        else
            st = hr_op_run(HR_OP_sdpa, &a, IN_(sc->qr, k_all, v_all), 3, o, 1);
    }
    if (st == HR_OK) st = hr_tensor_view(sc->attn, 3, (int64_t[]){b, s, c->n_heads * d}, &attn_flat);
    if (st == HR_OK) st = linear_into(attn_flat, lw->wo, lw->bo, out);
    hr_tensor_free(k_new);
    hr_tensor_free(v_new);
    hr_tensor_free(v_heads);
    hr_tensor_free(v_t);
    hr_tensor_free(k_all);
    hr_tensor_free(v_all);
    hr_tensor_free(attn_t);
    hr_tensor_free(attn_flat);
    return st;
}

hr_status hr_block_mlp(const hr_model *m, const hr_layer_weights *lw, const hr_tensor *h,
                       hr_tensor *out) {
    const hr_scratch *sc = &m->scratch;
    hr_status gated = HR_OK;
    if (fused_linears(m, h, HR_FUSED_GATED, 2, IN_(lw->w_gate, lw->w_up), IN_(lw->b_gate, lw->b_up),
                      (hr_tensor *const[]){sc->act, NULL}, &gated)) {
        HR_TRY(gated);
    } else {
        HR_TRY(linear_into(h, lw->w_gate, lw->b_gate, sc->gate));
        HR_TRY(linear_into(h, lw->w_up, lw->b_up, sc->up));
        hr_tensor *o[1] = {sc->act};
        HR_TRY(hr_op_run(HR_OP_silu_mul, NULL, IN_(sc->gate, sc->up), 2, o, 1));
    }
    return linear_into(sc->act, lw->w_down, lw->b_down, out);
}

/* Each residual add runs fused with the norm that reads its sum: this
 * layer's mlp norm, and the next layer's input norm, so a layer after the
 * first finds its normed input in sc->h already. */
hr_status hr_block_decoder_layer(const hr_model *m, const hr_layer_weights *lw, int64_t layer,
                                 const hr_fwd_ctx *f) {
    const hr_scratch *sc = &m->scratch;
    if (layer == 0) HR_TRY(hr_block_norm(m, sc->x, lw->attn_norm, sc->h));
    HR_TRY(hr_block_attention(m, lw, layer, f, sc->h, sc->o));
    HR_TRY(residual_norm(m, sc->x, sc->o, lw->mlp_norm, sc->h));
    HR_TRY(hr_block_mlp(m, lw, sc->h, sc->o));
    if (layer + 1 < m->cfg.n_layers) return residual_norm(m, sc->x, sc->o, m->layers[layer + 1].attn_norm, sc->h);
    return hr_block_residual(sc->x, sc->o);
}
