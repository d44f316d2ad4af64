/* Compile-path passes over captured graphs: fusion of linears and their
 * epilogues, elementwise-chain fusion, in-place fused nodes, and the
 * threading plan. Each replay is compared with eager, bit for bit where
 * the math is the same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "graph/disk_cache.h"
#include "hubrt.h"
#include "hubrt/graph.h"
#include "test_util.h"

/* ---- fusion ---------------------------------------------------------- */

typedef struct {
    hr_tensor *w[6]; /* q [8, 8], k [4, 8], v [4, 8], gate [12, 8], up [12, 8], down [8, 12] */
    hr_tensor *bq;   /* [8] */
} layer_w;

static const hr_tensor *resolve_layer(void *ctx, const char *name) {
    layer_w *L = ctx;
    static const char *names[6] = {"wq", "wk", "wv", "wg", "wu", "wd"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(name, names[i])) return L->w[i];
    return strcmp(name, "bq") ? NULL : L->bq;
}

static void setup_layer(layer_w *L) {
    static const char *names[6] = {"wq", "wk", "wv", "wg", "wu", "wd"};
    int64_t shapes[6][2] = {{8, 8}, {4, 8}, {4, 8}, {12, 8}, {12, 8}, {8, 12}}, bs[1] = {8};
    for (int i = 0; i < 6; i++) {
        L->w[i] = test_filled(2, shapes[i], 0.2f * (float)i);
        hr_tensor_set_name(L->w[i], names[i]);
    }
    L->bq = test_filled(1, bs, 2.0f);
    hr_tensor_set_name(L->bq, "bq");
}

static void free_layer(layer_w *L) {
    for (int i = 0; i < 6; i++) hr_tensor_free(L->w[i]);
    hr_tensor_free(L->bq);
}

/* A decoder layer's linears on rows x [1, r, 8]: q (with bias), k, v;
 * silu(gate) * up; down + x. A fifth output reads the down projection
 * again after the add, so the add may not take it into an epilogue. */
static hr_status fn_layer(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    layer_w *L = ctx;
    hr_tensor *g = NULL, *u = NULL, *a = NULL, *d = NULL;
    hr_status s = hr_linear(in[0], L->w[0], L->bq, &out[0]);
    if (s == HR_OK) s = hr_linear(in[0], L->w[1], NULL, &out[1]);
    if (s == HR_OK) s = hr_linear(in[0], L->w[2], NULL, &out[2]);
    if (s == HR_OK) s = hr_linear(in[0], L->w[3], NULL, &g);
    if (s == HR_OK) s = hr_linear(in[0], L->w[4], NULL, &u);
    if (s == HR_OK) s = hr_silu_mul(g, u, &a);
    if (s == HR_OK) s = hr_linear(a, L->w[5], NULL, &d);
    if (s == HR_OK) s = hr_add(in[0], d, &out[3]);
    if (s == HR_OK && n_out > 4) s = hr_mul(d, d, &out[4]);
    hr_tensor_free(g);
    hr_tensor_free(u);
    hr_tensor_free(a);
    hr_tensor_free(d);
    return s;
}

static void assert_close_f32(const hr_tensor *a, const hr_tensor *b, float tol) {
    size_t n = hr_tensor_nbytes(a);
    assert_int_equal(n, hr_tensor_nbytes(b));
    float *x = malloc(n), *y = malloc(n);
    assert_int_equal(hr_tensor_read(a, x, n), HR_OK);
    assert_int_equal(hr_tensor_read(b, y, n), HR_OK);
    for (size_t i = 0; i < n / 4; i++) assert_true(fabsf(x[i] - y[i]) <= tol * (1.0f + fabsf(y[i])));
    free(x);
    free(y);
}

/* Replays p on `in` twice and compares with the eager outputs: the
 * linears bit for bit, what went through silu within float rounding. */
