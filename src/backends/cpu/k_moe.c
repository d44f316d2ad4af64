/* CPU kernel for experts (ops.h): the router's slots grouped by expert (a
 * counting sort, stable: tokens ascending); each touched expert's rows
 * gathered into one block and taken through gate_up -> act -> down while
 * they are in cache, each product on the GEMM engine (gemm.h; few rows take
 * its GEMV route, which streams the weights once). A step reads the weights
 * of the experts its tokens touch, once, and no others. With at least two
 * touched experts per thread, the threads take whole experts one at a time
 * (each GEMM then on its own thread: no barrier between experts); with
 * fewer, the experts run one after another with each GEMM split over the
 * threads. Every slot's output row is kept, then each token sums its slots
 * in ascending expert order (per_expert: with transformers' roundings), so
 * the sum never depends on the threads; an expert's products may differ in
 * their last bits with how many rows share the expert (the GEMM engine
 * picks its route by row count), so a row's bits can depend on the batch,
 * unless batch_invariant takes the rows one at a time. Block-quantized
 * weights (a GGUF file's experts, kept in their blocks) take each expert's
 * matrix through the quantized linear instead of the GEMM engine. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_linear_quant.h"
#include "backends/cpu/k_moe.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"
#include "ops/experts_impl.h"
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

/* A tensor over caller memory: no device, no allocation (the kernel
 * library's entry, which links no device). */
static void raw_tensor(hr_tensor *t, hr_buffer *b, hr_dtype dt, const void *p, int ndim, const int64_t *shape) {
    memset(b, 0, sizeof *b);
    memset(t, 0, sizeof *t);
    b->data = (void *)p;
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    hr_contiguous_strides(ndim, shape, t->strides);
    t->buf = b;
}

/* The same with a block-quantized weight ([E, n, k], each expert's rows
 * contiguous): expert e's matrix through the quantized linear
 * (k_linear_quant.c), x quantized to int8 per 32 as for any linear. */
static hr_status expert_linear_quant(const char *x, hr_dtype dt, int64_t rows, int64_t k, const hr_tensor *w,
                                     int64_t e, const hr_tensor *bias, char *c, int64_t n) {
    hr_tensor tx, tw, tb, tc;
    hr_buffer bx, bw, bb, bc;
    const char *we = (const char *)hr_tensor_ptr(w) + hr_dtype_nbytes(w->dtype, e * w->strides[0]);
    raw_tensor(&tx, &bx, dt, x, 2, (int64_t[]){rows, k});
    raw_tensor(&tw, &bw, w->dtype, we, 2, (int64_t[]){n, k});
    raw_tensor(&tc, &bc, dt, c, 2, (int64_t[]){rows, n});
    snprintf(tw.name, sizeof tw.name, "%s", w->name);
    if (bias) {
        raw_tensor(&tb, &bb, bias->dtype,
                   (const char *)hr_tensor_ptr(bias) + e * bias->strides[0] * (int64_t)hr_dtype_size(bias->dtype), 1,
                   (int64_t[]){n});
        tb.strides[0] = bias->strides[1];
    }
    return hr_cpu_linear_quant(&tx, &tw, bias ? &tb : NULL, &tc);
}

/* rows x [k] (contiguous, dt) @ weight[e]^T (+ bias[e]) into c [rows, n]
 * (contiguous, dt), where weight is [E, n, k] with any strides (block
 * types: expert_linear_quant). */
static hr_status expert_linear(const char *x, hr_dtype dt, int64_t rows, int64_t k, const hr_tensor *w, int64_t e,
                               const hr_tensor *bias, char *c, int64_t n) {
    if (hr_dtype_is_quantized(w->dtype)) return expert_linear_quant(x, dt, rows, k, w, e, bias, c, n);
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
    /* From 2 rows the skinny route, which prefetches the cold weights ahead
     * of its dot products (the GEMM engine sends up to 4 bf16 rows to the
     * GEMV route): bench_moe, Qwen3-30B-A3B's layer, AMD EPYC, 2 threads,
     * alternated with the GEMV route at ~34 GB/s reads: 64 rows 85-88% ->
     * 92-94% of the read bound, 4 and 16 rows within the noise (98-104%). */
    if (rows >= 2 && hr_gemm_skinny_fits(&g, HR_GEMM_SKINNY_MIN_ROWS)) return hr_gemm_skinny_run(&g, rows);
    return hr_gemm_run(&g);
}

