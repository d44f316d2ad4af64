/* Whole-or-nothing file writes (atomic_file.h). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"

hr_status hr_atomic_open(hr_atomic_file *f, const char *path) {
    *f = (hr_atomic_file){.path = path, .fd = -1};
    size_t cap = strlen(path) + 32;
    if (!(f->tmp = malloc(cap))) return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    snprintf(f->tmp, cap, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (f->fd >= 0) return HR_OK;
    hr_status s = hr_error(HR_ERR_IO, "%s: cannot create temporary file %s: %s", path, f->tmp, strerror(errno));
    free(f->tmp);
    f->tmp = NULL;
    return s;
}

hr_status hr_atomic_write(hr_atomic_file *f, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(f->fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return hr_error(HR_ERR_IO, "%s: write failed: %s", f->tmp, w < 0 ? strerror(errno) : "no space");
        c += w, n -= (size_t)w;
    }
    return HR_OK;
}

hr_status hr_atomic_zeros(hr_atomic_file *f, size_t n) {
    static const uint8_t zeros[256];
    for (size_t k; n; n -= k) {
        k = n < sizeof zeros ? n : sizeof zeros;
        HR_TRY(hr_atomic_write(f, zeros, k));
    }
    return HR_OK;
}

/* Makes the rename itself durable. */
static void sync_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

void hr_atomic_abort(hr_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    if (f->tmp) unlink(f->tmp);
    free(f->tmp);
    f->tmp = NULL;
    f->fd = -1;
}

hr_status hr_atomic_commit(hr_atomic_file *f) {
    hr_status s = HR_OK;
    if (fsync(f->fd) != 0) s = hr_error(HR_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(errno));
    if (close(f->fd) != 0 && s == HR_OK) s = hr_error(HR_ERR_IO, "%s: close failed: %s", f->tmp, strerror(errno));
    f->fd = -1;
    if (s == HR_OK && rename(f->tmp, f->path) != 0)
        s = hr_error(HR_ERR_IO, "%s: cannot rename %s over it: %s", f->path, f->tmp, strerror(errno));
    if (s != HR_OK) {
        hr_atomic_abort(f);
        return s;
    }
    sync_dir(f->path);
    free(f->tmp);
    f->tmp = NULL;
    return HR_OK;
}
