/* Compile path: capture, arena planning, replay, stats, disk cache
 * (including corrupt entries), loud failures, in-place arena. The fusion
 * passes and the threading plan: test_graph_passes.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/threadpool.h"
#include "graph/disk_cache.h"
#include "graph/plan.h"
#include "hubrt.h"
#include "hubrt/graph.h"
#include "test_util.h"

typedef struct {
    hr_tensor *w;     /* [16, 8] constant weight */
    hr_tensor *cache; /* [8, 16] state updated in place */
    int calls;
} model;


/* out = silu_mul(x W^T, x W^T) @ (x W^T)^T; also cache[pos] = x W^T */
static hr_status fn_mlp(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    model *m = ctx;
    m->calls++;
    hr_tensor *y = NULL, *g = NULL, *yt = NULL;
    hr_status s = hr_linear(in[0], m->w, NULL, &y);
    if (s == HR_OK) s = hr_silu_mul(y, y, &g);
    if (s == HR_OK) s = hr_tensor_transpose(y, 0, 1, &yt);
    if (s == HR_OK) s = hr_matmul(g, yt, &out[0]);
    if (s == HR_OK && n_in > 1) s = hr_index_copy_(m->cache, 0, in[1], y);
    hr_tensor_free(y);
    hr_tensor_free(g);
    hr_tensor_free(yt);
    return s;
}

static const hr_tensor *resolve(void *ctx, const char *name) {
    model *m = ctx;
    if (!strcmp(name, "w")) return m->w;
    if (!strcmp(name, "cache")) return m->cache;
    return NULL;
}

static void setup_model(model *m) {
    memset(m, 0, sizeof *m);
    int64_t ws[2] = {16, 8}, cs[2] = {8, 16};
    m->w = test_filled(2, ws, 0.5f);
    hr_tensor_set_name(m->w, "w");
    assert_int_equal(hr_tensor_zeros(NULL, HR_F32, 2, cs, &m->cache), HR_OK);
    hr_tensor_set_name(m->cache, "cache");
}

static void free_model(model *m) {
    hr_tensor_free(m->w);
    hr_tensor_free(m->cache);
}


static hr_tensor *positions(int64_t a, int64_t b) {
    int64_t p[2] = {a, b}, shape[1] = {2};
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_I64, 1, shape, p, sizeof p, &t), HR_OK);
    return t;
}

static void test_replay_matches_eager(void **state) {
    model m;
    setup_model(&m);
    hr_compile_stats_reset();
    setenv("HUBRT_CACHE", "0", 1);
    hr_jit *jit = NULL;
    hr_jit_options o = {.name = "mlp", .fn = fn_mlp, .ctx = &m};
    assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
    int64_t xs[2] = {2, 8};
    for (int step = 0; step < 4; step++) {
        hr_tensor *x = test_filled(2, xs, (float)step), *pos = positions(step, step + 3);
        const hr_tensor *in[2] = {x, pos};
        hr_tensor *got = NULL, *want = NULL;
        hr_status s0 = hr_jit_call(jit, in, 2, &got, 1);
        if (s0) print_error("step %d: %s\n", step, hr_last_error());
        assert_int_equal(s0, HR_OK);
        int64_t cs[2] = {8, 16};
        hr_tensor *cache_after = NULL;
        assert_int_equal(hr_tensor_zeros(NULL, HR_F32, 2, cs, &cache_after), HR_OK);
        assert_int_equal(hr_copy_(cache_after, m.cache), HR_OK);
        /* the eager reference, run again on the same inputs */
        assert_int_equal(fn_mlp(&m, in, 2, &want, 1), HR_OK);
        test_assert_same(got, want);
        test_assert_same(cache_after, m.cache); /* the replay updated the cache in place */
        hr_tensor_free(got);
        hr_tensor_free(want);
        hr_tensor_free(cache_after);
        hr_tensor_free(x);
        hr_tensor_free(pos);
    }
    /* the function ran eagerly once for the capture and once per reference */
    assert_int_equal(m.calls, 1 + 4);
    assert_int_equal(hr_jit_num_plans(jit), 1);
    hr_compile_stats st;
    hr_compile_stats_get(&st);
    assert_int_equal(st.compiles, 1);
    assert_int_equal(st.hits, 3);
    assert_int_equal(st.requests, 4);
    /* a new shape compiles a second plan */
    int64_t xs2[2] = {3, 8};
    hr_tensor *x = test_filled(2, xs2, 9.0f), *out = NULL;
    const hr_tensor *in1[1] = {x};
    hr_status s1 = hr_jit_call(jit, in1, 1, &out, 1);
    if (s1) print_error("%s\n", hr_last_error());
    assert_int_equal(s1, HR_OK);
    assert_int_equal(hr_tensor_shape(out)[0], 3);
    assert_int_equal(hr_jit_num_plans(jit), 2);
    hr_tensor_free(out);
    hr_tensor_free(x);
    hr_jit_free(jit);
    free_model(&m);
}

