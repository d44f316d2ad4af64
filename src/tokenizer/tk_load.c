/* Loading: tokenizer.json into the pipeline, and the special tokens, flags
 * and chat template of tokenizer_config.json / special_tokens_map.json. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mem_budget.h"
#include "core/path.h"
#include "io/gguf.h"
#include "tokenizer/tk_internal.h"

/* The largest tokenizer files on the Hub are tens of MB (Gemma 3's
 * tokenizer.json: 33 MB); parsed, a JSON file takes about ten times its
 * size, so a larger one is refused rather than parsed. */
#define TK_FILE_MAX ((long)512 << 20)

static hr_status read_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return hr_error(errno == ENOENT ? HR_ERR_NOT_FOUND : HR_ERR_IO, "%s: %s", path, strerror(errno));
    hr_status st = HR_OK;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) st = hr_error(HR_ERR_IO, "%s: cannot seek", path);
    else if (n > TK_FILE_MAX)
        st = hr_error(HR_ERR_FORMAT, "%s: %ld bytes, more than the %ld a tokenizer file may hold", path, n, TK_FILE_MAX);
    else st = hr_mem_check((size_t)n * 10, path); /* the file and its parse */
    if (st == HR_OK && !(buf = malloc((size_t)n + 1)))
        st = hr_error(HR_ERR_OOM, "%s: out of memory for %ld bytes", path, n);
    else if (st == HR_OK && fread(buf, 1, (size_t)n, f) != (size_t)n)
        st = hr_error(HR_ERR_IO, "%s: short read", path);
    fclose(f);
    if (st != HR_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    *len = (size_t)n;
    return HR_OK;
}

static hr_status parse_json(const char *text, size_t len, const char *name, cJSON **out) {
    *out = cJSON_ParseWithLength(text, len);
    if (*out) return HR_OK;
    const char *at = cJSON_GetErrorPtr();
    size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
    size_t line = 1;
    for (size_t i = 0; i < off; i++) line += text[i] == '\n';
    return hr_error(HR_ERR_FORMAT, "%s: malformed JSON near byte %zu (line %zu)", name, off, line);
}

static void tokenizer_init_fields(hr_tokenizer *t) {
    t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
}

static hr_status build_pipeline(hr_tokenizer *t, const cJSON *j) {
    if (!cJSON_IsObject(j)) return hr_error(HR_ERR_FORMAT, "tokenizer.json: top level must be an object");
    HR_TRY(tk_normalizer_parse(tk_json_get(j, "normalizer"), &t->normalizer));
    HR_TRY(tk_pretok_parse(tk_json_get(j, "pre_tokenizer"), &t->pretok));
    const cJSON *model = tk_json_get(j, "model");
    if (!model) return hr_error(HR_ERR_FORMAT, "tokenizer.json: missing field 'model'");
    HR_TRY(tk_model_parse(model, &t->model));
    HR_TRY(tk_added_parse(tk_json_get(j, "added_tokens"), t->normalizer, t->model, &t->added));
    HR_TRY(tk_post_parse(tk_json_get(j, "post_processor"), &t->post));
    HR_TRY(tk_decoder_parse(tk_json_get(j, "decoder"), &t->decoder));
    const cJSON *trunc = tk_json_get(j, "truncation"), *pad = tk_json_get(j, "padding");
    if ((trunc && !cJSON_IsNull(trunc)) || (pad && !cJSON_IsNull(pad)))
        hr_log(HR_LOG_INFO, "tokenizer.json: truncation and padding settings are ignored");
    return HR_OK;
}

static hr_status tokenizer_alloc(hr_tokenizer **out) {
    hr_tokenizer *t = calloc(1, sizeof *t);
    pthread_mutex_t *mu = malloc(sizeof *mu);
    if (!t || !mu) {
        free(t);
        free(mu);
        return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    }
    pthread_mutex_init(mu, NULL);
    t->pool_lock = mu;
    tokenizer_init_fields(t);
    *out = t;
    return HR_OK;
}

void hr_tokenizer_free(hr_tokenizer *t) {
    if (!t) return;
    tk_ws_pool_free(t);
    if (t->pool_lock) {
        pthread_mutex_destroy(t->pool_lock);
        free(t->pool_lock);
    }
    tk_normalizer_free(t->normalizer);
    tk_pretok_free(t->pretok);
    tk_model_free(t->model);
    tk_added_free(t->added);
    tk_post_free(t->post);
    tk_decoder_free(t->decoder);
    free(t->chat_template);
    free(t);
}

