/* Tensors on a device: allocation through the device's vtable, host data
 * copied or wrapped in, and the host pointer of host-visible buffers. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "device/device_impl.h"

/* A device buffer whose backend left `release` unset is freed by the
 * backend's buffer_free. */
static void device_buffer_free(hr_buffer *buf) { buf->device->vt->buffer_free(buf); }

hr_status hr_device_buffer_alloc(hr_device *dev, size_t nbytes, hr_buffer **out) {
    HR_TRY(dev->vt->buffer_alloc(dev, nbytes, out));
    if (!(*out)->release) (*out)->release = device_buffer_free;
    return HR_OK;
}

hr_status hr_tensor_empty(hr_device *dev, hr_dtype dt, int ndim, const int64_t *shape,
                          hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_empty: out is NULL");
    *out = NULL;
    if (!dev) dev = hr_device_cpu();
    HR_TRY(hr_shape_check(dt, ndim, shape, "hr_tensor_empty"));
    size_t nbytes = hr_dtype_nbytes(dt, hr_shape_numel(ndim, shape));
    hr_buffer *buf;
    HR_TRY(hr_device_buffer_alloc(dev, nbytes, &buf));
    buf->seq = hr_buffer_next_seq();
    hr_status s = hr_tensor_over_buffer(buf, dt, ndim, shape, 0, out);
    hr_buffer_release(buf); /* the tensor holds the only reference */
    return s;
}

hr_status hr_tensor_empty_meta(hr_device *dev, const hr_tensor_meta *m, hr_tensor **out) {
    return hr_tensor_empty(dev, m->dtype, m->ndim, m->shape, out);
}

hr_status hr_tensor_from_host(hr_device *dev, hr_dtype dt, int ndim, const int64_t *shape,
                              const void *data, size_t nbytes, hr_tensor **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_from_host: out is NULL");
    *out = NULL;
    HR_TRY(hr_shape_check(dt, ndim, shape, "hr_tensor_from_host"));
    size_t want = hr_dtype_nbytes(dt, hr_shape_numel(ndim, shape));
    if (nbytes != want)
        return hr_error(HR_ERR_INVALID_ARG,
                        "hr_tensor_from_host: got %zu bytes, shape and dtype need %zu", nbytes,
                        want);
    if (want && !data) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_from_host: data is NULL");
    HR_TRY(hr_tensor_empty(dev, dt, ndim, shape, out));
    hr_device *d = (*out)->buf->device;
    hr_note_host_write((*out)->buf);
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
    HR_TRY(hr_shape_check(dt, ndim, shape, "hr_tensor_wrap_host"));
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
    if (hr_dtype_is_quantized(dt) && strides && !empty && memcmp(strides, cstrides, sizeof(int64_t) * (size_t)ndim))
        return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_wrap_host: a %s tensor is wrapped row-major (no strides)",
                        hr_dtype_name(dt));
    if (!empty && hr_dtype_nbytes(dt, last + 1) > nbytes)
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
    hr_note_host_write(buf);
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

void *hr_tensor_data(const hr_tensor *t) {
    return t->buf->device->host_visible ? hr_tensor_ptr(t) : NULL;
}

