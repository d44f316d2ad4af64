/* C-level checks of the eltwise and index ops that the Python oracle
 * tests do not reach: in-place aliasing, the hr_copy_/hr_index_copy_
 * wrappers, attrs validation, size-0 dims, and SIMD vs scalar conversions
 * bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "hubrt.h"
#include "test_util.h"

#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})


static void read_f32(const hr_tensor *t, float *dst, int64_t n) {
    assert_int_equal(hr_tensor_read(t, dst, (size_t)n * 4), HR_OK);
}

static void expect_error(hr_status s, hr_status want, const char *needle) {
    assert_int_equal(s, want);
    if (!strstr(hr_last_error(), needle)) fail_msg("error '%s' lacks '%s'", hr_last_error(), needle);
}

static void test_inplace_alias(void **state) {
    float av[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {10, 20, 30}, got[6];
    hr_tensor *a = test_from_f32(2, (int64_t[]){2, 3}, av), *b = test_from_f32(1, (int64_t[]){3}, bv);
    hr_tensor *outs[1] = {a};
    assert_int_equal(hr_op_run(HR_OP_add, NULL, IN_(a, b), 2, outs, 1), HR_OK);
    assert_ptr_equal(outs[0], a);
    read_f32(a, got, 6);
    for (int i = 0; i < 6; i++) assert_true(got[i] == av[i] + bv[i % 3]);
    /* in place through a transposed view of itself */
    hr_tensor *at = NULL;
    assert_int_equal(hr_tensor_transpose(a, 0, 1, &at), HR_OK);
    outs[0] = at;
    assert_int_equal(hr_op_run(HR_OP_mul, NULL, IN_(at, at), 2, outs, 1), HR_OK);
    read_f32(a, got, 6);
    for (int i = 0; i < 6; i++) assert_true(got[i] == (av[i] + bv[i % 3]) * (av[i] + bv[i % 3]));
    hr_tensor_free(at);
    hr_tensor_free(a);
    hr_tensor_free(b);
}

/* An output sharing part of an input's memory, or writing one place
 * twice, is refused before anything is written; exactly the input's view
 * (in place) and disjoint views of one buffer run. */
static void test_output_overlap(void **state) {
    float v[16], got[16];
    for (int i = 0; i < 16; i++) v[i] = (float)(i + 1);
    hr_tensor *t = test_from_f32(1, (int64_t[]){16}, v), *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(hr_tensor_narrow(t, 0, 0, 8, &a), HR_OK);
    assert_int_equal(hr_tensor_narrow(t, 0, 4, 8, &b), HR_OK); /* a's second half and more */
    assert_int_equal(hr_tensor_narrow(t, 0, 8, 8, &c), HR_OK); /* just past a */
    hr_tensor *outs[1] = {b};
    expect_error(hr_op_run(HR_OP_add, NULL, IN_(a, a), 2, outs, 1), HR_ERR_INVALID_ARG,
                 "output 0 overlaps input 0 in part (bytes [16, 48) and [0, 32)");
    read_f32(t, got, 16);
    for (int i = 0; i < 16; i++) assert_true(got[i] == v[i]); /* nothing written */
    /* the other way round: the output before the input */
    outs[0] = a;
    expect_error(hr_op_run(HR_OP_neg, NULL, IN_(b), 1, outs, 1), HR_ERR_INVALID_ARG, "overlaps input 0 in part");
    outs[0] = c; /* disjoint, one buffer */
    assert_int_equal(hr_op_run(HR_OP_add, NULL, IN_(a, a), 2, outs, 1), HR_OK);
    outs[0] = a; /* in place */
    assert_int_equal(hr_op_run(HR_OP_add, NULL, IN_(a, a), 2, outs, 1), HR_OK);
    read_f32(t, got, 16);
    for (int i = 0; i < 8; i++) assert_true(got[i] == 2 * v[i] && got[8 + i] == 2 * v[i]);
    /* interleaved views are not compared (not contiguous) and do not share
     * an element: odd = -even runs */
    hr_tensor *even = NULL, *odd = NULL;
    assert_int_equal(hr_tensor_slice(t, 0, 0, 16, 2, &even), HR_OK);
    assert_int_equal(hr_tensor_slice(t, 0, 1, 16, 2, &odd), HR_OK);
    outs[0] = odd;
    assert_int_equal(hr_op_run(HR_OP_neg, NULL, IN_(even), 1, outs, 1), HR_OK);
    read_f32(t, got, 16);
    for (int i = 0; i < 16; i += 2) assert_true(got[i + 1] == -got[i]);
    /* a broadcast output writes each place several times */
    hr_tensor *row = NULL, *wide = NULL, *x = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, HR_F32, 2, (int64_t[]){1, 4}, &row), HR_OK);
    assert_int_equal(hr_tensor_expand(row, 2, (int64_t[]){3, 4}, &wide), HR_OK);
    assert_int_equal(hr_tensor_zeros(NULL, HR_F32, 2, (int64_t[]){3, 4}, &x), HR_OK);
    outs[0] = wide;
    expect_error(hr_op_run(HR_OP_exp, NULL, IN_(x), 1, outs, 1), HR_ERR_INVALID_ARG,
                 "output 0 is broadcast along dim 0 (stride 0)");
    hr_tensor *views[] = {a, b, c, even, odd, row, wide, x, t};
    for (size_t i = 0; i < sizeof views / sizeof *views; i++) hr_tensor_free(views[i]);
}

