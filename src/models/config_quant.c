/* config.json's quantization_config, as transformers reads it: "mxfp4"
 * (gpt-oss's experts, weights_mxfp4.c), "fp8" (FineGrainedFP8Config:
 * weight_scale_inv per weight_block_size block, per tensor when that is
 * null, 128 x 128 when absent) and "compressed-tensors" in its
 * float-quantized format with 8-bit float weights (weight_scale per tensor,
 * channel, block or group). Anything else, or a scheme hubrt does not
 * apply (output activations, a quantized KV cache, sparsity, transforms),
 * is refused naming the field, rather than run with wrong weights. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "models/model_impl.h"

static const cJSON *item(hr_json_obj o, const char *key) {
    return o.node ? cJSON_GetObjectItemCaseSensitive((const cJSON *)o.node, key) : NULL;
}

static hr_status bad(const char *dir, const char *what) {
    return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: quantization_config: %s", dir, what);
}

/* [rows, cols] of positive integers into block. */
static hr_status block_pair(const char *dir, const char *field, const cJSON *v, int64_t block[2]) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: quantization_config.%s must be a list of two positive "
                        "integers", dir, field);
    for (int i = 0; i < 2; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > (double)(1 << 30) ||
            e->valuedouble != (double)(int64_t)e->valuedouble)
            return hr_error(HR_ERR_FORMAT, "%s/config.json: quantization_config.%s must be a list of two positive "
                            "integers", dir, field);
        block[i] = (int64_t)e->valuedouble;
    }
    return HR_OK;
}

static hr_status fp8(const char *dir, hr_json_obj q, hr_quant_config *c) {
    const char *scheme = NULL, *fmt = NULL, *experts = NULL;
    HR_TRY(hr_json_get_str(q, "activation_scheme", "dynamic", &scheme));
    HR_TRY(hr_json_get_str(q, "scale_fmt", "float", &fmt));
    HR_TRY(hr_json_get_str(q, "expert_dtype", "fp8", &experts));
    if (strcmp(scheme, "dynamic") && strcmp(scheme, "static"))
        return bad(dir, "activation_scheme must be \"dynamic\" or \"static\"");
    if (strcmp(fmt, "float")) return bad(dir, "scale_fmt other than \"float\" (ue8m0 scales) is not supported");
    if (strcmp(experts, "fp8")) return bad(dir, "expert_dtype other than \"fp8\" is not supported");
    c->static_act = !strcmp(scheme, "static");
    const cJSON *b = item(q, "weight_block_size");
    /* absent: transformers' default of 128 x 128; null: one scale per tensor */
    if (!b) c->block[0] = c->block[1] = 128;
    else if (!cJSON_IsNull(b)) HR_TRY(block_pair(dir, "weight_block_size", b, c->block));
    c->scale_suffix = "weight_scale_inv";
    c->label = "fp8";
    return HR_OK;
}

/* One config group's weights: 8-bit float, symmetric, by strategy. */
static hr_status ct_weights(const char *dir, hr_json_obj w, int64_t block[2]) {
    int64_t bits = 0, group = 0;
    const char *type = NULL, *strategy = NULL;
    bool symmetric = true;
    HR_TRY(hr_json_get_i64(w, "num_bits", 0, &bits));
    HR_TRY(hr_json_get_str(w, "type", "int", &type));
    HR_TRY(hr_json_get_str(w, "strategy", "tensor", &strategy));
    HR_TRY(hr_json_get_bool(w, "symmetric", true, &symmetric));
    if (bits != 8 || strcmp(type, "float") || !symmetric)
        return bad(dir, "compressed-tensors weights other than symmetric 8-bit float (FP8) are not supported");
    block[0] = block[1] = 0;
    if (!strcmp(strategy, "tensor")) return HR_OK;
    if (!strcmp(strategy, "channel")) {
        block[0] = 1;
        return HR_OK;
    }
    if (!strcmp(strategy, "block")) return block_pair(dir, "config_groups.*.weights.block_structure",
                                                      item(w, "block_structure"), block);
    if (!strcmp(strategy, "group")) {
        HR_TRY(hr_json_get_i64(w, "group_size", 0, &group));
        if (group < 1 || group > (1 << 30)) return bad(dir, "a group strategy needs a positive group_size");
        block[0] = 1;
        block[1] = group;
        return HR_OK;
    }
    return bad(dir, "compressed-tensors weights strategy must be tensor, channel, block or group");
}

