/* Whole-file reads for the small JSON files of a model folder, the counted
 * file maps of the weight files, and advice on their pages. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/st_internal.h"

hr_status hr_io_open_regular(const char *path, int *fd, uint64_t *size) {
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return hr_error(errno == ENOENT ? HR_ERR_NOT_FOUND : HR_ERR_IO, "%s: cannot open: %s", path,
                        strerror(errno));
    struct stat sb;
    hr_status s = HR_OK;
    if (fstat(*fd, &sb) != 0)
        s = hr_error(HR_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        s = hr_error(HR_ERR_INVALID_ARG, "%s: not a regular file%s", path,
                     S_ISDIR(sb.st_mode) ? " (a model folder? use hr_checkpoint_open)" : "");
    if (s != HR_OK) {
        close(*fd);
        *fd = -1;
        return s;
    }
    *size = (uint64_t)sb.st_size;
    return HR_OK;
}

static bool ranges_add(hr_io_map *m);

/* The counted map over [addr, addr + len), mapped by the caller (unmapped
 * here on failure); with `owner`, known as its range map while it lives. */
static hr_status map_new(void *addr, size_t len, const void *owner, const char *what, hr_io_map **out) {
    hr_io_map *m = malloc(sizeof *m);
    if (!m || (owner && addr && !ranges_add(m))) {
        free(m);
        if (addr) munmap(addr, len);
        return hr_error(HR_ERR_OOM, "%s: out of memory", what);
    }
    atomic_init(&m->refs, 1);
    m->addr = addr;
    m->len = len;
    m->owner = owner;
    *out = m;
    return HR_OK;
}

hr_status hr_io_map_file(const char *path, hr_io_map **out) {
    *out = NULL;
    int fd;
    uint64_t size;
    HR_TRY(hr_io_open_regular(path, &fd, &size));
    size_t len = (size_t)size;
    void *addr = len ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) : NULL;
    int e = errno;
    close(fd); /* the mapping keeps the file */
    if (addr == MAP_FAILED) return hr_error(HR_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    return map_new(addr, len, NULL, path, out);
}

/* The live range maps, so that a reader can tell its views by address. */
static pthread_mutex_t g_ranges_lock = PTHREAD_MUTEX_INITIALIZER;
static hr_io_map **g_ranges;
static size_t g_n_ranges, g_cap_ranges;

static bool ranges_add(hr_io_map *m) {
    pthread_mutex_lock(&g_ranges_lock);
    bool ok = g_n_ranges < g_cap_ranges;
    if (!ok) {
        size_t cap = g_cap_ranges ? 2 * g_cap_ranges : 64;
        hr_io_map **r = realloc(g_ranges, cap * sizeof *r);
        if (r) g_ranges = r, g_cap_ranges = cap, ok = true;
    }
    if (ok) g_ranges[g_n_ranges++] = m;
    pthread_mutex_unlock(&g_ranges_lock);
    return ok;
}

static void ranges_remove(hr_io_map *m) {
    pthread_mutex_lock(&g_ranges_lock);
    for (size_t i = 0; i < g_n_ranges; i++)
        if (g_ranges[i] == m) {
            g_ranges[i] = g_ranges[--g_n_ranges];
            break;
        }
    pthread_mutex_unlock(&g_ranges_lock);
}

bool hr_io_range_owned(const void *owner, const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    bool found = false;
    pthread_mutex_lock(&g_ranges_lock);
    for (size_t i = 0; i < g_n_ranges && !found; i++) {
        uintptr_t lo = (uintptr_t)g_ranges[i]->addr, hi = lo + g_ranges[i]->len;
        found = owner && g_ranges[i]->owner == owner && a >= lo && a + n <= hi;
    }
    pthread_mutex_unlock(&g_ranges_lock);
    return found;
}

void hr_io_range_disown(const void *owner) {
    pthread_mutex_lock(&g_ranges_lock);
    for (size_t i = 0; i < g_n_ranges; i++)
        if (g_ranges[i]->owner == owner) g_ranges[i]->owner = NULL;
    pthread_mutex_unlock(&g_ranges_lock);
}

hr_status hr_io_map_range(int fd, const char *path, uint64_t offset, size_t len, const void *owner, hr_io_map **out,
                          void **data) {
    *out = NULL;
    *data = NULL;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), start = offset & ~(page - 1);
    size_t span = (size_t)(offset - start) + len;
    void *addr = span ? mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, (off_t)start) : NULL;
    if (addr == MAP_FAILED)
        return hr_error(errno == ENOMEM ? HR_ERR_OOM : HR_ERR_IO, "%s: mmap of %zu bytes at %llu failed: %s", path,
                        len, (unsigned long long)offset, strerror(errno));
    HR_TRY(map_new(addr, span, owner, path, out));
    *data = addr ? (char *)addr + (offset - start) : NULL;
    return HR_OK;
}

hr_status hr_io_map_anon(size_t len, const void *owner, const char *what, hr_io_map **out) {
    *out = NULL;
    void *addr = len ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    if (addr == MAP_FAILED) return hr_error(HR_ERR_OOM, "%s: cannot map %zu bytes: %s", what, len, strerror(errno));
    return map_new(addr, len, owner, what, out);
}

hr_status hr_io_pread(int fd, const char *path, uint64_t offset, void *dst, size_t len) {
    for (size_t done = 0; done < len;) {
        ssize_t n = pread(fd, (char *)dst + done, len - done, (off_t)(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return hr_error(HR_ERR_IO, "%s: reading %zu bytes at %llu: %s", path, len, (unsigned long long)offset,
                            n < 0 ? strerror(errno) : "the file ends early");
        done += (size_t)n;
    }
    return HR_OK;
}

void hr_io_map_retain(hr_io_map *m) { atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed); }

void hr_io_map_release(void *ctx) {
    hr_io_map *m = ctx;
    if (!m || atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1) return;
    ranges_remove(m);
    if (m->addr) munmap(m->addr, m->len);
    free(m);
}

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
