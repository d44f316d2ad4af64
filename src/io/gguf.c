/* GGUF v2/v3 reader (the llama.cpp file format): header, metadata and
 * tensor infos validated up front from the file's private map (hr_io_map:
 * a write through a tensor viewing it copies the page, as for
 * safetensors), so that nothing after parsing can read outside the image. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"
#include "core/mem_budget.h"
#include "core/tensor_impl.h"
#include "io/gguf.h"
#include "io/st_internal.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGN 32

typedef struct cursor {
    const hr_gguf *g;
    size_t pos;
} cursor;

static hr_status truncated(const cursor *c, const char *what) {
    return hr_error(HR_ERR_FORMAT, "%s: truncated at byte %zu reading %s", c->g->label, c->pos, what);
}

static hr_status rd(cursor *c, void *dst, size_t n, const char *what) {
    if (c->g->size - c->pos < n) return truncated(c, what);
    memcpy(dst, c->g->buf + c->pos, n);
    c->pos += n;
    return HR_OK;
}

static hr_status rd_u32(cursor *c, uint32_t *v, const char *what) { return rd(c, v, 4, what); }
static hr_status rd_u64(cursor *c, uint64_t *v, const char *what) { return rd(c, v, 8, what); }

static hr_status rd_str(cursor *c, gguf_str *s, const char *what) {
    HR_TRY(rd_u64(c, &s->len, what));
    if (s->len > c->g->size - c->pos) {
        char buf[96];
        snprintf(buf, sizeof buf, "%s (length %llu)", what, (unsigned long long)s->len);
        return truncated(c, buf);
    }
    s->p = (const char *)c->g->buf + c->pos;
    c->pos += s->len;
    return HR_OK;
}

/* A key or tensor name: NUL-free, copied and NUL-terminated. */
static hr_status rd_name(cursor *c, char **out, const char *what) {
    gguf_str s = {0};
    HR_TRY(rd_str(c, &s, what));
    if (memchr(s.p, 0, s.len)) return hr_error(HR_ERR_FORMAT, "%s: %s contains a NUL byte", c->g->label, what);
    if (!(*out = strndup(s.p, s.len))) return hr_error(HR_ERR_OOM, "%s: out of memory", c->g->label);
    return HR_OK;
}

