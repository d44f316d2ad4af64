/* Whole-file reads for the small JSON files of a model folder, and advice
 * on the pages of a file map. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/st_internal.h"

void hr_io_advise(const void *p, size_t n, int advice) {
    if (!n) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    uintptr_t first = a & ~(page - 1), last = (a + n + page - 1) & ~(page - 1);
    madvise((void *)first, last - first, advice);
}

hr_status hr_io_read_file(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return hr_error(errno == ENOENT ? HR_ERR_NOT_FOUND : HR_ERR_IO, "%s: cannot open: %s",
                        path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return hr_error(HR_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > max) {
        fclose(f);
        return hr_error(HR_ERR_FORMAT, "%s: %lld bytes, more than the %zu this reader accepts",
                        path, (long long)sb.st_size, max);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, n, f);
    bool err = ferror(f);
    fclose(f);
    if (err || got != n) {
        free(buf);
        return hr_error(HR_ERR_IO, "%s: read failed", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return HR_OK;
}
