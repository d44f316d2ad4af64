/* The kernels lock file (kernel_lock.h). */
#include "kernels/kernel_lock.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

#define LOCK_MAX (4 << 20)

/* The lock's JSON, or NULL with an error (HR_ERR_NOT_FOUND: no file). */
static cJSON *read_lock(const char *path, hr_status *s) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *s = hr_error(errno == ENOENT ? HR_ERR_NOT_FOUND : HR_ERR_IO, "kernels lock %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(LOCK_MAX);
    size_t n = buf ? fread(buf, 1, LOCK_MAX, f) : 0;
    fclose(f);
    cJSON *root = buf && n < LOCK_MAX ? cJSON_ParseWithLength(buf, n) : NULL;
    free(buf);
    cJSON *kernels = root ? cJSON_GetObjectItemCaseSensitive(root, "kernels") : NULL;
    if (!cJSON_IsObject(kernels)) {
        cJSON_Delete(root);
        *s = hr_error(HR_ERR_FORMAT, "kernels lock %s: not a lock file (a JSON object with a 'kernels' object)", path);
        return NULL;
    }
    *s = HR_OK;
    return root;
}

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

hr_status hr_kernel_lock_check(const char *path, const hr_kernel_info *info, const hr_kernel_meta *m) {
    hr_status s;
    cJSON *root = read_lock(path, &s);
    if (!root) return s;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "kernels"), info->repo);
    const char *rev = str_of(e, "revision"), *var = str_of(e, "variant");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(e, "files");
    s = HR_OK;
    if (!cJSON_IsObject(e))
        s = hr_error(HR_ERR_PERMISSION, "kernel %s: lock mismatch: %s does not pin it (hubrt kernels lock adds it)",
                     info->repo, path);
    else if (!rev || strcmp(rev, info->revision))
        s = hr_error(HR_ERR_PERMISSION, "kernel %s: lock mismatch: %s pins revision %s, found %s", info->repo, path,
                     rev ? rev : "(none)", info->revision);
    else if (!var || strcmp(var, info->variant))
        s = hr_error(HR_ERR_PERMISSION, "kernel %s: lock mismatch: %s pins variant %s, found %s", info->repo, path,
                     var ? var : "(none)", info->variant);
    else if (!cJSON_IsObject(files) || cJSON_GetArraySize(files) != m->n_files)
        s = hr_error(HR_ERR_PERMISSION, "kernel %s: lock mismatch: %s pins %d files, metadata.json lists %d",
                     info->repo, path, cJSON_IsObject(files) ? cJSON_GetArraySize(files) : 0, m->n_files);
    for (int i = 0; s == HR_OK && i < m->n_files; i++) {
        const char *want = str_of(files, m->files[i].name);
        if (!want || strcmp(want, m->files[i].sha256))
            s = hr_error(HR_ERR_PERMISSION, "kernel %s: lock mismatch: %s pins %s at sha256 %s, found %s", info->repo,
                         path, m->files[i].name, want ? want : "(none)", m->files[i].sha256);
    }
    cJSON_Delete(root);
    return s;
}

hr_status hr_kernel_lock_write(const char *path, const hr_kernel_info *info, const hr_kernel_meta *m) {
    hr_status s;
    cJSON *root = read_lock(path, &s);
    if (!root && s != HR_ERR_NOT_FOUND) return s;
    if (!root) {
        root = cJSON_CreateObject();
        if (!root || !cJSON_AddObjectToObject(root, "kernels")) {
            cJSON_Delete(root);
            return hr_error(HR_ERR_OOM, "kernels lock: out of memory");
        }
    }
    cJSON *kernels = cJSON_GetObjectItemCaseSensitive(root, "kernels");
    cJSON_DeleteItemFromObjectCaseSensitive(kernels, info->repo);
    cJSON *e = cJSON_AddObjectToObject(kernels, info->repo);
    cJSON *files = e ? cJSON_CreateObject() : NULL;
    bool ok = e && files && cJSON_AddStringToObject(e, "revision", info->revision) &&
              cJSON_AddStringToObject(e, "variant", info->variant) && cJSON_AddNumberToObject(e, "version", (double)info->version);
    if (files && !(ok && cJSON_AddItemToObject(e, "files", files))) cJSON_Delete(files), ok = false;
    for (int i = 0; ok && i < m->n_files; i++) ok = cJSON_AddStringToObject(files, m->files[i].name, m->files[i].sha256);
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return hr_error(HR_ERR_OOM, "kernels lock: out of memory");
    /* a fresh file beside it (mkstemp: never an existing name or a link), renamed over it */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    int fd = strlen(path) < sizeof tmp - 8 ? mkstemp(tmp) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !f) close(fd);
    size_t n = strlen(text);
    bool wrote = f && fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
    if (f) wrote = (fflush(f) == 0 && fsync(fileno(f)) == 0 && fclose(f) == 0) && wrote;
    free(text);
    if (!wrote || rename(tmp, path)) {
        int err = errno;
        unlink(tmp);
        return hr_error(HR_ERR_IO, "kernels lock %s: cannot write: %s", path, strerror(err));
    }
    return HR_OK;
}
