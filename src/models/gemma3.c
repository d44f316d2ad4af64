/* Gemma 3 (Gemma3ForCausalLM, and the text model of
 * Gemma3ForConditionalGeneration): sliding-window and global layers as
 * layer_types says, each kind with its own rope (local layers: theta 1e4,
 * never scaled); four zero-centred norms per layer ((1 + w), f32 until
 * the last rounding) and per-head q/k norms; attention scaled by
 * query_pre_attn_scalar^-1/2; the embedding times sqrt(hidden) in the
 * model dtype; a gelu(tanh)-gated MLP; the final logits soft-capped where
 * the config sets final_logit_softcapping (the causal LM class only, as
 * in transformers). attn_logit_softcapping is read but, as in
 * transformers 5, Gemma 3's attention does not apply it. GGUF "gemma3"
 * files: norms with the +1 folded in, llama.cpp's attention scale. */
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "io/gguf.h"
#include "models/blocks.h"

typedef struct gemma3_cfg {
    double query_pre_attn_scalar;
    double final_logit_softcapping; /* 0: none */
    double norm_offset;             /* 1: HF's zero-centred norms; 0: GGUF's, the 1 folded in */
    bool attention_bias;
} gemma3_cfg;

enum {
    ATTN_NORM, WQ, WK, WV, WO, BQ, BK, BV, BO, Q_NORM, K_NORM, POST_ATTN_NORM, PRE_FF_NORM, POST_FF_NORM, GATE, UP,
    DOWN, N_WEIGHTS
};

static bool attn_bias(const hr_model *m, int64_t il) {
    (void)il;
    return ((const gemma3_cfg *)m->arch_cfg)->attention_bias;
}

