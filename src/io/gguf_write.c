/* GGUF v3 writer (gguf_write.h): little-endian, as ggml reads it. */
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/gguf_write.h"

#define ALIGN 32

typedef hr_bytes bytes;

static void put(bytes *b, const void *p, size_t n) { hr_bytes_put(b, p, n); }

static void put_u32(bytes *b, uint32_t v) {
    uint8_t t[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, t, 4);
}

static void put_u64(bytes *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(bytes *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}

typedef struct w_tensor {
    char *name;
    int ndim;
    int64_t ne[GGUF_MAX_DIMS];
    ggml_type type;
    uint64_t nbytes, offset;
    hr_gguf_emit_fn emit;
    void *ctx;
} w_tensor;

struct hr_gguf_writer {
    char *label;
    bytes kv;
    uint64_t n_kv;
    char **keys;
    w_tensor *t;
    size_t n_t, cap_t;
};

struct hr_gguf_sink {
    hr_atomic_file *f;
    uint64_t written;
};

hr_status hr_gguf_writer_new(const char *label, hr_gguf_writer **out) {
    *out = calloc(1, sizeof **out);
    if (!*out || !((*out)->label = strdup(label))) {
        free(*out);
        *out = NULL;
        return hr_error(HR_ERR_OOM, "%s: out of memory", label);
    }
    return HR_OK;
}

void hr_gguf_writer_free(hr_gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->kv.p);
    free(w->label);
    free(w);
}

bool hr_gguf_w_has(const hr_gguf_writer *w, const char *key) {
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return true;
    return false;
}

/* The key and value type; the caller appends the value. */
static hr_status key(hr_gguf_writer *w, const char *k, gguf_type type) {
    if (hr_gguf_w_has(w, k)) return hr_error(HR_ERR_INVALID_ARG, "%s: metadata key '%s' written twice", w->label, k);
    char **keys = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *keys);
    if (!keys) return hr_error(HR_ERR_OOM, "%s: out of memory", w->label);
    w->keys = keys;
    if (!(keys[w->n_kv] = strdup(k))) return hr_error(HR_ERR_OOM, "%s: out of memory", w->label);
    w->n_kv++;
    put_str(&w->kv, k, strlen(k));
    put_u32(&w->kv, (uint32_t)type);
    return HR_OK;
}

static hr_status done(hr_gguf_writer *w) {
    return w->kv.oom ? hr_error(HR_ERR_OOM, "%s: out of memory building the metadata", w->label) : HR_OK;
}

hr_status hr_gguf_w_str(hr_gguf_writer *w, const char *k, const char *v) {
    HR_TRY(key(w, k, GGUF_STRING));
    put_str(&w->kv, v, strlen(v));
    return done(w);
}

hr_status hr_gguf_w_u32(hr_gguf_writer *w, const char *k, uint32_t v) {
    HR_TRY(key(w, k, GGUF_U32));
    put_u32(&w->kv, v);
    return done(w);
}

hr_status hr_gguf_w_f32(hr_gguf_writer *w, const char *k, float v) {
    HR_TRY(key(w, k, GGUF_F32));
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(&w->kv, u);
    return done(w);
}

hr_status hr_gguf_w_bool(hr_gguf_writer *w, const char *k, bool v) {
    HR_TRY(key(w, k, GGUF_BOOL));
    uint8_t b = v;
    put(&w->kv, &b, 1);
    return done(w);
}

hr_status hr_gguf_w_arr_str(hr_gguf_writer *w, const char *k, const char *const *v, const size_t *lens, uint64_t n) {
    HR_TRY(key(w, k, GGUF_ARRAY));
    put_u32(&w->kv, GGUF_STRING);
    put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++) put_str(&w->kv, v[i], lens ? lens[i] : strlen(v[i]));
    return done(w);
}

hr_status hr_gguf_w_arr_i32(hr_gguf_writer *w, const char *k, const int32_t *v, uint64_t n) {
    HR_TRY(key(w, k, GGUF_ARRAY));
    put_u32(&w->kv, GGUF_I32);
    put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++) put_u32(&w->kv, (uint32_t)v[i]);
    return done(w);
}