static hr_status compressed_tensors(const char *dir, hr_json_obj q, hr_quant_config *c) {
    const char *format = NULL;
    HR_TRY(hr_json_get_str(q, "format", "?", &format));
    if (strcmp(format, "float-quantized"))
        return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: quantization_config: compressed-tensors format '%.40s' "
                        "is not supported (float-quantized is: F8_E4M3 weights with weight_scale)", dir, format);
    static const char *const unapplied[] = {"kv_cache_scheme", "sparsity_config", "transform_config"};
    for (size_t i = 0; i < sizeof unapplied / sizeof unapplied[0]; i++) {
        const cJSON *v = item(q, unapplied[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsObject(v) && !v->child))
            return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: quantization_config.%s is not supported", dir,
                            unapplied[i]);
    }
    const cJSON *groups = item(q, "config_groups");
    if (!cJSON_IsObject(groups) || !groups->child) return bad(dir, "compressed-tensors needs config_groups");
    bool first = true;
    for (const cJSON *g = groups->child; g; g = g->next) {
        hr_json_obj go = {.doc = q.doc, .node = g}, w, in, out;
        snprintf(go.prefix, sizeof go.prefix, "%.40sconfig_groups.%.40s.", q.prefix, g->string ? g->string : "?");
        const char *gformat = NULL;
        HR_TRY(hr_json_get_str(go, "format", format, &gformat));
        if (strcmp(gformat, "float-quantized")) return bad(dir, "every config group must be float-quantized");
        HR_TRY(hr_json_get_obj(go, "weights", &w));
        HR_TRY(hr_json_get_obj(go, "input_activations", &in));
        HR_TRY(hr_json_get_obj(go, "output_activations", &out));
        if (!hr_json_obj_present(w)) return bad(dir, "a config group without weights is not supported");
        if (hr_json_obj_present(out)) return bad(dir, "output_activations are not supported");
        int64_t block[2];
        HR_TRY(ct_weights(dir, w, block));
        bool dynamic = true;
        if (hr_json_obj_present(in)) HR_TRY(hr_json_get_bool(in, "dynamic", false, &dynamic));
        /* one weight layout for every group: the tensors carry no group name */
        if (!first && (block[0] != c->block[0] || block[1] != c->block[1] || !dynamic != c->static_act))
            return bad(dir, "config groups with different weight strategies are not supported");
        c->block[0] = block[0];
        c->block[1] = block[1];
        c->static_act = !dynamic;
        first = false;
    }
    c->scale_suffix = "weight_scale";
    c->label = "compressed-tensors";
    return HR_OK;
}

hr_status hr_config_quant(const char *dir, hr_json_obj root, hr_model_config *cfg) {
    hr_json_obj q;
    hr_quant_config *c = &cfg->quant;
    memset(c, 0, sizeof *c);
    HR_TRY(hr_json_get_obj(root, "quantization_config", &q));
    if (!hr_json_obj_present(q)) return HR_OK;
    const char *method = NULL;
    HR_TRY(hr_json_get_str(q, "quant_method", "?", &method));
    if (!strcmp(method, "mxfp4")) {
        if (strcmp(cfg->arch, "GptOssForCausalLM"))
            return bad(dir, "quant_method 'mxfp4' is read for gpt-oss's experts only");
        c->method = HR_QUANT_MXFP4;
        return HR_OK;
    }
    c->method = HR_QUANT_FP8;
    if (!strcmp(method, "fp8")) return fp8(dir, q, c);
    if (!strcmp(method, "compressed-tensors")) return compressed_tensors(dir, q, c);
    return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: quantization_config quant_method '%.40s' is not supported "
                    "(fp8, compressed-tensors with FP8 weights, and mxfp4 for gpt-oss are)", dir, method);
}
