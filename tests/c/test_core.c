/* Core: dtypes, errors, tensors, views, devices, thread pool, iteration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/half.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt.h"

static void test_dtype_names(void **state) {
    hr_dtype d;
    assert_int_equal(hr_dtype_parse("bfloat16", &d), HR_OK);
    assert_int_equal(d, HR_BF16);
    assert_int_equal(hr_dtype_parse("BF16", &d), HR_OK);
    assert_int_equal(d, HR_BF16);
    assert_int_equal(hr_dtype_parse("torch.float16", &d), HR_OK);
    assert_int_equal(d, HR_F16);
    assert_int_equal(hr_dtype_size(HR_I64), 8);
    assert_int_equal(hr_dtype_parse("complex64", &d), HR_ERR_DTYPE);
    assert_non_null(strstr(hr_last_error(), "complex64"));
}

static void test_half_round_trip(void **state) {
    /* Every f16 bit pattern survives f16 -> f32 -> f16 (NaNs stay NaN). */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = hr_f16_to_f32((uint16_t)h);
        uint16_t back = hr_f32_to_f16(f);
        if (isnan(f))
            assert_true(isnan(hr_f16_to_f32(back)));
        else
            assert_int_equal(back, h);
    }
    assert_int_equal(hr_f32_to_f16(65520.0f), 0x7c00);   /* rounds to inf */
    assert_int_equal(hr_f32_to_f16(65519.0f), 0x7bff);   /* max finite */
    assert_int_equal(hr_f32_to_f16(5.9604645e-08f), 1);  /* smallest subnormal */
    assert_int_equal(hr_f32_to_f16(2.9802322e-08f), 0);  /* half of it: ties to even */
    assert_int_equal(hr_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(hr_f32_to_bf16(1.00390625f), 0x3f80); /* tie -> even */
    assert_int_equal(hr_f32_to_bf16(1.01171875f), 0x3f82); /* tie -> even (up) */
    assert_true(isnan(hr_bf16_to_f32(hr_f32_to_bf16(NAN))));
}

static hr_tensor *iota(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float buf[256];
    for (int64_t i = 0; i < n; i++) buf[i] = (float)i;
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, ndim, shape, buf, (size_t)n * 4, &t), HR_OK);
    return t;
}

static void test_tensor_create_errors(void **state) {
    hr_tensor *t = NULL;
    int64_t shape[2] = {2, 3};
    float data[6] = {0};
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, 2, shape, data, 20, &t), HR_ERR_INVALID_ARG);
    assert_null(t);
    assert_non_null(strstr(hr_last_error(), "24"));
    int64_t bad[2] = {2, -1};
    assert_int_equal(hr_tensor_empty(NULL, HR_F32, 2, bad, &t), HR_ERR_SHAPE);
    int64_t big[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(hr_tensor_empty(NULL, HR_F32, 9, big, &t), HR_ERR_SHAPE);
    assert_int_equal(hr_tensor_zeros(NULL, HR_BF16, 2, shape, &t), HR_OK);
    assert_int_equal(hr_tensor_nbytes(t), 12);
    assert_true(hr_tensor_is_contiguous(t));
    hr_tensor_free(t);
}

