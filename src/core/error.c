/* Thread-local last-error message. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define HR_ERROR_CAP 1024

static _Thread_local char tl_message[HR_ERROR_CAP];

static const char *const status_names[HR_STATUS_COUNT] = {
    [HR_OK] = "ok",
    [HR_ERR_INVALID_ARG] = "invalid argument",
    [HR_ERR_SHAPE] = "shape error",
    [HR_ERR_DTYPE] = "dtype error",
    [HR_ERR_OOM] = "out of memory",
    [HR_ERR_IO] = "I/O error",
    [HR_ERR_FORMAT] = "format error",
    [HR_ERR_NOT_FOUND] = "not found",
    [HR_ERR_UNSUPPORTED] = "unsupported",
    [HR_ERR_DEVICE] = "device error",
    [HR_ERR_INTERNAL] = "internal error",
    [HR_ERR_PERMISSION] = "not permitted",
};

const char *hr_status_name(hr_status s) {
    if ((unsigned)s >= HR_STATUS_COUNT) return "unknown status";
    return status_names[s];
}

const char *hr_last_error(void) { return tl_message; }

void hr_clear_error(void) { tl_message[0] = '\0'; }

hr_status hr_error(hr_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_message, sizeof tl_message, fmt, ap);
    va_end(ap);
    return code;
}

hr_status hr_error_context(hr_status code, const char *fmt, ...) {
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[HR_ERROR_CAP];
    memcpy(old, tl_message, sizeof old);
    if (old[0])
        snprintf(tl_message, sizeof tl_message, "%.500s: %.*s", prefix, HR_ERROR_CAP - 504, old);
    else
        snprintf(tl_message, sizeof tl_message, "%s", prefix);
    return code;
}
