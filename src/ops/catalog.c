/* The op catalog tables, generated from HR_OP_LIST. */
#include <assert.h>
#include <string.h>

#include "core/error.h"
#include "ops/op_impl.h"

typedef struct {
    const char *name;
    int min_in, max_in, n_out;
    size_t attrs_size;
} op_info;

static const op_info ops[] = {
#define HR_X_(name, mn, mx, no, at) {#name, mn, mx, no, sizeof(at)},
    HR_OP_LIST(HR_X_)
#undef HR_X_
};
static_assert(sizeof ops / sizeof ops[0] == HR_OP_COUNT, "op info table out of sync with HR_OP_LIST");

/* Attribute fields of every op, by name; a misspelt field fails to compile.
 * The list is expanded twice: once for the fields, once for their ops. */
#define CLAMP_(F, op_) F(op_, F64, hr_attrs_clamp, min) F(op_, F64, hr_attrs_clamp, max) \
    F(op_, BOOL, hr_attrs_clamp, has_min) F(op_, BOOL, hr_attrs_clamp, has_max)
#define REDUCE_(F, op_) F(op_, I64, hr_attrs_reduce, dim) F(op_, BOOL, hr_attrs_reduce, keepdim)
#define DIM_(F, op_) F(op_, I64, hr_attrs_dim, dim)
#define CONV_(F) F(conv2d, I64, hr_attrs_conv2d, stride_h) F(conv2d, I64, hr_attrs_conv2d, stride_w) \
    F(conv2d, I64, hr_attrs_conv2d, pad_h) F(conv2d, I64, hr_attrs_conv2d, pad_w)                      \
    F(conv2d, I64, hr_attrs_conv2d, dilation_h) F(conv2d, I64, hr_attrs_conv2d, dilation_w)            \
    F(conv2d, I64, hr_attrs_conv2d, groups)
#define NORM_(F, op_) F(op_, F64, hr_attrs_norm, eps) F(op_, F64, hr_attrs_norm, weight_offset)

#define ATTR_LIST(F)                                                                     \
    F(gelu, I64, hr_attrs_gelu, approximate)                                             \
    F(gelu_mul, I64, hr_attrs_gelu, approximate)                                         \
    CLAMP_(F, clamp)                                                                     \
    F(scale, F64, hr_attrs_scale, mul) F(scale, F64, hr_attrs_scale, add)                \
    REDUCE_(F, sum) REDUCE_(F, mean) REDUCE_(F, max) REDUCE_(F, min) REDUCE_(F, argmax)  \
    DIM_(F, softmax) DIM_(F, log_softmax) DIM_(F, cumsum)                                \
    F(topk, I64, hr_attrs_topk, k) F(topk, I64, hr_attrs_topk, dim)                      \
    F(topk, BOOL, hr_attrs_topk, largest) F(topk, BOOL, hr_attrs_topk, sorted)           \
    NORM_(F, rms_norm) NORM_(F, add_rms_norm) NORM_(F, layer_norm)                       \
    F(rope_cos_sin, F64, hr_attrs_rope_cos_sin, attention_scaling)                       \
    F(rope_cos_sin, I64, hr_attrs_rope_cos_sin, dtype)                                   \
    CONV_(F)                                                                             \
    F(group_norm, I64, hr_attrs_group_norm, groups)                                      \
    F(group_norm, F64, hr_attrs_group_norm, eps)                                         \
    F(upsample_nearest, I64, hr_attrs_upsample, scale)                                   \
    F(linear_group, I64, hr_attrs_linear_group, n)                                       \
    F(linear_group, I64, hr_attrs_linear_group, epilogue)                                \
    F(linear_group, BOOL, hr_attrs_linear_group, bias)                                   \
    F(experts, I64, hr_attrs_experts, act) F(experts, BOOL, hr_attrs_experts, per_expert)  \
    F(experts, I64, hr_attrs_experts, impl)                                              \
    F(experts, F64, hr_attrs_experts, limit) F(experts, F64, hr_attrs_experts, alpha)      \
    F(experts, BOOL, hr_attrs_experts, batch_invariant)                                  \
    F(sdpa, F64, hr_attrs_sdpa, scale) F(sdpa, F64, hr_attrs_sdpa, softcap)              \
    F(sdpa, I64, hr_attrs_sdpa, window) F(sdpa, BOOL, hr_attrs_sdpa, is_causal)          \
    F(sdpa, BOOL, hr_attrs_sdpa, exact) F(sdpa, I64, hr_attrs_sdpa, exact_from)          \
    F(sdpa, BOOL, hr_attrs_sdpa, sinks)                                                  \
    DIM_(F, index_select) DIM_(F, gather) DIM_(F, index_copy) DIM_(F, cat)               \
    F(embedding, I64, hr_attrs_embedding, first)                                         \
    F(embedding, BOOL, hr_attrs_embedding, sharded)                                      \
    F(cast, I64, hr_attrs_cast, dtype)                                                   \
    F(fill, INTS, hr_attrs_fill, shape) F(fill, I64, hr_attrs_fill, dtype)               \
    F(fill, F64, hr_attrs_fill, value)                                                   \
    F(arange, F64, hr_attrs_arange, start) F(arange, F64, hr_attrs_arange, end)          \
    F(arange, F64, hr_attrs_arange, step) F(arange, I64, hr_attrs_arange, dtype)         \
    F(all_reduce, I64, hr_attrs_cast, dtype)                                             \
    F(all_gather, I64, hr_attrs_all_gather, dim)                                         \
    F(all_gather, I64, hr_attrs_all_gather, total)                                       \
    F(broadcast, I64, hr_attrs_broadcast, root)

