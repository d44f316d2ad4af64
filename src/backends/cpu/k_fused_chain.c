/* The fused elementwise chain (backends/cpu/plan_fuse.c builds it): one pass over
 * blocks of BLOCK output elements held in L1 as f32. Each step calls the
 * unfused eltwise kernel's own arithmetic (hr_k_eltwise_f32), and its
 * result is rounded through the dtype the unfused op stored, so the chain
 * gives the unfused plan's bytes; what it saves is storing and reloading
 * every intermediate and one thread-pool pass per op. */
#include <math.h>
#include <string.h>

#include "backends/cpu/k_eltwise.h"
#include "backends/cpu/k_fused.h"
#include "core/threadpool.h"

#define BLOCK 512
#define N_OPS (1 + HR_FUSED_MAX_OPERANDS) /* the output, then the operands */

typedef struct chain_ctx {
    const hr_fused_chain *c;
    int ndim; /* after dropping unit dims and coalescing, >= 1 */
    int64_t shape[HR_MAX_DIMS];
    int64_t strides[N_OPS][HR_MAX_DIMS]; /* elements; 0 where the operand broadcasts */
    char *base[N_OPS];
    hr_dtype dt[N_OPS];
    int64_t rows, cols, blocks_per_row;
    bool simd;
} chain_ctx;

/* The operands' strides over out's shape, unit dims dropped and
 * neighbours merged where every operand runs contiguously across them. */
static void chain_layout(chain_ctx *x) {
    const hr_fused_chain *c = x->c;
    const hr_tensor *out = c->out;
    int n_ops = 1 + c->n_operands, nd = 0;
    int64_t shape[HR_MAX_DIMS], st[N_OPS][HR_MAX_DIMS];
    for (int j = 0; j < out->ndim; j++) {
        if (out->shape[j] == 1) continue;
        shape[nd] = out->shape[j];
        for (int k = 0; k < n_ops; k++) {
            const hr_tensor *t = k ? c->operands[k - 1] : out;
            int tj = j - (out->ndim - t->ndim);
            st[k][nd] = tj < 0 || t->shape[tj] == 1 ? 0 : t->strides[tj];
        }
        nd++;
    }
    if (nd == 0) {
        shape[0] = 1;
        for (int k = 0; k < n_ops; k++) st[k][0] = 0;
        nd = 1;
    }
    /* merge from the innermost dim outwards */
    int m = nd - 1;
    x->shape[HR_MAX_DIMS - 1] = shape[m];
    for (int k = 0; k < n_ops; k++) x->strides[k][HR_MAX_DIMS - 1] = st[k][m];
    int top = HR_MAX_DIMS - 1;
    for (int j = m - 1; j >= 0; j--) {
        bool merge = true;
        for (int k = 0; k < n_ops && merge; k++) merge = st[k][j] == x->strides[k][top] * x->shape[top];
        if (merge) {
            x->shape[top] *= shape[j];
            continue;
        }
        top--;
        x->shape[top] = shape[j];
        for (int k = 0; k < n_ops; k++) x->strides[k][top] = st[k][j];
    }
    x->ndim = HR_MAX_DIMS - top;
    memmove(x->shape, x->shape + top, sizeof(int64_t) * (size_t)x->ndim);
    for (int k = 0; k < n_ops; k++) memmove(x->strides[k], x->strides[k] + top, sizeof(int64_t) * (size_t)x->ndim);
    x->cols = x->shape[x->ndim - 1];
    x->rows = 1;
    for (int j = 0; j + 1 < x->ndim; j++) x->rows *= x->shape[j];
    x->blocks_per_row = (x->cols + BLOCK - 1) / BLOCK;
}


/* o = step(a, b) over n elements; o may be a or b. hr_k_eltwise_f32's
 * result for an element does not depend on the range it is given, so any
 * block of the chain gets the unfused kernel's bytes. */
