/* Internal layout of tensors, buffers and devices. */
#ifndef HR_CORE_TENSOR_IMPL_H
#define HR_CORE_TENSOR_IMPL_H

#include <stdatomic.h>

#include "hubrt/ops.h"

/* A second copy of a buffer's [n, k] bf16 matrix (linear's weight, at
 * element `offset`, rows k apart) in the layout the CPU linear kernels read
 * fastest, made once (backends/cpu/linear_pack.c). The buffer's own data
 * stays valid: every other reader uses it. */
typedef struct hr_packed_weight {
    int64_t offset, n, k;
    hr_dtype dt; /* of the weight packed */
    const void *data;
    void (*release)(void *ctx); /* frees data; may be NULL */
    void *release_ctx;
} hr_packed_weight;

/* Refcounted storage owned by a device. */
struct hr_buffer {
    atomic_int refcount;
    hr_device *device;
    void *data;    /* host address for host-visible devices, device handle otherwise */
    size_t nbytes;
    /* Frees `data` (and the buffer): the device's buffer_free for device
     * allocations (hr_device_buffer_alloc), the wrapper's for zero-copy
     * wraps (mmap views). Never NULL once the buffer is handed out. */
    void (*release)(hr_buffer *buf);
    void *release_ctx;
    /* Handed out zero-filled by the allocator (fresh anonymous memory):
     * hr_tensor_zeros skips its fill. */
    bool zeroed;
    /* The packed copy of the matrix it holds, or NULL; dropped when an op
     * writes the buffer. */
    _Atomic(hr_packed_weight *) packed;
    /* The buffer this one stands for, whose packed copy applies to it: a
     * compiled plan's binding of a weight it retains; NULL otherwise. */
    const hr_buffer *origin;
    /* Unique creation number: identifies the buffer in a captured graph and
     * tells whether it existed before a capture started. */
    uint64_t seq;
};

#define HR_TENSOR_NAME_CAP 128

struct hr_tensor {
    hr_dtype dtype;
    int ndim;
    int64_t shape[HR_MAX_DIMS];
    int64_t strides[HR_MAX_DIMS]; /* in elements; 0 for broadcast dims */
    int64_t offset;               /* in elements from buf->data */
    hr_buffer *buf;
    char name[HR_TENSOR_NAME_CAP];
};

/* Shape and dtype without storage: what inference produces. */
typedef struct hr_tensor_meta {
    hr_dtype dtype;
    int ndim;
    int64_t shape[HR_MAX_DIMS];
} hr_tensor_meta;

hr_buffer *hr_buffer_retain(hr_buffer *buf);
/* Frees buf's packed copy, if any (the buffer is about to change). */
void hr_buffer_drop_packed(hr_buffer *buf);
uint64_t hr_buffer_next_seq(void);
void hr_buffer_release(hr_buffer *buf);
/* A tensor struct over `buf` (retained) with contiguous strides. */
hr_status hr_tensor_over_buffer(hr_buffer *buf, hr_dtype dt, int ndim, const int64_t *shape,
                                int64_t offset, hr_tensor **out);
hr_status hr_tensor_empty_meta(hr_device *dev, const hr_tensor_meta *m, hr_tensor **out);
int64_t hr_shape_numel(int ndim, const int64_t *shape);
void hr_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Checks a dtype, rank and sizes given for a new tensor; `what` names the
 * caller in errors. */
hr_status hr_shape_check(hr_dtype dt, int ndim, const int64_t *shape, const char *what);
/* Resolves one -1 in `shape` for a view of t and checks the element count
 * into res; the strides of such a view without a copy, as torch's
 * computeStride (false when none exist). */
hr_status hr_view_shape(const hr_tensor *t, int ndim, const int64_t *shape, int64_t *res);
bool hr_view_strides(const hr_tensor *t, int ndim, const int64_t *shape, int64_t *strides);
/* A trace running on this thread (ops/capture.c) is told of every buffer
 * host memory is written into, since a function that builds tensors from
 * host data during a capture cannot be replayed. Core and device code
 * report here (the layers below the trace); NULL when no trace runs. */
extern _Thread_local void (*hr_host_write_hook)(const hr_buffer *buf);
static inline void hr_note_host_write(const hr_buffer *buf) {
    if (hr_host_write_hook) hr_host_write_hook(buf);
}
/* Wraps a negative dim and checks range; `what` names the op for errors. */
hr_status hr_norm_dim(int64_t dim, int ndim, const char *what, int *out);
/* Human label for errors: the tensor's name or "tensor [2, 3] bf16". */
const char *hr_tensor_label(const hr_tensor *t, char *buf, size_t n);

/* A block-quantized tensor's offset is a whole number of its rows (views
 * keep whole rows), so of blocks. */
static inline void *hr_tensor_ptr(const hr_tensor *t) {
    return (char *)t->buf->data + hr_dtype_nbytes(t->dtype, t->offset);
}

#endif