static void test_views(void **state) {
    int64_t shape[3] = {2, 3, 4};
    hr_tensor *t = iota(3, shape), *v = NULL, *w = NULL;
    const float *base = hr_tensor_data(t);

    assert_int_equal(hr_tensor_transpose(t, 0, 2, &v), HR_OK); /* [4, 3, 2] */
    assert_int_equal(hr_tensor_shape(v)[0], 4);
    assert_int_equal(hr_tensor_strides(v)[0], 1);
    assert_false(hr_tensor_is_contiguous(v));
    int64_t flat = 24;
    assert_int_equal(hr_tensor_view(v, 1, &flat, &w), HR_ERR_SHAPE);
    assert_non_null(strstr(hr_last_error(), "reshape"));
    hr_tensor_free(v);

    /* view merges and splits contiguous runs */
    int64_t s2[2] = {6, -1};
    assert_int_equal(hr_tensor_view(t, 2, s2, &v), HR_OK);
    assert_int_equal(hr_tensor_shape(v)[1], 4);
    assert_ptr_equal(hr_tensor_data(v), base);
    hr_tensor_free(v);

    /* slice with step, then select */
    assert_int_equal(hr_tensor_slice(t, 2, 1, 100, 2, &v), HR_OK); /* [2,3,2]: 1,3 */
    assert_int_equal(hr_tensor_shape(v)[2], 2);
    assert_int_equal(hr_tensor_select(v, 1, -1, &w), HR_OK); /* row 2 */
    float got[4];
    assert_int_equal(hr_tensor_read(w, got, sizeof got), HR_OK);
    assert_true(got[0] == 9 && got[1] == 11 && got[2] == 21 && got[3] == 23);
    hr_tensor_free(w);
    hr_tensor_free(v);

    assert_int_equal(hr_tensor_narrow(t, 1, 2, 2, &v), HR_ERR_SHAPE);
    assert_int_equal(hr_tensor_narrow(t, 1, 1, 2, &v), HR_OK);
    assert_int_equal(hr_tensor_offset(v), 4);
    hr_tensor_free(v);

    /* expand a size-1 dim and add a leading one */
    int64_t one[2] = {1, 3};
    hr_tensor *r = iota(2, one);
    int64_t ex[3] = {5, 4, -1};
    assert_int_equal(hr_tensor_expand(r, 3, ex, &v), HR_OK);
    assert_int_equal(hr_tensor_strides(v)[0], 0);
    assert_int_equal(hr_tensor_strides(v)[1], 0);
    assert_int_equal(hr_tensor_shape(v)[2], 3);
    hr_tensor_free(v);
    int64_t ex_bad[2] = {2, 4};
    assert_int_equal(hr_tensor_expand(r, 2, ex_bad, &v), HR_ERR_SHAPE);
    hr_tensor_free(r);

    assert_int_equal(hr_tensor_unsqueeze(t, -1, &v), HR_OK);
    assert_int_equal(hr_tensor_ndim(v), 4);
    assert_int_equal(hr_tensor_squeeze(v, 3, &w), HR_OK);
    hr_tensor_free(v);
    assert_int_equal(hr_tensor_ndim(w), 3);
    assert_int_equal(hr_tensor_squeeze(w, 0, &v), HR_ERR_SHAPE);
    hr_tensor_free(w);

    hr_tensor *parts[4];
    int n = 0;
    assert_int_equal(hr_tensor_split(t, 3, 2, parts, 4, &n), HR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(hr_tensor_shape(parts[1])[2], 1);
    for (int i = 0; i < n; i++) hr_tensor_free(parts[i]);

    int perm[3] = {1, 1, 0};
    assert_int_equal(hr_tensor_permute(t, 3, perm, &v), HR_ERR_INVALID_ARG);
    /* the buffer outlives the tensor it came from */
    assert_int_equal(hr_tensor_narrow(t, 0, 1, 1, &v), HR_OK);
    hr_tensor_free(t);
    assert_int_equal(hr_tensor_read(v, got, sizeof got), HR_ERR_INVALID_ARG);
    float all[12];
    assert_int_equal(hr_tensor_read(v, all, sizeof all), HR_OK);
    assert_true(all[0] == 12 && all[11] == 23);
    hr_tensor_free(v);
}

static void test_wrap_bounds(void **state) {
    float data[6] = {0};
    int64_t shape[2] = {2, 3}, strides[2] = {4, 1};
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_wrap_host(HR_F32, 2, shape, strides, data, sizeof data, NULL, NULL, &t),
                     HR_ERR_INVALID_ARG);
    strides[0] = 3;
    assert_int_equal(hr_tensor_wrap_host(HR_F32, 2, shape, strides, data, sizeof data, NULL, NULL, &t), HR_OK);
    assert_ptr_equal(hr_tensor_data(t), data);
    hr_tensor_free(t);
}

static void test_devices(void **state) {
    hr_device *d = NULL;
    assert_int_equal(hr_device_get("cpu", &d), HR_OK);
    assert_ptr_equal(d, hr_device_cpu());
    assert_int_equal(hr_device_get("cpu:0", &d), HR_OK);
    assert_string_equal(hr_device_name(d), "cpu");
    assert_int_equal(hr_device_get("cpu:1", &d), HR_ERR_NOT_FOUND);
    assert_non_null(strstr(hr_last_error(), "cpu:1"));
    assert_int_equal(hr_device_get("warp", &d), HR_ERR_NOT_FOUND);
    assert_non_null(strstr(hr_last_error(), "available: cpu"));
    assert_int_equal(hr_device_get("cpu:x", &d), HR_ERR_INVALID_ARG);
    assert_int_equal(hr_device_get(":0", &d), HR_ERR_INVALID_ARG);
}

