/* Gemma 4 (Gemma4ForCausalLM, and the text model of
 * Gemma4ForConditionalGeneration), as transformers' Gemma4TextModel runs it:
 *
 * - sliding and full layers as layer_types says (the last always full),
 *   each kind with its own head_dim and kv heads (per_layer_config, or
 *   global_head_dim and, with attention_k_eq_v, num_global_key_value_heads
 *   for the full layers) and its own rope (full layers: "proportional",
 *   a quarter of the frequencies turning);
 * - plain RMS norms (x * w, no +1), per-head q and k norms, values
 *   RMS-normalised without a weight (v_norm), attention scaled by 1;
 * - attention_k_eq_v: full layers take their values from the key projection;
 * - num_kv_shared_layers: the last layers read the keys and values of the
 *   last earlier layer of their kind instead of their own; with
 *   use_double_wide_mlp their MLPs are twice as wide;
 * - enable_moe_block (26B-A4B): beside the dense MLP a mixture of experts
 *   routed from the residual (an unweighted RMS norm, times `scale` and
 *   hidden^-1/2, softmax in f32, top k renormalised, times
 *   per_expert_scale), each branch with its own norms, their sum normed;
 * - per-layer embeddings (hidden_size_per_layer_input > 0): a second,
 *   packed embedding of the tokens plus a projection of the embedded input,
 *   feeding a gated residual branch into every layer;
 * - every layer's output times its layer_scalar; the logits soft-capped by
 *   final_logit_softcapping.
 * Refused by name: bidirectional attention (use_bidirectional_attention
 * "all"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "models/blocks.h"

typedef struct gemma4_cfg {
    double final_logit_softcapping; /* 0: none */
    bool attention_bias, k_eq_v, double_wide, moe;
    int64_t ple;       /* hidden_size_per_layer_input (0: no per-layer embeddings) */
    int64_t ple_vocab; /* vocab_size_per_layer_input */
    int64_t first_shared; /* the first layer reading another's keys (n_layers: none) */
} gemma4_cfg;

enum {
    ATTN_NORM, WQ, WK, WV, WO, BQ, BK, BV, BO, Q_NORM, K_NORM, POST_ATTN_NORM, PRE_FF_NORM, POST_FF_NORM, GATE, UP,
    DOWN, LAYER_SCALAR, PLI_GATE, PLI_PROJ, POST_PLI_NORM, ROUTER, ROUTER_SCALE, EXPERT_SCALE, GATE_UP, EXP_DOWN,
    POST_FF_NORM_1, PRE_FF_NORM_2, POST_FF_NORM_2, N_WEIGHTS
};

enum { EMBED_PER_LAYER, PLE_PROJ, PLE_PROJ_NORM, N_MODEL_WEIGHTS };

/* sizes of the per-layer embeddings */
#define DIM_PLE HR_DIM_ARCH0       /* hidden_size_per_layer_input */
#define DIM_PLE_ALL HR_DIM_ARCH1   /* layers x hidden_size_per_layer_input */
#define DIM_PLE_VOCAB HR_DIM_ARCH2 /* vocab_size_per_layer_input */

static const gemma4_cfg *cfg_of(const hr_model *m) { return m->arch_cfg; }

static bool own_kv(const hr_model *m, int64_t il) { return il < cfg_of(m)->first_shared; }
static bool own_v(const hr_model *m, int64_t il) {
    return own_kv(m, il) && !(cfg_of(m)->k_eq_v && hr_model_layer_kind(m, il) == HR_LAYER_FULL);
}
static bool bias(const hr_model *m, int64_t il) { return (void)il, cfg_of(m)->attention_bias; }
static bool bias_k(const hr_model *m, int64_t il) { return bias(m, il) && own_kv(m, il); }
static bool bias_v(const hr_model *m, int64_t il) { return bias(m, il) && own_v(m, il); }
static bool ple(const hr_model *m, int64_t il) { return (void)il, cfg_of(m)->ple > 0; }
static bool moe(const hr_model *m, int64_t il) { return (void)il, cfg_of(m)->moe; }