static void assert_replay_matches(hr_plan *p, const hr_tensor *const *in, hr_tensor **want, int n_out) {
    for (int rep = 0; rep < 2; rep++) {
        hr_tensor *got[5] = {0};
        assert_int_equal(hr_plan_run(p, in, got, NULL), HR_OK);
        for (int i = 0; i < n_out; i++) {
            if (i < 3)
                test_assert_same(got[i], want[i]);
            else
                assert_close_f32(got[i], want[i], 1e-6f);
            hr_tensor_free(got[i]);
        }
    }
}

/* Runs fn once under capture: outs get its eager results. */
static void capture_fn(hr_capture *cap, hr_jit_fn fn, void *ctx, const hr_tensor *const *in, int n_in,
                       hr_tensor **outs, int n_out) {
    assert_int_equal(hr_capture_begin(cap, in, n_in), HR_OK);
    assert_int_equal(fn(ctx, in, n_in, outs, n_out), HR_OK);
    assert_int_equal(hr_capture_end(cap, outs, n_out), HR_OK);
}

static hr_plan *capture_layer(layer_w *L, const hr_tensor *const *in, hr_tensor **outs, int n_out,
                              hr_capture *cap) {
    capture_fn(cap, fn_layer, L, in, 1, outs, n_out);
    hr_plan *p = NULL;
    assert_int_equal(hr_plan_build(cap, outs, 1, n_out, false, &p), HR_OK);
    return p;
}

static void test_fusion_of_linears_and_epilogues(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    setenv("HUBRT_FUSE", "1", 1);
    layer_w L;
    setup_layer(&L);
    hr_cpu_isa isa_before = hr_cpu_isa_get();
    static const int64_t row_counts[3] = {1, 3, 17};
    /* each row count under every kernel path the CPU has: scalar, AVX2, AVX-512 */
    for (int step = 0; step < 9; step++) {
        if (hr_cpu_isa_set((hr_cpu_isa)(HR_ISA_SCALAR + step / 3)) != HR_OK) continue;
        int64_t rows = row_counts[step % 3];
        int64_t xs[3] = {1, rows, 8};
        hr_tensor *x = test_filled(3, xs, 0.7f);
        const hr_tensor *in[1] = {x};
        for (int n_out = 4; n_out <= 5; n_out++) {
            hr_tensor *want[5] = {0};
            hr_capture cap;
            hr_plan *p = capture_layer(&L, in, want, n_out, &cap);
            assert_int_equal(p->n_nodes, 8 + (n_out == 5));
            if (rows > 16) {
                /* prefill-sized rows go to the GEMM: nothing fused */
                assert_int_equal(p->n_absorbed, 0);
            } else {
                /* q+k+v, gate+up+silu_mul, and down+add unless the down
                 * projection is read again */
                assert_int_equal(hr_plan_count_subst(p, "fused_linear"), n_out == 4 ? 3 : 2);
                assert_int_equal(p->n_absorbed, n_out == 4 ? 5 : 4);
            }
            assert_replay_matches(p, in, want, n_out);
            /* the disk keeps the captured list; loading fuses it again */
            unsigned char *data = NULL;
            size_t len = 0;
            assert_int_equal(hr_plan_serialize(p, 42, resolve_layer, &L, &data, &len), HR_OK);
            hr_plan *back = NULL;
            assert_int_equal(hr_plan_deserialize(data, len, 42, resolve_layer, &L, false, in, 1, n_out, &back),
                             HR_OK);
            assert_int_equal(back->n_nodes, p->n_nodes);
            assert_int_equal(back->n_absorbed, p->n_absorbed);
            assert_true(back->structure_hash == p->structure_hash);
            assert_replay_matches(back, in, want, n_out);
            free(data);
            hr_plan_free(back);
            /* with HUBRT_FUSE=0 every captured op runs */
            setenv("HUBRT_FUSE", "0", 1);
            hr_plan *plain = NULL;
            assert_int_equal(hr_plan_build(&cap, want, 1, n_out, false, &plain), HR_OK);
            setenv("HUBRT_FUSE", "1", 1);
            assert_int_equal(plain->n_absorbed, 0);
            assert_true(plain->structure_hash == p->structure_hash);
            assert_replay_matches(plain, in, want, n_out);
            hr_plan_free(plain);
            hr_plan_free(p);
            hr_capture_free(&cap);
            for (int i = 0; i < n_out; i++) hr_tensor_free(want[i]);
        }
        hr_tensor_free(x);
    }
    hr_cpu_isa_set(isa_before);
    unsetenv("HUBRT_FUSE");
    free_layer(&L);
}

