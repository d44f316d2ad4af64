/* CPU kernels for the index ops: embedding, index_select, gather,
 * index_copy, cat. All of them move elements without converting, so rows
 * are copied by element size; index values are checked in a first serial
 * pass (errors name the bad value and where it sits), then the copies run
 * on the thread pool. */
#include <stdio.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_eltwise.h"
#include "backends/cpu/linear_pack.h"
#include "core/dequant.h"
#include "core/error.h"
#include "core/threadpool.h"

/* Elements per thread below which splitting a copy is not worth it. */
#define MIN_PER_THREAD HR_GRAIN_ELTWISE

static int64_t load_index(const char *p, hr_dtype dt) {
    if (dt == HR_I64) {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ---- index validation ----------------------------------------------------- */

typedef struct {
    hr_dtype dt;
    int64_t limit;  /* valid values are [0, limit) */
    int64_t seen;   /* elements visited, in logical order */
    int64_t bad_pos, bad_val;
} check_ctx;

static void row_check(void *vctx, char *const *p, const int64_t *s, int64_t n) {
    check_ctx *c = vctx;
    size_t size = hr_dtype_size(c->dt);
    for (int64_t i = 0; i < n && c->bad_pos < 0; i++) {
        int64_t v = load_index(p[0] + i * s[0] * (int64_t)size, c->dt);
        if (v < 0 || v >= c->limit) {
            c->bad_pos = c->seen + i;
            c->bad_val = v;
        }
    }
    c->seen += n;
}

/* Checks every value of `index` is in [0, limit); `what` describes the
 * range for the message ("weight with 100 rows"). */
static hr_status check_indices(const char *op, const char *name, const hr_tensor *index, int64_t limit,
                               const char *what) {
    check_ctx c = {index->dtype, limit, 0, -1, 0};
    hr_iter it;
    hr_iter_init(&it, 1, (const hr_tensor *const[]){index});
    hr_iter_rows(&it, 0, it.rows, row_check, &c);
    if (c.bad_pos < 0) return HR_OK;
    return hr_error(HR_ERR_INVALID_ARG, "%s: %s %lld at position %lld is out of range for %s (valid 0..%lld)",
                    op, name, (long long)c.bad_val, (long long)c.bad_pos, what, (long long)limit - 1);
}

/* Offset in elements of logical element `flat` of a tensor (shape, strides). */
static int64_t nd_offset(int64_t flat, int ndim, const int64_t *shape, const int64_t *strides) {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        off += flat % shape[d] * strides[d];
        flat /= shape[d];
    }
    return off;
}

/* ---- embedding ------------------------------------------------------------ */

typedef struct {
    const hr_tensor *w, *ids, *out;
    const uint32_t *panels; /* w packed for linear (a tied lm_head): rows read from there */
    int64_t first;          /* the table's first row id; ids outside give zero rows (sharded) */
    bool sharded;
} emb_ctx;

/* Row id of a [V, H] bf16 or f16 weight from its linear panels
 * (hr_gemm_panel_elem), so a weight whose own bytes were let go after
 * packing is not read back in. */
static void packed_row(uint16_t *dst, int64_t ds, const uint32_t *panels, int64_t id, int64_t hidden, bool f16) {
    for (int64_t i = 0; i < hidden; i++) dst[i * ds] = hr_gemm_panel_elem(panels, hidden, id, i, f16);
}

/* Row id of a block-quantized [V, H] table into f32 dst (stride ds),
 * dequantized block by block as the GGUF loader does (core/dequant.c). */
static void quant_row(float *dst, int64_t ds, const char *wp, const hr_tensor *w, int64_t id) {
    const uint8_t *row = (const uint8_t *)wp + hr_dtype_nbytes(w->dtype, id * w->strides[0]);
    int64_t blk = hr_dtype_block(w->dtype), hidden = w->shape[1];
    size_t bb = hr_dtype_nbytes(w->dtype, blk);
    float tmp[256];
    for (int64_t b = 0; b < hidden; b += blk, row += bb) {
        if (ds == 1) {
            hr_dequant_row(w->dtype, row, dst + b, blk);
            continue;
        }
        hr_dequant_row(w->dtype, row, tmp, blk);
        for (int64_t i = 0; i < blk; i++) dst[(b + i) * ds] = tmp[i];
    }
}

static void emb_body(void *vctx, int ith, int nth) {
    const emb_ctx *c = vctx;
    const hr_tensor *w = c->w, *ids = c->ids, *out = c->out;
    int64_t n_tok = hr_shape_numel(ids->ndim, ids->shape), hidden = w->shape[1], b, e;
    size_t size = hr_dtype_size(out->dtype), isz = hr_dtype_size(ids->dtype);
    hr_split_range(n_tok, ith, nth, &b, &e);
    const char *wp = hr_tensor_ptr(w), *ip = hr_tensor_ptr(ids);
    char *op = hr_tensor_ptr(out);
    for (int64_t t = b; t < e; t++) {
        int64_t id = load_index(ip + nd_offset(t, ids->ndim, ids->shape, ids->strides) * (int64_t)isz, ids->dtype);
        int64_t o = nd_offset(t, ids->ndim, out->shape, out->strides);
        if (c->sharded) {
            id -= c->first;
            if (id < 0 || id >= w->shape[0]) {
                /* another rank's row: zeros, for the sum over the ranks */
                int64_t ds = out->strides[out->ndim - 1];
                char *dst = op + o * (int64_t)size;
                for (int64_t i = 0; i < hidden; i++) memset(dst + i * ds * (int64_t)size, 0, size);
                continue;
            }
        }
        if (hr_dtype_is_quantized(w->dtype))
            quant_row((float *)(op + o * (int64_t)size), out->strides[out->ndim - 1], wp, w, id);
        else if (c->panels)
            packed_row((uint16_t *)(op + o * (int64_t)size), out->strides[out->ndim - 1], c->panels, id, hidden,
                       w->dtype == HR_F16);
        else
            hr_k_copy_row(op + o * (int64_t)size, out->strides[out->ndim - 1],
                          wp + id * w->strides[0] * (int64_t)size, w->strides[1], hidden, size);
    }
}

/* weight [V, H], ids [...] (i64/i32) -> out [..., H] */
static hr_status k_embedding(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                             int n_out) {
    const hr_attrs_embedding *a = attrs;
    bool sharded = a && a->sharded;
    char what[64];
    snprintf(what, sizeof what, "weight with %lld rows", (long long)in[0]->shape[0]);
    /* a shard's ids are the whole table's: any id is someone's row */
    if (!sharded) HR_TRY(check_indices("embedding", "id", in[1], in[0]->shape[0], what));
    emb_ctx c = {in[0], in[1], out[0], hr_linear_panels(in[0]), sharded ? a->first : 0, sharded};
    int64_t n = hr_tensor_numel(out[0]);
    hr_parallel_run(emb_body, &c, hr_parallel_threads_for(n, MIN_PER_THREAD));
    return HR_OK;
}

/* ---- index_select and index_copy ------------------------------------------- */

/* The view of t at index i along dim (dim kept with size 1). */
static void slice_at(hr_tensor *v, const hr_tensor *t, int dim, int64_t i) {
    *v = *t;
    v->offset += i * t->strides[dim];
    v->shape[dim] = 1;
}

typedef struct {
    const hr_tensor *x, *index, *out;
    int dim;
    bool select; /* out[.., i, ..] = x[.., index[i], ..]; else out[.., index[i], ..] = x[.., i, ..] */
} move_ctx;

static void move_slices(const move_ctx *c, int64_t b, int64_t e, bool parallel) {
    const hr_tensor *index = c->index;
    const char *ip = hr_tensor_ptr(index);
    int64_t ist = index->ndim ? index->strides[0] : 0;
    size_t isz = hr_dtype_size(index->dtype);
    hr_tensor src, dst;
    for (int64_t i = b; i < e; i++) {
        int64_t j = load_index(ip + i * ist * (int64_t)isz, index->dtype);
        slice_at(&src, c->x, c->dim, c->select ? j : i);
        slice_at(&dst, c->out, c->dim, c->select ? i : j);
        hr_k_copy_strided(&dst, &src, parallel);
    }
}

static void move_body(void *vctx, int ith, int nth) {
    const move_ctx *c = vctx;
    int64_t b, e;
    hr_split_range(c->index->ndim ? c->index->shape[0] : 1, ith, nth, &b, &e);
    move_slices(c, b, e, false);
}

static hr_status k_index_select(const void *attrs, const hr_tensor *const *in, int n_in,
                                hr_tensor *const *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    move_ctx c = {in[0], in[1], out[0], (int)(a->dim < 0 ? a->dim + in[0]->ndim : a->dim), true};
    char what[96];
    snprintf(what, sizeof what, "dim %d of size %lld", c.dim, (long long)in[0]->shape[c.dim]);
    HR_TRY(check_indices("index_select", "index", in[1], in[0]->shape[c.dim], what));
    int64_t n_idx = out[0]->shape[c.dim], per = n_idx ? hr_tensor_numel(out[0]) / n_idx : 0;
    /* Many small slices: split the index list; few big ones: split each. */
    if (per >= MIN_PER_THREAD)
        move_slices(&c, 0, n_idx, true);
    else
        hr_parallel_run(move_body, &c, hr_parallel_threads_for(per * n_idx, MIN_PER_THREAD));
    return HR_OK;
}

static bool same_view(const hr_tensor *a, const hr_tensor *b) {
    if (a->buf != b->buf || a->offset != b->offset || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] > 1 && a->strides[d] != b->strides[d]) return false;
    return true;
}

