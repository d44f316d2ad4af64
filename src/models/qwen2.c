/* Qwen2 / Qwen2.5: the Llama decoder with biases on q, k and v (not o),
 * SiLU-gated MLP. GGUF "qwen2" files (rows as HF's: its rope halves). */
#include "core/error.h"
#include "models/blocks.h"

enum { ATTN_NORM, WQ, WK, WV, WO, BQ, BK, BV, MLP_NORM, GATE, UP, DOWN, N_WEIGHTS };

static const hr_weight_spec weights[N_WEIGHTS] = {
    [ATTN_NORM] = {"input_layernorm.weight", "attn_norm.weight", {HR_DIM_HIDDEN}},
    [WQ] = {"self_attn.q_proj.weight", "attn_q.weight", {HR_DIM_Q, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WK] = {"self_attn.k_proj.weight", "attn_k.weight", {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WV] = {"self_attn.v_proj.weight", "attn_v.weight", {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [WO] = {"self_attn.o_proj.weight", "attn_output.weight", {HR_DIM_HIDDEN, HR_DIM_Q}, HR_WEIGHT_LINEAR},
    [BQ] = {"self_attn.q_proj.bias", "attn_q.bias", {HR_DIM_Q}},
    [BK] = {"self_attn.k_proj.bias", "attn_k.bias", {HR_DIM_KV}},
    [BV] = {"self_attn.v_proj.bias", "attn_v.bias", {HR_DIM_KV}},
    [MLP_NORM] = {"post_attention_layernorm.weight", "ffn_norm.weight", {HR_DIM_HIDDEN}},
    [GATE] = {"mlp.gate_proj.weight", "ffn_gate.weight", {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [UP] = {"mlp.up_proj.weight", "ffn_up.weight", {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [DOWN] = {"mlp.down_proj.weight", "ffn_down.weight", {HR_DIM_HIDDEN, HR_DIM_INTER}, HR_WEIGHT_LINEAR},
};

static hr_status qwen2_configure(hr_json_obj root, hr_model_config *cfg, void *arch_cfg) {
    HR_TRY(hr_config_require_act(cfg, "silu"));
    int64_t window = 0;
    bool use_window = false;
    HR_TRY(hr_json_get_bool(root, "use_sliding_window", false, &use_window));
    HR_TRY(hr_json_get_i64(root, "sliding_window", 0, &window));
    if (use_window && window > 0 && window < cfg->max_position_embeddings)
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: Qwen2ForCausalLM with use_sliding_window is not supported");
    return HR_OK;
}

#define W(il, i) hr_layer_w(m, (il), (i))

/* x -> x + attn(norm(x)) -> x + mlp(norm(x)); each residual add fused
 * with the next norm, the final norm after the last layer. */
static hr_status qwen2_forward(hr_fwd *f) {
    const hr_model *m = f->m;
    int64_t n = m->cfg.n_layers;
    hr_tensor *o = NULL;
    HR_TRY(hr_fwd_act(f, "o", 3, (int64_t[]){f->b, f->s, m->cfg.hidden_size}, &o));
    HR_TRY(hr_build_norm(f, f->x, W(0, ATTN_NORM), 0, f->h));
    for (int64_t il = 0; il < n; il++) {
        hr_attn_weights aw = {.wq = W(il, WQ), .wk = W(il, WK), .wv = W(il, WV), .wo = W(il, WO),
                              .bq = W(il, BQ), .bk = W(il, BK), .bv = W(il, BV)};
        HR_TRY(hr_build_attention(f, il, &aw, &(hr_attn_opts){0}, f->h, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, W(il, MLP_NORM), 0, f->h));
        hr_mlp_weights mw = {.gate = W(il, GATE), .up = W(il, UP), .down = W(il, DOWN)};
        HR_TRY(hr_build_gated_mlp(f, &mw, HR_LINEAR_SILU_MUL, f->h, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, il + 1 < n ? W(il + 1, ATTN_NORM) : m->final_norm, 0, f->h));
    }
    return HR_OK;
}

const hr_arch hr_arch_qwen2 = {
    .name = "Qwen2ForCausalLM",
    .configure = qwen2_configure,
    .layer_weights = weights,
    .n_layer_weights = N_WEIGHTS,
    .forward = qwen2_forward,
    .gguf_arch = "qwen2",
};