/* The residual add writes into the tensor the linear reads (x += x W^T):
 * the fused node must read x whole before any sum lands on it. */
static hr_status fn_inplace(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    layer_w *L = ctx;
    hr_tensor *t = NULL, *y = NULL;
    hr_status s = hr_add(in[0], in[0], &t); /* a temporary, not an alias of the input */
    for (int i = 0; i < 3 && s == HR_OK; i++) {
        s = hr_linear(t, L->w[0], NULL, &y);
        if (s == HR_OK) s = hr_op_run(HR_OP_add, NULL, (const hr_tensor *[]){t, y}, 2, (hr_tensor *[]){t}, 1);
        hr_tensor_free(y);
        y = NULL;
    }
    if (s == HR_OK) s = hr_add(t, t, &out[0]); /* a value of its own to return */
    hr_tensor_free(t);
    return s;
}

static void test_fused_residual_in_place(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    setenv("HUBRT_FUSE", "1", 1);
    layer_w L;
    setup_layer(&L);
    int64_t xs[2] = {3, 8};
    hr_tensor *x = test_filled(2, xs, 0.1f), *want = NULL, *got = NULL;
    const hr_tensor *in[1] = {x};
    hr_capture cap;
    capture_fn(&cap, fn_inplace, &L, in, 1, &want, 1);
    hr_plan *p = NULL;
    assert_int_equal(hr_plan_build(&cap, &want, 1, 1, false, &p), HR_OK);
    unsetenv("HUBRT_FUSE");
    assert_int_equal(p->n_absorbed, 3);
    assert_int_equal(hr_plan_run(p, in, &got, NULL), HR_OK);
    test_assert_same(got, want);
    hr_tensor_free(got);
    hr_plan_free(p);
    hr_capture_free(&cap);
    hr_tensor_free(want);
    hr_tensor_free(x);
    free_layer(&L);
}

/* ---- elementwise chains ---------------------------------------------------- */

/* in: x [r, h] (maybe a transposed view), row [h], col [r, 1], a 0-dim
 * f32 scalar, all but the scalar in one dtype. n_ops ops of one of four
 * op lists (the last two with every transcendental, unary and binary);
 * with `reread`, the second intermediate is read again after the chain
 * (a second output), so the chain must store it. */
typedef struct {
    int n_ops, alt;
    bool reread;
} chain_case;

static hr_status gelu_mul(const hr_tensor *a, const hr_tensor *b, hr_gelu_approx approx, hr_tensor **u) {
    hr_attrs_gelu at = {approx};
    return hr_op_run(HR_OP_gelu_mul, &at, (const hr_tensor *[]){a, b}, 2, u, 1);
}

static hr_status chain_op(int alt, int k, const hr_tensor *cur, const hr_tensor *const *in, hr_tensor **u) {
    double lo = -0.3, hi = 0.9;
    hr_dtype other = hr_tensor_dtype(cur) == HR_F32 ? HR_BF16 : HR_F32;
    if (alt == 3) {
        switch (k) {
        case 0: return hr_gelu(cur, HR_GELU_ERF, u);
        case 1: return hr_mul(cur, cur, u);
        case 2: return hr_pow(cur, in[3], u);
        case 3: return hr_silu_mul(in[0], cur, u);
        case 4: return hr_exp(cur, u);
        case 5: return gelu_mul(cur, cur, HR_GELU_TANH, u);
        default: return hr_sigmoid(cur, u);
        }
    }
    if (alt == 2) {
        switch (k) {
        case 0: return hr_sigmoid(cur, u);
        case 1: return hr_silu_mul(cur, in[1], u);
        case 2: return hr_ln(cur, u);
        case 3: return hr_tanh(cur, u);
        case 4: return gelu_mul(in[2], cur, HR_GELU_ERF, u);
        case 5: return hr_silu(cur, u);
        default: return hr_gelu(cur, HR_GELU_TANH, u);
        }
    }
    if (alt) {
        switch (k) {
        case 0: return hr_div(cur, in[1], u);
        case 1: return hr_abs(cur, u);
        case 2: return hr_sqrt(cur, u);
        case 3: return hr_add(cur, in[3], u);
        case 4: return hr_rsqrt(cur, u);
        case 5: return hr_minimum(cur, in[0], u);
        default: return hr_neg(cur, u);
        }
    }
    switch (k) {
    case 0: return hr_mul(cur, in[1], u);
    case 1: return hr_sub(in[2], cur, u);
    case 2: return hr_scale(cur, 0.75, 0.5, u);
    case 3: return hr_maximum(cur, in[0], u);
    case 4: return hr_clamp(cur, &lo, &hi, u);
    case 5: return hr_mul(cur, cur, u);
    default: return hr_cast(cur, other, u);
    }
}

