/* StableHLO module builder: ops are appended as MLIR text to one function.
 *
 * The eager path builds one small module per op (load views, lower the
 * op, store views); a compiled graph will append every node's lowering to
 * the same builder and become one module. Values are SSA names with a
 * logical shape and dtype; bool values are i1. Nothing here needs the PJRT
 * header. */
#ifndef HR_PJRT_SHLO_H
#define HR_PJRT_SHLO_H

#include "core/tensor_impl.h"

typedef struct hr_shlo_value {
    int id; /* %v<id>; negative marks an invalid value after an error */
    hr_dtype dt;
    int ndim;
    int64_t shape[HR_MAX_DIMS];
} hr_shlo_value;

typedef struct hr_shlo_builder {
    char *body; /* the function body */
    size_t len, cap;
    char *sig; /* "%v0: tensor<...>, ..." */
    size_t sig_len, sig_cap;
    int n_args;
    int next_id;
    int num_replicas; /* > 1 for collectives */
    hr_status status; /* first failure (OOM, unsupported lowering) */
} hr_shlo_builder;

void hr_shlo_init(hr_shlo_builder *b);
void hr_shlo_free(hr_shlo_builder *b);
/* Records the first failure with its message; later emits become no-ops. */
hr_status hr_shlo_fail(hr_shlo_builder *b, hr_status code, const char *fmt, ...) HR_PRINTF(3, 4);
/* Appends the function's result list and returns the module text (malloc'd)
 * or NULL with the builder's error. */
char *hr_shlo_finish(hr_shlo_builder *b, const char *name, const hr_shlo_value *results, int n);

/* MLIR element type of dt: "f32", "bf16", "i64", "ui8", "i1", ... */
const char *hr_shlo_elem(hr_dtype dt);
/* "tensor<2x3xf32>" into buf. */
const char *hr_shlo_type(char *buf, size_t n, hr_dtype dt, int ndim, const int64_t *shape);
const char *hr_shlo_vtype(char *buf, size_t n, const hr_shlo_value *v);

/* ---- building blocks ---- */

hr_shlo_value hr_shlo_arg(hr_shlo_builder *b, hr_dtype dt, int ndim, const int64_t *shape);
/* An argument aliased to result `result` (donated: updated in place). */
hr_shlo_value hr_shlo_arg_donated(hr_shlo_builder *b, hr_dtype dt, int ndim, const int64_t *shape, int result);
/* Generic op "stablehlo.<name>"(ins) {attrs} -> result of (dt, ndim, shape). */
hr_shlo_value hr_shlo_op(hr_shlo_builder *b, const char *name, const hr_shlo_value *ins, int n,
                         const char *attrs, hr_dtype dt, int ndim, const int64_t *shape);
/* "stablehlo.concatenate" of n values along dim -> result of (dt, ndim, shape). */
hr_shlo_value hr_shlo_concat(hr_shlo_builder *b, const hr_shlo_value *ins, int n, int dim, hr_dtype dt, int ndim,
                             const int64_t *shape);
/* 0-dim constant (floats: value rounded to dt; ints: truncated). */
hr_shlo_value hr_shlo_const(hr_shlo_builder *b, hr_dtype dt, double value);
hr_shlo_value hr_shlo_const_i64(hr_shlo_builder *b, int64_t value);
/* Constant broadcast to a shape. */
hr_shlo_value hr_shlo_splat(hr_shlo_builder *b, hr_dtype dt, double value, int ndim, const int64_t *shape);
/* NumPy broadcast of v (trailing-aligned) to shape. */
hr_shlo_value hr_shlo_bcast(hr_shlo_builder *b, hr_shlo_value v, int ndim, const int64_t *shape);
/* broadcast_in_dim with an explicit dims map (dims[i] = result dim of v's dim i). */
hr_shlo_value hr_shlo_bcast_dims(hr_shlo_builder *b, hr_shlo_value v, const int *dims, int ndim,
                                 const int64_t *shape);
