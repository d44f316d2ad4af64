/* safetensors reader: a private memory map plus a validated header; tensors
 * are zero-copy views of the map.
 *
 * The map is refcounted: the handle holds one reference and every tensor
 * handed out holds one, so tensors may outlive hr_safetensors_close. It is
 * mapped PROT_READ|PROT_WRITE with MAP_PRIVATE: pages stay shared with the
 * page cache until written, and a caller writing into a weight (an in-place
 * op, a torch tensor received through DLPack) gets its own copy of that
 * page instead of a SIGBUS/SIGSEGV; the file never changes.
 *
 * A file opened by ranges (hr_safetensors_open_ranged) maps nothing at
 * open: its header is read, and each tensor or slice asked for maps (or
 * reads) its own bytes, so the process's address space holds what it
 * asked for and no more. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "core/tensor_impl.h"
#include "io/st_internal.h"

struct hr_safetensors {
    char *path;
    hr_io_map *map; /* the whole file; NULL when opened by ranges */
    int fd;         /* a file opened by ranges; -1 otherwise */
    st_header h;
};

/* The file mapped, long enough to hold a safetensors header's length. */
static hr_status st_map_file(const char *path, hr_io_map **out) {
    HR_TRY(hr_io_map_file(path, out));
    if ((*out)->len >= 8) return HR_OK;
    size_t len = (*out)->len;
    hr_io_map_release(*out);
    *out = NULL;
    return hr_error(HR_ERR_FORMAT,
                    "%s: %lld bytes is too short for a safetensors file (8-byte header length missing)", path,
                    (long long)len);
}

/* An empty handle for `path` (no map, no file open). */
static hr_status st_new(const char *path, hr_safetensors **out) {
    hr_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    }
    st->fd = -1;
    *out = st;
    return HR_OK;
}

