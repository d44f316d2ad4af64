/* Llama-architecture GGUF files seen as Hub checkpoints: tensor names
 * mapped to HF's, and config.json / tokenizer.json equivalents built from
 * the metadata, so that the model and tokenizer loaders read them as they
 * read a model folder. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "io/gguf.h"

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

hr_status hr_gguf_resolve(const char *path, char **out) {
    *out = NULL;
    struct stat sb;
    if (!path || stat(path, &sb) != 0) return HR_OK; /* the caller's own open names the problem */
    if (!S_ISDIR(sb.st_mode)) {
        if (ends_with(path, ".gguf") && !(*out = strdup(path))) return hr_error(HR_ERR_OOM, "out of memory");
        return HR_OK;
    }
    DIR *d = opendir(path);
    if (!d) return HR_OK;
    char *found = NULL;
    int n_gguf = 0;
    bool st_files = false;
    for (struct dirent *e; (e = readdir(d));) {
        if (ends_with(e->d_name, ".safetensors") || ends_with(e->d_name, ".safetensors.index.json")) st_files = true;
        if (!ends_with(e->d_name, ".gguf")) continue;
        if (n_gguf++ == 0) found = strdup(e->d_name);
    }
    closedir(d);
    hr_status s = HR_OK;
    if (n_gguf > 1 && !st_files)
        s = hr_error(HR_ERR_INVALID_ARG, "%s: %d .gguf files in this folder; name the one to load", path, n_gguf);
    else if (n_gguf == 1 && !st_files) {
        size_t len = strlen(path) + strlen(found) + 2;
        if (!found || !(*out = malloc(len))) s = hr_error(HR_ERR_OOM, "out of memory");
        else snprintf(*out, len, "%s/%s", path, found);
    }
    free(found);
    return s;
}

/* ---- tensor names ---------------------------------------------------------- */

static const char *const layer_map[][2] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

static int64_t meta_int(const hr_gguf *g, const char *key, int64_t def) {
    int64_t v;
    return hr_gguf_get_int(g, key, &v) == HR_OK ? v : def;
}

bool hr_gguf_hf_name(const hr_gguf *g, const char *name, char *buf, size_t cap, int64_t *perm_heads) {
    *perm_heads = 0;
    static const char *const top[][2] = {{"token_embd.weight", "model.embed_tokens.weight"},
                                         {"output_norm.weight", "model.norm.weight"},
                                         {"output.weight", "lm_head.weight"}};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(name, top[i][0])) return (size_t)snprintf(buf, cap, "%s", top[i][1]) < cap;
    unsigned layer;
    int used = 0;
    if (sscanf(name, "blk.%u.%n", &layer, &used) != 1 || !used) return false;
    const char *rest = name + used;
    for (size_t i = 0; i < sizeof layer_map / sizeof layer_map[0]; i++) {
        if (strcmp(rest, layer_map[i][0])) continue;
        /* the converter permutes q with the head count, k with the kv head count */
        int64_t heads = meta_int(g, "llama.attention.head_count", 0);
        if (!strncmp(rest, "attn_q.", 7)) *perm_heads = heads;
        if (!strncmp(rest, "attn_k.", 7)) *perm_heads = meta_int(g, "llama.attention.head_count_kv", heads);
        return (size_t)snprintf(buf, cap, "model.layers.%u.%s", layer, layer_map[i][1]) < cap;
    }
    return false;
}

/* ---- config.json ------------------------------------------------------------- */

static hr_status check_llama(const hr_gguf *g) {
    gguf_str arch;
    HR_TRY(hr_gguf_get_str(g, "general.architecture", &arch));
    if (arch.len != 5 || memcmp(arch.p, "llama", 5))
        return hr_error(HR_ERR_UNSUPPORTED, "%s: GGUF architecture '%.*s' is not supported (llama)", g->label,
                        (int)(arch.len > 64 ? 64 : arch.len), arch.p);
    return HR_OK;
}

static hr_status print_json(const hr_gguf *g, cJSON *root, char **json, size_t *len) {
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return hr_error(HR_ERR_OOM, "%s: out of memory", g->label);
    *json = text;
    *len = strlen(text);
    return HR_OK;
}

static hr_status add_num(cJSON *o, const char *name, double v) {
    return cJSON_AddNumberToObject(o, name, v) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
}