static const hr_weight_spec weights[N_WEIGHTS] = {
    [ATTN_NORM] = {"input_layernorm.weight", NULL, {HR_DIM_HIDDEN}},
    [WQ] = {"self_attn.q_proj.weight", NULL, {HR_DIM_Q, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WK] = {"self_attn.k_proj.weight", NULL, {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR, .when = own_kv},
    [WV] = {"self_attn.v_proj.weight", NULL, {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR, .when = own_v},
    [WO] = {"self_attn.o_proj.weight", NULL, {HR_DIM_HIDDEN, HR_DIM_Q}, HR_WEIGHT_LINEAR},
    [BQ] = {"self_attn.q_proj.bias", NULL, {HR_DIM_Q}, .when = bias},
    [BK] = {"self_attn.k_proj.bias", NULL, {HR_DIM_KV}, .when = bias_k},
    [BV] = {"self_attn.v_proj.bias", NULL, {HR_DIM_KV}, .when = bias_v},
    [BO] = {"self_attn.o_proj.bias", NULL, {HR_DIM_HIDDEN}, .when = bias},
    [Q_NORM] = {"self_attn.q_norm.weight", NULL, {HR_DIM_HEAD}},
    [K_NORM] = {"self_attn.k_norm.weight", NULL, {HR_DIM_HEAD}, .when = own_kv},
    [POST_ATTN_NORM] = {"post_attention_layernorm.weight", NULL, {HR_DIM_HIDDEN}},
    [PRE_FF_NORM] = {"pre_feedforward_layernorm.weight", NULL, {HR_DIM_HIDDEN}},
    [POST_FF_NORM] = {"post_feedforward_layernorm.weight", NULL, {HR_DIM_HIDDEN}},
    [GATE] = {"mlp.gate_proj.weight", NULL, {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [UP] = {"mlp.up_proj.weight", NULL, {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [DOWN] = {"mlp.down_proj.weight", NULL, {HR_DIM_HIDDEN, HR_DIM_INTER}, HR_WEIGHT_LINEAR},
    [LAYER_SCALAR] = {"layer_scalar", NULL, {HR_DIM_ONE}},
    [PLI_GATE] = {"per_layer_input_gate.weight", NULL, {DIM_PLE, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR, .when = ple},
    [PLI_PROJ] = {"per_layer_projection.weight", NULL, {HR_DIM_HIDDEN, DIM_PLE}, HR_WEIGHT_LINEAR, .when = ple},
    [POST_PLI_NORM] = {"post_per_layer_input_norm.weight", NULL, {HR_DIM_HIDDEN}, .when = ple},
    [ROUTER] = {"router.proj.weight", NULL, {HR_DIM_EXPERTS, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR, .when = moe},
    [ROUTER_SCALE] = {"router.scale", NULL, {HR_DIM_HIDDEN}, .when = moe},
    [EXPERT_SCALE] = {"router.per_expert_scale", NULL, {HR_DIM_EXPERTS}, .when = moe},
    [GATE_UP] = {"experts.gate_up_proj", NULL, {HR_DIM_EXPERTS, HR_DIM_MOE_INTER2, HR_DIM_HIDDEN}, .when = moe},
    [EXP_DOWN] = {"experts.down_proj", NULL, {HR_DIM_EXPERTS, HR_DIM_HIDDEN, HR_DIM_MOE_INTER}, .when = moe},
    [POST_FF_NORM_1] = {"post_feedforward_layernorm_1.weight", NULL, {HR_DIM_HIDDEN}, .when = moe},
    [PRE_FF_NORM_2] = {"pre_feedforward_layernorm_2.weight", NULL, {HR_DIM_HIDDEN}, .when = moe},
    [POST_FF_NORM_2] = {"post_feedforward_layernorm_2.weight", NULL, {HR_DIM_HIDDEN}, .when = moe},
};

static const hr_weight_spec model_weights[N_MODEL_WEIGHTS] = {
    [EMBED_PER_LAYER] = {"embed_tokens_per_layer.weight", NULL, {DIM_PLE_VOCAB, DIM_PLE_ALL}, .when = ple},
    [PLE_PROJ] = {"per_layer_model_projection.weight", NULL, {DIM_PLE_ALL, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR,
                  .when = ple},
    [PLE_PROJ_NORM] = {"per_layer_projection_norm.weight", NULL, {DIM_PLE}, .when = ple},
};

static int64_t gemma4_dim(const hr_model *m, hr_dim d, int64_t il, char *field, size_t n) {
    const gemma4_cfg *c = cfg_of(m);
    const hr_model_config *mc = &m->cfg;
    int64_t v = -1;
    switch ((int)d) {
    case DIM_PLE:
        v = c->ple;
        if (field) snprintf(field, n, "hidden_size_per_layer_input (%lld)", (long long)v);
        break;
    case DIM_PLE_ALL:
        v = mc->n_layers * c->ple;
        if (field)
            snprintf(field, n, "num_hidden_layers x hidden_size_per_layer_input (%lld x %lld)",
                     (long long)mc->n_layers, (long long)c->ple);
        break;
    case DIM_PLE_VOCAB:
        v = c->ple_vocab;
        if (field) snprintf(field, n, "vocab_size_per_layer_input (%lld)", (long long)v);
        break;
    case HR_DIM_INTER:
        /* the layers that read others' keys have double-wide MLPs */
        if (c->double_wide && il >= c->first_shared) {
            v = 2 * mc->intermediate_size;
            if (field) snprintf(field, n, "2 x intermediate_size (%lld; use_double_wide_mlp)", (long long)v);
        }
        break;
    default: break;
    }
    return v;
}

/* Gemma4TextConfig's defaults: a Hub multimodal config's text_config holds
 * only what differs from them. */
static const char defaults[] =
    "{\"vocab_size\": 262144, \"hidden_size\": 2304, \"intermediate_size\": 9216, \"num_hidden_layers\": 30,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 256,"
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": true, \"sliding_window\": 512, \"vocab_size_per_layer_input\": 262144,"
    " \"hidden_size_per_layer_input\": 256}";

/* ---- config ------------------------------------------------------------------ */

/* layer_types when listed, else 5 sliding then 1 full; the last layer is
 * full either way (transformers forces it, with a warning). */
static hr_status read_layer_kinds(hr_json_obj root, hr_model_config *cfg) {
    bool listed = false;
    HR_TRY(hr_config_layer_types(root, cfg, "Gemma 4", &listed));
    if (!listed)
        for (int64_t i = 0; i < cfg->n_layers; i++)
            cfg->layer_kind[i] = (i + 1) % 6 ? HR_LAYER_SLIDING : HR_LAYER_FULL;
    if (cfg->layer_kind[cfg->n_layers - 1] != HR_LAYER_FULL) {
        HR_LOG_WARN("config.json: Gemma 4's last layer must use full_attention, not sliding_attention; it does "
                    "(as transformers forces it)");
        cfg->layer_kind[cfg->n_layers - 1] = HR_LAYER_FULL;
    }
    return HR_OK;
}

/* One layer's head_dim and kv heads override from per_layer_config, into
 * its kind's (they must agree across the kind, and sliding layers take
 * none: hubrt's cache holds one geometry per kind). */
static hr_status read_layer_override(const cJSON *entry, const char *key, hr_model_config *cfg, int64_t *hd,
                                     int64_t *kv, bool *seen) {
    char *end = NULL;
    long long il = strtoll(key, &end, 10);
    if (!*key || *end || il < 0 || il >= cfg->n_layers)
        return hr_error(HR_ERR_FORMAT, "config.json: per_layer_config key '%.40s' is not a layer index (0 to %lld)",
                        key, (long long)cfg->n_layers - 1);
    if (!cJSON_IsObject(entry))
        return hr_error(HR_ERR_FORMAT, "config.json: per_layer_config['%s'] must be an object", key);
    int kind = cfg->layer_kind[il];
    int64_t h = cfg->head_dim, k = cfg->n_kv_heads;
    for (const cJSON *f = entry->child; f; f = f->next) {
        int64_t *dst = !strcmp(f->string, "head_dim") ? &h : !strcmp(f->string, "num_key_value_heads") ? &k : NULL;
        if (!dst)
            return hr_error(HR_ERR_UNSUPPORTED, "config.json: per_layer_config['%s'] sets '%.40s'; Gemma 4 layers "
                            "may set head_dim and num_key_value_heads only", key, f->string);
        if (!cJSON_IsNumber(f) || f->valuedouble != (double)(int64_t)f->valuedouble || f->valuedouble < 1 ||
            f->valuedouble > 65536)
            return hr_error(HR_ERR_FORMAT, "config.json: per_layer_config['%s'].%s must be an integer in 1..65536",
                            key, f->string);
        *dst = (int64_t)f->valuedouble;
    }
    if (kind == HR_LAYER_SLIDING && (h != cfg->head_dim || k != cfg->n_kv_heads))
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: per_layer_config['%s'] gives a sliding layer its own "
                        "head_dim or num_key_value_heads; only full layers may differ", key);
    if (seen[kind] && (h != hd[kind] || k != kv[kind]))
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: per_layer_config['%s'] (head_dim %lld, %lld kv heads) "
                        "differs from other full layers (%lld, %lld); all full layers must agree", key, (long long)h,
                        (long long)k, (long long)hd[kind], (long long)kv[kind]);
    hd[kind] = h, kv[kind] = k, seen[kind] = true;
    return HR_OK;
}

/* Each kind's head_dim and kv heads: per_layer_config as transformers 5.24
 * saves it; or, as Hub configs hold them, global_head_dim (512 when absent)
 * and, with attention_k_eq_v, num_global_key_value_heads for full layers. */
static hr_status read_kind_dims(hr_json_obj root, hr_model_config *cfg, bool k_eq_v) {
    const cJSON *plc = cJSON_GetObjectItemCaseSensitive((const cJSON *)root.node, "per_layer_config");
    int64_t hd[HR_LAYER_KINDS], kv[HR_LAYER_KINDS];
    bool seen[HR_LAYER_KINDS] = {false, false};
    for (int k = 0; k < HR_LAYER_KINDS; k++) hd[k] = cfg->head_dim, kv[k] = cfg->n_kv_heads;
    if (plc && !cJSON_IsNull(plc)) {
        if (!cJSON_IsObject(plc)) return hr_error(HR_ERR_FORMAT, "config.json: per_layer_config must be an object");
        for (const cJSON *e = plc->child; e; e = e->next) HR_TRY(read_layer_override(e, e->string, cfg, hd, kv, seen));
        /* full layers left out keep the common sizes: all of them must then */
        for (int64_t il = 0; seen[HR_LAYER_FULL] && il < cfg->n_layers; il++) {
            char key[24];
            snprintf(key, sizeof key, "%lld", (long long)il);
            if (cfg->layer_kind[il] == HR_LAYER_FULL && !cJSON_GetObjectItemCaseSensitive(plc, key) &&
                (hd[HR_LAYER_FULL] != cfg->head_dim || kv[HR_LAYER_FULL] != cfg->n_kv_heads))
                return hr_error(HR_ERR_UNSUPPORTED, "config.json: per_layer_config leaves out full layer %lld while "
                                "other full layers have their own head_dim or kv heads", (long long)il);
        }
    } else {
        HR_TRY(hr_json_get_i64(root, "global_head_dim", 512, &hd[HR_LAYER_FULL]));
        if (k_eq_v) HR_TRY(hr_json_get_i64(root, "num_global_key_value_heads", cfg->n_kv_heads, &kv[HR_LAYER_FULL]));
    }
    static const char *const field[] = {"the full layers' head_dim", "the sliding layers' head_dim"};
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        if (hd[k] < 2 || hd[k] > 65536 || hd[k] % 2)
            return hr_error(HR_ERR_FORMAT, "config.json: %s is %lld; it must be even, 2..65536", field[k],
                            (long long)hd[k]);
        if (kv[k] < 1 || cfg->n_heads % kv[k])
            return hr_error(HR_ERR_FORMAT, "config.json: num_attention_heads (%lld) must be a multiple of the %s "
                            "layers' num_key_value_heads (%lld)", (long long)cfg->n_heads,
                            k == HR_LAYER_FULL ? "full" : "sliding", (long long)kv[k]);
        cfg->kind_head_dim[k] = hd[k], cfg->kind_kv_heads[k] = kv[k];
    }
    return HR_OK;
}

/* num_kv_shared_layers: each of the last layers reads the keys of the last
 * earlier layer of its kind (transformers' kv_sharing_modes). */
static hr_status read_kv_sharing(hr_json_obj root, hr_model_config *cfg, gemma4_cfg *c) {
    int64_t n_shared = 0, L = cfg->n_layers;
    HR_TRY(hr_json_get_i64(root, "num_kv_shared_layers", 0, &n_shared));
    if (n_shared < 0 || n_shared >= L)
        return hr_error(HR_ERR_FORMAT, "config.json: num_kv_shared_layers is %lld; it must be in 0..%lld (a layer "
                        "must make the keys the others read)", (long long)n_shared, (long long)L - 1);
    c->first_shared = L - n_shared;
    if (!n_shared) return HR_OK;
    cfg->kv_source = malloc(sizeof *cfg->kv_source * (size_t)L);
    if (!cfg->kv_source) return hr_error(HR_ERR_OOM, "config: kv sources");
    int64_t last[HR_LAYER_KINDS] = {-1, -1};
    for (int64_t il = 0; il < L; il++) {
        int kind = cfg->layer_kind[il];
        cfg->kv_source[il] = il < c->first_shared ? -1 : last[kind];
        if (il < c->first_shared) last[kind] = il;
        else if (last[kind] < 0)
            return hr_error(HR_ERR_FORMAT, "config.json: layer %lld (%s) shares keys (num_kv_shared_layers %lld), "
                            "but no earlier layer of its kind makes them", (long long)il,
                            kind == HR_LAYER_FULL ? "full_attention" : "sliding_attention", (long long)n_shared);
    }
    return HR_OK;
}

static hr_status read_moe(hr_json_obj root, hr_model_config *cfg, gemma4_cfg *c) {
    HR_TRY(hr_json_get_bool(root, "enable_moe_block", false, &c->moe));
    if (!c->moe) return HR_OK;
    for (const char *const *k = (const char *const[]){"num_experts", "top_k_experts", "moe_intermediate_size", NULL};
         *k; k++)
        if (!hr_json_has(root, *k) || cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root.node, *k)))
            return hr_error(HR_ERR_FORMAT, "config.json: enable_moe_block is true but %s is not set", *k);
    HR_TRY(hr_json_get_i64(root, "num_experts", 0, &cfg->n_experts));
    HR_TRY(hr_json_get_i64(root, "top_k_experts", 0, &cfg->n_experts_per_tok));
    HR_TRY(hr_json_get_i64(root, "moe_intermediate_size", 0, &cfg->moe_intermediate_size));
    if (cfg->n_experts < 1 || cfg->n_experts > 65536)
        return hr_error(HR_ERR_FORMAT, "config.json: num_experts is %lld (1 to 65536)", (long long)cfg->n_experts);
    if (cfg->n_experts_per_tok < 1 || cfg->n_experts_per_tok > cfg->n_experts)
        return hr_error(HR_ERR_FORMAT, "config.json: top_k_experts is %lld, not 1 to num_experts (%lld)",
                        (long long)cfg->n_experts_per_tok, (long long)cfg->n_experts);
    if (cfg->moe_intermediate_size < 1 || cfg->moe_intermediate_size > (1 << 20))
        return hr_error(HR_ERR_FORMAT, "config.json: moe_intermediate_size is %lld (1 to 1048576)",
                        (long long)cfg->moe_intermediate_size);
    return HR_OK;
}

/* rope_parameters keyed by layer type, each for its kind's head_dim;
 * transformers' defaults where a kind has none. */
static hr_status read_ropes(hr_json_obj root, hr_model_config *cfg) {
    hr_json_obj rp, full, sliding, none = {0};
    HR_TRY(hr_json_get_obj(root, "rope_parameters", &rp));
    HR_TRY(hr_json_get_obj(rp, "full_attention", &full));
    HR_TRY(hr_json_get_obj(rp, "sliding_attention", &sliding));
    cJSON *def = NULL;
    if (!hr_json_obj_present(full)) {
        def = cJSON_Parse("{\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25, \"rope_theta\": 1e6}");
        if (!def) return hr_error(HR_ERR_OOM, "out of memory");
        full = (hr_json_obj){.doc = rp.doc ? rp.doc : root.doc, .node = def};
        snprintf(full.prefix, sizeof full.prefix, "rope_parameters.full_attention");
    }
    hr_status s =
        hr_config_rope_dim(none, full, 1e6, cfg->kind_head_dim[HR_LAYER_FULL], cfg, &cfg->rope[HR_LAYER_FULL]);
    cJSON_Delete(def);
    HR_TRY(s);
    return hr_config_rope_dim(none, sliding, 1e4, cfg->kind_head_dim[HR_LAYER_SLIDING], cfg,
                              &cfg->rope[HR_LAYER_SLIDING]);
}

static hr_status gemma4_configure(hr_json_obj root, hr_model_config *cfg, void *arch_cfg) {
    gemma4_cfg *c = arch_cfg;
    HR_TRY(hr_config_require_act(cfg, "gelu_pytorch_tanh"));
    const char *bidi = NULL;
    HR_TRY(hr_json_get_str(root, "use_bidirectional_attention", NULL, &bidi));
    if (bidi && !strcmp(bidi, "all"))
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: use_bidirectional_attention 'all' (every token sees every "
                        "other) is not supported: hubrt's Gemma 4 is causal");
    /* "vision" makes image tokens see each other; text alone stays causal */
    HR_TRY(hr_json_get_f64(root, "final_logit_softcapping", 0, &c->final_logit_softcapping));
    if (c->final_logit_softcapping < 0)
        return hr_error(HR_ERR_FORMAT, "config.json: final_logit_softcapping %g is negative", c->final_logit_softcapping);
    HR_TRY(hr_json_get_bool(root, "attention_bias", false, &c->attention_bias));
    HR_TRY(hr_json_get_bool(root, "attention_k_eq_v", false, &c->k_eq_v));
    HR_TRY(hr_json_get_bool(root, "use_double_wide_mlp", false, &c->double_wide));
    HR_TRY(hr_json_get_i64(root, "hidden_size_per_layer_input", 256, &c->ple));
    HR_TRY(hr_json_get_i64(root, "vocab_size_per_layer_input", 262144, &c->ple_vocab));
    if (c->ple < 0 || c->ple > (1 << 20) || c->ple * cfg->n_layers > ((int64_t)1 << 31))
        return hr_error(HR_ERR_FORMAT, "config.json: hidden_size_per_layer_input is %lld (0 to 1048576, and x "
                        "num_hidden_layers at most 2^31)", (long long)c->ple);
    if (c->ple && (c->ple_vocab < 1 || c->ple_vocab > ((int64_t)1 << 31)))
        return hr_error(HR_ERR_FORMAT, "config.json: vocab_size_per_layer_input is %lld (1 to 2^31)",
                        (long long)c->ple_vocab);
    HR_TRY(hr_config_window(root, 512, cfg));
    HR_TRY(read_layer_kinds(root, cfg));
    HR_TRY(read_kind_dims(root, cfg, c->k_eq_v));
    HR_TRY(read_kv_sharing(root, cfg, c));
    HR_TRY(read_moe(root, cfg, c));
    return read_ropes(root, cfg);
}

/* ---- forward ------------------------------------------------------------------ */

#define W(il, i) hr_layer_w(m, (il), (i))
#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})

static hr_status run1(hr_op op, const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *out) {
    hr_tensor *o[1] = {out};
    return hr_op_run(op, attrs, in, n_in, o, 1);
}

static hr_status act3(hr_fwd *f, const char *name, int64_t n, hr_tensor **out) {
    return hr_fwd_act(f, name, 3, (int64_t[]){f->b, f->s, n}, out);
}

/* The per-layer inputs [b, s, layers, ple] ("ple"): the tokens' packed
 * per-layer embedding (times sqrt(ple)) plus the RMS-normed projection of
 * the embedded input (times hidden^-1/2), their sum times 2^-1/2. */
static hr_status per_layer_inputs(hr_fwd *f, const hr_tensor *ids) {
    const hr_model *m = f->m;
    int64_t L = m->cfg.n_layers, P = cfg_of(m)->ple;
    hr_tensor *tok = NULL, *proj = NULL, *out = NULL, *proj4 = NULL, *tok4 = NULL;
    HR_TRY(act3(f, "ple_tok", L * P, &tok));
    HR_TRY(hr_build_lookup(f, hr_model_w(m, EMBED_PER_LAYER), ids, sqrt((double)P), tok));
    HR_TRY(act3(f, "ple_proj", L * P, &proj));
    HR_TRY(run1(HR_OP_linear, NULL, IN_(f->x, hr_model_w(m, PLE_PROJ)), 2, proj));
    HR_TRY(run1(HR_OP_scale, &(hr_attrs_scale){.mul = 1.0 / sqrt((double)m->cfg.hidden_size)}, IN_(proj), 1, proj));
    HR_TRY(hr_fwd_act(f, "ple", 4, (int64_t[]){f->b, f->s, L, P}, &out));
    int64_t shape[4] = {f->b, f->s, L, P};
    hr_status s = hr_tensor_view(proj, 4, shape, &proj4);
    if (s == HR_OK) s = hr_tensor_view(tok, 4, shape, &tok4);
    if (s == HR_OK) s = hr_build_norm(f, proj4, hr_model_w(m, PLE_PROJ_NORM), 0, out);
    if (s == HR_OK) s = run1(HR_OP_add, NULL, IN_(out, tok4), 2, out);
    if (s == HR_OK) s = run1(HR_OP_scale, &(hr_attrs_scale){.mul = 1.0 / sqrt(2.0)}, IN_(out), 1, out);
    hr_tensor_free(proj4);
    hr_tensor_free(tok4);
    return s;
}

static hr_status gemma4_embed(hr_fwd *f, const hr_tensor *ids) {
    HR_TRY(hr_build_embedding(f, ids, sqrt((double)f->m->cfg.hidden_size)));
    return cfg_of(f->m)->ple ? per_layer_inputs(f, ids) : HR_OK;
}

/* The mixture of experts beside the MLP: routed from the residual x,
 * applied to pre_feedforward_layernorm_2(x), post-normed into out. */
static hr_status moe_branch(hr_fwd *f, int64_t il, hr_tensor *out) {
    const hr_model *m = f->m;
    int64_t e = m->cfg.n_experts, k = m->cfg.n_experts_per_tok, H = m->cfg.hidden_size;
    hr_tensor *r = NULL, *logits = NULL, *topv = NULL, *topi = NULL;
    hr_tensor *scale = NULL, *scale_f = NULL, *h2 = NULL, *flat = NULL, *scale3 = NULL;
    /* the router: norm without weight, times scale, times hidden^-1/2 (each rounded as torch does) */
    HR_TRY(act3(f, "router_in", H, &r));
    HR_TRY(run1(HR_OP_rms_norm, &(hr_attrs_norm){.eps = m->cfg.rms_norm_eps}, IN_(f->x), 1, r));
    HR_TRY(run1(HR_OP_mul, NULL, IN_(r, W(il, ROUTER_SCALE)), 2, r));
    HR_TRY(run1(HR_OP_scale, &(hr_attrs_scale){.mul = 1.0 / sqrt((double)H)}, IN_(r), 1, r));
    HR_TRY(act3(f, "router", e, &logits));
    HR_TRY(run1(HR_OP_linear, NULL, IN_(r, W(il, ROUTER)), 2, logits));
    HR_TRY(hr_scratch_get(f->sc, m->dev, "top_i", HR_I64, 3, (int64_t[]){f->b, f->s, k}, &topi));
    HR_TRY(hr_build_softmax_topk(f, logits, true, &topv, topi));
    /* times per_expert_scale[index], in f32 (the f32 weights win torch's promotion) */
    int64_t n = f->b * f->s * k;
    HR_TRY(hr_scratch_get(f->sc, m->dev, "expert_scale", m->dtype, 1, (int64_t[]){n}, &scale));
    hr_status s = hr_tensor_view(topi, 1, (int64_t[]){n}, &flat);
    if (s == HR_OK) s = run1(HR_OP_index_select, &(hr_attrs_dim){.dim = 0}, IN_(W(il, EXPERT_SCALE), flat), 2, scale);
    if (s == HR_OK && m->dtype != HR_F32) {
        s = hr_scratch_get(f->sc, m->dev, "expert_scale_f32", HR_F32, 1, (int64_t[]){n}, &scale_f);
        if (s == HR_OK) s = run1(HR_OP_cast, &(hr_attrs_cast){.dtype = HR_F32}, IN_(scale), 1, scale_f);
    }
    if (s == HR_OK) s = hr_tensor_view(scale_f ? scale_f : scale, 3, (int64_t[]){f->b, f->s, k}, &scale3);
    if (s == HR_OK) s = run1(HR_OP_mul, NULL, IN_(topv, scale3), 2, topv);
    hr_tensor_free(flat);
    hr_tensor_free(scale3);
    HR_TRY(s);
    /* the experts on pre_feedforward_layernorm_2(x), gelu-tanh gated */
    HR_TRY(act3(f, "moe_in", H, &h2));
    HR_TRY(hr_build_norm(f, f->x, W(il, PRE_FF_NORM_2), 0, h2));
    hr_moe_weights mw = {.gate_up = W(il, GATE_UP), .down = W(il, EXP_DOWN)};
    hr_moe_opts mo = {.act = HR_EXPERTS_GELU_TANH};
    HR_TRY(hr_build_experts(f, &mw, &mo, h2, topv, topi, out));
    return hr_build_norm(f, out, W(il, POST_FF_NORM_2), 0, out);
}

/* The per-layer input's gated branch: x += norm(proj(gelu(gate(x)) * pli)). */
static hr_status ple_branch(hr_fwd *f, int64_t il, hr_tensor *tmp) {
    const hr_model *m = f->m;
    int64_t L = m->cfg.n_layers, P = cfg_of(m)->ple;
    hr_tensor *all = NULL, *pli = NULL, *g = NULL;
    HR_TRY(hr_fwd_act(f, "ple", 4, (int64_t[]){f->b, f->s, L, P}, &all));
    HR_TRY(act3(f, "ple_gate", P, &g));
    HR_TRY(run1(HR_OP_linear, NULL, IN_(f->x, W(il, PLI_GATE)), 2, g));
    hr_status s = hr_tensor_select(all, 2, il, &pli);
    if (s == HR_OK) s = run1(HR_OP_gelu_mul, &(hr_attrs_gelu){.approximate = HR_GELU_TANH}, IN_(g, pli), 2, g);
    hr_tensor_free(pli);
    HR_TRY(s);
    HR_TRY(run1(HR_OP_linear, NULL, IN_(g, W(il, PLI_PROJ)), 2, tmp));
    HR_TRY(hr_build_norm(f, tmp, W(il, POST_PLI_NORM), 0, tmp));
    return run1(HR_OP_add, NULL, IN_(f->x, tmp), 2, f->x);
}

/* h = norm(x); x += post_norm(attn(h)); x += post_ff(mlp(pre_ff(x)) [+ moe
 * branch]); [x += ple branch]; x *= layer_scalar; the next layer's h. */
static hr_status gemma4_forward(hr_fwd *f) {
    const hr_model *m = f->m;
    const gemma4_cfg *c = cfg_of(m);
    int64_t n = m->cfg.n_layers, H = m->cfg.hidden_size;
    hr_attn_opts ao = {.scale = 1.0, .v_norm = true};
    hr_tensor *o = NULL, *moe_out = NULL;
    HR_TRY(act3(f, "o", H, &o));
    if (c->moe) HR_TRY(act3(f, "moe", H, &moe_out));
    HR_TRY(hr_build_norm(f, f->x, W(0, ATTN_NORM), 0, f->h));
    for (int64_t il = 0; il < n; il++) {
        hr_attn_weights aw = {.wq = W(il, WQ), .wk = W(il, WK), .wv = W(il, WV), .wo = W(il, WO),
                              .bq = W(il, BQ), .bk = W(il, BK), .bv = W(il, BV), .bo = W(il, BO),
                              .q_norm = W(il, Q_NORM), .k_norm = W(il, K_NORM)};
        HR_TRY(hr_build_attention(f, il, &aw, &ao, f->h, o));
        HR_TRY(hr_build_norm(f, o, W(il, POST_ATTN_NORM), 0, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, W(il, PRE_FF_NORM), 0, f->h));
        hr_mlp_weights mw = {.gate = W(il, GATE), .up = W(il, UP), .down = W(il, DOWN)};
        HR_TRY(hr_build_gated_mlp(f, &mw, HR_LINEAR_GELU_TANH_MUL, f->h, o));
        if (c->moe) {
            HR_TRY(hr_build_norm(f, o, W(il, POST_FF_NORM_1), 0, o));
            HR_TRY(moe_branch(f, il, moe_out));
            HR_TRY(run1(HR_OP_add, NULL, IN_(o, moe_out), 2, o));
        }
        HR_TRY(hr_build_norm(f, o, W(il, POST_FF_NORM), 0, o));
        HR_TRY(run1(HR_OP_add, NULL, IN_(f->x, o), 2, f->x));
        if (c->ple) HR_TRY(ple_branch(f, il, o));
        HR_TRY(run1(HR_OP_mul, NULL, IN_(f->x, W(il, LAYER_SCALAR)), 2, f->x));
        HR_TRY(hr_build_norm(f, f->x, il + 1 < n ? W(il + 1, ATTN_NORM) : m->final_norm, 0, f->h));
    }
    return HR_OK;
}

static hr_status gemma4_head(hr_fwd *f, const hr_tensor *h, hr_tensor *out) {
    return hr_build_head(f, h, cfg_of(f->m)->final_logit_softcapping, out);
}

const hr_arch hr_arch_gemma4 = {
    .name = "Gemma4ForCausalLM",
    .alias = "Gemma4ForConditionalGeneration",
    .defaults_json = defaults,
    .cfg_size = sizeof(gemma4_cfg),
    .configure = gemma4_configure,
    .layer_weights = weights,
    .n_layer_weights = N_WEIGHTS,
    .embed = gemma4_embed,
    .forward = gemma4_forward,
    .head = gemma4_head,
    .model_weights = model_weights,
    .n_model_weights = N_MODEL_WEIGHTS,
    .dim = gemma4_dim,
};
