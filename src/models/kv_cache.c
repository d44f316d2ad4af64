/* Static KV cache: every layer's keys and values preallocated once at
 * [batch, kv_heads, capacity, head_dim], all layers in one buffer; eager
 * forwards write their new tokens into narrowed views and attend over the
 * filled prefix, compiled ones index_copy them at tensor positions and
 * attend over the whole capacity under a mask. */
#include <stdlib.h>

#include "core/error.h"
#include "models/kv_cache.h"
#include "models/model_impl.h"

hr_status hr_kv_cache_create(const hr_model *m, int64_t batch, int64_t max_len, hr_kv_cache **out) {
    if (!m || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_create: NULL argument");
    *out = NULL;
    if (batch < 1 || max_len < 1)
        return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_create: batch %lld and max_len %lld must be >= 1",
                        (long long)batch, (long long)max_len);
    hr_kv_cache *c = calloc(1, sizeof *c);
    int64_t L = m->cfg.n_layers;
    if (c) {
        c->k = calloc((size_t)L, sizeof *c->k);
        c->v = calloc((size_t)L, sizeof *c->v);
    }
    if (!c || !c->k || !c->v) {
        hr_kv_cache_free(c);
        return hr_error(HR_ERR_OOM, "hr_kv_cache_create: out of memory");
    }
    c->batch = batch;
    c->capacity = max_len;
    c->n_layers = L;
    int64_t shape[5] = {L, batch, m->cfg.n_kv_heads, max_len, m->cfg.head_dim};
    /* Zeroed: a compiled forward attends over every slot under a mask, and
     * a masked slot still enters P V with weight 0, which garbage (NaN)
     * would poison. */
    hr_status s = hr_tensor_zeros(m->dev, m->dtype, 5, shape, &c->k_all);
    if (s == HR_OK) s = hr_tensor_zeros(m->dev, m->dtype, 5, shape, &c->v_all);
    for (int64_t l = 0; s == HR_OK && l < L; l++) {
        s = hr_tensor_select(c->k_all, 0, l, &c->k[l]);
        if (s == HR_OK) s = hr_tensor_select(c->v_all, 0, l, &c->v[l]);
    }
    if (s != HR_OK) {
        hr_kv_cache_free(c);
        return hr_error_context(s, "KV cache for batch %lld x %lld tokens", (long long)batch, (long long)max_len);
    }
    *out = c;
    return HR_OK;
}

void hr_kv_cache_free(hr_kv_cache *c) {
    if (!c) return;
    for (int64_t l = 0; l < c->n_layers; l++) {
        if (c->k) hr_tensor_free(c->k[l]);
        if (c->v) hr_tensor_free(c->v[l]);
    }
    free(c->k);
    free(c->v);
    hr_tensor_free(c->k_all);
    hr_tensor_free(c->v_all);
    free(c);
}

int64_t hr_kv_cache_len(const hr_kv_cache *c) { return c ? c->len : 0; }
int64_t hr_kv_cache_capacity(const hr_kv_cache *c) { return c ? c->capacity : 0; }
void hr_kv_cache_reset(hr_kv_cache *c) {
    if (c) c->len = 0;
}