static void test_copy_wrapper_broadcasts_and_casts(void **state) {
    float sv[4] = {1.00390625f, -2.5f, 3.0f, 1e-3f};
    hr_tensor *src = test_from_f32(1, (int64_t[]){4}, sv), *dst = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, HR_BF16, 2, (int64_t[]){3, 4}, &dst), HR_OK);
    assert_int_equal(hr_copy_(dst, src), HR_OK);
    uint16_t got[12];
    assert_int_equal(hr_tensor_read(dst, got, sizeof got), HR_OK);
    for (int i = 0; i < 12; i++) assert_int_equal(got[i], hr_f32_to_bf16(sv[i % 4]));
    hr_tensor_free(src);
    hr_tensor_free(dst);
}

static void test_index_copy_inplace(void **state) {
    float dv[8] = {0}, sv[4] = {1, 2, 3, 4}, got[8];
    int64_t iv[2] = {3, 1};
    hr_tensor *dst = test_from_f32(2, (int64_t[]){4, 2}, dv), *src = test_from_f32(2, (int64_t[]){2, 2}, sv), *idx = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_I64, 1, (int64_t[]){2}, iv, sizeof iv, &idx), HR_OK);
    assert_int_equal(hr_index_copy_(dst, 0, idx, src), HR_OK);
    read_f32(dst, got, 8);
    const float want[8] = {0, 0, 3, 4, 0, 0, 1, 2};
    for (int i = 0; i < 8; i++) assert_true(got[i] == want[i]);
    iv[0] = 4;
    hr_tensor_free(idx);
    assert_int_equal(hr_tensor_from_host(NULL, HR_I64, 1, (int64_t[]){2}, iv, sizeof iv, &idx), HR_OK);
    expect_error(hr_index_copy_(dst, 0, idx, src), HR_ERR_INVALID_ARG, "index 4 at position 0");
    hr_tensor_free(idx);
    hr_tensor_free(dst);
    hr_tensor_free(src);
}

static void test_attr_errors(void **state) {
    float v[2] = {1, 2};
    hr_tensor *x = test_from_f32(1, (int64_t[]){2}, v), *out = NULL;
    expect_error(hr_cast(x, (hr_dtype)99, &out), HR_ERR_INVALID_ARG, "dtype attribute 99");
    assert_non_null(strstr(hr_last_error(), "op 'cast'"));
    hr_tensor *outs[1] = {NULL};
    expect_error(hr_op_run(HR_OP_clamp, NULL, IN_(x), 1, outs, 1), HR_ERR_INVALID_ARG, "attrs are required");
    hr_attrs_fill f = {.shape = {.n = 9}, .dtype = HR_F32};
    expect_error(hr_op_run_on(hr_device_cpu(), HR_OP_fill, &f, NULL, 0, outs, 1), HR_ERR_SHAPE, "9 dims");
    f.shape.n = 2;
    f.shape.v[1] = -3;
    expect_error(hr_op_run_on(hr_device_cpu(), HR_OP_fill, &f, NULL, 0, outs, 1), HR_ERR_SHAPE, "negative");
    expect_error(hr_arange(NULL, 0, 5, 0, HR_I64, &out), HR_ERR_INVALID_ARG, "step must be nonzero");
    assert_null(out);
    hr_tensor_free(x);
}

