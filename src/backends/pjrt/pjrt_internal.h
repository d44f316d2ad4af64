/* PJRT backend internals shared by the plugin, executable and device
 * files. Only compiled with the PJRT C API header (HUBRT_HAVE_PJRT). */
#ifndef HR_PJRT_INTERNAL_H
#define HR_PJRT_INTERNAL_H

#include <pthread.h>

#include <pjrt_c_api.h>

#include "backends/pjrt/pjrt.h"

#define HR_PJRT_MAX_DEVICES 64
#define HR_PJRT_MAX_PENDING 64

typedef struct hr_pjrt_exec_entry hr_pjrt_exec_entry;

/* One loaded plugin with its client; shared by the backend's devices. */
typedef struct hr_pjrt_plugin {
    const char *backend;           /* "xla_cpu", "tpu" */
    const PJRT_Api *api;
    void *dl;
    PJRT_Client *client;
    PJRT_Device *devices[HR_PJRT_MAX_DEVICES]; /* addressable devices */
    hr_device hr_devices[HR_PJRT_MAX_DEVICES];
    int num_devices;
    hr_pjrt_info info;
    pthread_mutex_t lock; /* cache, stats and pending events */
    hr_pjrt_exec_entry **cache; /* hash buckets */
    size_t cache_buckets;
    hr_pjrt_cache_stats stats;
    PJRT_Event *pending[HR_PJRT_MAX_PENDING]; /* executions not yet awaited */
    int n_pending;
    bool launch_blocking; /* HUBRT_LAUNCH_BLOCKING=1 */
} hr_pjrt_plugin;

/* ---- plugin (pjrt_plugin.c) ---- */

/* The backend's plugin, loaded and its client created on first use. */
hr_status hr_pjrt_plugin_get(const char *backend, hr_pjrt_plugin **out);
/* Reads api->pjrt_api_version and refuses another major version. */
hr_status hr_pjrt_api_check(const PJRT_Api *api, const char *path);
/* Converts a PJRT error into an hr_status with "what: message"; frees it. */
hr_status hr_pjrt_check(const hr_pjrt_plugin *p, PJRT_Error *err, const char *what);
hr_status hr_pjrt_event_await(const hr_pjrt_plugin *p, PJRT_Event *ev, const char *what);
void hr_pjrt_buffer_destroy(const hr_pjrt_plugin *p, PJRT_Buffer *buf);
/* The plugin of a device of a PJRT backend. */
static inline hr_pjrt_plugin *hr_pjrt_of(const hr_device *dev) { return dev->impl; }
static inline PJRT_Device *hr_pjrt_device_of(const hr_device *dev) {
    return hr_pjrt_of(dev)->devices[dev->index];
}

/* ---- buffers (pjrt_device.c) ---- */

/* What hr_buffer.data points at: the buffer's current device array (NULL
 * until first written). */
typedef struct hr_pjrt_slot {
    PJRT_Buffer *pb;
} hr_pjrt_slot;

/* The device array behind an hr_buffer, created (zero-filled) if nothing
 * wrote it yet. */
hr_status hr_pjrt_buffer_get(hr_buffer *buf, PJRT_Buffer **out);
/* Replaces the device array behind buf (destroying the old one). */
void hr_pjrt_buffer_set(hr_buffer *buf, PJRT_Buffer *pb);
/* A device buffer of raw bytes (ui8[n]) on dev. */
hr_status hr_pjrt_upload(hr_device *dev, const void *data, int64_t nbytes, PJRT_Buffer **out);
hr_status hr_pjrt_upload_i64(hr_device *dev, int64_t value, PJRT_Buffer **out);

/* ---- executables (pjrt_exec.c) ---- */

/* A compiled module from the cache, or compiled now from `text` on a miss
 * (text is then dumped to HUBRT_DUMP_DIR). `key` identifies the module. */
hr_status hr_pjrt_exec_get(hr_pjrt_plugin *p, const int64_t *key, size_t key_len, const char *name,
                           char *(*build)(void *ctx), void *ctx, int num_replicas,
                           const int *device_ids, PJRT_LoadedExecutable **out);
/* Runs exe on n_dev devices (args [n_dev][n_args], outs [n_dev][n_out]).
 * `dev` non-NULL runs a single-device (portable) executable on it. */
hr_status hr_pjrt_execute(hr_pjrt_plugin *p, PJRT_LoadedExecutable *exe, PJRT_Device *dev,
                          PJRT_Buffer *const *const *args, size_t n_dev, size_t n_args,
                          PJRT_Buffer **const *outs, const char *what);
/* Awaits every execution still running. */
hr_status hr_pjrt_sync(hr_pjrt_plugin *p);
/* ---- compiled graphs (pjrt_graph.c): the vtable's compile/execute ---- */

/* key[0] of a compiled graph in the executable cache (ops use their op
 * number, all_reduce -1). */
#define HR_PJRT_GRAPH_KEY (-2)

hr_status hr_pjrt_compile(hr_device *dev, const hr_plan *g, const char *name, hr_executable **out);
hr_status hr_pjrt_execute_graph(hr_device *dev, hr_executable *exe, const hr_tensor *const *in, int n_in,
                                hr_tensor **out, int n_out);
void hr_pjrt_executable_free(hr_device *dev, hr_executable *exe);

/* ---- disk tier (pjrt_disk.c) ---- */

/* Names a module compiled with `opts` by this plugin build. */
uint64_t hr_pjrt_disk_key(const hr_pjrt_plugin *p, const char *text, const void *opts, size_t opts_len);
/* Loads the executable stored under key; false when absent or unusable. */
bool hr_pjrt_disk_load(hr_pjrt_plugin *p, uint64_t key, PJRT_LoadedExecutable **out);
/* Stores exe under key (best effort: failures are logged). */
void hr_pjrt_disk_store(hr_pjrt_plugin *p, uint64_t key, PJRT_LoadedExecutable *exe);

#endif
