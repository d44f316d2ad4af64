/* GGUF files seen as Hub checkpoints: tensor names mapped to HF's, and
 * config.json / tokenizer.json equivalents built from the metadata, so that
 * the model and tokenizer loaders read them as they read a model folder.
 * What differs by llama.cpp architecture (its HF class, tensor names, its
 * own config fields) comes from the adapter the model layer registers for
 * it (hr_gguf_arch_register; models/gguf_archs.c): this file knows the
 * format's common keys only. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/path.h"
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
        if (s == HR_OK && (s = hr_path_check_inside(path, *out)) != HR_OK) {
            free(*out);
            *out = NULL;
        }
    }
    free(found);
    return s;
}

/* ---- architectures ----------------------------------------------------------- */

#define MAX_GGUF_ARCHS 16

static const hr_gguf_arch *g_archs[MAX_GGUF_ARCHS];
static int g_n_archs;

hr_status hr_gguf_arch_register(const hr_gguf_arch *a) {
    if (g_n_archs == MAX_GGUF_ARCHS) return hr_error(HR_ERR_UNSUPPORTED, "too many GGUF architectures");
    g_archs[g_n_archs++] = a;
    return HR_OK;
}

const hr_gguf_arch *hr_gguf_arch_of(const hr_gguf *g) {
    gguf_str a;
    if (hr_gguf_get_str(g, "general.architecture", &a) != HR_OK) return NULL;
    for (int i = 0; i < g_n_archs; i++)
        if (a.len == strlen(g_archs[i]->name) && !memcmp(a.p, g_archs[i]->name, a.len)) return g_archs[i];
    return NULL;
}

/* Metadata keys are the architecture's name then a dot: "qwen3.block_count". */
const char *hr_gguf_arch_key(const hr_gguf_arch *a, const char *suffix, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", a->name, suffix);
    return buf;
}

static int64_t meta_int(const hr_gguf *g, const char *key, int64_t def) {
    int64_t v;
    return hr_gguf_get_int(g, key, &v) == HR_OK ? v : def;
}

int64_t hr_gguf_arch_int(const hr_gguf *g, const hr_gguf_arch *a, const char *suffix, int64_t def) {
    char key[96];
    return meta_int(g, hr_gguf_arch_key(a, suffix, key, sizeof key), def);
}

bool hr_gguf_hf_name(const hr_gguf *g, const char *name, char *buf, size_t cap, int64_t *perm_heads) {
    *perm_heads = 0;
    const hr_gguf_arch *a = hr_gguf_arch_of(g);
    return a && a->hf_name(a, g, name, buf, cap, perm_heads);
}

/* ---- config.json ------------------------------------------------------------- */

static hr_status check_arch(const hr_gguf *g, const hr_gguf_arch **out) {
    gguf_str arch;
    HR_TRY(hr_gguf_get_str(g, "general.architecture", &arch));
    if ((*out = hr_gguf_arch_of(g))) return HR_OK;
    char known[256] = "";
    for (int i = 0; i < g_n_archs; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, g_archs[i]->name, sizeof known - strlen(known) - 1);
    }
    return hr_error(HR_ERR_UNSUPPORTED, "%s: GGUF architecture '%.*s' is not supported (%s)", g->label,
                    (int)(arch.len > 64 ? 64 : arch.len), arch.p, known);
}

static hr_status print_json(const hr_gguf *g, cJSON *root, char **json, size_t *len) {
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return hr_error(HR_ERR_OOM, "%s: out of memory", g->label);
    *json = text;
    *len = strlen(text);
    return HR_OK;
}

hr_status hr_gguf_json_num(cJSON *o, const char *name, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, name);
    return cJSON_AddNumberToObject(o, name, v) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
}

/* llama.cpp's rope_freqs tensor: one divisor per rotary pair, which the
 * converter computes from a llama3 rope_scaling (and writes instead of
 * it). llama.cpp takes each pair's frequency as base^(-2i/d) / f[i]:
 * transformers' longrope with those factors for short and long contexts
 * alike and no attention scaling, so the config says that. */