typedef struct moe_call {
    const hr_tensor *x, *w, *idx, *gu, *dn, *bgu, *bdn;
    const hr_attrs_experts *a;
    int64_t t, k, e, h, i;
    bool simd;
    /* the slots by expert: expert e's are order[start[e] .. start[e + 1]),
     * each t * k + j; row[t * k + j] is the slot's row of d (-1: none) */
    int64_t *start, *order, *row;
    int64_t most;            /* the most rows of one expert */
    char *d;                 /* [slots, h] each slot's expert output, rows in order's order */
    int64_t *touched;        /* the experts with rows, ascending */
    int64_t n_touched;
    atomic_llong next;       /* the next entry of touched to claim */
    atomic_int status;       /* the first failure */
    char err[256];           /* its message (the failing thread's own is thread-local) */
} moe_call;

/* Counting sort of the slots by expert, tokens ascending within each;
 * slots outside [0, e) are left out. */
static void group_slots(moe_call *c) {
    memset(c->start, 0, (size_t)(c->e + 1) * sizeof *c->start);
    for (int64_t t = 0; t < c->t; t++)
        for (int64_t j = 0; j < c->k; j++) {
            int64_t e = slot_index(c->idx, t, j);
            c->row[t * c->k + j] = -1;
            if (e >= 0 && e < c->e) c->start[e + 1]++;
        }
    c->most = c->n_touched = 0;
    for (int64_t e = 0; e < c->e; e++) {
        if (c->start[e + 1] > c->most) c->most = c->start[e + 1];
        if (c->start[e + 1]) c->touched[c->n_touched++] = e;
        c->start[e + 1] += c->start[e];
    }
    int64_t *fill = c->order + c->start[c->e]; /* a cursor per expert, after the order */
    memcpy(fill, c->start, (size_t)c->e * sizeof *fill);
    for (int64_t t = 0; t < c->t; t++)
        for (int64_t j = 0; j < c->k; j++) {
            int64_t e = slot_index(c->idx, t, j);
            if (e < 0 || e >= c->e) continue;
            c->row[t * c->k + j] = fill[e];
            c->order[fill[e]++] = t * c->k + j;
        }
}

/* One expert's rows: x [most, h], gate_up [most, 2i], act [most, i]. */
typedef struct expert_scratch {
    char *xs, *gus, *as;
    float *f0, *f1; /* [i] */
} expert_scratch;

static hr_status scratch_new(const moe_call *c, expert_scratch *s) {
    size_t esz = hr_dtype_size(c->x->dtype), n = (size_t)c->most;
    s->xs = malloc(n * (size_t)(c->h + 3 * c->i) * esz + 64);
    s->f0 = malloc((size_t)(2 * c->i + 2) * sizeof *s->f0);
    if (!s->xs || !s->f0) {
        free(s->xs);
        free(s->f0);
        return hr_error(HR_ERR_OOM, "experts: out of memory for %lld rows of one expert", (long long)c->most);
    }
    s->gus = s->xs + n * (size_t)c->h * esz;
    s->as = s->gus + n * (size_t)(2 * c->i) * esz;
    s->f1 = s->f0 + c->i + 1;
    return HR_OK;
}

static void scratch_free(expert_scratch *s) {
    free(s->xs);
    free(s->f0);
}

/* gpt-oss's clamped SwiGLU into g: g = min(g, limit), u clamped to
 * [-limit, limit], (u + 1) * g * sigmoid(alpha * g), in f32. */
static void gpt_oss_glu(float *g, const float *u, int64_t n, float limit, float alpha) {
    for (int64_t j = 0; j < n; j++) {
        float x = fminf(g[j], limit), y = fminf(fmaxf(u[j], -limit), limit);
        g[j] = (y + 1.0f) * (x / (1.0f + expf(-alpha * x)));
    }
}