/* index_copy's common case, a static cache's update (a compiled step
 * writing its keys and values to their slots): increasing indices, so no
 * two copies land on the same slice and their order is free, and slices
 * whose dims after `dim` are one contiguous run in source and destination,
 * in separate buffers. Every (outer position, index) run is then one memcpy, the runs split
 * over the pool; copying slice by slice as views cost ~0.3 us per slice
 * (1.5 GB/s for a 512-token prefill's keys). */
typedef struct {
    const hr_tensor *x, *index, *out;
    int dim;
    int64_t n, outer, run; /* indices; positions before dim; elements per run */
} runs_ctx;

/* Elements per run when t's dims after dim are contiguous (else -1). */
static int64_t inner_run(const hr_tensor *t, int dim) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d > dim; d--) {
        if (t->shape[d] > 1 && t->strides[d] != want) return -1;
        want *= t->shape[d];
    }
    return want;
}

static bool increasing(const hr_tensor *index, int64_t n) {
    const char *ip = hr_tensor_ptr(index);
    int64_t ist = (index->ndim ? index->strides[0] : 0) * (int64_t)hr_dtype_size(index->dtype), prev = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = load_index(ip + i * ist, index->dtype);
        if (v <= prev) return false;
        prev = v;
    }
    return true;
}

static void runs_body(void *vctx, int ith, int nth) {
    const runs_ctx *c = vctx;
    int64_t b, e;
    hr_split_range(c->outer * c->n, ith, nth, &b, &e);
    size_t size = hr_dtype_size(c->x->dtype), isz = hr_dtype_size(c->index->dtype);
    const char *xp = hr_tensor_ptr(c->x), *ip = hr_tensor_ptr(c->index);
    char *op = hr_tensor_ptr(c->out);
    int64_t ist = c->index->ndim ? c->index->strides[0] : 0;
    for (int64_t r = b; r < e; r++) {
        int64_t o = r / c->n, i = r % c->n, j = load_index(ip + i * ist * (int64_t)isz, c->index->dtype);
        int64_t xo = nd_offset(o, c->dim, c->x->shape, c->x->strides) + i * c->x->strides[c->dim];
        int64_t oo = nd_offset(o, c->dim, c->out->shape, c->out->strides) + j * c->out->strides[c->dim];
        memcpy(op + oo * (int64_t)size, xp + xo * (int64_t)size, (size_t)c->run * size);
    }
}