static hr_status rope_freqs(const hr_gguf *g, cJSON *c, int64_t rot, int64_t ctx) {
    long ti = hr_gguf_tensor_index(g, "rope_freqs.weight");
    if (ti < 0) return HR_OK;
    if (cJSON_GetObjectItemCaseSensitive(c, "rope_parameters"))
        return hr_error(HR_ERR_FORMAT, "%s: a rope_freqs tensor and a rope.scaling.type; llama.cpp writes one or the other",
                        g->label);
    const gguf_tensor *t = &g->tensors[ti];
    if (t->type != GGML_F32 || t->ndim != 1 || t->ne[0] != rot / 2)
        return hr_error(HR_ERR_FORMAT, "%s: tensor 'rope_freqs.weight' must be F32 [%lld] (rotary dim / 2)", g->label,
                        (long long)(rot / 2));
    const uint8_t *src = g->buf + g->data_start + t->offset;
    cJSON *rp = cJSON_AddObjectToObject(c, "rope_parameters");
    cJSON *sf = rp ? cJSON_AddArrayToObject(rp, "short_factor") : NULL;
    cJSON *lf = rp ? cJSON_AddArrayToObject(rp, "long_factor") : NULL;
    if (!sf || !lf || !cJSON_AddStringToObject(rp, "rope_type", "longrope")) return hr_error(HR_ERR_OOM, "out of memory");
    for (int64_t i = 0; i < rot / 2; i++) {
        float f;
        memcpy(&f, src + 4 * i, 4);
        if (!(f > 0))
            return hr_error(HR_ERR_FORMAT, "%s: rope_freqs.weight[%lld] is %g; the factors must be positive", g->label,
                            (long long)i, (double)f);
        if (!cJSON_AddItemToArray(sf, cJSON_CreateNumber(f)) || !cJSON_AddItemToArray(lf, cJSON_CreateNumber(f)))
            return hr_error(HR_ERR_OOM, "out of memory");
    }
    HR_TRY(hr_gguf_json_num(rp, "attention_factor", 1.0));
    return hr_gguf_json_num(rp, "original_max_position_embeddings", (double)ctx);
}

/* The architecture's metadata number `suffix` into rp as `name`, when the
 * file has it. */
static hr_status copy_num(const hr_gguf *g, const hr_gguf_arch *a, const char *suffix, cJSON *rp, const char *name) {
    char key[96];
    double v;
    if (!hr_gguf_find(g, hr_gguf_arch_key(a, suffix, key, sizeof key))) return HR_OK;
    HR_TRY(hr_gguf_get_num(g, key, &v));
    return hr_gguf_json_num(rp, name, v);
}

/* llama.cpp's rope.scaling.* keys, which its converter writes from a
 * linear or yarn rope_parameters (type, factor, and for yarn the original
 * context length, attention factor and betas), back into that config.
 * Longrope keeps its factors in tensors of arches hubrt does not read. */
