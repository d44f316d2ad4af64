/* config.json -> hr_model_config, read as transformers 4.x writes it
 * (rope_theta + rope_scaling, torch_dtype) and as 5.x does
 * (rope_parameters, dtype); a multimodal config's text_config is the text
 * model's. The architecture named in "architectures" reads its own fields
 * (hr_arch.configure) and supplies the class defaults a sparse config
 * leaves out. Eos and pad ids also come from generation_config.json. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/path.h"
#include "models/model_impl.h"

static hr_status read_factors(hr_json_obj rp, const char *key, int64_t n, double **out) {
    free(*out);
    *out = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!*out) return hr_error(HR_ERR_OOM, "rope factors");
    int got = 0;
    HR_TRY(hr_json_get_f64_list(rp, key, *out, (int)n, &got));
    if (got != n)
        return hr_error(HR_ERR_FORMAT, "config.json: rope '%s' must hold %lld numbers (rotary_dim / 2), not %d", key,
                        (long long)n, got);
    return HR_OK;
}

hr_status hr_config_rope(hr_json_obj root, hr_json_obj rp, double theta, hr_model_config *cfg, hr_rope_config *r) {
    return hr_config_rope_dim(root, rp, theta, cfg->head_dim, cfg, r);
}

hr_status hr_config_rope_dim(hr_json_obj root, hr_json_obj rp, double theta, int64_t head_dim, hr_model_config *cfg,
                             hr_rope_config *r) {
    memset(r, 0, sizeof *r);
    double theta_top, partial_top, partial, omax;
    HR_TRY(hr_json_get_f64(root, "rope_theta", theta, &theta_top));
    HR_TRY(hr_json_get_f64(rp, "rope_theta", theta_top, &r->theta));
    HR_TRY(hr_json_get_f64(root, "partial_rotary_factor", 1.0, &partial_top));
    HR_TRY(hr_json_get_f64(rp, "partial_rotary_factor", partial_top, &partial));
    r->max_position_embeddings = cfg->max_position_embeddings;
    const char *ty = NULL;
    HR_TRY(hr_json_get_str(rp, "rope_type", NULL, &ty));
    if (!ty) HR_TRY(hr_json_get_str(rp, "type", "default", &ty));
    bool ok = false;
    r->type = hr_rope_type_parse(ty, &ok);
    if (!ok)
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: rope type '%s' is not supported "
                        "(default, linear, dynamic, yarn, llama3, longrope, proportional)", ty);
    if (r->type == HR_ROPE_PROPORTIONAL) {
        /* the rope spans the whole head; only the first int(partial *
         * head_dim // 2) frequency pairs turn */
        if (!(partial >= 0 && partial <= 1))
            return hr_error(HR_ERR_FORMAT, "config.json: partial_rotary_factor %g must be in [0, 1]", partial);
        r->rotary_dim = head_dim;
        r->rotated_dim = 2 * (int64_t)floor(partial * (double)head_dim / 2);
    } else {
        r->rotary_dim = (int64_t)((double)head_dim * partial);
    }
    if (r->rotary_dim < 2 || r->rotary_dim > head_dim || r->rotary_dim % 2)
        return hr_error(HR_ERR_FORMAT, "config.json: partial_rotary_factor %g gives rotary dim %lld for head_dim %lld",
                        partial, (long long)r->rotary_dim, (long long)head_dim);
    HR_TRY(hr_json_get_f64(rp, "original_max_position_embeddings", (double)cfg->max_position_embeddings, &omax));
    r->original_max_position_embeddings = (int64_t)omax;
    /* longrope without "factor" derives it from the two lengths */
    double def_factor = r->type == HR_ROPE_LONGROPE ? (double)cfg->max_position_embeddings / omax : 1.0;
    HR_TRY(hr_json_get_f64(rp, "factor", def_factor, &r->factor));
    HR_TRY(hr_json_get_f64(rp, "low_freq_factor", 1.0, &r->low_freq_factor));
    HR_TRY(hr_json_get_f64(rp, "high_freq_factor", 4.0, &r->high_freq_factor));
    HR_TRY(hr_json_get_f64(rp, "beta_fast", 32.0, &r->beta_fast));
    HR_TRY(hr_json_get_f64(rp, "beta_slow", 1.0, &r->beta_slow));
    HR_TRY(hr_json_get_f64(rp, "mscale", 0.0, &r->mscale));
    HR_TRY(hr_json_get_f64(rp, "mscale_all_dim", 0.0, &r->mscale_all_dim));
    HR_TRY(hr_json_get_f64(rp, "attention_factor", 0.0, &r->attention_factor));
    bool truncate = true;
    HR_TRY(hr_json_get_bool(rp, "truncate", true, &truncate));
    r->no_truncate = !truncate;
    if (r->type == HR_ROPE_LONGROPE) {
        HR_TRY(read_factors(rp, "short_factor", r->rotary_dim / 2, &cfg->rope_short));
        HR_TRY(read_factors(rp, "long_factor", r->rotary_dim / 2, &cfg->rope_long));
        r->short_factor = cfg->rope_short;
        r->long_factor = cfg->rope_long;
    }
    return HR_OK;
}

