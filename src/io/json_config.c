/* Typed access to JSON configs (config.json, generation_config.json) over
 * cJSON. Model code reads its own typed struct through these getters; every
 * error names the file and the dotted field path. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "io/st_internal.h"

/* config.json files are a few KB; anything this size is not one. */
#define JSON_FILE_MAX ((size_t)64 << 20)
#define JSON_MAX_EXACT 9007199254740992.0

struct hr_json_doc {
    cJSON *root;
    char *label;
};

hr_status hr_json_doc_parse(const char *label, const char *text, size_t len, hr_json_doc **out) {
    if (!out || (!text && len)) return hr_error(HR_ERR_INVALID_ARG, "hr_json_doc_parse: NULL argument");
    *out = NULL;
    label = label ? label : "json";
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text ? text : "", len, &end, 0);
    if (!root)
        return hr_error(HR_ERR_FORMAT, "%s: not valid JSON (near byte %zu)", label,
                        end ? (size_t)(end - text) : 0);
    for (const char *p = end; p < text + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return hr_error(HR_ERR_FORMAT, "%s: trailing bytes after the JSON value (byte %zu)",
                            label, (size_t)(p - text));
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return hr_error(HR_ERR_FORMAT, "%s: the top level must be a JSON object", label);
    }
    hr_json_doc *doc = calloc(1, sizeof *doc);
    if (!doc || !(doc->label = strdup(label))) {
        free(doc);
        cJSON_Delete(root);
        return hr_error(HR_ERR_OOM, "%s: out of memory", label);
    }
    doc->root = root;
    *out = doc;
    return HR_OK;
}

hr_status hr_json_doc_load(const char *path, hr_json_doc **out) {
    if (!path || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_json_doc_load: NULL argument");
    *out = NULL;
    char *text;
    size_t len;
    HR_TRY(hr_io_read_file(path, JSON_FILE_MAX, &text, &len));
    hr_status s = hr_json_doc_parse(path, text, len, out);
    free(text);
    return s;
}

void hr_json_doc_free(hr_json_doc *doc) {
    if (!doc) return;
    cJSON_Delete(doc->root);
    free(doc->label);
    free(doc);
}

hr_json_obj hr_json_doc_root(const hr_json_doc *doc) {
    hr_json_obj o = {doc, doc ? doc->root : NULL, ""};
    return o;
}

bool hr_json_obj_present(hr_json_obj obj) { return obj.node != NULL; }

/* The value at `key`, NULL when the object is absent, the key is missing or
 * the value is null. */
static const cJSON *jget(hr_json_obj o, const char *key) {
    if (!o.node || !key) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)o.node, key);
    return cJSON_IsNull(v) ? NULL : v;
}

static hr_status jbad(hr_json_obj o, const char *key, const char *want) {
    return hr_error(HR_ERR_FORMAT, "%s: field '%s%s' must be %s", o.doc ? o.doc->label : "json",
                    o.prefix, key, want);
}

bool hr_json_has(hr_json_obj obj, const char *key) { return jget(obj, key) != NULL; }

hr_status hr_json_require(hr_json_obj obj, const char *key) {
    if (jget(obj, key)) return HR_OK;
    return hr_error(HR_ERR_NOT_FOUND, "%s: missing field '%s%s'",
                    obj.doc ? obj.doc->label : "json", obj.prefix, key);
}

