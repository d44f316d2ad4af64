/* Tensors: creation, metadata, refcounted buffers. Views are in view.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "device/device_impl.h"
#include "graph/capture.h"

static atomic_uint_fast64_t g_buffer_seq;

uint64_t hr_buffer_next_seq(void) { return atomic_fetch_add(&g_buffer_seq, 1) + 1; }

hr_buffer *hr_buffer_retain(hr_buffer *buf) {
    atomic_fetch_add_explicit(&buf->refcount, 1, memory_order_relaxed);
    return buf;
}

void hr_buffer_drop_packed(hr_buffer *buf) {
    hr_packed_weight *p = atomic_exchange_explicit(&buf->packed, NULL, memory_order_acq_rel);
    if (!p) return;
    if (p->release) p->release(p->release_ctx);
    free(p);
}

void hr_buffer_release(hr_buffer *buf) {
    if (!buf) return;
    if (atomic_fetch_sub_explicit(&buf->refcount, 1, memory_order_acq_rel) != 1) return;
    hr_buffer_drop_packed(buf);
    if (buf->release)
        buf->release(buf);
    else
        buf->device->vt->buffer_free(buf);
}

int64_t hr_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void hr_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

hr_status hr_norm_dim(int64_t dim, int ndim, const char *what, int *out) {
    int64_t d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= ndim)
        return hr_error(HR_ERR_INVALID_ARG, "%s: dim %lld out of range for a %d-dim tensor",
                        what, (long long)dim, ndim);
    *out = (int)d;
    return HR_OK;
}

char *hr_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t used = 0;
    if (n == 0) return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

const char *hr_tensor_label(const hr_tensor *t, char *buf, size_t n) {
    if (t->name[0]) {
        snprintf(buf, n, "'%s'", t->name);
    } else {
        char s[160];
        snprintf(buf, n, "tensor %s %s", hr_shape_str(t->ndim, t->shape, s, sizeof s),
                 hr_dtype_name(t->dtype));
    }
    return buf;
}

static hr_status check_shape(hr_dtype dt, int ndim, const int64_t *shape, const char *what) {
    if ((unsigned)dt >= HR_DTYPE_COUNT)
        return hr_error(HR_ERR_DTYPE, "%s: invalid dtype %d", what, (int)dt);
    if (ndim < 0 || ndim > HR_MAX_DIMS)
        return hr_error(HR_ERR_SHAPE, "%s: rank %d outside 0..%d", what, ndim, HR_MAX_DIMS);
    if (ndim > 0 && !shape) return hr_error(HR_ERR_INVALID_ARG, "%s: shape is NULL", what);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return hr_error(HR_ERR_SHAPE, "%s: negative size %lld at dim %d", what,
                            (long long)shape[i], i);
        if (shape[i] && n > INT64_MAX / 16 / shape[i])
            return hr_error(HR_ERR_SHAPE, "%s: shape too large", what);
        n *= shape[i];
    }
    return HR_OK;
}

hr_status hr_tensor_over_buffer(hr_buffer *buf, hr_dtype dt, int ndim, const int64_t *shape,
                                int64_t offset, hr_tensor **out) {
    hr_tensor *t = calloc(1, sizeof *t);
    if (!t) return hr_error(HR_ERR_OOM, "out of memory allocating a tensor");
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    hr_contiguous_strides(ndim, t->shape, t->strides);
    t->offset = offset;
    t->buf = hr_buffer_retain(buf);
    *out = t;
    return HR_OK;
}

hr_status hr_tensor_empty(hr_device *dev, hr_dtype dt, int ndim, const int64_t *shape,
                          hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_empty: out is NULL");
    *out = NULL;
    if (!dev) dev = hr_device_cpu();
    HR_TRY(check_shape(dt, ndim, shape, "hr_tensor_empty"));
    size_t nbytes = (size_t)hr_shape_numel(ndim, shape) * hr_dtype_size(dt);
    hr_buffer *buf;
    HR_TRY(dev->vt->buffer_alloc(dev, nbytes, &buf));
    buf->seq = hr_buffer_next_seq();
    hr_status s = hr_tensor_over_buffer(buf, dt, ndim, shape, 0, out);
    hr_buffer_release(buf); /* the tensor holds the only reference */
    return s;
}

