/* The op catalog: the one list every op table is generated from.
 *
 * X(name, min_inputs, max_inputs, outputs, attrs_type)
 *
 * `outputs` is the count, or the most an op may have when its attrs set
 * the count (hr_op_outputs_for).
 *
 * Adding an op touches this list, one attrs struct (ops.h) if it has
 * attributes, one inference function and one kernel per device. Tables
 * built from this list are static_assert-ed against HR_OP_COUNT. */
#ifndef HUBRT_OP_LIST_H
#define HUBRT_OP_LIST_H

/* clang-format off */
#define HR_OP_LIST(X)                                              \
    /* elementwise binary, broadcasting (NumPy rules) */           \
    X(add,          2, 2, 1, hr_attrs_none)                        \
    X(sub,          2, 2, 1, hr_attrs_none)                        \
    X(mul,          2, 2, 1, hr_attrs_none)                        \
    X(div,          2, 2, 1, hr_attrs_none)                        \
    X(pow,          2, 2, 1, hr_attrs_none)                        \
    X(maximum,      2, 2, 1, hr_attrs_none)                        \
    X(minimum,      2, 2, 1, hr_attrs_none)                        \
    /* elementwise unary */                                        \
    X(neg,          1, 1, 1, hr_attrs_none)                        \
    X(exp,          1, 1, 1, hr_attrs_none)                        \
    X(log,          1, 1, 1, hr_attrs_none)                        \
    X(sqrt,         1, 1, 1, hr_attrs_none)                        \
    X(rsqrt,        1, 1, 1, hr_attrs_none)                        \
    X(abs,          1, 1, 1, hr_attrs_none)                        \
    X(relu,         1, 1, 1, hr_attrs_none)                        \
    X(sigmoid,      1, 1, 1, hr_attrs_none)                        \
    X(tanh,         1, 1, 1, hr_attrs_none)                        \
    X(silu,         1, 1, 1, hr_attrs_none)                        \
    X(gelu,         1, 1, 1, hr_attrs_gelu)                        \
    X(clamp,        1, 1, 1, hr_attrs_clamp)                       \
    X(scale,        1, 1, 1, hr_attrs_scale)                       \
    X(where,        3, 3, 1, hr_attrs_none)                        \
    /* fused elementwise the models use on every layer */           \
    X(silu_mul,     2, 2, 1, hr_attrs_none)                        \
    X(gelu_mul,     2, 2, 1, hr_attrs_gelu)                        \
    /* reductions over one dim */                                  \
    X(sum,          1, 1, 1, hr_attrs_reduce)                      \
    X(mean,         1, 1, 1, hr_attrs_reduce)                      \
    X(max,          1, 1, 1, hr_attrs_reduce)                      \
    X(min,          1, 1, 1, hr_attrs_reduce)                      \
    X(argmax,       1, 1, 1, hr_attrs_reduce)                      \
    X(softmax,      1, 1, 1, hr_attrs_dim)                         \
    X(log_softmax,  1, 1, 1, hr_attrs_dim)                         \
    X(cumsum,       1, 1, 1, hr_attrs_dim)                         \
    X(topk,         1, 1, 2, hr_attrs_topk)                        \
    /* linear algebra */                                           \
    X(matmul,       2, 2, 1, hr_attrs_none)                        \
    X(linear,       2, 3, 1, hr_attrs_none)                        \
    X(linear_group, 2, 8, 3, hr_attrs_linear_group)                \
    X(experts,      5, 7, 1, hr_attrs_experts)                     \
    /* normalization and positions */                              \
    X(rms_norm,     1, 2, 1, hr_attrs_norm)                        \
    X(add_rms_norm, 2, 3, 2, hr_attrs_norm)                        \
    X(layer_norm,   1, 3, 1, hr_attrs_norm)                        \
    X(rope_cos_sin, 2, 2, 2, hr_attrs_rope_cos_sin)                \
    X(rope,         3, 3, 1, hr_attrs_none)                        \
    X(sdpa,         3, 5, 1, hr_attrs_sdpa)                        \
    /* images, NCHW as torch */                                    \
    X(conv2d,       2, 3, 1, hr_attrs_conv2d)                      \
    X(group_norm,   1, 3, 1, hr_attrs_group_norm)                  \
    X(upsample_nearest, 1, 1, 1, hr_attrs_upsample)                \
    /* indexing and data movement */                               \
    X(embedding,    2, 2, 1, hr_attrs_embedding)                        \
    X(index_select, 2, 2, 1, hr_attrs_dim)                         \
    X(gather,       2, 2, 1, hr_attrs_dim)                         \
    X(index_copy,   3, 3, 1, hr_attrs_dim)                         \
    X(cat,          1, 16, 1, hr_attrs_dim)                        \
    X(copy,         1, 1, 1, hr_attrs_none)                        \
    X(cast,         1, 1, 1, hr_attrs_cast)                        \
    X(fill,         0, 0, 1, hr_attrs_fill)                        \
    X(arange,       0, 0, 1, hr_attrs_arange)                      \
    /* collectives over the process group (ops/collective.h) */    \
    X(all_reduce,   1, 2, 1, hr_attrs_cast)                        \
    X(all_gather,   1, 1, 1, hr_attrs_all_gather)                  \
    X(broadcast,    1, 1, 1, hr_attrs_broadcast)
/* clang-format on */

#define HR_MAX_OP_INPUTS 16
#define HR_MAX_OP_OUTPUTS 3

#endif
