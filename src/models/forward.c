/* The eager forward: host arrays in, the architecture's embedding, layers
 * and head over the model's activations, logits out; the rope tables and
 * cache plans of each layer kind made once per call. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/forward_internal.h"

#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})

/* ---- shared with the compiled forward (forward_internal.h) ---------------- */

bool hr_model_has_kind(const hr_model *m, hr_layer_kind kind) {
    for (int64_t il = 0; il < m->cfg.n_layers; il++)
        if (m->cfg.layer_kind[il] == kind) return true;
    return false;
}

hr_status hr_model_to_device(const hr_model *m, hr_tensor **t) {
    if (hr_tensor_device(*t) == m->dev) return HR_OK;
    hr_tensor *d = NULL;
    hr_status s = hr_tensor_to(*t, m->dev, &d);
    hr_tensor_free(*t);
    *t = d;
    return s;
}

static bool rope_depends_on_len(const hr_rope_config *r) {
    return r->type == HR_ROPE_DYNAMIC || r->type == HR_ROPE_LONGROPE;
}

hr_status hr_model_rope_init(hr_model *m) {
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        const hr_rope_config *r = &m->cfg.rope[k];
        if (rope_depends_on_len(r)) continue;
        m->inv_freq[k] = malloc(sizeof(float) * (size_t)(r->rotary_dim / 2));
        if (!m->inv_freq[k]) return hr_error(HR_ERR_OOM, "rope frequencies");
        HR_TRY(hr_rope_inv_freq(r, m->cfg.max_position_embeddings, m->inv_freq[k], &m->attn_scaling[k]));
    }
    return HR_OK;
}

/* cos/sin [b, 1, s, rot] of layer kind `kind` for positions [b, s] into
 * the activations "cos<k>", "sin<k>"; dynamic and longrope rope recompute
 * their frequencies from the largest position, as transformers does per
 * forward. */
static hr_status rope_tables(hr_fwd *f, hr_layer_kind kind, const int64_t *pos, const hr_tensor *positions,
                             hr_tensor **cos, hr_tensor **sin) {
    hr_model *m = f->m;
    const hr_rope_config *r = &m->cfg.rope[kind];
    int64_t half = r->rotary_dim / 2, n = f->b * f->s;
    float local[512];
    float *inv = m->inv_freq[kind];
    double scaling = m->attn_scaling[kind];
    if (!inv) {
        int64_t maxp = 0;
        for (int64_t i = 0; i < n; i++) maxp = pos[i] > maxp ? pos[i] : maxp;
        if (half > 512) return hr_error(HR_ERR_UNSUPPORTED, "rotary dim %lld too large", (long long)r->rotary_dim);
        inv = local;
        int64_t len = maxp + 1;
        if (r->type == HR_ROPE_DYNAMIC && len < r->max_position_embeddings) len = r->max_position_embeddings;
        HR_TRY(hr_rope_inv_freq(r, len, inv, &scaling));
    }
    const char *names[2][2] = {{"cos0", "sin0"}, {"cos1", "sin1"}};
    HR_TRY(hr_fwd_act(f, names[kind][0], 4, (int64_t[]){f->b, 1, f->s, r->rotary_dim}, cos));
    HR_TRY(hr_fwd_act(f, names[kind][1], 4, (int64_t[]){f->b, 1, f->s, r->rotary_dim}, sin));
    hr_tensor *inv_t = NULL, *pos_dev = NULL, *cos_v = NULL, *sin_v = NULL;
    HR_TRY(hr_tensor_wrap_host(HR_F32, 1, &half, NULL, inv, sizeof(float) * (size_t)half, NULL, NULL, &inv_t));
    hr_status s = hr_model_to_device(m, &inv_t);
    if (s == HR_OK) s = hr_tensor_alias(positions, &pos_dev);
    if (s == HR_OK) s = hr_model_to_device(m, &pos_dev);
    /* rope_cos_sin gives [b, s, rot]; the activations are [b, 1, s, rot] */
    if (s == HR_OK) s = hr_tensor_view(*cos, 3, (int64_t[]){f->b, f->s, r->rotary_dim}, &cos_v);
    if (s == HR_OK) s = hr_tensor_view(*sin, 3, (int64_t[]){f->b, f->s, r->rotary_dim}, &sin_v);
    if (s == HR_OK) {
        hr_attrs_rope_cos_sin a = {.attention_scaling = scaling, .dtype = m->dtype};
        hr_tensor *o[2] = {cos_v, sin_v};
        s = hr_op_run(HR_OP_rope_cos_sin, &a, IN_(pos_dev, inv_t), 2, o, 2);
    }
    hr_tensor_free(inv_t);
    hr_tensor_free(pos_dev);
    hr_tensor_free(cos_v);
    hr_tensor_free(sin_v);
    return s;
}

hr_status hr_model_rope_all(hr_fwd *f, const int64_t *pos, const hr_tensor *positions, hr_tensor **tables) {
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        tables[2 * k] = tables[2 * k + 1] = NULL;
        if (!hr_model_has_kind(f->m, (hr_layer_kind)k)) continue;
        HR_TRY(rope_tables(f, (hr_layer_kind)k, pos, positions, &tables[2 * k], &tables[2 * k + 1]));
        f->cos[k] = tables[2 * k];
        f->sin[k] = tables[2 * k + 1];
    }
    return HR_OK;
}

static bool has_shape(const hr_tensor *t, hr_dtype dt, int64_t b, int64_t n, int64_t v) {
    return t && t->dtype == dt && t->ndim == 3 && t->shape[0] == b && t->shape[1] == n && t->shape[2] == v;
}

