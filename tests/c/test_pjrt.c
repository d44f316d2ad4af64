/* PJRT backend: plugin version check (faked version field), a 2-device
 * all-reduce, compile errors that point at the dumped module, the
 * StableHLO text of a view load, and the build without PJRT headers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/pjrt/pjrt.h"
#include "backends/pjrt/shlo.h"
#include "hubrt.h"
#include "hubrt/graph.h"

#ifdef HUBRT_HAVE_PJRT
#include <unistd.h>

#include "backends/pjrt/pjrt_internal.h"

/* The xla_cpu plugin, or a skip that says why. */
static hr_pjrt_plugin *plugin_or_skip(void) {
    hr_pjrt_plugin *p;
    if (hr_pjrt_plugin_get("xla_cpu", &p) != HR_OK) {
        print_message("skipped: xla_cpu PJRT plugin unavailable: %s\n", hr_last_error());
        skip();
    }
    return p;
}

static void test_version_check(void **state) {
    hr_pjrt_plugin *p = plugin_or_skip();
    assert_int_equal(hr_pjrt_api_check(p->api, p->info.path), HR_OK);
    /* A copy of the plugin's PJRT_Api with another major version. */
    PJRT_Api fake;
    memcpy(&fake, p->api, sizeof fake);
    fake.pjrt_api_version.major_version = PJRT_API_MAJOR + 1;
    assert_int_equal(hr_pjrt_api_check(&fake, "/fake/plugin.so"), HR_ERR_DEVICE);
    const char *msg = hr_last_error();
    assert_non_null(strstr(msg, "/fake/plugin.so"));
    assert_non_null(strstr(msg, "major versions must match"));
    char want[32];
    snprintf(want, sizeof want, "API %d.", PJRT_API_MAJOR + 1);
    assert_non_null(strstr(msg, want));
    /* A newer minor version is accepted. */
    fake.pjrt_api_version.major_version = PJRT_API_MAJOR;
    fake.pjrt_api_version.minor_version = PJRT_API_MINOR + 5;
    assert_int_equal(hr_pjrt_api_check(&fake, "/fake/plugin.so"), HR_OK);
}

static void test_all_reduce_two_devices(void **state) {
    hr_pjrt_plugin *p = plugin_or_skip();
    if (p->num_devices < 2) {
        print_message("skipped: the xla_cpu client has %d device(s)\n", p->num_devices);
        skip();
    }
    hr_device *d0, *d1;
    assert_int_equal(hr_device_get("xla_cpu:0", &d0), HR_OK);
    assert_int_equal(hr_device_get("xla_cpu:1", &d1), HR_OK);
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, -50};
    int64_t shape[1] = {5};
    hr_tensor *t[2];
    assert_int_equal(hr_tensor_from_host(d0, HR_F32, 1, shape, a, sizeof a, &t[0]), HR_OK);
    assert_int_equal(hr_tensor_from_host(d1, HR_F32, 1, shape, b, sizeof b, &t[1]), HR_OK);
    assert_int_equal(hr_pjrt_all_reduce_sum(t, 2), HR_OK);
    for (int k = 0; k < 2; k++) {
        float got[5];
        assert_int_equal(hr_tensor_read(t[k], got, sizeof got), HR_OK);
        for (int i = 0; i < 5; i++) assert_true(got[i] == a[i] + b[i]);
        assert_ptr_equal(hr_tensor_device(t[k]), k ? d1 : d0);
    }
    /* Two tensors on one device are refused, not summed. */
    hr_tensor *same[2] = {t[0], t[0]};
    assert_int_equal(hr_pjrt_all_reduce_sum(same, 2), HR_ERR_INVALID_ARG);
    assert_non_null(strstr(hr_last_error(), "both on xla_cpu:0"));
    hr_tensor_free(t[0]);
    hr_tensor_free(t[1]);
}

/* rows x cols floats on device d. */
static hr_tensor *on(hr_device *d, hr_dtype dt, int rows, int cols, const float *v) {
    int64_t shape[2] = {rows, cols};
    hr_tensor *h = NULL, *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, 2, shape, v, sizeof(float) * (size_t)(rows * cols), &h), HR_OK);
    if (dt != HR_F32) {
        hr_tensor *c = NULL;
        assert_int_equal(hr_cast(h, dt, &c), HR_OK);
        hr_tensor_free(h);
        h = c;
    }
    assert_int_equal(hr_tensor_to(h, d, &t), HR_OK);
    hr_tensor_free(h);
    return t;
}