static void apply_step(const chain_ctx *x, const hr_chain_step *s, float *o, const float *a, const float *b,
                       int64_t n) {
    if (s->cast) {
        if (o != a) memcpy(o, a, sizeof(float) * (size_t)n);
        return;
    }
    hr_k_eltwise_f32(s->op, s->p0, s->p1, o, a, b, n, x->simd);
}

/* Element offsets of row r's first element, per operand. */
static void row_offsets(const chain_ctx *x, int64_t r, int64_t *off) {
    int n_ops = 1 + x->c->n_operands;
    for (int k = 0; k < n_ops; k++) off[k] = 0;
    for (int j = x->ndim - 2; j >= 0; j--) {
        int64_t i = r % x->shape[j];
        r /= x->shape[j];
        for (int k = 0; k < n_ops; k++) off[k] += i * x->strides[k][j];
    }
}

static const char *at(const chain_ctx *x, int k, const int64_t *off, int64_t col) {
    return x->base[k] + (off[k] + col * x->strides[k][x->ndim - 1]) * (int64_t)hr_dtype_size(x->dt[k]);
}

/* n elements of operand k from column col as f32; a broadcast one is
 * read once and repeated. */
static void load_operand(const chain_ctx *x, int k, const int64_t *off, int64_t col, int64_t n, float *dst) {
    int64_t stride = x->strides[k][x->ndim - 1];
    hr_k_load_f32(dst, at(x, k, off, col), x->dt[k], stride ? n : 1, stride, x->simd);
    if (stride == 0)
        for (int64_t i = 1; i < n; i++) dst[i] = dst[0];
}

/* n output elements from column col of a row. */
static void chain_block(const chain_ctx *x, const int64_t *off, int64_t col, int64_t n) {
    const hr_fused_chain *c = x->c;
    float acc[BLOCK], arg[BLOCK];
    load_operand(x, 1, off, col, n, acc);
    for (int i = 0; i < c->n_steps; i++) {
        const hr_chain_step *s = &c->steps[i];
        const float *b = acc;
        if (s->operand >= 0) {
            load_operand(x, 1 + s->operand, off, col, n, arg);
            b = arg;
        }
        if (s->acc_right)
            apply_step(x, s, acc, b, acc, n);
        else
            apply_step(x, s, acc, acc, b, n);
        /* the last step's rounding is the store's */
        if (s->round != HR_F32 && i + 1 < c->n_steps) hr_k_round_f32(acc, s->round, n, x->simd);
    }
    hr_k_store_f32((char *)at(x, 0, off, col), x->dt[0], acc, n, x->strides[0][x->ndim - 1], x->simd);
}

static void chain_body(void *arg, int ith, int nth) {
    const chain_ctx *x = arg;
    int64_t b, e, off[N_OPS], row = -1;
    hr_split_range(x->rows * x->blocks_per_row, ith, nth, &b, &e);
    for (int64_t w = b; w < e; w++) {
        int64_t r = w / x->blocks_per_row, col = w % x->blocks_per_row * BLOCK;
        if (r != row) row_offsets(x, row = r, off);
        chain_block(x, off, col, x->cols - col < BLOCK ? x->cols - col : BLOCK);
    }
}

hr_status hr_cpu_fused_chain(const hr_fused_chain *c) {
    chain_ctx x = {.c = c, .simd = hr_k_simd()};
    chain_layout(&x);
    x.base[0] = hr_tensor_ptr(c->out);
    x.dt[0] = c->out->dtype;
    for (int k = 0; k < c->n_operands; k++) {
        x.base[1 + k] = hr_tensor_ptr(c->operands[k]);
        x.dt[1 + k] = c->operands[k]->dtype;
    }
    int64_t total = x.rows * x.cols;
    if (total == 0) return HR_OK;
    int nth = hr_parallel_threads_for(total, HR_GRAIN_ELTWISE); /* hr_iter_parallel's */
    if (nth > 1)
        hr_parallel_run(chain_body, &x, nth);
    else
        chain_body(&x, 0, 1);
    return HR_OK;
}
