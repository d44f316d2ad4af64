/* The compiled forward: the same layers as the eager forward, written with
 * static shapes (new keys and values go to tensor-given cache slots, and
 * attention reads the whole cache under a mask), so that hr_jit captures it
 * once per [batch, tokens, capacity] and replays it. Everything that
 * changes from call to call is an input: token ids, rope tables, cache
 * slots, mask and the cache itself; the weights are the plan's constants,
 * resolved by their HF names when a plan comes from the disk cache. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/hash.h"
#include "models/kv_cache.h"
#include "models/model_impl.h"

enum { IN_IDS, IN_COS, IN_SIN, IN_CACHE_POS, IN_MASK, IN_K, IN_V, N_IN };

/* Activations made during the capture live in the plan's arena: the body
 * runs on a scratch of its own, not the eager forward's. */
static hr_status body(hr_model *m, const hr_tensor *const *in, hr_tensor **out, bool last_only) {
    hr_scratch eager = m->scratch;
    const int64_t *sh = hr_tensor_shape(in[IN_IDS]);
    hr_status st = hr_model_scratch_alloc(m, sh[0], sh[1], &m->scratch);
    if (st == HR_OK) {
        hr_fwd_ctx f = {.cache = m->jit_cache, .cos = in[IN_COS], .sin = in[IN_SIN], .mask = in[IN_MASK],
                        .cache_pos = in[IN_CACHE_POS]};
        st = hr_model_forward_core(m, in[IN_IDS], &f, last_only, false, &out[0]);
    }
    hr_model_scratch_free(&m->scratch);
    m->scratch = eager;
    return st;
}

static hr_status body_all(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    return body(ctx, in, out, false);
}

static hr_status body_last(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    return body(ctx, in, out, true);
}

static const hr_tensor *named(const hr_tensor *t, const char *name) {
    return t && !strcmp(hr_tensor_name(t), name) ? t : NULL;
}

static const hr_tensor *resolve_weight(void *ctx, const char *name) {
    const hr_model *m = ctx;
    const hr_tensor *t = named(m->embed, name);
    if (!t) t = named(m->final_norm, name);
    if (!t) t = named(m->lm_head, name);
    for (int64_t l = 0; !t && l < m->cfg.n_layers; l++) {
        const hr_layer_weights *lw = &m->layers[l];
#define FIND_(f) if (!t) t = named(lw->f, name);
        HR_LAYER_WEIGHT_FIELDS(FIND_)
#undef FIND_
    }
    return t;
}

/* What fixes the graph besides the input shapes: the architecture, its
 * sizes and flags, the dtype and the norm epsilon baked into attrs; and
 * the graph's version (2: the logits left in the model's dtype), so that
 * plans an older graph left on disk are not taken for this one. */
static uint64_t fingerprint(const hr_model *m) {
    const hr_model_config *c = &m->cfg;
    int64_t dims[] = {c->vocab_size, c->hidden_size, c->intermediate_size, c->n_layers, c->n_heads,
                      c->n_kv_heads, c->head_dim, c->rope.rotary_dim, m->dtype, c->tie_word_embeddings,
                      c->attention_bias, c->qkv_bias, c->mlp_bias, c->qk_norm, 2};
    uint64_t h = hr_fnv1a(HR_FNV_OFFSET, c->arch, strlen(c->arch));
    h = hr_fnv1a(h, dims, sizeof dims);
    return hr_fnv1a(h, &c->rms_norm_eps, sizeof c->rms_norm_eps);
}

static hr_status jit_for(hr_model *m, bool last_only, hr_jit **out) {
    if (!m->jit[last_only]) {
        hr_jit_options o = {.name = last_only ? "forward-last" : "forward", .fn = last_only ? body_last : body_all,
                            .ctx = m, .resolve = resolve_weight, .resolve_ctx = m, .fingerprint = fingerprint(m),
                            .fold_constants = true};
        HR_TRY(hr_jit_create(&o, &m->jit[last_only]));
    }
    *out = m->jit[last_only];
    return HR_OK;
}

/* bool [b, 1, s, capacity]: query i (slot past + i) sees slot j <= past + i
 * holding a real token, and itself. */
static hr_status static_mask(const int64_t *mask, int64_t b, int64_t s, int64_t past, int64_t cap, hr_tensor **out) {
    HR_TRY(hr_tensor_empty(hr_device_cpu(), HR_BOOL, 4, (int64_t[]){b, 1, s, cap}, out));
    uint8_t *p = hr_tensor_data(*out);
    int64_t t = past + s;
    for (int64_t r = 0; r < b; r++)
        for (int64_t i = 0; i < s; i++) {
            uint8_t *row = p + (r * s + i) * cap;
            for (int64_t j = 0; j < cap; j++)
                row[j] = j <= past + i && (!mask || mask[r * t + j] != 0 || j == past + i);
        }
    return HR_OK;
}

hr_status hr_model_forward_compiled(hr_model *m, const int64_t *ids, const int64_t *mask, const int64_t *pos,
                                    int64_t b, int64_t s, hr_kv_cache *cache, bool last_only,
                                    hr_tensor **logits) {
    *logits = NULL;
    HR_TRY(hr_model_check_forward(m, ids, b, s, cache));
    int64_t past = cache->len;
    HR_TRY(hr_model_scratch_prepare(m, b, s));
    hr_tensor *ids_t = NULL, *pos_t = NULL, *slots = NULL, *mask_t = NULL;
    hr_jit *jit = NULL;
    int64_t shape[2] = {b, s};
    hr_status st = hr_tensor_from_host(hr_device_cpu(), HR_I64, 2, shape, ids, sizeof(int64_t) * (size_t)(b * s), &ids_t);
    if (st == HR_OK)
        st = hr_tensor_wrap_host(HR_I64, 2, shape, NULL, (void *)pos, sizeof(int64_t) * (size_t)(b * s), NULL, NULL,
                                 &pos_t);
    if (st == HR_OK) st = hr_model_rope_tables(m, pos, b * s, pos_t);
    if (st == HR_OK) st = hr_arange(hr_device_cpu(), (double)past, (double)(past + s), 1, HR_I64, &slots);
    if (st == HR_OK) st = static_mask(mask, b, s, past, cache->capacity, &mask_t);
    if (st == HR_OK) st = hr_model_to_device(m, &ids_t);
    if (st == HR_OK) st = hr_model_to_device(m, &slots);
    if (st == HR_OK) st = hr_model_to_device(m, &mask_t);
    if (st == HR_OK) st = jit_for(m, last_only, &jit);
    if (st == HR_OK) {
        const hr_tensor *in[N_IN] = {ids_t, m->scratch.cos, m->scratch.sin, slots, mask_t, cache->k_all, cache->v_all};
        m->jit_cache = cache;
        st = hr_jit_call(jit, in, N_IN, logits, 1);
        m->jit_cache = NULL;
    }
    hr_tensor_free(ids_t);
    hr_tensor_free(pos_t);
    hr_tensor_free(slots);
    hr_tensor_free(mask_t);
    if (st == HR_OK) cache->len = past + s;
    return st;
}
