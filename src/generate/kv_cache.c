/* Static KV cache: every layer's keys and values preallocated once at
 * [batch, kv_heads, capacity, head_dim]; forwards write their new tokens
 * into narrowed views and attend over the filled prefix. */
#include <stdlib.h>

#include "core/error.h"
#include "generate/kv_cache.h"
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
    int64_t shape[4] = {batch, m->cfg.n_kv_heads, max_len, m->cfg.head_dim};
    for (int64_t l = 0; l < L; l++) {
        hr_status s = hr_tensor_empty(m->dev, m->dtype, 4, shape, &c->k[l]);
        if (s == HR_OK) s = hr_tensor_empty(m->dev, m->dtype, 4, shape, &c->v[l]);
        if (s != HR_OK) {
            hr_kv_cache_free(c);
            return hr_error_context(s, "KV cache for batch %lld x %lld tokens", (long long)batch,
                                    (long long)max_len);
        }
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
    free(c);
}

int64_t hr_kv_cache_len(const hr_kv_cache *c) { return c ? c->len : 0; }
int64_t hr_kv_cache_capacity(const hr_kv_cache *c) { return c ? c->capacity : 0; }
void hr_kv_cache_reset(hr_kv_cache *c) {
    if (c) c->len = 0;
}
