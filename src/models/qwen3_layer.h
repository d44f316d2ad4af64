/* The attention half of a Qwen3 layer, shared by Qwen3 (qwen3.c) and
 * Qwen3-MoE (qwen3_moe.c): the first entries of both weight tables, the
 * config fields both read, and the block that runs them. */
#ifndef HR_MODELS_QWEN3_LAYER_H
#define HR_MODELS_QWEN3_LAYER_H

#include "models/blocks.h"

/* The first member of both architectures' own configs. */
typedef struct hr_qwen3_attn_cfg {
    bool attention_bias;
} hr_qwen3_attn_cfg;

enum {
    HR_Q3_ATTN_NORM, HR_Q3_WQ, HR_Q3_WK, HR_Q3_WV, HR_Q3_WO, HR_Q3_BQ, HR_Q3_BK, HR_Q3_BV, HR_Q3_BO, HR_Q3_Q_NORM,
    HR_Q3_K_NORM, HR_Q3_MLP_NORM, HR_Q3_N_ATTN
};

bool hr_qwen3_attn_bias(const hr_model *m, int64_t il);

/* The entries [0, HR_Q3_N_ATTN) of a weight table. */
#define HR_QWEN3_ATTN_WEIGHTS                                                                                    \
    [HR_Q3_ATTN_NORM] = {"input_layernorm.weight", "attn_norm.weight", {HR_DIM_HIDDEN}},                          \
    [HR_Q3_WQ] = {"self_attn.q_proj.weight", "attn_q.weight", {HR_DIM_Q, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},       \
    [HR_Q3_WK] = {"self_attn.k_proj.weight", "attn_k.weight", {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},      \
    [HR_Q3_WV] = {"self_attn.v_proj.weight", "attn_v.weight", {HR_DIM_KV, HR_DIM_HIDDEN}, HR_WEIGHT_LINEAR},      \
    [HR_Q3_WO] = {"self_attn.o_proj.weight", "attn_output.weight", {HR_DIM_HIDDEN, HR_DIM_Q}, HR_WEIGHT_LINEAR},  \
    [HR_Q3_BQ] = {"self_attn.q_proj.bias", "attn_q.bias", {HR_DIM_Q}, .when = hr_qwen3_attn_bias},                \
    [HR_Q3_BK] = {"self_attn.k_proj.bias", "attn_k.bias", {HR_DIM_KV}, .when = hr_qwen3_attn_bias},               \
    [HR_Q3_BV] = {"self_attn.v_proj.bias", "attn_v.bias", {HR_DIM_KV}, .when = hr_qwen3_attn_bias},               \
    [HR_Q3_BO] = {"self_attn.o_proj.bias", "attn_output.bias", {HR_DIM_HIDDEN}, .when = hr_qwen3_attn_bias},      \
    [HR_Q3_Q_NORM] = {"self_attn.q_norm.weight", "attn_q_norm.weight", {HR_DIM_HEAD}},                            \
    [HR_Q3_K_NORM] = {"self_attn.k_norm.weight", "attn_k_norm.weight", {HR_DIM_HEAD}},                            \
    [HR_Q3_MLP_NORM] = {"post_attention_layernorm.weight", "ffn_norm.weight", {HR_DIM_HIDDEN}}

/* hidden_act silu, use_sliding_window refused (naming `arch`), attention_bias. */
hr_status hr_qwen3_configure_attn(hr_json_obj root, const hr_model_config *cfg, const char *arch,
                                  hr_qwen3_attn_cfg *out);

/* Layer il's attention over f->h into o, then x += o and f->h = the
 * post-attention norm of x. */
hr_status hr_qwen3_attention(hr_fwd *f, int64_t il, hr_tensor *o);

#endif