static hr_status fn_eltwise_chain(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    const chain_case *c = ctx;
    hr_tensor *t[8] = {0};
    const hr_tensor *cur = in[0];
    hr_status s = HR_OK;
    for (int k = 0; k < c->n_ops && s == HR_OK; k++) {
        s = chain_op(c->alt, k, cur, in, &t[k]);
        cur = t[k];
    }
    if (s == HR_OK && c->reread) s = hr_neg(t[1], &out[1]);
    if (s == HR_OK) out[0] = t[c->n_ops - 1];
    for (int k = 0; k < c->n_ops - (s == HR_OK); k++) hr_tensor_free(t[k]);
    return s;
}

static hr_tensor *filled_as(hr_dtype dt, int ndim, const int64_t *shape, float seed, float add) {
    hr_tensor *f = test_filled(ndim, shape, seed), *g = NULL, *t = NULL;
    assert_int_equal(hr_scale(f, 1.0, add, &g), HR_OK);
    assert_int_equal(hr_cast(g, dt, &t), HR_OK);
    hr_tensor_free(f);
    hr_tensor_free(g);
    return t;
}

/* Builds the case's plan with and without chain fusion; both replay the
 * eager bytes. Returns the fused plan. */
static hr_plan *check_chain(const chain_case *c, const hr_tensor *const *in, hr_capture *cap, hr_tensor **want) {
    int n_out = 1 + c->reread;
    capture_fn(cap, fn_eltwise_chain, (void *)c, in, 4, want, n_out);
    hr_plan *p = NULL, *plain = NULL;
    assert_int_equal(hr_plan_build(cap, want, 4, n_out, false, &p), HR_OK);
    setenv("HUBRT_FUSE_CHAINS", "0", 1);
    assert_int_equal(hr_plan_build(cap, want, 4, n_out, false, &plain), HR_OK);
    unsetenv("HUBRT_FUSE_CHAINS");
    assert_int_equal(hr_plan_count_subst(plain, "chain"), 0);
    hr_plan *plans[2] = {p, plain};
    for (int k = 0; k < 2; k++)
        for (int rep = 0; rep < 2; rep++) {
            hr_tensor *got[2] = {0};
            assert_int_equal(hr_plan_run(plans[k], in, got, NULL), HR_OK);
            for (int i = 0; i < n_out; i++) {
                test_assert_same(got[i], want[i]);
                hr_tensor_free(got[i]);
            }
        }
    hr_plan_free(plain);
    return p;
}

/* Sizes of one thread (the first three) and of three: 100003 columns
 * split over the threads at odd places, 40 rows of 2500 split by rows.
 * The unfused transcendentals ran each thread's range (or each chunk of
 * it) as whole vectors and a scalar tail; the chain must too. */