static size_t type_size(gguf_type t) {
    static const size_t sz[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return sz[t];
}

static hr_status parse_value(cursor *c, gguf_kv *kv) {
    uint32_t ty = 0;
    HR_TRY(rd_u32(c, &ty, "a value type"));
    if (ty >= GGUF_TYPE_COUNT)
        return hr_error(HR_ERR_FORMAT, "%s: key '%s' has unknown value type %u", c->g->label, kv->key, ty);
    kv->type = (gguf_type)ty;
    kv->n = 1;
    gguf_type et = kv->type;
    if (kv->type == GGUF_ARRAY) {
        HR_TRY(rd_u32(c, &ty, "an array type"));
        if (ty >= GGUF_TYPE_COUNT || ty == GGUF_ARRAY)
            return hr_error(HR_ERR_FORMAT, "%s: key '%s' is an array of unsupported type %u", c->g->label, kv->key, ty);
        kv->arr_type = et = (gguf_type)ty;
        HR_TRY(rd_u64(c, &kv->n, "an array length"));
    }
    kv->data = c->g->buf + c->pos;
    if (et != GGUF_STRING) {
        size_t es = type_size(et);
        if (kv->n > (c->g->size - c->pos) / es)
            return hr_error(HR_ERR_FORMAT, "%s: key '%s': %llu elements run past the end of the file", c->g->label,
                            kv->key, (unsigned long long)kv->n);
        if (et == GGUF_BOOL)
            for (uint64_t i = 0; i < kv->n; i++)
                if (kv->data[i] > 1)
                    return hr_error(HR_ERR_FORMAT, "%s: key '%s': bool value %u", c->g->label, kv->key, kv->data[i]);
        c->pos += kv->n * es;
        return HR_OK;
    }
    /* every string takes at least its 8-byte length */
    if (kv->n > (c->g->size - c->pos) / 8)
        return hr_error(HR_ERR_FORMAT, "%s: key '%s': %llu strings run past the end of the file", c->g->label,
                        kv->key, (unsigned long long)kv->n);
    HR_TRY(hr_mem_check(sizeof *kv->strs * (size_t)kv->n, c->g->label));
    kv->strs = malloc(sizeof *kv->strs * (size_t)(kv->n ? kv->n : 1));
    if (!kv->strs) return hr_error(HR_ERR_OOM, "%s: key '%s': out of memory", c->g->label, kv->key);
    for (uint64_t i = 0; i < kv->n; i++) HR_TRY(rd_str(c, &kv->strs[i], kv->key));
    return HR_OK;
}

/* The types hubrt reads are those with a hubrt dtype of the same bytes
 * (HR_QTYPE_LIST for the block types); their block sizes come from it. */
static bool known_type(uint32_t t) { return t < 64 && hr_gguf_type_dtype((ggml_type)t) != HR_DTYPE_COUNT; }
static uint64_t block_elems(ggml_type t) { return (uint64_t)hr_dtype_block(hr_gguf_type_dtype(t)); }
static uint64_t block_bytes(ggml_type t) {
    hr_dtype dt = hr_gguf_type_dtype(t);
    return hr_dtype_nbytes(dt, hr_dtype_block(dt));
}

static hr_status parse_tensor(cursor *c, gguf_tensor *t) {
    HR_TRY(rd_name(c, &t->name, "a tensor name"));
    const char *L = c->g->label;
    uint32_t nd = 0, ty = 0;
    HR_TRY(rd_u32(c, &nd, "a tensor rank"));
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return hr_error(HR_ERR_FORMAT, "%s: tensor '%s' has rank %u (1 to %d)", L, t->name, nd, GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t d = 0;
        HR_TRY(rd_u64(c, &d, "a tensor dim"));
        /* 2^40 per dim and 2^50 in all keep every size product below 2^63 */
        if (d > ((uint64_t)1 << 40) || (d && numel > ((uint64_t)1 << 50) / d))
            return hr_error(HR_ERR_FORMAT, "%s: tensor '%s': dim %u = %llu is too large", L, t->name, i,
                            (unsigned long long)d);
        t->ne[i] = (int64_t)d;
        numel *= d;
    }
    HR_TRY(rd_u32(c, &ty, "a tensor type"));
    if (!known_type(ty))
        return hr_error(HR_ERR_UNSUPPORTED, "%s: tensor '%s' has ggml type %u; hubrt reads F32, F16, BF16, Q8_0, "
                        "Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4", L, t->name, ty);
    t->type = (ggml_type)ty;
    HR_TRY(rd_u64(c, &t->offset, "a tensor offset"));
    uint64_t be = block_elems(t->type);
    if (t->ne[0] % (int64_t)be)
        return hr_error(HR_ERR_FORMAT, "%s: tensor '%s': first dim %lld is not a multiple of the block size %llu", L,
                        t->name, (long long)t->ne[0], (unsigned long long)be);
    t->nbytes = numel / be * block_bytes(t->type);
    return HR_OK;
}

static int off_cmp(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* No two keys or tensor names alike. */
static hr_status check_unique(const hr_gguf *g, char **names, size_t n, const char *what) {
    qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(names[i], names[i - 1]))
            return hr_error(HR_ERR_FORMAT, "%s: %s '%s' appears twice", g->label, what, names[i]);
    return HR_OK;
}

static hr_status check_layout(hr_gguf *g, cursor *c) {
    g->alignment = GGUF_DEFAULT_ALIGN;
    const gguf_kv *al = hr_gguf_find(g, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (al->type == GGUF_U32) memcpy(&a, al->data, 4);
        if (!a || (a & (a - 1)))
            return hr_error(HR_ERR_FORMAT, "%s: general.alignment must be a u32 power of two", g->label);
        g->alignment = a;
    }
    g->data_start = (c->pos + g->alignment - 1) / g->alignment * g->alignment;
    uint64_t data_size = g->data_start <= g->size ? g->size - g->data_start : 0;
    const gguf_tensor **by_off = malloc(sizeof *by_off * (g->n_tensors ? g->n_tensors : 1));
    if (!by_off) return hr_error(HR_ERR_OOM, "%s: out of memory", g->label);
    hr_status s = HR_OK;
    for (size_t i = 0; i < g->n_tensors && s == HR_OK; i++) {
        const gguf_tensor *t = &g->tensors[i];
        by_off[i] = t;
        if (t->offset % g->alignment)
            s = hr_error(HR_ERR_FORMAT, "%s: tensor '%s': offset %llu is not a multiple of the alignment %llu",
                         g->label, t->name, (unsigned long long)t->offset, (unsigned long long)g->alignment);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            s = hr_error(HR_ERR_FORMAT, "%s: tensor '%s': bytes [%llu, %llu) of the data section lie outside the "
                         "file (data section of %llu bytes)", g->label, t->name, (unsigned long long)t->offset,
                         (unsigned long long)(t->offset + t->nbytes), (unsigned long long)data_size);
    }
    if (s == HR_OK) qsort(by_off, g->n_tensors, sizeof *by_off, off_cmp);
    for (size_t i = 1; s == HR_OK && i < g->n_tensors; i++)
        if (by_off[i - 1]->offset + by_off[i - 1]->nbytes > by_off[i]->offset)
            s = hr_error(HR_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", g->label, by_off[i - 1]->name,
                         by_off[i]->name);
    free(by_off);
    return s;
}

static hr_status parse_all(hr_gguf *g) {
    cursor c = {g, 0};
    uint32_t magic = 0;
    uint64_t n_tensors = 0, n_kv = 0;
    if (rd_u32(&c, &magic, "the magic") != HR_OK || magic != GGUF_MAGIC)
        return hr_error(HR_ERR_FORMAT, "%s: not a GGUF file (bad magic)", g->label);
    HR_TRY(rd_u32(&c, &g->version, "the version"));
    if (g->version != 2 && g->version != 3)
        return hr_error(HR_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 or 3)", g->label, g->version);
    HR_TRY(rd_u64(&c, &n_tensors, "the tensor count"));
    HR_TRY(rd_u64(&c, &n_kv, "the metadata count"));
    /* a key takes >= 12 bytes, a tensor info >= 24: bound the counts by the file */
    size_t left = g->size - c.pos;
    if (n_kv > left / 12 || n_tensors > left / 24)
        return hr_error(HR_ERR_FORMAT, "%s: %llu tensors and %llu metadata keys cannot fit in %zu bytes", g->label,
                        (unsigned long long)n_tensors, (unsigned long long)n_kv, g->size);
    HR_TRY(hr_mem_check((size_t)n_kv * sizeof *g->kv + (size_t)n_tensors * sizeof *g->tensors, g->label));
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return hr_error(HR_ERR_OOM, "%s: out of memory", g->label);
    /* calloc'd entries are all freed by hr_gguf_close, filled or not */
    g->n_kv = n_kv;
    g->n_tensors = n_tensors;
    for (size_t i = 0; i < n_kv; i++) {
        HR_TRY(rd_name(&c, &g->kv[i].key, "a metadata key"));
        HR_TRY(parse_value(&c, &g->kv[i]));
    }
    for (size_t i = 0; i < n_tensors; i++) HR_TRY(parse_tensor(&c, &g->tensors[i]));
    size_t nn = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    char **names = malloc(sizeof *names * (nn ? nn : 1));
    if (!names) return hr_error(HR_ERR_OOM, "%s: out of memory", g->label);
    for (size_t i = 0; i < g->n_kv; i++) names[i] = g->kv[i].key;
    hr_status s = check_unique(g, names, g->n_kv, "metadata key");
    for (size_t i = 0; i < g->n_tensors; i++) names[i] = g->tensors[i].name;
    if (s == HR_OK) s = check_unique(g, names, g->n_tensors, "tensor");
    free(names);
    HR_TRY(s);
    return check_layout(g, &c);
}

hr_status hr_gguf_parse(const char *label, const uint8_t *buf, size_t size, hr_gguf **out) {
    *out = NULL;
    hr_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->label = strdup(label))) {
        free(g);
        return hr_error(HR_ERR_OOM, "%s: out of memory", label);
    }
    g->buf = buf;
    g->size = size;
    hr_status s = parse_all(g);
    if (s != HR_OK) {
        hr_gguf_close(g);
        return s;
    }
    *out = g;
    return HR_OK;
}

