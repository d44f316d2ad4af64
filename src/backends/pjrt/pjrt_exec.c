/* Executables: the compile options proto (encoded by hand), the in-memory
 * executable cache with its stats, HUBRT_DUMP_DIR dumps, and execution
 * (asynchronous unless HUBRT_LAUNCH_BLOCKING=1). */
#ifdef HUBRT_HAVE_PJRT
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/pjrt/pjrt_internal.h"
#include "core/error.h"

/* ---- CompileOptionsProto, protobuf wire format ------------------------- */

typedef struct {
    uint8_t b[512];
    size_t n;
} pb;

static void pb_varint(pb *p, uint64_t v) {
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        if (p->n < sizeof p->b) p->b[p->n++] = byte | (v ? 0x80 : 0);
    } while (v);
}

static void pb_int(pb *p, int field, int64_t v) {
    pb_varint(p, (uint64_t)field << 3); /* wire type 0: varint */
    pb_varint(p, (uint64_t)v);
}

static void pb_bytes(pb *p, int field, const pb *msg) {
    pb_varint(p, (uint64_t)field << 3 | 2); /* wire type 2: length-delimited */
    pb_varint(p, msg->n);
    for (size_t i = 0; i < msg->n && p->n < sizeof p->b; i++) p->b[p->n++] = msg->b[i];
}

/* CompileOptionsProto {3: ExecutableBuildOptionsProto {1: device_ordinal,
 * 4: num_replicas, 5: num_partitions, 9: DeviceAssignmentProto {1:
 * replica_count, 2: computation_count, 3: {1: replica_device_ids}}},
 * 4: compile_portable_executable}. A single-device executable is portable
 * so that one compilation runs on any device of the client. */
static void compile_options(pb *out, int num_replicas, const int *device_ids) {
    pb build = {.n = 0}, assign = {.n = 0}, comp = {.n = 0};
    pb_int(&build, 1, -1);
    pb_int(&build, 4, num_replicas);
    pb_int(&build, 5, 1);
    if (num_replicas > 1) {
        for (int i = 0; i < num_replicas; i++) pb_int(&comp, 1, device_ids[i]);
        pb_int(&assign, 1, num_replicas);
        pb_int(&assign, 2, 1);
        pb_bytes(&assign, 3, &comp);
        pb_bytes(&build, 9, &assign);
    }
    out->n = 0;
    pb_bytes(out, 3, &build);
    if (num_replicas == 1) pb_int(out, 4, 1);
}

/* ---- cache --------------------------------------------------------------- */

struct hr_pjrt_exec_entry {
    hr_pjrt_exec_entry *next;
    uint64_t hash;
    size_t key_len;
    PJRT_LoadedExecutable *exe;
    int64_t key[]; /* key_len */
};

