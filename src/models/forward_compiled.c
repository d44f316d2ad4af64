/* The compiled forward: the same architecture forward as the eager one,
 * with static shapes (new keys and values go to tensor-given cache slots,
 * attention reads whole caches under masks), so that hr_jit captures it
 * once per [batch, tokens, capacity] and replays it. Everything that
 * changes from call to call is an input: token ids, and per layer kind
 * the rope tables, cache slots, mask and the cache buffers; the weights
 * are the plan's constants, resolved by their HF names when a plan comes
 * from the disk cache. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/hash.h"
#include "models/forward_internal.h"

/* inputs: ids, then per kind present cos, sin, slots, mask, then per kind
 * present the key and value buffers */
enum { IN_PER_KIND = 4, CACHE_PER_KIND = 2 };

/* Activations made during the capture live in the plan's arena: the body
 * runs on a scratch of its own, not the eager forward's. */
static hr_status body(hr_model *m, const hr_tensor *const *in, hr_tensor **out, bool last_only) {
    const int64_t *sh = hr_tensor_shape(in[0]);
    hr_scratch sc = {0};
    hr_fwd f = {.m = m, .cache = m->jit_cache, .sc = &sc, .b = sh[0], .s = sh[1]};
    int at = 1;
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        if (!hr_model_has_kind(m, (hr_layer_kind)k)) continue;
        f.cos[k] = in[at];
        f.sin[k] = in[at + 1];
        hr_kv_plan_compiled(f.cache, (hr_layer_kind)k, f.s, in[at + 3], in[at + 2], &f.kv[k]);
        at += IN_PER_KIND;
    }
    hr_status st = hr_model_forward_core(&f, in[0], last_only, false, &out[0]);
    hr_scratch_free(&sc);
    return st;
}

static hr_status body_all(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    return body(ctx, in, out, false);
}

static hr_status body_last(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    return body(ctx, in, out, true);
}

static const hr_tensor *resolve_weight(void *ctx, const char *name) { return hr_model_find_weight(ctx, name); }

/* What fixes the graph besides the input shapes: the architecture, its
 * sizes and own config, the layer kinds, the dtype and the norm epsilon
 * baked into attrs, the experts and their implementation, this rank's tensor-parallel share; and the graph's
 * version (3: architectures write their
 * forward), so that plans an older graph left on disk are not taken for
 * this one. */
static uint64_t fingerprint(const hr_model *m) {
    const hr_model_config *c = &m->cfg;
    int64_t dims[] = {c->vocab_size, c->hidden_size, c->intermediate_size, c->n_layers, c->n_heads,
                      c->n_kv_heads, c->head_dim, c->rope[0].rotary_dim, c->rope[1].rotary_dim, m->dtype,
                      c->tie_word_embeddings, c->sliding_window, c->from_gguf, c->n_experts,
                      c->n_experts_per_tok, c->moe_intermediate_size, m->experts_per_expert, m->experts_impl,
                      c->kind_head_dim[0], c->kind_head_dim[1], c->kind_kv_heads[0], c->kind_kv_heads[1],
                      c->rope[0].type, c->rope[1].type, c->rope[0].rotated_dim, c->rope[1].rotated_dim, 3};
    uint64_t h = hr_fnv1a(HR_FNV_OFFSET, c->arch, strlen(c->arch));
    h = hr_fnv1a(h, dims, sizeof dims);
    if (c->kv_source) h = hr_fnv1a(h, c->kv_source, sizeof *c->kv_source * (size_t)c->n_layers);
    h = hr_fnv1a(h, m->arch_cfg, m->arch->cfg_size);
    h = hr_fnv1a(h, c->layer_kind, (size_t)c->n_layers);
    /* a rank's plan bakes its share into attrs (the vocab rows its lookup
     * holds): each rank's is its own */
    const hr_tp *t = &m->tp;
    int64_t tp[] = {t->size, t->rank, t->attn, t->mlp, t->embed, t->head, t->heads0, t->kv0, t->vocab0, t->vocab_n,
                    t->ep, t->experts0, t->experts_n};
    h = hr_fnv1a(h, tp, sizeof tp);
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

#define MAX_IN (1 + (IN_PER_KIND + CACHE_PER_KIND) * HR_LAYER_KINDS)

hr_status hr_model_forward_compiled(hr_model *m, const int64_t *ids, const int64_t *mask, const int64_t *pos,
                                    int64_t b, int64_t s, hr_kv_cache *cache, bool last_only,
                                    hr_tensor **logits) {
    *logits = NULL;
    HR_TRY(hr_model_check_forward(m, ids, b, s, cache));
    hr_fwd f = {.m = m, .cache = cache, .sc = &m->scratch, .b = b, .s = s};
    hr_tensor *ids_t = NULL, *pos_t = NULL, *tables[2 * HR_LAYER_KINDS] = {0};
    hr_tensor *masks[HR_LAYER_KINDS] = {0}, *slots[HR_LAYER_KINDS] = {0};
    hr_jit *jit = NULL;
    int64_t shape[2] = {b, s};
    hr_status st = hr_tensor_from_host(hr_device_cpu(), HR_I64, 2, shape, ids, sizeof(int64_t) * (size_t)(b * s), &ids_t);
    if (st == HR_OK)
        st = hr_tensor_wrap_host(HR_I64, 2, shape, NULL, (void *)pos, sizeof(int64_t) * (size_t)(b * s), NULL, NULL,
                                 &pos_t);
    if (st == HR_OK) st = hr_model_rope_all(&f, pos, pos_t, tables);
    if (st == HR_OK) st = hr_model_to_device(m, &ids_t);
    const hr_tensor *in[MAX_IN] = {ids_t};
    int n_in = 1;
    for (int k = 0; k < HR_LAYER_KINDS && st == HR_OK; k++) {
        if (!hr_model_has_kind(m, (hr_layer_kind)k)) continue;
        st = hr_kv_inputs_compiled(cache, (hr_layer_kind)k, s, mask, &masks[k], &slots[k]);
        if (st == HR_OK) st = hr_model_to_device(m, &masks[k]);
        if (st == HR_OK) st = hr_model_to_device(m, &slots[k]);
        in[n_in++] = tables[2 * k];
        in[n_in++] = tables[2 * k + 1];
        in[n_in++] = slots[k];
        in[n_in++] = masks[k];
    }
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        if (!cache->k_all[k]) continue;
        in[n_in++] = cache->k_all[k];
        in[n_in++] = cache->v_all[k];
    }
    if (st == HR_OK) st = jit_for(m, last_only, &jit);
    if (st == HR_OK) {
        m->jit_cache = cache;
        st = hr_jit_call(jit, in, n_in, logits, 1);
        m->jit_cache = NULL;
    }
    hr_tensor_free(ids_t);
    hr_tensor_free(pos_t);
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        hr_tensor_free(masks[k]);
        hr_tensor_free(slots[k]);
    }
    if (st == HR_OK) cache->len += s;
    return st;
}
