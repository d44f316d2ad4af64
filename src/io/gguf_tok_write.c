/* A model folder's tokenizer (tokenizer.json, tokenizer_config.json,
 * config.json, chat_template.jinja) as GGUF tokenizer metadata, the keys
 * llama.cpp's converter writes for a byte-level BPE tokenizer:
 *
 * - tokenizer.ggml.tokens: the vocabulary in id order, padded to the
 *   model's vocab_size with "[PAD<id>]" tokens of type UNUSED (5), as the
 *   converter pads it; token_type: 1 normal, 3 control (added tokens that
 *   are special, or look it: "<|...|>" and the like, as the converter
 *   judges them), 4 user-defined (the other added tokens);
 * - merges as "left right" strings;
 * - tokenizer.ggml.pre: the llama.cpp name of the pre-tokenizer, from its
 *   split regex (io/gguf_hub.c reads these names back). A Llama 3
 *   tokenizer that ignores merges is "llama-bpe", one that does not
 *   "smaug-bpe": llama.cpp tokenizes each as its tokenizer.json does
 *   (its converter names by a hash of sample ids, which gives "smaug-bpe"
 *   to some tokenizers that ignore merges);
 * - bos/eos/unk/pad ids from tokenizer_config.json's tokens, else from
 *   config.json's ids; add_bos_token from tokenizer_config.json, else from
 *   a post-processor that puts BOS first; the chat template.
 *
 * Other tokenizer models (SentencePiece Unigram, WordPiece) are refused by
 * name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "io/gguf_write.h"
#include "io/st_internal.h"

#define TOK_FILE_MAX ((size_t)256 << 20)
#define MAX_VOCAB ((int64_t)1 << 24)

enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5 };

static hr_status load_json(const char *dir, const char *name, bool required, cJSON **out) {
    *out = NULL;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return hr_error(HR_ERR_INVALID_ARG, "%s: path too long", dir);
    char *text = NULL;
    size_t len = 0;
    hr_status s = hr_io_read_file(path, TOK_FILE_MAX, &text, &len);
    if (s != HR_OK) {
        if (!required && s == HR_ERR_NOT_FOUND) {
            hr_clear_error();
            return HR_OK;
        }
        return s;
    }
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return hr_error(HR_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return HR_OK;
}

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A special token as tokenizer_config.json names it: a string, or an
 * AddedToken object's content. */
static const char *token_text(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    return cJSON_IsObject(v) ? str_of(v, "content") : NULL;
}

static bool starts_ends(const char *s, const char *a, const char *b) {
    size_t n = strlen(s), na = strlen(a), nb = strlen(b);
    return n >= na + nb && !strncmp(s, a, na) && !strcmp(s + n - nb, b);
}

/* Added tokens that the converter makes CONTROL although not special. */
static bool looks_special(const char *t) {
    return !strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") || !strcmp(t, "[@BOS@]") ||
           starts_ends(t, "<|", "|>") || starts_ends(t, "<\xef\xbd\x9c", "\xef\xbd\x9c>") ||
           starts_ends(t, "<unused", ">");
}

/* The llama.cpp pre-tokenizer name for tokenizer.json's pre_tokenizer, or
 * NULL with *why set. */
static const char *pre_name(const cJSON *tj, const char **why) {
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const char *type = str_of(pt, "type");
    *why = "its pre_tokenizer is none of GPT-2's ByteLevel, Llama 3's, Qwen2's or SmolLM's";
    if (type && !strcmp(type, "ByteLevel"))
        return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "use_regex")) ? "gpt-2" : NULL;
    if (!type || strcmp(type, "Sequence")) return NULL;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
    if (cJSON_GetArraySize(list) != 2) return NULL;
    const cJSON *first = cJSON_GetArrayItem(list, 0), *second = cJSON_GetArrayItem(list, 1);
    const char *t0 = str_of(first, "type"), *t1 = str_of(second, "type");
    if (!t0 || !t1 || strcmp(t1, "ByteLevel")) return NULL;
    if (!strcmp(t0, "Digits") && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(first, "individual_digits")))
        return "smollm";
    const char *re = str_of(cJSON_GetObjectItemCaseSensitive(first, "pattern"), "Regex");
    if (strcmp(t0, "Split") || !re) return NULL;
    if (!strcmp(re, hr_gguf_qwen2_split)) return "qwen2";
    if (!strcmp(re, hr_gguf_llama3_split))
        return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges")) ? "llama-bpe" : "smaug-bpe";
    return NULL;
}

typedef struct vocab {
    char **tok; /* [n]; NULL: a hole */
    int32_t *type;
    int64_t n;
} vocab;

