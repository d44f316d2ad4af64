/* Post-processors: TemplateProcessing, BertProcessing, RobertaProcessing,
 * ByteLevel (ids unchanged) and Sequence. Only the single-sequence template
 * is applied: hubrt encodes one text at a time. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_internal.h"

typedef enum { PP_TEMPLATE, PP_BERT, PP_ROBERTA, PP_BYTE_LEVEL, PP_SEQUENCE } pp_type;

/* One template item: the sequence (n_ids == 0 and is_seq) or special ids. */
typedef struct {
    bool is_seq;
    int32_t *ids;
    size_t n_ids;
} pp_item;

struct tk_post {
    pp_type type;
    bool trim_offsets, add_prefix_space; /* ByteLevel, Roberta */
    pp_item *items; /* (n_items) */
    size_t n_items;
    tk_post **children; /* Sequence (n_children) */
    size_t n_children;
};

void tk_post_free(tk_post *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_items; i++) free(p->items[i].ids);
    free(p->items);
    for (size_t i = 0; i < p->n_children; i++) tk_post_free(p->children[i]);
    free(p->children);
    free(p);
}

static hr_status add_item(tk_post *p, bool is_seq, const int32_t *ids, size_t n) {
    pp_item *items = realloc(p->items, (p->n_items + 1) * sizeof *items);
    if (!items) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    p->items = items;
    pp_item *it = &items[p->n_items++];
    *it = (pp_item){is_seq, NULL, n};
    if (n) {
        it->ids = malloc(n * sizeof *ids);
        if (!it->ids) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        memcpy(it->ids, ids, n * sizeof *ids);
    }
    return HR_OK;
}

static hr_status parse_template(const cJSON *j, tk_post *p) {
    const cJSON *single = tk_json_get(j, "single"), *specials = tk_json_get(j, "special_tokens"), *it;
    if (!cJSON_IsArray(single))
        return hr_error(HR_ERR_FORMAT, "post-processor 'TemplateProcessing': field 'single' must be an array");
    cJSON_ArrayForEach(it, single) {
        const cJSON *sp = tk_json_get(it, "SpecialToken");
        if (tk_json_get(it, "Sequence")) {
            HR_TRY(add_item(p, true, NULL, 0));
            continue;
        }
        const cJSON *name = tk_json_get(sp, "id");
        if (!cJSON_IsString(name))
            return hr_error(HR_ERR_FORMAT, "post-processor 'TemplateProcessing': 'single' items must be Sequence or SpecialToken");
        const cJSON *def = tk_json_get(specials, name->valuestring), *ids = tk_json_get(def, "ids"), *id;
        if (!cJSON_IsArray(ids))
            return hr_error(HR_ERR_FORMAT, "post-processor 'TemplateProcessing': special token '%.80s' is not in 'special_tokens'",
                            name->valuestring);
        int32_t buf[64];
        size_t n = 0;
        cJSON_ArrayForEach(id, ids) {
            if (!cJSON_IsNumber(id) || id->valuedouble < 0 || n == 64)
                return hr_error(HR_ERR_FORMAT, "post-processor 'TemplateProcessing': bad ids for '%.80s'", name->valuestring);
            buf[n++] = (int32_t)id->valuedouble;
        }
        HR_TRY(add_item(p, false, buf, n));
    }
    return HR_OK;
}

/* BertProcessing / RobertaProcessing: "cls": [token, id], "sep": [token, id]. */
static hr_status pair_id(const cJSON *j, const char *key, const char *what, int32_t *id) {
    const cJSON *v = cJSON_GetArrayItem(tk_json_get(j, key), 1);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0)
        return hr_error(HR_ERR_FORMAT, "post-processor '%s': field '%s' must be [token, id]", what, key);
    *id = (int32_t)v->valuedouble;
    return HR_OK;
}

hr_status tk_post_parse(const cJSON *j, tk_post **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return HR_OK;
    const char *type = tk_json_type(j);
    if (!type) return hr_error(HR_ERR_FORMAT, "post-processor: missing string field 'type'");
    tk_post *p = calloc(1, sizeof *p);
    if (!p) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    hr_status st = HR_OK;
    if (!strcmp(type, "TemplateProcessing")) {
        p->type = PP_TEMPLATE;
        st = parse_template(j, p);
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        p->type = type[0] == 'B' ? PP_BERT : PP_ROBERTA;
        p->trim_offsets = p->type == PP_ROBERTA && tk_json_bool(j, "trim_offsets", true);
        p->add_prefix_space = tk_json_bool(j, "add_prefix_space", true);
        int32_t cls = 0, sep = 0;
        if ((st = pair_id(j, "cls", type, &cls)) == HR_OK && (st = pair_id(j, "sep", type, &sep)) == HR_OK &&
            (st = add_item(p, false, &cls, 1)) == HR_OK && (st = add_item(p, true, NULL, 0)) == HR_OK)
            st = add_item(p, false, &sep, 1);
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = PP_BYTE_LEVEL;
        p->trim_offsets = tk_json_bool(j, "trim_offsets", true);
        p->add_prefix_space = tk_json_bool(j, "add_prefix_space", true);
    } else if (!strcmp(type, "Sequence")) {
        p->type = PP_SEQUENCE;
        const cJSON *arr = tk_json_get(j, "processors"), *it;
        if (!cJSON_IsArray(arr)) st = hr_error(HR_ERR_FORMAT, "post-processor 'Sequence': field 'processors' must be an array");
        else if (!(p->children = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *p->children)))
            st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        else cJSON_ArrayForEach(it, arr) {
            if ((st = tk_post_parse(it, &p->children[p->n_children])) != HR_OK) break;
            if (p->children[p->n_children]) p->n_children++;
        }
    } else {
        st = hr_error(HR_ERR_UNSUPPORTED, "unsupported post-processor '%s'", type);
    }
    if (st != HR_OK) {
        tk_post_free(p);
        return st;
    }
    *out = p;
    return HR_OK;
}

