/* CPU kernels of the collectives (ops/collective.h): the exchange is the
 * installed group's; these move the bytes in and out of it. all_reduce
 * gathers every rank's part as f32 and sums the parts in rank order, so
 * every rank ends with the same bits (an MPI reduction may sum in an
 * order that differs by rank) and nothing is rounded to a 16-bit dtype
 * before the sum. broadcast sends the root's bytes to every rank. */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/k_eltwise.h"
#include "core/error.h"
#include "ops/collective.h"
#include "ops/op_impl.h"

#define HR_MAX_RANKS_ON_STACK 64

/* t's elements in logical order into the contiguous `dst` (t's dtype):
 * src's own bytes when contiguous, else a strided copy. */
static hr_status contiguous_bytes(const hr_tensor *t, const int64_t *shape, int ndim, void *dst) {
    hr_tensor *d = NULL;
    size_t bytes = hr_dtype_size(t->dtype) * (size_t)hr_shape_numel(ndim, shape);
    HR_TRY(hr_tensor_wrap_host(t->dtype, ndim, shape, NULL, dst, bytes, NULL, NULL, &d));
    hr_k_copy_strided(d, t, true); /* broadcasts t to shape */
    hr_tensor_free(d);
    return HR_OK;
}

/* The contiguous `src` (out's dtype) into out, any strides. */
static hr_status store_bytes(hr_tensor *out, void *src) {
    hr_tensor *s = NULL;
    size_t bytes = hr_dtype_size(out->dtype) * (size_t)hr_tensor_numel(out);
    HR_TRY(hr_tensor_wrap_host(out->dtype, out->ndim, out->shape, NULL, src, bytes, NULL, NULL, &s));
    hr_k_copy_strided(out, s, true);
    hr_tensor_free(s);
    return HR_OK;
}

/* x's elements as contiguous f32 into dst[n]. */
static hr_status load_f32(const hr_tensor *x, const int64_t *shape, int ndim, float *dst, int64_t n) {
    if (x->dtype == HR_F32) return contiguous_bytes(x, shape, ndim, dst);
    void *tmp = malloc(hr_dtype_size(x->dtype) * (size_t)n + 1);
    if (!tmp) return hr_error(HR_ERR_OOM, "all_reduce: out of memory for %lld elements", (long long)n);
    hr_status s = contiguous_bytes(x, shape, ndim, tmp);
    if (s == HR_OK) hr_k_load_f32(dst, tmp, x->dtype, n, 1, hr_k_simd());
    free(tmp);
    return s;
}

static hr_status k_all_reduce(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                              int n_out) {
    const hr_tensor *x = in[0];
    hr_tensor *y = out[0];
    const hr_collectives *g = hr_collectives_current();
    int ranks = g ? g->size : 1;
    int64_t n = hr_tensor_numel(x);
    size_t part = sizeof(float) * (size_t)n;
    /* [ranks + 2][n]: the gathered parts, this rank's part, the bias */
    float *buf = malloc(part * (size_t)(ranks + 2) + 1);
    if (!buf) return hr_error(HR_ERR_OOM, "all_reduce: out of memory for %d parts of %lld", ranks, (long long)n);
    float *all = buf, *mine = buf + (size_t)ranks * (size_t)n, *bias = mine + n;
    hr_status s = load_f32(x, x->shape, x->ndim, ranks > 1 ? mine : all, n);
    if (s == HR_OK && ranks > 1) {
        size_t counts[HR_MAX_RANKS_ON_STACK], displs[HR_MAX_RANKS_ON_STACK];
        size_t *c = ranks <= HR_MAX_RANKS_ON_STACK ? counts : malloc(2 * sizeof(size_t) * (size_t)ranks);
        size_t *d = ranks <= HR_MAX_RANKS_ON_STACK ? displs : c + ranks;
        if (!c) s = hr_error(HR_ERR_OOM, "all_reduce: out of memory");
        for (int r = 0; s == HR_OK && r < ranks; r++) c[r] = part, d[r] = part * (size_t)r;
        if (s == HR_OK) s = g->all_gather(mine, part, all, c, d);
        if (c != counts) free(c);
        /* rank order, the same on every rank */
        for (int r = 1; s == HR_OK && r < ranks; r++) {
            const float *p = all + (size_t)r * (size_t)n;
            for (int64_t i = 0; i < n; i++) all[i] += p[i];
        }
    }
    if (s == HR_OK && n_in == 2) {
        s = load_f32(in[1], x->shape, x->ndim, bias, n);
        for (int64_t i = 0; s == HR_OK && i < n; i++) all[i] += bias[i];
    }
    if (s == HR_OK) {
        if (y->dtype == HR_F32 && hr_tensor_is_contiguous(y)) {
            memcpy(hr_tensor_ptr(y), all, part);
        } else {
            /* the f32 sums rounded once into y's dtype, in place over `mine` */
            hr_k_store_f32((char *)mine, y->dtype, all, n, 1, hr_k_simd());
            s = store_bytes(y, mine);
        }
    }
    free(buf);
    return s;
}