hr_shlo_value hr_shlo_convert(hr_shlo_builder *b, hr_shlo_value v, hr_dtype dt);
hr_shlo_value hr_shlo_reshape(hr_shlo_builder *b, hr_shlo_value v, int ndim, const int64_t *shape);
hr_shlo_value hr_shlo_transpose(hr_shlo_builder *b, hr_shlo_value v, const int *perm);
hr_shlo_value hr_shlo_unary(hr_shlo_builder *b, const char *name, hr_shlo_value x);
/* Same-shape binary op (broadcast first). */
hr_shlo_value hr_shlo_binary(hr_shlo_builder *b, const char *name, hr_shlo_value x, hr_shlo_value y);
/* Same-shape compare: dir is "EQ", "NE", "LT", "LE", "GT", "GE"; result i1. */
hr_shlo_value hr_shlo_compare(hr_shlo_builder *b, const char *dir, hr_shlo_value x, hr_shlo_value y);
hr_shlo_value hr_shlo_select(hr_shlo_builder *b, hr_shlo_value pred, hr_shlo_value t, hr_shlo_value f);
hr_shlo_value hr_shlo_iota(hr_shlo_builder *b, hr_dtype dt, int dim, int ndim, const int64_t *shape);
hr_shlo_value hr_shlo_slice(hr_shlo_builder *b, hr_shlo_value v, const int64_t *start,
                            const int64_t *limit, const int64_t *stride);
/* Reduces dims (a mask over v's dims) with a binary op ("add", "maximum",
 * "minimum") from init (0-dim, v's dtype). */
hr_shlo_value hr_shlo_reduce(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value init, const char *fn,
                             const bool *dims);
/* Flat gather: out[i] = v[idx[i]] for 1-D v and an i64 index tensor. */
hr_shlo_value hr_shlo_gather_flat(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value idx);
/* Overwriting scatter of upd into v along `dim`: `window_dims` are the
 * dims of upd copied whole (all but the scattered one), idx holds the
 * positions along dim (index_vector_dim as in StableHLO). */
hr_shlo_value hr_shlo_scatter(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value idx, hr_shlo_value upd,
                              const int *window_dims, int n_window, int dim, int index_vector_dim);
/* A 16-bit float array's bits as i16 (same shape), and back with
 * hr_shlo_bits_as; other dtypes pass through. Data movement (scatter,
 * dynamic_update_slice) runs on the bits: XLA's CPU compiler widens bf16
 * and f16 ops to f32, and a dynamic_update_slice of a layer's KV rows
 * widened the whole flat cache to f32 and back for every layer. */
bool hr_shlo_float16(hr_dtype dt); /* bf16 or f16 */
hr_shlo_value hr_shlo_bits(hr_shlo_builder *b, hr_shlo_value v);
hr_shlo_value hr_shlo_bits_as(hr_shlo_builder *b, hr_shlo_value v, hr_dtype dt);
/* Flat scatter (overwrite): v[idx[i]] = upd[i] for 1-D v. */
hr_shlo_value hr_shlo_scatter_flat(hr_shlo_builder *b, hr_shlo_value v, hr_shlo_value idx,
                                   hr_shlo_value upd);
/* The body of a reducer region on 0-dim dt values: "^bb0(%a, %b): return
 * fn(a, b)", or return %b (overwrite, for scatters) when fn is NULL. */
void hr_shlo_region(hr_shlo_builder *b, hr_dtype dt, const char *fn);
/* Emits raw text into the body (regions, ops the helpers don't cover). */
void hr_shlo_text(hr_shlo_builder *b, const char *fmt, ...) HR_PRINTF(2, 3);
int hr_shlo_new_id(hr_shlo_builder *b);
/* The value %v<id> with the given type, after hand-written text defined it. */
hr_shlo_value hr_shlo_named(int id, hr_dtype dt, int ndim, const int64_t *shape);

/* dot_general with `nb` leading batch dims: contracts lhs dim lc with rhs
 * dim rc; result [batch..., lhs free..., rhs free...] in the compute dtype
 * (f32 for bf16/f16 operands). */
