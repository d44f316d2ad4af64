/* Tensors as views over flat device buffers.
 *
 * A PJRT buffer behind an hr_buffer is a flat ui8 array of the buffer's
 * bytes (copy_from_host does not know a dtype). A module reinterprets it as
 * the tensor's dtype, then reads the view (shape, strides, offset):
 * contiguous views are a slice, any other strides a gather. Outputs that do
 * not cover their buffer (a KV-cache slice) are written with
 * dynamic_update_slice or a scatter into the old bytes, giving the buffer's
 * new bytes. Offsets travel as run-time scalars so that a decode loop
 * writing at a moving position compiles once. */
#include <stdio.h>
#include <string.h>

#include "backends/pjrt/shlo.h"

void hr_shlo_view_of(const hr_tensor *t, hr_shlo_view *v) {
    memset(v, 0, sizeof *v);
    v->dt = t->dtype;
    v->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        v->shape[i] = t->shape[i];
        v->strides[i] = t->shape[i] == 1 ? 0 : t->strides[i];
    }
    v->contiguous = hr_tensor_is_contiguous(t);
    v->has_offset = t->offset != 0;
    v->buf_bytes = (int64_t)t->buf->nbytes;
}

bool hr_shlo_view_is_full(const hr_shlo_view *v) {
    int64_t n = hr_shape_numel(v->ndim, v->shape) * (int64_t)hr_dtype_size(v->dt);
    return v->contiguous && !v->has_offset && n == v->buf_bytes;
}

/* The storage dtype a buffer is reinterpreted as: bool bytes stay ui8,
 * bf16 and f16 are held as their bits (i16) from argument to result, so
 * the writes into them (KV-cache rows) move bits and a read converts only
 * what it reads (hr_shlo_bits: XLA's CPU compiler widens 16-bit float data
 * movement to f32, and copies the whole array for a bitcast between
 * writes). */
static hr_dtype storage_dtype(hr_dtype dt) {
    return dt == HR_BOOL ? HR_U8 : hr_shlo_float16(dt) ? HR_I16 : dt;
}

/* The buffer bytes as a flat array of the view's storage dtype. */
static hr_shlo_value bytes_to_flat(hr_shlo_builder *b, hr_shlo_value bytes, hr_dtype dt) {
    int64_t s = (int64_t)hr_dtype_size(dt), n = bytes.shape[0] / s;
    hr_dtype st = storage_dtype(dt);
    if (s == 1) return st == HR_U8 ? bytes : hr_shlo_op(b, "bitcast_convert", &bytes, 1, NULL, st, 1, &n);
    if (n * s != bytes.shape[0]) {
        int64_t start = 0, limit = n * s;
        bytes = hr_shlo_slice(b, bytes, &start, &limit, NULL);
    }
    int64_t shape2[2] = {n, s};
    hr_shlo_value r = hr_shlo_reshape(b, bytes, 2, shape2);
    return hr_shlo_op(b, "bitcast_convert", &r, 1, NULL, st, 1, &n);
}

static hr_shlo_value flat_to_bytes(hr_shlo_builder *b, hr_shlo_value flat) {
    int64_t s = (int64_t)hr_dtype_size(flat.dt), n = flat.shape[0];
    if (s == 1) return flat.dt == HR_U8 ? flat : hr_shlo_op(b, "bitcast_convert", &flat, 1, NULL, HR_U8, 1, &n);
    int64_t shape2[2] = {n, s}, total = n * s;
    hr_shlo_value r = hr_shlo_op(b, "bitcast_convert", &flat, 1, NULL, HR_U8, 2, shape2);
    return hr_shlo_reshape(b, r, 1, &total);
}

/* Element indices of the view in the flat array: offset + sum(i_d * stride_d). */
static hr_shlo_value view_indices(hr_shlo_builder *b, const hr_shlo_view *v, hr_shlo_value off) {
    hr_shlo_value idx = hr_shlo_splat(b, HR_I64, 0, v->ndim, v->shape);
    for (int d = 0; d < v->ndim; d++) {
        if (v->strides[d] == 0) continue;
        hr_shlo_value io = hr_shlo_iota(b, HR_I64, d, v->ndim, v->shape);
        if (v->strides[d] != 1)
            io = hr_shlo_binary(b, "multiply", io, hr_shlo_splat(b, HR_I64, (double)v->strides[d], v->ndim, v->shape));
        idx = hr_shlo_binary(b, "add", idx, io);
    }
    if (off.id >= 0) idx = hr_shlo_binary(b, "add", idx, hr_shlo_bcast(b, off, v->ndim, v->shape));
    return idx;
}

