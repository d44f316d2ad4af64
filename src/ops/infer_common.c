/* Inference helpers shared by the op groups. */
#include "core/error.h"
#include "ops/op_impl.h"

hr_status hr_broadcast_shapes(const char *op, int na, const int64_t *a, int nb, const int64_t *b,
                              int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[160], sb[160];
            return hr_error(HR_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                            hr_shape_str(na, a, sa, sizeof sa), hr_shape_str(nb, b, sb, sizeof sb), i,
                            (long long)da, (long long)db);
        }
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return HR_OK;
}

hr_status hr_binary_dtype(const char *op, const hr_tensor *a, const hr_tensor *b, hr_dtype *out) {
    /* A float scalar would be truncated into an integer tensor; torch
     * promotes instead. Refuse rather than silently differ. */
    const hr_tensor *scalar = b->ndim == 0 ? b : a->ndim == 0 ? a : NULL;
    const hr_tensor *other = scalar == b ? a : b;
    if (scalar && scalar != other && hr_dtype_is_float(scalar->dtype) && !hr_dtype_is_float(other->dtype))
        return hr_error(HR_ERR_DTYPE, "%s: a %s scalar with a %s tensor would truncate the float (cast one first)",
                        op, hr_dtype_name(scalar->dtype), hr_dtype_name(other->dtype));
    if (a->dtype == b->dtype || b->ndim == 0) {
        *out = a->dtype;
        return HR_OK;
    }
    if (a->ndim == 0) {
        *out = b->dtype;
        return HR_OK;
    }
    return hr_error(HR_ERR_DTYPE, "%s: inputs have different dtypes %s and %s (cast one first)", op,
                    hr_dtype_name(a->dtype), hr_dtype_name(b->dtype));
}

hr_status hr_require_float(const char *op, const char *what, const hr_tensor *t) {
    if (t->dtype == HR_F32 || t->dtype == HR_BF16 || t->dtype == HR_F16) return HR_OK;
    return hr_error(HR_ERR_DTYPE, "%s: %s must be f32, bf16 or f16, got %s", op, what,
                    hr_dtype_name(t->dtype));
}

hr_status hr_require_index(const char *op, const char *what, const hr_tensor *t) {
    if (t->dtype == HR_I64 || t->dtype == HR_I32) return HR_OK;
    return hr_error(HR_ERR_DTYPE, "%s: %s must be i64 or i32, got %s", op, what, hr_dtype_name(t->dtype));
}
