/* Helpers shared by the cmocka tests (include after <cmocka.h>). */
#ifndef HUBRT_TEST_UTIL_H
#define HUBRT_TEST_UTIL_H

#include "hubrt.h"

/* A contiguous f32 cpu tensor holding v[0..numel). */
static inline hr_tensor *test_from_f32(int ndim, const int64_t *shape, const float *v) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, ndim, shape, v, (size_t)n * 4, &t), HR_OK);
    return t;
}

#endif
