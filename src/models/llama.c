/* Llama (2, 3, 3.1/3.2 with llama3 rope), SmolLM2, and Mistral without a
 * sliding window: pre-norm decoder, GQA, optional attention/MLP biases. */
#include "core/error.h"
#include "models/model_impl.h"

static hr_status llama_configure(hr_json_obj root, hr_model_config *cfg) {
    HR_TRY(hr_json_get_bool(root, "attention_bias", false, &cfg->attention_bias));
    return hr_json_get_bool(root, "mlp_bias", false, &cfg->mlp_bias);
}

/* Mistral's sliding window changes attention; hubrt runs only checkpoints
 * whose window covers the whole context (or that have none). */
static hr_status mistral_configure(hr_json_obj root, hr_model_config *cfg) {
    int64_t window = 0;
    HR_TRY(hr_json_get_i64(root, "sliding_window", 0, &window));
    if (window > 0 && window < cfg->max_position_embeddings)
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: MistralForCausalLM with sliding_window %lld < "
                        "max_position_embeddings %lld is not supported", (long long)window,
                        (long long)cfg->max_position_embeddings);
    return HR_OK;
}

const hr_arch hr_arch_llama = {
    .name = "LlamaForCausalLM",
    .configure = llama_configure,
    .load_layer = hr_block_load_layer,
    .forward_layer = hr_block_decoder_layer,
};

const hr_arch hr_arch_mistral = {
    .name = "MistralForCausalLM",
    .configure = mistral_configure,
    .load_layer = hr_block_load_layer,
    .forward_layer = hr_block_decoder_layer,
};
