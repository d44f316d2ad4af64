/* Views: new tensor handles over the same buffer with other shape/strides. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/tensor_impl.h"

static hr_status clone_header(const hr_tensor *t, hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "view of a NULL tensor");
    hr_tensor *v = malloc(sizeof *v);
    if (!v) return hr_error(HR_ERR_OOM, "out of memory allocating a view");
    *v = *t;
    hr_buffer_retain(v->buf);
    *out = v;
    return HR_OK;
}

hr_status hr_tensor_alias(const hr_tensor *t, hr_tensor **out) { return clone_header(t, out); }

/* A view of a block-quantized tensor keeps whole contiguous rows (its
 * kernels read rows of blocks); any other is refused and *out freed. */
static hr_status block_rows_kept(const hr_tensor *t, hr_tensor **out) {
    const hr_tensor *v = *out;
    if (!hr_dtype_is_quantized(t->dtype)) return HR_OK;
    int64_t row = t->shape[t->ndim - 1];
    if (v->ndim >= 1 && v->shape[v->ndim - 1] == row && v->strides[v->ndim - 1] == 1 && v->offset % row == 0)
        return HR_OK;
    hr_tensor_free(*out);
    *out = NULL;
    char a[160];
    return hr_error(HR_ERR_DTYPE, "view: %s tensor '%s' %s is stored in blocks along its rows; a view must keep whole rows",
                    hr_dtype_name(t->dtype), t->name, hr_shape_str(t->ndim, t->shape, a, sizeof a));
}

/* Resolves one -1 and checks the element count. */
hr_status hr_view_shape(const hr_tensor *t, int ndim, const int64_t *shape,
                                  int64_t *res) {
    if (ndim < 0 || ndim > HR_MAX_DIMS)
        return hr_error(HR_ERR_SHAPE, "view: rank %d outside 0..%d", ndim, HR_MAX_DIMS);
    int infer = -1;
    int64_t known = 1, numel = hr_shape_numel(t->ndim, t->shape);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (infer >= 0) return hr_error(HR_ERR_SHAPE, "view: only one dim may be -1");
            infer = i;
        } else if (shape[i] < 0) {
            return hr_error(HR_ERR_SHAPE, "view: invalid size %lld at dim %d", (long long)shape[i], i);
        } else {
            known *= shape[i];
        }
        res[i] = shape[i];
    }
    if (infer >= 0) {
        if (known == 0 || numel % known)
            goto mismatch;
        res[infer] = numel / known;
    } else if (known != numel) {
        goto mismatch;
    }
    return HR_OK;
mismatch:;
    char a[160], b[160];
    return hr_error(HR_ERR_SHAPE, "view: shape %s is invalid for a tensor of shape %s (%lld elements)",
                    hr_shape_str(ndim, shape, a, sizeof a), hr_shape_str(t->ndim, t->shape, b, sizeof b),
                    (long long)numel);
}

/* Computes strides for `shape` over t's memory without copying, as torch's
 * computeStride does: each run of old dims that merges contiguously may be
 * split into new dims. Returns false when impossible. */