static uint64_t key_hash(const int64_t *key, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)key;
    for (size_t i = 0; i < n * sizeof *key; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Writes the module to dir (made if needed); path receives the file name. */
static bool dump_module(const char *dir, const char *name, uint64_t hash, const char *text, char *path,
                        size_t n) {
    mkdir(dir, 0755);
    snprintf(path, n, "%s/%s-%016llx.mlir", dir, name, (unsigned long long)hash);
    FILE *f = fopen(path, "w");
    if (!f) {
        hr_log(HR_LOG_WARN, "HUBRT_DUMP_DIR: cannot write %s: %s", path, strerror(errno));
        return false;
    }
    fputs(text, f);
    fclose(f);
    return true;
}

/* Writes the module to HUBRT_DUMP_DIR when set; path receives its name. */
static bool dump_if_asked(const char *text, const char *name, uint64_t hash, char *path, size_t n) {
    const char *dir = getenv("HUBRT_DUMP_DIR");
    return dir && *dir && dump_module(dir, name, hash, text, path, n);
}

/* `dumped`: the module's file in HUBRT_DUMP_DIR, or "" when not written. */
static hr_status compile_text(hr_pjrt_plugin *p, const char *text, const char *name, uint64_t hash, const pb *opts,
                              const char *dumped, PJRT_LoadedExecutable **out) {
    static const char format[] = "mlir";
    PJRT_Program prog = {.struct_size = PJRT_Program_STRUCT_SIZE, .code = (char *)text,
                         .code_size = strlen(text), .format = format, .format_size = sizeof format - 1};
    PJRT_Client_Compile_Args ca = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE, .client = p->client,
                                   .program = &prog, .compile_options = (const char *)opts->b,
                                   .compile_options_size = opts->n};
    char what[160];
    snprintf(what, sizeof what, "StableHLO compile of '%s' failed", name);
    hr_status s = hr_pjrt_check(p, p->api->PJRT_Client_Compile(&ca), what);
    if (s != HR_OK) {
        /* Point at the module: the plugin's message names lines in it. */
        char path[768];
        bool ok = dumped[0];
        if (ok) {
            snprintf(path, sizeof path, "%s", dumped);
        } else {
            char tmp[256];
            snprintf(tmp, sizeof tmp, "%s/hubrt-dump-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
            ok = dump_module(tmp, name, hash, text, path, sizeof path);
        }
        return hr_error_context(s, "module dumped to %s", ok ? path : "(dump failed)");
    }
    *out = ca.executable;
    return HR_OK;
}

hr_status hr_pjrt_exec_get(hr_pjrt_plugin *p, const int64_t *key, size_t key_len, const char *name,
                           char *(*build)(void *ctx), void *ctx, int num_replicas, const int *device_ids,
                           PJRT_LoadedExecutable **out) {
    uint64_t h = key_hash(key, key_len);
    pthread_mutex_lock(&p->lock);
    p->stats.requests++;
    if (!p->cache) {
        p->cache_buckets = 1024;
        p->cache = calloc(p->cache_buckets, sizeof *p->cache);
    }
    hr_pjrt_exec_entry **bucket = p->cache ? &p->cache[h % p->cache_buckets] : NULL;
    for (hr_pjrt_exec_entry *e = bucket ? *bucket : NULL; e; e = e->next)
        if (e->hash == h && e->key_len == key_len && !memcmp(e->key, key, key_len * sizeof *key)) {
            p->stats.hits++;
            *out = e->exe;
            pthread_mutex_unlock(&p->lock);
            return HR_OK;
        }
    p->stats.misses++;
    if (key_len && key[0] == HR_PJRT_GRAPH_KEY) p->stats.graph_misses++;
    hr_status s = HR_OK;
    hr_pjrt_exec_entry *e = bucket ? malloc(sizeof *e + key_len * sizeof *key) : NULL;
    char *text = e ? build(ctx) : NULL;
    if (!e)
        s = hr_error(HR_ERR_OOM, "PJRT executable cache: out of memory");
    else if (!text)
        s = hr_last_error()[0] ? HR_ERR_UNSUPPORTED : hr_error(HR_ERR_INTERNAL, "%s: no module built", name);
    if (s == HR_OK) {
        pb opts;
        compile_options(&opts, num_replicas, device_ids);
        uint64_t disk_key = hr_pjrt_disk_key(p, text, opts.b, opts.n);
        char dumped[768] = "";
        if (!dump_if_asked(text, name, h, dumped, sizeof dumped)) dumped[0] = '\0';
        if (hr_pjrt_disk_load(p, disk_key, &e->exe)) {
            p->stats.disk_hits++;
        } else {
            double t0 = now_seconds();
            s = compile_text(p, text, name, h, &opts, dumped, &e->exe);
            p->stats.compile_seconds += now_seconds() - t0;
            if (s == HR_OK) hr_pjrt_disk_store(p, disk_key, e->exe);
        }
    }
    free(text);
    if (s == HR_OK) {
        e->hash = h;
        e->key_len = key_len;
        memcpy(e->key, key, key_len * sizeof *key);
        e->next = *bucket;
        *bucket = e;
        *out = e->exe;
    } else {
        free(e);
    }
    pthread_mutex_unlock(&p->lock);
    return s;
}

/* ---- execution ------------------------------------------------------------ */

static hr_status sync_locked(hr_pjrt_plugin *p) {
    hr_status s = HR_OK;
    for (int i = 0; i < p->n_pending; i++) {
        hr_status si = hr_pjrt_event_await(p, p->pending[i], "asynchronous PJRT execution failed "
                                                             "(set HUBRT_LAUNCH_BLOCKING=1 to find the op)");
        if (s == HR_OK) s = si;
    }
    p->n_pending = 0;
    return s;
}

hr_status hr_pjrt_sync(hr_pjrt_plugin *p) {
    pthread_mutex_lock(&p->lock);
    hr_status s = sync_locked(p);
    pthread_mutex_unlock(&p->lock);
    return s;
}

hr_status hr_pjrt_execute(hr_pjrt_plugin *p, PJRT_LoadedExecutable *exe, PJRT_Device *dev,
                          PJRT_Buffer *const *const *args, size_t n_dev, size_t n_args,
                          PJRT_Buffer **const *outs, const char *what) {
    PJRT_Event *events[HR_PJRT_MAX_DEVICES] = {0};
    PJRT_ExecuteOptions opts = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE};
    PJRT_LoadedExecutable_Execute_Args ea = {.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
                                             .executable = exe, .options = &opts, .argument_lists = args,
                                             .num_devices = n_dev, .num_args = n_args, .output_lists = outs,
                                             .device_complete_events = events, .execute_device = dev};
    char msg[192];
    snprintf(msg, sizeof msg, "PJRT execution of %s failed", what);
    HR_TRY(hr_pjrt_check(p, p->api->PJRT_LoadedExecutable_Execute(&ea), msg));
    hr_status s = HR_OK;
    pthread_mutex_lock(&p->lock);
    for (size_t d = 0; d < n_dev; d++) {
        if (p->launch_blocking) {
            hr_status sd = hr_pjrt_event_await(p, events[d], msg);
            if (s == HR_OK) s = sd;
            continue;
        }
        if (p->n_pending == HR_PJRT_MAX_PENDING) {
            hr_status sd = sync_locked(p);
            if (s == HR_OK) s = sd;
        }
        p->pending[p->n_pending++] = events[d];
    }
    pthread_mutex_unlock(&p->lock);
    return s;
}
#endif