static void read_f32(const hr_tensor *t, float *out, size_t n) {
    hr_tensor *h = NULL, *f = NULL;
    assert_int_equal(hr_tensor_to(t, hr_device_cpu(), &h), HR_OK);
    assert_int_equal(hr_cast(h, HR_F32, &f), HR_OK);
    assert_int_equal(hr_tensor_read(f, out, sizeof(float) * n), HR_OK);
    hr_tensor_free(h);
    hr_tensor_free(f);
}

static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* The collective ops as one module of two replicas on xla_cpu:0 and :1:
 * all_reduce adds the replicas' f32 parts in replica order, then the bias
 * (bf16 parts summed in f32, rounded once); all_gather joins them along a
 * dim; broadcast gives the root's. */
static void test_collectives_in_one_module_over_two_devices(void **state) {
    hr_pjrt_plugin *p = plugin_or_skip();
    if (p->num_devices < 2) skip();
    hr_device *d[2];
    assert_int_equal(hr_device_get("xla_cpu:0", &d[0]), HR_OK);
    assert_int_equal(hr_device_get("xla_cpu:1", &d[1]), HR_OK);
    float a[6] = {1.5f, -2, 3.25f, 4, 5e-3f, 6}, b[6] = {10, 20.5f, -30, 40, 50, -1e-3f}, bias[3] = {0.5f, -1, 2};
    for (int bf = 0; bf < 2; bf++) {
        hr_dtype dt = bf ? HR_BF16 : HR_F32;
        const hr_tensor *ins[4] = {on(d[0], dt, 2, 3, a), on(d[0], HR_F32, 1, 3, bias), on(d[1], dt, 2, 3, b),
                                   on(d[1], HR_F32, 1, 3, bias)};
        hr_tensor *outs[2];
        hr_attrs_cast ac = {.dtype = dt};
        assert_int_equal(hr_pjrt_run_replicated(HR_OP_all_reduce, &ac, ins, 2, 2, outs), HR_OK);
        for (int r = 0; r < 2; r++) {
            float got[6];
            read_f32(outs[r], got, 6);
            assert_ptr_equal(hr_tensor_device(outs[r]), d[r]);
            for (int i = 0; i < 6; i++) {
                float x = bf ? bf16_round(a[i]) : a[i], y = bf ? bf16_round(b[i]) : b[i];
                float want = (x + y) + bias[i % 3];
                if (bf) want = bf16_round(want);
                assert_true(got[i] == want);
            }
            hr_tensor_free(outs[r]);
        }
        for (int i = 0; i < 4; i++) hr_tensor_free((hr_tensor *)ins[i]);
    }
    const hr_tensor *xs[2] = {on(d[0], HR_F32, 2, 3, a), on(d[1], HR_F32, 2, 3, b)};
    hr_tensor *outs[2];
    hr_attrs_all_gather ag = {.dim = 1, .total = 6};
    assert_int_equal(hr_pjrt_run_replicated(HR_OP_all_gather, &ag, xs, 1, 2, outs), HR_OK);
    for (int r = 0; r < 2; r++) {
        float got[12];
        read_f32(outs[r], got, 12);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 6; j++) assert_true(got[i * 6 + j] == (j < 3 ? a[i * 3 + j] : b[i * 3 + j - 3]));
        hr_tensor_free(outs[r]);
    }
    hr_attrs_broadcast bc = {.root = 1};
    assert_int_equal(hr_pjrt_run_replicated(HR_OP_broadcast, &bc, xs, 1, 2, outs), HR_OK);
    for (int r = 0; r < 2; r++) {
        float got[6];
        read_f32(outs[r], got, 6);
        assert_memory_equal(got, b, sizeof got);
        hr_tensor_free(outs[r]);
    }
    /* a module's replicas hold equal parts */
    ag.total = 5;
    assert_int_not_equal(hr_pjrt_run_replicated(HR_OP_all_gather, &ag, xs, 1, 2, outs), HR_OK);
    /* both replicas on one device are refused */
    const hr_tensor *same[2] = {xs[0], xs[0]};
    assert_int_equal(hr_pjrt_run_replicated(HR_OP_broadcast, &bc, same, 1, 2, outs), HR_ERR_INVALID_ARG);
    assert_non_null(strstr(hr_last_error(), "both on xla_cpu:0"));
    hr_tensor_free((hr_tensor *)xs[0]);
    hr_tensor_free((hr_tensor *)xs[1]);
}

