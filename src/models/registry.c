/* The architecture table: config.json "architectures" -> constructor. */
#include <string.h>

#include "models/model_impl.h"

static const hr_arch *const g_archs[] = {&hr_arch_llama, &hr_arch_mistral, &hr_arch_qwen2,
                                         &hr_arch_qwen3};

const hr_arch *hr_arch_find(const char *name) {
    for (size_t i = 0; i < sizeof g_archs / sizeof g_archs[0]; i++)
        if (!strcmp(g_archs[i]->name, name)) return g_archs[i];
    return NULL;
}

const char *hr_model_supported_archs(void) {
    return "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";
}