hr_status hr_gguf_w_tensor(hr_gguf_writer *w, const char *name, int ndim, const int64_t *ne, ggml_type type,
                           hr_gguf_emit_fn emit, void *ctx) {
    hr_dtype dt = hr_gguf_type_dtype(type);
    if (dt == HR_DTYPE_COUNT) return hr_error(HR_ERR_DTYPE, "%s: tensor '%s': ggml type %d", w->label, name, (int)type);
    if (ndim < 1 || ndim > GGUF_MAX_DIMS || ne[0] % hr_dtype_block(dt))
        return hr_error(HR_ERR_SHAPE, "%s: tensor '%s': %d dims, the first %lld (a multiple of %lld for %s)", w->label,
                        name, ndim, (long long)ne[0], (long long)hr_dtype_block(dt), hr_dtype_name(dt));
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return hr_error(HR_ERR_INVALID_ARG, "%s: tensor '%s' written twice", w->label, name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        w_tensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return hr_error(HR_ERR_OOM, "%s: out of memory", w->label);
        w->t = t, w->cap_t = cap;
    }
    w_tensor *t = &w->t[w->n_t];
    *t = (w_tensor){.name = strdup(name), .ndim = ndim, .type = type, .emit = emit, .ctx = ctx};
    if (!t->name) return hr_error(HR_ERR_OOM, "%s: out of memory", w->label);
    uint64_t rows = 1;
    for (int d = 0; d < ndim; d++) {
        if (ne[d] < 1) return hr_error(HR_ERR_SHAPE, "%s: tensor '%s': dim %d is %lld", w->label, name, d, (long long)ne[d]);
        t->ne[d] = ne[d];
        if (d) rows *= (uint64_t)ne[d];
    }
    t->nbytes = rows * hr_dtype_nbytes(dt, ne[0]);
    w->n_t++;
    return HR_OK;
}

static uint64_t pad(uint64_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

hr_status hr_gguf_sink_put(hr_gguf_sink *s, const void *p, size_t n) {
    s->written += n;
    return hr_atomic_write(s->f, p, n);
}

const char *hr_gguf_sink_label(const hr_gguf_sink *s) { return s->f->path; }

hr_status hr_gguf_w_write(hr_gguf_writer *w, const char *path) {
    HR_TRY(done(w));
    bytes h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, w->n_t);
    put_u64(&h, w->n_kv);
    put(&h, w->kv.p, w->kv.len);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w_tensor *t = &w->t[i];
        put_str(&h, t->name, strlen(t->name));
        put_u32(&h, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) put_u64(&h, (uint64_t)t->ne[d]);
        put_u32(&h, (uint32_t)t->type);
        t->offset = off;
        put_u64(&h, off);
        off = pad(off + t->nbytes);
    }
    if (h.oom) {
        free(h.p);
        return hr_error(HR_ERR_OOM, "%s: out of memory building the header", path);
    }
    hr_atomic_file f;
    hr_status s = hr_atomic_open(&f, path);
    if (s != HR_OK) {
        free(h.p);
        return s;
    }
    s = hr_atomic_write(&f, h.p, h.len);
    if (s == HR_OK) s = hr_atomic_zeros(&f, pad(h.len) - h.len);
    free(h.p);
    for (size_t i = 0; i < w->n_t && s == HR_OK; i++) {
        w_tensor *t = &w->t[i];
        hr_gguf_sink sink = {.f = &f};
        s = t->emit(t->ctx, &sink);
        if (s != HR_OK) s = hr_error_context(s, "%s: tensor '%s'", path, t->name);
        else if (sink.written != t->nbytes)
            s = hr_error(HR_ERR_INTERNAL, "%s: tensor '%s' gave %llu bytes, not %llu", path, t->name,
                         (unsigned long long)sink.written, (unsigned long long)t->nbytes);
        else s = hr_atomic_zeros(&f, pad(t->nbytes) - t->nbytes);
    }
    if (s != HR_OK) {
        hr_atomic_abort(&f);
        return s;
    }
    return hr_atomic_commit(&f);
}