hr_status hr_tensor_empty_meta(hr_device *dev, const hr_tensor_meta *m, hr_tensor **out) {
    return hr_tensor_empty(dev, m->dtype, m->ndim, m->shape, out);
}

hr_status hr_tensor_zeros(hr_device *dev, hr_dtype dt, int ndim, const int64_t *shape,
                          hr_tensor **out) {
    HR_TRY(hr_tensor_empty(dev, dt, ndim, shape, out));
    hr_device *d = (*out)->buf->device;
    if (d->host_visible && !hr_capture_active()) {
        if (!(*out)->buf->zeroed) memset((*out)->buf->data, 0, (*out)->buf->nbytes);
        return HR_OK;
    }
    hr_tensor *z = *out;
    *out = NULL;
    hr_status s = hr_fill(d, dt, ndim, shape, 0.0, out);
    hr_tensor_free(z);
    return s;
}

hr_status hr_tensor_from_host(hr_device *dev, hr_dtype dt, int ndim, const int64_t *shape,
                              const void *data, size_t nbytes, hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_from_host: out is NULL");
    *out = NULL;
    HR_TRY(check_shape(dt, ndim, shape, "hr_tensor_from_host"));
    size_t want = (size_t)hr_shape_numel(ndim, shape) * hr_dtype_size(dt);
    if (nbytes != want)
        return hr_error(HR_ERR_INVALID_ARG,
                        "hr_tensor_from_host: got %zu bytes, shape and dtype need %zu", nbytes,
                        want);
    if (want && !data) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_from_host: data is NULL");
    HR_TRY(hr_tensor_empty(dev, dt, ndim, shape, out));
    hr_device *d = (*out)->buf->device;
    hr_capture_note_host_write((*out)->buf);
    hr_status s = want ? d->vt->copy_from_host(d, (*out)->buf, 0, data, want) : HR_OK;
    if (s != HR_OK) {
        hr_tensor_free(*out);
        *out = NULL;
    }
    return s;
}

typedef struct {
    void (*release)(void *);
    void *ctx;
} wrap_ctx;

static void wrap_release(hr_buffer *buf) {
    wrap_ctx *w = buf->release_ctx;
    if (w && w->release) w->release(w->ctx);
    free(w);
    free(buf);
}

hr_status hr_tensor_wrap_host(hr_dtype dt, int ndim, const int64_t *shape,
                              const int64_t *strides, void *data, size_t nbytes,
                              void (*release)(void *), void *ctx, hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_wrap_host: out is NULL");
    *out = NULL;
    HR_TRY(check_shape(dt, ndim, shape, "hr_tensor_wrap_host"));
    /* Every element the strides can reach must lie inside [data, data+nbytes). */
    int64_t last = 0;
    int64_t cstrides[HR_MAX_DIMS];
    hr_contiguous_strides(ndim, shape, cstrides);
    const int64_t *st = strides ? strides : cstrides;
    bool empty = hr_shape_numel(ndim, shape) == 0;
    for (int i = 0; i < ndim && !empty; i++) {
        if (st[i] < 0)
            return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_wrap_host: negative stride at dim %d",
                            i);
        last += (shape[i] - 1) * st[i];
    }
    if (!empty && (size_t)(last + 1) * hr_dtype_size(dt) > nbytes)
        return hr_error(HR_ERR_INVALID_ARG,
                        "hr_tensor_wrap_host: shape and strides reach past the %zu bytes given",
                        nbytes);
    hr_buffer *buf = calloc(1, sizeof *buf);
    wrap_ctx *w = calloc(1, sizeof *w);
    hr_tensor *t = calloc(1, sizeof *t);
    if (!buf || !w || !t) {
        free(buf), free(w), free(t);
        return hr_error(HR_ERR_OOM, "out of memory wrapping host data");
    }
    w->release = release;
    w->ctx = ctx;
    atomic_init(&buf->refcount, 1);
    buf->device = hr_device_cpu();
    buf->data = data;
    buf->nbytes = nbytes;
    buf->release = wrap_release;
    buf->release_ctx = w;
    buf->seq = hr_buffer_next_seq();
    hr_capture_note_host_write(buf);
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) {
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
        memcpy(t->strides, st, sizeof(int64_t) * (size_t)ndim);
    }
    t->buf = buf;
    *out = t;
    return HR_OK;
}

