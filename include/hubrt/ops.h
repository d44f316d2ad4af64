/* hubrt eager ops (public API).
 *
 * Every op of op_list.h runs through hr_op_run: shape/dtype inference
 * first (clear errors naming the op and the offending input), then the
 * kernel of the inputs' device. Floating ops on bf16/f16 store in that
 * dtype and accumulate in f32. Binary ops broadcast with NumPy rules; both
 * inputs must share a dtype unless one of them is 0-dim (a scalar), which
 * takes the other's dtype. */
#ifndef HUBRT_OPS_H
#define HUBRT_OPS_H

#include "op_list.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hr_op {
#define HR_X_(name, ...) HR_OP_##name,
    HR_OP_LIST(HR_X_)
#undef HR_X_
    HR_OP_COUNT
} hr_op;

/* A small fixed-size list of ints (shapes, dims) usable inside attrs. */
typedef struct hr_ints {
    int64_t n;
    int64_t v[HR_MAX_DIMS];
} hr_ints;

/* ---- attribute structs (zero-initialise, then set fields) ------------- */

typedef struct hr_attrs_none { int64_t unused_; } hr_attrs_none;

typedef enum hr_gelu_approx { HR_GELU_ERF = 0, HR_GELU_TANH = 1 } hr_gelu_approx;
typedef struct hr_attrs_gelu { int64_t approximate; /* hr_gelu_approx */ } hr_attrs_gelu;

typedef struct hr_attrs_clamp {
    double min, max;
    bool has_min, has_max;
} hr_attrs_clamp;

/* y = x * mul + add */
typedef struct hr_attrs_scale { double mul, add; } hr_attrs_scale;

typedef struct hr_attrs_reduce {
    int64_t dim; /* negative counts from the end */
    bool keepdim;
} hr_attrs_reduce;

typedef struct hr_attrs_dim { int64_t dim; } hr_attrs_dim;

typedef struct hr_attrs_topk {
    int64_t k, dim;
    bool largest; /* false: smallest */
    bool sorted;  /* kept for torch parity; results are always sorted */
} hr_attrs_topk;

/* linear_group(x [..., k], w_0 .. w_{n-1} [n_j, k], [b_0 .. b_{n-1} [n_j]],
 *   [res]): the n linears (1..3) that read the same rows x, in one op
 *   (q/k/v; gate/up), so a device may compute them in one pass (the CPU
 *   streams every weight once for decode rows). Each product y_j = x @
 *   w_j^T + b_j is rounded to x's dtype, as linear would store it; then:
 *   STORE: n outputs y_j [..., n_j];
 *   SILU_MUL, GELU_TANH_MUL: one output act(y_0) * y_1 (n = 2, n_0 = n_1;
 *     silu, or gelu's tanh approximation), as silu_mul / gelu_mul give;
 *   RESIDUAL: one output y_0 + res (n = 1; res [..., n_0], which the
 *     output may overwrite in place).
 *   The biases follow the weights when `bias` is set. */
typedef enum hr_linear_epilogue {
    HR_LINEAR_STORE = 0,
    HR_LINEAR_SILU_MUL = 1,
    HR_LINEAR_GELU_TANH_MUL = 2,
    HR_LINEAR_RESIDUAL = 3,
} hr_linear_epilogue;
typedef struct hr_attrs_linear_group {
    int64_t n;
    int64_t epilogue; /* hr_linear_epilogue */
    bool bias;
} hr_attrs_linear_group;

/* experts(x [..., h], weights [..., k], indices [..., k] (i64 or i32),
 *   gate_up [e, 2i, h], down [e, h, i], [gate_up_bias [e, 2i],
 *   down_bias [e, h]] (both or neither)) -> [..., h]: the experts of a mixture-of-experts
 *   layer, given the router's choice. Row t's output is the sum over its k
 *   slots j of weights[t, j] * down_e(act(gate_up_e(x_t))), e =
 *   indices[t, j]; a slot whose index lies outside [0, e) adds nothing
 *   (the sentinel some routers give a dropped slot). gate_up holds the
 *   gate's i rows, then the up's; each product (+ bias) is rounded to x's
 *   dtype as linear stores it, act(gate) * up computed in f32 and rounded
 *   as silu_mul / gelu_mul give it. The weights may be any float dtype.
 *   per_expert false (grouped): a row's slots are weighted and summed in
 *   f32 in ascending expert order and rounded once. per_expert true
 *   (transformers' eager loop): each weight rounded to x's dtype, each
 *   weighted product rounded, and added into the row in ascending expert
 *   order, rounded after every add (the same bits in f32). */