static hr_status rope_scaling(const hr_gguf *g, const hr_gguf_arch *a, cJSON *c) {
    char key[96];
    gguf_str type;
    if (!hr_gguf_find(g, hr_gguf_arch_key(a, "rope.scaling.type", key, sizeof key))) return HR_OK;
    HR_TRY(hr_gguf_get_str(g, key, &type));
    bool linear = type.len == 6 && !memcmp(type.p, "linear", 6), yarn = type.len == 4 && !memcmp(type.p, "yarn", 4);
    if (type.len == 4 && !memcmp(type.p, "none", 4)) return HR_OK;
    if (!linear && !yarn)
        return hr_error(HR_ERR_UNSUPPORTED, "%s: '%s' is '%.*s'; hubrt reads none, linear and yarn", g->label, key,
                        (int)(type.len > 32 ? 32 : type.len), type.p);
    double factor, ext = 1.0;
    HR_TRY(hr_gguf_get_num(g, hr_gguf_arch_key(a, "rope.scaling.factor", key, sizeof key), &factor));
    if (!(factor >= 1.0))
        return hr_error(HR_ERR_FORMAT, "%s: '%s' is %g; a rope scaling factor is at least 1", g->label, key, factor);
    if (hr_gguf_find(g, hr_gguf_arch_key(a, "rope.scaling.yarn_ext_factor", key, sizeof key)))
        HR_TRY(hr_gguf_get_num(g, key, &ext));
    if (ext != 1.0) /* transformers' yarn has no extrapolation mix */
        return hr_error(HR_ERR_UNSUPPORTED, "%s: '%s' is %g; hubrt's yarn takes 1", g->label, key, ext);
    cJSON *rp = cJSON_AddObjectToObject(c, "rope_parameters");
    if (!rp || !cJSON_AddStringToObject(rp, "rope_type", linear ? "linear" : "yarn"))
        return hr_error(HR_ERR_OOM, "out of memory");
    HR_TRY(hr_gguf_json_num(rp, "factor", factor));
    if (linear) return HR_OK;
    int64_t orig;
    HR_TRY(hr_gguf_get_int(g, hr_gguf_arch_key(a, "rope.scaling.original_context_length", key, sizeof key), &orig));
    HR_TRY(hr_gguf_json_num(rp, "original_max_position_embeddings", (double)orig));
    HR_TRY(copy_num(g, a, "rope.scaling.yarn_attn_factor", rp, "attention_factor"));
    HR_TRY(copy_num(g, a, "rope.scaling.yarn_beta_fast", rp, "beta_fast"));
    return copy_num(g, a, "rope.scaling.yarn_beta_slow", rp, "beta_slow");
}

/* The dtype a model loads in by default: the one the matrices are stored
 * in when they all share BF16 or F16 (as config.json names a safetensors
 * checkpoint's), else float32, into which transformers dequantizes GGUF
 * blocks too. */
static const char *stored_dtype(const hr_gguf *g) {
    int bf16 = 0, f16 = 0, other = 0;
    for (size_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (t->ndim != 2) continue;
        if (t->type == GGML_BF16) bf16++;
        else if (t->type == GGML_F16) f16++;
        else other++;
    }
    return other || (bf16 && f16) ? "float32" : bf16 ? "bfloat16" : f16 ? "float16" : "float32";
}