hr_status hr_config_layer_types(hr_json_obj root, hr_model_config *cfg, const char *arch, bool *listed) {
    *listed = false;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive((const cJSON *)root.node, "layer_types");
    if (!types || cJSON_IsNull(types)) return HR_OK;
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != cfg->n_layers)
        return hr_error(HR_ERR_FORMAT, "config.json: layer_types must list %lld layer types (num_hidden_layers)",
                        (long long)cfg->n_layers);
    int64_t i = 0;
    for (const cJSON *t = types->child; t; t = t->next, i++) {
        const char *v = cJSON_IsString(t) ? t->valuestring : "";
        if (!strcmp(v, "sliding_attention"))
            cfg->layer_kind[i] = HR_LAYER_SLIDING;
        else if (!strcmp(v, "full_attention"))
            cfg->layer_kind[i] = HR_LAYER_FULL;
        else
            return hr_error(HR_ERR_UNSUPPORTED, "config.json: layer_types[%lld] is '%.40s'; %s layers are "
                            "'sliding_attention' or 'full_attention'", (long long)i, v, arch);
    }
    *listed = true;
    return HR_OK;
}

hr_status hr_config_json_set_num(struct cJSON *o, const char *key, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    return cJSON_AddNumberToObject(o, key, v) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
}

hr_status hr_config_window(hr_json_obj root, int64_t def, hr_model_config *cfg) {
    HR_TRY(hr_json_get_i64(root, "sliding_window", def, &cfg->sliding_window));
    if (cfg->sliding_window < 1 || cfg->sliding_window > cfg->max_position_embeddings)
        return hr_error(HR_ERR_FORMAT, "config.json: sliding_window %lld must be in 1..%lld "
                        "(max_position_embeddings, the context)", (long long)cfg->sliding_window,
                        (long long)cfg->max_position_embeddings);
    return HR_OK;
}

hr_status hr_config_require_act(const hr_model_config *cfg, const char *want) {
    if (!strcmp(cfg->hidden_act, want)) return HR_OK;
    return hr_error(HR_ERR_UNSUPPORTED, "config.json: hidden_act '%s' is not supported by %s (%s)", cfg->hidden_act,
                    cfg->arch, want);
}

/* "dtype" (transformers 5.x) over "torch_dtype" (4.x), as transformers
 * reads them; a config holding both that disagree (a 4.x config edited by
 * hand, or a conversion that set one) is loaded at "dtype", and said so. */