/* GPT_OSS: gpt-oss's clamped SwiGLU, gate g clamped to at most `limit`,
 * up u to [-limit, limit], then (u + 1) * g * sigmoid(alpha * g). */
typedef enum hr_experts_act { HR_EXPERTS_SILU = 0, HR_EXPERTS_GELU_TANH = 1, HR_EXPERTS_GPT_OSS = 2 } hr_experts_act;
typedef struct hr_attrs_experts {
    int64_t act; /* hr_experts_act */
    double limit, alpha; /* GPT_OSS's */
    bool per_expert;
    /* 0: the device's own kernel; else a kernel library's implementation
     * that the kernel hub loaded (hubrt/kernels.h: hr_kernel_impl_id),
     * on the CPU; other devices run their own lowering. */
    int64_t impl;
    /* CPU: each row through the experts on its own (one-row products), so
     * its bits do not depend on the other rows of the call (hubrt serve
     * --deterministic); slower with many rows per expert. */
    bool batch_invariant;
} hr_attrs_experts;

/* rms_norm: y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset)
 * (weight_offset 1 for Gemma-style norms). layer_norm: inputs x, [weight],
 * [bias]; weight_offset likewise. Normalizes over the last dim. */
typedef struct hr_attrs_norm { double eps, weight_offset; } hr_attrs_norm;

/* conv2d(x [n, c, h, w], weight [o, c / groups, kh, kw], [bias [o]])
 *   -> [n, o, ho, wo], torch's F.conv2d: ho = (h + 2 pad_h - dilation_h
 *   (kh - 1) - 1) / stride_h + 1, likewise wo. Zero padding; f32
 *   accumulation, rounded once to x's dtype. */
typedef struct hr_attrs_conv2d {
    int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
} hr_attrs_conv2d;

/* group_norm(x [n, c, ...], [weight [c]], [bias [c]]): torch's
 * F.group_norm, each of `groups` channel groups of each sample normalized
 * over its channels and spatial positions, in f32, rounded once. */
typedef struct hr_attrs_group_norm {
    int64_t groups;
    double eps;
} hr_attrs_group_norm;

/* upsample_nearest(x [n, c, h, w]) -> [n, c, h * scale, w * scale]:
 * F.interpolate(mode="nearest") with an integer scale factor. */
typedef struct hr_attrs_upsample { int64_t scale; } hr_attrs_upsample;

/* rope_cos_sin(positions i64 [..., seq], inv_freq f32 [rot/2])
 *   -> cos, sin [..., seq, rot] in `dtype`, each multiplied by
 *   attention_scaling (0 means 1), the HF layout cat(freqs, freqs). */
typedef struct hr_attrs_rope_cos_sin {
    double attention_scaling;
    int64_t dtype; /* hr_dtype */
} hr_attrs_rope_cos_sin;

/* sdpa(q [b, hq, s, d], k [b, hkv, t, d], v [b, hkv, t, dv], [mask], [sinks])
 *   -> [b, hq, s, dv]. hq must be a multiple of hkv (GQA by head
 *   broadcast). mask broadcasts to [b, hq, s, t]: bool (true = attend) or
 *   additive float. Causal masking aligns the last query with the last key
 *   (query i sits at position t - s + i), so attention over a longer KV
 *   cache works. window > 0 keeps only keys with pos_q - pos_k < window.
 *   scale 0 means 1/sqrt(d). softcap > 0 applies tanh soft-capping. A
 *   query row with every key masked out gives zeros (torch gives NaN). */
typedef struct hr_attrs_sdpa {
    double scale;
    double softcap;
    int64_t window;
    bool is_causal;
    /* Batch-invariant (CPU): each query row sums over its visible keys one
     * after another, taken in key order starting at key exact_from (and
     * wrapping: a ring cache's oldest slot), after an exact max; its
     * result then depends on its own keys only, not on where they lie nor
     * on the other rows or the threads. Slower; other devices ignore it. */
    bool exact;
    int64_t exact_from;
    /* The last input is sinks [hq] (gpt-oss): each head's logit of a key
     * that takes its share of the softmax and holds no value. */
    bool sinks;
} hr_attrs_sdpa;

/* cast(x) -> x in `dtype`. all_reduce(x, [bias]) -> the sum of x over
 * every process of the group, plus bias (broadcast), in `dtype`: the
 * ranks' parts are summed in f32 in rank order, so every rank holds the
 * same bits whatever the group's reduction algorithm. */
