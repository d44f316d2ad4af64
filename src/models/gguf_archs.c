/* llama.cpp's GGUF files of the architectures hubrt runs, as io sees them
 * (io/gguf.h, hr_gguf_arch): each architecture's HF tensor names from its
 * own weight table (its GGUF names beside them), and its own config
 * fields. Registered when the library loads, so that every reader of a
 * GGUF file (models, `hubrt inspect`, hubrt.load_safetensors) sees them. */
#include <stdio.h>
#include <string.h>

#include "io/gguf.h"
#include "models/model_impl.h"

/* The top-level tensors every architecture shares. */
static const char *const top_names[][2] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

static bool hf_name(const hr_gguf_arch *ga, const hr_gguf *g, const char *name, char *buf, size_t cap,
                    int64_t *perm_heads) {
    const hr_arch *a = ga->ctx;
    *perm_heads = 0;
    for (size_t i = 0; i < sizeof top_names / sizeof top_names[0]; i++)
        if (!strcmp(name, top_names[i][0])) return (size_t)snprintf(buf, cap, "%s", top_names[i][1]) < cap;
    unsigned layer;
    int used = 0;
    if (sscanf(name, "blk.%u.%n", &layer, &used) != 1 || !used) return false;
    const char *rest = name + used;
    for (int j = 0; j < a->n_layer_weights; j++) {
        const hr_weight_spec *w = &a->layer_weights[j];
        for (int p = 0; p < 2; p++)
            if (w->gguf_parts[p] && w->parts[p] && !strcmp(rest, w->gguf_parts[p]))
                return (size_t)snprintf(buf, cap, "model.layers.%u.%s", layer, w->parts[p]) < cap;
        if (!w->gguf || strcmp(rest, w->gguf)) continue;
        /* the converter permutes q with the head count, k with the kv head count */
        int64_t heads = hr_gguf_arch_int(g, ga, "attention.head_count", 0);
        if (w->gguf_rows == HR_GGUF_ROWS_PERM_HEADS) *perm_heads = heads;
        if (w->gguf_rows == HR_GGUF_ROWS_PERM_KV_HEADS)
            *perm_heads = hr_gguf_arch_int(g, ga, "attention.head_count_kv", heads);
        return (size_t)snprintf(buf, cap, "model.layers.%u.%s", layer, w->hf) < cap;
    }
    return false;
}

static hr_status arch_config(const hr_gguf_arch *ga, const hr_gguf *g, struct cJSON *config) {
    const hr_arch *a = ga->ctx;
    return a->gguf_config ? a->gguf_config(g, config) : HR_OK;
}

#define MAX_ARCHS 16

static hr_gguf_arch g_adapters[MAX_ARCHS];

__attribute__((constructor(110))) static void register_gguf_archs(void) {
    int n = 0;
    for (const hr_arch *a; (a = hr_arch_at(n)) && n < MAX_ARCHS; n++) {
        if (!a->gguf_arch) continue;
        g_adapters[n] = (hr_gguf_arch){.name = a->gguf_arch, .hf_class = a->name, .hf_name = hf_name,
                                       .config = arch_config, .ctx = a};
        hr_gguf_arch_register(&g_adapters[n]);
    }
}