static hr_status parse_dtype(const char *dir, hr_json_obj root, hr_json_obj text, hr_model_config *cfg) {
    const char *name = NULL, *legacy = NULL;
    HR_TRY(hr_json_get_str(root, "dtype", NULL, &name));
    HR_TRY(hr_json_get_str(root, "torch_dtype", NULL, &legacy));
    if (!name && !legacy) {
        HR_TRY(hr_json_get_str(text, "dtype", NULL, &name));
        HR_TRY(hr_json_get_str(text, "torch_dtype", NULL, &legacy));
    }
    if (name && legacy && strcmp(name, legacy))
        HR_LOG_WARN("%s/config.json: dtype '%s' and torch_dtype '%s' disagree; the model loads as '%s', as "
                    "transformers does",
                    dir, name, legacy, name);
    if (!name) name = legacy;
    cfg->dtype = HR_F32;
    if (!name || !strcmp(name, "auto")) return HR_OK;
    if (hr_dtype_parse(name, &cfg->dtype) != HR_OK || !hr_dtype_is_float(cfg->dtype))
        return hr_error(HR_ERR_FORMAT, "config.json: dtype '%s' is not a floating dtype", name);
    return HR_OK;
}

/* Sizes are bounded so that products of them (weights, caches) cannot
 * overflow, and counts that size arrays before any tensor is read (layers,
 * heads) stay small. */
#define MAX_SIZE ((int64_t)1 << 31)
#define MAX_COUNT ((int64_t)1 << 16)

static hr_status check_size(const char *dir, const char *field, int64_t v, int64_t lo, int64_t hi) {
    if (v >= lo && v <= hi) return HR_OK;
    return hr_error(HR_ERR_FORMAT, "%s/config.json: %s is %lld; it must be in %lld..%lld", dir, field, (long long)v,
                    (long long)lo, (long long)hi);
}

