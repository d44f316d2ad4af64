/* CPU kernel for experts (ops.h): the tokens grouped by expert (a
 * counting sort of the router's slots, stable: tokens ascending), then,
 * one touched expert after another in ascending order, its rows gathered
 * into one block and taken through gate_up -> act -> down while they are
 * in cache, each product on the GEMM engine (gemm.h), which spreads its
 * columns over the thread pool: a decode step reads the weights of the
 * experts its tokens touch once (few rows: the GEMV route streams them),
 * and no others. Each weighted row is added into its token's f32 sum as
 * the expert finishes, so a row's result depends on its own slots only:
 * never on the other rows of the call, nor on the threads. */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "core/error.h"
#include "ops/op_impl.h"

/* Element offset of row r of t over its leading dims (the last dim is the
 * row), for any strides. */
static int64_t row_offset(const hr_tensor *t, int64_t r) {
    int64_t off = 0;
    for (int d = t->ndim - 2; d >= 0; d--) {
        off += r % t->shape[d] * t->strides[d];
        r /= t->shape[d];
    }
    return off;
}

static const char *row_ptr(const hr_tensor *t, int64_t r) {
    return (const char *)hr_tensor_ptr(t) + row_offset(t, r) * (int64_t)hr_dtype_size(t->dtype);
}

/* The router's index of slot j of row t (i64 or i32). */
static int64_t slot_index(const hr_tensor *idx, int64_t t, int64_t j) {
    const char *p = row_ptr(idx, t) + j * idx->strides[idx->ndim - 1] * (int64_t)hr_dtype_size(idx->dtype);
    if (idx->dtype == HR_I32) return *(const int32_t *)p;
    return *(const int64_t *)p;
}

/* rows x [k] (contiguous, dt) @ weight[e]^T (+ bias[e]) into c [rows, n]
 * (contiguous, dt), where weight is [E, n, k] with any strides. */
static hr_status expert_linear(const char *x, int64_t rows, int64_t k, const hr_tensor *w, int64_t e,
                               const hr_tensor *bias, char *c, int64_t n) {
    size_t esz = hr_dtype_size(w->dtype);
    hr_gemm g = {.m = rows, .n = n, .k = k};
    g.a = (hr_gemm_mat){.base = (char *)x, .dt = w->dtype, .rs = k, .cs = 1};
    g.b = (hr_gemm_mat){.base = (char *)hr_tensor_ptr(w) + e * w->strides[0] * (int64_t)esz, .dt = w->dtype,
                        .rs = w->strides[2], .cs = w->strides[1]};
    g.c = (hr_gemm_mat){.base = c, .dt = w->dtype, .rs = n, .cs = 1};
    if (bias) {
        g.bias = (const char *)hr_tensor_ptr(bias) + e * bias->strides[0] * (int64_t)esz;
        g.bias_dt = bias->dtype;
        g.bias_s = bias->strides[1];
    }
    return hr_gemm_run(&g);
}

typedef struct moe_call {
    const hr_tensor *x, *w, *idx, *gu, *dn, *bgu, *bdn;
    const hr_attrs_experts *a;
    int64_t t, k, e, h, i;
    bool simd;
    /* the slots by expert: expert e's are order[start[e] .. start[e + 1]),
     * each t * k + j */
    int64_t *start, *order;
    float *acc;             /* [t, h] the rows' sums */
    char *xs, *gus, *as, *ds; /* one expert's rows: x [n, h], gate_up [n, 2i], act [n, i], down [n, h] */
    float *f0, *f1;         /* [max(2i, h)] f32 rows */
} moe_call;

/* Counting sort of the slots by expert, tokens ascending within each;
 * slots outside [0, e) are left out. Returns the most rows of one expert. */
static int64_t group_slots(moe_call *c) {
    memset(c->start, 0, (size_t)(c->e + 1) * sizeof *c->start);
    for (int64_t t = 0; t < c->t; t++)
        for (int64_t j = 0; j < c->k; j++) {
            int64_t e = slot_index(c->idx, t, j);
            if (e >= 0 && e < c->e) c->start[e + 1]++;
        }
    int64_t most = 0;
    for (int64_t e = 0; e < c->e; e++) {
        if (c->start[e + 1] > most) most = c->start[e + 1];
        c->start[e + 1] += c->start[e];
    }
    int64_t *fill = c->order + c->start[c->e]; /* scratch cursor per expert, after the order */
    memcpy(fill, c->start, (size_t)c->e * sizeof *fill);
    for (int64_t t = 0; t < c->t; t++)
        for (int64_t j = 0; j < c->k; j++) {
            int64_t e = slot_index(c->idx, t, j);
            if (e >= 0 && e < c->e) c->order[fill[e]++] = t * c->k + j;
        }
    return most;
}

/* Expert e over its n slots: rows gathered, gate_up, act, down, each
 * weighted row added into its token's sum. */
