/* Added tokens: matched leftmost-longest in the raw text (normalized=false)
 * or in the normalized pieces (normalized=true), with lstrip, rstrip and
 * single_word, as tokenizers' AddedVocabulary does.
 *
 * Their ids are the ones tokenizers assigns, not the ones the file claims:
 * a content already in the model's vocab keeps its vocab id, a content seen
 * before keeps its first id, and every new content takes the next id after
 * the vocab's entries, in file order. So a file claiming id 2^31 - 2 costs
 * nothing, and no table here is sized by a number the file states. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/tk_internal.h"

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    int32_t first; /* index of the first token with this content */
    bool special, lstrip, rstrip, single_word, normalized;
    bool any_special; /* on the first copy: some copy is special (tokenizers' special set) */
} added_token;

/* A byte trie over token strings; node 0 is the root. */
typedef struct {
    tk_u64map next;   /* (node << 8 | byte) -> child */
    int32_t *tok;     /* (n) index of the token ending at each node, or -1 */
    size_t n, cap;
    bool first_byte[256];
} trie;

struct tk_added {
    added_token *v; /* (n) */
    size_t n;
    tk_strmap by_content;
    int32_t max_id;
    tk_u64map by_id; /* id -> index into v of the id's last copy (a vocab id may be any int32) */
    trie raw, norm;
    tk_buf norm_text; /* normalized contents, keys of `norm` */
};

static hr_status trie_init(trie *t) {
    t->cap = 64;
    t->tok = malloc(t->cap * sizeof *t->tok);
    if (!t->tok) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    t->tok[0] = -1;
    t->n = 1;
    return tk_u64map_init(&t->next, 256);
}

static void trie_free(trie *t) {
    tk_u64map_free(&t->next);
    free(t->tok);
}

static hr_status trie_add(trie *t, const char *s, size_t n, int32_t tok) {
    if (!n) return HR_OK;
    uint64_t node = 0;
    t->first_byte[(unsigned char)s[0]] = true;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = node << 8 | (unsigned char)s[i], child;
        if (!tk_u64map_get(&t->next, key, &child)) {
            if (t->n == t->cap) {
                int32_t *p = realloc(t->tok, t->cap * 2 * sizeof *p);
                if (!p) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
                t->tok = p;
                t->cap *= 2;
            }
            child = t->n++;
            t->tok[child] = -1;
            HR_TRY(tk_u64map_put(&t->next, key, child));
        }
        node = child;
    }
    /* The first token with a given content wins, as a map insert would not. */
    if (t->tok[node] < 0) t->tok[node] = tok;
    return HR_OK;
}

/* Longest token starting at s[0]: its index, and its length in *len. */
static int32_t trie_longest(const trie *t, const char *s, size_t n, size_t *len) {
    if (!t->first_byte[(unsigned char)s[0]]) return -1;
    uint64_t node = 0;
    int32_t best = -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t child;
        if (!tk_u64map_get(&t->next, node << 8 | (unsigned char)s[i], &child)) break;
        node = child;
        if (t->tok[node] >= 0) {
            best = t->tok[node];
            *len = i + 1;
        }
    }
    return best;
}

void tk_added_free(tk_added *a) {
    if (!a) return;
    for (size_t i = 0; i < a->n; i++) free(a->v[i].content);
    free(a->v);
    tk_u64map_free(&a->by_id);
    tk_strmap_free(&a->by_content);
    trie_free(&a->raw);
    trie_free(&a->norm);
    tk_buf_free(&a->norm_text);
    free(a);
}

static hr_status parse_token(const cJSON *it, size_t i, added_token *t) {
    const cJSON *id = tk_json_get(it, "id"), *content = tk_json_get(it, "content");
    /* The claimed id is read as tokenizers reads it (an u32) and then
     * dropped: tokenizers assigns its own. */
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > UINT32_MAX ||
        id->valuedouble != (double)(int64_t)id->valuedouble || !cJSON_IsString(content))
        return hr_error(HR_ERR_FORMAT, "added_tokens[%zu]: needs an integer 'id' in 0..%u and a string 'content'",
                        i, UINT32_MAX);
    t->len = strlen(content->valuestring);
    /* matched through UTF-8 regexes and tries: JSON text is UTF-8, as
     * tokenizers (serde) insists */
    if (tk_utf8_valid_prefix(content->valuestring, t->len) != t->len)
        return hr_error(HR_ERR_FORMAT, "added_tokens[%zu]: content is not valid UTF-8", i);
    t->content = malloc(t->len + 1);
    if (!t->content) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    memcpy(t->content, content->valuestring, t->len + 1);
    t->special = tk_json_bool(it, "special", false);
    t->lstrip = tk_json_bool(it, "lstrip", false);
    t->rstrip = tk_json_bool(it, "rstrip", false);
    t->single_word = tk_json_bool(it, "single_word", false);
    t->normalized = tk_json_bool(it, "normalized", !t->special);
    return HR_OK;
}