/* A tokenizer from a parsed tokenizer.json tree (freed here); errors gain
 * `name` as context. */
static hr_status load_json_tree(cJSON *j, const char *name, hr_tokenizer **out) {
    hr_tokenizer *t = NULL;
    hr_status st = tokenizer_alloc(&t);
    if (st == HR_OK) st = build_pipeline(t, j);
    cJSON_Delete(j);
    if (st != HR_OK) {
        hr_error_context(st, "%s", name);
        hr_tokenizer_free(t);
        return st;
    }
    *out = t;
    return HR_OK;
}

static hr_status load_json_text(const char *text, size_t len, const char *name, hr_tokenizer **out) {
    cJSON *j;
    HR_TRY(parse_json(text, len, name, &j));
    return load_json_tree(j, name, out);
}

/* Whether dir holds the two files of a CLIPTokenizer without tokenizer.json. */
static bool clip_files(const char *dir) {
    char a[4200], b[4200];
    if (snprintf(a, sizeof a, "%s/vocab.json", dir) >= (int)sizeof a) return false;
    if (snprintf(b, sizeof b, "%s/merges.txt", dir) >= (int)sizeof b) return false;
    return access(a, F_OK) == 0 && access(b, F_OK) == 0;
}

static hr_status load_clip(const char *dir, hr_tokenizer **out) {
    cJSON *j = NULL;
    HR_TRY(tk_clip_build(dir, &j));
    char name[4200];
    snprintf(name, sizeof name, "%s (vocab.json + merges.txt)", dir);
    return load_json_tree(j, name, out);
}

