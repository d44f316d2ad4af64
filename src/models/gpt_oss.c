/* gpt-oss: a pre-norm decoder whose attention has q/k/v/o biases and a
 * learnt sink logit per head (a key of its own in the softmax that holds no
 * value), alternating sliding-window and full layers (layer_types), yarn
 * rope, and a mixture of experts in every layer: a router linear with a
 * bias, the top num_experts_per_tok of its logits and a softmax over those,
 * and experts with biases and a clamped SwiGLU ((up + 1) * gate *
 * sigmoid(1.702 gate), gate at most swiglu_limit, up within +-limit).
 *
 * The experts are stored as transformers holds them, gate_up [E, H, 2I]
 * with gate and up interleaved (::2, 1::2) and down [E, I, H]; they are
 * rearranged once at load into the experts op's [E, 2I, H] (gate rows, then
 * up rows) and [E, H, I] (hr_weight_stored). The Hub's gpt-oss releases
 * hold the experts in MXFP4 (quantization_config.quant_method "mxfp4",
 * NAME_blocks and NAME_scales in the op's own layout): dequantized at load
 * (weights_mxfp4.c); other quant_methods are refused naming them. */
#include <string.h>

#include "core/error.h"
#include "models/blocks.h"

typedef struct gpt_oss_cfg {
    bool attention_bias;
    double swiglu_limit, swiglu_alpha;
} gpt_oss_cfg;

enum {
    ATTN_NORM, WQ, WK, WV, WO, BQ, BK, BV, BO, SINKS, MLP_NORM, ROUTER, ROUTER_B, GATE_UP, GATE_UP_B, DOWN, DOWN_B,
    N_WEIGHTS
};

static bool attn_bias(const hr_model *m, int64_t il) {
    (void)il;
    return ((const gpt_oss_cfg *)m->arch_cfg)->attention_bias;
}

