/* The static KV cache and how one forward call reads and writes it.
 *
 * Full-attention layers keep every token: [batch, kv_heads, capacity,
 * head_dim]. Sliding-window layers keep the last `ring` tokens (the window,
 * or the capacity when that is smaller) in a ring buffer: token position p
 * lives in slot p % ring. All layers of one kind share one buffer for keys
 * and one for values, so a compiled forward takes each as one input; each
 * kind has its own kv heads and head_dim. A layer that reads an earlier
 * layer's keys and values (Gemma 4's shared KV layers) has no slot there:
 * its views are its source's. */
#ifndef HR_MODELS_KV_CACHE_H
#define HR_MODELS_KV_CACHE_H

#include "models/model_impl.h"

struct hr_kv_cache {
    int64_t batch, capacity, len;
    int64_t n_layers;
    int64_t window;                         /* sliding layers' window (0: none) */
    int64_t slots[HR_LAYER_KINDS];          /* per layer of the kind: capacity, or the ring's size */
    /* [layers of the kind, batch, kv_heads, slots, head_dim]; NULL when no
     * layer is of the kind */
    hr_tensor *k_all[HR_LAYER_KINDS], *v_all[HR_LAYER_KINDS];
    hr_tensor **k, **v;                     /* [layer] -> views [batch, kv_heads, slots, head_dim] */
    uint8_t *kind;                          /* [layer] hr_layer_kind */
    int64_t *source;                        /* [layer] the layer whose keys it reads (itself, or a kv_source) */
};

/* How a call's layers of one kind use the cache. */
typedef enum hr_kv_mode {
    /* Eager: new keys go to slots [at, at + s), attention reads slots
     * [0, at + s) (full layers; a ring that has not wrapped). */
    HR_KV_APPEND,
    /* Eager, one token: it goes to slot `at`, attention reads every slot of
     * the ring (each holds a token of the window). */
    HR_KV_RING_STEP,
    /* Eager, several tokens past a ring's end: attention reads the ring's
     * filled slots in position order (slots [split, n_ring) then [0,
     * split)) followed by the new keys, then the last `keep` new keys go
     * to slots keep_at.. (mod ring). */
    HR_KV_RING_CAT,
    /* Compiled: new keys go to the slots `slots` names (index_copy);
     * attention reads every slot under `mask` (full layers; a ring with
     * one new token). */
    HR_KV_INDEX,
    /* Compiled, several tokens into a ring: attention reads the whole ring
     * then the new keys under `mask`, then the last `keep` new keys go to
     * the slots `slots` names. */
    HR_KV_INDEX_CAT,
} hr_kv_mode;

typedef struct hr_kv_plan {
    hr_kv_mode mode;
    int64_t at;           /* APPEND, RING_STEP: first slot written */
    int64_t n_attend;     /* APPEND: slots read */
    int64_t n_ring, split;/* RING_CAT: filled slots and where position order starts */
    int64_t keep, keep_at;/* RING_CAT, INDEX_CAT: new keys kept and (eager) their first slot */
    int64_t window;       /* sdpa's window attribute (0: none) */
    bool causal;          /* sdpa's is_causal (no mask) */
    const hr_tensor *mask;  /* bool [b, 1, s, keys], or NULL */
    const hr_tensor *slots; /* INDEX*: i64 slot of each new (kept) key */
    bool exact;             /* sdpa's batch-invariant path, keys from slot exact_from */
    int64_t exact_from;
} hr_kv_plan;

/* Eager plan for tokens [past, past + s) with the host mask [b, past + s]
 * (NULL: no padding); allocates *mask_out when one is needed (the caller
 * frees it). */
hr_status hr_kv_plan_eager(const hr_kv_cache *c, hr_layer_kind kind, int64_t s, const int64_t *mask, hr_device *dev,
                           hr_kv_plan *p, hr_tensor **mask_out);
/* The plan a compiled forward of s tokens follows (its shapes fix it, not
 * the cache's length), over the mask and slots it receives as inputs. */
void hr_kv_plan_compiled(const hr_kv_cache *c, hr_layer_kind kind, int64_t s, const hr_tensor *mask,
                         const hr_tensor *slots, hr_kv_plan *p);
/* Compiled plan's host inputs for the same call: the mask and the slots,
 * each a new host tensor the caller frees (their shapes depend on b, s
 * and the cache only, so one plan serves every call of that shape). */
hr_status hr_kv_inputs_compiled(const hr_kv_cache *c, hr_layer_kind kind, int64_t s, const int64_t *mask,
                                hr_tensor **mask_out, hr_tensor **slots_out);

#endif
