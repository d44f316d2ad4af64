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
        int32_t cls = 0, sep = 0;
        if ((st = pair_id(j, "cls", type, &cls)) == HR_OK && (st = pair_id(j, "sep", type, &sep)) == HR_OK &&
            (st = add_item(p, false, &cls, 1)) == HR_OK && (st = add_item(p, true, NULL, 0)) == HR_OK)
            st = add_item(p, false, &sep, 1);
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = PP_BYTE_LEVEL;
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

hr_status tk_post_process(const tk_post *p, const tk_ids *in, const tk_ids *in_offs, tk_ids *out, tk_ids *out_offs) {
    out->n = 0;
    if (out_offs) out_offs->n = 0;
    const int32_t *io = in_offs ? in_offs->p : NULL;
    if (p->type == PP_SEQUENCE) {
        tk_ids cur = {0}, next = {0}, cur_o = {0}, next_o = {0};
        hr_status st = append(&cur, &cur_o, in->p, io, in->n);
        for (size_t i = 0; st == HR_OK && i < p->n_children; i++) {
            st = tk_post_process(p->children[i], &cur, &cur_o, &next, &next_o);
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
    if (p->type == PP_BYTE_LEVEL) return append(out, out_offs, in->p, io, in->n);
    for (size_t i = 0; i < p->n_items; i++) {
        const pp_item *it = &p->items[i];
        HR_TRY(it->is_seq ? append(out, out_offs, in->p, io, in->n) : append(out, out_offs, it->ids, NULL, it->n_ids));
    }
    return HR_OK;
}