static hr_status fn_reads_host(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    float v[16];
    hr_status s = hr_tensor_read(in[0], v, sizeof v);
    return s != HR_OK ? s : hr_scale(in[0], v[0], 0, &out[0]);
}

static hr_status fn_returns_input(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    return hr_tensor_alias(in[0], &out[0]);
}

static void test_capture_fails_loudly(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    int64_t xs[2] = {2, 8};
    hr_tensor *x = test_filled(2, xs, 1.0f), *out = NULL;
    const hr_tensor *in[1] = {x};
    hr_jit *jit = NULL;
    hr_jit_options o = {.name = "reads_host", .fn = fn_reads_host};
    assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
    assert_int_equal(hr_jit_call(jit, in, 1, &out, 1), HR_ERR_UNSUPPORTED);
    assert_non_null(strstr(hr_last_error(), "reads tensor values on the host"));
    assert_null(out);
    hr_jit_free(jit);
    hr_jit_options o2 = {.name = "returns_input", .fn = fn_returns_input};
    assert_int_equal(hr_jit_create(&o2, &jit), HR_OK);
    assert_int_equal(hr_jit_call(jit, in, 1, &out, 1), HR_ERR_UNSUPPORTED);
    assert_non_null(strstr(hr_last_error(), "return a copy"));
    hr_jit_free(jit);
    hr_tensor_free(x);
}