/* Expert e over its rows: gathered, gate_up, act, down into its rows of d. */
static hr_status run_expert(const moe_call *c, int64_t e, expert_scratch *sc) {
    const int64_t *slots = c->order + c->start[e];
    int64_t n = c->start[e + 1] - c->start[e], h = c->h, i = c->i;
    hr_dtype dt = c->x->dtype;
    size_t esz = hr_dtype_size(dt);
    int64_t xs = c->x->strides[c->x->ndim - 1];
    for (int64_t r = 0; r < n; r++)
        hr_k_copy_row(sc->xs + r * h * (int64_t)esz, 1, row_ptr(c->x, slots[r] / c->k), xs, h, esz);
    /* batch-invariant: one-row products, whose route never changes with the expert's row count */
    int64_t step = c->a->batch_invariant ? 1 : n;
    for (int64_t r0 = 0; r0 < n; r0 += step)
        HR_TRY(expert_linear(sc->xs + r0 * h * (int64_t)esz, dt, step, h, c->gu, e, c->bgu,
                             sc->gus + r0 * 2 * i * (int64_t)esz, 2 * i));
    hr_ew_op act = c->a->act == HR_EXPERTS_GELU_TANH ? HR_EW_GELU_TANH_MUL : HR_EW_SILU_MUL;
    for (int64_t r = 0; r < n; r++) {
        const char *g = sc->gus + r * 2 * i * (int64_t)esz;
        hr_k_load_f32(sc->f0, g, dt, i, 1, c->simd);
        hr_k_load_f32(sc->f1, g + i * (int64_t)esz, dt, i, 1, c->simd);
        if (c->a->act == HR_EXPERTS_GPT_OSS)
            gpt_oss_glu(sc->f0, sc->f1, i, (float)c->a->limit, (float)c->a->alpha);
        else
            hr_k_eltwise_f32(act, 0, 0, sc->f0, sc->f0, sc->f1, i, c->simd);
        hr_k_store_f32(sc->as + r * i * (int64_t)esz, dt, sc->f0, i, 1, c->simd);
    }
    for (int64_t r0 = 0; r0 < n; r0 += step)
        HR_TRY(expert_linear(sc->as + r0 * i * (int64_t)esz, dt, step, i, c->dn, e, c->bdn,
                             c->d + (c->start[e] + r0) * h * (int64_t)esz, h));
    return HR_OK;
}

static void fail(moe_call *c, hr_status s) {
    int ok = HR_OK;
    if (atomic_compare_exchange_strong(&c->status, &ok, (int)s)) snprintf(c->err, sizeof c->err, "%s", hr_last_error());
}

/* A thread's share: experts claimed one at a time, each GEMM on this
 * thread alone (a region inside a region runs serially), so the threads
 * stream different experts' weights side by side with no barrier between
 * experts. */
static void experts_task(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    moe_call *c = arg;
    expert_scratch sc;
    hr_status s = scratch_new(c, &sc);
    if (s != HR_OK) {
        fail(c, s);
        return;
    }
    for (int64_t u; atomic_load(&c->status) == HR_OK && (u = atomic_fetch_add(&c->next, 1)) < c->n_touched;) {
        s = run_expert(c, c->touched[u], &sc);
        if (s != HR_OK) fail(c, s);
    }
    scratch_free(&sc);
}

/* Row t's sum: its slots' rows of d weighted, in ascending expert order
 * (order: k scratch entries). */
static void combine_row(const moe_call *c, int64_t t, float *acc, float *tmp, int64_t *order) {
    int64_t h = c->h, n = 0;
    hr_dtype dt = c->x->dtype;
    size_t esz = hr_dtype_size(dt), wsz = hr_dtype_size(c->w->dtype);
    int64_t ws = c->w->strides[c->w->ndim - 1];
    memset(acc, 0, (size_t)h * sizeof *acc);
    /* the slots by expert, insertion-sorted: their rows of d ascend with the expert */
    for (int64_t j = 0; j < c->k; j++) {
        int64_t r = c->row[t * c->k + j];
        if (r < 0) continue;
        int64_t q = n++;
        for (; q > 0 && c->row[t * c->k + order[q - 1]] > r; q--) order[q] = order[q - 1];
        order[q] = j;
    }
    for (int64_t q = 0; q < n; q++) {
        int64_t j = order[q];
        float wt;
        hr_k_load_f32(&wt, row_ptr(c->w, t) + j * ws * (int64_t)wsz, c->w->dtype, 1, 1, false);
        hr_k_load_f32(tmp, c->d + c->row[t * c->k + j] * h * (int64_t)esz, dt, h, 1, c->simd);
        if (c->a->per_expert) {
            /* transformers: (y * w) in x's dtype, index_add_ into x's dtype */
            hr_k_round_f32(&wt, dt, 1, false);
            for (int64_t p = 0; p < h; p++) tmp[p] *= wt;
            hr_k_round_f32(tmp, dt, h, c->simd);
            for (int64_t p = 0; p < h; p++) acc[p] += tmp[p];
            hr_k_round_f32(acc, dt, h, c->simd);
        } else {
            for (int64_t p = 0; p < h; p++) acc[p] += wt * tmp[p];
        }
    }
}

typedef struct combine_ctx {
    const moe_call *c;
    hr_tensor *y;
    atomic_int status;
} combine_ctx;

