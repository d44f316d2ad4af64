/* safetensors writer: the layout of the `safetensors` Python package, written
 * atomically (io/atomic_file.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "io/atomic_file.h"
#include "io/st_internal.h"

/* ---- header text ------------------------------------------------------ */

typedef hr_bytes strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) { hr_bytes_put(b, s, n); }

static void sb_puts(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_putf_u64(strbuf *b, unsigned long long v) {
    char t[24];
    sb_put(b, t, (size_t)snprintf(t, sizeof t, "%llu", v));
}

/* A JSON string escaped as serde_json escapes it, so our headers match the
 * reference writer's byte for byte. */
static void sb_json_string(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char t[8];
        switch (c) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        default:
            if (c < 0x20) sb_put(b, t, (size_t)snprintf(t, sizeof t, "\\u%04x", c));
            else sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* ---- order ------------------------------------------------------------ */

/* The reference sorts by its Dtype enum, descending, then by name; this is
 * that enum's order for the dtypes hubrt has. */
static int dtype_rank(hr_dtype dt) {
    switch (dt) {
    case HR_BOOL: return 0;
    case HR_U8: return 1;
    case HR_I8: return 2;
    case HR_F8_E4M3: return 3;
    case HR_I16: return 4;
    case HR_F16: return 5;
    case HR_BF16: return 6;
    case HR_I32: return 7;
    case HR_F32: return 8;
    case HR_F64: return 9;
    case HR_I64: return 10;
    default: return -1;
    }
}

typedef struct wr_item {
    const char *name;
    const hr_tensor *t;
    uint64_t nbytes;
} wr_item;

static int item_order(const void *a, const void *b) {
    const wr_item *x = a, *y = b;
    int rx = dtype_rank(x->t->dtype), ry = dtype_rank(y->t->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

static int name_order(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static hr_status wr_check(const char *path, const char *const *names,
                          const hr_tensor *const *tensors, size_t n, const hr_kv *meta,
                          size_t n_meta, wr_item *items) {
    for (size_t i = 0; i < n; i++) {
        if (!names[i] || !tensors[i])
            return hr_error(HR_ERR_INVALID_ARG, "%s: tensor #%zu has a NULL %s", path, i,
                            names[i] ? "tensor" : "name");
        if (!hr_utf8_valid((const uint8_t *)names[i], strlen(names[i])))
            return hr_error(HR_ERR_INVALID_ARG, "%s: tensor name #%zu is not valid UTF-8", path, i);
        if (!strcmp(names[i], "__metadata__"))
            return hr_error(HR_ERR_INVALID_ARG, "%s: '__metadata__' cannot name a tensor", path);
        if (hr_dtype_is_quantized(tensors[i]->dtype))
            return hr_error(HR_ERR_DTYPE, "%s: tensor '%s' is %s: safetensors has no block-quantized dtype", path,
                            names[i], hr_dtype_name(tensors[i]->dtype));
        items[i] = (wr_item){names[i], tensors[i], hr_tensor_nbytes(tensors[i])};
    }
    for (size_t i = 0; i < n_meta; i++) {
        if (!meta[i].key || !meta[i].value)
            return hr_error(HR_ERR_INVALID_ARG, "%s: metadata entry #%zu has a NULL key or value",
                            path, i);
        if (!hr_utf8_valid((const uint8_t *)meta[i].key, strlen(meta[i].key)) ||
            !hr_utf8_valid((const uint8_t *)meta[i].value, strlen(meta[i].value)))
            return hr_error(HR_ERR_INVALID_ARG, "%s: metadata entry '%s' is not valid UTF-8", path,
                            meta[i].key);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(meta[i].key, meta[j].key))
                return hr_error(HR_ERR_INVALID_ARG, "%s: duplicate metadata key '%s'", path,
                                meta[i].key);
    }
    const char **sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) sorted[i] = names[i];
    qsort(sorted, n, sizeof *sorted, name_order);
    hr_status s = HR_OK;
    for (size_t i = 1; i < n && s == HR_OK; i++)
        if (!strcmp(sorted[i - 1], sorted[i]))
            s = hr_error(HR_ERR_INVALID_ARG, "%s: duplicate tensor name '%s'", path, sorted[i]);
    free(sorted);
    qsort(items, n, sizeof *items, item_order);
    return s;
}

static hr_status wr_header(const wr_item *items, size_t n, const hr_kv *meta, size_t n_meta,
                           strbuf *b) {
    sb_puts(b, "{");
    if (n_meta) {
        sb_puts(b, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            if (i) sb_puts(b, ",");
            sb_json_string(b, meta[i].key);
            sb_puts(b, ":");
            sb_json_string(b, meta[i].value);
        }
        sb_puts(b, "}");
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const hr_tensor *t = items[i].t;
        if (i || n_meta) sb_puts(b, ",");
        sb_json_string(b, items[i].name);
        sb_puts(b, ":{\"dtype\":\"");
        sb_puts(b, hr_dtype_safetensors_name(t->dtype));
        sb_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_puts(b, ",");
            sb_putf_u64(b, (unsigned long long)t->shape[d]);
        }
        sb_puts(b, "],\"data_offsets\":[");
        sb_putf_u64(b, off);
        sb_puts(b, ",");
        off += items[i].nbytes;
        sb_putf_u64(b, off);
        sb_puts(b, "]}");
    }
    sb_puts(b, "}");
    while (b->len % 8) sb_puts(b, " ");
    return b->oom ? hr_error(HR_ERR_OOM, "out of memory building a safetensors header") : HR_OK;
}

/* ---- file ------------------------------------------------------------- */

static hr_status wr_tensor(hr_atomic_file *f, const wr_item *it) {
    if (!it->nbytes) return HR_OK;
    const hr_tensor *t = it->t;
    if (hr_tensor_is_contiguous(t) && hr_tensor_data(t)) return hr_atomic_write(f, hr_tensor_data(t), (size_t)it->nbytes);
    void *host = malloc((size_t)it->nbytes);
    if (!host) return hr_error(HR_ERR_OOM, "%s: out of memory staging tensor '%s'", f->path, it->name);
    hr_status s = hr_tensor_read(t, host, (size_t)it->nbytes);
    if (s != HR_OK) s = hr_error_context(s, "tensor '%s'", it->name);
    else s = hr_atomic_write(f, host, (size_t)it->nbytes);
    free(host);
    return s;
}

static hr_status wr_file(const char *path, const strbuf *hdr, const wr_item *items, size_t n) {
    hr_atomic_file f;
    HR_TRY(hr_atomic_open(&f, path));
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hdr->len >> (8 * i));
    hr_status s = hr_atomic_write(&f, len8, 8);
    if (s == HR_OK) s = hr_atomic_write(&f, hdr->p, hdr->len);
    for (size_t i = 0; i < n && s == HR_OK; i++) s = wr_tensor(&f, &items[i]);
    if (s != HR_OK) {
        hr_atomic_abort(&f);
        return s;
    }
    return hr_atomic_commit(&f);
}

hr_status hr_safetensors_write(const char *path, const char *const *names,
                               const hr_tensor *const *tensors, size_t n, const hr_kv *meta,
                               size_t n_meta) {
    if (!path || (n && (!names || !tensors)) || (n_meta && !meta))
        return hr_error(HR_ERR_INVALID_ARG, "hr_safetensors_write: NULL argument");
    wr_item *items = calloc(n ? n : 1, sizeof *items);
    strbuf hdr = {0};
    hr_status s = items ? HR_OK : hr_error(HR_ERR_OOM, "%s: out of memory", path);
    if (s == HR_OK) s = wr_check(path, names, tensors, n, meta, n_meta, items);
    if (s == HR_OK) s = wr_header(items, n, meta, n_meta, &hdr);
    if (s == HR_OK) s = wr_file(path, &hdr, items, n);
    free(hdr.p);
    free(items);
    return s;
}
