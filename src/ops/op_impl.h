/* Internal op machinery: inference and kernel tables, filled per group.
 *
 * Each op group (eltwise, reduce, linalg, nn, index, attention, moe, image, collective) has one inference file
 * src/ops/infer_<group>.c and one CPU kernel file per group under
 * src/backends/cpu/, each exporting a register function listed here. */
#ifndef HR_OPS_OP_IMPL_H
#define HR_OPS_OP_IMPL_H

#include "core/tensor_impl.h"

/* Checks inputs and fills out[0..n_out) with result shapes/dtypes. Errors
 * name the op and the offending input. */
typedef hr_status (*hr_infer_fn)(const void *attrs, const hr_tensor *const *in, int n_in,
                                 hr_tensor_meta *out, int n_out);

/* A CPU kernel: inputs and outputs are host tensors with any strides;
 * outputs have the inferred shapes and dtypes. */
typedef hr_status (*hr_cpu_kernel_fn)(const void *attrs, const hr_tensor *const *in, int n_in,
                                      hr_tensor *const *out, int n_out);

#define HR_OP_GROUPS(X) X(eltwise) X(reduce) X(linalg) X(nn) X(index) X(attention) X(moe) X(image) X(collective)

#define HR_X_(g) void hr_infer_register_##g(hr_infer_fn *table);
HR_OP_GROUPS(HR_X_)
#undef HR_X_
#define HR_X_(g) void hr_cpu_register_##g(hr_cpu_kernel_fn *table);
HR_OP_GROUPS(HR_X_)
#undef HR_X_

const hr_infer_fn *hr_infer_table(void);
/* The attribute field table's length: hr_op_attr_fields finds an op's
 * fields only as one run, so the runs of all ops must add up to it. */
size_t hr_op_attr_field_total(void);
const hr_cpu_kernel_fn *hr_cpu_kernel_table(void);

/* Shared inference helpers. */
/* NumPy broadcast of a and b shapes into out; errors name `op`. */
hr_status hr_broadcast_shapes(const char *op, int na, const int64_t *a, int nb, const int64_t *b,
                              int *nout, int64_t *out);
/* Both inputs share a dtype, or one is 0-dim and takes the other's. */
hr_status hr_binary_dtype(const char *op, const hr_tensor *a, const hr_tensor *b, hr_dtype *out);
hr_status hr_require_float(const char *op, const char *what, const hr_tensor *t);
hr_status hr_require_index(const char *op, const char *what, const hr_tensor *t);
static inline void hr_meta_of(const hr_tensor *t, hr_tensor_meta *m) {
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) m->shape[i] = t->shape[i];
}

#endif