hr_status hr_tokenizer_load_json(const char *json, size_t len, hr_tokenizer **out) {
    if (!json || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_load_json: NULL argument");
    *out = NULL;
    return load_json_text(json, len, "tokenizer.json", out);
}

/* ---- tokenizer_config.json ----------------------------------------------------- */

/* A special token is a string or {"content": string, ...}. */
static const char *token_content(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = tk_json_get(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static void set_special(hr_tokenizer *t, const cJSON *cfg, const char *key, int32_t *id) {
    const char *s = token_content(tk_json_get(cfg, key));
    if (!s || *id >= 0) return;
    int32_t v;
    if (hr_tokenizer_token_to_id(t, s, strlen(s), &v) == HR_OK) *id = v;
    else hr_log(HR_LOG_WARN, "tokenizer config: %s '%s' is not in the vocabulary", key, s);
}

static hr_status apply_config(hr_tokenizer *t, const cJSON *cfg) {
    set_special(t, cfg, "bos_token", &t->bos_id);
    set_special(t, cfg, "eos_token", &t->eos_id);
    set_special(t, cfg, "pad_token", &t->pad_id);
    set_special(t, cfg, "unk_token", &t->unk_id);
    const cJSON *ab = tk_json_get(cfg, "add_bos_token"), *ae = tk_json_get(cfg, "add_eos_token");
    if (cJSON_IsBool(ab)) t->has_add_bos = true, t->add_bos = cJSON_IsTrue(ab);
    if (cJSON_IsBool(ae)) t->has_add_eos = true, t->add_eos = cJSON_IsTrue(ae);
    const cJSON *ct = tk_json_get(cfg, "chat_template");
    const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
    if (cJSON_IsArray(ct)) {
        /* A list of named templates: the one named "default", else the first. */
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *name = tk_json_get(it, "name"), *tx = tk_json_get(it, "template");
            if (!cJSON_IsString(tx)) continue;
            if (!tmpl || (cJSON_IsString(name) && !strcmp(name->valuestring, "default"))) tmpl = tx->valuestring;
        }
    }
    if (tmpl && !t->chat_template) {
        t->chat_template = strdup(tmpl);
        if (!t->chat_template) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    }
    return HR_OK;
}

static hr_status apply_config_text(hr_tokenizer *t, const char *text, size_t len, const char *label) {
    cJSON *j;
    HR_TRY(parse_json(text, len, label, &j));
    hr_status st = apply_config(t, j);
    cJSON_Delete(j);
    return st;
}

hr_status tk_read_optional(const char *dir, const char *name, char *path, size_t cap, char **text,
                               size_t *len) {
    *text = NULL;
    if (snprintf(path, cap, "%s/%s", dir, name) >= (int)cap)
        return hr_error(HR_ERR_INVALID_ARG, "tokenizer: path too long");
    HR_TRY(hr_path_check_inside(dir, path));
    hr_status st = read_file(path, text, len);
    if (st != HR_ERR_NOT_FOUND) return st;
    hr_clear_error();
    return HR_OK;
}

static hr_status load_side_file(hr_tokenizer *t, const char *dir, const char *name) {
    char path[4096], *text;
    size_t len;
    HR_TRY(tk_read_optional(dir, name, path, sizeof path, &text, &len));
    if (!text) return HR_OK;
    hr_status st = apply_config_text(t, text, len, path);
    free(text);
    return st;
}

/* chat_template.jinja (transformers 5 saves the template there) wins over
 * tokenizer_config.json's chat_template, as transformers reads them. */
static hr_status load_template_file(hr_tokenizer *t, const char *dir) {
    char path[4096], *text;
    size_t len;
    HR_TRY(tk_read_optional(dir, "chat_template.jinja", path, sizeof path, &text, &len));
    if (!text) return HR_OK;
    if (memchr(text, 0, len)) {
        free(text);
        return hr_error(HR_ERR_FORMAT, "%s: holds a NUL byte", path);
    }
    free(t->chat_template);
    t->chat_template = text;
    return HR_OK;
}

/* A GGUF file's tokenizer: tokenizer.json and tokenizer_config.json as
 * its metadata describes them (io/gguf_hub.c), from one parse of it. */
static hr_status load_gguf(const char *gguf, hr_tokenizer **out) {
    char *json = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    hr_tokenizer *t = NULL;
    hr_gguf *g = NULL;
    hr_status st = hr_gguf_open(gguf, &g);
    if (st == HR_OK) st = hr_gguf_tokenizer_json_of(g, &json, &len);
    if (st == HR_OK) st = hr_gguf_tokenizer_config_json_of(g, &cfg, &cfg_len);
    hr_gguf_close(g);
    if (st == HR_OK) st = load_json_text(json, len, gguf, &t);
    if (st == HR_OK) st = apply_config_text(t, cfg, cfg_len, gguf);
    free(json);
    free(cfg);
    if (st != HR_OK) {
        hr_tokenizer_free(t);
        return st;
    }
    *out = t;
    return HR_OK;
}

hr_status hr_tokenizer_load(const char *path, hr_tokenizer **out) {
    if (!path || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return hr_error(errno == ENOENT ? HR_ERR_NOT_FOUND : HR_ERR_IO, "%s: %s", path, strerror(errno));
    char dir[4096], file[4096];
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        if (snprintf(file, sizeof file, "%s/tokenizer.json", path) >= (int)sizeof file)
            return hr_error(HR_ERR_INVALID_ARG, "tokenizer: path too long");
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
    }
    /* A GGUF file, or a folder whose model is one and that has no
     * tokenizer.json of its own (which wins, as transformers reads it). */
    if (!S_ISDIR(sb.st_mode) || access(file, F_OK) != 0) {
        char *gguf = NULL;
        HR_TRY(hr_gguf_resolve(path, &gguf));
        if (gguf) {
            hr_status st = load_gguf(gguf, out);
            free(gguf);
            return st;
        }
    }
    if (S_ISDIR(sb.st_mode)) HR_TRY(hr_path_check_inside(dir, file));
    hr_tokenizer *t;
    hr_status st;
    if (S_ISDIR(sb.st_mode) && access(file, F_OK) != 0 && clip_files(dir)) {
        st = load_clip(dir, &t); /* vocab.json + merges.txt, as CLIPTokenizer builds from them */
    } else {
        char *text;
        size_t len;
        HR_TRY(read_file(file, &text, &len));
        st = load_json_text(text, len, file, &t);
        free(text);
    }
    HR_TRY(st);
    /* tokenizer_config.json wins over special_tokens_map.json. */
    st = load_side_file(t, dir, "tokenizer_config.json");
    if (st == HR_OK) st = load_side_file(t, dir, "special_tokens_map.json");
    if (st == HR_OK) st = load_template_file(t, dir);
    if (st != HR_OK) {
        hr_tokenizer_free(t);
        return st;
    }
    *out = t;
    return HR_OK;
}
