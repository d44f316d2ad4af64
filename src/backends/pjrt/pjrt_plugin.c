/* PJRT plugins: find the library, dlopen it, check its C API version,
 * create the client and list its devices. One plugin per backend, loaded
 * on first use and kept for the life of the process. */
#ifdef HUBRT_HAVE_PJRT
#include <dlfcn.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/pjrt/pjrt_internal.h"
#include "core/error.h"

#define MAX_CANDIDATES 16

typedef struct {
    char paths[MAX_CANDIDATES][512];
    int n;
} candidates;

static void add_path(candidates *c, const char *path) {
    if (c->n < MAX_CANDIDATES && path && *path) snprintf(c->paths[c->n++], sizeof c->paths[0], "%s", path);
}

/* Every python3.* site-packages under prefix holding `rel`. */
static void add_site_glob(candidates *c, const char *prefix, const char *rel) {
    if (!prefix || !*prefix) return;
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/lib/python3*/site-packages/%s", prefix, rel);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) add_path(c, g.gl_pathv[i]);
        globfree(&g);
    } else {
        add_path(c, pattern);
    }
}

/* Where a backend's plugin may be. HUBRT_PJRT_PLUGIN, when set, is the only
 * candidate: naming a plugin must never silently load another one. */
static void plugin_candidates(const char *backend, candidates *c) {
    c->n = 0;
    const char *explicit_path = getenv("HUBRT_PJRT_PLUGIN");
    if (explicit_path && *explicit_path) {
        add_path(c, explicit_path);
        return;
    }
    const char *rel = !strcmp(backend, "tpu") ? "libtpu/libtpu.so" : "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";
    if (!strcmp(backend, "tpu")) add_path(c, getenv("TPU_LIBRARY_PATH"));
#ifdef HUBRT_PJRT_SITE_PACKAGES
    char built[512];
    snprintf(built, sizeof built, "%s/%s", HUBRT_PJRT_SITE_PACKAGES, rel);
    add_path(c, built);
#endif
    add_site_glob(c, getenv("VIRTUAL_ENV"), rel);
}

/* The major version must equal the one hubrt was built against. */
static hr_status version_check(const char *path, int major, int minor) {
    if (major != PJRT_API_MAJOR)
        return hr_error(HR_ERR_DEVICE,
                        "PJRT plugin %s implements PJRT C API %d.%d, but hubrt was built against %d.%d; "
                        "the major versions must match (use a plugin built for API %d.x)",
                        path, major, minor, PJRT_API_MAJOR, PJRT_API_MINOR, PJRT_API_MAJOR);
    if (minor < PJRT_API_MINOR)
        hr_log(HR_LOG_INFO, "PJRT plugin %s is API %d.%d, older than hubrt's %d.%d", path, major, minor,
               PJRT_API_MAJOR, PJRT_API_MINOR);
    return HR_OK;
}

hr_status hr_pjrt_api_check(const PJRT_Api *api, const char *path) {
    if (!api) return hr_error(HR_ERR_DEVICE, "PJRT plugin %s: GetPjrtApi returned NULL", path);
    return version_check(path, api->pjrt_api_version.major_version, api->pjrt_api_version.minor_version);
}

hr_status hr_pjrt_check(const hr_pjrt_plugin *p, PJRT_Error *err, const char *what) {
    if (!err) return HR_OK;
    PJRT_Error_Message_Args m = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE, .error = err};
    p->api->PJRT_Error_Message(&m);
    hr_status s = hr_error(HR_ERR_DEVICE, "%s: %.*s", what, (int)m.message_size, m.message);
    PJRT_Error_Destroy_Args d = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = err};
    p->api->PJRT_Error_Destroy(&d);
    return s;
}

hr_status hr_pjrt_event_await(const hr_pjrt_plugin *p, PJRT_Event *ev, const char *what) {
    if (!ev) return HR_OK;
    PJRT_Event_Await_Args a = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = ev};
    hr_status s = hr_pjrt_check(p, p->api->PJRT_Event_Await(&a), what);
    PJRT_Event_Destroy_Args d = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = ev};
    p->api->PJRT_Event_Destroy(&d);
    return s;
}

void hr_pjrt_buffer_destroy(const hr_pjrt_plugin *p, PJRT_Buffer *buf) {
    if (!buf) return;
    PJRT_Buffer_Destroy_Args d = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE, .buffer = buf};
    hr_pjrt_check(p, p->api->PJRT_Buffer_Destroy(&d), "PJRT_Buffer_Destroy");
}