#define FIELD_(op_, type_, struct_, field_) {#field_, HR_ATTR_##type_, offsetof(struct_, field_)},
#define OWNER_(op_, type_, struct_, field_) HR_OP_##op_,
static const hr_attr_field attr_fields[] = {ATTR_LIST(FIELD_)};
static const hr_op attr_owner[] = {ATTR_LIST(OWNER_)};
static_assert(sizeof attr_fields / sizeof attr_fields[0] == sizeof attr_owner / sizeof attr_owner[0],
              "attr tables out of sync");

const char *hr_op_name(hr_op op) { return (unsigned)op < HR_OP_COUNT ? ops[op].name : "invalid"; }
int hr_op_min_inputs(hr_op op) { return (unsigned)op < HR_OP_COUNT ? ops[op].min_in : 0; }
int hr_op_max_inputs(hr_op op) { return (unsigned)op < HR_OP_COUNT ? ops[op].max_in : 0; }
int hr_op_num_outputs(hr_op op) { return (unsigned)op < HR_OP_COUNT ? ops[op].n_out : 0; }

int hr_op_outputs_for(hr_op op, const void *attrs) {
    if (op != HR_OP_linear_group) return hr_op_num_outputs(op);
    const hr_attrs_linear_group *a = attrs;
    if (!a || a->n < 1 || a->n > 3) return -1;
    return a->epilogue == HR_LINEAR_STORE ? (int)a->n : 1;
}

size_t hr_op_attrs_size(hr_op op) {
    if ((unsigned)op >= HR_OP_COUNT) return 0;
    int n;
    hr_op_attr_fields(op, &n);
    return n ? ops[op].attrs_size : 0;
}

hr_status hr_op_find(const char *name, hr_op *out) {
    for (int i = 0; i < HR_OP_COUNT; i++)
        if (name && !strcmp(name, ops[i].name)) {
            *out = (hr_op)i;
            return HR_OK;
        }
    return hr_error(HR_ERR_NOT_FOUND, "unknown op '%s'", name ? name : "(null)");
}

size_t hr_op_attr_field_total(void) { return sizeof attr_fields / sizeof attr_fields[0]; }

const hr_attr_field *hr_op_attr_fields(hr_op op, int *n) {
    /* Fields of one op are adjacent in the list. */
    const size_t total = sizeof attr_owner / sizeof attr_owner[0];
    size_t i = 0;
    while (i < total && attr_owner[i] != op) i++;
    size_t j = i;
    while (j < total && attr_owner[j] == op) j++;
    *n = (int)(j - i);
    return j > i ? &attr_fields[i] : NULL;
}
