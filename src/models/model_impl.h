/* Internal model machinery: typed config, weight store, layer weights, the
 * architecture table and the shared blocks the architectures are built
 * from. */
#ifndef HR_MODELS_MODEL_IMPL_H
#define HR_MODELS_MODEL_IMPL_H

#include "core/tensor_impl.h"
#include "hubrt/graph.h"
#include "hubrt/io.h"
#include "hubrt/model.h"

/* The fields of config.json the decoder-only architectures read. */
typedef struct hr_model_config {
    char arch[64];
    int64_t vocab_size, hidden_size, intermediate_size;
    int64_t n_layers, n_heads, n_kv_heads, head_dim;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias; /* q/k/v/o biases (Llama attention_bias) */
    bool qkv_bias;       /* q/k/v biases only (Qwen2) */
    bool mlp_bias;
    bool qk_norm;        /* per-head rms norm of q and k (Qwen3) */
    hr_rope_config rope;
    double *rope_short, *rope_long; /* owned; longrope factors [rotary_dim/2] */
    hr_dtype dtype;                 /* torch_dtype / dtype, f32 when absent */
    /* generation_config.json, with config.json's eos/pad/bos ids merged */
    hr_generation_config gen;
} hr_model_config;

/* Reads config.json and generation_config.json from dir; *doc keeps
 * config.json for the architecture's own fields. */
hr_status hr_model_config_load(const char *dir, hr_model_config *cfg, hr_json_doc **doc);
void hr_model_config_free(hr_model_config *cfg);

/* ---- layers and the model --------------------------------------------- */

/* Every tensor field of hr_layer_weights, for code that walks them all. */
#define HR_LAYER_WEIGHT_FIELDS(X) \
    X(attn_norm) X(wq) X(wk) X(wv) X(wo) X(bq) X(bk) X(bv) X(bo) X(q_norm) X(k_norm) \
    X(mlp_norm) X(w_gate) X(w_up) X(w_down) X(b_gate) X(b_up) X(b_down)

typedef struct hr_layer_weights {
    hr_tensor *attn_norm;          /* [hidden] input_layernorm */
    hr_tensor *wq, *wk, *wv, *wo;  /* [hq*d, hidden], [hkv*d, hidden] x2, [hidden, hq*d] */
    hr_tensor *bq, *bk, *bv, *bo;  /* biases or NULL */
    hr_tensor *q_norm, *k_norm;    /* [d] or NULL */
    hr_tensor *mlp_norm;           /* [hidden] post_attention_layernorm */
    hr_tensor *w_gate, *w_up;      /* [inter, hidden] */
    hr_tensor *w_down;             /* [hidden, inter] */
    hr_tensor *b_gate, *b_up, *b_down; /* or NULL */
} hr_layer_weights;

/* Activations reused across forward calls of the same [b, s]: decode
 * steps allocate nothing. */
typedef struct hr_scratch {
    int64_t b, s;
    hr_tensor *x;        /* [b, s, hidden] residual stream */
    hr_tensor *h;        /* [b, s, hidden] normed */
    hr_tensor *q;        /* [b, s, hq*d] */
    hr_tensor *k, *v;    /* [b, s, hkv*d] */
    hr_tensor *qn, *kn;  /* [b, s, hq|hkv, d] (q/k norm) */
    hr_tensor *qr;       /* [b, hq, s, d] roped q */
    hr_tensor *attn;     /* [b, s, hq, d] attention output */
    hr_tensor *o;        /* [b, s, hidden] */
    hr_tensor *gate, *up, *act; /* [b, s, inter] */
    hr_tensor *cos, *sin;       /* [b, 1, s, rot] */
    hr_tensor *head;            /* [b, s | 1, vocab] lm_head output in the model dtype */
} hr_scratch;

typedef struct hr_arch hr_arch;

/* What one forward call's layers share. */
typedef struct hr_fwd_ctx {
    hr_kv_cache *cache;
    int64_t past;               /* tokens in the cache before this call */
    const hr_tensor *cos, *sin; /* [b, 1, s, rot] */
    const hr_tensor *mask;      /* bool [b, 1, s, past + s], NULL: causal only */
    /* Static shapes (the compiled forward): i64 [s] cache slots the new
     * tokens go to, and mask is [b, 1, s, capacity]; nothing depends on past. */
    const hr_tensor *cache_pos;
} hr_fwd_ctx;

struct hr_model {
    const hr_arch *arch;
    hr_model_config cfg;
    hr_dtype dtype;
    hr_device *dev;
    hr_checkpoint *ckpt;
    hr_tensor *embed;      /* [vocab, hidden] */
    hr_tensor *final_norm; /* [hidden] */
    hr_tensor *lm_head;    /* [vocab, hidden], the embedding when tied */
    hr_layer_weights *layers;
    float *inv_freq;       /* [rot/2] for seq-independent rope types */
    double attn_scaling;
    hr_scratch scratch;
    /* The compiled forward (forward_compiled.c): one jit returning every
     * position's logits, one the last position's; plans per input shape. */
    hr_jit *jit[2];
    hr_kv_cache *jit_cache; /* the cache of the call being captured */
};