hr_status hr_tensor_scalar(hr_device *dev, hr_dtype dt, double value, hr_tensor **out) {
    return hr_fill(dev, dt, 0, NULL, value, out);
}

void hr_tensor_free(hr_tensor *t) {
    if (!t) return;
    hr_buffer_release(t->buf);
    free(t);
}

hr_dtype hr_tensor_dtype(const hr_tensor *t) { return t->dtype; }
int hr_tensor_ndim(const hr_tensor *t) { return t->ndim; }
const int64_t *hr_tensor_shape(const hr_tensor *t) { return t->shape; }
const int64_t *hr_tensor_strides(const hr_tensor *t) { return t->strides; }
int64_t hr_tensor_offset(const hr_tensor *t) { return t->offset; }
int64_t hr_tensor_numel(const hr_tensor *t) { return hr_shape_numel(t->ndim, t->shape); }
size_t hr_tensor_nbytes(const hr_tensor *t) {
    return (size_t)hr_tensor_numel(t) * hr_dtype_size(t->dtype);
}
hr_device *hr_tensor_device(const hr_tensor *t) { return t->buf->device; }
const char *hr_tensor_name(const hr_tensor *t) { return t->name; }

void hr_tensor_set_name(hr_tensor *t, const char *name) {
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
}

void *hr_tensor_data(const hr_tensor *t) {
    return t->buf->device->host_visible ? hr_tensor_ptr(t) : NULL;
}

bool hr_tensor_is_contiguous(const hr_tensor *t) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (t->shape[i] == 0) return true;
        if (t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

hr_status hr_tensor_to(const hr_tensor *t, hr_device *dev, hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_to: NULL argument");
    *out = NULL;
    hr_device *src = t->buf->device;
    if (src == dev) return hr_contiguous(t, out);
    /* Cross-device copies go through the host in contiguous form. */
    size_t n = hr_tensor_nbytes(t);
    void *tmp = malloc(n ? n : 1);
    if (!tmp) return hr_error(HR_ERR_OOM, "hr_tensor_to: out of memory (%zu bytes)", n);
    hr_status s = hr_tensor_read(t, tmp, n);
    if (s == HR_OK) s = hr_tensor_from_host(dev, t->dtype, t->ndim, t->shape, tmp, n, out);
    free(tmp);
    return s;
}

hr_status hr_tensor_read(const hr_tensor *t, void *dst, size_t nbytes) {
    if (!t || (!dst && nbytes)) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_read: NULL argument");
    HR_TRY(hr_capture_check_host_read(t));
    size_t n = hr_tensor_nbytes(t);
    if (nbytes != n)
        return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_read: buffer has %zu bytes, tensor %zu",
                        nbytes, n);
    if (n == 0) return HR_OK;
    hr_device *dev = t->buf->device;
    if (!hr_tensor_is_contiguous(t)) {
        hr_tensor *c;
        HR_TRY(hr_contiguous(t, &c));
        hr_status s = hr_tensor_read(c, dst, nbytes);
        hr_tensor_free(c);
        return s;
    }
    size_t off = (size_t)t->offset * hr_dtype_size(t->dtype);
    if (dev->host_visible) {
        memcpy(dst, (char *)t->buf->data + off, n);
        return HR_OK;
    }
    return dev->vt->copy_to_host(dev, t->buf, off, dst, n);
}