static hr_status build_config(const hr_gguf *g, cJSON *c) {
    const hr_gguf_arch *a;
    HR_TRY(check_arch(g, &a));
    static const char *const req[][2] = {
        {"embedding_length", "hidden_size"}, {"feed_forward_length", "intermediate_size"},
        {"block_count", "num_hidden_layers"}, {"attention.head_count", "num_attention_heads"}};
    char key[96];
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        int64_t v;
        HR_TRY(hr_gguf_get_int(g, hr_gguf_arch_key(a, req[i][0], key, sizeof key), &v));
        HR_TRY(hr_gguf_json_num(c, req[i][1], (double)v));
    }
    int64_t heads = hr_gguf_arch_int(g, a, "attention.head_count", 1);
    HR_TRY(hr_gguf_json_num(c, "num_key_value_heads", (double)hr_gguf_arch_int(g, a, "attention.head_count_kv", heads)));
    const gguf_kv *tokens = hr_gguf_find(g, "tokenizer.ggml.tokens");
    int64_t vocab = hr_gguf_arch_int(g, a, "vocab_size", tokens ? (int64_t)tokens->n : -1);
    if (vocab < 0)
        return hr_error(HR_ERR_NOT_FOUND, "%s: missing metadata key '%s'", g->label,
                        hr_gguf_arch_key(a, "vocab_size", key, sizeof key));
    HR_TRY(hr_gguf_json_num(c, "vocab_size", (double)vocab));
    int64_t hidden = hr_gguf_arch_int(g, a, "embedding_length", 0);
    int64_t head_dim = hr_gguf_arch_int(g, a, "attention.key_length", hidden / (heads > 0 ? heads : 1));
    int64_t rot = hr_gguf_arch_int(g, a, "rope.dimension_count", head_dim);
    int64_t ctx = hr_gguf_arch_int(g, a, "context_length", 2048);
    HR_TRY(hr_gguf_json_num(c, "head_dim", (double)head_dim));
    HR_TRY(hr_gguf_json_num(c, "max_position_embeddings", (double)ctx));
    if (rot != head_dim && head_dim > 0) HR_TRY(hr_gguf_json_num(c, "partial_rotary_factor", (double)rot / (double)head_dim));
    double eps = 1e-5, theta = 10000.0;
    if (hr_gguf_find(g, hr_gguf_arch_key(a, "attention.layer_norm_rms_epsilon", key, sizeof key)))
        HR_TRY(hr_gguf_get_num(g, key, &eps));
    if (hr_gguf_find(g, hr_gguf_arch_key(a, "rope.freq_base", key, sizeof key))) HR_TRY(hr_gguf_get_num(g, key, &theta));
    HR_TRY(hr_gguf_json_num(c, "rms_norm_eps", eps));
    HR_TRY(hr_gguf_json_num(c, "rope_theta", theta));
    HR_TRY(rope_scaling(g, a, c));
    HR_TRY(rope_freqs(g, c, rot, ctx));
    static const char *const ids[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                         {"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                         {"tokenizer.ggml.padding_token_id", "pad_token_id"}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (hr_gguf_find(g, ids[i][0])) HR_TRY(hr_gguf_json_num(c, ids[i][1], (double)meta_int(g, ids[i][0], -1)));
    /* llama.cpp writes no output.weight when the head is the embedding */
    bool tied = hr_gguf_tensor_index(g, "output.weight") < 0;
    cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
    if (!arch || !cJSON_AddItemToArray(arch, cJSON_CreateString(a->hf_class)) ||
        !cJSON_AddBoolToObject(c, "tie_word_embeddings", tied) || !cJSON_AddStringToObject(c, "hidden_act", "silu") ||
        !cJSON_AddStringToObject(c, "torch_dtype", stored_dtype(g)))
        return hr_error(HR_ERR_OOM, "out of memory");
    return a->config ? a->config(a, g, c) : HR_OK;
}

static hr_status build_json(const hr_gguf *g, hr_status (*build)(const hr_gguf *, cJSON *), char **json,
                            size_t *len) {
    *json = NULL;
    *len = 0;
    cJSON *root = cJSON_CreateObject();
    hr_status s = root ? build(g, root) : hr_error(HR_ERR_OOM, "out of memory");
    if (s == HR_OK) return print_json(g, root, json, len);
    cJSON_Delete(root);
    return s;
}

static hr_status with_file(const char *path, hr_status (*build)(const hr_gguf *, cJSON *), char **json, size_t *len) {
    *json = NULL;
    *len = 0;
    hr_gguf *g = NULL;
    HR_TRY(hr_gguf_open(path, &g));
    hr_status s = build_json(g, build, json, len);
    hr_gguf_close(g);
    return s;
}

hr_status hr_gguf_config_json(const char *path, char **json, size_t *len) {
    return with_file(path, build_config, json, len);
}

hr_status hr_gguf_config_json_of(const hr_gguf *g, char **json, size_t *len) {
    return build_json(g, build_config, json, len);
}

/* ---- tokenizer.json ---------------------------------------------------------- */

/* llama.cpp's pre-tokenizer names -> the split regex of their HF tokenizer
 * (llama-vocab.cpp); "smollm" (and gpt2 and unnamed ones) use the GPT-2
 * regex of ByteLevel. */
const char *const hr_gguf_llama3_split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen2's (and Qwen3's): digits one at a time */
const char *const hr_gguf_qwen2_split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static cJSON *byte_level(bool use_regex) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", false);
    cJSON_AddBoolToObject(b, "trim_offsets", true);
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

static bool str_is(gguf_str s, const char *z) { return s.len == strlen(z) && !memcmp(s.p, z, s.len); }

static gguf_str pre_name(const hr_gguf *g) {
    gguf_str pre = {"", 0};
    (void)hr_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    return pre;
}

static bool llama3_pre(gguf_str pre) {
    return str_is(pre, "llama-bpe") || str_is(pre, "llama3") || str_is(pre, "smaug-bpe");
}