static hr_status k_all_gather(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                              int n_out) {
    const hr_attrs_all_gather *a = attrs;
    const hr_tensor *x = in[0];
    hr_tensor *y = out[0];
    const hr_collectives *g = hr_collectives_current();
    int ranks = g ? g->size : 1, me = g ? g->rank : 0, dim = (int)(a->dim < 0 ? a->dim + x->ndim : a->dim);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < dim; i++) outer *= x->shape[i];
    for (int i = dim + 1; i < x->ndim; i++) inner *= x->shape[i];
    size_t es = hr_dtype_size(x->dtype);
    int64_t first, len;
    hr_split_part(a->total, ranks, me, &first, &len);
    if (len != x->shape[dim])
        return hr_error(HR_ERR_SHAPE, "all_gather: rank %d of %d holds %lld along dim %d, but its part of %lld is %lld",
                        me, ranks, (long long)x->shape[dim], dim, (long long)a->total, (long long)len);
    size_t total_bytes = es * (size_t)(outer * a->total * inner), mine_bytes = es * (size_t)(outer * len * inner);
    /* recv: rank r's block [outer, len_r, inner], blocks in rank order; mine; the result */
    char *buf = malloc(2 * total_bytes + mine_bytes + 1);
    size_t *c = malloc(2 * sizeof(size_t) * (size_t)ranks);
    hr_status s = buf && c ? HR_OK : hr_error(HR_ERR_OOM, "all_gather: out of memory for %zu bytes", total_bytes);
    char *recv = buf, *mine = buf + total_bytes, *res = mine + mine_bytes;
    size_t *d = c ? c + ranks : NULL;
    if (s == HR_OK) s = contiguous_bytes(x, x->shape, x->ndim, ranks > 1 ? mine : recv);
    for (int r = 0; s == HR_OK && r < ranks; r++) {
        int64_t f, l;
        hr_split_part(a->total, ranks, r, &f, &l);
        c[r] = es * (size_t)(outer * l * inner);
        d[r] = es * (size_t)(outer * f * inner);
    }
    if (s == HR_OK && ranks > 1) s = g->all_gather(mine, mine_bytes, recv, c, d);
    /* rank r's rows of outer index o go to [o, f_r .. f_r + l_r) */
    for (int r = 0; s == HR_OK && r < ranks; r++) {
        int64_t f, l;
        hr_split_part(a->total, ranks, r, &f, &l);
        size_t run = es * (size_t)(l * inner);
        for (int64_t o = 0; o < outer; o++)
            memcpy(res + es * (size_t)((o * a->total + f) * inner), recv + d[r] + run * (size_t)o, run);
    }
    if (s == HR_OK) s = store_bytes(y, res);
    free(buf);
    free(c);
    return s;
}

static hr_status k_broadcast(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                             int n_out) {
    const hr_attrs_broadcast *a = attrs;
    const hr_collectives *g = hr_collectives_current();
    int ranks = g ? g->size : 1;
    if (a->root >= ranks)
        return hr_error(HR_ERR_INVALID_ARG, "broadcast: root %lld is not a rank of the group of %d", (long long)a->root,
                        ranks);
    size_t bytes = hr_dtype_size(in[0]->dtype) * (size_t)hr_tensor_numel(in[0]);
    char *buf = malloc(bytes + 1);
    if (!buf) return hr_error(HR_ERR_OOM, "broadcast: out of memory for %zu bytes", bytes);
    hr_status s = contiguous_bytes(in[0], in[0]->shape, in[0]->ndim, buf);
    if (s == HR_OK && ranks > 1) s = g->broadcast(buf, bytes, (int)a->root);
    if (s == HR_OK) s = store_bytes(out[0], buf);
    free(buf);
    return s;
}

void hr_cpu_register_collective(hr_cpu_kernel_fn *table) {
    table[HR_OP_broadcast] = k_broadcast;
    table[HR_OP_all_reduce] = k_all_reduce;
    table[HR_OP_all_gather] = k_all_gather;
}
