/* Post-processors: TemplateProcessing, BertProcessing, RobertaProcessing,
 * ByteLevel (ids unchanged, offsets trimmed) and Sequence, for one sequence
 * or a pair. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_internal.h"

typedef enum { PP_TEMPLATE, PP_BERT, PP_ROBERTA, PP_BYTE_LEVEL, PP_SEQUENCE } pp_type;

/* One template item: sequence 'A' or 'B', or special ids (seq == 0). */
typedef struct {
    char seq;
    int32_t type_id;
    int32_t *ids;
    size_t n_ids;
} pp_item;

typedef struct {
    pp_item *v;
    size_t n;
} pp_items;

struct tk_post {
    pp_type type;
    bool trim_offsets, add_prefix_space; /* ByteLevel, Roberta */
    pp_items single, pair; /* templates (Bert and Roberta ones are built) */
    tk_post **children; /* Sequence (n_children) */
    size_t n_children;
};

void tk_post_free(tk_post *p) {
    if (!p) return;
    for (size_t i = 0; i < p->single.n; i++) free(p->single.v[i].ids);
    for (size_t i = 0; i < p->pair.n; i++) free(p->pair.v[i].ids);
    free(p->single.v);
    free(p->pair.v);
    for (size_t i = 0; i < p->n_children; i++) tk_post_free(p->children[i]);
    free(p->children);
    free(p);
}

static hr_status add_item(pp_items *l, char seq, int32_t type_id, const int32_t *ids, size_t n) {
    pp_item *items = realloc(l->v, (l->n + 1) * sizeof *items);
    if (!items) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    l->v = items;
    pp_item *it = &items[l->n++];
    *it = (pp_item){seq, type_id, NULL, n};
    if (n) {
        it->ids = malloc(n * sizeof *ids);
        if (!it->ids) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        memcpy(it->ids, ids, n * sizeof *ids);
    }
    return HR_OK;
}

static int32_t type_id_of(const cJSON *item) {
    const cJSON *t = tk_json_get(item, "type_id");
    return cJSON_IsNumber(t) ? (int32_t)t->valuedouble : 0;
}

static hr_status parse_template(const cJSON *j, const char *field, const cJSON *specials, pp_items *out) {
    const cJSON *list = tk_json_get(j, field), *it;
    if (!list && !strcmp(field, "pair")) return HR_OK; /* pairs then fail when asked for */
    if (!cJSON_IsArray(list))
        return hr_error(HR_ERR_FORMAT, "post-processor 'TemplateProcessing': field '%s' must be an array", field);
    cJSON_ArrayForEach(it, list) {
        const cJSON *sp = tk_json_get(it, "SpecialToken"), *seq = tk_json_get(it, "Sequence");
        if (seq) {
            const cJSON *which = tk_json_get(seq, "id");
            char c = cJSON_IsString(which) && !strcmp(which->valuestring, "B") ? 'B' : 'A';
            HR_TRY(add_item(out, c, type_id_of(seq), NULL, 0));
            continue;
        }
        const cJSON *name = tk_json_get(sp, "id");
        if (!cJSON_IsString(name))
            return hr_error(HR_ERR_FORMAT, "post-processor 'TemplateProcessing': '%s' items must be Sequence or SpecialToken",
                            field);
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
        HR_TRY(add_item(out, 0, type_id_of(sp), buf, n));
    }
    return HR_OK;
}

/* BertProcessing / RobertaProcessing: "cls": [token, id], "sep": [token, id]. */
/* Bert: [CLS] A [SEP] B:1 [SEP]:1. Roberta: <s> A </s> </s> B </s>, all type 0. */
static hr_status build_cls_sep(tk_post *p, int32_t cls, int32_t sep) {
    int32_t b = p->type == PP_BERT ? 1 : 0;
    HR_TRY(add_item(&p->single, 0, 0, &cls, 1));
    HR_TRY(add_item(&p->single, 'A', 0, NULL, 0));
    HR_TRY(add_item(&p->single, 0, 0, &sep, 1));
    HR_TRY(add_item(&p->pair, 0, 0, &cls, 1));
    HR_TRY(add_item(&p->pair, 'A', 0, NULL, 0));
    HR_TRY(add_item(&p->pair, 0, 0, &sep, 1));
    if (p->type == PP_ROBERTA) HR_TRY(add_item(&p->pair, 0, 0, &sep, 1));
    HR_TRY(add_item(&p->pair, 'B', b, NULL, 0));
    return add_item(&p->pair, 0, b, &sep, 1);
}

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
        const cJSON *specials = tk_json_get(j, "special_tokens");
        st = parse_template(j, "single", specials, &p->single);
        if (st == HR_OK) st = parse_template(j, "pair", specials, &p->pair);
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        p->type = type[0] == 'B' ? PP_BERT : PP_ROBERTA;
        p->trim_offsets = p->type == PP_ROBERTA && tk_json_bool(j, "trim_offsets", true);
        p->add_prefix_space = tk_json_bool(j, "add_prefix_space", true);
        int32_t cls = 0, sep = 0;
        if ((st = pair_id(j, "cls", type, &cls)) == HR_OK && (st = pair_id(j, "sep", type, &sep)) == HR_OK)
            st = build_cls_sep(p, cls, sep);
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
    for (size_t i = 0; st == HR_OK && i < p->single.n; i++) {
        const pp_item *it = &p->single.v[i];
        st = it->seq ? append(out, out_offs, seq.p, out_offs ? seq_o.p : NULL, seq.n)
                     : append(out, out_offs, it->ids, NULL, it->n_ids);
    }
    tk_ids_free(&seq);
    tk_ids_free(&seq_o);
    return st;
}

static hr_status push_types(tk_ids *types, int32_t t, size_t n) {
    for (size_t i = 0; types && i < n; i++) HR_TRY(tk_ids_push(types, t));
    return HR_OK;
}

hr_status tk_post_process_pair(const tk_post *p, bool add_special, const tk_ids *a, const tk_ids *b, tk_ids *out,
                               tk_ids *types) {
    out->n = 0;
    if (types) types->n = 0;
    /* In a Sequence the first processor that is not ByteLevel joins the pair. */
    while (p && p->type == PP_SEQUENCE) {
        const tk_post *next = NULL;
        for (size_t i = 0; !next && i < p->n_children; i++)
            if (p->children[i]->type != PP_BYTE_LEVEL) next = p->children[i];
        p = next;
    }
    bool roberta = p && p->type == PP_ROBERTA;
    if (!p || p->type == PP_BYTE_LEVEL || !add_special) {
        HR_TRY(tk_ids_append(out, a->p, a->n));
        HR_TRY(tk_ids_append(out, b->p, b->n));
        HR_TRY(push_types(types, 0, a->n));
        return push_types(types, roberta ? 0 : 1, b->n);
    }
    if (!p->pair.n) return hr_error(HR_ERR_UNSUPPORTED, "post-processor 'TemplateProcessing' has no 'pair' template");
    for (size_t i = 0; i < p->pair.n; i++) {
        const pp_item *it = &p->pair.v[i];
        const tk_ids *seq = it->seq == 'A' ? a : b;
        const int32_t *ids = it->seq ? seq->p : it->ids;
        size_t n = it->seq ? seq->n : it->n_ids;
        HR_TRY(tk_ids_append(out, ids, n));
        HR_TRY(push_types(types, it->type_id, n));
    }
    return HR_OK;
}