static hr_status append(tk_ids *out, tk_ids *out_offs, const int32_t *ids, const int32_t *offs, size_t n) {
    HR_TRY(tk_ids_append(out, ids, n));
    if (!out_offs) return HR_OK;
    if (offs) return tk_ids_append(out_offs, offs, 2 * n);
    for (size_t i = 0; i < 2 * n; i++) HR_TRY(tk_ids_push(out_offs, 0));
    return HR_OK;
}

static bool is_space_char(int32_t cp) { return cp == 0x120 || tk_cp_is_whitespace(cp); }

/* tokenizers' byte-level process_offsets: leading and trailing spaces ('Ġ'
 * or whitespace) of each token's string leave its range, counted as one byte
 * each as tokenizers counts them; one leading space of the first token stays
 * when add_prefix_space put it there. */
static void trim_offsets(const tk_post *p, const hr_tokenizer *tok, const tk_ids *ids, int32_t *offs) {
    for (size_t i = 0; i < ids->n; i++) {
        size_t len;
        const char *s = tk_token_str(tok, ids->p[i], &len);
        if (!s) continue;
        size_t lead = 0, trail = 0, a = 0, z = len;
        for (int32_t cp; a < len; lead++) {
            size_t k = tk_utf8_decode(s + a, len - a, &cp);
            if (!is_space_char(cp)) break;
            a += k;
        }
        while (z > 0) {
            size_t k = 1;
            while (k < z && ((unsigned char)s[z - k] & 0xC0) == 0x80) k++;
            int32_t cp;
            tk_utf8_decode(s + z - k, k, &cp);
            if (!is_space_char(cp)) break;
            z -= k;
            trail++;
        }
        int32_t *start = &offs[2 * i], *end = &offs[2 * i + 1];
        if (lead) {
            bool first = i == 0 || *start == 0;
            if (first && p->add_prefix_space && lead == 1) lead = 0;
            *start = *start + (int32_t)lead < *end ? *start + (int32_t)lead : *end;
        }
        if (trail && *end >= (int32_t)trail) *end = *end - (int32_t)trail > *start ? *end - (int32_t)trail : *start;
    }
}

hr_status tk_post_process(const tk_post *p, const hr_tokenizer *tok, bool add_special, const tk_ids *in,
                          const tk_ids *in_offs, tk_ids *out, tk_ids *out_offs) {
    out->n = 0;
    if (out_offs) out_offs->n = 0;
    const int32_t *io = in_offs ? in_offs->p : NULL;
    if (p->type == PP_SEQUENCE) {
        tk_ids cur = {0}, next = {0}, cur_o = {0}, next_o = {0};
        hr_status st = append(&cur, &cur_o, in->p, io, in->n);
        for (size_t i = 0; st == HR_OK && i < p->n_children; i++) {
            st = tk_post_process(p->children[i], tok, add_special, &cur, &cur_o, &next, &next_o);
            tk_ids t = cur, to = cur_o;
            cur = next;
            cur_o = next_o;
            next = t;
            next_o = to;
        }
        if (st == HR_OK) st = append(out, out_offs, cur.p, cur_o.p, cur.n);
        tk_ids_free(&cur);
        tk_ids_free(&next);
        tk_ids_free(&cur_o);
        tk_ids_free(&next_o);
        return st;
    }
    HR_TRY(append(out, out_offs, in->p, io, in->n));
    if (p->trim_offsets && out_offs) trim_offsets(p, tok, out, out_offs->p);
    if (p->type == PP_BYTE_LEVEL || !add_special) return HR_OK;
    /* The template wraps the (trimmed) sequence. */
    tk_ids seq = {0}, seq_o = {0};
    hr_status st = append(&seq, out_offs ? &seq_o : NULL, out->p, out_offs ? out_offs->p : NULL, out->n);
    out->n = 0;
    if (out_offs) out_offs->n = 0;
    for (size_t i = 0; st == HR_OK && i < p->n_items; i++) {
        const pp_item *it = &p->items[i];
        st = it->is_seq ? append(out, out_offs, seq.p, out_offs ? seq_o.p : NULL, seq.n)
                        : append(out, out_offs, it->ids, NULL, it->n_ids);
    }
    tk_ids_free(&seq);
    tk_ids_free(&seq_o);
    return st;
}