/* Serial over the index list so duplicate indices resolve last-wins, as
 * a sequential loop in torch does; each slice copy may use the pool. */
static hr_status k_index_copy(const void *attrs, const hr_tensor *const *in, int n_in,
                              hr_tensor *const *out, int n_out) {
    const hr_attrs_dim *a = attrs;
    const hr_tensor *dst = in[0];
    int dim = (int)(a->dim < 0 ? a->dim + dst->ndim : a->dim);
    char what[96];
    snprintf(what, sizeof what, "dim %d of size %lld", dim, (long long)dst->shape[dim]);
    HR_TRY(check_indices("index_copy", "index", in[1], dst->shape[dim], what));
    if (!same_view(out[0], dst)) hr_k_copy_strided(out[0], dst, true);
    const hr_tensor *x = in[2];
    int64_t n = in[1]->ndim ? in[1]->shape[0] : 1, run = inner_run(x, dim);
    /* (the op layer lets a source into the destination's buffer only as
     * the very same view; memcpy must not see that either) */
    if (run >= 0 && inner_run(out[0], dim) == run && x->buf != out[0]->buf && increasing(in[1], n)) {
        runs_ctx r = {x, in[1], out[0], dim, n, dim ? hr_shape_numel(dim, x->shape) : 1, run};
        if (r.outer * n * run > 0)
            hr_parallel_run(runs_body, &r, hr_parallel_threads_for(r.outer * n * run, MIN_PER_THREAD));
        return HR_OK;
    }
    move_ctx c = {x, in[1], out[0], dim, false};
    move_slices(&c, 0, c.index->ndim ? c.index->shape[0] : 1, true);
    return HR_OK;
}