static hr_status build_config(const hr_gguf *g, cJSON *c) {
    HR_TRY(check_llama(g));
    static const char *const req[][2] = {
        {"llama.embedding_length", "hidden_size"}, {"llama.feed_forward_length", "intermediate_size"},
        {"llama.block_count", "num_hidden_layers"}, {"llama.attention.head_count", "num_attention_heads"}};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        int64_t v;
        HR_TRY(hr_gguf_get_int(g, req[i][0], &v));
        HR_TRY(add_num(c, req[i][1], (double)v));
    }
    int64_t heads = meta_int(g, "llama.attention.head_count", 1);
    HR_TRY(add_num(c, "num_key_value_heads", (double)meta_int(g, "llama.attention.head_count_kv", heads)));
    const gguf_kv *tokens = hr_gguf_find(g, "tokenizer.ggml.tokens");
    int64_t vocab = meta_int(g, "llama.vocab_size", tokens ? (int64_t)tokens->n : -1);
    if (vocab < 0) return hr_error(HR_ERR_NOT_FOUND, "%s: missing metadata key 'llama.vocab_size'", g->label);
    HR_TRY(add_num(c, "vocab_size", (double)vocab));
    int64_t hidden = meta_int(g, "llama.embedding_length", 0);
    HR_TRY(add_num(c, "head_dim", (double)meta_int(g, "llama.attention.key_length", hidden / (heads ? heads : 1))));
    HR_TRY(add_num(c, "max_position_embeddings", (double)meta_int(g, "llama.context_length", 2048)));
    double eps = 1e-5, theta = 10000.0;
    if (hr_gguf_find(g, "llama.attention.layer_norm_rms_epsilon"))
        HR_TRY(hr_gguf_get_num(g, "llama.attention.layer_norm_rms_epsilon", &eps));
    if (hr_gguf_find(g, "llama.rope.freq_base")) HR_TRY(hr_gguf_get_num(g, "llama.rope.freq_base", &theta));
    HR_TRY(add_num(c, "rms_norm_eps", eps));
    HR_TRY(add_num(c, "rope_theta", theta));
    if (hr_gguf_find(g, "llama.rope.scaling.type") || hr_gguf_tensor_index(g, "rope_freqs.weight") >= 0)
        return hr_error(HR_ERR_UNSUPPORTED, "%s: rope scaling in GGUF files is not supported yet", g->label);
    static const char *const ids[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                         {"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                         {"tokenizer.ggml.padding_token_id", "pad_token_id"}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (hr_gguf_find(g, ids[i][0])) HR_TRY(add_num(c, ids[i][1], (double)meta_int(g, ids[i][0], -1)));
    /* llama.cpp writes no output.weight when the head is the embedding */
    bool tied = hr_gguf_tensor_index(g, "output.weight") < 0;
    cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
    if (!arch || !cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM")) ||
        !cJSON_AddBoolToObject(c, "tie_word_embeddings", tied) || !cJSON_AddStringToObject(c, "hidden_act", "silu") ||
        !cJSON_AddStringToObject(c, "torch_dtype", "float32"))
        return hr_error(HR_ERR_OOM, "out of memory");
    return HR_OK;
}

static hr_status with_file(const char *path, hr_status (*build)(const hr_gguf *, cJSON *), char **json, size_t *len) {
    *json = NULL;
    *len = 0;
    hr_gguf *g = NULL;
    HR_TRY(hr_gguf_open(path, &g));
    cJSON *root = cJSON_CreateObject();
    hr_status s = root ? build(g, root) : hr_error(HR_ERR_OOM, "out of memory");
    if (s == HR_OK) s = print_json(g, root, json, len);
    else cJSON_Delete(root);
    hr_gguf_close(g);
    return s;
}

hr_status hr_gguf_config_json(const char *path, char **json, size_t *len) {
    return with_file(path, build_config, json, len);
}

/* ---- tokenizer.json ---------------------------------------------------------- */

/* llama.cpp's pre-tokenizer names -> the split regex of their HF tokenizer;
 * "smollm" (and gpt2 and unnamed ones) use the GPT-2 regex of ByteLevel. */
static const char *const llama3_split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static cJSON *byte_level(bool use_regex) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", false);
    cJSON_AddBoolToObject(b, "trim_offsets", true);
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

static cJSON *pre_tokenizer(const hr_gguf *g) {
    gguf_str pre = {"", 0};
    (void)hr_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    bool smollm = pre.len == 6 && !memcmp(pre.p, "smollm", 6);
    bool llama3 = (pre.len == 9 && !memcmp(pre.p, "llama-bpe", 9)) || (pre.len == 6 && !memcmp(pre.p, "llama3", 6));
    if (!smollm && !llama3) return byte_level(true);
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *first = cJSON_CreateObject();
    if (smollm) {
        /* SmolLM2's own tokenizer.json: digits one by one, then GPT-2's regex */
        cJSON_AddStringToObject(first, "type", "Digits");
        cJSON_AddBoolToObject(first, "individual_digits", true);
    } else {
        cJSON_AddStringToObject(first, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(first, "pattern"), "Regex", llama3_split);
        cJSON_AddStringToObject(first, "behavior", "Isolated");
        cJSON_AddBoolToObject(first, "invert", false);
    }
    cJSON_AddItemToArray(list, first);
    cJSON_AddItemToArray(list, byte_level(smollm));
    return seq;
}

/* tokenizer.ggml.add_bos_token: a template putting BOS before each sequence
 * (as llama.cpp does); JSON null otherwise. */
static cJSON *post_processor(const hr_gguf *g, const gguf_kv *toks) {
    const gguf_kv *add = hr_gguf_find(g, "tokenizer.ggml.add_bos_token");
    int64_t bos = -1;
    if (!add || add->type != GGUF_BOOL || !add->data[0] || hr_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &bos) != HR_OK ||
        bos < 0 || (uint64_t)bos >= toks->n)
        return cJSON_CreateNull();
    cJSON *p = cJSON_CreateObject(), *single = cJSON_AddArrayToObject(p, "single");
    cJSON_AddStringToObject(p, "type", "TemplateProcessing");
    cJSON *pair = cJSON_AddArrayToObject(p, "pair");
    const char *seqs[2] = {"A", "B"};
    for (int k = 0; k < 2; k++) {
        cJSON *sp = cJSON_CreateObject(), *sq = cJSON_CreateObject();
        cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "SpecialToken"), "id", "bos");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(sq, "Sequence"), "id", seqs[k]);
        cJSON_AddItemToArray(pair, sp);
        cJSON_AddItemToArray(pair, sq);
        if (k == 0) {
            cJSON_AddItemToArray(single, cJSON_Duplicate(sp, true));
            cJSON_AddItemToArray(single, cJSON_Duplicate(sq, true));
        }
    }
    cJSON *def = cJSON_AddObjectToObject(cJSON_AddObjectToObject(p, "special_tokens"), "bos");
    cJSON_AddStringToObject(def, "id", "bos");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(def, "ids"), cJSON_CreateNumber((double)bos));
    return p;
}