static void vocab_free(vocab *v) {
    for (int64_t i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->type);
}

/* Token `text` at id `idv` (a JSON number: checked to be a whole number
 * inside the table before any conversion). */
static hr_status vocab_put(vocab *v, const char *label, const cJSON *idv, const char *text, int32_t type) {
    double d = cJSON_IsNumber(idv) ? idv->valuedouble : -1.0;
    if (!(d >= 0 && d < (double)v->n) || d != (double)(int64_t)d)
        return hr_error(HR_ERR_FORMAT, "%s: token '%.40s' has id %.17g, not a whole number below the model's %lld rows",
                        label, text, d, (long long)v->n);
    int64_t id = (int64_t)d;
    free(v->tok[id]);
    if (!(v->tok[id] = strdup(text))) return hr_error(HR_ERR_OOM, "out of memory");
    v->type[id] = type;
    return HR_OK;
}

static int64_t find_token(const vocab *v, const char *text) {
    for (int64_t i = v->n - 1; text && i >= 0; i--) /* added tokens sit last */
        if (v->tok[i] && !strcmp(v->tok[i], text)) return i;
    return -1;
}

static hr_status build_vocab(const cJSON *tj, const char *label, int64_t vocab_size, vocab *v) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(map)) return hr_error(HR_ERR_FORMAT, "%s: model.vocab must be an object", label);
    if (vocab_size <= 0 || vocab_size > MAX_VOCAB)
        return hr_error(HR_ERR_FORMAT, "%s: vocab_size %lld", label, (long long)vocab_size);
    v->n = vocab_size;
    v->tok = calloc((size_t)v->n, sizeof *v->tok);
    v->type = calloc((size_t)v->n, sizeof *v->type);
    if (!v->tok || !v->type) return hr_error(HR_ERR_OOM, "out of memory");
    for (const cJSON *e = map->child; e; e = e->next) HR_TRY(vocab_put(v, label, e, e->string, TOK_NORMAL));
    const cJSON *added;
    cJSON_ArrayForEach(added, cJSON_GetObjectItemCaseSensitive(tj, "added_tokens")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(added, "id");
        const char *content = str_of(added, "content");
        if (!content) return hr_error(HR_ERR_FORMAT, "%s: an added token without a content", label);
        bool special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(added, "special")) || looks_special(content);
        HR_TRY(vocab_put(v, label, id, content, special ? TOK_CONTROL : TOK_USER));
    }
    for (int64_t i = 0; i < v->n; i++) {
        if (v->tok[i]) continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
        if (!(v->tok[i] = strdup(pad))) return hr_error(HR_ERR_OOM, "out of memory");
        v->type[i] = TOK_UNUSED;
    }
    return HR_OK;
}

static hr_status write_merges(hr_gguf_writer *w, const cJSON *tj, const char *label) {
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "model"), "merges");
    int n = cJSON_GetArraySize(merges);
    char **m = calloc((size_t)(n ? n : 1), sizeof *m);
    hr_status s = m ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        if (s != HR_OK) break;
        const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
        if (cJSON_IsString(e)) m[i] = strdup(e->valuestring);
        else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(a) && cJSON_IsString(b)) {
            size_t len = strlen(a->valuestring) + strlen(b->valuestring) + 2;
            if ((m[i] = malloc(len))) snprintf(m[i], len, "%s %s", a->valuestring, b->valuestring);
        } else {
            s = hr_error(HR_ERR_FORMAT, "%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", label, i);
            break;
        }
        if (!m[i++]) s = hr_error(HR_ERR_OOM, "out of memory");
    }
    if (s == HR_OK) s = hr_gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)m, NULL, (uint64_t)n);
    for (int k = 0; m && k < n; k++) free(m[k]);
    free(m);
    return s;
}

/* add_bos_token: tokenizer_config.json's, else whether a TemplateProcessing
 * post-processor starts each sequence with the BOS token. */
static bool add_bos(const cJSON *tj, const cJSON *tc, const vocab *v, int64_t bos) {
    const cJSON *flag = cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token");
    if (cJSON_IsBool(flag)) return cJSON_IsTrue(flag);
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(tj, "post_processor");
    const char *type = str_of(pp, "type");
    if (!type || strcmp(type, "TemplateProcessing") || bos < 0) return false;
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "single"), 0);
    const char *id = str_of(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
    return id && find_token(v, id) == bos;
}

