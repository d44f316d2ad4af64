/* config.json -> hr_model_config, read as transformers 4.x writes it
 * (rope_theta + rope_scaling, torch_dtype) and as 5.x does
 * (rope_parameters, dtype). Eos and pad ids also come from
 * generation_config.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "models/model_impl.h"

static hr_status read_factors(hr_json_obj rp, const char *key, int64_t n, double **out) {
    *out = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!*out) return hr_error(HR_ERR_OOM, "rope factors");
    int got = 0;
    HR_TRY(hr_json_get_f64_list(rp, key, *out, (int)n, &got));
    if (got != n)
        return hr_error(HR_ERR_FORMAT, "config.json: rope '%s' must hold %lld numbers (rotary_dim / 2), not %d", key,
                        (long long)n, got);
    return HR_OK;
}

/* rope_parameters (5.x) holds everything; 4.x splits rope_theta (top level)
 * from rope_scaling (null for plain rope, "type" in older files). */
static hr_status parse_rope(hr_json_obj root, hr_model_config *cfg) {
    hr_json_obj rp;
    HR_TRY(hr_json_get_obj(root, "rope_parameters", &rp));
    if (!hr_json_obj_present(rp)) HR_TRY(hr_json_get_obj(root, "rope_scaling", &rp));
    hr_rope_config *r = &cfg->rope;
    memset(r, 0, sizeof *r);
    double theta_top, partial_top, partial, omax;
    HR_TRY(hr_json_get_f64(root, "rope_theta", 10000.0, &theta_top));
    HR_TRY(hr_json_get_f64(rp, "rope_theta", theta_top, &r->theta));
    HR_TRY(hr_json_get_f64(root, "partial_rotary_factor", 1.0, &partial_top));
    HR_TRY(hr_json_get_f64(rp, "partial_rotary_factor", partial_top, &partial));
    r->rotary_dim = (int64_t)((double)cfg->head_dim * partial);
    if (r->rotary_dim < 2 || r->rotary_dim > cfg->head_dim || r->rotary_dim % 2)
        return hr_error(HR_ERR_FORMAT, "config.json: partial_rotary_factor %g gives rotary dim %lld for head_dim %lld",
                        partial, (long long)r->rotary_dim, (long long)cfg->head_dim);
    r->max_position_embeddings = cfg->max_position_embeddings;
    const char *ty = NULL;
    HR_TRY(hr_json_get_str(rp, "rope_type", NULL, &ty));
    if (!ty) HR_TRY(hr_json_get_str(rp, "type", "default", &ty));
    bool ok = false;
    r->type = hr_rope_type_parse(ty, &ok);
    if (!ok)
        return hr_error(HR_ERR_UNSUPPORTED, "config.json: rope type '%s' is not supported "
                        "(default, linear, dynamic, yarn, llama3, longrope)", ty);
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

/* "dtype" (transformers 5.x) over "torch_dtype" (4.x), as transformers
 * reads them; a config holding both that disagree (a 4.x config edited by
 * hand, or a conversion that set one) is loaded at "dtype", and said so. */
static hr_status parse_dtype(const char *dir, hr_json_obj root, hr_model_config *cfg) {
    const char *name = NULL, *legacy = NULL;
    HR_TRY(hr_json_get_str(root, "dtype", NULL, &name));
    HR_TRY(hr_json_get_str(root, "torch_dtype", NULL, &legacy));
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

static hr_status parse_config(const char *dir, hr_json_obj root, hr_model_config *cfg) {
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive((const cJSON *)root.node, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(a0)) return hr_error(HR_ERR_FORMAT, "%s/config.json: no 'architectures' list", dir);
    snprintf(cfg->arch, sizeof cfg->arch, "%s", a0->valuestring);
    static const char *const required[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) HR_TRY(hr_json_require(root, required[i]));
    HR_TRY(hr_json_get_i64(root, "vocab_size", 0, &cfg->vocab_size));
    HR_TRY(hr_json_get_i64(root, "hidden_size", 0, &cfg->hidden_size));
    HR_TRY(hr_json_get_i64(root, "intermediate_size", 0, &cfg->intermediate_size));
    HR_TRY(hr_json_get_i64(root, "num_hidden_layers", 0, &cfg->n_layers));
    HR_TRY(hr_json_get_i64(root, "num_attention_heads", 0, &cfg->n_heads));
    HR_TRY(hr_json_get_i64(root, "num_key_value_heads", cfg->n_heads, &cfg->n_kv_heads));
    if (cfg->vocab_size < 1 || cfg->hidden_size < 1 || cfg->intermediate_size < 1 || cfg->n_layers < 1 ||
        cfg->n_heads < 1 || cfg->n_kv_heads < 1 || cfg->n_heads % cfg->n_kv_heads)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: sizes must be >= 1 and num_attention_heads (%lld) a "
                        "multiple of num_key_value_heads (%lld)", dir, (long long)cfg->n_heads,
                        (long long)cfg->n_kv_heads);
    HR_TRY(hr_json_get_i64(root, "head_dim", cfg->hidden_size / cfg->n_heads, &cfg->head_dim));
    HR_TRY(hr_json_get_i64(root, "max_position_embeddings", 2048, &cfg->max_position_embeddings));
    if (cfg->head_dim < 2 || cfg->max_position_embeddings < 1)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: head_dim and max_position_embeddings must be positive", dir);
    HR_TRY(hr_json_get_f64(root, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps));
    HR_TRY(hr_json_get_bool(root, "tie_word_embeddings", false, &cfg->tie_word_embeddings));
    const char *act = NULL;
    HR_TRY(hr_json_get_str(root, "hidden_act", "silu", &act));
    if (strcmp(act, "silu"))
        return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: hidden_act '%s' is not supported (silu)", dir, act);
    HR_TRY(parse_dtype(dir, root, cfg));
    return parse_rope(root, cfg);
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
        hr_status s = hr_gguf_config_json(gguf, &json, &len);
        if (s == HR_OK) s = hr_json_doc_parse(gguf, json, len, doc);
        free(json);
        free(gguf);
        return s;
    }
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (stat(path, &st) == 0) HR_TRY(hr_generation_config_load(path, &cfg->gen));
    snprintf(path, sizeof path, "%s/config.json", dir);
    return hr_json_doc_load(path, doc);
}

hr_status hr_model_config_load(const char *dir, hr_model_config *cfg, hr_json_doc **doc_out) {
    memset(cfg, 0, sizeof *cfg);
    hr_json_doc *doc = NULL;
    HR_TRY(load_doc(dir, cfg, &doc));
    hr_json_obj root = hr_json_doc_root(doc);
    hr_status s = parse_config(dir, root, cfg);
    if (s == HR_OK) s = merge_eos(root, cfg);
    if (s != HR_OK) {
        hr_json_doc_free(doc);
        hr_model_config_free(cfg);
        return s;
    }
    *doc_out = doc;
    return HR_OK;
}

void hr_model_config_free(hr_model_config *cfg) {
    free(cfg->rope_short);
    free(cfg->rope_long);
    cfg->rope_short = cfg->rope_long = NULL;
}