static hr_status build(tk_added *a, const tk_normalizer *nz) {
    HR_TRY(trie_init(&a->raw));
    HR_TRY(trie_init(&a->norm));
    HR_TRY(tk_u64map_init(&a->by_id, a->n));
    tk_ws ws = {0};
    tk_buf tmp = {0};
    hr_status st = HR_OK;
    /* Normalized contents first: their offsets must be final before use. */
    size_t *norm_off = calloc(a->n + 1, sizeof *norm_off), *norm_len = calloc(a->n + 1, sizeof *norm_len);
    if (!norm_off || !norm_len) st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    for (size_t i = 0; st == HR_OK && i < a->n; i++) {
        added_token *t = &a->v[i];
        if (!t->normalized) continue;
        if (nz) st = tk_normalize(nz, t->content, NULL, t->len, &tmp, NULL, &ws);
        else {
            tmp.n = 0;
            st = tk_buf_append(&tmp, t->content, t->len);
        }
        norm_off[i] = a->norm_text.n;
        norm_len[i] = tmp.n;
        if (st == HR_OK) st = tk_buf_append(&a->norm_text, tmp.p, tmp.n);
    }
    for (size_t i = 0; st == HR_OK && i < a->n; i++) {
        st = tk_u64map_put(&a->by_id, (uint64_t)a->v[i].id, i);
        if (a->v[i].special) a->v[a->v[i].first].any_special = true;
    }
    /* Matched as tokenizers matches them: the token each id ended with
     * (a later copy's flags; an id shared with another content, as a vocab
     * with holes allows, only the last). */
    for (size_t i = 0; st == HR_OK && i < a->n; i++) {
        added_token *t = &a->v[i];
        uint64_t last = 0;
        tk_u64map_get(&a->by_id, (uint64_t)t->id, &last);
        if (last != i) continue;
        st = t->normalized ? trie_add(&a->norm, a->norm_text.p + norm_off[i], norm_len[i], (int32_t)i)
                           : trie_add(&a->raw, t->content, t->len, (int32_t)i);
    }
    free(norm_off);
    free(norm_len);
    tk_buf_free(&tmp);
    tk_ws_clear(&ws);
    return st;
}

static bool same_flags(const added_token *a, const added_token *b) {
    return a->special == b->special && a->lstrip == b->lstrip && a->rstrip == b->rstrip &&
           a->single_word == b->single_word && a->normalized == b->normalized;
}

/* Gives v[a->n] its id, or drops it (returns false) as tokenizers skips an
 * empty content or a token equal in every field to one already added. */
static hr_status assign_id(tk_added *a, const tk_model *model, int64_t *next, bool *keep) {
    added_token *t = &a->v[a->n];
    *keep = false;
    if (!t->len) return HR_OK;
    int32_t k = tk_strmap_get(&a->by_content, t->content, t->len);
    if (k >= 0) {
        for (size_t i = (size_t)k; i < a->n; i++)
            if (a->v[i].first == k && same_flags(&a->v[i], t)) return HR_OK;
        t->id = a->v[k].id;
        t->first = k;
    } else {
        int32_t vid = tk_model_token_to_id(model, t->content, t->len);
        if (vid < 0) {
            if (*next > INT32_MAX - 1) return hr_error(HR_ERR_FORMAT, "added_tokens: more ids than an int32 holds");
            vid = (int32_t)(*next)++;
        }
        t->id = vid;
        t->first = (int32_t)a->n;
        HR_TRY(tk_strmap_put(&a->by_content, t->content, t->len, (int32_t)a->n));
    }
    if (t->id > a->max_id) a->max_id = t->id;
    *keep = true;
    return HR_OK;
}