static hr_status parse_common(const char *dir, hr_json_obj root, hr_json_obj text, hr_model_config *cfg) {
    static const char *const required[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) HR_TRY(hr_json_require(text, required[i]));
    HR_TRY(hr_json_get_i64(text, "vocab_size", 0, &cfg->vocab_size));
    HR_TRY(hr_json_get_i64(text, "hidden_size", 0, &cfg->hidden_size));
    HR_TRY(hr_json_get_i64(text, "intermediate_size", 0, &cfg->intermediate_size));
    HR_TRY(hr_json_get_i64(text, "num_hidden_layers", 0, &cfg->n_layers));
    HR_TRY(hr_json_get_i64(text, "num_attention_heads", 0, &cfg->n_heads));
    HR_TRY(hr_json_get_i64(text, "num_key_value_heads", cfg->n_heads, &cfg->n_kv_heads));
    HR_TRY(check_size(dir, "vocab_size", cfg->vocab_size, 1, MAX_SIZE));
    HR_TRY(check_size(dir, "hidden_size", cfg->hidden_size, 1, MAX_SIZE));
    HR_TRY(check_size(dir, "intermediate_size", cfg->intermediate_size, 1, MAX_SIZE));
    HR_TRY(check_size(dir, "num_hidden_layers", cfg->n_layers, 1, MAX_COUNT));
    HR_TRY(check_size(dir, "num_attention_heads", cfg->n_heads, 1, MAX_COUNT));
    HR_TRY(check_size(dir, "num_key_value_heads", cfg->n_kv_heads, 1, MAX_COUNT));
    if (cfg->n_heads % cfg->n_kv_heads)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: num_attention_heads (%lld) must be a multiple of "
                        "num_key_value_heads (%lld)", dir, (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
    HR_TRY(hr_json_get_i64(text, "head_dim", cfg->hidden_size / cfg->n_heads, &cfg->head_dim));
    HR_TRY(hr_json_get_i64(text, "max_position_embeddings", 2048, &cfg->max_position_embeddings));
    HR_TRY(check_size(dir, "head_dim", cfg->head_dim, 2, MAX_COUNT));
    HR_TRY(check_size(dir, "max_position_embeddings", cfg->max_position_embeddings, 1, MAX_SIZE));
    HR_TRY(hr_json_get_f64(text, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps));
    bool tie_root = false;
    HR_TRY(hr_json_get_bool(root, "tie_word_embeddings", false, &tie_root));
    HR_TRY(hr_json_get_bool(text, "tie_word_embeddings", tie_root, &cfg->tie_word_embeddings));
    const char *act = NULL;
    HR_TRY(hr_json_get_str(text, "hidden_activation", NULL, &act));
    if (!act) HR_TRY(hr_json_get_str(text, "hidden_act", "silu", &act));
    snprintf(cfg->hidden_act, sizeof cfg->hidden_act, "%s", act);
    HR_TRY(parse_dtype(dir, root, text, cfg));
    for (int k = 0; k < HR_LAYER_KINDS; k++) cfg->kind_head_dim[k] = cfg->head_dim, cfg->kind_kv_heads[k] = cfg->n_kv_heads;
    /* every layer full, with one rope, unless the architecture says more */
    cfg->layer_kind = calloc((size_t)cfg->n_layers, 1);
    if (!cfg->layer_kind) return hr_error(HR_ERR_OOM, "config: layer kinds");
    hr_json_obj rp;
    HR_TRY(hr_json_get_obj(text, "rope_parameters", &rp));
    if (!hr_json_obj_present(rp)) HR_TRY(hr_json_get_obj(text, "rope_scaling", &rp));
    HR_TRY(hr_config_rope(text, rp, 10000.0, cfg, &cfg->rope[HR_LAYER_FULL]));
    cfg->rope[HR_LAYER_SLIDING] = cfg->rope[HR_LAYER_FULL];
    return HR_OK;
}

/* Eos ids: generation_config.json's first, then config.json's. */
static hr_status merge_eos(hr_json_obj root, hr_model_config *cfg) {
    int64_t ids[HR_GEN_MAX_EOS];
    int n = 0;
    HR_TRY(hr_json_get_i64_list(root, "eos_token_id", ids, HR_GEN_MAX_EOS, &n));
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < cfg->gen.n_eos; j++) seen |= cfg->gen.eos_token_ids[j] == ids[i];
        if (!seen && cfg->gen.n_eos < HR_GEN_MAX_EOS) cfg->gen.eos_token_ids[cfg->gen.n_eos++] = ids[i];
    }
    if (cfg->gen.pad_token_id < 0) HR_TRY(hr_json_get_i64(root, "pad_token_id", -1, &cfg->gen.pad_token_id));
    if (cfg->gen.bos_token_id < 0) HR_TRY(hr_json_get_i64(root, "bos_token_id", -1, &cfg->gen.bos_token_id));
    return HR_OK;
}

/* config.json of a folder, or its equivalent built from a GGUF file's
 * metadata (which carries no generation_config.json). */
static hr_status load_doc(const char *dir, hr_model_config *cfg, hr_json_doc **doc) {
    char *gguf = NULL;
    HR_TRY(hr_gguf_resolve(dir, &gguf));
    hr_generation_config_defaults(&cfg->gen);
    if (gguf) {
        char *json = NULL;
        size_t len = 0;
        cfg->from_gguf = true;
        hr_status s = hr_gguf_config_json(gguf, &json, &len);
        if (s == HR_OK) s = hr_json_doc_parse(gguf, json, len, doc);
        free(json);
        free(gguf);
        return s;
    }
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (stat(path, &st) == 0) {
        HR_TRY(hr_path_check_inside(dir, path));
        HR_TRY(hr_generation_config_load(path, &cfg->gen));
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    HR_TRY(hr_path_check_inside(dir, path));
    return hr_json_doc_load(path, doc);
}

static hr_status find_arch(const char *dir, hr_json_obj root, hr_model_config *cfg, const hr_arch **arch) {
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive((const cJSON *)root.node, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(a0)) return hr_error(HR_ERR_FORMAT, "%s/config.json: no 'architectures' list", dir);
    snprintf(cfg->arch, sizeof cfg->arch, "%s", a0->valuestring);
    if ((*arch = hr_arch_find(cfg->arch))) return HR_OK;
    return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: architecture '%s' is not supported; supported: %s", dir,
                    cfg->arch, hr_model_supported_archs());
}