/* The path of the (single) plan file in dir. */
static void plan_path(const char *dir, char *path, size_t n) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/*.hrplan", dir);
    FILE *ls = popen(cmd, "r");
    assert_non_null(ls);
    assert_non_null(fgets(path, (int)n, ls));
    pclose(ls);
    path[strcspn(path, "\n")] = '\0';
}

static void test_disk_cache_round_trip_and_corruption(void **state) {
    char dir[] = "/tmp/hubrt-graph-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    setenv("HUBRT_CACHE_DIR", dir, 1);
    setenv("HUBRT_CACHE", "1", 1);
    model m;
    setup_model(&m);
    int64_t xs[2] = {2, 8};
    hr_tensor *x = test_filled(2, xs, 2.0f), *pos = positions(1, 4);
    const hr_tensor *in[2] = {x, pos};
    hr_tensor *first = NULL, *again = NULL;
    hr_jit_options o = {.name = "mlp-disk", .fn = fn_mlp, .ctx = &m, .resolve = resolve, .resolve_ctx = &m,
                        .fingerprint = 42};
    hr_jit *jit = NULL;
    hr_compile_stats_reset();
    assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
    assert_int_equal(hr_jit_call(jit, in, 2, &first, 1), HR_OK);
    hr_jit_free(jit);
    /* A new jit (as in a new process) finds the plan on disk. */
    assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
    int calls = m.calls;
    assert_int_equal(hr_jit_call(jit, in, 2, &again, 1), HR_OK);
    assert_int_equal(m.calls, calls); /* replayed, not captured */
    test_assert_same(first, again);
    hr_compile_stats st;
    hr_compile_stats_get(&st);
    assert_int_equal(st.compiles, 1);
    assert_int_equal(st.disk_hits, 1);
    hr_jit_free(jit);
    hr_tensor_free(again);

    /* Corrupt the entry three ways; each is rejected and rebuilt. */
    char cmd[600], path[600];
    plan_path(dir, path, sizeof path);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *orig = malloc((size_t)len);
    assert_int_equal(fread(orig, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    for (int kind = 0; kind < 3; kind++) {
        unsigned char *bad = malloc((size_t)len);
        memcpy(bad, orig, (size_t)len);
        long blen = len;
        if (kind == 0) blen = len / 2;                 /* truncated */
        if (kind == 1) bad[len - 20] ^= 0x10;          /* bit flip */
        if (kind == 2) bad[8] = 99;                    /* another format version */
        f = fopen(path, "wb");
        fwrite(bad, 1, (size_t)blen, f);
        fclose(f);
        free(bad);
        hr_compile_stats_reset();
        assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
        assert_int_equal(hr_jit_call(jit, in, 2, &again, 1), HR_OK);
        test_assert_same(first, again);
        hr_compile_stats_get(&st);
        assert_int_equal(st.disk_rejects, 1);
        assert_int_equal(st.compiles, 1);
        hr_jit_free(jit);
        hr_tensor_free(again);
    }
    /* A constant that changed shape invalidates the entry too. */
    int64_t ws[2] = {16, 8};
    hr_tensor_free(m.w);
    m.w = test_filled(2, ws, 3.0f);
    hr_tensor_set_name(m.w, "w");
    unsigned char *data = NULL;
    size_t dlen = 0;
    hr_plan *plan = NULL;
    f = fopen(path, "rb");
    data = malloc((size_t)len);
    dlen = fread(data, 1, (size_t)len, f);
    fclose(f);
    uint64_t key;
    memcpy(&key, data + 16, 8);
    model other = m;
    int64_t ws2[2] = {4, 8};
    other.w = test_filled(2, ws2, 1.0f);
    assert_int_equal(hr_plan_deserialize(data, dlen, key, resolve, &other, false, in, 2, 1, &plan), HR_ERR_FORMAT);
    assert_non_null(strstr(hr_last_error(), "constant"));
    assert_int_equal(hr_plan_deserialize(data, dlen, key + 1, resolve, &m, false, in, 2, 1, &plan), HR_ERR_FORMAT);
    hr_tensor_free(other.w);
    free(data);
    free(orig);
    hr_tensor_free(first);
    hr_tensor_free(x);
    hr_tensor_free(pos);
    free_model(&m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static hr_status fn_chain(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    hr_tensor *a = NULL, *b = NULL, *c = NULL;
    hr_status s = hr_matmul(in[0], in[0], &a);
    if (s == HR_OK) s = hr_matmul(a, in[0], &b);
    if (s == HR_OK) s = hr_matmul(b, in[0], &c);
    if (s == HR_OK) s = hr_matmul(c, in[0], &out[0]);
    hr_tensor_free(a);
    hr_tensor_free(b);
    hr_tensor_free(c);
    return s;
}

static void test_arena_reuses_dead_values(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    int64_t xs[2] = {32, 32};
    hr_tensor *x = test_filled(2, xs, 0.1f), *out = NULL;
    const hr_tensor *in[1] = {x};
    hr_capture cap;
    assert_int_equal(hr_capture_begin(&cap, in, 1), HR_OK);
    assert_int_equal(fn_chain(NULL, in, 1, &out, 1), HR_OK);
    assert_int_equal(hr_capture_end(&cap, &out, 1), HR_OK);
    hr_plan *plan = NULL;
    assert_int_equal(hr_plan_build(&cap, &out, 1, 1, false, &plan), HR_OK);
    /* three 4 KiB temporaries, at most two alive at once */
    assert_int_equal(plan->n_nodes, 4);
    assert_int_equal(plan->arena_size, 2 * 32 * 32 * 4);
    hr_plan_free(plan);
    hr_capture_free(&cap);
    hr_tensor_free(out);
    hr_tensor_free(x);
}

/* x [17, 17] through exp, a broadcast mul and rms_norm (each may
 * overwrite its dead input), then a matmul, which may not though the
 * layouts match: with `tail` its result is a temporary, else returned. */
typedef struct {
    const hr_tensor *w; /* [17] */
    bool tail;
} inplace_ctx;

static hr_status fn_inplace_chain(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    const inplace_ctx *c = ctx;
    hr_tensor *a = NULL, *b = NULL, *cc = NULL, *d = NULL, *g = NULL;
    hr_status s = hr_add(in[0], in[0], &a);
    if (s == HR_OK) s = hr_exp(a, &b);
    if (s == HR_OK) s = hr_mul(b, c->w, &cc);
    if (s == HR_OK) s = hr_rms_norm(cc, c->w, 1e-6, 0, &d);
    if (s == HR_OK) s = hr_matmul(d, d, c->tail ? &g : &out[0]);
    if (s == HR_OK && c->tail) s = hr_add(g, g, &out[0]);
    hr_tensor *tmp[5] = {a, b, cc, d, g};
    for (int i = 0; i < 5; i++) hr_tensor_free(tmp[i]);
    return s;
}

static int out_value(const hr_plan *p, int node) {
    const hr_plan_node *n = &p->nodes[node];
    return hr_plan_value_index(p, &p->tensors[n->first_tensor + n->n_in]);
}

static void test_arena_in_place(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    /* in place node by node: as a chain, add, exp and mul would be one node */
    setenv("HUBRT_FUSE_CHAINS", "0", 1);
    int64_t xs[2] = {17, 17}, ws[1] = {17};
    hr_tensor *x = test_filled(2, xs, 0.2f), *w = test_filled(1, ws, 1.3f);
    const hr_tensor *in[1] = {x};
    size_t slot = (17 * 17 * 4 + 63) / 64 * 64;
    for (int tail = 0; tail < 2; tail++) {
        inplace_ctx c = {w, tail};
        hr_tensor *want = NULL, *got = NULL;
        hr_capture cap;
        assert_int_equal(hr_capture_begin(&cap, in, 1), HR_OK);
        assert_int_equal(fn_inplace_chain(&c, in, 1, &want, 1), HR_OK);
        assert_int_equal(hr_capture_end(&cap, &want, 1), HR_OK);
        hr_plan *p = NULL, *plain = NULL;
        assert_int_equal(hr_plan_build(&cap, &want, 1, 1, false, &p), HR_OK);
        setenv("HUBRT_INPLACE", "0", 1);
        assert_int_equal(hr_plan_build(&cap, &want, 1, 1, false, &plain), HR_OK);
        unsetenv("HUBRT_INPLACE");
        /* exp, mul and rms_norm reuse the add's slot */
        assert_int_equal(p->n_inplace, 3);
        assert_int_equal(plain->n_inplace, 0);
        size_t head = p->values[out_value(p, 0)].arena_offset;
        for (int i = 1; i < 4; i++) assert_int_equal(p->values[out_value(p, i)].arena_offset, head);
        if (tail) {
            /* the matmul's temporary never lands on its input */
            assert_true(p->values[out_value(p, 4)].arena_offset != p->values[out_value(p, 3)].arena_offset);
            assert_int_equal(p->arena_size, 2 * slot);
        } else {
            assert_int_equal(p->arena_size, slot);
            assert_int_equal(plain->arena_size, 2 * slot);
        }
        for (int rep = 0; rep < 2; rep++) {
            assert_int_equal(hr_plan_run(p, in, &got, NULL), HR_OK);
            test_assert_same(got, want);
            hr_tensor_free(got);
        }
        hr_plan_free(p);
        hr_plan_free(plain);
        hr_capture_free(&cap);
        hr_tensor_free(want);
    }
    hr_tensor_free(w);
    hr_tensor_free(x);
    unsetenv("HUBRT_FUSE_CHAINS");
}

/* x @ contiguous(W^T) with a dead branch: DCE drops the branch, folding
 * runs the weight transpose once at compile time. */
static hr_status fn_passes(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    model *m = ctx;
    hr_tensor *wt = NULL, *wtc = NULL, *unused = NULL;
    hr_status s = hr_tensor_transpose(m->w, 0, 1, &wt);   /* [8, 16] view */
    if (s == HR_OK) s = hr_contiguous(wt, &wtc);          /* weight-only */
    if (s == HR_OK) s = hr_exp(in[0], &unused);           /* dead */
    if (s == HR_OK) s = hr_matmul(in[0], wtc, &out[0]);
    hr_tensor_free(wt);
    hr_tensor_free(wtc);
    hr_tensor_free(unused);
    return s;
}

static void test_dce_and_constant_folding(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    model m;
    setup_model(&m);
    int64_t xs[2] = {3, 8};
    hr_tensor *x = test_filled(2, xs, 0.3f), *out = NULL;
    const hr_tensor *in[1] = {x};
    hr_capture cap;
    assert_int_equal(hr_capture_begin(&cap, in, 1), HR_OK);
    assert_int_equal(fn_passes(&m, in, 1, &out, 1), HR_OK);
    assert_int_equal(hr_capture_end(&cap, &out, 1), HR_OK);
    hr_plan *plan = NULL;
    assert_int_equal(hr_plan_build(&cap, &out, 1, 1, true, &plan), HR_OK);
    assert_int_equal(plan->n_nodes, 3);
    assert_int_equal(plan->n_dead, 1);
    assert_int_equal(plan->n_folded, 1);
    /* only the matmul runs; its result matches the eager one */
    hr_tensor *again = NULL;
    for (int rep = 0; rep < 2; rep++) {
        assert_int_equal(hr_plan_run(plan, in, &again, NULL), HR_OK);
        test_assert_same(out, again);
        hr_tensor_free(again);
    }
    hr_plan_free(plan);
    hr_capture_free(&cap);
    hr_tensor_free(out);
    hr_tensor_free(x);
    free_model(&m);
}

/* Two processes share one cache folder: one keeps rewriting an entry while
 * the other keeps loading it; the reader never sees a partial file. */
static void test_two_processes_share_the_cache(void **state) {
    char dir[] = "/tmp/hubrt-graph-mp-XXXXXX";
    assert_non_null(mkdtemp(dir));
    setenv("HUBRT_CACHE_DIR", dir, 1);
    setenv("HUBRT_CACHE", "1", 1);
    model m;
    setup_model(&m);
    int64_t xs[2] = {2, 8};
    hr_tensor *x = test_filled(2, xs, 4.0f), *pos = positions(0, 1), *ref = NULL;
    const hr_tensor *in[2] = {x, pos};
    hr_jit_options o = {.name = "mlp-mp", .fn = fn_mlp, .ctx = &m, .resolve = resolve, .resolve_ctx = &m,
                        .fingerprint = 7};
    hr_jit *jit = NULL;
    assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
    assert_int_equal(hr_jit_call(jit, in, 2, &ref, 1), HR_OK); /* writes the entry */
    hr_jit_free(jit);
    /* the key of the entry, from its file name */
    char path[600];
    plan_path(dir, path, sizeof path);
    uint64_t key = strtoull(strrchr(path, '-') + 1, NULL, 16);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* writer: capture afresh and rewrite the same entry again and again */
        for (int i = 0; i < 60; i++) {
            hr_tensor *o2 = NULL;
            hr_capture cap;
            if (hr_capture_begin(&cap, in, 2) != HR_OK) _exit(3);
            if (fn_mlp(&m, in, 2, &o2, 1) != HR_OK) _exit(4);
            if (hr_capture_end(&cap, &o2, 1) != HR_OK) _exit(5);
            hr_plan *plan = NULL;
            if (hr_plan_build(&cap, &o2, 2, 1, false, &plan) != HR_OK) _exit(6);
            hr_disk_cache_store(key, "mlp-mp", plan, resolve, &m);
            hr_plan_free(plan);
            hr_capture_free(&cap);
            hr_tensor_free(o2);
        }
        _exit(0);
    }
    /* reader: load the entry again and again while the child rewrites it */
    hr_compile_stats_reset();
    for (int i = 0; i < 60; i++) {
        hr_tensor *got = NULL;
        assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
        assert_int_equal(hr_jit_call(jit, in, 2, &got, 1), HR_OK);
        test_assert_same(ref, got);
        hr_tensor_free(got);
        hr_jit_free(jit);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    hr_compile_stats st;
    hr_compile_stats_get(&st);
    assert_int_equal(st.disk_rejects, 0);
    assert_int_equal(st.disk_hits, 60);
    hr_tensor_free(ref);
    hr_tensor_free(x);
    hr_tensor_free(pos);
    free_model(&m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A 4 MiB f32 output (its own mapping on the cpu device) and a 2 MiB bf16
 * one (the heap). */
static hr_status fn_two_outputs(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    hr_status s = hr_scale(in[0], 2.0, 0.5, &out[0]);
    return s != HR_OK ? s : hr_cast(in[0], HR_BF16, &out[1]);
}

static void check_two_outputs(const hr_tensor *x, hr_tensor *const *got) {
    hr_tensor *want[2] = {0};
    const hr_tensor *in[1] = {x};
    assert_int_equal(fn_two_outputs(NULL, in, 1, want, 2), HR_OK);
    test_assert_same(got[0], want[0]);
    test_assert_same(got[1], want[1]);
    hr_tensor_free(want[0]);
    hr_tensor_free(want[1]);
}

/* A replay writes into the previous replay's output buffers once the
 * caller has freed them (a decode step's logits are not mapped, faulted
 * in and zeroed anew each step), and never into ones still in use. */
static void test_replay_reuses_freed_outputs(void **state) {
    setenv("HUBRT_CACHE", "0", 1);
    hr_jit *jit = NULL;
    hr_jit_options o = {.name = "two_outputs", .fn = fn_two_outputs};
    assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
    int64_t xs[2] = {1024, 1024};
    hr_tensor *x[3] = {test_filled(2, xs, 0.0f), test_filled(2, xs, 1.0f), test_filled(2, xs, 2.0f)};
    hr_tensor *got[2] = {0}, *held[2] = {0};
    /* the capture, then a first replay: its outputs are new buffers */
    for (int call = 0; call < 2; call++) {
        assert_int_equal(hr_jit_call(jit, (const hr_tensor *const[]){x[call]}, 1, got, 2), HR_OK);
        check_two_outputs(x[call], got);
        hr_tensor_free(got[0]);
        hr_tensor_free(got[1]);
    }
    long long allocs = hr_plan_output_allocs();
    for (int call = 0; call < 4; call++) {
        assert_int_equal(hr_jit_call(jit, (const hr_tensor *const[]){x[call % 3]}, 1, got, 2), HR_OK);
        check_two_outputs(x[call % 3], got);
        hr_tensor_free(got[0]);
        hr_tensor_free(got[1]);
    }
    assert_int_equal(hr_plan_output_allocs(), allocs);
    /* outputs the caller holds (one through a view) keep their values */
    assert_int_equal(hr_jit_call(jit, (const hr_tensor *const[]){x[0]}, 1, held, 2), HR_OK);
    hr_tensor *view = NULL;
    assert_int_equal(hr_tensor_narrow(held[1], 0, 1, 3, &view), HR_OK);
    hr_tensor_free(held[1]);
    assert_int_equal(hr_jit_call(jit, (const hr_tensor *const[]){x[1]}, 1, got, 2), HR_OK);
    assert_int_equal(hr_plan_output_allocs(), allocs + 2);
    assert_ptr_not_equal(hr_tensor_data(got[0]), hr_tensor_data(held[0]));
    check_two_outputs(x[1], got);
    hr_tensor *want_view = NULL, *x0_bf16 = NULL;
    assert_int_equal(hr_cast(x[0], HR_BF16, &x0_bf16), HR_OK);
    assert_int_equal(hr_tensor_narrow(x0_bf16, 0, 1, 3, &want_view), HR_OK);
    test_assert_same(view, want_view);
    hr_tensor *want_held[2] = {0};
    assert_int_equal(fn_two_outputs(NULL, (const hr_tensor *const[]){x[0]}, 1, want_held, 2), HR_OK);
    test_assert_same(held[0], want_held[0]);
    hr_tensor_free(got[0]);
    hr_tensor_free(got[1]);
    /* the last run's buffers are free again; the held ones stay the caller's */
    assert_int_equal(hr_jit_call(jit, (const hr_tensor *const[]){x[2]}, 1, got, 2), HR_OK);
    assert_int_equal(hr_plan_output_allocs(), allocs + 2);
    check_two_outputs(x[2], got);
    test_assert_same(held[0], want_held[0]);
    test_assert_same(view, want_view);
    for (int i = 0; i < 2; i++) {
        hr_tensor_free(got[i]);
        hr_tensor_free(want_held[i]);
    }
    hr_tensor_free(held[0]);
    hr_tensor_free(view);
    hr_tensor_free(want_view);
    hr_tensor_free(x0_bf16);
    for (int i = 0; i < 3; i++) hr_tensor_free(x[i]);
    hr_jit_free(jit);
}


int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_matches_eager),
        cmocka_unit_test(test_capture_fails_loudly),
        cmocka_unit_test(test_disk_cache_round_trip_and_corruption),
        cmocka_unit_test(test_arena_reuses_dead_values),
        cmocka_unit_test(test_arena_in_place),
        cmocka_unit_test(test_dce_and_constant_folding),
        cmocka_unit_test(test_two_processes_share_the_cache),
        cmocka_unit_test(test_replay_reuses_freed_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
