/* CLIPTokenizer folders as the Hub stores SD3's and SD1's: vocab.json and
 * merges.txt, without a tokenizer.json. The tokenizer.json transformers
 * builds from them (CLIPTokenizer.__init__) is built here as a cJSON tree
 * for the ordinary loader: NFC, whitespace runs to one space, lowercase;
 * split on CLIP's pattern (the special tokens, English contractions,
 * letter runs, single digits, other symbol runs); byte-level; BPE with the
 * "</w>" end-of-word suffix; <|startoftext|> ... <|endoftext|> around
 * each text. Special tokens are tokenizer_config.json's added tokens and
 * its bos/eos/unk/pad tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tk_internal.h"

static const char clip_pattern[] =
    "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+";

static hr_status slurp(const char *dir, const char *name, bool optional, char **text, size_t *len) {
    char path[4200];
    HR_TRY(tk_read_optional(dir, name, path, sizeof path, text, len));
    if (!*text) return optional ? HR_OK : hr_error(HR_ERR_NOT_FOUND, "%s: missing", path);
    char *buf = *text;
    size_t n = *len;
    size_t bad = tk_utf8_valid_prefix(buf, n); /* JSON and merges are UTF-8 text, without NULs */
    const char *nul = memchr(buf, 0, bad);
    if (nul) bad = (size_t)(nul - buf);
    if (bad != n) {
        free(buf);
        *text = NULL;
        return hr_error(HR_ERR_FORMAT, "%s: not UTF-8 text (at byte %zu)", path, bad);
    }
    return HR_OK;
}

/* merges.txt: "a b" per line, a "#version" header line skipped (as
 * tokenizers' BPE.read_file). */
static hr_status read_merges(const char *dir, cJSON *out) {
    char *text;
    size_t len;
    HR_TRY(slurp(dir, "merges.txt", false, &text, &len));
    hr_status s = HR_OK;
    size_t line_no = 0;
    for (char *p = text, *end = text + len; s == HR_OK && p < end; line_no++) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl ? nl : end;
        if (stop > p && stop[-1] == '\r') stop[-1] = '\0';
        *stop = '\0';
        if (*p && !(line_no == 0 && !strncmp(p, "#version", 8))) {
            char *sp = strchr(p, ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == p || !sp[1]) {
                s = hr_error(HR_ERR_FORMAT, "%s/merges.txt: line %zu is not two tokens separated by one space", dir,
                             line_no + 1);
                break;
            }
            *sp = '\0';
            cJSON *pair = cJSON_CreateArray();
            if (!pair || !cJSON_AddItemToArray(out, pair) || !cJSON_AddItemToArray(pair, cJSON_CreateString(p)) ||
                !cJSON_AddItemToArray(pair, cJSON_CreateString(sp + 1)))
                s = hr_error(HR_ERR_OOM, "%s/merges.txt", dir);
        }
        p = stop + 1;
    }
    free(text);
    return s;
}

static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "content") : NULL;
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static cJSON *added_token(int64_t id, const char *content, bool normalized) {
    cJSON *t = cJSON_CreateObject();
    if (!t) return NULL;
    cJSON_AddNumberToObject(t, "id", (double)id);
    cJSON_AddStringToObject(t, "content", content);
    cJSON_AddBoolToObject(t, "single_word", false);
    cJSON_AddBoolToObject(t, "lstrip", false);
    cJSON_AddBoolToObject(t, "rstrip", false);
    cJSON_AddBoolToObject(t, "normalized", normalized);
    cJSON_AddBoolToObject(t, "special", true);
    return t;
}

/* The id the loader will give added token `text` (tk_added.c, as
 * tokenizers assigns them, whatever id the JSON says): its vocab id, else
 * the next one after the vocab's entry count, in the order the added
 * tokens come; `text` not yet among them counts as the next one to come. */
static int64_t special_id(cJSON *vocab, cJSON *added, const char *text) {
    int64_t next = cJSON_GetArraySize(vocab);
    const cJSON *it;
    cJSON_ArrayForEach(it, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(c) || !c->valuestring[0]) continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, c->valuestring);
        bool seen = false; /* an earlier added token of the same content holds its id */
        for (const cJSON *e = added->child; e != it && !seen; e = e->next) {
            const cJSON *ec = cJSON_GetObjectItemCaseSensitive(e, "content");
            seen = cJSON_IsString(ec) && !strcmp(ec->valuestring, c->valuestring);
        }
        int64_t id = cJSON_IsNumber(v) ? (int64_t)v->valuedouble : seen ? -1 : next++;
        if (!strcmp(c->valuestring, text) && id >= 0) return id;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, text);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : next;
}