bool hr_view_strides(const hr_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
    int64_t numel = hr_shape_numel(t->ndim, t->shape);
    if (numel == 0 || t->ndim == 0) {
        hr_contiguous_strides(ndim, shape, strides);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_base_stride = t->strides[t->ndim - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tensor_numel *= t->shape[td];
        if (td == 0 || (t->shape[td - 1] != 1 &&
                        t->strides[td - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                strides[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base_stride = t->strides[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

hr_status hr_tensor_view(const hr_tensor *t, int ndim, const int64_t *shape, hr_tensor **out) {
    if (!t || !out || (ndim && !shape)) return hr_error(HR_ERR_INVALID_ARG, "view: NULL argument");
    *out = NULL;
    int64_t res[HR_MAX_DIMS], strides[HR_MAX_DIMS];
    HR_TRY(hr_view_shape(t, ndim, shape, res));
    if (!hr_view_strides(t, ndim, res, strides)) {
        char a[160], b[160];
        return hr_error(HR_ERR_SHAPE,
                        "view: cannot view %s as %s without a copy (strides do not allow it); "
                        "use reshape",
                        hr_shape_str(t->ndim, t->shape, a, sizeof a), hr_shape_str(ndim, res, b, sizeof b));
    }
    HR_TRY(clone_header(t, out));
    (*out)->ndim = ndim;
    memcpy((*out)->shape, res, sizeof(int64_t) * (size_t)ndim);
    memcpy((*out)->strides, strides, sizeof(int64_t) * (size_t)ndim);
    return block_rows_kept(t, out);
}

hr_status hr_tensor_slice(const hr_tensor *t, int dim, int64_t start, int64_t end, int64_t step,
                          hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "slice: NULL argument");
    *out = NULL;
    int d;
    HR_TRY(hr_norm_dim(dim, t->ndim, "slice", &d));
    if (step < 1) return hr_error(HR_ERR_INVALID_ARG, "slice: step must be >= 1, got %lld", (long long)step);
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : (start > n ? n : start);
    end = end < start ? start : (end > n ? n : end);
    HR_TRY(clone_header(t, out));
    (*out)->offset += start * t->strides[d];
    (*out)->shape[d] = (end - start + step - 1) / step;
    (*out)->strides[d] *= step;
    return block_rows_kept(t, out);
}

hr_status hr_tensor_narrow(const hr_tensor *t, int dim, int64_t start, int64_t length,
                           hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "narrow: NULL argument");
    *out = NULL;
    int d;
    HR_TRY(hr_norm_dim(dim, t->ndim, "narrow", &d));
    if (start < 0) start += t->shape[d];
    if (start < 0 || length < 0 || start > t->shape[d] || length > t->shape[d] - start)
        return hr_error(HR_ERR_SHAPE, "narrow: [%lld, %lld+%lld) is outside dim %d of size %lld",
                        (long long)start, (long long)start, (long long)length, d,
                        (long long)t->shape[d]);
    HR_TRY(clone_header(t, out));
    (*out)->offset += start * t->strides[d];
    (*out)->shape[d] = length;
    return block_rows_kept(t, out);
}

hr_status hr_tensor_select(const hr_tensor *t, int dim, int64_t index, hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "select: NULL argument");
    *out = NULL;
    int d;
    HR_TRY(hr_norm_dim(dim, t->ndim, "select", &d));
    if (index < 0) index += t->shape[d];
    if (index < 0 || index >= t->shape[d])
        return hr_error(HR_ERR_SHAPE, "select: index %lld out of range for dim %d of size %lld",
                        (long long)index, d, (long long)t->shape[d]);
    HR_TRY(clone_header(t, out));
    hr_tensor *v = *out;
    v->offset += index * t->strides[d];
    for (int i = d; i < t->ndim - 1; i++) {
        v->shape[i] = t->shape[i + 1];
        v->strides[i] = t->strides[i + 1];
    }
    v->ndim--;
    return block_rows_kept(t, out);
}

hr_status hr_tensor_permute(const hr_tensor *t, int ndim, const int *dims, hr_tensor **out) {
    if (!t || !out || (ndim && !dims)) return hr_error(HR_ERR_INVALID_ARG, "permute: NULL argument");
    *out = NULL;
    if (ndim != t->ndim)
        return hr_error(HR_ERR_SHAPE, "permute: %d dims given for a %d-dim tensor", ndim, t->ndim);
    bool seen[HR_MAX_DIMS] = {0};
    int norm[HR_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        HR_TRY(hr_norm_dim(dims[i], ndim, "permute", &norm[i]));
        if (seen[norm[i]]) return hr_error(HR_ERR_INVALID_ARG, "permute: dim %d repeated", norm[i]);
        seen[norm[i]] = true;
    }
    HR_TRY(clone_header(t, out));
    for (int i = 0; i < ndim; i++) {
        (*out)->shape[i] = t->shape[norm[i]];
        (*out)->strides[i] = t->strides[norm[i]];
    }
    return block_rows_kept(t, out);
}

hr_status hr_tensor_transpose(const hr_tensor *t, int dim0, int dim1, hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "transpose: NULL argument");
    *out = NULL;
    int a, b;
    HR_TRY(hr_norm_dim(dim0, t->ndim, "transpose", &a));
    HR_TRY(hr_norm_dim(dim1, t->ndim, "transpose", &b));
    int dims[HR_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) dims[i] = i;
    dims[a] = b;
    dims[b] = a;
    return hr_tensor_permute(t, t->ndim, dims, out);
}

hr_status hr_tensor_expand(const hr_tensor *t, int ndim, const int64_t *shape, hr_tensor **out) {
    if (!t || !out || (ndim && !shape)) return hr_error(HR_ERR_INVALID_ARG, "expand: NULL argument");
    *out = NULL;
    if (ndim < t->ndim || ndim > HR_MAX_DIMS)
        return hr_error(HR_ERR_SHAPE, "expand: cannot expand a %d-dim tensor to %d dims", t->ndim, ndim);
    int64_t nshape[HR_MAX_DIMS], nstrides[HR_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int src = i - lead;
        int64_t want = shape[i];
        if (src < 0) {
            if (want < 0) return hr_error(HR_ERR_SHAPE, "expand: -1 not allowed for new dim %d", i);
            nshape[i] = want;
            nstrides[i] = 0;
        } else if (want == -1 || want == t->shape[src]) {
            nshape[i] = t->shape[src];
            nstrides[i] = t->strides[src];
        } else if (t->shape[src] == 1 && want >= 0) {
            nshape[i] = want;
            nstrides[i] = 0;
        } else {
            char a[160], b[160];
            return hr_error(HR_ERR_SHAPE, "expand: cannot expand %s to %s (dim %d is %lld, not 1)",
                            hr_shape_str(t->ndim, t->shape, a, sizeof a), hr_shape_str(ndim, shape, b, sizeof b),
                            i, (long long)t->shape[src]);
        }
    }
    HR_TRY(clone_header(t, out));
    (*out)->ndim = ndim;
    memcpy((*out)->shape, nshape, sizeof(int64_t) * (size_t)ndim);
    memcpy((*out)->strides, nstrides, sizeof(int64_t) * (size_t)ndim);
    return block_rows_kept(t, out);
}

hr_status hr_tensor_unsqueeze(const hr_tensor *t, int dim, hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "unsqueeze: NULL argument");
    *out = NULL;
    if (t->ndim >= HR_MAX_DIMS)
        return hr_error(HR_ERR_SHAPE, "unsqueeze: tensor already has %d dims", HR_MAX_DIMS);
    int d;
    HR_TRY(hr_norm_dim(dim, t->ndim + 1, "unsqueeze", &d));
    HR_TRY(clone_header(t, out));
    hr_tensor *v = *out;
    for (int i = t->ndim; i > d; i--) {
        v->shape[i] = t->shape[i - 1];
        v->strides[i] = t->strides[i - 1];
    }
    v->shape[d] = 1;
    v->strides[d] = d < t->ndim ? t->strides[d] * t->shape[d] : 1;
    v->ndim++;
    return block_rows_kept(t, out);
}

hr_status hr_tensor_squeeze(const hr_tensor *t, int dim, hr_tensor **out) {
    if (!t || !out) return hr_error(HR_ERR_INVALID_ARG, "squeeze: NULL argument");
    *out = NULL;
    int d;
    HR_TRY(hr_norm_dim(dim, t->ndim, "squeeze", &d));
    if (t->shape[d] != 1)
        return hr_error(HR_ERR_SHAPE, "squeeze: dim %d has size %lld, not 1", d, (long long)t->shape[d]);
    return hr_tensor_select(t, d, 0, out);
}

hr_status hr_tensor_split(const hr_tensor *t, int64_t size, int dim, hr_tensor **outs,
                          int max_out, int *n_out) {
    if (!t || !outs || !n_out) return hr_error(HR_ERR_INVALID_ARG, "split: NULL argument");
    *n_out = 0;
    int d;
    HR_TRY(hr_norm_dim(dim, t->ndim, "split", &d));
    if (size < 1) return hr_error(HR_ERR_INVALID_ARG, "split: size must be >= 1");
    int64_t n = t->shape[d], count = n ? (n + size - 1) / size : 1;
    if (count > max_out)
        return hr_error(HR_ERR_INVALID_ARG, "split: %lld pieces do not fit in %d outputs",
                        (long long)count, max_out);
    for (int64_t i = 0; i < count; i++) {
        int64_t start = i * size, len = n - start < size ? n - start : size;
        hr_status s = hr_tensor_narrow(t, d, start, len, &outs[i]);
        if (s != HR_OK) {
            for (int64_t j = 0; j < i; j++) hr_tensor_free(outs[j]);
            return s;
        }
    }
    *n_out = (int)count;
    return HR_OK;
}