typedef struct hr_attrs_cast { int64_t dtype; /* hr_dtype */ } hr_attrs_cast;

/* all_gather(x) -> every rank's x joined along dim in rank order; rank r
 * gives part r of the even split of `total` (hr_split_part), the length
 * of dim in the output. */
typedef struct hr_attrs_all_gather {
    int64_t dim, total;
} hr_attrs_all_gather;

/* broadcast(x) -> rank `root`'s x on every rank (each rank's x of the
 * same shape and dtype; what the others hold is overwritten). */
typedef struct hr_attrs_broadcast {
    int64_t root;
} hr_attrs_broadcast;

/* embedding(weight [rows, hidden], ids) -> [..., hidden]. sharded: weight
 * holds the table's rows [first, first + rows) (a vocab-split slice); ids
 * outside them give zero rows, for a sum over the ranks to complete.
 * Otherwise every id must index a row. */
typedef struct hr_attrs_embedding {
    int64_t first;
    bool sharded;
} hr_attrs_embedding;

typedef struct hr_attrs_fill {
    hr_ints shape;
    int64_t dtype; /* hr_dtype */
    double value;
} hr_attrs_fill;

typedef struct hr_attrs_arange {
    double start, end, step;
    int64_t dtype; /* hr_dtype */
} hr_attrs_arange;

/* ---- catalog introspection (for bindings, graph hashing, lowering) ---- */

typedef enum hr_attr_type {
    HR_ATTR_I64 = 0,
    HR_ATTR_F64 = 1,
    HR_ATTR_BOOL = 2,
    HR_ATTR_INTS = 3,
} hr_attr_type;

typedef struct hr_attr_field {
    const char *name;
    hr_attr_type type;
    size_t offset; /* within the op's attrs struct */
} hr_attr_field;

HR_API const char *hr_op_name(hr_op op);
HR_API hr_status hr_op_find(const char *name, hr_op *out);
HR_API int hr_op_min_inputs(hr_op op);
HR_API int hr_op_max_inputs(hr_op op);
HR_API int hr_op_num_outputs(hr_op op);
/* The outputs a call with these attrs has: hr_op_num_outputs, except for
 * ops whose attrs set the count (linear_group); -1 for attrs that set
 * none (an invalid count). */
HR_API int hr_op_outputs_for(hr_op op, const void *attrs);
HR_API size_t hr_op_attrs_size(hr_op op);
/* Fields of the op's attrs struct; *n receives the count (0 for none). */
HR_API const hr_attr_field *hr_op_attr_fields(hr_op op, int *n);

/* ---- generic entry ---------------------------------------------------- */

/* Runs `op` on the device of its inputs. For each i < n_out: when outs[i]
 * is NULL a new tensor is allocated and stored there; otherwise outs[i] is
 * the destination (same shape and dtype as inferred, any strides), which is
 * how results are scattered into a slice of a KV cache. `attrs` points to
 * the op's attrs struct (NULL allowed for hr_attrs_none). */
HR_API hr_status hr_op_run(hr_op op, const void *attrs, const hr_tensor *const *in,
                           int n_in, hr_tensor **outs, int n_out);
/* Same, on an explicit device (needed by ops without inputs: fill, arange). */
HR_API hr_status hr_op_run_on(hr_device *dev, hr_op op, const void *attrs,
                              const hr_tensor *const *in, int n_in, hr_tensor **outs,
                              int n_out);

/* ---- typed wrappers: *out always receives a new tensor ---------------- */

#define HR_DECL_BINARY_(name) \
    HR_API hr_status hr_##name(const hr_tensor *a, const hr_tensor *b, hr_tensor **out);
#define HR_DECL_UNARY_(name) HR_API hr_status hr_##name(const hr_tensor *x, hr_tensor **out);
HR_DECL_BINARY_(add)
HR_DECL_BINARY_(sub)
HR_DECL_BINARY_(mul)
HR_DECL_BINARY_(div)
HR_DECL_BINARY_(pow)
HR_DECL_BINARY_(maximum)
HR_DECL_BINARY_(minimum)
HR_DECL_BINARY_(silu_mul)
HR_DECL_BINARY_(matmul)
HR_DECL_UNARY_(neg)
HR_DECL_UNARY_(exp)
HR_DECL_UNARY_(ln) /* torch.log; hr_log is the logger */
HR_DECL_UNARY_(sqrt)
HR_DECL_UNARY_(rsqrt)
HR_DECL_UNARY_(abs)
HR_DECL_UNARY_(relu)
HR_DECL_UNARY_(sigmoid)
HR_DECL_UNARY_(tanh)
HR_DECL_UNARY_(silu)
HR_DECL_UNARY_(contiguous)
#undef HR_DECL_BINARY_
#undef HR_DECL_UNARY_

