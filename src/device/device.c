/* Device registry: backends by name, devices opened once per index. The
 * backends register themselves (src/backends/, from ELF constructors that
 * run when the library loads): this layer knows none of them. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "device/device_impl.h"

#define MAX_BACKENDS 8
#define MAX_DEVICES_PER_BACKEND 64

static const hr_device_backend *g_backends[MAX_BACKENDS];
static hr_device *g_devices[MAX_BACKENDS][MAX_DEVICES_PER_BACKEND];
static int g_n_backends;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static hr_status register_locked(const hr_device_backend *b) {
    for (int i = 0; i < g_n_backends; i++)
        if (!strcmp(g_backends[i]->name, b->name))
            return hr_error(HR_ERR_INVALID_ARG, "device backend '%s' already registered", b->name);
    if (g_n_backends == MAX_BACKENDS)
        return hr_error(HR_ERR_UNSUPPORTED, "too many device backends (max %d)", MAX_BACKENDS);
    g_backends[g_n_backends++] = b;
    return HR_OK;
}

hr_status hr_device_register_backend(const hr_device_backend *backend) {
    pthread_mutex_lock(&g_lock);
    hr_status s = register_locked(backend);
    pthread_mutex_unlock(&g_lock);
    return s;
}

const char *const *hr_device_backends(void) {
    static const char *names[MAX_BACKENDS + 1];
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n_backends; i++) names[i] = g_backends[i]->name;
    names[g_n_backends] = NULL;
    pthread_mutex_unlock(&g_lock);
    return names;
}

static hr_status parse_spec(const char *spec, char *name, size_t cap, int *index) {
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    if (len == 0 || len >= cap)
        return hr_error(HR_ERR_INVALID_ARG, "invalid device string '%s' (expected name[:index])", spec);
    memcpy(name, spec, len);
    name[len] = '\0';
    *index = 0;
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || v < 0 || v >= MAX_DEVICES_PER_BACKEND)
            return hr_error(HR_ERR_INVALID_ARG,
                            "invalid device index in '%s' (expected a number 0..%d)", spec,
                            MAX_DEVICES_PER_BACKEND - 1);
        *index = (int)v;
    }
    return HR_OK;
}

hr_status hr_device_get(const char *spec, hr_device **out) {
    if (!spec || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_device_get: NULL argument");
    *out = NULL;
    char name[64];
    int index;
    HR_TRY(parse_spec(spec, name, sizeof name, &index));
    pthread_mutex_lock(&g_lock);
    hr_status s = HR_OK;
    int b = 0;
    while (b < g_n_backends && strcmp(g_backends[b]->name, name)) b++;
    if (b == g_n_backends) {
        char known[256] = "";
        for (int i = 0; i < g_n_backends; i++) {
            strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
            strncat(known, g_backends[i]->name, sizeof known - strlen(known) - 1);
        }
        s = hr_error(HR_ERR_NOT_FOUND, "unknown device '%s' (available: %s)", spec, known);
    } else if (!g_devices[b][index]) {
        int count = g_backends[b]->count();
        if (count == 0) {
            /* An unavailable backend explains itself (e.g. the plugin paths searched). */
            hr_device *unused = NULL;
            s = g_backends[b]->open(index, &unused);
            if (s == HR_OK) s = hr_error(HR_ERR_NOT_FOUND, "device '%s': %s has no devices", spec, name);
        } else if (index >= count)
            s = hr_error(HR_ERR_NOT_FOUND, "device '%s' does not exist (%s has %d device%s)", spec,
                         name, count, count == 1 ? "" : "s");
        else
            s = g_backends[b]->open(index, &g_devices[b][index]);
    }
    if (s == HR_OK) *out = g_devices[b][index];
    pthread_mutex_unlock(&g_lock);
    return s;
}

const char *hr_device_name(const hr_device *dev) { return dev->backend; }
int hr_device_index(const hr_device *dev) { return dev->index; }

hr_status hr_device_sync(hr_device *dev) {
    if (!dev) return hr_error(HR_ERR_INVALID_ARG, "hr_device_sync: NULL device");
    return dev->vt->sync ? dev->vt->sync(dev) : HR_OK;
}

/* The host device, looked up once: ops fall back to it, and host data
 * (file maps, arrays) is wrapped on it. */
hr_device *hr_device_cpu(void) {
    static _Atomic(hr_device *) cpu;
    hr_device *d = atomic_load_explicit(&cpu, memory_order_acquire);
    if (d) return d;
    if (hr_device_get("cpu", &d) != HR_OK) {
        hr_log(HR_LOG_ERROR, "no 'cpu' device backend is registered (was libhubrt.a linked whole?): %s",
               hr_last_error());
        return NULL;
    }
    atomic_store_explicit(&cpu, d, memory_order_release);
    return d;
}