static const hr_weight_spec weights[N_WEIGHTS] = {
    [ATTN_NORM] = {"input_layernorm.weight", NULL, {HR_DIM_HIDDEN}},
    [WQ] = {"self_attn.q_proj.weight", NULL, {HR_DIM_Q, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WK] = {"self_attn.k_proj.weight", NULL, {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WV] = {"self_attn.v_proj.weight", NULL, {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WO] = {"self_attn.o_proj.weight", NULL, {HR_DIM_HIDDEN, HR_DIM_Q}, HR_WEIGHT_LINEAR},
    [BQ] = {"self_attn.q_proj.bias", NULL, {HR_DIM_Q}, .when = attn_bias},
    [BK] = {"self_attn.k_proj.bias", NULL, {HR_DIM_KV}, .when = attn_bias},
    [BV] = {"self_attn.v_proj.bias", NULL, {HR_DIM_KV}, .when = attn_bias},
    [BO] = {"self_attn.o_proj.bias", NULL, {HR_DIM_HIDDEN}, .when = attn_bias},
    [SINKS] = {"self_attn.sinks", NULL, {HR_DIM_HEADS}},
    [MLP_NORM] = {"post_attention_layernorm.weight", NULL, {HR_DIM_HIDDEN}},
    [ROUTER] = {"mlp.router.weight", NULL, {HR_DIM_EXPERTS, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [ROUTER_B] = {"mlp.router.bias", NULL, {HR_DIM_EXPERTS}},
    [GATE_UP] = {"mlp.experts.gate_up_proj", NULL, {HR_DIM_EXPERTS, HR_DIM_MOE_INTER2, HR_DIM_HIDDEN},
                 .stored = HR_STORED_TRANSPOSED_INTERLEAVED},
    [GATE_UP_B] = {"mlp.experts.gate_up_proj_bias", NULL, {HR_DIM_EXPERTS, HR_DIM_MOE_INTER2},
                   .stored = HR_STORED_INTERLEAVED},
    [DOWN] = {"mlp.experts.down_proj", NULL, {HR_DIM_EXPERTS, HR_DIM_HIDDEN, HR_DIM_MOE_INTER},
              .stored = HR_STORED_TRANSPOSED},
    [DOWN_B] = {"mlp.experts.down_proj_bias", NULL, {HR_DIM_EXPERTS, HR_DIM_HIDDEN}},
};

/* transformers' GptOssConfig defaults for the keys a config.json may leave out */
static const char defaults[] = "{\"num_local_experts\": 128, \"num_experts_per_tok\": 4, \"sliding_window\": 128,"
                               " \"attention_bias\": true, \"swiglu_limit\": 7.0, \"swiglu_alpha\": 1.702}";

static hr_status gpt_oss_configure(hr_json_obj root, hr_model_config *cfg, void *arch_cfg) {
    gpt_oss_cfg *c = arch_cfg;
    hr_json_obj q;
    HR_TRY(hr_json_get_obj(root, "quantization_config", &q));
    if (hr_json_obj_present(q)) {
        const char *method = NULL;
        HR_TRY(hr_json_get_str(q, "quant_method", "?", &method));
        if (strcmp(method, "mxfp4"))
            return hr_error(HR_ERR_UNSUPPORTED, "config.json: quantization_config quant_method '%.40s' is not "
                            "supported (mxfp4 is: the experts' _blocks and _scales)", method);
    }
    HR_TRY(hr_json_get_bool(root, "attention_bias", true, &c->attention_bias));
    HR_TRY(hr_json_get_f64(root, "swiglu_limit", 7.0, &c->swiglu_limit));
    HR_TRY(hr_json_get_f64(root, "swiglu_alpha", 1.702, &c->swiglu_alpha));
    if (!(c->swiglu_limit > 0) || c->swiglu_limit > 1e30 || !(c->swiglu_alpha > -1e30 && c->swiglu_alpha < 1e30))
        return hr_error(HR_ERR_FORMAT, "config.json: swiglu_limit %g must be positive and swiglu_alpha %g finite",
                        c->swiglu_limit, c->swiglu_alpha);
    HR_TRY(hr_json_get_i64(root, "num_local_experts", 128, &cfg->n_experts));
    HR_TRY(hr_json_get_i64(root, "num_experts_per_tok", 4, &cfg->n_experts_per_tok));
    cfg->moe_intermediate_size = cfg->intermediate_size; /* gpt-oss's experts are its MLPs */
    cfg->moe_inter_field = "intermediate_size";
    if (cfg->n_experts < 1 || cfg->n_experts > 65536)
        return hr_error(HR_ERR_FORMAT, "config.json: num_local_experts is %lld (1 to 65536)", (long long)cfg->n_experts);
    if (cfg->n_experts_per_tok < 1 || cfg->n_experts_per_tok > cfg->n_experts)
        return hr_error(HR_ERR_FORMAT, "config.json: num_experts_per_tok is %lld, not 1 to num_local_experts (%lld)",
                        (long long)cfg->n_experts_per_tok, (long long)cfg->n_experts);
    HR_TRY(hr_config_window(root, 128, cfg));
    bool listed = false;
    HR_TRY(hr_config_layer_types(root, cfg, "gpt-oss", &listed));
    /* transformers' default: sliding, full, sliding, ... */
    for (int64_t i = 0; !listed && i < cfg->n_layers; i++) cfg->layer_kind[i] = i % 2 ? HR_LAYER_FULL : HR_LAYER_SLIDING;
    return HR_OK;
}

#define W(il, i) hr_layer_w(m, (il), (i))

/* x -> x + attn(norm(x)) with the heads' sinks -> x + moe(norm(x)); each
 * residual add fused with the next norm. */
static hr_status gpt_oss_forward(hr_fwd *f) {
    const hr_model *m = f->m;
    const gpt_oss_cfg *c = m->arch_cfg;
    int64_t n = m->cfg.n_layers;
    hr_tensor *o = NULL;
    HR_TRY(hr_fwd_act(f, "o", 3, (int64_t[]){f->b, f->s, m->cfg.hidden_size}, &o));
    HR_TRY(hr_build_norm(f, f->x, W(0, ATTN_NORM), 0, f->h));
    hr_moe_opts mo = {.router = HR_ROUTER_TOPK_SOFTMAX, .act = HR_EXPERTS_GPT_OSS, .limit = c->swiglu_limit,
                      .alpha = c->swiglu_alpha};
    for (int64_t il = 0; il < n; il++) {
        hr_attn_weights aw = {.wq = W(il, WQ), .wk = W(il, WK), .wv = W(il, WV), .wo = W(il, WO),
                              .bq = W(il, BQ), .bk = W(il, BK), .bv = W(il, BV), .bo = W(il, BO),
                              .sinks = W(il, SINKS)};
        HR_TRY(hr_build_attention(f, il, &aw, &(hr_attn_opts){0}, f->h, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, W(il, MLP_NORM), 0, f->h));
        hr_moe_weights ew = {.router = W(il, ROUTER), .router_bias = W(il, ROUTER_B), .gate_up = W(il, GATE_UP),
                             .down = W(il, DOWN), .gate_up_bias = W(il, GATE_UP_B), .down_bias = W(il, DOWN_B)};
        HR_TRY(hr_build_moe(f, &ew, &mo, f->h, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, il + 1 < n ? W(il + 1, ATTN_NORM) : m->final_norm, 0, f->h));
    }
    return HR_OK;
}

const hr_arch hr_arch_gpt_oss = {
    .name = "GptOssForCausalLM",
    .defaults_json = defaults,
    .cfg_size = sizeof(gpt_oss_cfg),
    .configure = gpt_oss_configure,
    .layer_weights = weights,
    .n_layer_weights = N_WEIGHTS,
    .forward = gpt_oss_forward,
};
