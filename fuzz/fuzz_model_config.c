/* libFuzzer target: config.json as a model reads it, through every
 * architecture's own configure (Gemma 3's layer types and per-type rope,
 * Mistral's window, the rope scalings, Qwen3-MoE's experts, Gemma 4's
 * per-kind sizes and shared KV layers, the quantization_configs). A config
 * that loads must hold sizes inside their bounds, a layer kind for every
 * layer (reading each lets ASan prove the array), KV sources earlier
 * layers of the same kind and an FP8 config its scale tensors' name and
 * block sizes; every refusal carries a message. */
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "models/model_impl.h"
#include "fuzz_limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hr_model_config cfg;
    const hr_arch *arch = NULL;
    void *arch_cfg = NULL;
    if (hr_model_config_parse("config.json", (const char *)data, size, &cfg, &arch, &arch_cfg) != HR_OK) {
        if (!hr_last_error()[0]) abort();
        return 0;
    }
    if (!arch || cfg.n_layers < 1 || cfg.n_layers > 1 << 16 || cfg.hidden_size < 1 || cfg.vocab_size < 1 ||
        cfg.n_heads < 1 || cfg.n_kv_heads < 1 || cfg.n_heads % cfg.n_kv_heads || cfg.head_dim < 2)
        abort();
    if (cfg.n_experts < 0 || (cfg.n_experts > 0 && (cfg.n_experts_per_tok < 1 || cfg.n_experts_per_tok > cfg.n_experts ||
                                                    cfg.moe_intermediate_size < 1)))
        abort();
    unsigned kinds = 0;
    for (int64_t i = 0; i < cfg.n_layers; i++) kinds |= 1u << (cfg.layer_kind[i] & 7);
    if (kinds & ~((1u << HR_LAYER_KINDS) - 1)) abort();
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        if (cfg.kind_head_dim[k] < 2 || cfg.kind_kv_heads[k] < 1 || cfg.n_heads % cfg.kind_kv_heads[k]) abort();
        if (cfg.rope[k].rotary_dim < 2 || cfg.rope[k].rotary_dim > cfg.kind_head_dim[k]) abort();
    }
    for (int64_t i = 0; cfg.kv_source && i < cfg.n_layers; i++) {
        int64_t src = cfg.kv_source[i];
        if (src >= i || (src >= 0 && (cfg.kv_source[src] >= 0 || cfg.layer_kind[src] != cfg.layer_kind[i]))) abort();
    }
    const hr_quant_config *q = &cfg.quant;
    if (q->method == HR_QUANT_FP8 &&
        (!q->scale_suffix || !q->label || q->block[0] < 0 || q->block[1] < 0 || q->block[0] > 1 << 30 ||
         q->block[1] > 1 << 30))
        abort();
    hr_model_config_free(&cfg);
    free(arch_cfg);
    return 0;
}