hr_status hr_gguf_open(const char *path, hr_gguf **out) {
    *out = NULL;
    hr_io_map *m = NULL;
    HR_TRY(hr_io_map_file(path, &m));
    hr_status s = hr_gguf_parse(path, m->addr ? m->addr : (const uint8_t *)"", m->len, out);
    if (s != HR_OK) {
        hr_io_map_release(m);
        return s;
    }
    (*out)->map = m;
    return HR_OK;
}

bool hr_gguf_drop_pages(const hr_gguf *g, const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p, lo = g->map ? (uintptr_t)g->map->addr : 0, hi = lo + (g->map ? g->map->len : 0);
    if (!g->map || a < lo || a + n > hi) return false;
    if (n) hr_io_advise(p, n, MADV_DONTNEED);
    return true;
}

void hr_gguf_drop_tensor(const hr_gguf *g, const gguf_tensor *t) {
    hr_gguf_drop_pages(g, g->buf + g->data_start + t->offset, (size_t)t->nbytes);
}

hr_dtype hr_gguf_stored_dtype(const gguf_tensor *t) { return hr_gguf_type_dtype(t->type); }

int hr_gguf_dtype_type(hr_dtype dt) {
    for (int t = 0; t < 64; t++)
        if (hr_gguf_type_dtype((ggml_type)t) == dt) return t;
    return -1;
}

