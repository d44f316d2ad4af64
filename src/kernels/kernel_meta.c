/* metadata.json of a kernel package, checked field by field: every string
 * has a bound, every file name is a plain name in its variant folder, every
 * digest is 64 lowercase hex digits. */
#include "kernels/kernel_meta.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

static hr_status get_str(const char *label, const cJSON *root, const char *key, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v) return hr_error(HR_ERR_FORMAT, "%s: no '%s'", label, key);
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return hr_error(HR_ERR_FORMAT, "%s: '%s' must be a non-empty string", label, key);
    if (strlen(v->valuestring) >= cap)
        return hr_error(HR_ERR_FORMAT, "%s: '%s' is over %zu bytes", label, key, cap - 1);
    snprintf(out, cap, "%s", v->valuestring);
    return HR_OK;
}

static hr_status get_int(const char *label, const cJSON *root, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v) return hr_error(HR_ERR_FORMAT, "%s: no '%s'", label, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1e300;
    /* the range first: the cast of a double outside int64 is undefined */
    if (!cJSON_IsNumber(v) || !(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d)
        return hr_error(HR_ERR_FORMAT, "%s: '%s' must be an integer from %lld to %lld", label, key, (long long)lo,
                        (long long)hi);
    *out = (int64_t)d;
    return HR_OK;
}

static bool plain_name(const char *s) {
    size_t n = strlen(s);
    if (!n || n > 255 || s[0] == '.') return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '/' || s[i] == '\\' || (unsigned char)s[i] < 0x20) return false;
    return true;
}

static bool hex64(const char *s) {
    if (strlen(s) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

static hr_status parse_files(const char *label, const cJSON *root, hr_kernel_meta *m) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsObject(files) || !files->child)
        return hr_error(HR_ERR_FORMAT, "%s: 'files' must be an object naming each file and its sha256", label);
    for (const cJSON *f = files->child; f; f = f->next) {
        if (m->n_files == HR_KMETA_MAX_FILES)
            return hr_error(HR_ERR_FORMAT, "%s: 'files' lists over %d files", label, HR_KMETA_MAX_FILES);
        if (!f->string || !plain_name(f->string))
            return hr_error(HR_ERR_FORMAT, "%s: 'files' has an entry that is not a plain file name of its folder",
                            label);
        for (int i = 0; i < m->n_files; i++)
            if (!strcmp(m->files[i].name, f->string))
                return hr_error(HR_ERR_FORMAT, "%s: 'files' lists '%s' twice", label, f->string);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(f, "sha256");
        if (!cJSON_IsString(d) || !hex64(d->valuestring))
            return hr_error(HR_ERR_FORMAT, "%s: 'files.%s.sha256' must be 64 lowercase hex digits", label, f->string);
        snprintf(m->files[m->n_files].name, sizeof m->files[0].name, "%s", f->string);
        snprintf(m->files[m->n_files].sha256, sizeof m->files[0].sha256, "%s", d->valuestring);
        m->n_files++;
    }
    return HR_OK;
}

hr_status hr_kernel_meta_parse(const char *label, const char *text, size_t len, hr_kernel_meta *out) {
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return hr_error(HR_ERR_FORMAT, "%s: not valid JSON", label);
    hr_status s = cJSON_IsObject(root) ? HR_OK : hr_error(HR_ERR_FORMAT, "%s: not a JSON object", label);
    if (s == HR_OK) s = get_str(label, root, "id", out->id, sizeof out->id);
    if (s == HR_OK) s = get_str(label, root, "name", out->name, sizeof out->name);
    if (s == HR_OK) s = get_int(label, root, "version", 1, 1 << 30, &out->version);
    if (s == HR_OK) s = get_str(label, root, "license", out->license, sizeof out->license);
    if (s == HR_OK) s = get_str(label, root, "backend", out->backend, sizeof out->backend);
    if (s == HR_OK) s = get_int(label, root, "abi", 0, 1 << 30, &out->abi);
    if (s == HR_OK) s = parse_files(label, root, out);
    cJSON_Delete(root);
    return s;
}