static hr_shlo_value offset_arg(hr_shlo_builder *b, const hr_shlo_view *v) {
    if (v->has_offset) return hr_shlo_arg(b, HR_I64, 0, NULL);
    hr_shlo_value none = {.id = -1};
    return none;
}

/* The dims a view steps through (stride != 0), outermost first, when they
 * tile a dense span: a permutation of a contiguous layout (a transpose),
 * with broadcast dims on top. Then the view is a slice, a reshape and a
 * transpose, which XLA runs far faster than a gather. */
static bool dense_order(const hr_shlo_view *v, int *order, int *n) {
    *n = 0;
    for (int d = 0; d < v->ndim; d++)
        if (v->strides[d] != 0) order[(*n)++] = d;
    for (int i = 1; i < *n; i++) /* insertion sort, stride descending, stable */
        for (int j = i; j > 0 && v->strides[order[j - 1]] < v->strides[order[j]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int64_t expect = 1;
    for (int i = *n - 1; i >= 0; i--) {
        if (v->strides[order[i]] != expect) return false;
        expect *= v->shape[order[i]];
    }
    return true;
}

/* `numel` elements of flat from the view's offset. */
static hr_shlo_value span(hr_shlo_builder *b, hr_shlo_value flat, hr_shlo_value off, int64_t numel) {
    if (off.id < 0) {
        int64_t start = 0;
        return hr_shlo_slice(b, flat, &start, &numel, NULL);
    }
    char attr[64];
    snprintf(attr, sizeof attr, "slice_sizes = array<i64: %lld>", (long long)numel);
    hr_shlo_value in[2] = {flat, off};
    return hr_shlo_op(b, "dynamic_slice", in, 2, attr, flat.dt, 1, &numel);
}

/* A dense span (order from dense_order) read as the view. */
static hr_shlo_value span_to_view(hr_shlo_builder *b, hr_shlo_value sp, const hr_shlo_view *v, const int *order,
                                  int n) {
    int64_t sorted[HR_MAX_DIMS];
    for (int i = 0; i < n; i++) sorted[i] = v->shape[order[i]];
    hr_shlo_value r = hr_shlo_reshape(b, sp, n, sorted);
    /* perm[k]: position in `order` of the k-th stepped dim in view order */
    int perm[HR_MAX_DIMS], dims[HR_MAX_DIMS], k = 0;
    for (int d = 0; d < v->ndim; d++) {
        if (v->strides[d] == 0) continue;
        for (int i = 0; i < n; i++)
            if (order[i] == d) perm[k] = i;
        dims[k++] = d;
    }
    r = hr_shlo_transpose(b, r, perm);
    return k == v->ndim ? r : hr_shlo_bcast_dims(b, r, dims, v->ndim, v->shape);
}

hr_shlo_value hr_shlo_flat_as(hr_shlo_builder *b, hr_shlo_value flat, hr_dtype dt) {
    hr_dtype st = storage_dtype(dt);
    if (flat.dt == st) return flat;
    if (st == HR_I16 && hr_shlo_float16(flat.dt)) return hr_shlo_bits(b, flat);
    if (flat.dt != HR_U8) flat = flat_to_bytes(b, flat);
    if (flat.shape[0] % (int64_t)hr_dtype_size(dt)) {
        hr_shlo_fail(b, HR_ERR_UNSUPPORTED, "a %lld-byte buffer read as %s is not a whole number of elements",
                     (long long)flat.shape[0], hr_dtype_name(dt));
        return flat;
    }
    return bytes_to_flat(b, flat, dt);
}

hr_shlo_value hr_shlo_view_get(hr_shlo_builder *b, const hr_shlo_view *v, hr_shlo_value flat, hr_shlo_value off) {
    int order[HR_MAX_DIMS], n;
    hr_shlo_value r;
    if (v->contiguous) {
        r = hr_shlo_reshape(b, span(b, flat, off, hr_shape_numel(v->ndim, v->shape)), v->ndim, v->shape);
    } else if (dense_order(v, order, &n)) {
        int64_t count = 1;
        for (int i = 0; i < n; i++) count *= v->shape[order[i]];
        r = span_to_view(b, span(b, flat, off, count), v, order, n);
    } else {
        r = hr_shlo_gather_flat(b, flat, view_indices(b, v, off));
    }
    return v->dt == HR_BOOL ? hr_shlo_convert(b, r, HR_BOOL) : hr_shlo_bits_as(b, r, v->dt);
}

hr_shlo_value hr_shlo_view_load(hr_shlo_builder *b, const hr_shlo_view *v) {
    hr_shlo_value bytes = hr_shlo_arg(b, HR_U8, 1, &v->buf_bytes);
    hr_shlo_value off = offset_arg(b, v);
    return hr_shlo_view_get(b, v, bytes_to_flat(b, bytes, v->dt), off);
}

hr_shlo_value hr_shlo_view_put(hr_shlo_builder *b, const hr_shlo_view *v, hr_shlo_value flat, hr_shlo_value off,
                               hr_shlo_value val) {
    val = v->dt == HR_BOOL ? hr_shlo_convert(b, val, HR_U8) : hr_shlo_bits(b, hr_shlo_convert(b, val, v->dt));
    int64_t numel = hr_shape_numel(v->ndim, v->shape);
    if (hr_shlo_view_is_full(v)) return hr_shlo_reshape(b, val, 1, &numel);
    int order[HR_MAX_DIMS], n, sized = 0;
    for (int d = 0; d < v->ndim; d++) sized += v->shape[d] > 1;
    /* dims of size 1 have stride 0 here but write one place each; a dim of
     * more than one at stride 0 would write one place several times */
    if (v->contiguous || (dense_order(v, order, &n) && n == sized)) {
        /* A dense (possibly transposed) output: one dynamic_update_slice. */
        if (!v->contiguous) {
            /* val without its size-1 dims, then the stepped dims from the
             * largest stride down */
            int pos[HR_MAX_DIMS], perm[HR_MAX_DIMS], k = 0;
            int64_t stepped[HR_MAX_DIMS];
            for (int d = 0; d < v->ndim; d++)
                if (v->strides[d] != 0) pos[d] = k, stepped[k++] = v->shape[d];
            for (int i = 0; i < n; i++) perm[i] = pos[order[i]];
            val = hr_shlo_transpose(b, hr_shlo_reshape(b, val, n, stepped), perm);
        }
        if (off.id < 0) off = hr_shlo_const_i64(b, 0);
        hr_shlo_value in[3] = {flat, hr_shlo_reshape(b, val, 1, &numel), off};
        return hr_shlo_op(b, "dynamic_update_slice", in, 3, NULL, flat.dt, 1, flat.shape);
    }
    return hr_shlo_scatter_flat(b, flat, view_indices(b, v, off), val);
}

hr_shlo_value hr_shlo_view_store(hr_shlo_builder *b, const hr_shlo_view *v, hr_shlo_value val, int donate_as) {
    hr_shlo_value none = {.id = -1};
    if (hr_shlo_view_is_full(v)) return flat_to_bytes(b, hr_shlo_view_put(b, v, none, none, val));
    int64_t s = (int64_t)hr_dtype_size(v->dt);
    if (v->buf_bytes % s) {
        hr_shlo_fail(b, HR_ERR_UNSUPPORTED, "a %lld-byte buffer is not a whole number of %s elements",
                     (long long)v->buf_bytes, hr_dtype_name(v->dt));
        return val;
    }
    hr_shlo_value bytes = donate_as >= 0 ? hr_shlo_arg_donated(b, HR_U8, 1, &v->buf_bytes, donate_as)
                                         : hr_shlo_arg(b, HR_U8, 1, &v->buf_bytes);
    hr_shlo_value off = offset_arg(b, v);
    return flat_to_bytes(b, hr_shlo_view_put(b, v, bytes_to_flat(b, bytes, v->dt), off, val));
}