static char *broken_module(void *ctx) {
    return strdup("module @broken {\n  func.func public @main(%a: tensor<2xf32>) -> tensor<3xf32> {\n"
                  "    %0 = \"stablehlo.add\"(%a, %a) : (tensor<2xf32>, tensor<2xf32>) -> tensor<3xf32>\n"
                  "    \"func.return\"(%0) : (tensor<3xf32>) -> ()\n  }\n}\n");
}

static void test_compile_error_points_at_dump(void **state) {
    hr_pjrt_plugin *p = plugin_or_skip();
    char dir[] = "/tmp/hubrt-pjrt-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    setenv("HUBRT_DUMP_DIR", dir, 1);
    int64_t key[2] = {-2, 12345};
    PJRT_LoadedExecutable *exe = NULL;
    hr_status s = hr_pjrt_exec_get(p, key, 2, "broken", broken_module, NULL, 1, NULL, &exe);
    unsetenv("HUBRT_DUMP_DIR");
    assert_int_equal(s, HR_ERR_DEVICE);
    const char *msg = hr_last_error();
    assert_non_null(strstr(msg, "StableHLO compile of 'broken' failed"));
    const char *at = strstr(msg, "module dumped to ");
    assert_non_null(at);
    char path[512];
    assert_int_equal(sscanf(at + strlen("module dumped to "), "%511[^:]", path), 1);
    assert_non_null(strstr(path, dir));
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char text[256] = "";
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    assert_non_null(strstr(text, "module @broken"));
    remove(path);
    rmdir(dir);
}

static void test_missing_plugin_lists_paths(void **state) {
    /* The registry loads each plugin once per process; the loader's search
     * runs again here on a backend that has not been loaded: tpu. */
    setenv("HUBRT_PJRT_PLUGIN", "/nonexistent/dir/libtpu.so", 1);
    hr_pjrt_info info;
    hr_status s = hr_pjrt_backend_info("tpu", &info);
    unsetenv("HUBRT_PJRT_PLUGIN");
    if (s == HR_OK) {
        print_message("skipped: a tpu plugin loaded earlier in this process\n");
        skip();
    }
    assert_int_equal(s, HR_ERR_NOT_FOUND);
    assert_non_null(strstr(hr_last_error(), "/nonexistent/dir/libtpu.so"));
    assert_non_null(strstr(hr_last_error(), "paths searched"));
    hr_device *d;
    assert_int_not_equal(hr_device_get("tpu", &d), HR_OK);
}
/* A compiled function (hr_jit: capture, plan, replay) on xla_cpu: the
 * replay matches eager runs and updates a device KV cache in place. */
typedef struct {
    hr_tensor *w;     /* [6, 4] */
    hr_tensor *cache; /* [5, 6], rows written at positions */
} jit_model;

static hr_status jit_fn(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **out, int n_out) {
    jit_model *m = ctx;
    hr_tensor *y = NULL;
    hr_status s = hr_linear(in[0], m->w, NULL, &y); /* [1, 6] */
    if (s == HR_OK) s = hr_index_copy_(m->cache, 0, in[1], y);
    if (s == HR_OK) s = hr_silu(y, &out[0]);
    hr_tensor_free(y);
    return s;
}

static hr_tensor *dev_tensor(hr_device *d, hr_dtype dt, int ndim, const int64_t *shape, const void *data, size_t n) {
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_from_host(d, dt, ndim, shape, data, n, &t), HR_OK);
    return t;
}