static void test_eltwise_chain_fusion(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    static const int64_t sizes[5][2] = {{1, 17}, {3, 4097}, {17, 33}, {1, 100003}, {40, 2500}};
    static const hr_dtype dts[3] = {HR_F32, HR_BF16, HR_F16};
    hr_cpu_isa isa_before = hr_cpu_isa_get();
    int threads_before = hr_num_threads();
    assert_int_equal(hr_set_num_threads(3), HR_OK);
    for (int isa = HR_ISA_SCALAR; isa <= HR_ISA_AVX2; isa++) {
        assert_int_equal(hr_cpu_isa_set((hr_cpu_isa)isa), HR_OK);
        for (int d = 0; d < 3; d++)
            for (int z = 0; z < 5; z++) {
                int64_t r = sizes[z][0], h = sizes[z][1], xs[2] = {r, h}, xts[2] = {h, r}, rs[1] = {h}, cs[2] = {r, 1};
                /* odd sizes get x as a transposed view: strided rows */
                hr_tensor *xt = z == 1 ? NULL : filled_as(dts[d], 2, xts, 0.3f, 0.0f), *xv = NULL;
                if (xt) assert_int_equal(hr_tensor_transpose(xt, 0, 1, &xv), HR_OK);
                hr_tensor *x = xv ? xv : filled_as(dts[d], 2, xs, 0.3f, 0.0f);
                hr_tensor *row = filled_as(dts[d], 1, rs, 1.1f, 1.5f), *col = filled_as(dts[d], 2, cs, 2.0f, 0.0f);
                hr_tensor *sc = NULL;
                assert_int_equal(hr_tensor_from_host(NULL, HR_F32, 0, NULL, &(float){0.25f}, 4, &sc), HR_OK);
                const hr_tensor *in[4] = {x, row, col, sc};
                for (int alt = 0; alt < 4; alt++)
                    for (int n_ops = 2; n_ops <= 7; n_ops++) {
                        chain_case c = {n_ops, alt, false};
                        hr_capture cap;
                        hr_tensor *want[2] = {0};
                        hr_plan *p = check_chain(&c, in, &cap, want);
                        assert_int_equal(hr_plan_count_subst(p, "chain"), 1);
                        assert_int_equal(p->n_absorbed, n_ops - 1);
                        hr_plan_free(p);
                        hr_capture_free(&cap);
                        hr_tensor_free(want[0]);
                    }
                /* the second intermediate is read after the chain: it is
                 * stored, so one chain ends there and another starts */
                chain_case c = {5, 0, true};
                hr_capture cap;
                hr_tensor *want[2] = {0};
                hr_plan *p = check_chain(&c, in, &cap, want);
                assert_int_equal(hr_plan_count_subst(p, "chain"), 2);
                assert_int_equal(p->n_absorbed, 1 + 2);
                assert_false(p->nodes[1].subst);
                assert_true(p->nodes[1].absorbed);
                assert_true(p->nodes[2].subst && !p->nodes[2].absorbed);
                assert_true(p->subst[0].out[0] == &p->tensors[p->nodes[1].first_tensor + p->nodes[1].n_in]);
                hr_plan_free(p);
                hr_capture_free(&cap);
                hr_tensor_free(want[0]);
                hr_tensor_free(want[1]);
                hr_tensor *frees[6] = {x, xt, row, col, sc};
                for (int i = 0; i < 5; i++) hr_tensor_free(frees[i]);
            }
    }
    hr_cpu_isa_set(isa_before);
    assert_int_equal(hr_set_num_threads(threads_before), HR_OK);
}

/* softmax(x), then mul by a row, scale and exp (a chain), then softmax
 * again: the chain writes over the first softmax's dead result; unfused,
 * each of mul, scale and exp does. */
static hr_status fn_chain_over_temp(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    hr_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    hr_status s = hr_softmax(in[0], -1, &a);
    if (s == HR_OK) s = hr_mul(a, in[1], &b);
    if (s == HR_OK) s = hr_scale(b, 0.5, 0.25, &c);
    if (s == HR_OK) s = hr_exp(c, &d);
    if (s == HR_OK) s = hr_softmax(d, -1, &out[0]);
    hr_tensor *tmp[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) hr_tensor_free(tmp[i]);
    return s;
}

