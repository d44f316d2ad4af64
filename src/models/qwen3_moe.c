/* Qwen3-MoE: Qwen3's attention (qwen3_layer.h: per-head q/k rms norms
 * before rope), and in place of the MLP a mixture of experts on the layers
 * where (il + 1) % decoder_sparse_step == 0 and il is not in
 * mlp_only_layers: a router softmax in f32 over every expert, the top
 * num_experts_per_tok, renormalised when norm_topk_prob, and SiLU-gated
 * experts; a dense MLP of intermediate_size elsewhere. The experts are read stacked, [E, 2I,
 * H] and [E, H, I]: as transformers holds them, or stacked at load from
 * the per-expert tensors transformers saves. */
#include <cjson/cJSON.h>
#include <stdio.h>

#include "core/error.h"
#include "io/gguf.h"
#include "models/qwen3_layer.h"

#define MAX_MLP_ONLY 256

typedef struct qwen3_moe_cfg {
    hr_qwen3_attn_cfg attn;
    bool norm_topk_prob;
    int64_t decoder_sparse_step;
    int n_mlp_only;
    int64_t mlp_only[MAX_MLP_ONLY];
} qwen3_moe_cfg;

enum { GATE = HR_Q3_N_ATTN, UP, DOWN, ROUTER, GATE_UP, EXP_DOWN, N_WEIGHTS };

static const qwen3_moe_cfg *cfg_of(const hr_model *m) { return m->arch_cfg; }

/* transformers' Qwen3MoeDecoderLayer: experts on every decoder_sparse_step-th
 * layer not listed in mlp_only_layers, when there are experts at all */
static bool moe_layer(const hr_model *m, int64_t il) {
    const qwen3_moe_cfg *c = cfg_of(m);
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only[i] == il) return false;
    return m->cfg.n_experts > 0 && (il + 1) % c->decoder_sparse_step == 0;
}

static bool dense_layer(const hr_model *m, int64_t il) { return !moe_layer(m, il); }