static const hr_weight_spec weights[N_WEIGHTS] = {
    [ATTN_NORM] = {"input_layernorm.weight", "attn_norm.weight", {HR_DIM_HIDDEN}},
    [WQ] = {"self_attn.q_proj.weight", "attn_q.weight", {HR_DIM_Q, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WK] = {"self_attn.k_proj.weight", "attn_k.weight", {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WV] = {"self_attn.v_proj.weight", "attn_v.weight", {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WO] = {"self_attn.o_proj.weight", "attn_output.weight", {HR_DIM_HIDDEN, HR_DIM_Q}, HR_WEIGHT_LINEAR},
    [BQ] = {"self_attn.q_proj.bias", "attn_q.bias", {HR_DIM_Q}, .when = attn_bias},
    [BK] = {"self_attn.k_proj.bias", "attn_k.bias", {HR_DIM_KV}, .when = attn_bias},
    [BV] = {"self_attn.v_proj.bias", "attn_v.bias", {HR_DIM_KV}, .when = attn_bias},
    [BO] = {"self_attn.o_proj.bias", "attn_output.bias", {HR_DIM_HIDDEN}, .when = attn_bias},
    [Q_NORM] = {"self_attn.q_norm.weight", "attn_q_norm.weight", {HR_DIM_HEAD}},
    [K_NORM] = {"self_attn.k_norm.weight", "attn_k_norm.weight", {HR_DIM_HEAD}},
    [POST_ATTN_NORM] = {"post_attention_layernorm.weight", "post_attention_norm.weight", {HR_DIM_HIDDEN}},
    [PRE_FF_NORM] = {"pre_feedforward_layernorm.weight", "ffn_norm.weight", {HR_DIM_HIDDEN}},
    [POST_FF_NORM] = {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", {HR_DIM_HIDDEN}},
    [GATE] = {"mlp.gate_proj.weight", "ffn_gate.weight", {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [UP] = {"mlp.up_proj.weight", "ffn_up.weight", {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [DOWN] = {"mlp.down_proj.weight", "ffn_down.weight", {HR_DIM_HIDDEN, HR_DIM_INTER}, HR_WEIGHT_LINEAR},
};

/* Gemma3TextConfig's defaults: a Hub multimodal config's text_config
 * holds only what differs from them. */
static const char defaults[] =
    "{\"vocab_size\": 262208, \"hidden_size\": 2304, \"intermediate_size\": 9216, \"num_hidden_layers\": 26,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 256,"
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": true, \"query_pre_attn_scalar\": 256, \"sliding_window\": 4096}";

/* ---- config ------------------------------------------------------------------ */

/* layer_types when the config lists them, else every `pattern`-th layer
 * full (sliding_window_pattern, 6 by default), as transformers derives. */
static hr_status read_layer_kinds(hr_json_obj root, hr_model_config *cfg) {
    bool listed = false;
    HR_TRY(hr_config_layer_types(root, cfg, "Gemma 3", &listed));
    if (listed) return HR_OK;
    int64_t pattern = 6;
    HR_TRY(hr_json_get_i64(root, "_sliding_window_pattern", pattern, &pattern));
    HR_TRY(hr_json_get_i64(root, "sliding_window_pattern", pattern, &pattern));
    if (pattern < 1)
        return hr_error(HR_ERR_FORMAT, "config.json: sliding_window_pattern %lld must be >= 1", (long long)pattern);
    for (int64_t i = 0; i < cfg->n_layers; i++)
        cfg->layer_kind[i] = (i + 1) % pattern ? HR_LAYER_SLIDING : HR_LAYER_FULL;
    return HR_OK;
}

/* 5.x: rope_parameters keyed by layer type. 4.x: rope_theta and
 * rope_scaling for global layers, rope_local_base_freq for local ones; a
 * rope_scaling that names its type by "type" alone is ignored, as
 * transformers 5 ignores it, and only global layers are ever scaled. */
static hr_status read_ropes(hr_json_obj root, hr_model_config *cfg) {
    hr_json_obj rp, full, sliding, none = {0};
    HR_TRY(hr_json_get_obj(root, "rope_parameters", &rp));
    HR_TRY(hr_json_get_obj(rp, "full_attention", &full));
    HR_TRY(hr_json_get_obj(rp, "sliding_attention", &sliding));
    if (hr_json_obj_present(full) || hr_json_obj_present(sliding)) {
        HR_TRY(hr_config_rope(none, full, 1e6, cfg, &cfg->rope[HR_LAYER_FULL]));
        return hr_config_rope(none, sliding, 1e4, cfg, &cfg->rope[HR_LAYER_SLIDING]);
    }
    double theta_global, theta_local;
    HR_TRY(hr_json_get_f64(root, "rope_theta", 1e6, &theta_global));
    HR_TRY(hr_json_get_f64(root, "rope_local_base_freq", 1e4, &theta_local));
    if (!hr_json_obj_present(rp)) HR_TRY(hr_json_get_obj(root, "rope_scaling", &rp));
    const char *type = NULL;
    HR_TRY(hr_json_get_str(rp, "rope_type", NULL, &type));
    HR_TRY(hr_config_rope(none, type ? rp : none, theta_global, cfg, &cfg->rope[HR_LAYER_FULL]));
    return hr_config_rope(none, none, theta_local, cfg, &cfg->rope[HR_LAYER_SLIDING]);
}

static hr_status gemma3_configure(hr_json_obj root, hr_model_config *cfg, void *arch_cfg) {
    gemma3_cfg *c = arch_cfg;
    HR_TRY(hr_config_require_act(cfg, "gelu_pytorch_tanh"));
    HR_TRY(hr_json_get_f64(root, "query_pre_attn_scalar", 256, &c->query_pre_attn_scalar));
    if (!(c->query_pre_attn_scalar > 0))
        return hr_error(HR_ERR_FORMAT, "config.json: query_pre_attn_scalar %g must be positive", c->query_pre_attn_scalar);
    /* the class that loads the checkpoint decides: the multimodal one
     * never caps its logits */
    if (!strcmp(cfg->arch, "Gemma3ForCausalLM"))
        HR_TRY(hr_json_get_f64(root, "final_logit_softcapping", 0, &c->final_logit_softcapping));
    if (c->final_logit_softcapping < 0)
        return hr_error(HR_ERR_FORMAT, "config.json: final_logit_softcapping %g is negative", c->final_logit_softcapping);
    HR_TRY(hr_json_get_bool(root, "attention_bias", false, &c->attention_bias));
    bool bidirectional = false;
    HR_TRY(hr_json_get_bool(root, "use_bidirectional_attention", false, &bidirectional));
    if (bidirectional)
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: use_bidirectional_attention (EmbeddingGemma) is not "
                        "supported");
    c->norm_offset = cfg->from_gguf ? 0 : 1;
    HR_TRY(hr_config_window(root, 4096, cfg));
    HR_TRY(read_layer_kinds(root, cfg));
    return read_ropes(root, cfg);
}

/* ---- forward ------------------------------------------------------------------ */

#define W(il, i) hr_layer_w(m, (il), (i))

/* x -> x + post_norm(attn(norm(x))) -> x + post_norm(mlp(pre_norm(x))):
 * the post-norms act on each branch before its residual add, which is
 * fused with the next norm (the next layer's input norm, or the final). */
static hr_status gemma3_forward(hr_fwd *f) {
    const hr_model *m = f->m;
    const gemma3_cfg *c = m->arch_cfg;
    int64_t n = m->cfg.n_layers;
    double off = c->norm_offset;
    hr_attn_opts ao = {.scale = 1.0 / sqrt(c->query_pre_attn_scalar), .norm_offset = off};
    hr_tensor *o = NULL;
    HR_TRY(hr_fwd_act(f, "o", 3, (int64_t[]){f->b, f->s, m->cfg.hidden_size}, &o));
    HR_TRY(hr_build_norm(f, f->x, W(0, ATTN_NORM), off, f->h));
    for (int64_t il = 0; il < n; il++) {
        hr_attn_weights aw = {.wq = W(il, WQ), .wk = W(il, WK), .wv = W(il, WV), .wo = W(il, WO),
                              .bq = W(il, BQ), .bk = W(il, BK), .bv = W(il, BV), .bo = W(il, BO),
                              .q_norm = W(il, Q_NORM), .k_norm = W(il, K_NORM)};
        HR_TRY(hr_build_attention(f, il, &aw, &ao, f->h, o));
        HR_TRY(hr_build_norm(f, o, W(il, POST_ATTN_NORM), off, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, W(il, PRE_FF_NORM), off, f->h));
        hr_mlp_weights mw = {.gate = W(il, GATE), .up = W(il, UP), .down = W(il, DOWN)};
        HR_TRY(hr_build_gated_mlp(f, &mw, HR_LINEAR_GELU_TANH_MUL, f->h, o));
        HR_TRY(hr_build_norm(f, o, W(il, POST_FF_NORM), off, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, il + 1 < n ? W(il + 1, ATTN_NORM) : m->final_norm, off, f->h));
    }
    return HR_OK;
}

static hr_status gemma3_embed(hr_fwd *f, const hr_tensor *ids) {
    return hr_build_embedding(f, ids, sqrt((double)f->m->cfg.hidden_size));
}

static hr_status gemma3_head(hr_fwd *f, const hr_tensor *h, hr_tensor *out) {
    return hr_build_head(f, h, ((const gemma3_cfg *)f->m->arch_cfg)->final_logit_softcapping, out);
}

/* ---- GGUF --------------------------------------------------------------------- */

static double meta_num(const hr_gguf *g, const char *key, double def) {
    double v;
    return hr_gguf_find(g, key) && hr_gguf_get_num(g, key, &v) == HR_OK ? v : def;
}

/* What llama.cpp's converter keeps of a Gemma 3 config: the window (no
 * key: no sliding layers) and its layer pattern, each kind's rope theta,
 * linear scaling of global layers, the final soft-cap. It writes no
 * attention scale: llama.cpp takes 1/sqrt(hidden / heads) for the 62-layer
 * model (27B) and 1/sqrt(head_dim) for the others, and so does this. */
static hr_status gemma3_gguf_config(const hr_gguf *g, cJSON *c) {
    double window = meta_num(g, "gemma3.attention.sliding_window", 0);
    double layers = meta_num(g, "gemma3.block_count", 0), hidden = meta_num(g, "gemma3.embedding_length", 0);
    double heads = meta_num(g, "gemma3.attention.head_count", 1);
    double head_dim = meta_num(g, "gemma3.attention.key_length", hidden / heads);
    double pattern = window > 0 ? meta_num(g, "gemma3.attention.sliding_window_pattern", 6) : 1;
    HR_TRY(hr_config_json_set_num(c, "sliding_window_pattern", pattern));
    HR_TRY(hr_config_json_set_num(c, "sliding_window", window > 0 ? window : meta_num(g, "gemma3.context_length", 2048)));
    HR_TRY(hr_config_json_set_num(c, "query_pre_attn_scalar", layers == 62 ? hidden / heads : head_dim));
    double cap = meta_num(g, "gemma3.final_logit_softcapping", 0);
    if (cap > 0) HR_TRY(hr_config_json_set_num(c, "final_logit_softcapping", cap));
    cJSON_DeleteItemFromObjectCaseSensitive(c, "hidden_act");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "rope_theta");
    if (!cJSON_AddStringToObject(c, "hidden_activation", "gelu_pytorch_tanh")) return hr_error(HR_ERR_OOM, "out of memory");
    /* rope by layer kind: the common builder's global rope (a linear
     * scaling it found) becomes full_attention's */
    cJSON *global = cJSON_DetachItemFromObjectCaseSensitive(c, "rope_parameters");
    if (!global) global = cJSON_CreateObject();
    cJSON *rp = cJSON_AddObjectToObject(c, "rope_parameters"), *local = cJSON_CreateObject();
    if (!global || !rp || !local || !cJSON_AddItemToObject(rp, "full_attention", global) ||
        !cJSON_AddItemToObject(rp, "sliding_attention", local)) {
        cJSON_Delete(local);
        return hr_error(HR_ERR_OOM, "out of memory");
    }
    HR_TRY(hr_config_json_set_num(global, "rope_theta", meta_num(g, "gemma3.rope.freq_base", 1e6)));
    return hr_config_json_set_num(local, "rope_theta", meta_num(g, "gemma3.rope.freq_base_swa", 1e4));
}

const hr_arch hr_arch_gemma3 = {
    .name = "Gemma3ForCausalLM",
    .alias = "Gemma3ForConditionalGeneration",
    .defaults_json = defaults,
    .cfg_size = sizeof(gemma3_cfg),
    .configure = gemma3_configure,
    .layer_weights = weights,
    .n_layer_weights = N_WEIGHTS,
    .embed = gemma3_embed,
    .forward = gemma3_forward,
    .head = gemma3_head,
    .gguf_arch = "gemma3",
    .gguf_config = gemma3_gguf_config,
};