/* ---- gather ------------------------------------------------------------------ */

typedef struct {
    const hr_tensor *x, *index, *out;
    int dim;
} gather_ctx;

static void gather_body(void *vctx, int ith, int nth) {
    const gather_ctx *c = vctx;
    const hr_tensor *x = c->x, *ix = c->index, *out = c->out;
    /* A 0-dim gather is one element: view everything as shape [1]. */
    int nd = out->ndim ? out->ndim : 1, last = nd - 1, dim = c->dim;
    int64_t one = 1, zero = 0;
    const int64_t *shape = out->ndim ? out->shape : &one;
    const int64_t *os = out->ndim ? out->strides : &zero, *is = ix->ndim ? ix->strides : &zero;
    const int64_t *xs = x->ndim ? x->strides : &zero;
    int64_t len = shape[last], rows = len ? hr_shape_numel(nd, shape) / len : 0, b, e;
    hr_split_range(rows, ith, nth, &b, &e);
    size_t size = hr_dtype_size(x->dtype), isz = hr_dtype_size(ix->dtype);
    const char *xp = hr_tensor_ptr(x), *ip = hr_tensor_ptr(ix);
    char *op = hr_tensor_ptr(out);
    for (int64_t r = b; r < e; r++) {
        int64_t ob = 0, ib = 0, xb = 0, rem = r;
        for (int d = last - 1; d >= 0; d--) {
            int64_t k = rem % shape[d];
            rem /= shape[d];
            ob += k * os[d];
            ib += k * is[d];
            if (d != dim) xb += k * xs[d];
        }
        for (int64_t j = 0; j < len; j++) {
            int64_t v = load_index(ip + (ib + j * is[last]) * (int64_t)isz, ix->dtype);
            int64_t xo = xb + v * xs[dim] + (dim == last ? 0 : j * xs[last]);
            memcpy(op + (ob + j * os[last]) * (int64_t)size, xp + xo * (int64_t)size, size);
        }
    }
}

static hr_status k_gather(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                          int n_out) {
    const hr_attrs_dim *a = attrs;
    const hr_tensor *x = in[0];
    gather_ctx c = {x, in[1], out[0], x->ndim ? (int)(a->dim < 0 ? a->dim + x->ndim : a->dim) : 0};
    int64_t limit = x->ndim ? x->shape[c.dim] : 1;
    char what[96];
    snprintf(what, sizeof what, "dim %d of size %lld", c.dim, (long long)limit);
    HR_TRY(check_indices("gather", "index", in[1], limit, what));
    hr_parallel_run(gather_body, &c, hr_parallel_threads_for(hr_tensor_numel(out[0]), MIN_PER_THREAD));
    return HR_OK;
}

/* ---- cat --------------------------------------------------------------------- */

static hr_status k_cat(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                       int n_out) {
    const hr_attrs_dim *a = attrs;
    int dim = (int)(a->dim < 0 ? a->dim + out[0]->ndim : a->dim);
    hr_tensor part = *out[0];
    int64_t at = 0;
    for (int k = 0; k < n_in; k++) {
        int64_t len = in[k]->shape[dim];
        if (hr_tensor_numel(in[k]) > 0) {
            part.offset = out[0]->offset + at * out[0]->strides[dim];
            part.shape[dim] = len;
            hr_k_copy_strided(&part, in[k], true);
        }
        at += len;
    }
    return HR_OK;
}

void hr_cpu_register_index(hr_cpu_kernel_fn *table) {
    table[HR_OP_embedding] = k_embedding;
    table[HR_OP_index_select] = k_index_select;
    table[HR_OP_gather] = k_gather;
    table[HR_OP_index_copy] = k_index_copy;
    table[HR_OP_cat] = k_cat;
}
