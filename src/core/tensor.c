/* Tensors as plain data: refcounted buffers, shapes, metadata. Views are
 * in view.c; what needs a device (allocation, host copies) is in
 * device/device_tensor.c, what runs an op (fills, copies across devices)
 * in ops/tensor_ops.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/tensor_impl.h"

_Thread_local void (*hr_host_write_hook)(const hr_buffer *buf);

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
    buf->release(buf); /* set by whoever made the buffer (device/device_tensor.c) */
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

hr_status hr_shape_check(hr_dtype dt, int ndim, const int64_t *shape, const char *what) {
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
    int64_t blk = hr_dtype_block(dt);
    if (blk > 1 && (ndim < 1 || shape[ndim - 1] % blk))
        return hr_error(HR_ERR_SHAPE, "%s: %s stores rows in blocks of %lld elements; a last dim of %lld does not divide",
                        what, hr_dtype_name(dt), (long long)blk, ndim < 1 ? 0LL : (long long)shape[ndim - 1]);
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
size_t hr_tensor_nbytes(const hr_tensor *t) { return hr_dtype_nbytes(t->dtype, hr_tensor_numel(t)); }
hr_device *hr_tensor_device(const hr_tensor *t) { return t->buf->device; }
const char *hr_tensor_name(const hr_tensor *t) { return t->name; }

void hr_tensor_set_name(hr_tensor *t, const char *name) {
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
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