static void test_jit_replay_on_device(void **state) {
    plugin_or_skip();
    hr_device *d;
    assert_int_equal(hr_device_get("xla_cpu", &d), HR_OK);
    float w[24], zeros[30] = {0};
    for (int i = 0; i < 24; i++) w[i] = 0.1f * (float)(i % 7) - 0.3f;
    jit_model m = {.w = dev_tensor(d, HR_F32, 2, (int64_t[]){6, 4}, w, sizeof w),
                   .cache = dev_tensor(d, HR_F32, 2, (int64_t[]){5, 6}, zeros, sizeof zeros)};
    hr_tensor_set_name(m.w, "w");
    hr_tensor_set_name(m.cache, "cache");
    setenv("HUBRT_CACHE", "0", 1);
    hr_jit *jit = NULL;
    hr_jit_options o = {.name = "pjrt_step", .fn = jit_fn, .ctx = &m};
    assert_int_equal(hr_jit_create(&o, &jit), HR_OK);
    float want_cache[30] = {0};
    for (int64_t step = 0; step < 3; step++) {
        float x[4] = {1.0f + (float)step, -0.5f, 0.25f * (float)step, 2.0f};
        hr_tensor *xt = dev_tensor(d, HR_F32, 2, (int64_t[]){1, 4}, x, sizeof x);
        hr_tensor *pos = dev_tensor(d, HR_I64, 1, (int64_t[]){1}, &step, sizeof step);
        const hr_tensor *in[2] = {xt, pos};
        hr_tensor *got = NULL;
        assert_int_equal(hr_jit_call(jit, in, 2, &got, 1), HR_OK);
        assert_ptr_equal(hr_tensor_device(got), d);
        float g[6];
        assert_int_equal(hr_tensor_read(got, g, sizeof g), HR_OK);
        for (int j = 0; j < 6; j++) {
            float y = 0;
            for (int k = 0; k < 4; k++) y += x[k] * w[j * 4 + k];
            want_cache[step * 6 + j] = y;
            assert_true(fabsf(g[j] - y / (1.0f + expf(-y))) < 1e-5f);
        }
        float c[30];
        assert_int_equal(hr_tensor_read(m.cache, c, sizeof c), HR_OK);
        for (int i = 0; i < 30; i++) assert_true(fabsf(c[i] - want_cache[i]) < 1e-5f);
        hr_tensor_free(got);
        hr_tensor_free(xt);
        hr_tensor_free(pos);
    }
    assert_int_equal(hr_jit_num_plans(jit), 1);
    hr_jit_free(jit);
    unsetenv("HUBRT_CACHE");
    hr_tensor_free(m.w);
    hr_tensor_free(m.cache);
}
#else
static void test_built_without_headers(void **state) {
    hr_pjrt_info info;
    assert_int_equal(hr_pjrt_backend_info("xla_cpu", &info), HR_ERR_UNSUPPORTED);
    assert_non_null(strstr(hr_last_error(), "built without PJRT headers"));
    hr_device *d;
    assert_int_not_equal(hr_device_get("xla_cpu", &d), HR_OK);
}
#endif

/* A transpose reads through a transpose, a stepped slice through a gather,
 * and an offset travels as an argument. */
static void test_view_load_text(void **state) {
    float data[12] = {0};
    int64_t shape[2] = {3, 4};
    hr_tensor *t, *tt, *row, *step;
    assert_int_equal(hr_tensor_from_host(hr_device_cpu(), HR_F32, 2, shape, data, sizeof data, &t), HR_OK);
    assert_int_equal(hr_tensor_transpose(t, 0, 1, &tt), HR_OK);
    assert_int_equal(hr_tensor_select(t, 0, 1, &row), HR_OK);
    assert_int_equal(hr_tensor_slice(t, 1, 0, 4, 2, &step), HR_OK);
    const hr_tensor *views[3] = {tt, row, step};
    static const char *const want[3] = {"stablehlo.transpose", "stablehlo.dynamic_slice", "stablehlo.gather"};
    for (int i = 0; i < 3; i++) {
        hr_shlo_view v;
        hr_shlo_builder b;
        hr_shlo_init(&b);
        hr_shlo_view_of(views[i], &v);
        hr_shlo_value x = hr_shlo_view_load(&b, &v);
        char *text = hr_shlo_finish(&b, "view", &x, 1);
        assert_non_null(text);
        for (int j = 0; j < 3; j++) {
            if (j == i)
                assert_non_null(strstr(text, want[j]));
            else
                assert_null(strstr(text, want[j]));
        }
        /* the buffer's bytes, then the offset for the row */
        const char *sig = strstr(text, "@main(");
        assert_non_null(sig);
        assert_true(strstr(sig, "tensor<48xui8>") == sig + strlen("@main(%v0: "));
        const char *off = strstr(sig, "tensor<i64>");
        assert_true((off && off < strstr(sig, ") ->")) == (views[i] == row));
        free(text);
        hr_shlo_free(&b);
    }
    hr_tensor_free(step);
    hr_tensor_free(row);
    hr_tensor_free(tt);
    hr_tensor_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#ifdef HUBRT_HAVE_PJRT
        cmocka_unit_test(test_version_check),
        cmocka_unit_test(test_all_reduce_two_devices),
        cmocka_unit_test(test_collectives_in_one_module_over_two_devices),
        cmocka_unit_test(test_compile_error_points_at_dump),
        cmocka_unit_test(test_missing_plugin_lists_paths),
        cmocka_unit_test(test_jit_replay_on_device),
#else
        cmocka_unit_test(test_built_without_headers),
#endif
        cmocka_unit_test(test_view_load_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
