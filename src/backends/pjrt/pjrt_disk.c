/* The disk tier of the PJRT executable cache: serialized executables under
 * $HUBRT_CACHE_DIR/pjrt (default ~/.cache/hubrt/pjrt; HUBRT_CACHE=0 turns
 * it off), so a new process skips XLA compilation of modules it has seen.
 *
 * An entry is named by a hash of the module text, the compile options and
 * the plugin's identity (path, size, mtime, platform version, C API
 * version): another plugin build never matches. The file carries a magic,
 * the key and a checksum of the payload; anything that does not check out,
 * or that the plugin refuses to load, is ignored and rebuilt, never
 * trusted. Writes go to a temporary file renamed into place. */
#ifdef HUBRT_HAVE_PJRT
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/pjrt/pjrt_internal.h"
#include "core/error.h"

#define MAGIC "HRPJRT\0\1"
#define HEADER_SIZE 32 /* magic 8, key 8, payload length 8, checksum 8 */

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static bool cache_dir(char *buf, size_t n) {
    const char *off = getenv("HUBRT_CACHE");
    if (off && !strcmp(off, "0")) return false;
    const char *dir = getenv("HUBRT_CACHE_DIR"), *home = getenv("HOME");
    if (dir && *dir) return (size_t)snprintf(buf, n, "%s/pjrt", dir) < n;
    return home && *home && (size_t)snprintf(buf, n, "%s/.cache/hubrt/pjrt", home) < n;
}

uint64_t hr_pjrt_disk_key(const hr_pjrt_plugin *p, const char *text, const void *opts, size_t opts_len) {
    uint64_t h = 1469598103934665603ull;
    struct stat st;
    if (stat(p->info.path, &st) == 0) {
        int64_t id[2] = {(int64_t)st.st_size, (int64_t)st.st_mtime};
        h = fnv(h, id, sizeof id);
    }
    h = fnv(h, p->info.path, strlen(p->info.path));
    h = fnv(h, p->info.version, strlen(p->info.version));
    int api[2] = {p->info.api_major, p->info.api_minor};
    h = fnv(h, api, sizeof api);
    h = fnv(h, opts, opts_len);
    return fnv(h, text, strlen(text));
}

static void entry_path(const hr_pjrt_plugin *p, const char *dir, uint64_t key, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s-%016llx.bin", dir, p->backend, (unsigned long long)key);
}

static unsigned char *read_entry(const char *path, uint64_t key, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char head[HEADER_SIZE];
    unsigned char *payload = NULL;
    uint64_t k, n, sum;
    if (fread(head, 1, HEADER_SIZE, f) == HEADER_SIZE && !memcmp(head, MAGIC, 8)) {
        memcpy(&k, head + 8, 8);
        memcpy(&n, head + 16, 8);
        memcpy(&sum, head + 24, 8);
        if (k == key && n > 0 && n < ((uint64_t)1 << 34) && (payload = malloc(n)) &&
            (fread(payload, 1, n, f) != n || fgetc(f) != EOF || fnv(1469598103934665603ull, payload, n) != sum)) {
            free(payload);
            payload = NULL;
        }
        *len = (size_t)n;
    }
    fclose(f);
    if (!payload) hr_log(HR_LOG_WARN, "PJRT disk cache: ignoring %s (corrupt, truncated or stale); recompiling", path);
    return payload;
}

bool hr_pjrt_disk_load(hr_pjrt_plugin *p, uint64_t key, PJRT_LoadedExecutable **out) {
    char dir[512], path[640];
    if (!cache_dir(dir, sizeof dir)) return false;
    entry_path(p, dir, key, path, sizeof path);
    if (access(path, R_OK) != 0) return false;
    size_t len = 0;
    unsigned char *payload = read_entry(path, key, &len);
    if (!payload) return false;
    PJRT_Executable_DeserializeAndLoad_Args a = {.struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE,
                                                 .client = p->client, .serialized_executable = (const char *)payload,
                                                 .serialized_executable_size = len};
    hr_status s = hr_pjrt_check(p, p->api->PJRT_Executable_DeserializeAndLoad(&a), "PJRT disk cache");
    free(payload);
    if (s != HR_OK) {
        hr_log(HR_LOG_WARN, "PJRT disk cache: the plugin refused %s (%s); recompiling", path, hr_last_error());
        return false;
    }
    *out = a.loaded_executable;
    return true;
}

static bool write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }

void hr_pjrt_disk_store(hr_pjrt_plugin *p, uint64_t key, PJRT_LoadedExecutable *exe) {
    char dir[512], path[640], tmp[700];
    if (!cache_dir(dir, sizeof dir)) return;
    PJRT_LoadedExecutable_GetExecutable_Args g = {.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE,
                                                  .loaded_executable = exe};
    if (hr_pjrt_check(p, p->api->PJRT_LoadedExecutable_GetExecutable(&g), "PJRT disk cache") != HR_OK) return;
    PJRT_Executable_Serialize_Args sa = {.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE,
                                         .executable = g.executable};
    hr_status s = hr_pjrt_check(p, p->api->PJRT_Executable_Serialize(&sa), "PJRT disk cache: serialize");
    PJRT_Executable_Destroy_Args d = {.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE,
                                      .executable = g.executable};
    if (s != HR_OK) {
        hr_log(HR_LOG_DEBUG, "%s", hr_last_error());
        hr_pjrt_check(p, p->api->PJRT_Executable_Destroy(&d), "PJRT_Executable_Destroy");
        return;
    }
    /* mkdir -p of the cache folder and its pjrt/ child */
    char parent[512];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = '\0', mkdir(parent, 0755);
    mkdir(dir, 0755);
    entry_path(p, dir, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    uint64_t n = sa.serialized_bytes_size, sum = fnv(1469598103934665603ull, sa.serialized_bytes, n);
    FILE *f = fopen(tmp, "wb");
    bool ok = f && write_all(f, MAGIC, 8) && write_all(f, &key, 8) && write_all(f, &n, 8) && write_all(f, &sum, 8) &&
              write_all(f, sa.serialized_bytes, n);
    if (f && fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        hr_log(HR_LOG_WARN, "PJRT disk cache: cannot write %s: %s", path, strerror(errno));
        remove(tmp);
    }
    sa.serialized_executable_deleter(sa.serialized_executable);
    hr_pjrt_check(p, p->api->PJRT_Executable_Destroy(&d), "PJRT_Executable_Destroy");
}
#endif