hr_dtype hr_gguf_type_dtype(ggml_type type) {
    switch (type) {
    case GGML_F32: return HR_F32;
    case GGML_F16: return HR_F16;
    case GGML_BF16: return HR_BF16;
    case GGML_Q8_0: return HR_Q8_0;
    case GGML_Q4_0: return HR_Q4_0;
    case GGML_Q4_1: return HR_Q4_1;
    case GGML_Q5_0: return HR_Q5_0;
    case GGML_Q5_1: return HR_Q5_1;
    case GGML_Q2_K: return HR_Q2_K;
    case GGML_Q3_K: return HR_Q3_K;
    case GGML_Q4_K: return HR_Q4_K;
    case GGML_Q5_K: return HR_Q5_K;
    case GGML_Q6_K: return HR_Q6_K;
    case GGML_IQ4_NL: return HR_IQ4_NL;
    case GGML_IQ4_XS: return HR_IQ4_XS;
    case GGML_MXFP4: return HR_MXFP4;
    }
    return HR_DTYPE_COUNT;
}

static void row_major_shape(const gguf_tensor *t, int64_t *shape) {
    for (int i = 0; i < t->ndim; i++) shape[i] = t->ne[t->ndim - 1 - i];
}

hr_status hr_gguf_view(const hr_gguf *g, const gguf_tensor *t, hr_tensor **out) {
    *out = NULL;
    hr_dtype dt = hr_gguf_stored_dtype(t);
    if (!g->map || dt == HR_DTYPE_COUNT)
        return hr_error(HR_ERR_UNSUPPORTED, "%s: tensor '%s' has no zero-copy view (an unknown type, or no file map)",
                        g->label, t->name);
    int64_t shape[GGUF_MAX_DIMS];
    row_major_shape(t, shape);
    void *p = (void *)(g->buf + g->data_start + t->offset);
    HR_TRY(hr_tensor_wrap_host(dt, t->ndim, shape, NULL, p, (size_t)t->nbytes, hr_io_map_release, g->map, out));
    hr_io_map_retain(g->map);
    hr_tensor_set_name(*out, t->name);
    return HR_OK;
}