static hr_status run_expert(moe_call *c, int64_t e) {
    const int64_t *slots = c->order + c->start[e];
    int64_t n = c->start[e + 1] - c->start[e], h = c->h, i = c->i;
    hr_dtype dt = c->x->dtype;
    size_t esz = hr_dtype_size(dt);
    int64_t xs = c->x->strides[c->x->ndim - 1];
    for (int64_t r = 0; r < n; r++)
        hr_k_copy_row(c->xs + r * h * (int64_t)esz, 1, row_ptr(c->x, slots[r] / c->k), xs, h, esz);
    HR_TRY(expert_linear(c->xs, n, h, c->gu, e, c->bgu, c->gus, 2 * i));
    hr_ew_op act = c->a->act == HR_EXPERTS_GELU_TANH ? HR_EW_GELU_TANH_MUL : HR_EW_SILU_MUL;
    for (int64_t r = 0; r < n; r++) {
        const char *g = c->gus + r * 2 * i * (int64_t)esz;
        hr_k_load_f32(c->f0, g, dt, i, 1, c->simd);
        hr_k_load_f32(c->f1, g + i * (int64_t)esz, dt, i, 1, c->simd);
        hr_k_eltwise_f32(act, 0, 0, c->f0, c->f0, c->f1, i, c->simd);
        hr_k_store_f32(c->as + r * i * (int64_t)esz, dt, c->f0, i, 1, c->simd);
    }
    HR_TRY(expert_linear(c->as, n, i, c->dn, e, c->bdn, c->ds, h));
    int64_t ws = c->w->strides[c->w->ndim - 1];
    size_t wsz = hr_dtype_size(c->w->dtype);
    for (int64_t r = 0; r < n; r++) {
        int64_t t = slots[r] / c->k, j = slots[r] % c->k;
        float wt;
        hr_k_load_f32(&wt, row_ptr(c->w, t) + j * ws * (int64_t)wsz, c->w->dtype, 1, 1, false);
        hr_k_load_f32(c->f0, c->ds + r * h * (int64_t)esz, dt, h, 1, c->simd);
        float *acc = c->acc + t * h;
        if (c->a->per_expert) {
            /* transformers: (y * w) in x's dtype, index_add_ into x's dtype */
            hr_k_round_f32(&wt, dt, 1, false);
            for (int64_t q = 0; q < h; q++) c->f0[q] *= wt;
            hr_k_round_f32(c->f0, dt, h, c->simd);
            for (int64_t q = 0; q < h; q++) acc[q] += c->f0[q];
            hr_k_round_f32(acc, dt, h, c->simd);
        } else {
            for (int64_t q = 0; q < h; q++) acc[q] += wt * c->f0[q];
        }
    }
    return HR_OK;
}

static hr_status k_experts(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                           int n_out) {
    static const hr_attrs_experts none = {0};
    moe_call c = {.x = in[0], .w = in[1], .idx = in[2], .gu = in[3], .dn = in[4],
                  .bgu = n_in > 5 ? in[5] : NULL, .bdn = n_in > 6 ? in[6] : NULL,
                  .a = attrs ? attrs : &none, .simd = hr_k_simd()};
    c.h = c.x->shape[c.x->ndim - 1];
    c.t = c.h ? hr_shape_numel(c.x->ndim, c.x->shape) / c.h : 0;
    c.k = c.w->shape[c.w->ndim - 1];
    c.e = c.gu->shape[0];
    c.i = c.gu->shape[1] / 2;
    hr_tensor *y = out[0];
    size_t esz = hr_dtype_size(c.x->dtype);
    c.start = malloc((size_t)(c.e + 1) * sizeof *c.start);
    c.order = malloc(((size_t)(c.t * c.k) + (size_t)c.e + 1) * sizeof *c.order);
    c.acc = calloc((size_t)(c.t * c.h) + 1, sizeof *c.acc);
    int64_t wide = 2 * c.i > c.h ? 2 * c.i : c.h;
    c.f0 = malloc((size_t)(2 * wide + 2) * sizeof *c.f0);
    hr_status s = HR_OK;
    if (!c.start || !c.order || !c.acc || !c.f0) s = hr_error(HR_ERR_OOM, "experts: out of memory for %lld rows",
                                                             (long long)c.t);
    char *block = NULL;
    if (s == HR_OK) {
        c.f1 = c.f0 + wide + 1;
        int64_t most = group_slots(&c);
        /* one block for the expert's rows: x, gate_up, act, down */
        size_t per_row = (size_t)(c.h + 2 * c.i + c.i + c.h) * esz;
        block = malloc(per_row * (size_t)most + 64);
        if (!block) s = hr_error(HR_ERR_OOM, "experts: out of memory for %lld rows of one expert", (long long)most);
        c.xs = block;
        c.gus = block + (size_t)(most * c.h) * esz;
        c.as = c.gus + (size_t)(most * 2 * c.i) * esz;
        c.ds = c.as + (size_t)(most * c.i) * esz;
    }
    for (int64_t e = 0; s == HR_OK && e < c.e; e++)
        if (c.start[e + 1] > c.start[e]) s = run_expert(&c, e);
    if (s == HR_OK)
        for (int64_t t = 0; t < c.t; t++)
            hr_k_store_f32((char *)hr_tensor_ptr(y) + row_offset(y, t) * (int64_t)esz, y->dtype, c.acc + t * c.h, c.h,
                           y->strides[y->ndim - 1], c.simd);
    free(block);
    free(c.f0);
    free(c.acc);
    free(c.order);
    free(c.start);
    return s;
}

void hr_cpu_register_moe(hr_cpu_kernel_fn *table) { table[HR_OP_experts] = k_experts; }
