/* Llama (2, 3, 3.1/3.2 with llama3 rope), SmolLM2, and Mistral: pre-norm
 * decoder, GQA, optional attention/MLP biases, SiLU-gated MLP; Mistral's
 * sliding window over every layer. GGUF "llama" files (q and k rows as
 * llama.cpp's converter permuted them). */
#include <cjson/cJSON.h>

#include "core/error.h"
#include "io/gguf.h"
#include "models/blocks.h"

typedef struct llama_cfg {
    bool attention_bias, mlp_bias;
} llama_cfg;

enum { ATTN_NORM, WQ, WK, WV, WO, BQ, BK, BV, BO, MLP_NORM, GATE, UP, DOWN, B_GATE, B_UP, B_DOWN, N_WEIGHTS };

static bool attn_bias(const hr_model *m, int64_t il) {
    (void)il;
    return ((const llama_cfg *)m->arch_cfg)->attention_bias;
}
static bool mlp_bias(const hr_model *m, int64_t il) {
    (void)il;
    return ((const llama_cfg *)m->arch_cfg)->mlp_bias;
}

static const hr_weight_spec weights[N_WEIGHTS] = {
    [ATTN_NORM] = {"input_layernorm.weight", "attn_norm.weight", {HR_DIM_HIDDEN}},
    [WQ] = {"self_attn.q_proj.weight", "attn_q.weight", {HR_DIM_Q, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR,
            HR_GGUF_ROWS_PERM_HEADS},
    [WK] = {"self_attn.k_proj.weight", "attn_k.weight", {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR,
            HR_GGUF_ROWS_PERM_KV_HEADS},
    [WV] = {"self_attn.v_proj.weight", "attn_v.weight", {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WO] = {"self_attn.o_proj.weight", "attn_output.weight", {HR_DIM_HIDDEN, HR_DIM_Q}, HR_WEIGHT_LINEAR},
    [BQ] = {"self_attn.q_proj.bias", "attn_q.bias", {HR_DIM_Q}, .gguf_rows = HR_GGUF_ROWS_PERM_HEADS, .when = attn_bias},
    [BK] = {"self_attn.k_proj.bias", "attn_k.bias", {HR_DIM_KV}, .gguf_rows = HR_GGUF_ROWS_PERM_KV_HEADS,
            .when = attn_bias},
    [BV] = {"self_attn.v_proj.bias", "attn_v.bias", {HR_DIM_KV}, .when = attn_bias},
    [BO] = {"self_attn.o_proj.bias", "attn_output.bias", {HR_DIM_HIDDEN}, .when = attn_bias},
    [MLP_NORM] = {"post_attention_layernorm.weight", "ffn_norm.weight", {HR_DIM_HIDDEN}},
    [GATE] = {"mlp.gate_proj.weight", "ffn_gate.weight", {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [UP] = {"mlp.up_proj.weight", "ffn_up.weight", {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [DOWN] = {"mlp.down_proj.weight", "ffn_down.weight", {HR_DIM_HIDDEN, HR_DIM_INTER}, HR_WEIGHT_LINEAR},
    [B_GATE] = {"mlp.gate_proj.bias", NULL, {HR_DIM_INTER}, .when = mlp_bias},
    [B_UP] = {"mlp.up_proj.bias", NULL, {HR_DIM_INTER}, .when = mlp_bias},
    [B_DOWN] = {"mlp.down_proj.bias", NULL, {HR_DIM_HIDDEN}, .when = mlp_bias},
};

static hr_status llama_configure(hr_json_obj root, hr_model_config *cfg, void *arch_cfg) {
    llama_cfg *c = arch_cfg;
    HR_TRY(hr_config_require_act(cfg, "silu"));
    HR_TRY(hr_json_get_bool(root, "attention_bias", false, &c->attention_bias));
    return hr_json_get_bool(root, "mlp_bias", false, &c->mlp_bias);
}

/* Mistral attends over the last sliding_window tokens in every layer
 * (none when it is null). */
static hr_status mistral_configure(hr_json_obj root, hr_model_config *cfg, void *arch_cfg) {
    HR_TRY(llama_configure(root, cfg, arch_cfg));
    HR_TRY(hr_json_get_i64(root, "sliding_window", 0, &cfg->sliding_window));
    if (cfg->sliding_window < 0)
        return hr_error(HR_ERR_FORMAT, "config.json: sliding_window %lld is negative", (long long)cfg->sliding_window);
    for (int64_t il = 0; cfg->sliding_window && il < cfg->n_layers; il++) cfg->layer_kind[il] = HR_LAYER_SLIDING;
    return HR_OK;
}

/* llama.cpp's converter writes no attention_bias key: the file's first
 * q bias says it (llama.cpp loads the biases when they are there). */
static hr_status llama_gguf_config(const hr_gguf *g, cJSON *c) {
    bool bias = hr_gguf_tensor_index(g, "blk.0.attn_q.bias") >= 0;
    cJSON_DeleteItemFromObjectCaseSensitive(c, "attention_bias");
    return cJSON_AddBoolToObject(c, "attention_bias", bias) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
}

#define W(il, i) hr_layer_w(m, (il), (i))

/* x -> x + attn(norm(x)) -> x + mlp(norm(x)), each residual add fused
 * with the norm that reads its sum: the MLP's, then the next layer's
 * input norm (the final norm after the last layer). */
static hr_status llama_forward(hr_fwd *f) {
    const hr_model *m = f->m;
    int64_t n = m->cfg.n_layers;
    hr_tensor *o = NULL;
    HR_TRY(hr_fwd_act(f, "o", 3, (int64_t[]){f->b, f->s, m->cfg.hidden_size}, &o));
    HR_TRY(hr_build_norm(f, f->x, W(0, ATTN_NORM), 0, f->h));
    for (int64_t il = 0; il < n; il++) {
        hr_attn_weights aw = {.wq = W(il, WQ), .wk = W(il, WK), .wv = W(il, WV), .wo = W(il, WO),
                              .bq = W(il, BQ), .bk = W(il, BK), .bv = W(il, BV), .bo = W(il, BO)};
        HR_TRY(hr_build_attention(f, il, &aw, &(hr_attn_opts){0}, f->h, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, W(il, MLP_NORM), 0, f->h));
        hr_mlp_weights mw = {.gate = W(il, GATE), .up = W(il, UP), .down = W(il, DOWN),
                             .b_gate = W(il, B_GATE), .b_up = W(il, B_UP), .b_down = W(il, B_DOWN)};
        HR_TRY(hr_build_gated_mlp(f, &mw, HR_LINEAR_SILU_MUL, f->h, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, il + 1 < n ? W(il + 1, ATTN_NORM) : m->final_norm, 0, f->h));
    }
    return HR_OK;
}

const hr_arch hr_arch_llama = {
    .name = "LlamaForCausalLM",
    .cfg_size = sizeof(llama_cfg),
    .configure = llama_configure,
    .layer_weights = weights,
    .n_layer_weights = N_WEIGHTS,
    .forward = llama_forward,
    .gguf_arch = "llama",
    .gguf_config = llama_gguf_config,
};

const hr_arch hr_arch_mistral = {
    .name = "MistralForCausalLM",
    .cfg_size = sizeof(llama_cfg),
    .configure = mistral_configure,
    .layer_weights = weights,
    .n_layer_weights = N_WEIGHTS,
    .forward = llama_forward,
};