static hr_status open_library(hr_pjrt_plugin *p, const char *backend) {
    candidates c;
    plugin_candidates(backend, &c);
    char tried[2048] = "";
    for (int i = 0; i < c.n; i++) {
        const char *path = c.paths[i];
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof tried - used, "\n  %s", path);
        if (access(path, R_OK) != 0) continue;
        /* XLA's INFO lines (one per client) drown hubrt's own log unless asked for. */
        if (hr_log_get_level() > HR_LOG_INFO) setenv("TF_CPP_MIN_LOG_LEVEL", "1", 0);
        void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!dl) {
            used = strlen(tried);
            snprintf(tried + used, sizeof tried - used, " (dlopen: %s)", dlerror());
            continue;
        }
        const PJRT_Api *(*get_api)(void) = (const PJRT_Api *(*)(void))dlsym(dl, "GetPjrtApi");
        if (!get_api) {
            dlclose(dl);
            return hr_error(HR_ERR_DEVICE, "%s is not a PJRT plugin (no GetPjrtApi symbol)", path);
        }
        const PJRT_Api *api = get_api();
        hr_status s = hr_pjrt_api_check(api, path);
        if (s != HR_OK) {
            dlclose(dl);
            return s;
        }
        p->dl = dl;
        p->api = api;
        snprintf(p->info.path, sizeof p->info.path, "%s", path);
        p->info.api_major = api->pjrt_api_version.major_version;
        p->info.api_minor = api->pjrt_api_version.minor_version;
        return HR_OK;
    }
    const char *hint = !strcmp(backend, "tpu")
                           ? "install the libtpu package, or set TPU_LIBRARY_PATH or HUBRT_PJRT_PLUGIN"
                           : "install xla-cpu-pjrt (pip install xla-cpu-pjrt) or set HUBRT_PJRT_PLUGIN";
    return hr_error(HR_ERR_NOT_FOUND, "no PJRT plugin for device '%s' (%s); paths searched:%s", backend, hint,
                    c.n ? tried : " (none)");
}