static void test_size_zero(void **state) {
    hr_tensor *e = NULL, *r = NULL, *ones = NULL, *row = NULL, *idx = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, HR_F32, 2, (int64_t[]){0, 3}, &e), HR_OK);
    assert_int_equal(hr_fill(NULL, HR_F32, 2, (int64_t[]){2, 3}, 1.0, &ones), HR_OK);
    assert_int_equal(hr_fill(NULL, HR_F32, 1, (int64_t[]){3}, 1.0, &row), HR_OK);
    assert_int_equal(hr_add(e, row, &r), HR_OK);
    assert_int_equal(hr_tensor_shape(r)[0], 0);
    hr_tensor_free(r);
    hr_tensor_free(row);
    /* an empty input among non-empty ones reaches the kernel */
    assert_int_equal(hr_cat(IN_(e, ones, e), 3, 0, &r), HR_OK);
    float got[6];
    read_f32(r, got, 6);
    for (int i = 0; i < 6; i++) assert_true(got[i] == 1.0f);
    hr_tensor_free(r);
    assert_int_equal(hr_tensor_zeros(NULL, HR_I64, 1, (int64_t[]){0}, &idx), HR_OK);
    assert_int_equal(hr_index_select(ones, 0, idx, &r), HR_OK);
    assert_int_equal(hr_tensor_shape(r)[0], 0);
    hr_tensor_free(r);
    assert_int_equal(hr_index_copy_(ones, 0, idx, e), HR_OK);
    hr_tensor_free(idx);
    hr_tensor_free(e);
    hr_tensor_free(ones);
}

/* The AVX2 bf16/f16 conversions and the vector exp against the scalar
 * path, over a sweep of f32 bit patterns (every exponent, many mantissas,
 * both signs, infinities and NaNs). */
static void test_simd_matches_scalar(void **state) {
    hr_cpu_isa best = hr_cpu_isa_get();
    const int64_t n = (int64_t)1 << 20;
    uint32_t *bits = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) bits[i] = (uint32_t)(i * 4099u + (i >> 7));
    hr_tensor *x = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, 1, &n, bits, (size_t)n * 4, &x), HR_OK);
    hr_dtype to[2] = {HR_BF16, HR_F16};
    for (int k = 0; k < 2; k++) {
        hr_tensor *fast = NULL, *slow = NULL, *back_fast = NULL, *back_slow = NULL;
        assert_int_equal(hr_cast(x, to[k], &fast), HR_OK);
        assert_int_equal(hr_cast(fast, HR_F32, &back_fast), HR_OK);
        assert_int_equal(hr_cpu_isa_set(HR_ISA_SCALAR), HR_OK);
        assert_int_equal(hr_cast(x, to[k], &slow), HR_OK);
        assert_int_equal(hr_cast(slow, HR_F32, &back_slow), HR_OK);
        assert_int_equal(hr_cpu_isa_set(best), HR_OK);
        const uint16_t *a = hr_tensor_data(fast), *b = hr_tensor_data(slow);
        const float *fa = hr_tensor_data(back_fast), *fb = hr_tensor_data(back_slow);
        for (int64_t i = 0; i < n; i++) {
            if (a[i] != b[i]) fail_msg("%s of 0x%08x: simd 0x%04x, scalar 0x%04x", hr_dtype_name(to[k]), bits[i], a[i], b[i]);
            if (memcmp(&fa[i], &fb[i], 4)) fail_msg("%s -> f32 differs at %lld", hr_dtype_name(to[k]), (long long)i);
        }
        hr_tensor_free(fast);
        hr_tensor_free(slow);
        hr_tensor_free(back_fast);
        hr_tensor_free(back_slow);
    }
    free(bits);
    hr_tensor_free(x);
}

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double ref_silu(double x) { return x * ref_sigmoid(x); }
static double ref_gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double ref_gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* The AVX2 transcendentals against double references over a dense sweep
 * (and, with HUBRT_CPU_ISA=scalar, libm the same way). Tolerances are
 * absolute plus relative: a few f32 ulps, gelu's erf approximation 1.5e-7. */