hr_status hr_gguf_rows_permuted(const hr_gguf *g, const gguf_tensor *t, int64_t heads, hr_tensor **out) {
    *out = NULL;
    hr_dtype dt = hr_gguf_stored_dtype(t);
    if (dt == HR_DTYPE_COUNT || t->ndim != 2 || heads <= 0 || t->ne[1] % (2 * heads))
        return hr_error(HR_ERR_SHAPE, "%s: tensor '%s': %lld rows do not split into %lld heads of pairs", g->label,
                        t->name, (long long)t->ne[1], (long long)heads);
    int64_t shape[2];
    row_major_shape(t, shape);
    HR_TRY(hr_tensor_empty(hr_device_cpu(), dt, 2, shape, out));
    size_t row = hr_dtype_nbytes(dt, shape[1]);
    const uint8_t *src = g->buf + g->data_start + t->offset;
    uint8_t *dst = hr_tensor_ptr(*out);
    for (int64_t r = 0; r < shape[0]; r++) memcpy(dst + (size_t)r * row, src + (size_t)hr_gguf_src_row(shape[0], heads, r) * row, row);
    hr_tensor_set_name(*out, t->name);
    return HR_OK;
}

void hr_gguf_close(hr_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].strs);
    }
    for (size_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    hr_io_map_release(g->map);
    free(g->label);
    free(g);
}

const gguf_kv *hr_gguf_find(const hr_gguf *g, const char *key) {
    for (size_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

long hr_gguf_tensor_index(const hr_gguf *g, const char *name) {
    for (size_t i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return (long)i;
    return -1;
}

static bool is_int(gguf_type t) { return t <= GGUF_I32 || t == GGUF_U64 || t == GGUF_I64; }

static int64_t load_int(gguf_type t, const uint8_t *p) {
    switch (t) {
    case GGUF_U8: return *p;
    case GGUF_I8: return (int8_t)*p;
    case GGUF_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_U64: { uint64_t v; memcpy(&v, p, 8); return v > INT64_MAX ? INT64_MAX : (int64_t)v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
    }
}

int64_t hr_gguf_arr_int(const gguf_kv *kv, uint64_t i) {
    return load_int(kv->arr_type, kv->data + i * type_size(kv->arr_type));
}

static hr_status lookup(const hr_gguf *g, const char *key, const gguf_kv **out) {
    *out = hr_gguf_find(g, key);
    if (!*out) return hr_error(HR_ERR_NOT_FOUND, "%s: missing metadata key '%s'", g->label, key);
    return HR_OK;
}

hr_status hr_gguf_get_int(const hr_gguf *g, const char *key, int64_t *out) {
    const gguf_kv *kv;
    HR_TRY(lookup(g, key, &kv));
    if (!is_int(kv->type)) return hr_error(HR_ERR_FORMAT, "%s: metadata key '%s' must be an integer", g->label, key);
    *out = load_int(kv->type, kv->data);
    return HR_OK;
}

hr_status hr_gguf_get_num(const hr_gguf *g, const char *key, double *out) {
    const gguf_kv *kv;
    HR_TRY(lookup(g, key, &kv));
    if (kv->type == GGUF_F32) {
        float f;
        memcpy(&f, kv->data, 4);
        *out = f;
    } else if (kv->type == GGUF_F64) {
        memcpy(out, kv->data, 8);
    } else if (is_int(kv->type)) {
        *out = (double)load_int(kv->type, kv->data);
    } else {
        return hr_error(HR_ERR_FORMAT, "%s: metadata key '%s' must be a number", g->label, key);
    }
    return HR_OK;
}

hr_status hr_gguf_get_str(const hr_gguf *g, const char *key, gguf_str *out) {
    const gguf_kv *kv;
    HR_TRY(lookup(g, key, &kv));
    if (kv->type != GGUF_STRING) return hr_error(HR_ERR_FORMAT, "%s: metadata key '%s' must be a string", g->label, key);
    *out = kv->strs[0];
    return HR_OK;
}