static hr_status add_special(cJSON *vocab, cJSON *added, const char *text, int64_t *id) {
    *id = special_id(vocab, added, text);
    const cJSON *it;
    cJSON_ArrayForEach(it, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (cJSON_IsString(c) && !strcmp(c->valuestring, text)) return HR_OK;
    }
    cJSON *t = added_token(*id, text, false);
    if (!t || !cJSON_AddItemToArray(added, t)) return hr_error(HR_ERR_OOM, "tokenizer: special tokens");
    return HR_OK;
}

/* The special tokens: tokenizer_config.json's added_tokens_decoder, then
 * its bos/eos/unk/pad tokens (CLIPTokenizer's defaults otherwise). */
static hr_status specials(const char *dir, cJSON *vocab, cJSON *added, int64_t *bos, int64_t *eos,
                          const char **bos_s, const char **eos_s, const char **unk_s, cJSON **cfg_out) {
    char *text;
    size_t len;
    HR_TRY(slurp(dir, "tokenizer_config.json", true, &text, &len));
    cJSON *cfg = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (text && !cfg) return hr_error(HR_ERR_FORMAT, "%s/tokenizer_config.json: not valid JSON", dir);
    *cfg_out = cfg;
    const char *cls = cfg ? token_text(cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class")) : NULL;
    if (cls && strcmp(cls, "CLIPTokenizer") && strcmp(cls, "CLIPTokenizerFast"))
        return hr_error(HR_ERR_UNSUPPORTED, "%s: tokenizer_class '%s' with vocab.json + merges.txt and no "
                        "tokenizer.json (hubrt builds CLIPTokenizer from those files)", dir, cls);
    const cJSON *dec = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder") : NULL, *it;
    if (!cJSON_IsObject(dec)) dec = NULL;
    cJSON_ArrayForEach(it, dec) {
        const char *content = token_text(it), *end;
        long long id = strtoll(it->string, (char **)&end, 10);
        if (!content || *end || id < 0)
            return hr_error(HR_ERR_FORMAT, "%s/tokenizer_config.json: added_tokens_decoder entry '%s' is not an id with "
                            "a content", dir, it->string);
        const cJSON *norm = cJSON_GetObjectItemCaseSensitive(it, "normalized");
        cJSON *t = added_token(id, content, cJSON_IsTrue(norm));
        if (!t || !cJSON_AddItemToArray(added, t)) return hr_error(HR_ERR_OOM, "tokenizer: added tokens");
    }
    const char *names[4] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    const char *defaults[4] = {"<|startoftext|>", "<|endoftext|>", "<|endoftext|>", "<|endoftext|>"};
    const char *got[4];
    int64_t ids[4];
    for (int i = 0; i < 4; i++) {
        const char *v = cfg ? token_text(cJSON_GetObjectItemCaseSensitive(cfg, names[i])) : NULL;
        got[i] = v ? v : defaults[i];
        HR_TRY(add_special(vocab, added, got[i], &ids[i]));
    }
    *bos = ids[0], *eos = ids[1];
    *bos_s = got[0], *eos_s = got[1], *unk_s = got[2];
    return HR_OK;
}

static cJSON *regex_pattern(const char *re) {
    cJSON *p = cJSON_CreateObject();
    if (p) cJSON_AddStringToObject(p, "Regex", re);
    return p;
}

static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddStringToObject(o, "type", type);
    return o;
}

static cJSON *pair(const char *s, int64_t id) {
    cJSON *a = cJSON_CreateArray();
    if (a) {
        cJSON_AddItemToArray(a, cJSON_CreateString(s));
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)id));
    }
    return a;
}