static void count_body(void *ctx, int ith, int nth) {
    atomic_int *hits = ctx;
    atomic_fetch_add(&hits[ith], 1);
    atomic_fetch_add(&hits[63], nth);
}

static void nested_body(void *ctx, int ith, int nth) {
    atomic_int *hits = ctx;
    /* a region inside a region runs on the calling thread only */
    atomic_int inner[64] = {0};
    hr_parallel_run(count_body, inner, 0);
    assert_int_equal(atomic_load(&inner[0]), 1);
    atomic_fetch_add(&hits[ith], 1);
}

static void test_thread_pool(void **state) {
    int n = hr_num_threads();
    assert_true(n >= 1);
    for (int rep = 0; rep < 1000; rep++) {
        atomic_int hits[64] = {0};
        hr_parallel_run(count_body, hits, 0);
        for (int i = 0; i < n; i++) assert_int_equal(atomic_load(&hits[i]), 1);
        assert_int_equal(atomic_load(&hits[63]), n * n);
    }
    /* Resizing the pool: new workers must not replay an old region. */
    for (int size = 3; size >= 1; size--) {
        assert_int_equal(hr_set_num_threads(size), HR_OK);
        atomic_int again[64] = {0};
        hr_parallel_run(count_body, again, 0);
        for (int i = 0; i < size; i++) assert_int_equal(atomic_load(&again[i]), 1);
        assert_int_equal(atomic_load(&again[63]), size * size);
    }
    assert_int_equal(hr_set_num_threads(n), HR_OK);
    assert_int_equal(hr_set_num_threads(0), HR_ERR_INVALID_ARG);
    atomic_int hits[64] = {0};
    hr_parallel_run(nested_body, hits, 0);
    for (int i = 0; i < n; i++) assert_int_equal(atomic_load(&hits[i]), 1);
    int64_t b, e, total = 0;
    for (int i = 0; i < 3; i++) {
        hr_split_range(10, i, 3, &b, &e);
        total += e - b;
    }
    assert_int_equal(total, 10);
}

static void test_iter_coalesce(void **state) {
    int64_t shape[3] = {2, 3, 4};
    hr_tensor *t = iota(3, shape), *v = NULL;
    hr_iter it;
    const hr_tensor *ops[1] = {t};
    hr_iter_init(&it, 1, ops);
    assert_int_equal(it.ndim, 1); /* contiguous: one row of 24 */
    assert_int_equal(it.shape[0], 24);
    assert_int_equal(hr_tensor_narrow(t, 2, 0, 2, &v), HR_OK);
    const hr_tensor *ops2[1] = {v};
    hr_iter_init(&it, 1, ops2);
    assert_int_equal(it.ndim, 2);
    assert_int_equal(it.rows, 6);
    hr_tensor_free(v);
    hr_tensor_free(t);
}

static void test_error_is_thread_local(void **state) {
    hr_dtype d;
    hr_dtype_parse("nope", &d);
    assert_non_null(strstr(hr_last_error(), "nope"));
    hr_clear_error();
    assert_string_equal(hr_last_error(), "");
}

/* hr_build_id is the linker's NT_GNU_BUILD_ID of the binary holding the
 * library (this test links it statically), as readelf prints it. */
static void test_build_id_is_the_linkers(void **state) {
    char exe[4096], cmd[4200], line[512], want[200] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    snprintf(cmd, sizeof cmd, "readelf -n '%s'", exe);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    while (fgets(line, sizeof line, p)) /* read to the end: readelf must not get SIGPIPE */
        if (!want[0]) sscanf(line, " Build ID: %199s", want);
    assert_int_equal(pclose(p), 0);
    assert_int_equal(strlen(want), 40);
    assert_string_equal(hr_build_id(), want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_names),  cmocka_unit_test(test_half_round_trip),
        cmocka_unit_test(test_tensor_create_errors), cmocka_unit_test(test_views),
        cmocka_unit_test(test_wrap_bounds), cmocka_unit_test(test_devices),
        cmocka_unit_test(test_thread_pool), cmocka_unit_test(test_iter_coalesce),
        cmocka_unit_test(test_error_is_thread_local), cmocka_unit_test(test_build_id_is_the_linkers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