static void test_vector_transcendentals(void **state) {
    static const struct {
        hr_op op;
        int64_t approximate;
        double lo, hi, atol, rtol;
        double (*ref)(double);
    } cases[] = {
        {HR_OP_exp, 0, -87, 88, 0, 4e-7, exp},
        {HR_OP_sigmoid, 0, -100, 100, 2e-7, 4e-7, ref_sigmoid},
        {HR_OP_silu, 0, -100, 100, 2e-7, 4e-7, ref_silu},
        {HR_OP_tanh, 0, -12, 12, 1e-9, 4e-7, tanh},
        {HR_OP_gelu, HR_GELU_ERF, -12, 12, 2e-7, 4e-7, ref_gelu},
        {HR_OP_gelu, HR_GELU_TANH, -12, 12, 2e-7, 4e-7, ref_gelu_tanh},
    };
    const int64_t n = 100003;
    float *v = malloc((size_t)n * 4);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int64_t i = 0; i < n; i++) v[i] = (float)(cases[c].lo + (cases[c].hi - cases[c].lo) * (double)i / (double)(n - 1));
        hr_tensor *x = test_from_f32(1, &n, v), *outs[1] = {NULL};
        hr_attrs_gelu g = {.approximate = cases[c].approximate};
        assert_int_equal(hr_op_run(cases[c].op, &g, IN_(x), 1, outs, 1), HR_OK);
        const float *got = hr_tensor_data(outs[0]);
        for (int64_t i = 0; i < n; i++) {
            double want = cases[c].ref(v[i]);
            if (fabs(got[i] - want) > cases[c].atol + cases[c].rtol * fabs(want))
                fail_msg("%s(%.9g) = %.9g, want %.9g", hr_op_name(cases[c].op), v[i], got[i], want);
        }
        hr_tensor_free(x);
        hr_tensor_free(outs[0]);
    }
    free(v);
}

/* An element's result does not depend on how the op's rows are split over
 * threads: with AVX2, a call's partial last vector used to go through the
 * scalar libm code, which gives other bits than the vector exp, so the
 * same input differed between 1, 2 and 3 threads. */
static void test_thread_count_changes_no_bits(void **state) {
    static const hr_op ops[] = {HR_OP_exp, HR_OP_sigmoid, HR_OP_silu, HR_OP_tanh, HR_OP_gelu};
    const int64_t n = 70007, shapes[2][2] = {{1, 70007}, {7, 10001}}; /* numel n; rows of odd length */
    float *v = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) v[i] = -9.0f + 18.0f * (float)((i * 7919) % n) / (float)n;
    int threads = hr_num_threads();
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int sh = 0; sh < 2; sh++) {
            hr_tensor *x = test_from_f32(2, shapes[sh], v), *want = NULL;
            for (int nth = 1; nth <= 3; nth++) {
                assert_int_equal(hr_set_num_threads(nth), HR_OK);
                hr_tensor *outs[1] = {NULL};
                hr_attrs_gelu g = {.approximate = HR_GELU_ERF};
                assert_int_equal(hr_op_run(ops[o], ops[o] == HR_OP_gelu ? &g : NULL, IN_(x), 1, outs, 1), HR_OK);
                if (!want) {
                    want = outs[0];
                    continue;
                }
                if (memcmp(hr_tensor_data(outs[0]), hr_tensor_data(want), (size_t)n * 4))
                    fail_msg("%s on [%lld, %lld]: %d threads differ from 1", hr_op_name(ops[o]),
                             (long long)shapes[sh][0], (long long)shapes[sh][1], nth);
                hr_tensor_free(outs[0]);
            }
            hr_tensor_free(want);
            hr_tensor_free(x);
        }
    assert_int_equal(hr_set_num_threads(threads), HR_OK);
    free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inplace_alias),
        cmocka_unit_test(test_copy_wrapper_broadcasts_and_casts),
        cmocka_unit_test(test_index_copy_inplace),
        cmocka_unit_test(test_attr_errors),
        cmocka_unit_test(test_size_zero),
        cmocka_unit_test(test_output_overlap),
        cmocka_unit_test(test_simd_matches_scalar),
        cmocka_unit_test(test_vector_transcendentals),
        cmocka_unit_test(test_thread_count_changes_no_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