hr_status tk_added_parse(const cJSON *j, const tk_normalizer *nz, const tk_model *model, tk_added **out) {
    *out = NULL;
    tk_added *a = calloc(1, sizeof *a);
    if (!a) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    a->max_id = -1;
    hr_status st = HR_OK;
    if (j && !cJSON_IsNull(j) && !cJSON_IsArray(j)) st = hr_error(HR_ERR_FORMAT, "field 'added_tokens' must be an array");
    int cnt = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : 0;
    if (st == HR_OK) {
        a->v = calloc((size_t)cnt + 1, sizeof *a->v);
        if (!a->v) st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    }
    if (st == HR_OK) st = tk_strmap_init(&a->by_content, (size_t)cnt);
    int64_t next = (int64_t)tk_model_entries(model);
    const cJSON *it;
    size_t idx = 0;
    if (st == HR_OK && cnt) cJSON_ArrayForEach(it, j) {
        bool keep = false;
        if ((st = parse_token(it, idx++, &a->v[a->n])) != HR_OK) break;
        if ((st = assign_id(a, model, &next, &keep)) != HR_OK) break;
        if (keep) a->n++;
        else {
            free(a->v[a->n].content);
            a->v[a->n].content = NULL;
        }
    }
    if (st != HR_OK && a->n < (size_t)cnt) free(a->v[a->n].content);
    if (st == HR_OK) st = build(a, nz);
    if (st != HR_OK) {
        tk_added_free(a);
        return st;
    }
    *out = a;
    return HR_OK;
}

/* ---- matching ------------------------------------------------------------------- */

static int32_t last_cp(const char *s, size_t n) {
    if (!n) return -1;
    size_t k = 1;
    while (k < n && ((unsigned char)s[n - k] & 0xC0) == 0x80) k++;
    int32_t cp;
    tk_utf8_decode(s + n - k, k, &cp);
    return cp;
}

/* Rust regex's Unicode \w, which tokenizers uses for single_word:
 * Alphabetic, marks, decimal digits, connectors, Join_Control. The
 * Alphabetic symbols outside L and Nl are the circled and squared letters. */
static bool is_word_cp(int32_t cp) {
    if (cp < 0x80) return cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    if (cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F189)) return true;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return tk_cp_category(cp) == 'L' || tk_cp_category(cp) == 'M';
    }
}

hr_status tk_added_split(const tk_added *a, bool normalized, const char *s, const tk_align *al, size_t n, bool first,
                         tk_pieces *out) {
    const trie *t = normalized ? &a->norm : &a->raw;
    size_t done = 0; /* end of the last emitted piece */
    for (size_t i = 0; i < n && t->n > 1;) {
        size_t len = 0;
        int32_t k = trie_longest(t, s + i, n - i, &len);
        if (k < 0) {
            i++;
            continue;
        }
        const added_token *tok = &a->v[k];
        size_t start = i, stop = i + len;
        i = stop;
        if (tok->single_word) {
            int32_t before = last_cp(s, start), after = -1;
            if (stop < n) tk_utf8_decode(s + stop, n - stop, &after);
            if ((before >= 0 && is_word_cp(before)) || (after >= 0 && is_word_cp(after))) continue;
        }
        if (tok->lstrip) {
            size_t ns = start;
            for (int32_t cp; ns > 0 && tk_cp_is_whitespace(cp = last_cp(s, ns));) {
                char u[4];
                ns -= tk_utf8_encode(cp, u);
            }
            start = ns > done ? ns : done;
        }
        if (tok->rstrip)
            for (int32_t cp; stop < n;) {
                size_t kk = tk_utf8_decode(s + stop, n - stop, &cp);
                if (!tk_cp_is_whitespace(cp)) break;
                stop += kk;
            }
        if (start > done) HR_TRY(tk_pieces_add(out, s + done, tk_al_at(al, done), start - done, -1, first && done == 0));
        HR_TRY(tk_pieces_add(out, s + start, tk_al_at(al, start), stop - start, tok->id, first && start == 0));
        done = stop;
    }
    if (done < n) HR_TRY(tk_pieces_add(out, s + done, tk_al_at(al, done), n - done, -1, first && done == 0));
    return HR_OK;
}

int32_t tk_added_token_to_id(const tk_added *a, const char *s, size_t n) {
    int32_t k = tk_strmap_get(&a->by_content, s, n);
    return k < 0 ? -1 : a->v[k].id;
}

const char *tk_added_id_to_token(const tk_added *a, int32_t id, size_t *len, bool *special) {
    uint64_t k;
    if (id < 0 || id > a->max_id || !tk_u64map_get(&a->by_id, (uint64_t)id, &k)) return NULL;
    const added_token *t = &a->v[k];
    *len = t->len;
    if (special) *special = a->v[t->first].any_special;
    return t->content;
}

size_t tk_added_count(const tk_added *a) { return a->n; }
int32_t tk_added_max_id(const tk_added *a) { return a->max_id; }
