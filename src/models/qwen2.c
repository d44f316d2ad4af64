/* Qwen2 / Qwen2.5: the Llama layer with biases on q, k and v (not o). */
#include "core/error.h"
#include "models/model_impl.h"

static hr_status qwen2_configure(hr_json_obj root, hr_model_config *cfg) {
    int64_t window = 0;
    bool use_window = false;
    HR_TRY(hr_json_get_bool(root, "use_sliding_window", false, &use_window));
    HR_TRY(hr_json_get_i64(root, "sliding_window", 0, &window));
    if (use_window && window > 0 && window < cfg->max_position_embeddings)
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: Qwen2ForCausalLM with use_sliding_window is not supported");
    cfg->qkv_bias = true;
    return HR_OK;
}

const hr_arch hr_arch_qwen2 = {
    .name = "Qwen2ForCausalLM",
    .configure = qwen2_configure,
    .load_layer = hr_block_load_layer,
    .forward_layer = hr_block_decoder_layer,
};
