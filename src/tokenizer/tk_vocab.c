/* Vocabulary tables and the model dispatch. */
#include <stdlib.h>
#include <string.h>

#include "core/mem_budget.h"
#include "tokenizer/tk_model.h"

void tk_vocab_free(tk_vocab *v) {
    free(v->arena);
    free(v->off);
    free(v->len);
    tk_u64map_free(&v->far);
    tk_strmap_free(&v->map);
    memset(v, 0, sizeof *v);
}

static hr_status vocab_alloc(tk_vocab *v, size_t n, size_t entries, size_t bytes) {
    HR_TRY(hr_mem_check(bytes + n * 2 * sizeof *v->off + entries * 32, "tokenizer: the vocabulary"));
    v->arena = malloc(bytes + 1);
    v->off = malloc((n + 1) * sizeof *v->off);
    v->len = malloc((n + 1) * sizeof *v->len);
    if (!v->arena || !v->off || !v->len) return hr_error(HR_ERR_OOM, "tokenizer: out of memory for a vocabulary of %zu", n);
    v->n = n;
    /* Unset ids read as empty strings that the map never returns. */
    for (size_t i = 0; i < n; i++) v->len[i] = UINT32_MAX;
    v->entries = entries;
    v->max_id = (int64_t)n - 1;
    HR_TRY(tk_u64map_init(&v->far, 4));
    return tk_strmap_init(&v->map, entries);
}

static hr_status vocab_set(tk_vocab *v, size_t id, const char *s, size_t *pos) {
    size_t len = strlen(s), off = *pos;
    memcpy(v->arena + off, s, len);
    *pos += len;
    if (id < v->n) {
        v->off[id] = (uint32_t)off;
        v->len[id] = (uint32_t)len;
    } else {
        HR_TRY(tk_u64map_put(&v->far, id, (uint64_t)off << 32 | len));
        if ((int64_t)id > v->max_id) v->max_id = (int64_t)id;
    }
    return tk_strmap_put(&v->map, v->arena + off, len, (int32_t)id);
}

const char *tk_vocab_token(const tk_vocab *v, int32_t id, size_t *len) {
    if (id < 0) return NULL;
    if ((size_t)id < v->n) {
        if (v->len[id] == UINT32_MAX) return NULL;
        *len = v->len[id];
        return v->arena + v->off[id];
    }
    uint64_t packed;
    if (!tk_u64map_get(&v->far, (uint64_t)id, &packed)) return NULL;
    *len = (uint32_t)packed;
    return v->arena + (packed >> 32);
}

hr_status tk_vocab_from_object(const cJSON *obj, const char *what, tk_vocab *v) {
    if (!cJSON_IsObject(obj)) return hr_error(HR_ERR_FORMAT, "%s: field 'vocab' must be an object", what);
    size_t n = 0, bytes = 0;
    int64_t max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX - 1 ||
            it->valuedouble != (double)(int64_t)it->valuedouble)
            return hr_error(HR_ERR_FORMAT, "%s: vocab entry '%.80s' must have an integer id in 0..%d (hubrt's ids are "
                            "int32)", what, it->string, INT32_MAX - 1);
        if ((int64_t)it->valuedouble > max_id) max_id = (int64_t)it->valuedouble;
        bytes += strlen(it->string);
        n++;
    }
    if (bytes > UINT32_MAX) return hr_error(HR_ERR_FORMAT, "%s: the vocab's strings pass 4 GB", what);
    /* dense up to a few times the entries; ids past that go to the map */
    int64_t dense = max_id + 1 < (int64_t)n * 4 + 1024 ? max_id + 1 : (int64_t)n * 4 + 1024;
    HR_TRY(vocab_alloc(v, (size_t)dense, n, bytes));
    size_t pos = 0;
    cJSON_ArrayForEach(it, obj) HR_TRY(vocab_set(v, (size_t)it->valuedouble, it->string, &pos));
    return HR_OK;
}

hr_status tk_vocab_from_pairs(const cJSON *arr, const char *what, tk_vocab *v, double **scores) {
    if (!cJSON_IsArray(arr)) return hr_error(HR_ERR_FORMAT, "%s: field 'vocab' must be an array", what);
    size_t n = 0, bytes = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *tok = cJSON_GetArrayItem(it, 0), *sc = cJSON_GetArrayItem(it, 1);
        if (!cJSON_IsArray(it) || !cJSON_IsString(tok) || !cJSON_IsNumber(sc))
            return hr_error(HR_ERR_FORMAT, "%s: vocab entry %zu must be [string, number]", what, n);
        bytes += strlen(tok->valuestring);
        n++;
    }
    HR_TRY(vocab_alloc(v, n, n, bytes));
    *scores = malloc((n + 1) * sizeof **scores);
    if (!*scores) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    size_t pos = 0, id = 0;
    cJSON_ArrayForEach(it, arr) {
        HR_TRY(vocab_set(v, id, cJSON_GetArrayItem(it, 0)->valuestring, &pos));
        (*scores)[id++] = cJSON_GetArrayItem(it, 1)->valuedouble;
    }
    return HR_OK;
}