hr_shlo_value hr_shlo_dot(hr_shlo_builder *b, hr_shlo_value x, hr_shlo_value y, int nb, int lc, int rc);

/* bf16/f16 compute in f32; other dtypes in themselves. */
hr_dtype hr_shlo_compute_dtype(hr_dtype dt);
static inline hr_shlo_value hr_shlo_up(hr_shlo_builder *b, hr_shlo_value v) {
    return hr_shlo_convert(b, v, hr_shlo_compute_dtype(v.dt));
}

/* ---- op lowering (one function per op of the catalog) ---- */

/* Lowers `op` on input values (logical shapes) into output values of the
 * inferred metas. Returns HR_ERR_UNSUPPORTED for calls it cannot lower. */
typedef hr_status (*hr_shlo_lower_fn)(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in,
                                      int n_in, const hr_tensor_meta *meta, hr_shlo_value *out,
                                      int n_out);
/* Whether `op` with these input metas lowers (no emission). */
typedef bool (*hr_shlo_check_fn)(const void *attrs, const hr_tensor *const *in, int n_in);

typedef struct hr_shlo_lowering {
    hr_shlo_lower_fn lower;
    hr_shlo_check_fn check; /* NULL: every call lowers */
} hr_shlo_lowering;

const hr_shlo_lowering *hr_shlo_lowering_get(hr_op op);
void hr_shlo_register_eltwise(hr_shlo_lowering *table);
void hr_shlo_register_reduce(hr_shlo_lowering *table);
void hr_shlo_register_linalg(hr_shlo_lowering *table);
void hr_shlo_register_index(hr_shlo_lowering *table);
void hr_shlo_register_nn(hr_shlo_lowering *table);
void hr_shlo_register_moe(hr_shlo_lowering *table);
void hr_shlo_register_image(hr_shlo_lowering *table);
void hr_shlo_register_collective(hr_shlo_lowering *table);

/* ---- views over flat byte buffers ---- */

/* Describes how a tensor sits in its device buffer. */
typedef struct hr_shlo_view {
    hr_dtype dt;
    int ndim;
    int64_t shape[HR_MAX_DIMS];
    int64_t strides[HR_MAX_DIMS];
    bool contiguous;
    bool has_offset; /* the offset is passed at run time as an i64 scalar */
    int64_t buf_bytes;
} hr_shlo_view;

void hr_shlo_view_of(const hr_tensor *t, hr_shlo_view *v);
/* Declares the buffer argument (and offset argument) and returns the
 * tensor's logical value. */
hr_shlo_value hr_shlo_view_load(hr_shlo_builder *b, const hr_shlo_view *v);
/* Returns the new bytes of the output's buffer holding `val`: declares the
 * old buffer (and offset) as arguments unless the view covers it all. When
 * `donate_as` >= 0 the old buffer is donated to that result, so XLA writes
 * the view in place instead of copying the whole buffer. */
hr_shlo_value hr_shlo_view_store(hr_shlo_builder *b, const hr_shlo_view *v, hr_shlo_value val, int donate_as);
/* The same steps on SSA values, for a module holding many ops (a compiled
 * graph): a buffer's bytes are kept as a flat 1-D array of some storage
 * dtype (bool is ui8), and offsets are i64 0-dim values (id < 0: none). */

/* flat reinterpreted as a flat array of dt's storage dtype. */
hr_shlo_value hr_shlo_flat_as(hr_shlo_builder *b, hr_shlo_value flat, hr_dtype dt);
/* The view's logical value, read from flat (storage dtype of v->dt). */
hr_shlo_value hr_shlo_view_get(hr_shlo_builder *b, const hr_shlo_view *v, hr_shlo_value flat, hr_shlo_value off);
/* flat with the view overwritten by val (flat is not read when the view
 * covers the whole buffer). */
hr_shlo_value hr_shlo_view_put(hr_shlo_builder *b, const hr_shlo_view *v, hr_shlo_value flat, hr_shlo_value off,
                               hr_shlo_value val);
/* Whether the output view covers its whole buffer contiguously. */
bool hr_shlo_view_is_full(const hr_shlo_view *v);

#endif