static hr_status chat_template(hr_gguf_writer *w, const char *dir, const cJSON *tc) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
    if (cJSON_IsString(t)) return hr_gguf_w_str(w, "tokenizer.chat_template", t->valuestring);
    const cJSON *e;
    cJSON_ArrayForEach(e, t) { /* [{"name": ..., "template": ...}]: the default one */
        const char *name = str_of(e, "name"), *text = str_of(e, "template");
        if (name && text && !strcmp(name, "default")) return hr_gguf_w_str(w, "tokenizer.chat_template", text);
    }
    char path[4096], *text = NULL;
    size_t len = 0;
    if ((size_t)snprintf(path, sizeof path, "%s/chat_template.jinja", dir) >= sizeof path) return HR_OK;
    hr_status s = hr_io_read_file(path, TOK_FILE_MAX, &text, &len);
    if (s == HR_ERR_NOT_FOUND) {
        hr_clear_error();
        return HR_OK;
    }
    if (s == HR_OK && strlen(text) != len) s = hr_error(HR_ERR_FORMAT, "%s: holds a NUL byte", path);
    if (s == HR_OK) s = hr_gguf_w_str(w, "tokenizer.chat_template", text);
    free(text);
    return s;
}

hr_status hr_gguf_w_tokenizer(hr_gguf_writer *w, const char *dir, int64_t vocab_size) {
    char label[4096];
    snprintf(label, sizeof label, "%s/tokenizer.json", dir);
    cJSON *tj = NULL, *tc = NULL, *cfg = NULL;
    vocab v = {0};
    hr_status s = load_json(dir, "tokenizer.json", true, &tj);
    if (s == HR_OK) s = load_json(dir, "tokenizer_config.json", false, &tc);
    if (s == HR_OK) s = load_json(dir, "config.json", false, &cfg);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const char *type = str_of(model, "type"), *why = NULL, *pre = NULL;
    if (s == HR_OK && (!type || strcmp(type, "BPE")))
        s = hr_error(HR_ERR_UNSUPPORTED, "%s: model.type is %s; hubrt writes byte-level BPE (gpt2) tokenizers into GGUF",
                     label, type ? type : "missing");
    if (s == HR_OK && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        s = hr_error(HR_ERR_UNSUPPORTED, "%s: a byte_fallback BPE (SentencePiece style) is not a gpt2 tokenizer", label);
    if (s == HR_OK && !(pre = pre_name(tj, &why)))
        s = hr_error(HR_ERR_UNSUPPORTED, "%s: no llama.cpp pre-tokenizer name for it: %s", label, why);
    if (s == HR_OK) s = build_vocab(tj, label, vocab_size, &v);
    if (s == HR_OK) s = hr_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    if (s == HR_OK) s = hr_gguf_w_str(w, "tokenizer.ggml.pre", pre);
    if (s == HR_OK) s = hr_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, NULL, (uint64_t)v.n);
    if (s == HR_OK) s = hr_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.type, (uint64_t)v.n);
    if (s == HR_OK) s = write_merges(w, tj, label);
    static const char *const ids[][3] = {{"bos_token", "bos_token_id", "tokenizer.ggml.bos_token_id"},
                                         {"eos_token", "eos_token_id", "tokenizer.ggml.eos_token_id"},
                                         {"unk_token", NULL, "tokenizer.ggml.unknown_token_id"},
                                         {"pad_token", "pad_token_id", "tokenizer.ggml.padding_token_id"}};
    int64_t bos = -1;
    for (size_t i = 0; s == HR_OK && i < sizeof ids / sizeof ids[0]; i++) {
        int64_t id = find_token(&v, token_text(tc, ids[i][0]));
        const cJSON *c = ids[i][1] ? cJSON_GetObjectItemCaseSensitive(cfg, ids[i][1]) : NULL;
        if (cJSON_IsArray(c)) c = cJSON_GetArrayItem(c, 0); /* several eos ids: the first */
        if (id < 0 && cJSON_IsNumber(c) && c->valuedouble >= 0 && c->valuedouble < (double)v.n) id = (int64_t)c->valuedouble;
        if (i == 0) bos = id;
        if (id >= 0) s = hr_gguf_w_u32(w, ids[i][2], (uint32_t)id);
    }
    if (s == HR_OK) s = hr_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", add_bos(tj, tc, &v, bos));
    if (s == HR_OK)
        s = hr_gguf_w_bool(w, "tokenizer.ggml.add_eos_token",
                           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tc, "add_eos_token")));
    if (s == HR_OK) s = chat_template(w, dir, tc);
    vocab_free(&v);
    cJSON_Delete(tj);
    cJSON_Delete(tc);
    cJSON_Delete(cfg);
    return s;
}
