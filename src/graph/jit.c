/* hr_jit: compile once per input signature, cache in memory and on disk,
 * replay. On a device with a graph compiler (vt->compile: the PJRT
 * devices) the plan is handed to it and each call is one execution of the
 * device's executable; elsewhere the plan is replayed op by op. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/grow.h"
#include "core/hash.h"
#include "device/device_impl.h"
#include "graph/disk_cache.h"
#include "graph/plan.h"
#include "hubrt/graph.h"
#include "hubrt/runtime.h"

#define SIG_MAX (2 + HR_JIT_MAX_IO * (3 + 2 * HR_MAX_DIMS))

typedef struct jit_entry {
    uint64_t key;
    int sig_len;
    int64_t sig[SIG_MAX];
    hr_plan *plan;
    hr_executable *exe; /* the device's compiled plan, NULL: replay the plan */
} jit_entry;

struct hr_jit {
    hr_jit_options opts;
    char name[96];
    pthread_mutex_t lock;
    jit_entry *entries;
    int n_entries, cap_entries;
    bool warned_recompile;
    /* the last replay's output buffers, reused by the next replay once the
     * caller has freed its tensors (hr_plan_run) */
    hr_buffer *recycle[HR_JIT_MAX_IO];
};

static pthread_mutex_t g_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static hr_compile_stats g_stats;

void hr_compile_stats_get(hr_compile_stats *out) {
    pthread_mutex_lock(&g_stats_lock);
    *out = g_stats;
    pthread_mutex_unlock(&g_stats_lock);
}

void hr_compile_stats_reset(void) {
    pthread_mutex_lock(&g_stats_lock);
    memset(&g_stats, 0, sizeof g_stats);
    pthread_mutex_unlock(&g_stats_lock);
}

static void stats_add(int64_t hits, int64_t disk_hits, int64_t compiles, int64_t rejects, double ms) {
    pthread_mutex_lock(&g_stats_lock);
    g_stats.requests += hits + disk_hits + compiles;
    g_stats.hits += hits;
    g_stats.disk_hits += disk_hits;
    g_stats.compiles += compiles;
    g_stats.disk_rejects += rejects;
    g_stats.compile_ms += ms;
    pthread_mutex_unlock(&g_stats_lock);
}

void hr_compile_stats_note_reject(void) { stats_add(0, 0, 0, 1, 0); }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int env_int(const char *name, int def) {
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    long v = strtol(s, &end, 10);
    return *end ? def : (int)v;
}

