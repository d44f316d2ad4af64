/* safetensors reader: a private memory map plus a validated header; tensors
 * are zero-copy views of the map.
 *
 * The map is refcounted: the handle holds one reference and every tensor
 * handed out holds one, so tensors may outlive hr_safetensors_close. It is
 * mapped PROT_READ|PROT_WRITE with MAP_PRIVATE: pages stay shared with the
 * page cache until written, and a caller writing into a weight (an in-place
 * op, a torch tensor received through DLPack) gets its own copy of that
 * page instead of a SIGBUS/SIGSEGV; the file never changes. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"
#include "core/tensor_impl.h"
#include "io/st_internal.h"

struct hr_safetensors {
    char *path;
    hr_io_map *map;
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

hr_status hr_safetensors_open(const char *path, hr_safetensors **out) {
    if (!path || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_safetensors_open: NULL argument");
    *out = NULL;
    hr_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    }
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

void hr_safetensors_close(hr_safetensors *st) {
    if (!st) return;
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
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)st->map->addr, hi = lo + st->map->len;
    if (a < lo || a + n > hi) return false;
    hr_io_advise(p, n, MADV_DONTNEED);
    return true;
}

void hr_safetensors_drop_tensor(const hr_safetensors *st, const char *name) {
    const st_entry *e = NULL;
    if (st_lookup(st, name, &e) != HR_OK) return;
    hr_safetensors_drop_pages(st, (const char *)st->map->addr + st->h.data_start + e->begin,
                              (size_t)(e->end - e->begin));
}

hr_status hr_safetensors_tensor(const hr_safetensors *st, const char *name, hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_safetensors_tensor: out is NULL");
    *out = NULL;
    const st_entry *e = NULL;
    HR_TRY(st_lookup(st, name, &e));
    uint8_t *p = (uint8_t *)st->map->addr + st->h.data_start + e->begin;
    size_t n = (size_t)(e->end - e->begin);
    hr_status s;
    if ((uintptr_t)p % hr_dtype_size(e->dtype) == 0) {
        st_prefetch(p, n);
        s = hr_tensor_wrap_host(e->dtype, e->ndim, e->shape, NULL, p, n, hr_io_map_release, st->map,
                                out);
        if (s == HR_OK) hr_io_map_retain(st->map);
    } else {
        /* Other writers may leave data unaligned for its type; kernels load
         * whole elements, so such a tensor is copied once. */
        HR_LOG_DEBUG("%s: tensor '%s' is not aligned to its dtype; copying it", st->path, name);
        s = hr_tensor_from_host(hr_device_cpu(), e->dtype, e->ndim, e->shape, p, n, out);
    }
    if (s != HR_OK) return hr_error_context(s, "%s: tensor '%s'", st->path, name);
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