static bool as_i64(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(fabs(d) <= JSON_MAX_EXACT) || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

hr_status hr_json_get_i64(hr_json_obj obj, const char *key, int64_t def, int64_t *out) {
    const cJSON *v = jget(obj, key);
    *out = def;
    if (v && !as_i64(v, out)) return jbad(obj, key, "an integer");
    return HR_OK;
}

hr_status hr_json_get_f64(hr_json_obj obj, const char *key, double def, double *out) {
    const cJSON *v = jget(obj, key);
    *out = def;
    if (!v) return HR_OK;
    if (!cJSON_IsNumber(v)) return jbad(obj, key, "a number");
    *out = v->valuedouble;
    return HR_OK;
}

hr_status hr_json_get_bool(hr_json_obj obj, const char *key, bool def, bool *out) {
    const cJSON *v = jget(obj, key);
    *out = def;
    if (!v) return HR_OK;
    if (!cJSON_IsBool(v)) return jbad(obj, key, "true or false");
    *out = cJSON_IsTrue(v);
    return HR_OK;
}

hr_status hr_json_get_str(hr_json_obj obj, const char *key, const char *def, const char **out) {
    const cJSON *v = jget(obj, key);
    *out = def;
    if (!v) return HR_OK;
    if (!cJSON_IsString(v)) return jbad(obj, key, "a string");
    *out = v->valuestring;
    return HR_OK;
}

hr_status hr_json_get_obj(hr_json_obj obj, const char *key, hr_json_obj *out) {
    const cJSON *v = jget(obj, key);
    out->doc = obj.doc;
    out->node = NULL;
    int w = snprintf(out->prefix, sizeof out->prefix, "%s%s.", obj.prefix, key ? key : "");
    if (w < 0 || (size_t)w >= sizeof out->prefix) /* deep paths keep their head */
        memcpy(out->prefix + sizeof out->prefix - 5, "...." , 5);
    if (!v) return HR_OK;
    if (!cJSON_IsObject(v)) return jbad(obj, key, "an object");
    out->node = v;
    return HR_OK;
}

/* The array at `key` when it fits `cap` entries (NULL when missing/null). */
static hr_status jarray(hr_json_obj obj, const char *key, int cap, const char *want,
                        const cJSON **arr) {
    const cJSON *v = jget(obj, key);
    *arr = v;
    if (!v) return HR_OK;
    if (!cJSON_IsArray(v)) return jbad(obj, key, want);
    int count = cJSON_GetArraySize(v);
    if (count > cap)
        return hr_error(HR_ERR_FORMAT, "%s: field '%s%s' has %d entries, at most %d are supported",
                        obj.doc ? obj.doc->label : "json", obj.prefix, key, count, cap);
    return HR_OK;
}

hr_status hr_json_get_i64_list(hr_json_obj obj, const char *key, int64_t *out, int cap, int *n) {
    static const char want[] = "an integer or a list of integers";
    const cJSON *v = jget(obj, key);
    *n = 0;
    if (cJSON_IsNumber(v)) {
        if (cap < 1 || !as_i64(v, &out[0])) return jbad(obj, key, want);
        *n = 1;
        return HR_OK;
    }
    HR_TRY(jarray(obj, key, cap, want, &v));
    int i = 0;
    for (const cJSON *e = v ? v->child : NULL; e; e = e->next, i++)
        if (!as_i64(e, &out[i])) return jbad(obj, key, want);
    *n = i;
    return HR_OK;
}

hr_status hr_json_get_f64_list(hr_json_obj obj, const char *key, double *out, int cap, int *n) {
    static const char want[] = "a list of numbers";
    const cJSON *v;
    *n = 0;
    HR_TRY(jarray(obj, key, cap, want, &v));
    int i = 0;
    for (const cJSON *e = v ? v->child : NULL; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e)) return jbad(obj, key, want);
        out[i] = e->valuedouble;
    }
    *n = i;
    return HR_OK;
}

/* ---- generation_config.json ------------------------------------------ */

void hr_generation_config_defaults(hr_generation_config *gc) {
    memset(gc, 0, sizeof *gc);
    gc->bos_token_id = -1;
    gc->pad_token_id = -1;
    gc->max_length = 20;
    gc->max_new_tokens = -1;
    gc->temperature = 1.0;
    gc->top_k = 50;
    gc->top_p = 1.0;
    gc->repetition_penalty = 1.0;
}

static hr_status gen_read(hr_json_obj o, hr_generation_config *gc) {
    HR_TRY(hr_json_get_i64(o, "bos_token_id", gc->bos_token_id, &gc->bos_token_id));
    HR_TRY(hr_json_get_i64(o, "pad_token_id", gc->pad_token_id, &gc->pad_token_id));
    HR_TRY(hr_json_get_i64_list(o, "eos_token_id", gc->eos_token_ids, HR_GEN_MAX_EOS, &gc->n_eos));
    HR_TRY(hr_json_get_i64(o, "max_length", gc->max_length, &gc->max_length));
    HR_TRY(hr_json_get_i64(o, "max_new_tokens", gc->max_new_tokens, &gc->max_new_tokens));
    HR_TRY(hr_json_get_bool(o, "do_sample", gc->do_sample, &gc->do_sample));
    HR_TRY(hr_json_get_f64(o, "temperature", gc->temperature, &gc->temperature));
    HR_TRY(hr_json_get_i64(o, "top_k", gc->top_k, &gc->top_k));
    HR_TRY(hr_json_get_f64(o, "top_p", gc->top_p, &gc->top_p));
    HR_TRY(hr_json_get_f64(o, "min_p", gc->min_p, &gc->min_p));
    return hr_json_get_f64(o, "repetition_penalty", gc->repetition_penalty,
                           &gc->repetition_penalty);
}

hr_status hr_generation_config_load(const char *path, hr_generation_config *out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_generation_config_load: out is NULL");
    hr_generation_config_defaults(out);
    hr_json_doc *doc;
    HR_TRY(hr_json_doc_load(path, &doc));
    hr_generation_config gc = *out;
    hr_status s = gen_read(hr_json_doc_root(doc), &gc);
    hr_json_doc_free(doc);
    if (s == HR_OK) *out = gc;
    return s;
}