static void combine_task(void *arg, int ith, int nth) {
    combine_ctx *x = arg;
    const moe_call *c = x->c;
    int64_t t0, t1;
    hr_split_range(c->t, ith, nth, &t0, &t1);
    float *acc = malloc((size_t)(2 * c->h + 1) * sizeof *acc);
    int64_t *order = malloc((size_t)(c->k + 1) * sizeof *order);
    if (!acc || !order) {
        free(acc);
        free(order);
        atomic_store(&x->status, HR_ERR_OOM);
        return;
    }
    size_t esz = hr_dtype_size(x->y->dtype);
    for (int64_t t = t0; t < t1; t++) {
        combine_row(c, t, acc, acc + c->h, order);
        hr_k_store_f32((char *)hr_tensor_ptr(x->y) + row_offset(x->y, t) * (int64_t)esz, x->y->dtype, acc, c->h,
                       x->y->strides[x->y->ndim - 1], c->simd);
    }
    free(acc);
    free(order);
}

/* The call handed to a kernel library's implementation (attr impl). */
static hr_status run_external(const hr_attrs_experts *a, const hr_tensor *const *in, int n_in, hr_tensor *y) {
    const char *name = "?";
    hr_experts_fn fn = hr_experts_impl_find(a->impl, &name);
    if (!fn)
        return hr_error(HR_ERR_NOT_FOUND, "experts: implementation %lld is not loaded (load its kernel first)",
                        (long long)a->impl);
    for (int j = 0; j <= n_in; j++) {
        const hr_tensor *t = j < n_in ? in[j] : y;
        if (!hr_tensor_is_contiguous(t))
            return hr_error(HR_ERR_UNSUPPORTED, "experts: the kernel '%s' takes contiguous tensors; %s is not", name,
                            j < n_in ? "an input" : "the output");
    }
    if (in[2]->dtype != HR_I64)
        return hr_error(HR_ERR_DTYPE, "experts: the kernel '%s' takes i64 indices, got %s", name,
                        hr_dtype_name(in[2]->dtype));
    const hr_tensor *x = in[0], *gu = in[3];
    char err[256] = "";
    hr_kernel_experts_args k = {
        .dtype = (int32_t)x->dtype, .weights_dtype = (int32_t)in[1]->dtype, .act = (int32_t)a->act,
        .per_expert = a->per_expert, .limit = a->limit, .alpha = a->alpha, .h = x->shape[x->ndim - 1], .i = gu->shape[1] / 2, .e = gu->shape[0],
        .k = in[1]->shape[in[1]->ndim - 1], .x = hr_tensor_ptr(x), .weights = hr_tensor_ptr(in[1]),
        .indices = hr_tensor_ptr(in[2]), .gate_up = hr_tensor_ptr(gu), .down = hr_tensor_ptr(in[4]),
        .gate_up_bias = n_in > 5 ? hr_tensor_ptr(in[5]) : NULL, .down_bias = n_in > 6 ? hr_tensor_ptr(in[6]) : NULL,
        .out = hr_tensor_ptr(y), .isa = (int32_t)hr_cpu_isa_get(), .threads = hr_num_threads(), .error = err,
        .error_cap = sizeof err};
    k.t = k.h ? hr_shape_numel(x->ndim, x->shape) / k.h : 0;
    int rc = fn(&k);
    if (rc == 0) return HR_OK;
    err[sizeof err - 1] = 0;
    hr_status code = rc > 0 && rc < HR_STATUS_COUNT ? (hr_status)rc : HR_ERR_INTERNAL;
    return hr_error(code, "experts: the kernel '%s' failed: %s", name, err[0] ? err : "(no message)");
}