static cJSON *pre_tokenizer(const hr_gguf *g) {
    gguf_str pre = pre_name(g);
    bool smollm = str_is(pre, "smollm");
    const char *split = llama3_pre(pre) ? hr_gguf_llama3_split : str_is(pre, "qwen2") ? hr_gguf_qwen2_split : NULL;
    if (!smollm && !split) return byte_level(true);
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *first = cJSON_CreateObject();
    if (smollm) {
        /* SmolLM2's own tokenizer.json: digits one by one, then GPT-2's regex */
        cJSON_AddStringToObject(first, "type", "Digits");
        cJSON_AddBoolToObject(first, "individual_digits", true);
    } else {
        cJSON_AddStringToObject(first, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(first, "pattern"), "Regex", split);
        cJSON_AddStringToObject(first, "behavior", "Isolated");
        cJSON_AddBoolToObject(first, "invert", false);
    }
    cJSON_AddItemToArray(list, first);
    cJSON_AddItemToArray(list, byte_level(smollm));
    return seq;
}

/* A GGUF's pre-tokenizer name stands for the HF tokenizer it was made
 * from, and hubrt tokenizes as that tokenizer.json does, where llama.cpp
 * differs in two places: Qwen2's composes text to NFC first (llama.cpp
 * does not), and Llama 3's emits a word found whole in the vocabulary
 * without merging (ignore_merges), which llama.cpp does for "llama-bpe"
 * but not "smaug-bpe", the name its converter gives some Llama 3
 * tokenizers. */
static cJSON *normalizer(const hr_gguf *g) {
    if (!str_is(pre_name(g), "qwen2")) return cJSON_CreateNull();
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "NFC");
    return n;
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
    cJSON_AddItemToObject(root, "normalizer", normalizer(g));
    cJSON_AddItemToObject(root, "pre_tokenizer", pre_tokenizer(g));
    cJSON_AddItemToObject(root, "post_processor", post_processor(g, toks));
    cJSON_AddItemToObject(root, "decoder", byte_level(true));
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddBoolToObject(m, "byte_fallback", false);
    cJSON_AddBoolToObject(m, "ignore_merges", llama3_pre(pre_name(g)));
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

hr_status hr_gguf_tokenizer_json_of(const hr_gguf *g, char **json, size_t *len) {
    return build_json(g, build_tokenizer, json, len);
}

/* ---- tokenizer_config.json --------------------------------------------------- */

/* The special tokens llama.cpp names by id (as their strings, which is how
 * tokenizer_config.json names them; an id outside the vocabulary is left
 * out) and tokenizer.chat_template, as transformers' GGUF loading takes
 * them. add_bos_token is the tokenizer.json's post-processor already. */
static hr_status build_tokenizer_config(const hr_gguf *g, cJSON *root) {
    const gguf_kv *toks = hr_gguf_find(g, "tokenizer.ggml.tokens");
    static const char *const ids[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token"},
                                         {"tokenizer.ggml.eos_token_id", "eos_token"},
                                         {"tokenizer.ggml.padding_token_id", "pad_token"},
                                         {"tokenizer.ggml.unknown_token_id", "unk_token"}};
    for (size_t i = 0; toks && toks->strs && i < sizeof ids / sizeof ids[0]; i++) {
        int64_t id = meta_int(g, ids[i][0], -1);
        if (id < 0 || (uint64_t)id >= toks->n) continue;
        cJSON *v = str_item(&toks->strs[id]);
        if (!v || !cJSON_AddItemToObject(root, ids[i][1], v)) return hr_error(HR_ERR_OOM, "out of memory");
    }
    gguf_str tmpl;
    if (hr_gguf_find(g, "tokenizer.chat_template")) {
        HR_TRY(hr_gguf_get_str(g, "tokenizer.chat_template", &tmpl));
        cJSON *v = str_item(&tmpl);
        if (!v || !cJSON_AddItemToObject(root, "chat_template", v)) return hr_error(HR_ERR_OOM, "out of memory");
    }
    return HR_OK;
}

hr_status hr_gguf_tokenizer_config_json(const char *path, char **json, size_t *len) {
    return with_file(path, build_tokenizer_config, json, len);
}

hr_status hr_gguf_tokenizer_config_json_of(const hr_gguf *g, char **json, size_t *len) {
    return build_json(g, build_tokenizer_config, json, len);
}
