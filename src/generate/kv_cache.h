/* Static KV cache layout, shared by the model forward and generation. */
#ifndef HR_GENERATE_KV_CACHE_H
#define HR_GENERATE_KV_CACHE_H

#include "hubrt/model.h"

struct hr_kv_cache {
    int64_t batch, capacity, len;
    int64_t n_layers;
    hr_tensor **k, **v; /* [layer] -> [batch, kv_heads, capacity, head_dim] */
};

#endif
