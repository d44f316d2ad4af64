/* StableHLO lowerings of the index ops: embedding, index_select, gather,
 * index_copy, cat. Index values are data here: XLA clamps out-of-range
 * indices where the cpu kernels report them, so callers validate ids on
 * the host when they come from users. */
#include <stdio.h>

#include "backends/pjrt/shlo.h"
#include "core/error.h"

static void int_list(char *buf, size_t n, const int *v, int k) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < k && used < n; i++) used += (size_t)snprintf(buf + used, n - used, i ? ", %d" : "%d", v[i]);
}

/* "stablehlo.gather" with explicit dimension numbers. */
static hr_shlo_value gather(hr_shlo_builder *b, hr_shlo_value x, hr_shlo_value idx, const int *offset_dims,
                            int n_offset, const int *collapsed, int n_collapsed, const int *start_map, int n_map,
                            int index_vector_dim, const int64_t *slice_sizes, const hr_tensor_meta *m) {
    char od[128], cd[128], sm[128], ss[256], attr[1024];
    int_list(od, sizeof od, offset_dims, n_offset);
    int_list(cd, sizeof cd, collapsed, n_collapsed);
    int_list(sm, sizeof sm, start_map, n_map);
    size_t used = 0;
    ss[0] = '\0';
    for (int i = 0; i < x.ndim; i++)
        used += (size_t)snprintf(ss + used, sizeof ss - used, i ? ", %lld" : "%lld", (long long)slice_sizes[i]);
    snprintf(attr, sizeof attr,
             "dimension_numbers = #stablehlo.gather<offset_dims = [%s], collapsed_slice_dims = [%s], "
             "start_index_map = [%s], index_vector_dim = %d>, indices_are_sorted = false, slice_sizes = "
             "array<i64: %s>",
             od, cd, sm, index_vector_dim, ss);
    hr_shlo_value in[2] = {x, idx};
    return hr_shlo_op(b, "gather", in, 2, attr, x.dt, m->ndim, m->shape);
}

/* weight [V, H], ids [...] -> [..., H] */
static hr_status lower_embedding(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                 const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    hr_shlo_value w = in[0], ids = hr_shlo_convert(b, in[1], HR_I64);
    int od = ids.ndim, zero = 0;
    int64_t sizes[2] = {1, w.shape[1]};
    out[0] = gather(b, w, ids, &od, 1, &zero, 1, &zero, 1, ids.ndim, sizes, m);
    return b->status;
}

/* A vocab-split shard's lookup (hr_attrs_embedding.sharded) runs in the
 * tensor-parallel path, which is the CPU's for now. */
static bool check_embedding(const void *attrs, const hr_tensor *const *in, int n_in) {
    const hr_attrs_embedding *a = attrs;
    return !a || !a->sharded;
}

static hr_status lower_index_select(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                    const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    hr_shlo_value x = in[0], idx = hr_shlo_convert(b, in[1], HR_I64);
    int dim = (int)(a->dim < 0 ? a->dim + x.ndim : a->dim);
    int64_t n = idx.ndim ? idx.shape[0] : 1;
    idx = hr_shlo_reshape(b, idx, 1, &n);
    int od[HR_MAX_DIMS], k = 0;
    int64_t sizes[HR_MAX_DIMS];
    for (int i = 0; i < x.ndim; i++) {
        if (i != dim) od[k++] = i;
        sizes[i] = i == dim ? 1 : x.shape[i];
    }
    out[0] = gather(b, x, idx, od, k, &dim, 1, &dim, 1, 1, sizes, m);
    return b->status;
}

/* torch.gather: out[i] = x[i with i[dim] replaced by index[i]]. */
static hr_status lower_gather(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                              const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    hr_shlo_value x = in[0], idx = hr_shlo_convert(b, in[1], HR_I64);
    int r = x.ndim, dim = (int)(a->dim < 0 ? a->dim + r : a->dim);
    int64_t cshape[HR_MAX_DIMS + 1];
    for (int i = 0; i < r; i++) cshape[i] = idx.shape[i];
    cshape[r] = 1;
    hr_shlo_value coords[HR_MAX_DIMS];
    for (int d = 0; d < r; d++) {
        hr_shlo_value c = d == dim ? idx : hr_shlo_iota(b, HR_I64, d, r, idx.shape);
        coords[d] = hr_shlo_reshape(b, c, r + 1, cshape);
    }
    cshape[r] = r;
    hr_shlo_value all = r == 1 ? coords[0] : hr_shlo_concat(b, coords, r, r, HR_I64, r + 1, cshape);
    int dims[HR_MAX_DIMS];
    int64_t ones[HR_MAX_DIMS];
    for (int i = 0; i < r; i++) dims[i] = i, ones[i] = 1;
    out[0] = gather(b, x, all, NULL, 0, dims, r, dims, r, r, ones, m);
    return b->status;
}

static bool check_gather(const void *attrs, const hr_tensor *const *in, int n_in) { return in[0]->ndim > 0; }

/* dst[.., index[i], ..] = src[.., i, ..] along dim: a scatter that overwrites. */
static hr_status lower_index_copy(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                  const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    hr_shlo_value dst = in[0], idx = hr_shlo_convert(b, in[1], HR_I64), src = in[2];
    int dim = (int)(a->dim < 0 ? a->dim + dst.ndim : a->dim);
    int64_t n = idx.ndim ? idx.shape[0] : 1;
    idx = hr_shlo_reshape(b, idx, 1, &n);
    int uw[HR_MAX_DIMS], k = 0;
    for (int i = 0; i < dst.ndim; i++)
        if (i != dim) uw[k++] = i;
    out[0] = hr_shlo_scatter(b, dst, idx, src, uw, k, dim, 1);
    return b->status;
}

static hr_status lower_cat(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                           const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    int dim = (int)(a->dim < 0 ? a->dim + m->ndim : a->dim);
    if (n_in == 1) {
        out[0] = in[0];
        return b->status;
    }
    out[0] = hr_shlo_concat(b, in, n_in, dim, m->dtype, m->ndim, m->shape);
    return b->status;
}

void hr_shlo_register_index(hr_shlo_lowering *t) {
    t[HR_OP_embedding].lower = lower_embedding;
    t[HR_OP_embedding].check = check_embedding;
    t[HR_OP_index_select].lower = lower_index_select;
    t[HR_OP_gather].lower = lower_gather;
    t[HR_OP_gather].check = check_gather;
    t[HR_OP_index_copy].lower = lower_index_copy;
    t[HR_OP_cat].lower = lower_cat;
}