hr_status hr_safetensors_open(const char *path, hr_safetensors **out) {
    if (!path || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_safetensors_open: NULL argument");
    *out = NULL;
    hr_safetensors *st = NULL;
    HR_TRY(st_new(path, &st));
    hr_status s = st_map_file(path, &st->map);
    if (s == HR_OK) s = hr_st_parse(path, st->map->addr, st->map->len, &st->h);
    if (s != HR_OK) {
        hr_safetensors_close(st);
        return s;
    }
    HR_LOG_DEBUG("%s: %zu tensors, header %llu bytes", path, st->h.n,
                 (unsigned long long)st->h.data_start - 8);
    *out = st;
    return HR_OK;
}

/* The header of the open file st->fd of `size` bytes, read and parsed. */
static hr_status st_read_header(hr_safetensors *st, uint64_t size) {
    uint8_t len8[8];
    if (size < 8)
        return hr_error(HR_ERR_FORMAT, "%s: %llu bytes is too short for a safetensors file (8-byte header length "
                        "missing)", st->path, (unsigned long long)size);
    HR_TRY(hr_io_pread(st->fd, st->path, 0, len8, 8));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    /* hr_st_parse names an oversized or overlong header; read no more than fits */
    uint64_t n = hlen > HR_ST_MAX_HEADER || hlen > size - 8 ? 0 : hlen;
    uint8_t *buf = malloc(8 + n + 1);
    if (!buf) return hr_error(HR_ERR_OOM, "%s: out of memory for a %llu-byte header", st->path,
                              (unsigned long long)hlen);
    memcpy(buf, len8, 8);
    hr_status s = hr_io_pread(st->fd, st->path, 8, buf + 8, (size_t)n);
    /* the parser reads 8 + hlen bytes only when they fit `size` and the limit */
    if (s == HR_OK) s = hr_st_parse(st->path, buf, (size_t)size, &st->h);
    free(buf);
    return s;
}

hr_status hr_safetensors_open_ranged(const char *path, hr_safetensors **out) {
    if (!path || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_safetensors_open_ranged: NULL argument");
    *out = NULL;
    hr_safetensors *st = NULL;
    HR_TRY(st_new(path, &st));
    uint64_t size = 0;
    hr_status s = hr_io_open_regular(path, &st->fd, &size);
    if (s == HR_OK) s = st_read_header(st, size);
    if (s != HR_OK) {
        hr_safetensors_close(st);
        return s;
    }
    *out = st;
    return HR_OK;
}

void hr_safetensors_close(hr_safetensors *st) {
    if (!st) return;
    if (st->fd >= 0) close(st->fd);
    hr_io_range_disown(st);
    if (st->map) hr_io_map_release(st->map);
    hr_st_header_free(&st->h);
    free(st->path);
    free(st);
}

size_t hr_safetensors_count(const hr_safetensors *st) { return st->h.n; }

const char *hr_safetensors_name(const hr_safetensors *st, size_t i) {
    return i < st->h.n ? st->h.entries[i].name : NULL;
}

static hr_status st_lookup(const hr_safetensors *st, const char *name, const st_entry **out) {
    if (!name) return hr_error(HR_ERR_INVALID_ARG, "%s: tensor name is NULL", st->path);
    long i = hr_st_find(&st->h, name);
    if (i < 0) return hr_error(HR_ERR_NOT_FOUND, "%s: no tensor named '%s'", st->path, name);
    *out = &st->h.entries[i];
    return HR_OK;
}

hr_status hr_safetensors_info(const hr_safetensors *st, const char *name, hr_tensor_info *out) {
    const st_entry *e = NULL;
    HR_TRY(st_lookup(st, name, &e));
    memset(out, 0, sizeof *out);
    out->dtype = e->dtype;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof e->shape);
    out->nbytes = (size_t)(e->end - e->begin);
    return HR_OK;
}

/* Starts readahead of the pages a tensor covers: opening a file touches only
 * the header, and a model reads each weight soon after asking for it. */
static void st_prefetch(const uint8_t *p, size_t n) { hr_io_advise(p, n, MADV_WILLNEED); }

bool hr_safetensors_drop_pages(const hr_safetensors *st, const void *p, size_t n) {
    if (!st->map) {
        /* by ranges: the tensors' own maps of this file */
        if (!hr_io_range_owned(st, p, n)) return false;
        hr_io_advise(p, n, MADV_DONTNEED);
        return true;
    }
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)st->map->addr, hi = lo + st->map->len;
    if (a < lo || a + n > hi) return false;
    hr_io_advise(p, n, MADV_DONTNEED);
    return true;
}

void hr_safetensors_drop_tensor(const hr_safetensors *st, const char *name) {
    const st_entry *e = NULL;
    if (st_lookup(st, name, &e) != HR_OK || !st->map) return;
    hr_safetensors_drop_pages(st, (const char *)st->map->addr + st->h.data_start + e->begin,
                              (size_t)(e->end - e->begin));
}

/* A tensor of `ndim` dims viewing bytes [off, off + n) of the data
 * section: into the file's map, or mapped by range; copied once when
 * the bytes are not aligned to the dtype (other writers may leave them so,
 * and kernels load whole elements). */
static hr_status st_view(const hr_safetensors *st, const char *name, hr_dtype dt, int ndim, const int64_t *shape,
                         uint64_t off, size_t n, hr_tensor **out) {
    uint64_t at = st->h.data_start + off;
    hr_io_map *map = st->map;
    uint8_t *p = NULL;
    if (map) {
        p = (uint8_t *)map->addr + at;
        hr_io_map_retain(map);
    } else {
        void *data = NULL;
        HR_TRY(hr_io_map_range(st->fd, st->path, at, n, st, &map, &data));
        p = data;
    }
    hr_status s;
    if ((uintptr_t)p % hr_dtype_size(dt) == 0) {
        st_prefetch(p, n);
        s = hr_tensor_wrap_host(dt, ndim, shape, NULL, p, n, hr_io_map_release, map, out);
        if (s == HR_OK) map = NULL; /* the tensor holds it */
    } else {
        HR_LOG_DEBUG("%s: tensor '%s' is not aligned to its dtype; copying it", st->path, name);
        s = hr_tensor_from_host(hr_device_cpu(), dt, ndim, shape, p, n, out);
    }
    if (map) hr_io_map_release(map);
    if (s != HR_OK) return hr_error_context(s, "%s: tensor '%s'", st->path, name);
    hr_tensor_set_name(*out, name);
    return HR_OK;
}

