/* Qwen3: the Llama decoder with a per-head rms norm of q and k before rope
 * (q_norm, k_norm), optional attention biases, SiLU-gated MLP. GGUF
 * "qwen3" files. The attention half is qwen3_layer.h's, shared with
 * Qwen3-MoE. */
#include "core/error.h"
#include "models/qwen3_layer.h"

typedef struct qwen3_cfg {
    hr_qwen3_attn_cfg attn;
} qwen3_cfg;

enum { GATE = HR_Q3_N_ATTN, UP, DOWN, N_WEIGHTS };

bool hr_qwen3_attn_bias(const hr_model *m, int64_t il) {
    (void)il;
    return ((const hr_qwen3_attn_cfg *)m->arch_cfg)->attention_bias;
}

static const hr_weight_spec weights[N_WEIGHTS] = {
    HR_QWEN3_ATTN_WEIGHTS,
    [GATE] = {"mlp.gate_proj.weight", "ffn_gate.weight", {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [UP] = {"mlp.up_proj.weight", "ffn_up.weight", {HR_DIM_INTER, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},
    [DOWN] = {"mlp.down_proj.weight", "ffn_down.weight", {HR_DIM_HIDDEN, HR_DIM_INTER}, HR_WEIGHT_LINEAR},
};

hr_status hr_qwen3_configure_attn(hr_json_obj root, const hr_model_config *cfg, const char *arch,
                                  hr_qwen3_attn_cfg *out) {
    HR_TRY(hr_config_require_act(cfg, "silu"));
    bool use_window = false;
    HR_TRY(hr_json_get_bool(root, "use_sliding_window", false, &use_window));
    if (use_window) return hr_error(HR_ERR_UNSUPPORTED, "config.json: %s with use_sliding_window is not supported", arch);
    return hr_json_get_bool(root, "attention_bias", false, &out->attention_bias);
}

static hr_status qwen3_configure(hr_json_obj root, hr_model_config *cfg, void *arch_cfg) {
    return hr_qwen3_configure_attn(root, cfg, "Qwen3ForCausalLM", &((qwen3_cfg *)arch_cfg)->attn);
}

#define W(il, i) hr_layer_w(m, (il), (i))

hr_status hr_qwen3_attention(hr_fwd *f, int64_t il, hr_tensor *o) {
    const hr_model *m = f->m;
    hr_attn_weights aw = {.wq = W(il, HR_Q3_WQ), .wk = W(il, HR_Q3_WK), .wv = W(il, HR_Q3_WV),
                          .wo = W(il, HR_Q3_WO), .bq = W(il, HR_Q3_BQ), .bk = W(il, HR_Q3_BK),
                          .bv = W(il, HR_Q3_BV), .bo = W(il, HR_Q3_BO), .q_norm = W(il, HR_Q3_Q_NORM),
                          .k_norm = W(il, HR_Q3_K_NORM)};
    HR_TRY(hr_build_attention(f, il, &aw, &(hr_attn_opts){0}, f->h, o));
    return hr_build_add_norm(f, f->x, o, W(il, HR_Q3_MLP_NORM), 0, f->h);
}

/* x -> x + attn(norm(x)) with q and k normed per head before rope ->
 * x + mlp(norm(x)); each residual add fused with the next norm. */
static hr_status qwen3_forward(hr_fwd *f) {
    const hr_model *m = f->m;
    int64_t n = m->cfg.n_layers;
    hr_tensor *o = NULL;
    HR_TRY(hr_fwd_act(f, "o", 3, (int64_t[]){f->b, f->s, m->cfg.hidden_size}, &o));
    HR_TRY(hr_build_norm(f, f->x, W(0, HR_Q3_ATTN_NORM), 0, f->h));
    for (int64_t il = 0; il < n; il++) {
        HR_TRY(hr_qwen3_attention(f, il, o));
        hr_mlp_weights mw = {.gate = W(il, GATE), .up = W(il, UP), .down = W(il, DOWN)};
        HR_TRY(hr_build_gated_mlp(f, &mw, HR_LINEAR_SILU_MUL, f->h, o));
        HR_TRY(hr_build_add_norm(f, f->x, o, il + 1 < n ? W(il + 1, HR_Q3_ATTN_NORM) : m->final_norm, 0, f->h));
    }
    return HR_OK;
}

const hr_arch hr_arch_qwen3 = {
    .name = "Qwen3ForCausalLM",
    .cfg_size = sizeof(qwen3_cfg),
    .configure = qwen3_configure,
    .layer_weights = weights,
    .n_layer_weights = N_WEIGHTS,
    .forward = qwen3_forward,
    .gguf_arch = "qwen3",
};