static hr_status create_client(hr_pjrt_plugin *p) {
    const PJRT_Api *api = p->api;
    PJRT_Plugin_Initialize_Args init = {.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE};
    HR_TRY(hr_pjrt_check(p, api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize"));
    /* The XLA CPU plugin exposes one device unless asked for more; two let
     * collectives run on one machine. */
    PJRT_NamedValue opts[1];
    size_t n_opts = 0;
    if (!strcmp(p->backend, "xla_cpu")) {
        const char *env = getenv("HUBRT_XLA_CPU_DEVICES");
        int64_t count = env && atoi(env) > 0 ? atoi(env) : 2;
        static const char name[] = "cpu_device_count";
        opts[n_opts++] = (PJRT_NamedValue){.struct_size = PJRT_NamedValue_STRUCT_SIZE, .name = name,
                                           .name_size = sizeof name - 1, .type = PJRT_NamedValue_kInt64,
                                           .int64_value = count, .value_size = 1};
    }
    PJRT_Client_Create_Args ca = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE,
                                  .create_options = n_opts ? opts : NULL, .num_options = n_opts};
    HR_TRY(hr_pjrt_check(p, api->PJRT_Client_Create(&ca), "PJRT_Client_Create"));
    p->client = ca.client;

    PJRT_Client_PlatformName_Args pn = {.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE, .client = p->client};
    HR_TRY(hr_pjrt_check(p, api->PJRT_Client_PlatformName(&pn), "PJRT_Client_PlatformName"));
    snprintf(p->info.platform, sizeof p->info.platform, "%.*s", (int)pn.platform_name_size, pn.platform_name);
    PJRT_Client_PlatformVersion_Args pv = {.struct_size = PJRT_Client_PlatformVersion_Args_STRUCT_SIZE,
                                           .client = p->client};
    HR_TRY(hr_pjrt_check(p, api->PJRT_Client_PlatformVersion(&pv), "PJRT_Client_PlatformVersion"));
    snprintf(p->info.version, sizeof p->info.version, "%.*s", (int)pv.platform_version_size, pv.platform_version);

    PJRT_Client_AddressableDevices_Args ad = {.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE,
                                              .client = p->client};
    HR_TRY(hr_pjrt_check(p, api->PJRT_Client_AddressableDevices(&ad), "PJRT_Client_AddressableDevices"));
    size_t n = ad.num_addressable_devices < HR_PJRT_MAX_DEVICES ? ad.num_addressable_devices : HR_PJRT_MAX_DEVICES;
    for (size_t i = 0; i < n; i++) p->devices[i] = ad.addressable_devices[i];
    p->num_devices = (int)n;
    p->info.num_devices = (int)n;
    return HR_OK;
}

#define N_BACKENDS 2
static const char *const g_names[N_BACKENDS] = {"xla_cpu", "tpu"};
static hr_pjrt_plugin g_plugins[N_BACKENDS];
static hr_status g_status[N_BACKENDS];
static char g_message[N_BACKENDS][2560];
static bool g_tried[N_BACKENDS];
static pthread_mutex_t g_load_lock = PTHREAD_MUTEX_INITIALIZER;

/* The MPI layout's value of one of these variables (Open MPI's, then
 * MPICH's Hydra), or -1. */
static long mpi_env(const char *ompi, const char *mpich) {
    const char *v = getenv(ompi);
    if (!v) v = getenv(mpich);
    char *end = NULL;
    long n = v ? strtol(v, &end, 10) : -1;
    return v && end != v && !*end && n >= 0 ? n : -1;
}

/* A rank started by `hubrt launch -n N --tpu` (mpirun) gets the variables
 * that libtpu reads and that are the same for every process from the
 * launcher (TPU_PROCESS_BOUNDS, TPU_CHIPS_PER_PROCESS_BOUNDS,
 * TPU_PROCESS_ADDRESSES, HUBRT_TPU_BASE_PORT); its own three come from its
 * place in the MPI layout, here, before libtpu starts: its chip (the local
 * rank), its port (the base + the local rank) and its task id (the rank).
 * Variables already set are left alone. */
static void tpu_env_from_mpi(void) {
    const char *base = getenv("HUBRT_TPU_BASE_PORT");
    long rank = mpi_env("OMPI_COMM_WORLD_RANK", "PMI_RANK");
    long local = mpi_env("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID");
    if (!base || rank < 0 || local < 0) return;
    char v[32];
    snprintf(v, sizeof v, "%ld", local);
    setenv("TPU_VISIBLE_CHIPS", v, 0);
    snprintf(v, sizeof v, "%ld", atol(base) + local);
    setenv("TPU_PROCESS_PORT", v, 0);
    snprintf(v, sizeof v, "%ld", rank);
    setenv("CLOUD_TPU_TASK_ID", v, 0);
    hr_log(HR_LOG_INFO, "tpu: rank %ld (local %ld): TPU_VISIBLE_CHIPS=%s TPU_PROCESS_PORT=%s CLOUD_TPU_TASK_ID=%s", rank,
           local, getenv("TPU_VISIBLE_CHIPS"), getenv("TPU_PROCESS_PORT"), getenv("CLOUD_TPU_TASK_ID"));
}

hr_status hr_pjrt_plugin_get(const char *backend, hr_pjrt_plugin **out) {
    int b = 0;
    while (b < N_BACKENDS && strcmp(g_names[b], backend)) b++;
    if (b == N_BACKENDS) return hr_error(HR_ERR_NOT_FOUND, "'%s' is not a PJRT backend", backend);
    pthread_mutex_lock(&g_load_lock);
    if (!g_tried[b]) {
        hr_pjrt_plugin *p = &g_plugins[b];
        p->backend = g_names[b];
        pthread_mutex_init(&p->lock, NULL);
        const char *blocking = getenv("HUBRT_LAUNCH_BLOCKING");
        p->launch_blocking = blocking && *blocking && strcmp(blocking, "0");
        if (!strcmp(backend, "tpu")) tpu_env_from_mpi();
        hr_status s = open_library(p, backend);
        if (s == HR_OK) s = create_client(p);
        g_status[b] = s;
        if (s != HR_OK) snprintf(g_message[b], sizeof g_message[b], "%s", hr_last_error());
        g_tried[b] = true;
    }
    hr_status s = g_status[b];
    pthread_mutex_unlock(&g_load_lock);
    if (s != HR_OK) return hr_error(s, "%s", g_message[b]);
    *out = &g_plugins[b];
    return HR_OK;
}

hr_status hr_pjrt_backend_info(const char *backend, hr_pjrt_info *out) {
    hr_pjrt_plugin *p;
    HR_TRY(hr_pjrt_plugin_get(backend, &p));
    *out = p->info;
    return HR_OK;
}

hr_status hr_pjrt_cache_stats_get(const char *backend, hr_pjrt_cache_stats *out) {
    hr_pjrt_plugin *p;
    HR_TRY(hr_pjrt_plugin_get(backend, &p));
    pthread_mutex_lock(&p->lock);
    *out = p->stats;
    pthread_mutex_unlock(&p->lock);
    return HR_OK;
}
#endif
