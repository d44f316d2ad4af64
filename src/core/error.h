/* Internal error helpers: set the thread-local message and return the code. */
#ifndef HR_CORE_ERROR_H
#define HR_CORE_ERROR_H

#include "hubrt/base.h"

/* Sets the thread-local message (printf-style) and returns `code`. */
hr_status hr_error(hr_status code, const char *fmt, ...) HR_PRINTF(2, 3);
/* Prepends "prefix: " to the current message (context such as a file or
 * tensor name) and returns `code`. */
hr_status hr_error_context(hr_status code, const char *fmt, ...) HR_PRINTF(2, 3);

#define HR_TRY(expr)                         \
    do {                                     \
        hr_status hr_try_s_ = (expr);        \
        if (hr_try_s_ != HR_OK) return hr_try_s_; \
    } while (0)

#define HR_LOG_DEBUG(...) hr_log(HR_LOG_DEBUG, __VA_ARGS__)
#define HR_LOG_INFO(...) hr_log(HR_LOG_INFO, __VA_ARGS__)
#define HR_LOG_WARN(...) hr_log(HR_LOG_WARN, __VA_ARGS__)
#define HR_LOG_ERROR(...) hr_log(HR_LOG_ERROR, __VA_ARGS__)

#endif