/* What one architecture adds to the shared blocks. */
struct hr_arch {
    const char *name; /* config.json "architectures" entry */
    /* Sets the architecture's flags from config.json (biases, norms). */
    hr_status (*configure)(hr_json_obj root, hr_model_config *cfg);
    /* Loads layer `i`'s weights by their HF names. */
    hr_status (*load_layer)(hr_model *m, int64_t i, hr_layer_weights *lw);
    /* Runs layer `layer` on m->scratch.x in place. */
    hr_status (*forward_layer)(const hr_model *m, const hr_layer_weights *lw, int64_t layer,
                               const hr_fwd_ctx *f);
};

extern const hr_arch hr_arch_llama, hr_arch_mistral, hr_arch_qwen2, hr_arch_qwen3;
const hr_arch *hr_arch_find(const char *name);

/* The forward on host arrays: ids and pos [b, s], mask [b, past + s] or
 * NULL. Writes the tokens into the cache and logits [b, s | 1, vocab] into
 * *logits: reused when it has that shape and dtype, else (re)allocated.
 * The logits are f32 (bf16 or f16 values for such a model, as transformers
 * casts its head's output), or with f32_logits false the head's output in
 * the model's dtype, the same values before widening. */
hr_status hr_model_forward_host(hr_model *m, const int64_t *ids, const int64_t *mask, const int64_t *pos,
                                int64_t b, int64_t s, hr_kv_cache *cache, bool last_only, bool f32_logits,
                                hr_tensor **logits);

/* Shared by the eager and the compiled forward (model.c). */
hr_status hr_model_check_forward(const hr_model *m, const int64_t *ids, int64_t b, int64_t s,
                                 const hr_kv_cache *cache);
hr_status hr_model_scratch_alloc(const hr_model *m, int64_t b, int64_t s, hr_scratch *out);
/* m->scratch for [b, s], reallocated only when the shape changes. */
hr_status hr_model_scratch_prepare(hr_model *m, int64_t b, int64_t s);
void hr_model_scratch_free(hr_scratch *sc);
/* Replaces a host tensor by its copy on the model's device (no-op there). */
hr_status hr_model_to_device(const hr_model *m, hr_tensor **t);
/* cos/sin of positions [b, s] into m->scratch (which must be [b, s]). */
hr_status hr_model_rope_tables(hr_model *m, const int64_t *pos, int64_t n, const hr_tensor *positions);
/* Embedding, layers, final norm and head over m->scratch. */
hr_status hr_model_forward_core(hr_model *m, const hr_tensor *ids, const hr_fwd_ctx *f, bool last_only,
                                bool f32_logits, hr_tensor **logits);
/* The forward with static shapes, compiled once per [b, s, capacity] and
 * replayed (forward_compiled.c); the contract of hr_model_forward_host
 * with f32_logits false (generate's), but *logits always receives a new
 * tensor. */
hr_status hr_model_forward_compiled(hr_model *m, const int64_t *ids, const int64_t *mask, const int64_t *pos,
                                    int64_t b, int64_t s, hr_kv_cache *cache, bool last_only,
                                    hr_tensor **logits);

/* ---- shared blocks (blocks.c) ----------------------------------------- */

/* Loads `name` with the given shape in the model dtype into *out: a
 * zero-copy view of the mapping when the file's dtype matches, cast once
 * here otherwise. Errors name the tensor. */
hr_status hr_model_weight(hr_model *m, const char *name, int ndim, const int64_t *shape,
                          hr_tensor **out);
/* The Llama-family layer tensors under model.layers.<i>.; the flags of
 * cfg pick the optional ones (biases, q/k norms). */
hr_status hr_block_load_layer(hr_model *m, int64_t i, hr_layer_weights *lw);
void hr_layer_weights_free(hr_layer_weights *lw);
/* rms_norm(x) * w into out. */
hr_status hr_block_norm(const hr_model *m, const hr_tensor *x, const hr_tensor *w, hr_tensor *out);
hr_status hr_block_residual(hr_tensor *x, const hr_tensor *y);
/* Self-attention of the normed h [b, s, hidden] over the cache, into out. */
hr_status hr_block_attention(const hr_model *m, const hr_layer_weights *lw, int64_t layer,
                             const hr_fwd_ctx *f, const hr_tensor *h, hr_tensor *out);
/* down(silu(gate(h)) * up(h)) into out. */
hr_status hr_block_mlp(const hr_model *m, const hr_layer_weights *lw, const hr_tensor *h,
                       hr_tensor *out);
/* Pre-norm decoder layer: x += attn(norm(x)); x += mlp(norm(x)). Layers
 * run in order 0..n-1: each one's last residual add also writes the next
 * layer's normed input into scratch.h, where that layer takes it. */
hr_status hr_block_decoder_layer(const hr_model *m, const hr_layer_weights *lw, int64_t layer,
                                 const hr_fwd_ctx *f);

#endif
