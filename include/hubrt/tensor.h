/* hubrt tensors and devices (public API).
 *
 * A tensor is plain data: dtype, rank (<= HR_MAX_DIMS), shape, strides in
 * elements, an offset in elements, and a refcounted buffer owned by a
 * device. A tensor handle has one owner (hr_tensor_free); views share the
 * buffer, which lives until its last tensor is freed. */
#ifndef HUBRT_TENSOR_H
#define HUBRT_TENSOR_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_device hr_device;
typedef struct hr_buffer hr_buffer;
typedef struct hr_tensor hr_tensor;

/* ---- devices ---------------------------------------------------------- */

/* Device string "name[:index]", e.g. "cpu", "cpu:0". The handle is owned by
 * the registry and lives until the process exits. */
HR_API hr_status hr_device_get(const char *spec, hr_device **out);
HR_API hr_device *hr_device_cpu(void);
HR_API const char *hr_device_name(const hr_device *dev); /* "cpu" */
HR_API int hr_device_index(const hr_device *dev);
HR_API hr_status hr_device_sync(hr_device *dev);
/* Names of the registered device backends, NULL-terminated. */
HR_API const char *const *hr_device_backends(void);

/* ---- creation ------------------------------------------------------- */

HR_API hr_status hr_tensor_empty(hr_device *dev, hr_dtype dt, int ndim,
                                 const int64_t *shape, hr_tensor **out);
HR_API hr_status hr_tensor_zeros(hr_device *dev, hr_dtype dt, int ndim,
                                 const int64_t *shape, hr_tensor **out);
/* Copies `nbytes` of contiguous host data (must equal numel * itemsize). */
HR_API hr_status hr_tensor_from_host(hr_device *dev, hr_dtype dt, int ndim,
                                     const int64_t *shape, const void *data,
                                     size_t nbytes, hr_tensor **out);
/* Zero-copy view of host memory the caller keeps alive; `release(ctx)` is
 * called when the last tensor over it is freed (may be NULL). `strides`
 * may be NULL for contiguous. */
HR_API hr_status hr_tensor_wrap_host(hr_dtype dt, int ndim, const int64_t *shape,
                                     const int64_t *strides, void *data,
                                     size_t nbytes, void (*release)(void *),
                                     void *ctx, hr_tensor **out);
/* 0-dim tensor holding `value` converted to dt. */
HR_API hr_status hr_tensor_scalar(hr_device *dev, hr_dtype dt, double value,
                                  hr_tensor **out);
HR_API void hr_tensor_free(hr_tensor *t);

/* ---- metadata ------------------------------------------------------- */

HR_API hr_dtype hr_tensor_dtype(const hr_tensor *t);
HR_API int hr_tensor_ndim(const hr_tensor *t);
HR_API const int64_t *hr_tensor_shape(const hr_tensor *t);
HR_API const int64_t *hr_tensor_strides(const hr_tensor *t);
HR_API int64_t hr_tensor_offset(const hr_tensor *t);
HR_API int64_t hr_tensor_numel(const hr_tensor *t);
HR_API size_t hr_tensor_nbytes(const hr_tensor *t);
HR_API hr_device *hr_tensor_device(const hr_tensor *t);
HR_API bool hr_tensor_is_contiguous(const hr_tensor *t);
/* Address of element [0,...,0] for host-visible tensors, NULL otherwise. */
HR_API void *hr_tensor_data(const hr_tensor *t);
/* Optional name used in error messages ("model.layers.0.mlp.up_proj.weight"). */
HR_API const char *hr_tensor_name(const hr_tensor *t);
HR_API void hr_tensor_set_name(hr_tensor *t, const char *name);

/* ---- views (no copy) -------------------------------------------------- */

/* A new handle on the same data. */
HR_API hr_status hr_tensor_alias(const hr_tensor *t, hr_tensor **out);
/* Reshape without copying; fails with HR_ERR_SHAPE when strides forbid it.
 * One dim may be -1. */
HR_API hr_status hr_tensor_view(const hr_tensor *t, int ndim, const int64_t *shape,
                                hr_tensor **out);
/* View when possible, contiguous copy otherwise. */
HR_API hr_status hr_tensor_reshape(const hr_tensor *t, int ndim, const int64_t *shape,
                                   hr_tensor **out);
/* Python-style slice [start:end:step] along dim; negative dim/start/end
 * count from the end and are clamped like Python. step >= 1. */
HR_API hr_status hr_tensor_slice(const hr_tensor *t, int dim, int64_t start,
                                 int64_t end, int64_t step, hr_tensor **out);
HR_API hr_status hr_tensor_narrow(const hr_tensor *t, int dim, int64_t start,
                                  int64_t length, hr_tensor **out);
/* Removes `dim`, taking index `index` along it. */
HR_API hr_status hr_tensor_select(const hr_tensor *t, int dim, int64_t index,
                                  hr_tensor **out);
HR_API hr_status hr_tensor_transpose(const hr_tensor *t, int dim0, int dim1,
                                     hr_tensor **out);
HR_API hr_status hr_tensor_permute(const hr_tensor *t, int ndim, const int *dims,
                                   hr_tensor **out);
/* Broadcast size-1 dims (stride 0) to `shape`; -1 keeps a dim. New leading
 * dims may be added. */
HR_API hr_status hr_tensor_expand(const hr_tensor *t, int ndim, const int64_t *shape,
                                  hr_tensor **out);
HR_API hr_status hr_tensor_unsqueeze(const hr_tensor *t, int dim, hr_tensor **out);
HR_API hr_status hr_tensor_squeeze(const hr_tensor *t, int dim, hr_tensor **out);
/* Splits along dim into pieces of `size` (last may be smaller); `outs` must
 * hold ceil(shape[dim]/size) handles; *n_out receives the count. */
HR_API hr_status hr_tensor_split(const hr_tensor *t, int64_t size, int dim,
                                 hr_tensor **outs, int max_out, int *n_out);

/* ---- transfers -------------------------------------------------------- */

/* Copy to another device (or the same one), contiguous. */
HR_API hr_status hr_tensor_to(const hr_tensor *t, hr_device *dev, hr_tensor **out);
/* Copy the elements in logical (row-major) order into host memory. */
HR_API hr_status hr_tensor_read(const hr_tensor *t, void *dst, size_t nbytes);
/* A host f32, bf16 or f16 tensor (last dim a multiple of dt's block: 32,
 * or 256 for the k-quants) quantized into block type dt (q8_0, q4_0, q4_1,
 * q5_0, q5_1, mxfp4, q4_k, q5_k, q6_k), row by row as ggml's reference quantizer
 * does (without an importance matrix), into a new CPU tensor of the same
 * shape. */
HR_API hr_status hr_tensor_quantize(const hr_tensor *t, hr_dtype dt, hr_tensor **out);

/* Shape as text, "[2, 3, 4]", into buf; returns buf. */
HR_API char *hr_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
