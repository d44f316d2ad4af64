/* cJSON field access with errors that name the component and field. */
#include <string.h>

#include "tokenizer/tk_internal.h"

const cJSON *tk_json_get(const cJSON *obj, const char *key) {
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

hr_status tk_json_string(const cJSON *obj, const char *key, const char *what, const char **out) {
    const cJSON *v = tk_json_get(obj, key);
    if (!cJSON_IsString(v)) return hr_error(HR_ERR_FORMAT, "%s: field '%s' must be a string", what, key);
    *out = v->valuestring;
    return HR_OK;
}

hr_status tk_json_opt_string(const cJSON *obj, const char *key, const char *what, const char **out) {
    const cJSON *v = tk_json_get(obj, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return HR_OK;
    if (!cJSON_IsString(v)) return hr_error(HR_ERR_FORMAT, "%s: field '%s' must be a string or null", what, key);
    *out = v->valuestring;
    return HR_OK;
}

bool tk_json_bool(const cJSON *obj, const char *key, bool dflt) {
    const cJSON *v = tk_json_get(obj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

const char *tk_json_type(const cJSON *obj) {
    const cJSON *t = tk_json_get(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

hr_status tk_json_type_index(const cJSON *obj, const char *const *names, int n, const char *what, int *index) {
    const char *type = tk_json_type(obj);
    if (!type) return hr_error(HR_ERR_FORMAT, "%s: missing string field 'type'", what);
    for (int i = 0; i < n; i++)
        if (names[i] && !strcmp(names[i], type)) {
            *index = i;
            return HR_OK;
        }
    return hr_error(HR_ERR_UNSUPPORTED, "unsupported %s '%s'", what, type);
}