static cJSON *str_item(const gguf_str *s) {
    char *z = strndup(s->p, s->len);
    cJSON *v = z ? cJSON_CreateString(z) : NULL;
    free(z);
    return v;
}

static hr_status build_tokenizer(const hr_gguf *g, cJSON *root) {
    gguf_str model;
    HR_TRY(hr_gguf_get_str(g, "tokenizer.ggml.model", &model));
    if (model.len != 4 || memcmp(model.p, "gpt2", 4))
        return hr_error(HR_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' is not supported (gpt2)", g->label,
                        (int)(model.len > 64 ? 64 : model.len), model.p);
    const gguf_kv *toks = hr_gguf_find(g, "tokenizer.ggml.tokens"), *merges = hr_gguf_find(g, "tokenizer.ggml.merges");
    const gguf_kv *types = hr_gguf_find(g, "tokenizer.ggml.token_type");
    if (!toks || toks->type != GGUF_ARRAY || toks->arr_type != GGUF_STRING || !merges || merges->type != GGUF_ARRAY ||
        merges->arr_type != GGUF_STRING)
        return hr_error(HR_ERR_FORMAT, "%s: tokenizer.ggml.tokens and tokenizer.ggml.merges must be string arrays",
                        g->label);
    if (types && (types->type != GGUF_ARRAY || types->n != toks->n || types->arr_type == GGUF_STRING ||
                  types->arr_type == GGUF_F32 || types->arr_type == GGUF_F64))
        return hr_error(HR_ERR_FORMAT, "%s: tokenizer.ggml.token_type must be an integer array as long as the tokens",
                        g->label);
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", pre_tokenizer(g));
    cJSON_AddItemToObject(root, "post_processor", post_processor(g, toks));
    cJSON_AddItemToObject(root, "decoder", byte_level(true));
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddBoolToObject(m, "byte_fallback", false);
    cJSON_AddBoolToObject(m, "ignore_merges", false);
    cJSON *vocab = cJSON_AddObjectToObject(m, "vocab"), *ml = cJSON_AddArrayToObject(m, "merges");
    if (!added || !vocab || !ml) return hr_error(HR_ERR_OOM, "out of memory");
    for (uint64_t i = 0; i < toks->n; i++) {
        char *z = strndup(toks->strs[i].p, toks->strs[i].len);
        if (!z) return hr_error(HR_ERR_OOM, "out of memory");
        cJSON_AddItemToObject(vocab, z, cJSON_CreateNumber((double)i));
        /* 3 is CONTROL (special, matched whole), 4 USER_DEFINED (matched whole) */
        int64_t ty = types ? hr_gguf_arr_int(types, i) : 1;
        if (ty == 3 || ty == 4) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", z);
            cJSON_AddBoolToObject(a, "single_word", false);
            cJSON_AddBoolToObject(a, "lstrip", false);
            cJSON_AddBoolToObject(a, "rstrip", false);
            cJSON_AddBoolToObject(a, "normalized", false);
            cJSON_AddBoolToObject(a, "special", ty == 3);
            cJSON_AddItemToArray(added, a);
        }
        free(z);
    }
    for (uint64_t i = 0; i < merges->n; i++) cJSON_AddItemToArray(ml, str_item(&merges->strs[i]));
    return HR_OK;
}

hr_status hr_gguf_tokenizer_json(const char *path, char **json, size_t *len) {
    return with_file(path, build_tokenizer, json, len);
}