hr_status hr_jit_create(const hr_jit_options *opts, hr_jit **out) {
    if (!opts || !opts->fn || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_jit_create: NULL argument");
    hr_jit *j = calloc(1, sizeof *j);
    if (!j) return hr_error(HR_ERR_OOM, "hr_jit_create: out of memory");
    j->opts = *opts;
    snprintf(j->name, sizeof j->name, "%s", opts->name ? opts->name : "fn");
    j->opts.name = j->name;
    pthread_mutex_init(&j->lock, NULL);
    *out = j;
    return HR_OK;
}

void hr_jit_free(hr_jit *j) {
    if (!j) return;
    for (int i = 0; i < j->n_entries; i++) {
        jit_entry *e = &j->entries[i];
        if (e->exe) e->plan->device->vt->executable_free(e->plan->device, e->exe);
        hr_plan_free(e->plan);
    }
    for (int i = 0; i < HR_JIT_MAX_IO; i++) hr_buffer_release(j->recycle[i]);
    free(j->entries);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

int hr_jit_num_plans(const hr_jit *j) { return j->n_entries; }

/* The input signature: what a plan is specialised to. */
static int signature(const hr_tensor *const *in, int n_in, int n_out, int64_t *sig) {
    int n = 0;
    sig[n++] = n_in;
    sig[n++] = n_out;
    for (int i = 0; i < n_in; i++) {
        const hr_tensor *t = in[i];
        sig[n++] = t->dtype;
        sig[n++] = t->ndim;
        sig[n++] = (int64_t)(intptr_t)t->buf->device;
        for (int d = 0; d < t->ndim; d++) sig[n++] = t->shape[d];
        for (int d = 0; d < t->ndim; d++) sig[n++] = t->strides[d];
    }
    return n;
}

/* Disk key: everything a plan depends on that is the same across processes
 * (device pointers are replaced by backend name and index). */
static uint64_t disk_key(const hr_jit *j, const hr_tensor *const *in, int n_in, int n_out) {
    uint64_t h = HR_FNV_OFFSET;
    h = hr_fnv1a(h, j->name, strlen(j->name));
    h = hr_fnv1a(h, &j->opts.fingerprint, sizeof j->opts.fingerprint);
    h = hr_fnv1a(h, HUBRT_VERSION_STRING, strlen(HUBRT_VERSION_STRING));
    /* a development build keeps the version string: the build ID changes
     * with any change to the code that captured the plan */
    h = hr_fnv1a(h, hr_build_id(), strlen(hr_build_id()));
    int isa = hr_cpu_isa_get();
    h = hr_fnv1a(h, &isa, sizeof isa);
    int head[2] = {n_in, n_out};
    h = hr_fnv1a(h, head, sizeof head);
    for (int i = 0; i < n_in; i++) {
        const hr_tensor *t = in[i];
        int64_t meta[3 + 2 * HR_MAX_DIMS] = {t->dtype, t->ndim, t->buf->device->index};
        for (int d = 0; d < t->ndim; d++) meta[3 + d] = t->shape[d], meta[3 + HR_MAX_DIMS + d] = t->strides[d];
        h = hr_fnv1a(h, meta, sizeof meta);
        h = hr_fnv1a(h, t->buf->device->backend, strlen(t->buf->device->backend));
    }
    return h;
}

static void warn_recompile(hr_jit *j, const int64_t *sig, const hr_tensor *const *in, int n_in) {
    int limit = env_int("HUBRT_RECOMPILE_LIMIT", 8);
    if (j->warned_recompile || j->n_entries <= limit) return;
    j->warned_recompile = true;
    /* Name the input whose shape differs from the previous plan's. */
    const jit_entry *prev = &j->entries[j->n_entries - 2];
    int changed = -1;
    for (int i = 0, pos = 2, ppos = 2; i < n_in && changed < 0; i++) {
        int nd = in[i]->ndim;
        if (ppos + 3 > prev->sig_len || prev->sig[ppos + 1] != nd ||
            memcmp(&prev->sig[ppos + 3], &sig[pos + 3], sizeof(int64_t) * (size_t)nd))
            changed = i;
        pos += 3 + 2 * nd;
        ppos += 3 + 2 * (int)prev->sig[ppos + 1];
    }
    char shape[160] = "?";
    if (changed >= 0) hr_shape_str(in[changed]->ndim, in[changed]->shape, shape, sizeof shape);
    hr_log(HR_LOG_WARN,
           "compiled function '%s' has been compiled %d times (limit %d, HUBRT_RECOMPILE_LIMIT); "
           "input %d changed shape, now %s: dynamic shapes recompile, pad inputs to a few fixed sizes",
           j->name, j->n_entries, limit, changed, shape);
}

static hr_status add_entry(hr_jit *j, uint64_t key, const int64_t *sig, int sig_len, hr_plan *plan,
                           hr_executable *exe) {
    jit_entry *grown = hr_grow(j->entries, j->n_entries, &j->cap_entries, sizeof *grown, 8);
    if (!grown) return hr_error(HR_ERR_OOM, "jit: out of memory");
    j->entries = grown;
    jit_entry *e = &j->entries[j->n_entries++];
    e->key = key;
    e->sig_len = sig_len;
    memcpy(e->sig, sig, sizeof(int64_t) * (size_t)sig_len);
    e->plan = plan;
    e->exe = exe;
    return HR_OK;
}

static hr_status capture_and_plan(hr_jit *j, const hr_tensor *const *in, int n_in, hr_tensor **outs,
                                  int n_out, hr_plan **plan) {
    hr_capture cap;
    HR_TRY(hr_capture_begin(&cap, in, n_in));
    for (int i = 0; i < n_out; i++) outs[i] = NULL;
    hr_status s = j->opts.fn(j->opts.ctx, in, n_in, outs, n_out);
    hr_status e = hr_capture_end(&cap, outs, s == HR_OK ? n_out : 0);
    if (s == HR_OK && e != HR_OK) s = hr_error_context(e, "compiled function '%s'", j->name);
    if (s == HR_OK) s = hr_plan_build(&cap, outs, n_in, n_out, j->opts.fold_constants, plan);
    hr_capture_free(&cap);
    if (s != HR_OK)
        for (int i = 0; i < n_out; i++) {
            hr_tensor_free(outs[i]);
            outs[i] = NULL;
        }
    return s;
}

/* Hands the plan to its device's graph compiler, when it has one. A graph
 * the device cannot lower whole is replayed op by op, with one warning. */
static hr_status compile_on_device(hr_jit *j, hr_plan *plan, hr_executable **exe) {
    *exe = NULL;
    hr_device *dev = plan->device;
    if (!dev->vt->compile) return HR_OK;
    hr_status s = dev->vt->compile(dev, plan, j->name, exe);
    if (s == HR_ERR_UNSUPPORTED) {
        hr_log(HR_LOG_WARN, "compiled function '%s' replays op by op on %s: %s", j->name, dev->backend,
               hr_last_error());
        s = HR_OK;
    }
    return s;
}

static hr_status run_entry(hr_jit *j, const jit_entry *e, const hr_tensor *const *in, int n_in, hr_tensor **outs,
                           int n_out) {
    hr_device *dev = e->plan->device;
    return e->exe ? dev->vt->execute(dev, e->exe, in, n_in, outs, n_out) : hr_plan_run(e->plan, in, outs, j->recycle);
}

static void free_entry(hr_plan *plan, hr_executable *exe) {
    if (exe) plan->device->vt->executable_free(plan->device, exe);
    hr_plan_free(plan);
}

hr_status hr_jit_call(hr_jit *j, const hr_tensor *const *in, int n_in, hr_tensor **outs, int n_out) {
    if (!j || !outs || (n_in && !in)) return hr_error(HR_ERR_INVALID_ARG, "hr_jit_call: NULL argument");
    if (n_in > HR_JIT_MAX_IO || n_out > HR_JIT_MAX_IO || n_out < 1)
        return hr_error(HR_ERR_INVALID_ARG, "hr_jit_call: %d inputs, %d outputs (1..%d outputs, <= %d inputs)",
                        n_in, n_out, HR_JIT_MAX_IO, HR_JIT_MAX_IO);
    for (int i = 0; i < n_in; i++)
        if (!in[i]) return hr_error(HR_ERR_INVALID_ARG, "hr_jit_call '%s': input %d is NULL", j->name, i);
    if (env_int("HUBRT_LAUNCH_BLOCKING", 0)) {
        for (int i = 0; i < n_out; i++) outs[i] = NULL;
        return j->opts.fn(j->opts.ctx, in, n_in, outs, n_out);
    }
    int64_t sig[SIG_MAX];
    int sig_len = signature(in, n_in, n_out, sig);
    pthread_mutex_lock(&j->lock);
    hr_status s = HR_OK;
    jit_entry *hit = NULL;
    for (int i = 0; i < j->n_entries && !hit; i++)
        if (j->entries[i].sig_len == sig_len && !memcmp(j->entries[i].sig, sig, sizeof(int64_t) * (size_t)sig_len))
            hit = &j->entries[i];
    if (hit) {
        stats_add(1, 0, 0, 0, 0);
        s = run_entry(j, hit, in, n_in, outs, n_out);
        pthread_mutex_unlock(&j->lock);
        return s;
    }
    uint64_t key = disk_key(j, in, n_in, n_out);
    hr_plan *plan = NULL;
    hr_executable *exe = NULL;
    double t0 = now_ms();
    if (j->opts.resolve && hr_disk_cache_enabled() &&
        hr_disk_cache_load(key, j->name, j->opts.resolve, j->opts.resolve_ctx, j->opts.fold_constants, in, n_in,
                           n_out, &plan) == HR_OK) {
        s = compile_on_device(j, plan, &exe);
        if (s == HR_OK) s = add_entry(j, key, sig, sig_len, plan, exe);
        if (s == HR_OK) {
            /* the device's share: its executable cache may have it on disk too */
            stats_add(0, 1, 0, 0, exe ? now_ms() - t0 : 0);
            s = run_entry(j, &j->entries[j->n_entries - 1], in, n_in, outs, n_out);
        } else {
            free_entry(plan, exe);
        }
        pthread_mutex_unlock(&j->lock);
        return s;
    }
    s = capture_and_plan(j, in, n_in, outs, n_out, &plan);
    /* A device with a graph compiler only recorded during the capture: the
     * outputs it left are not computed, the executable (or plan) runs now. */
    bool rerun = s == HR_OK && plan->device->vt->compile;
    if (rerun)
        for (int i = 0; i < n_out; i++) {
            hr_tensor_free(outs[i]);
            outs[i] = NULL;
        }
    if (s == HR_OK) s = compile_on_device(j, plan, &exe);
    if (s == HR_OK) s = add_entry(j, key, sig, sig_len, plan, exe);
    if (s == HR_OK) {
        double ms = now_ms() - t0;
        stats_add(0, 0, 1, 0, ms);
        hr_log(HR_LOG_DEBUG, "compiled '%s': %d ops, arena %zu bytes, %s, %.1f ms", j->name, plan->n_nodes,
               plan->arena_size, exe ? "one device executable" : "replayed op by op", ms);
        warn_recompile(j, sig, in, n_in);
        if (j->opts.resolve && hr_disk_cache_enabled())
            hr_disk_cache_store(key, j->name, plan, j->opts.resolve, j->opts.resolve_ctx);
        if (rerun) s = run_entry(j, &j->entries[j->n_entries - 1], in, n_in, outs, n_out);
    } else if (plan) {
        free_entry(plan, exe);
        for (int i = 0; i < n_out; i++) {
            hr_tensor_free(outs[i]);
            outs[i] = NULL;
        }
    }
    pthread_mutex_unlock(&j->lock);
    return s;
}
