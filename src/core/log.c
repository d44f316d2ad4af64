/* Leveled logging to stderr; level from HUBRT_LOG on first use. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static atomic_int g_level = -1;

static int level_from_env(void) {
    const char *s = getenv("HUBRT_LOG");
    if (!s || !*s) return HR_LOG_WARN;
    if (!strcmp(s, "debug")) return HR_LOG_DEBUG;
    if (!strcmp(s, "info")) return HR_LOG_INFO;
    if (!strcmp(s, "warn") || !strcmp(s, "warning")) return HR_LOG_WARN;
    if (!strcmp(s, "error")) return HR_LOG_ERROR;
    if (!strcmp(s, "off") || !strcmp(s, "none")) return HR_LOG_OFF;
    fprintf(stderr, "hubrt [warn] HUBRT_LOG='%s' is not one of debug|info|warn|error|off; using warn\n", s);
    return HR_LOG_WARN;
}

hr_log_level hr_log_get_level(void) {
    int lv = atomic_load(&g_level);
    if (lv < 0) {
        lv = level_from_env();
        atomic_store(&g_level, lv);
    }
    return (hr_log_level)lv;
}

void hr_log_set_level(hr_log_level level) { atomic_store(&g_level, (int)level); }

void hr_log(hr_log_level level, const char *fmt, ...) {
    if (level < hr_log_get_level()) return;
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line keeps lines from different threads whole. */
    fprintf(stderr, "hubrt [%s] %s\n", names[level < HR_LOG_OFF ? level : HR_LOG_ERROR], line);
}

const char *hr_version(void) { return HUBRT_VERSION_STRING; }
