/* The blocks an architecture's forward is written with: norms, residual
 * adds fused with the norm that reads their sum, attention over the KV
 * cache, gated MLPs, the embedding and the head. Each block runs catalog
 * ops only (eager, or captured by the compiled forward; on any device)
 * and writes into the forward's named activations. */
#ifndef HR_MODELS_BLOCKS_H
#define HR_MODELS_BLOCKS_H

#include "models/kv_cache.h"

/* What one forward call's blocks share. */
struct hr_fwd {
    hr_model *m;
    hr_kv_cache *cache;
    hr_scratch *sc;
    int64_t b, s;
    const hr_tensor *cos[HR_LAYER_KINDS], *sin[HR_LAYER_KINDS]; /* [b, 1, s, rot] per layer kind */
    hr_kv_plan kv[HR_LAYER_KINDS];                              /* how each kind's layers use the cache */
    hr_tensor *x; /* [b, s, hidden] residual stream */
    hr_tensor *h; /* [b, s, hidden] normed input of the next block */
};

/* An activation of the forward: [ndim] shape in the model dtype. */
hr_status hr_fwd_act(hr_fwd *f, const char *name, int ndim, const int64_t *shape, hr_tensor **out);

/* out = rms_norm(x) * (w + offset) (offset 1: Gemma's zero-centred weights). */
hr_status hr_build_norm(hr_fwd *f, const hr_tensor *x, const hr_tensor *w, double offset, hr_tensor *out);
/* x += y, then out = rms_norm(x) * (w + offset), in one op: the residual
 * add and the norm of the next block (the last layer's: the final norm). */
hr_status hr_build_add_norm(hr_fwd *f, hr_tensor *x, const hr_tensor *y, const hr_tensor *w, double offset,
                            hr_tensor *out);

typedef struct hr_attn_weights {
    /* [hq*d, hidden], [hkv*d, hidden] x2, [hidden, hq*d]; wv NULL: the
     * values are the key projection (Gemma 4's attention_k_eq_v), before
     * k_norm and rope. A layer reading another's keys (kv_source) needs
     * only wq and wo. */
    const hr_tensor *wq, *wk, *wv, *wo;
    const hr_tensor *bq, *bk, *bv, *bo; /* or NULL; q/k/v all or none */
    const hr_tensor *q_norm, *k_norm;   /* [d] per-head rms norms before rope, or NULL */
    const hr_tensor *sinks;             /* [hq] each head's sink logit (gpt-oss), or NULL */
} hr_attn_weights;

typedef struct hr_attn_opts {
    double scale;       /* of q.k; 0: 1/sqrt(head_dim) */
    double softcap;     /* tanh soft-capping of the scores; 0: none */
    double norm_offset; /* of q_norm / k_norm's weights */
    bool v_norm;        /* each value head RMS-normalised without a weight (Gemma 4) */
} hr_attn_opts;

/* Self-attention of layer il over the normed rows h [b, s, hidden] and the
 * cache, as the call's plan for the layer's kind says, with the kind's
 * head_dim and kv heads; into out. A layer with a kv_source attends over
 * what its source attended over in this call, writing no keys. */
hr_status hr_build_attention(hr_fwd *f, int64_t il, const hr_attn_weights *w, const hr_attn_opts *o,
                             const hr_tensor *h, hr_tensor *out);

typedef struct hr_mlp_weights {
    const hr_tensor *gate, *up, *down;       /* [inter, hidden] x2, [hidden, inter] */
    const hr_tensor *b_gate, *b_up, *b_down; /* or NULL; gate/up both or neither */
} hr_mlp_weights;

/* down(act(gate(h)) * up(h)) into out; act is HR_LINEAR_SILU_MUL or
 * HR_LINEAR_GELU_TANH_MUL. */
hr_status hr_build_gated_mlp(hr_fwd *f, const hr_mlp_weights *w, hr_linear_epilogue act, const hr_tensor *h,
                             hr_tensor *out);

/* A mixture-of-experts layer's router and experts (moe.c). */
typedef enum hr_router_kind {
    /* softmax over every expert in f32, then the top k (Qwen3-MoE),
     * renormalised to sum 1 when norm_topk */
    HR_ROUTER_SOFTMAX_TOPK = 0,
    /* the top k of the logits (with the router's bias), then a softmax over
     * those k in the model dtype (gpt-oss) */
    HR_ROUTER_TOPK_SOFTMAX = 1,
} hr_router_kind;

typedef struct hr_moe_weights {
    const hr_tensor *router;                 /* [experts, hidden] */
    const hr_tensor *router_bias;            /* [experts], or NULL */
    const hr_tensor *gate_up, *down;         /* [experts, 2 inter, hidden], [experts, hidden, inter] */
    const hr_tensor *gate_up_bias, *down_bias; /* [experts, 2 inter], [experts, hidden], or NULL */
} hr_moe_weights;

typedef struct hr_moe_opts {
    hr_router_kind router;
    bool norm_topk;
    hr_experts_act act;
    double limit, alpha; /* act gpt_oss's */
} hr_moe_opts;

/* The router's choice of n_experts_per_tok experts per row of h [b, s,
 * hidden], its weights cast to the model dtype (as transformers casts
 * them), then the experts op in the model's experts implementation; into
 * out. */
hr_status hr_build_moe(hr_fwd *f, const hr_moe_weights *w, const hr_moe_opts *o, const hr_tensor *h, hr_tensor *out);
/* softmax over every expert's logit [b, s, experts] in f32 (the logits cast
 * first when the model's dtype is not), the top n_experts_per_tok into
 * *topv (the f32 activation "top_w", [b, s, k]) and topi, renormalised to
 * sum 1 when norm: Qwen3-MoE's router, and the start of Gemma 4's. */
hr_status hr_build_softmax_topk(hr_fwd *f, const hr_tensor *logits, bool norm, hr_tensor **topv, hr_tensor *topi);
/* The experts op alone, over a router's weights wts and indices topi [b,
 * s, k] computed by the caller (an architecture's own router), in the
 * model's experts implementation; into out. */
hr_status hr_build_experts(hr_fwd *f, const hr_moe_weights *w, const hr_moe_opts *o, const hr_tensor *h,
                           const hr_tensor *wts, const hr_tensor *topi, hr_tensor *out);

/* f->x = embed[ids] * scale (scale 1: the lookup alone; otherwise rounded
 * to the model dtype first, as a tensor of that dtype multiplies it). */
hr_status hr_build_embedding(hr_fwd *f, const hr_tensor *ids, double scale);
/* The same lookup in any table [rows, n] into out [b, s, n]. */
hr_status hr_build_lookup(hr_fwd *f, const hr_tensor *table, const hr_tensor *ids, double scale, hr_tensor *out);
/* out = h @ lm_head^T, then tanh(out / cap) * cap when cap > 0. */
hr_status hr_build_head(hr_fwd *f, const hr_tensor *h, double softcap, hr_tensor *out);

#endif
