/* Tensor functions that run ops: zero fills on devices without host
 * memory, scalars, copies across devices, host reads of strided views, and
 * quantizing into block types. */
#include <stdlib.h>
#include <string.h>

#include "core/dequant.h"
#include "core/error.h"
#include "core/threadpool.h"
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

typedef struct quant_job {
    const char *src;
    hr_dtype sdt, dt;
    int64_t rows, cols;
    uint8_t *dst;
    float *tmp; /* [threads][cols] */
} quant_job;

static void quant_rows(void *arg, int ith, int nth) {
    const quant_job *j = arg;
    int64_t b, e;
    hr_split_range(j->rows, ith, nth, &b, &e);
    float *f = j->tmp + (size_t)ith * (size_t)j->cols;
    size_t in_row = (size_t)j->cols * hr_dtype_size(j->sdt), out_row = hr_dtype_nbytes(j->dt, j->cols);
    for (int64_t r = b; r < e; r++) {
        hr_dequant_row(j->sdt, (const uint8_t *)j->src + (size_t)r * in_row, f, j->cols);
        hr_quantize_row(j->dt, f, j->dst + (size_t)r * out_row, j->cols);
    }
}

hr_status hr_tensor_quantize(const hr_tensor *t, hr_dtype dt, hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_tensor_quantize: NULL argument");
    *out = NULL;
    char label[200];
    hr_tensor_label(t, label, sizeof label);
    if (!hr_quantize_supported(dt))
        return hr_error(HR_ERR_DTYPE, "quantize %s: hubrt quantizes into q8_0, q4_0, q4_1, q5_0, q5_1, mxfp4, q4_k, q5_k and q6_k, not %s", label,
                        hr_dtype_name(dt));
    if (t->dtype != HR_F32 && t->dtype != HR_BF16 && t->dtype != HR_F16)
        return hr_error(HR_ERR_DTYPE, "quantize %s: the values must be f32, bf16 or f16", label);
    if (!t->buf->device->host_visible)
        return hr_error(HR_ERR_UNSUPPORTED, "quantize %s: the tensor must be in host memory", label);
    int64_t block = hr_dtype_block(dt);
    if (t->ndim < 1 || t->shape[t->ndim - 1] % block)
        return hr_error(HR_ERR_SHAPE, "quantize %s: the last dim must be a multiple of %lld (%s's block)", label,
                        (long long)block, hr_dtype_name(dt));
    hr_tensor *c = NULL;
    if (!hr_tensor_is_contiguous(t)) HR_TRY(hr_contiguous(t, &c));
    const hr_tensor *s = c ? c : t;
    quant_job j = {.src = hr_tensor_ptr(s), .sdt = s->dtype, .dt = dt, .cols = t->shape[t->ndim - 1]};
    j.rows = j.cols ? hr_tensor_numel(t) / j.cols : 0;
    int nth = hr_parallel_threads_for(j.rows * j.cols, HR_GRAIN_ROWS);
    hr_status st = hr_tensor_empty(hr_device_cpu(), dt, t->ndim, t->shape, out);
    if (st == HR_OK && j.rows * j.cols > 0) {
        j.dst = hr_tensor_ptr(*out);
        j.tmp = malloc(sizeof(float) * (size_t)nth * (size_t)j.cols);
        if (j.tmp) hr_parallel_run(quant_rows, &j, nth);
        else st = hr_error(HR_ERR_OOM, "quantize %s: out of memory", label);
        free(j.tmp);
    }
    hr_tensor_free(c);
    if (st != HR_OK) {
        hr_tensor_free(*out);
        *out = NULL;
        return st;
    }
    hr_tensor_set_name(*out, t->name);
    return HR_OK;
}
