/* Helpers shared by the cmocka tests (include after <cmocka.h>). */
#ifndef HUBRT_TEST_UTIL_H
#define HUBRT_TEST_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hubrt.h"

/* A contiguous f32 cpu tensor holding v[0..numel). */
static inline hr_tensor *test_from_f32(int ndim, const int64_t *shape, const float *v) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, ndim, shape, v, (size_t)n * 4, &t), HR_OK);
    return t;
}

/* A contiguous f32 cpu tensor of sin(seed + 0.37 i): smooth, distinct values. */
static inline hr_tensor *test_filled(int ndim, const int64_t *shape, float seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *buf = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) buf[i] = sinf(seed + 0.37f * (float)i);
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, ndim, shape, buf, sizeof(float) * (size_t)n, &t), HR_OK);
    free(buf);
    return t;
}

/* Bit for bit, any dtype. */
static inline void test_assert_same(const hr_tensor *a, const hr_tensor *b) {
    size_t n = hr_tensor_nbytes(a);
    assert_int_equal(n, hr_tensor_nbytes(b));
    char *x = malloc(n), *y = malloc(n);
    assert_int_equal(hr_tensor_read(a, x, n), HR_OK);
    assert_int_equal(hr_tensor_read(b, y, n), HR_OK);
    assert_int_equal(memcmp(x, y, n), 0);
    free(x);
    free(y);
}

#endif