hr_status hr_safetensors_tensor(const hr_safetensors *st, const char *name, hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_safetensors_tensor: out is NULL");
    *out = NULL;
    const st_entry *e = NULL;
    HR_TRY(st_lookup(st, name, &e));
    return st_view(st, name, e->dtype, e->ndim, e->shape, e->begin, (size_t)(e->end - e->begin), out);
}

hr_status hr_safetensors_rows(const hr_safetensors *st, const char *name, int dim, int64_t first, int64_t len,
                              hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_safetensors_rows: out is NULL");
    *out = NULL;
    const st_entry *e = NULL;
    HR_TRY(st_lookup(st, name, &e));
    if (dim < 0 || dim >= e->ndim || first < 0 || len < 0 || first > e->shape[dim] - len)
        return hr_error(HR_ERR_INVALID_ARG, "%s: rows %lld..%lld of dim %d of tensor '%s' are outside it", st->path,
                        (long long)first, (long long)(first + len), dim, name);
    int64_t shape[HR_MAX_DIMS], outer = 1, inner = 1;
    memcpy(shape, e->shape, sizeof shape);
    shape[dim] = len;
    for (int i = 0; i < dim; i++) outer *= e->shape[i];
    for (int i = dim + 1; i < e->ndim; i++) inner *= e->shape[i];
    size_t es = hr_dtype_size(e->dtype), seg = es * (size_t)(len * inner), row = es * (size_t)(e->shape[dim] * inner);
    if (dim == 0) return st_view(st, name, e->dtype, e->ndim, shape, e->begin + es * (size_t)(first * inner), seg, out);
    /* one segment per outer index, copied out (the rest never touched)
     * into memory the loader may drop once it packed or copied it, as it
     * drops a file's pages */
    hr_io_map *map = NULL;
    size_t bytes = seg * (size_t)outer;
    HR_TRY(hr_io_map_anon(bytes, st->map ? NULL : st, st->path, &map));
    char *dst = map->addr;
    hr_status s = HR_OK;
    for (int64_t o = 0; s == HR_OK && bytes && o < outer; o++) {
        uint64_t at = st->h.data_start + e->begin + row * (uint64_t)o + es * (uint64_t)(first * inner);
        if (st->map) memcpy(dst + seg * (size_t)o, (const char *)st->map->addr + at, seg);
        else s = hr_io_pread(st->fd, st->path, at, dst + seg * (size_t)o, seg);
    }
    if (s == HR_OK) s = hr_tensor_wrap_host(e->dtype, e->ndim, shape, NULL, dst, bytes, hr_io_map_release, map, out);
    if (s != HR_OK) {
        hr_io_map_release(map);
        return hr_error_context(s, "tensor '%s'", name);
    }
    hr_tensor_set_name(*out, name);
    return HR_OK;
}

size_t hr_safetensors_metadata_count(const hr_safetensors *st) { return st->h.n_meta; }

hr_kv hr_safetensors_metadata_at(const hr_safetensors *st, size_t i) {
    return i < st->h.n_meta ? st->h.meta[i] : (hr_kv){NULL, NULL};
}

const char *hr_safetensors_metadata_get(const hr_safetensors *st, const char *key) {
    for (size_t i = 0; key && i < st->h.n_meta; i++)
        if (!strcmp(st->h.meta[i].key, key)) return st->h.meta[i].value;
    return NULL;
}