/* ---- model dispatch ------------------------------------------------------------ */

hr_status tk_model_parse(const cJSON *j, tk_model **out) {
    *out = NULL;
    const char *type = tk_json_type(j);
    /* Old files leave "type" out of BPE models. */
    if (!type && cJSON_IsObject(j) && tk_json_get(j, "merges")) type = "BPE";
    if (!type) return hr_error(HR_ERR_FORMAT, "model: missing string field 'type'");
    tk_model *m = calloc(1, sizeof *m);
    if (!m) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    m->unk_id = -1;
    hr_status st;
    if (!strcmp(type, "BPE")) {
        m->type = TK_MODEL_BPE;
        st = tk_bpe_parse(j, m);
    } else if (!strcmp(type, "WordPiece")) {
        m->type = TK_MODEL_WORDPIECE;
        st = tk_wordpiece_parse(j, m);
    } else if (!strcmp(type, "WordLevel")) {
        m->type = TK_MODEL_WORDLEVEL;
        st = tk_wordlevel_parse(j, m);
    } else if (!strcmp(type, "Unigram")) {
        m->type = TK_MODEL_UNIGRAM;
        st = tk_unigram_parse(j, m);
    } else {
        st = hr_error(HR_ERR_UNSUPPORTED, "unsupported model '%s'", type);
    }
    if (st != HR_OK) {
        tk_model_free(m);
        return st;
    }
    *out = m;
    return HR_OK;
}

void tk_model_free(tk_model *m) {
    if (!m) return;
    tk_vocab_free(&m->vocab);
    free(m->prefix);
    free(m->suffix);
    tk_u64map_free(&m->merges);
    free(m->scores);
    tk_u64map_free(&m->trie);
    free(m->trie_ids);
    free(m);
}

void tk_model_scratch_free(const tk_model *m, void *scratch) {
    if (!scratch) return;
    if (m->type == TK_MODEL_BPE) tk_bpe_scratch_free(scratch);
    else if (m->type == TK_MODEL_UNIGRAM) tk_unigram_scratch_free(scratch);
}

hr_status tk_model_tokenize(const tk_model *m, const char *s, size_t n, tk_ids *out, tk_ids *offs, tk_ws *ws) {
    if (n == 0) return HR_OK;
    switch (m->type) {
    case TK_MODEL_BPE: return tk_bpe_tokenize(m, s, n, out, offs, ws);
    case TK_MODEL_WORDPIECE: return tk_wordpiece_tokenize(m, s, n, out, offs);
    case TK_MODEL_UNIGRAM: return tk_unigram_tokenize(m, s, n, out, offs, ws);
    case TK_MODEL_WORDLEVEL: {
        int32_t id = tk_vocab_get(&m->vocab, s, n);
        if (id < 0 && m->unk_id < 0)
            return hr_error(HR_ERR_UNSUPPORTED, "model 'WordLevel': '%.*s' is not in the vocab and there is no unk_token",
                            (int)(n > 80 ? 80 : n), s);
        if (offs) {
            HR_TRY(tk_ids_push(offs, 0));
            HR_TRY(tk_ids_push(offs, (int32_t)n));
        }
        return tk_ids_push(out, id >= 0 ? id : m->unk_id);
    }
    }
    return hr_error(HR_ERR_INTERNAL, "model: bad type");
}

int32_t tk_model_token_to_id(const tk_model *m, const char *s, size_t n) { return tk_vocab_get(&m->vocab, s, n); }

const char *tk_model_id_to_token(const tk_model *m, int32_t id, size_t *len) {
    return tk_vocab_token(&m->vocab, id, len);
}

size_t tk_model_vocab_size(const tk_model *m) { return (size_t)(m->vocab.max_id + 1); }

size_t tk_model_entries(const tk_model *m) { return m->vocab.entries; }

const char *hr_tokenizer_model_type(const hr_tokenizer *tok) {
    if (!tok) return NULL;
    switch (tok->model->type) {
    case TK_MODEL_BPE: return "BPE";
    case TK_MODEL_WORDPIECE: return "WordPiece";
    case TK_MODEL_WORDLEVEL: return "WordLevel";
    case TK_MODEL_UNIGRAM: return "Unigram";
    }
    return NULL;
}