/* The keys of the architecture's class defaults that `text` lacks, added
 * to it (transformers fills them from the config class). */
static hr_status add_defaults(const hr_arch *arch, hr_json_obj text) {
    if (!arch->defaults_json) return HR_OK;
    cJSON *def = cJSON_Parse(arch->defaults_json);
    if (!def) return hr_error(HR_ERR_INTERNAL, "%s: class defaults do not parse", arch->name);
    cJSON *t = (cJSON *)text.node;
    for (cJSON *it = def->child; it; it = it->next)
        if (!cJSON_HasObjectItem(t, it->string)) {
            cJSON *copy = cJSON_Duplicate(it, true);
            if (!copy || !cJSON_AddItemToObject(t, it->string, copy)) {
                cJSON_Delete(copy);
                cJSON_Delete(def);
                return hr_error(HR_ERR_OOM, "config: out of memory");
            }
        }
    cJSON_Delete(def);
    return HR_OK;
}

static hr_status parse_config(const char *dir, hr_json_doc *doc, hr_model_config *cfg, const hr_arch **arch,
                              void **arch_cfg) {
    hr_json_obj root = hr_json_doc_root(doc), text;
    HR_TRY(find_arch(dir, root, cfg, arch));
    HR_TRY(hr_json_get_obj(root, "text_config", &text));
    if (!hr_json_obj_present(text)) text = root;
    HR_TRY(add_defaults(*arch, text));
    HR_TRY(parse_common(dir, root, text, cfg));
    HR_TRY(hr_config_quant(dir, root, cfg));
    *arch_cfg = calloc(1, (*arch)->cfg_size ? (*arch)->cfg_size : 1);
    if (!*arch_cfg) return hr_error(HR_ERR_OOM, "config: out of memory");
    hr_status s = (*arch)->configure(text, cfg, *arch_cfg);
    if (s != HR_OK) return hr_error_context(s, "%s", dir);
    HR_TRY(merge_eos(root, cfg));
    return text.node == root.node ? HR_OK : merge_eos(text, cfg);
}

static hr_status config_from_doc(const char *dir, hr_json_doc *doc, hr_model_config *cfg, const hr_arch **arch,
                                 void **arch_cfg) {
    hr_status s = parse_config(dir, doc, cfg, arch, arch_cfg);
    hr_json_doc_free(doc);
    if (s != HR_OK) {
        hr_model_config_free(cfg);
        free(*arch_cfg);
        *arch_cfg = NULL;
    }
    return s;
}

hr_status hr_model_config_load(const char *dir, hr_model_config *cfg, const hr_arch **arch, void **arch_cfg) {
    memset(cfg, 0, sizeof *cfg);
    *arch = NULL;
    *arch_cfg = NULL;
    hr_json_doc *doc = NULL;
    HR_TRY(load_doc(dir, cfg, &doc));
    return config_from_doc(dir, doc, cfg, arch, arch_cfg);
}

hr_status hr_model_config_parse(const char *label, const char *text, size_t len, hr_model_config *cfg,
                                const hr_arch **arch, void **arch_cfg) {
    memset(cfg, 0, sizeof *cfg);
    *arch = NULL;
    *arch_cfg = NULL;
    hr_generation_config_defaults(&cfg->gen);
    hr_json_doc *doc = NULL;
    HR_TRY(hr_json_doc_parse(label, text, len, &doc));
    return config_from_doc(label, doc, cfg, arch, arch_cfg);
}

void hr_model_config_free(hr_model_config *cfg) {
    free(cfg->rope_short);
    free(cfg->rope_long);
    free(cfg->layer_kind);
    free(cfg->kv_source);
    cfg->rope_short = cfg->rope_long = NULL;
    cfg->layer_kind = NULL;
    cfg->kv_source = NULL;
}