HR_API hr_status hr_gelu(const hr_tensor *x, hr_gelu_approx approx, hr_tensor **out);
HR_API hr_status hr_clamp(const hr_tensor *x, const double *min, const double *max,
                          hr_tensor **out);
HR_API hr_status hr_scale(const hr_tensor *x, double mul, double add, hr_tensor **out);
HR_API hr_status hr_where(const hr_tensor *cond, const hr_tensor *a, const hr_tensor *b,
                          hr_tensor **out);
HR_API hr_status hr_sum(const hr_tensor *x, int64_t dim, bool keepdim, hr_tensor **out);
HR_API hr_status hr_mean(const hr_tensor *x, int64_t dim, bool keepdim, hr_tensor **out);
HR_API hr_status hr_max(const hr_tensor *x, int64_t dim, bool keepdim, hr_tensor **out);
HR_API hr_status hr_min(const hr_tensor *x, int64_t dim, bool keepdim, hr_tensor **out);
HR_API hr_status hr_argmax(const hr_tensor *x, int64_t dim, bool keepdim, hr_tensor **out);
HR_API hr_status hr_softmax(const hr_tensor *x, int64_t dim, hr_tensor **out);
HR_API hr_status hr_log_softmax(const hr_tensor *x, int64_t dim, hr_tensor **out);
HR_API hr_status hr_cumsum(const hr_tensor *x, int64_t dim, hr_tensor **out);
HR_API hr_status hr_topk(const hr_tensor *x, int64_t k, int64_t dim, bool largest,
                         hr_tensor **values, hr_tensor **indices);
/* x [..., in] @ weight[out, in]^T (+ bias [out]); bias may be NULL. */
HR_API hr_status hr_linear(const hr_tensor *x, const hr_tensor *weight,
                           const hr_tensor *bias, hr_tensor **out);
/* Keeps beside weight ([out, in] bf16, contiguous, in CPU memory; or f16
 * where AVX-512 BF16 is not in use, by the CPU or the ISA setting) a copy
 * in the layout the CPU linear kernels read fastest, where this CPU has
 * them (AVX2 and FMA or more): linear on this weight reads the copy from
 * then on (an f16 one while AVX-512 BF16 stays unused), at any row count,
 * and a row's result no longer depends on how many rows share the call.
 * *packed says whether a copy was made (false: none applies, and linear
 * reads the weight as before). The copy takes the weight's bytes
 * again and goes with its storage; an op that writes the weight drops it,
 * and a write through a raw pointer (DLPack) needs hr_linear_pack again.
 * Models loaded on the CPU pack their linear weights themselves. */
HR_API hr_status hr_linear_pack(hr_tensor *weight, bool *packed);
/* The experts op (attrs above); the biases both NULL or both given. */
HR_API hr_status hr_experts(const hr_tensor *x, const hr_tensor *weights, const hr_tensor *indices,
                            const hr_tensor *gate_up, const hr_tensor *down, const hr_tensor *gate_up_bias,
                            const hr_tensor *down_bias, const hr_attrs_experts *attrs, hr_tensor **out);
HR_API hr_status hr_rms_norm(const hr_tensor *x, const hr_tensor *weight, double eps,
                             double weight_offset, hr_tensor **out);
/* The pre-norm residual step in one pass: *sum = x + residual (rounded to
 * their dtype, as torch's add) and *out = rms_norm(*sum) * weight exactly
 * as hr_rms_norm (weight may be NULL); x and residual have the same shape
 * and dtype. Through hr_op_run the outputs (out, sum) may be the inputs
 * themselves, e.g. sum = residual to update the residual stream in place. */
HR_API hr_status hr_add_rms_norm(const hr_tensor *x, const hr_tensor *residual, const hr_tensor *weight,
                                 double eps, double weight_offset, hr_tensor **out, hr_tensor **sum);
HR_API hr_status hr_layer_norm(const hr_tensor *x, const hr_tensor *weight,
                               const hr_tensor *bias, double eps, hr_tensor **out);
HR_API hr_status hr_rope_cos_sin(const hr_tensor *positions, const hr_tensor *inv_freq,
                                 double attention_scaling, hr_dtype dtype,
                                 hr_tensor **cos, hr_tensor **sin);