static void test_chain_in_place(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    int64_t xs[2] = {3, 4097}, rs[1] = {4097};
    hr_tensor *x = test_filled(2, xs, 0.1f), *row = test_filled(1, rs, 0.6f), *want = NULL, *got = NULL;
    const hr_tensor *in[2] = {x, row};
    hr_capture cap;
    capture_fn(&cap, fn_chain_over_temp, NULL, in, 2, &want, 1);
    size_t slot = (3 * 4097 * 4 + 63) / 64 * 64;
    for (int fuse = 0; fuse < 2; fuse++) {
        if (!fuse) setenv("HUBRT_FUSE_CHAINS", "0", 1);
        hr_plan *p = NULL;
        assert_int_equal(hr_plan_build(&cap, &want, 2, 1, false, &p), HR_OK);
        unsetenv("HUBRT_FUSE_CHAINS");
        assert_int_equal(hr_plan_count_subst(p, "chain"), fuse);
        assert_int_equal(p->n_inplace, fuse ? 1 : 3);
        assert_int_equal(p->arena_size, slot);
        assert_int_equal(hr_plan_run(p, in, &got, NULL), HR_OK);
        test_assert_same(got, want);
        hr_tensor_free(got);
        hr_plan_free(p);
    }
    hr_capture_free(&cap);
    hr_tensor_free(want);
    hr_tensor_free(row);
    hr_tensor_free(x);
}

/* ---- threading plan ----------------------------------------------------------- */

/* A large add and a norm of one row, as in a decode step. */
static hr_status fn_threads(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    hr_status s = hr_add(in[0], in[0], &out[0]);
    return s == HR_OK ? hr_rms_norm(in[1], ctx, 1e-6, 0, &out[1]) : s;
}

static void test_threading_plan(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    int before = hr_num_threads();
    assert_int_equal(hr_set_num_threads(4), HR_OK);
    int64_t xs[2] = {64, 4096}, rs[3] = {1, 1, 576}, ws[1] = {576};
    hr_tensor *x = test_filled(2, xs, 0.4f), *r = test_filled(3, rs, 0.9f), *w = test_filled(1, ws, 1.7f), *want[2] = {0};
    const hr_tensor *in[2] = {x, r};
    hr_capture cap;
    capture_fn(&cap, fn_threads, w, in, 2, want, 2);
    hr_plan *p = NULL, *plain = NULL;
    assert_int_equal(hr_plan_build(&cap, want, 2, 2, false, &p), HR_OK);
    setenv("HUBRT_PLAN_THREADS", "0", 1);
    assert_int_equal(hr_plan_build(&cap, want, 2, 2, false, &plain), HR_OK);
    unsetenv("HUBRT_PLAN_THREADS");
    /* 256 Ki elements of add: every thread; one row of 576: one thread */
    assert_int_equal(p->nodes[0].threads, 4);
    assert_int_equal(p->nodes[1].threads, 1);
    assert_int_equal(p->pool_threads, 4);
    assert_int_equal(plain->nodes[0].threads, 0);
    assert_int_equal(plain->nodes[1].threads, 0);
    hr_plan *plans[2] = {p, plain};
    for (int k = 0; k < 2; k++)
        for (int rep = 0; rep < 2; rep++) {
            hr_tensor *got[2] = {0};
            assert_int_equal(hr_plan_run(plans[k], in, got, NULL), HR_OK);
            for (int i = 0; i < 2; i++) {
                test_assert_same(got[i], want[i]);
                hr_tensor_free(got[i]);
            }
        }
    /* the plan's count does not outlive its call */
    assert_int_equal(hr_parallel_threads_for(1 << 30, 1), 4);
    hr_plan_free(p);
    hr_plan_free(plain);
    hr_capture_free(&cap);
    for (int i = 0; i < 2; i++) hr_tensor_free(want[i]);
    hr_tensor_free(x);
    hr_tensor_free(r);
    hr_tensor_free(w);
    assert_int_equal(hr_set_num_threads(before), HR_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fusion_of_linears_and_epilogues),
        cmocka_unit_test(test_fused_residual_in_place),
        cmocka_unit_test(test_eltwise_chain_fusion),
        cmocka_unit_test(test_chain_in_place),
        cmocka_unit_test(test_threading_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
