/* The registry of experts_impl.h: a fixed table behind a mutex, written
 * only when a kernel loads. */
#include "ops/experts_impl.h"

#include <pthread.h>
#include <stdio.h>

#include "core/error.h"

#define MAX_IMPLS 64

static struct {
    int64_t id;
    char name[128];
    hr_experts_fn fn;
} g_impls[MAX_IMPLS];
static int g_n;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

hr_status hr_experts_impl_register(int64_t id, const char *name, hr_experts_fn fn) {
    if (!id || !fn) return hr_error(HR_ERR_INVALID_ARG, "experts implementation: id 0 or no function");
    hr_status s = HR_OK;
    pthread_mutex_lock(&g_lock);
    int i = 0;
    while (i < g_n && g_impls[i].id != id) i++;
    if (i == g_n && g_n == MAX_IMPLS) {
        s = hr_error(HR_ERR_UNSUPPORTED, "experts implementation '%s': %d are registered already", name, MAX_IMPLS);
    } else if (i == g_n) {
        g_impls[i].id = id;
        snprintf(g_impls[i].name, sizeof g_impls[i].name, "%s", name ? name : "?");
        g_impls[i].fn = fn;
        g_n++;
    }
    pthread_mutex_unlock(&g_lock);
    return s;
}

hr_experts_fn hr_experts_impl_find(int64_t id, const char **name) {
    hr_experts_fn fn = NULL;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n && !fn; i++)
        if (g_impls[i].id == id) {
            fn = g_impls[i].fn;
            if (name) *name = g_impls[i].name;
        }
    pthread_mutex_unlock(&g_lock);
    return fn;
}