static hr_status k_experts(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                           int n_out) {
    static const hr_attrs_experts none = {0};
    if (attrs && ((const hr_attrs_experts *)attrs)->impl) return run_external(attrs, in, n_in, out[0]);
    moe_call c = {.x = in[0], .w = in[1], .idx = in[2], .gu = in[3], .dn = in[4],
                  .bgu = n_in > 5 ? in[5] : NULL, .bdn = n_in > 6 ? in[6] : NULL,
                  .a = attrs ? attrs : &none, .simd = hr_k_simd()};
    c.h = c.x->shape[c.x->ndim - 1];
    c.t = c.h ? hr_shape_numel(c.x->ndim, c.x->shape) / c.h : 0;
    c.k = c.w->shape[c.w->ndim - 1];
    c.e = c.gu->shape[0];
    c.i = c.gu->shape[1] / 2;
    atomic_init(&c.next, 0);
    atomic_init(&c.status, HR_OK);
    size_t esz = hr_dtype_size(c.x->dtype), slots = (size_t)(c.t * c.k);
    c.start = malloc((size_t)(c.e + 1) * sizeof *c.start);
    c.touched = malloc((size_t)(c.e + 1) * sizeof *c.touched);
    c.order = malloc((slots + (size_t)c.e + 1) * sizeof *c.order);
    c.row = malloc((slots + 1) * sizeof *c.row);
    c.d = malloc(slots * (size_t)c.h * esz + 64);
    hr_status s = HR_OK;
    if (!c.start || !c.touched || !c.order || !c.row || !c.d)
        s = hr_error(HR_ERR_OOM, "experts: out of memory for %lld rows", (long long)c.t);
    if (s == HR_OK) {
        group_slots(&c);
        int nth = hr_parallel_threads_for(c.n_touched, 1);
        if (nth > 1 && c.n_touched >= 2 * (int64_t)nth) {
            /* experts side by side, one per thread at a time */
            hr_parallel_run(experts_task, &c, nth);
            s = (hr_status)atomic_load(&c.status);
            if (s != HR_OK) s = hr_error(s, "experts: %s", c.err);
        } else {
            /* few experts: one after another, each GEMM over every thread */
            expert_scratch sc;
            s = c.n_touched ? scratch_new(&c, &sc) : HR_OK;
            for (int64_t u = 0; s == HR_OK && u < c.n_touched; u++) s = run_expert(&c, c.touched[u], &sc);
            if (c.n_touched) scratch_free(&sc);
        }
    }
    if (s == HR_OK) {
        combine_ctx x = {.c = &c, .y = out[0]};
        atomic_init(&x.status, HR_OK);
        hr_parallel_run(combine_task, &x, hr_parallel_threads_for(c.t * c.h * (c.k + 1), HR_GRAIN_ELTWISE));
        if (atomic_load(&x.status) != HR_OK) s = hr_error(HR_ERR_OOM, "experts: out of memory combining rows");
    }
    free(c.d);
    free(c.row);
    free(c.order);
    free(c.touched);
    free(c.start);
    return s;
}

int hr_cpu_experts_raw(const hr_kernel_experts_args *a) {
    if ((a->isa >= 0 && hr_cpu_isa_get() != (hr_cpu_isa)a->isa && hr_cpu_isa_set((hr_cpu_isa)a->isa) != HR_OK) ||
        (a->threads > 0 && hr_num_threads() != a->threads && hr_set_num_threads(a->threads) != HR_OK)) {
        if (a->error && a->error_cap) snprintf(a->error, a->error_cap, "%s", hr_last_error());
        return HR_ERR_UNSUPPORTED;
    }
    hr_dtype dt = (hr_dtype)a->dtype;
    hr_tensor t[8];
    hr_buffer b[8];
    raw_tensor(&t[0], &b[0], dt, a->x, 2, (int64_t[]){a->t, a->h});
    raw_tensor(&t[1], &b[1], (hr_dtype)a->weights_dtype, a->weights, 2, (int64_t[]){a->t, a->k});
    raw_tensor(&t[2], &b[2], HR_I64, a->indices, 2, (int64_t[]){a->t, a->k});
    raw_tensor(&t[3], &b[3], dt, a->gate_up, 3, (int64_t[]){a->e, 2 * a->i, a->h});
    raw_tensor(&t[4], &b[4], dt, a->down, 3, (int64_t[]){a->e, a->h, a->i});
    int n_in = 5;
    if (a->gate_up_bias && a->down_bias) {
        raw_tensor(&t[5], &b[5], dt, a->gate_up_bias, 2, (int64_t[]){a->e, 2 * a->i});
        raw_tensor(&t[6], &b[6], dt, a->down_bias, 2, (int64_t[]){a->e, a->h});
        n_in = 7;
    }
    raw_tensor(&t[7], &b[7], dt, a->out, 2, (int64_t[]){a->t, a->h});
    const hr_tensor *in[7] = {&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6]};
    hr_tensor *out[1] = {&t[7]};
    hr_attrs_experts attrs = {.act = a->act, .per_expert = a->per_expert != 0, .limit = a->limit, .alpha = a->alpha};
    hr_status s = k_experts(&attrs, in, n_in, out, 1);
    if (s != HR_OK && a->error && a->error_cap) snprintf(a->error, a->error_cap, "%s", hr_last_error());
    return (int)s;
}

void hr_cpu_register_moe(hr_cpu_kernel_fn *table) { table[HR_OP_experts] = k_experts; }
