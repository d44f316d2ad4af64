/* Qwen3: the Llama layer with a per-head rms norm of q and k before rope
 * (q_norm, k_norm) and optional attention biases. */
#include "core/error.h"
#include "models/model_impl.h"

static hr_status qwen3_configure(hr_json_obj root, hr_model_config *cfg) {
    bool use_window = false;
    HR_TRY(hr_json_get_bool(root, "use_sliding_window", false, &use_window));
    if (use_window)
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: Qwen3ForCausalLM with use_sliding_window is not supported");
    cfg->qk_norm = true;
    return hr_json_get_bool(root, "attention_bias", false, &cfg->attention_bias);
}

const hr_arch hr_arch_qwen3 = {
    .name = "Qwen3ForCausalLM",
    .configure = qwen3_configure,
    .load_layer = hr_block_load_layer,
    .forward_layer = hr_block_decoder_layer,
};