/* HF rotate-half rope on the first cos.shape[-1] features of x's last dim
 * (partial rotary leaves the rest untouched); cos/sin broadcast to x. */
HR_API hr_status hr_rope(const hr_tensor *x, const hr_tensor *cos, const hr_tensor *sin,
                         hr_tensor **out);
HR_API hr_status hr_sdpa(const hr_tensor *q, const hr_tensor *k, const hr_tensor *v,
                         const hr_tensor *mask, const hr_attrs_sdpa *attrs,
                         hr_tensor **out);
HR_API hr_status hr_conv2d(const hr_tensor *x, const hr_tensor *weight, const hr_tensor *bias,
                           const hr_attrs_conv2d *attrs, hr_tensor **out);
HR_API hr_status hr_group_norm(const hr_tensor *x, const hr_tensor *weight, const hr_tensor *bias,
                               int64_t groups, double eps, hr_tensor **out);
HR_API hr_status hr_upsample_nearest(const hr_tensor *x, int64_t scale, hr_tensor **out);
/* weight [vocab, hidden], ids (i64/i32) [...] -> [..., hidden] */
HR_API hr_status hr_embedding(const hr_tensor *weight, const hr_tensor *ids,
                              hr_tensor **out);
HR_API hr_status hr_index_select(const hr_tensor *x, int64_t dim, const hr_tensor *index,
                                 hr_tensor **out);
/* torch.gather semantics. */
HR_API hr_status hr_gather(const hr_tensor *x, int64_t dim, const hr_tensor *index,
                           hr_tensor **out);
/* dst[..., index[i], ...] = src[..., i, ...] along dim, in place in dst. */
HR_API hr_status hr_index_copy_(hr_tensor *dst, int64_t dim, const hr_tensor *index,
                                const hr_tensor *src);
HR_API hr_status hr_cat(const hr_tensor *const *xs, int n, int64_t dim, hr_tensor **out);
/* Writes src (broadcast, cast) into dst, any strides: scatter into a slice. */
HR_API hr_status hr_copy_(hr_tensor *dst, const hr_tensor *src);
HR_API hr_status hr_cast(const hr_tensor *x, hr_dtype dtype, hr_tensor **out);
HR_API hr_status hr_fill(hr_device *dev, hr_dtype dtype, int ndim, const int64_t *shape,
                         double value, hr_tensor **out);
HR_API hr_status hr_arange(hr_device *dev, double start, double end, double step,
                           hr_dtype dtype, hr_tensor **out);

/* ---- rope scaling, computed as transformers does ----------------------- */

typedef enum hr_rope_type {
    HR_ROPE_DEFAULT = 0,
    HR_ROPE_LINEAR,
    HR_ROPE_DYNAMIC,
    HR_ROPE_YARN,
    HR_ROPE_LLAMA3,
    HR_ROPE_LONGROPE,
    HR_ROPE_PROPORTIONAL, /* Gemma 4: the first rotated_dim/2 frequencies of a full-width rope, the rest 0 */
} hr_rope_type;

typedef struct hr_rope_config {
    hr_rope_type type;
    double theta;           /* rope_theta */
    int64_t rotary_dim;     /* head_dim * partial_rotary_factor (proportional: head_dim) */
    double factor;          /* linear, dynamic, yarn, llama3 */
    int64_t max_position_embeddings;
    int64_t original_max_position_embeddings; /* yarn, llama3, longrope */
    double low_freq_factor, high_freq_factor; /* llama3 */
    double beta_fast, beta_slow;              /* yarn (defaults 32, 1) */
    double mscale, mscale_all_dim;            /* yarn (0 = unset) */
    double attention_factor;                  /* yarn, longrope (0 = unset) */
    bool no_truncate; /* yarn: true when config says truncate: false (zeroed = transformers default) */
    const double *short_factor, *long_factor; /* longrope, rotary_dim/2 each */
    /* proportional: 2 x int(partial_rotary_factor * head_dim / 2), the
     * leading dims that turn (factor: 0 = 1) */
    int64_t rotated_dim;
} hr_rope_config;

HR_API hr_rope_type hr_rope_type_parse(const char *name, bool *ok);
/* Fills inv_freq[rotary_dim/2] and *attention_scaling for a sequence of
 * `seq_len` tokens (only dynamic and longrope depend on it). */
HR_API hr_status hr_rope_inv_freq(const hr_rope_config *cfg, int64_t seq_len,
                                  float *inv_freq, double *attention_scaling);

#ifdef __cplusplus
}
#endif
#endif