/* Logits of the final-normed rows h [b, n, hidden] into *logits, reused
 * when it already has the shape and dtype (decode steps): f32, a
 * reduced-precision model's head output cast through an activation as
 * transformers' logits are; with `f32` false, the head output itself, in
 * the model's dtype (the caller widens the rows it reads, skipping a pass
 * over [b, n, vocab]). */
static hr_status logits_of(hr_fwd *f, const hr_tensor *h, bool f32, hr_tensor **logits) {
    hr_model *m = f->m;
    int64_t b = h->shape[0], n = h->shape[1], v = m->cfg.vocab_size;
    hr_dtype dt = f32 ? HR_F32 : m->dtype;
    if (!has_shape(*logits, dt, b, n, v)) {
        hr_tensor_free(*logits);
        *logits = NULL;
        HR_TRY(hr_tensor_empty(m->dev, dt, 3, (int64_t[]){b, n, v}, logits));
    }
    hr_tensor *head = *logits;
    if (dt != m->dtype) HR_TRY(hr_fwd_act(f, "head", 3, (int64_t[]){b, n, v}, &head));
    HR_TRY(m->arch->head ? m->arch->head(f, h, head) : hr_build_head(f, h, 0, head));
    if (head == *logits) return HR_OK;
    hr_attrs_cast a = {.dtype = HR_F32};
    return hr_op_run(HR_OP_cast, &a, IN_(head), 1, logits, 1);
}

hr_status hr_model_forward_core(hr_fwd *f, const hr_tensor *ids, bool last_only, bool f32_logits,
                                hr_tensor **logits) {
    hr_model *m = f->m;
    int64_t hid = m->cfg.hidden_size;
    HR_TRY(hr_fwd_act(f, "x", 3, (int64_t[]){f->b, f->s, hid}, &f->x));
    HR_TRY(hr_fwd_act(f, "h", 3, (int64_t[]){f->b, f->s, hid}, &f->h));
    HR_TRY(m->arch->embed ? m->arch->embed(f, ids) : hr_build_embedding(f, ids, 1));
    HR_TRY(m->arch->forward(f));
    hr_tensor *h_last = NULL;
    hr_status st = last_only ? hr_tensor_narrow(f->h, 1, f->s - 1, 1, &h_last) : hr_tensor_alias(f->h, &h_last);
    if (st == HR_OK) st = logits_of(f, h_last, f32_logits, logits);
    hr_tensor_free(h_last);
    return st;
}

hr_status hr_model_check_forward(const hr_model *m, const int64_t *ids, int64_t b, int64_t s,
                                 const hr_kv_cache *cache) {
    if (cache->batch != b)
        return hr_error(HR_ERR_SHAPE, "forward: batch %lld does not match the KV cache's batch %lld", (long long)b,
                        (long long)cache->batch);
    if (cache->n_layers != m->cfg.n_layers || cache->window != m->cfg.sliding_window)
        return hr_error(HR_ERR_INVALID_ARG, "forward: the KV cache was made for another model");
    int64_t past = cache->len, t = past + s;
    if (t > cache->capacity)
        return hr_error(HR_ERR_INVALID_ARG, "forward: %lld cached + %lld new tokens do not fit the KV cache of %lld",
                        (long long)past, (long long)s, (long long)cache->capacity);
    for (int64_t i = 0; i < b * s; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
            return hr_error(HR_ERR_INVALID_ARG, "forward: input_ids[%lld] = %lld is outside the vocabulary of %lld",
                            (long long)i, (long long)ids[i], (long long)m->cfg.vocab_size);
    return HR_OK;
}

/* ---- eager --------------------------------------------------------------------- */

hr_status hr_model_forward_host(hr_model *m, const int64_t *ids, const int64_t *mask, const int64_t *pos,
                                int64_t b, int64_t s, hr_kv_cache *cache, bool last_only, bool f32_logits,
                                hr_tensor **logits, bool exact) {
    HR_TRY(hr_model_check_forward(m, ids, b, s, cache));
    hr_fwd f = {.m = m, .cache = cache, .sc = &m->scratch, .b = b, .s = s};
    hr_tensor *ids_t = NULL, *pos_t = NULL, *tables[2 * HR_LAYER_KINDS] = {0}, *masks[HR_LAYER_KINDS] = {0};
    int64_t shape[2] = {b, s};
    size_t bytes = sizeof(int64_t) * (size_t)(b * s);
    hr_status st = hr_tensor_wrap_host(HR_I64, 2, shape, NULL, (void *)ids, bytes, NULL, NULL, &ids_t);
    if (st == HR_OK) st = hr_tensor_wrap_host(HR_I64, 2, shape, NULL, (void *)pos, bytes, NULL, NULL, &pos_t);
    if (st == HR_OK) st = hr_model_rope_all(&f, pos, pos_t, tables);
    if (st == HR_OK) st = hr_model_to_device(m, &ids_t);
    for (int k = 0; k < HR_LAYER_KINDS && st == HR_OK; k++)
        if (hr_model_has_kind(m, (hr_layer_kind)k))
            st = hr_kv_plan_eager(cache, (hr_layer_kind)k, s, mask, m->dev, &f.kv[k], &masks[k]);
    for (int k = 0; k < HR_LAYER_KINDS && exact; k++) {
        /* keys in position order: a ring's oldest slot is the one after the write */
        f.kv[k].exact = true;
        f.kv[k].exact_from = f.kv[k].mode == HR_KV_RING_STEP ? (f.kv[k].at + 1) % cache->slots[k] : 0;
    }
    if (st == HR_OK) st = hr_model_forward_core(&f, ids_t, last_only, f32_logits, logits);
    hr_tensor_free(ids_t);
    hr_tensor_free(pos_t);
    for (int k = 0; k < HR_LAYER_KINDS; k++) hr_tensor_free(masks[k]);
    if (st == HR_OK) cache->len += s;
    return st;
}