/* The tokenizer.json tree, owned by the caller. */
hr_status tk_clip_build(const char *dir, cJSON **out) {
    *out = NULL;
    cJSON *config = NULL; /* tokenizer_config.json: the special tokens' strings point into it */
    char *text;
    size_t len;
    HR_TRY(slurp(dir, "vocab.json", false, &text, &len));
    cJSON *vocab = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(vocab)) {
        cJSON_Delete(vocab);
        return hr_error(HR_ERR_FORMAT, "%s/vocab.json: not a JSON object of token ids", dir);
    }
    cJSON *root = cJSON_CreateObject(), *model = typed("BPE"), *merges = cJSON_CreateArray(),
          *added = cJSON_CreateArray();
    hr_status s = root && model && merges && added ? HR_OK : hr_error(HR_ERR_OOM, "tokenizer");
    if (s == HR_OK) s = read_merges(dir, merges);
    int64_t bos = 0, eos = 0;
    const char *bos_s = NULL, *eos_s = NULL, *unk_s = NULL;
    if (s == HR_OK) s = specials(dir, vocab, added, &bos, &eos, &bos_s, &eos_s, &unk_s, &config);
    if (s == HR_OK) {
        cJSON_AddItemToObject(root, "added_tokens", added);
        added = NULL;
        cJSON *norm = typed("Sequence"), *norms = cJSON_CreateArray(), *rep = typed("Replace");
        cJSON_AddItemToObject(rep, "pattern", regex_pattern("\\s+"));
        cJSON_AddStringToObject(rep, "content", " ");
        cJSON_AddItemToArray(norms, typed("NFC"));
        cJSON_AddItemToArray(norms, rep);
        cJSON_AddItemToArray(norms, typed("Lowercase"));
        cJSON_AddItemToObject(norm, "normalizers", norms);
        cJSON_AddItemToObject(root, "normalizer", norm);
        cJSON *pre = typed("Sequence"), *pres = cJSON_CreateArray(), *split = typed("Split"), *bl = typed("ByteLevel");
        cJSON_AddItemToObject(split, "pattern", regex_pattern(clip_pattern));
        cJSON_AddStringToObject(split, "behavior", "Removed");
        cJSON_AddBoolToObject(split, "invert", true);
        cJSON_AddBoolToObject(bl, "add_prefix_space", false);
        cJSON_AddBoolToObject(bl, "trim_offsets", true);
        cJSON_AddBoolToObject(bl, "use_regex", true);
        cJSON_AddItemToArray(pres, split);
        cJSON_AddItemToArray(pres, bl);
        cJSON_AddItemToObject(pre, "pretokenizers", pres);
        cJSON_AddItemToObject(root, "pre_tokenizer", pre);
        cJSON *post = typed("RobertaProcessing");
        cJSON_AddItemToObject(post, "sep", pair(eos_s, eos));
        cJSON_AddItemToObject(post, "cls", pair(bos_s, bos));
        cJSON_AddBoolToObject(post, "trim_offsets", false);
        cJSON_AddBoolToObject(post, "add_prefix_space", false);
        cJSON_AddItemToObject(root, "post_processor", post);
        cJSON *dec = typed("ByteLevel");
        cJSON_AddBoolToObject(dec, "add_prefix_space", true);
        cJSON_AddBoolToObject(dec, "trim_offsets", true);
        cJSON_AddBoolToObject(dec, "use_regex", true);
        cJSON_AddItemToObject(root, "decoder", dec);
        cJSON_AddNullToObject(model, "dropout");
        cJSON_AddStringToObject(model, "unk_token", unk_s);
        cJSON_AddStringToObject(model, "continuing_subword_prefix", "");
        cJSON_AddStringToObject(model, "end_of_word_suffix", "</w>");
        cJSON_AddBoolToObject(model, "fuse_unk", false);
        cJSON_AddBoolToObject(model, "byte_fallback", false);
        cJSON_AddBoolToObject(model, "ignore_merges", false);
        cJSON_AddItemToObject(model, "vocab", vocab);
        cJSON_AddItemToObject(model, "merges", merges);
        vocab = merges = NULL;
        cJSON_AddItemToObject(root, "model", model);
        model = NULL;
        if (!norm || !norms || !rep || !pre || !pres || !split || !bl || !post || !dec)
            s = hr_error(HR_ERR_OOM, "tokenizer");
    }
    cJSON_Delete(vocab);
    cJSON_Delete(merges);
    cJSON_Delete(added);
    cJSON_Delete(model);
    cJSON_Delete(config);
    if (s != HR_OK) {
        cJSON_Delete(root);
        return s;
    }
    *out = root;
    return HR_OK;
}
