/* Tensor functions that run ops: zero fills on devices without host
 * memory, scalars, copies across devices and host reads of strided views. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "device/device_impl.h"
#include "ops/capture.h"

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

hr_status hr_tensor_scalar(hr_device *dev, hr_dtype dt, double value, hr_tensor **out) {
    return hr_fill(dev, dt, 0, NULL, value, out);
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
    size_t off = hr_dtype_nbytes(t->dtype, t->offset);
    if (dev->host_visible) {
        memcpy(dst, (char *)t->buf->data + off, n);
        return HR_OK;
    }
    return dev->vt->copy_to_host(dev, t->buf, off, dst, n);
}

/* A view where the strides allow one, a contiguous copy otherwise. */
hr_status hr_tensor_reshape(const hr_tensor *t, int ndim, const int64_t *shape, hr_tensor **out) {
    if (!t || !out || (ndim && !shape)) return hr_error(HR_ERR_INVALID_ARG, "reshape: NULL argument");
    *out = NULL;
    int64_t res[HR_MAX_DIMS], strides[HR_MAX_DIMS];
    HR_TRY(hr_view_shape(t, ndim, shape, res));
    if (hr_view_strides(t, ndim, res, strides)) return hr_tensor_view(t, ndim, res, out);
    hr_tensor *c;
    HR_TRY(hr_contiguous(t, &c));
    hr_status s = hr_tensor_view(c, ndim, res, out);
    hr_tensor_free(c);
    return s;
}