static const hr_weight_spec weights[N_WEIGHTS] = {
    HR_QWEN3_ATTN_WEIGHTS,
    [GATE] = {"mlp.gate_proj.weight", NULL, {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR, .when = dense_layer},
    [UP] = {"mlp.up_proj.weight", NULL, {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR, .when = dense_layer},
    [DOWN] = {"mlp.down_proj.weight", NULL, {HR_DIM_HIDDEN, HR_DIM_INTER}, HR_WEIGHT_LINEAR, .when = dense_layer},
    [ROUTER] = {"mlp.gate.weight", "ffn_gate_inp.weight", {HR_DIM_EXPERTS, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR,
                .when = moe_layer},
    [GATE_UP] = {"mlp.experts.gate_up_proj", NULL, {HR_DIM_EXPERTS, HR_DIM_MOE_INTER2, HR_DIM_HIDDEN},
                 .when = moe_layer,
                 .per_expert = {"mlp.experts.%lld.gate_proj.weight", "mlp.experts.%lld.up_proj.weight"},
                 .parts = {"mlp.experts.gate_proj", "mlp.experts.up_proj"},
                 .gguf_parts = {"ffn_gate_exps.weight", "ffn_up_exps.weight"}},
    [EXP_DOWN] = {"mlp.experts.down_proj", "ffn_down_exps.weight", {HR_DIM_EXPERTS, HR_DIM_HIDDEN, HR_DIM_MOE_INTER},
                  .when = moe_layer, .per_expert = {"mlp.experts.%lld.down_proj.weight"}},
};

/* transformers' Qwen3MoeConfig defaults for the keys a config.json may leave out */
static const char defaults[] = "{\"num_experts_per_tok\": 8, \"moe_intermediate_size\": 768,"
                               "\"norm_topk_prob\": false, \"decoder_sparse_step\": 1}";

static hr_status qwen3_moe_configure(hr_json_obj root, hr_model_config *cfg, void *arch_cfg) {
    qwen3_moe_cfg *c = arch_cfg;
    HR_TRY(hr_qwen3_configure_attn(root, cfg, "Qwen3MoeForCausalLM", &c->attn));
    HR_TRY(hr_json_get_bool(root, "norm_topk_prob", false, &c->norm_topk_prob));
    /* transformers 5 saves num_experts as num_local_experts */
    const char *experts_key = hr_json_has(root, "num_local_experts") && !hr_json_has(root, "num_experts")
                                  ? "num_local_experts" : "num_experts";
    HR_TRY(hr_json_get_i64(root, experts_key, 128, &cfg->n_experts));
    HR_TRY(hr_json_get_i64(root, "num_experts_per_tok", 8, &cfg->n_experts_per_tok));
    HR_TRY(hr_json_get_i64(root, "moe_intermediate_size", 768, &cfg->moe_intermediate_size));
    HR_TRY(hr_json_get_i64(root, "decoder_sparse_step", 1, &c->decoder_sparse_step));
    if (cfg->n_experts < 0 || cfg->n_experts > 65536)
        return hr_error(HR_ERR_FORMAT, "config.json: %s is %lld (0 to 65536)", experts_key, (long long)cfg->n_experts);
    if (cfg->n_experts > 0 && (cfg->n_experts_per_tok < 1 || cfg->n_experts_per_tok > cfg->n_experts))
        return hr_error(HR_ERR_FORMAT, "config.json: num_experts_per_tok is %lld, not 1 to %s (%lld)",
                        (long long)cfg->n_experts_per_tok, experts_key, (long long)cfg->n_experts);
    if (cfg->n_experts > 0 && (cfg->moe_intermediate_size < 1 || cfg->moe_intermediate_size > (1 << 20)))
        return hr_error(HR_ERR_FORMAT, "config.json: moe_intermediate_size is %lld (1 to 1048576)",
                        (long long)cfg->moe_intermediate_size);
    if (c->decoder_sparse_step < 1)
        return hr_error(HR_ERR_FORMAT, "config.json: decoder_sparse_step is %lld, not a positive count",
                        (long long)c->decoder_sparse_step);
    return hr_json_get_i64_list(root, "mlp_only_layers", c->mlp_only, MAX_MLP_ONLY, &c->n_mlp_only);
}

/* What llama.cpp keeps of a Qwen3-MoE config: the experts' count, top-k and
 * size. Its qwen3moe graph has experts on every layer and renormalises the
 * top-k weights (norm_w), whatever the HF config said; so does this. */
static hr_status qwen3_moe_gguf_config(const hr_gguf *g, cJSON *c) {
    static const char *const keys[][2] = {{"expert_count", "num_experts"},
                                          {"expert_used_count", "num_experts_per_tok"},
                                          {"expert_feed_forward_length", "moe_intermediate_size"}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char key[64];
        double v;
        snprintf(key, sizeof key, "qwen3moe.%s", keys[i][0]);
        if (!hr_gguf_find(g, key) || hr_gguf_get_num(g, key, &v) != HR_OK)
            return hr_error(HR_ERR_FORMAT, "GGUF: no '%s' (a qwen3moe file's experts)", key);
        HR_TRY(hr_config_json_set_num(c, keys[i][1], v));
    }
    HR_TRY(hr_config_json_set_num(c, "decoder_sparse_step", 1));
    cJSON_DeleteItemFromObjectCaseSensitive(c, "norm_topk_prob");
    return cJSON_AddBoolToObject(c, "norm_topk_prob", 1) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
}

#define W(il, i) hr_layer_w(m, (il), (i))

/* Qwen3's layer, with the experts in place of the MLP on MoE layers. */
static hr_status qwen3_moe_forward(hr_fwd *f) {
    const hr_model *m = f->m;
    int64_t n = m->cfg.n_layers;
    hr_tensor *o = NULL;
    HR_TRY(hr_fwd_act(f, "o", 3, (int64_t[]){f->b, f->s, m->cfg.hidden_size}, &o));
    HR_TRY(hr_build_norm(f, f->x, W(0, HR_Q3_ATTN_NORM), 0, f->h));
    hr_moe_opts mo = {.router = HR_ROUTER_SOFTMAX_TOPK, .norm_topk = cfg_of(m)->norm_topk_prob,
                      .act = HR_EXPERTS_SILU};
    for (int64_t il = 0; il < n; il++) {
        HR_TRY(hr_qwen3_attention(f, il, o));
        if (moe_layer(m, il)) {
            hr_moe_weights ew = {.router = W(il, ROUTER), .gate_up = W(il, GATE_UP), .down = W(il, EXP_DOWN)};
            HR_TRY(hr_build_moe(f, &ew, &mo, f->h, o));
        } else {
            hr_mlp_weights mw = {.gate = W(il, GATE), .up = W(il, UP), .down = W(il, DOWN)};
            HR_TRY(hr_build_gated_mlp(f, &mw, HR_LINEAR_SILU_MUL, f->h, o));
        }
        HR_TRY(hr_build_add_norm(f, f->x, o, il + 1 < n ? W(il + 1, HR_Q3_ATTN_NORM) : m->final_norm, 0, f->h));
    }
    return HR_OK;
}

const hr_arch hr_arch_qwen3_moe = {
    .name = "Qwen3MoeForCausalLM",
    .defaults_json = defaults,
    .cfg_size = sizeof(qwen3_moe_cfg),
    .configure = qwen3_moe_configure,
    .layer_weights = weights,
    .n_layer_weights = N_WEIGHTS,
    .forward = qwen3_moe_forward,
    .gguf_arch = "qwen3moe",
    .gguf_config = qwen3_moe_gguf_config,
};
