/* Static KV cache layout, shared by the model forward and generation. */
#ifndef HR_MODELS_KV_CACHE_H
#define HR_MODELS_KV_CACHE_H

#include "hubrt/model.h"

struct hr_kv_cache {
    int64_t batch, capacity, len;
    int64_t n_layers;
    /* One buffer each for keys and values, so that a compiled forward takes
     * the whole cache as two inputs: [layer, batch, kv_heads, capacity, head_dim] */
    hr_tensor *k_all, *v_all;
    hr_tensor **k, **v; /* [layer] -> views [batch, kv_heads, capacity, head_dim] */
};

#endif
