/* C-level checks of the reduce and nn ops and of rope scaling that the
 * Python oracle tests do not reach: hand-computed values through the typed
 * wrappers, results independent of the thread count (row split and
 * position split), size-0 dims, the rope frequency formulas, and errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "hubrt.h"
#include "test_util.h"


static void expect_error(hr_status s, hr_status want, const char *needle) {
    assert_int_equal(s, want);
    if (!strstr(hr_last_error(), needle)) fail_msg("error '%s' lacks '%s'", hr_last_error(), needle);
}

static void test_reduce_values(void **state) {
    const float v[6] = {1, 5, 5, 5, 0, 3}; /* [2, 3] */
    hr_tensor *x = test_from_f32(2, (int64_t[]){2, 3}, v), *out = NULL;
    float f[4];
    int64_t i[4];
    assert_int_equal(hr_sum(x, 1, false, &out), HR_OK);
    assert_int_equal(hr_tensor_read(out, f, 8), HR_OK);
    assert_true(f[0] == 11 && f[1] == 8);
    hr_tensor_free(out);
    assert_int_equal(hr_mean(x, 0, true, &out), HR_OK);
    assert_int_equal(hr_tensor_ndim(out), 2);
    assert_int_equal(hr_tensor_read(out, f, 12), HR_OK);
    assert_true(f[0] == 3 && f[1] == 2.5f && f[2] == 4);
    hr_tensor_free(out);
    assert_int_equal(hr_min(x, -1, false, &out), HR_OK);
    assert_int_equal(hr_tensor_read(out, f, 8), HR_OK);
    assert_true(f[0] == 1 && f[1] == 0);
    hr_tensor_free(out);
    assert_int_equal(hr_argmax(x, 1, false, &out), HR_OK); /* ties: the first */
    assert_int_equal(hr_tensor_dtype(out), HR_I64);
    assert_int_equal(hr_tensor_read(out, i, 16), HR_OK);
    assert_true(i[0] == 1 && i[1] == 0);
    hr_tensor_free(out);
    hr_tensor *vals = NULL, *idx = NULL;
    assert_int_equal(hr_topk(x, 2, 1, false, &vals, &idx), HR_OK);
    assert_int_equal(hr_tensor_read(vals, f, 16), HR_OK);
    assert_int_equal(hr_tensor_read(idx, i, 32), HR_OK);
    assert_true(f[0] == 1 && f[1] == 5 && i[0] == 0);      /* row 0, smallest first */
    assert_true(f[2] == 0 && f[3] == 3 && i[2] == 1 && i[3] == 2); /* row 1 */
    hr_tensor_free(vals);
    hr_tensor_free(idx);
    hr_tensor_free(x);
}

static void test_softmax_and_cumsum_values(void **state) {
    const float v[3] = {0, logf(2), logf(5)};
    hr_tensor *x = test_from_f32(1, (int64_t[]){3}, v), *out = NULL;
    float f[3];
    assert_int_equal(hr_softmax(x, 0, &out), HR_OK);
    assert_int_equal(hr_tensor_read(out, f, 12), HR_OK);
    assert_float_equal(f[0], 0.125, 1e-7);
    assert_float_equal(f[1], 0.25, 1e-7);
    assert_float_equal(f[2], 0.625, 1e-7);
    hr_tensor_free(out);
    assert_int_equal(hr_log_softmax(x, -1, &out), HR_OK);
    assert_int_equal(hr_tensor_read(out, f, 12), HR_OK);
    assert_float_equal(f[0], log(0.125), 1e-6);
    hr_tensor_free(out);
    int32_t iv[4] = {1, -2, 3, 4};
    int64_t got[4];
    hr_tensor *xi = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_I32, 1, (int64_t[]){4}, iv, sizeof iv, &xi), HR_OK);
    assert_int_equal(hr_cumsum(xi, 0, &out), HR_OK);
    assert_int_equal(hr_tensor_dtype(out), HR_I64); /* torch: integer cumsum is i64 */
    assert_int_equal(hr_tensor_read(out, got, sizeof got), HR_OK);
    assert_true(got[0] == 1 && got[1] == -1 && got[2] == 2 && got[3] == 6);
    hr_tensor_free(out);
    hr_tensor_free(xi);
    hr_tensor_free(x);
}

/* Runs sum/argmax/softmax/cumsum on [rows, n] over dim `dim` and returns
 * the concatenated raw results. */
static void run_suite(hr_tensor *x, int64_t dim, float *sum, int64_t *arg, float *soft, float *cum, size_t npos,
                      size_t nall) {
    hr_tensor *o = NULL;
    assert_int_equal(hr_sum(x, dim, false, &o), HR_OK);
    assert_int_equal(hr_tensor_read(o, sum, npos * 4), HR_OK);
    hr_tensor_free(o);
    assert_int_equal(hr_argmax(x, dim, false, &o), HR_OK);
    assert_int_equal(hr_tensor_read(o, arg, npos * 8), HR_OK);
    hr_tensor_free(o);
    assert_int_equal(hr_softmax(x, dim, &o), HR_OK);
    assert_int_equal(hr_tensor_read(o, soft, nall * 4), HR_OK);
    hr_tensor_free(o);
    assert_int_equal(hr_cumsum(x, dim, &o), HR_OK);
    assert_int_equal(hr_tensor_read(o, cum, nall * 4), HR_OK);
    hr_tensor_free(o);
}

typedef struct {
    hr_tensor *x;
    int64_t dim;
    float *sum, *soft, *cum;
    int64_t *arg;
    size_t npos, nall;
} suite_ctx;

/* Thread 0 of a region runs the suite; kernels called inside a region
 * run on one thread (hr_parallel_run does not nest). */
static void suite_serial(void *arg, int ith, int nth) {
    suite_ctx *c = arg;
    if (ith == 0) run_suite(c->x, c->dim, c->sum, c->arg, c->soft, c->cum, c->npos, c->nall);
}

static void test_same_results_for_any_thread_count(void **state) {
    /* [2, 70000] over dim 1: 2 rows on the pool splits positions; over
     * dim 0 the column layout runs. Results must not depend on either. */
    const int64_t rows = 2, n = 70000, all = rows * n;
    float *v = malloc(sizeof(float) * (size_t)all);
    for (int64_t i = 0; i < all; i++) v[i] = (float)((i * 7919) % 1013) / 101.0f - 5.0f;
    hr_tensor *x = test_from_f32(2, (int64_t[]){rows, n}, v);
    for (int dim = 0; dim < 2; dim++) {
        suite_ctx c[2];
        for (int t = 0; t < 2; t++) {
            c[t] = (suite_ctx){.x = x, .dim = dim, .npos = (size_t)(dim ? rows : n), .nall = (size_t)all};
            c[t].sum = malloc(c[t].npos * 4);
            c[t].arg = malloc(c[t].npos * 8);
            c[t].soft = malloc(c[t].nall * 4);
            c[t].cum = malloc(c[t].nall * 4);
        }
        run_suite(x, dim, c[0].sum, c[0].arg, c[0].soft, c[0].cum, c[0].npos, c[0].nall);
        hr_parallel_run(suite_serial, &c[1], 2);
        assert_memory_equal(c[0].sum, c[1].sum, c[0].npos * 4);
        assert_memory_equal(c[0].arg, c[1].arg, c[0].npos * 8);
        assert_memory_equal(c[0].soft, c[1].soft, c[0].nall * 4);
        assert_memory_equal(c[0].cum, c[1].cum, c[0].nall * 4);
        for (int t = 0; t < 2; t++) {
            free(c[t].sum);
            free(c[t].arg);
            free(c[t].soft);
            free(c[t].cum);
        }
    }
    hr_tensor_free(x);
    free(v);
}

static void test_size_zero_dims(void **state) {
    hr_tensor *x = NULL, *out = NULL, *vals = NULL, *idx = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, HR_F32, 2, (int64_t[]){0, 5}, &x), HR_OK);
    assert_int_equal(hr_softmax(x, 1, &out), HR_OK);
    assert_int_equal(hr_tensor_numel(out), 0);
    hr_tensor_free(out);
    float f[5];
    assert_int_equal(hr_sum(x, 0, false, &out), HR_OK); /* sum over nothing */
    assert_int_equal(hr_tensor_read(out, f, sizeof f), HR_OK);
    for (int i = 0; i < 5; i++) assert_true(f[i] == 0);
    hr_tensor_free(out);
    assert_int_equal(hr_topk(x, 0, 1, true, &vals, &idx), HR_OK);
    hr_tensor_free(vals);
    hr_tensor_free(idx);
    expect_error(hr_argmax(x, 0, false, &out), HR_ERR_SHAPE, "empty along dim 0");
    assert_null(out);
    hr_tensor_free(x);
}

static void test_norms_and_rope_values(void **state) {
    const float v[4] = {1, 1, 1, 1}, w[4] = {1, 2, 3, 4};
    hr_tensor *x = test_from_f32(1, (int64_t[]){4}, v), *wt = test_from_f32(1, (int64_t[]){4}, w), *out = NULL;
    float f[8];
    assert_int_equal(hr_rms_norm(x, wt, 0.0, 1.0, &out), HR_OK); /* Gemma: (1 + w) */
    assert_int_equal(hr_tensor_read(out, f, 16), HR_OK);
    for (int i = 0; i < 4; i++) assert_true(f[i] == 1 + w[i]);
    hr_tensor_free(out);
    assert_int_equal(hr_layer_norm(wt, NULL, NULL, 0.0, &out), HR_OK);
    assert_int_equal(hr_tensor_read(out, f, 16), HR_OK);
    assert_float_equal(f[0], -1.5 / sqrt(1.25), 1e-6);
    hr_tensor_free(out);
    /* positions [2] x inv_freq [2] -> cos/sin [2, 4]; rope of x [2, 4] */
    int64_t pos[2] = {0, 3};
    const float inv[2] = {1.0f, 0.5f};
    hr_tensor *p = NULL, *it = test_from_f32(1, (int64_t[]){2}, inv), *c = NULL, *s = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_I64, 1, (int64_t[]){2}, pos, sizeof pos, &p), HR_OK);
    assert_int_equal(hr_rope_cos_sin(p, it, 2.0, HR_F32, &c, &s), HR_OK);
    assert_int_equal(hr_tensor_read(c, f, 32), HR_OK);
    assert_true(f[0] == 2 && f[2] == 2);                     /* position 0, scaled by 2 */
    assert_float_equal(f[5], 2 * cos(1.5), 1e-6);             /* position 3, freq 0.5 */
    assert_true(f[5] == f[7]);                                /* cat(freqs, freqs) */
    const float xv[8] = {1, 0, 0, 0, 1, 0, 0, 0};
    hr_tensor *q = test_from_f32(2, (int64_t[]){2, 4}, xv);
    assert_int_equal(hr_rope(q, c, s, &out), HR_OK);
    assert_int_equal(hr_tensor_read(out, f, 32), HR_OK);
    assert_float_equal(f[4], 2 * cos(3.0), 1e-6); /* x1 * cos */
    assert_float_equal(f[6], 2 * sin(3.0), 1e-6); /* x1 * sin lands on the second half */
    hr_tensor_free(out);
    hr_tensor *ps[] = {p, it, c, s, q, x, wt};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) hr_tensor_free(ps[i]);
}

static void test_rope_inv_freq_formulas(void **state) {
    bool ok;
    assert_int_equal(hr_rope_type_parse("llama3", &ok), HR_ROPE_LLAMA3);
    assert_true(ok);
    hr_rope_type_parse("su", &ok);
    assert_false(ok);
    hr_rope_config c = {.type = HR_ROPE_DEFAULT, .theta = 10000, .rotary_dim = 4, .max_position_embeddings = 64};
    float inv[4];
    double sc;
    assert_int_equal(hr_rope_inv_freq(&c, 1, inv, &sc), HR_OK);
    assert_true(inv[0] == 1.0f && inv[1] == 0.01f && sc == 1.0);
    c.type = HR_ROPE_LINEAR;
    c.factor = 4;
    assert_int_equal(hr_rope_inv_freq(&c, 1, inv, &sc), HR_OK);
    assert_true(inv[0] == 0.25f && inv[1] == 0.0025f);
    /* dynamic: unchanged up to max_position_embeddings, then theta grows */
    c.type = HR_ROPE_DYNAMIC;
    c.factor = 2;
    assert_int_equal(hr_rope_inv_freq(&c, 64, inv, &sc), HR_OK);
    assert_true(inv[1] == 0.01f);
    assert_int_equal(hr_rope_inv_freq(&c, 128, inv, &sc), HR_OK);
    assert_float_equal(inv[1], 1.0 / 300, 1e-9); /* theta 10000 * (2*128/64 - 1)^(4/2), ^-1/2 */
    /* llama3: the fastest frequency is left alone, the slowest divided */
    hr_rope_config l3 = {.type = HR_ROPE_LLAMA3, .theta = 500000, .rotary_dim = 64, .factor = 8,
                         .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position_embeddings = 8192};
    float f3[32];
    assert_int_equal(hr_rope_inv_freq(&l3, 1, f3, &sc), HR_OK);
    assert_true(f3[0] == 1.0f);
    assert_float_equal(f3[31], (float)(1.0 / pow(500000.0, 62.0 / 64)) / 8, 1e-12);
    /* yarn's default attention factor */
    hr_rope_config y = {.type = HR_ROPE_YARN, .theta = 10000, .rotary_dim = 64, .factor = 4,
                        .original_max_position_embeddings = 1024};
    assert_int_equal(hr_rope_inv_freq(&y, 1, f3, &sc), HR_OK);
    assert_float_equal(sc, 0.1 * log(4.0) + 1, 1e-15);
    /* longrope picks long factors past the original length */
    double sf[2] = {1, 1}, lf[2] = {2, 4};
    hr_rope_config lr = {.type = HR_ROPE_LONGROPE, .theta = 10000, .rotary_dim = 4, .factor = 4,
                         .original_max_position_embeddings = 100, .short_factor = sf, .long_factor = lf};
    assert_int_equal(hr_rope_inv_freq(&lr, 100, inv, &sc), HR_OK);
    assert_true(inv[1] == 0.01f);
    assert_int_equal(hr_rope_inv_freq(&lr, 101, inv, &sc), HR_OK);
    assert_true(inv[0] == 0.5f && inv[1] == 0.0025f);
    assert_float_equal(sc, sqrt(1 + log(4.0) / log(100.0)), 1e-15);
    expect_error(hr_rope_inv_freq(&lr, 1, inv, NULL), HR_ERR_INVALID_ARG, "must not be NULL");
    lr.rotary_dim = 3;
    expect_error(hr_rope_inv_freq(&lr, 1, inv, &sc), HR_ERR_INVALID_ARG, "rope (longrope): rotary_dim must be even");
}

static void test_errors(void **state) {
    hr_tensor *x = NULL, *out = NULL, *v = NULL, *i = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, HR_F32, 2, (int64_t[]){2, 3}, &x), HR_OK);
    expect_error(hr_sum(x, -3, false, &out), HR_ERR_INVALID_ARG, "op 'sum': x: dim -3 out of range");
    expect_error(hr_topk(x, -1, 1, true, &v, &i), HR_ERR_INVALID_ARG, "op 'topk': k=-1 is out of range");
    assert_null(v);
    expect_error(hr_op_run(HR_OP_softmax, NULL, (const hr_tensor *const[]){x}, 1, &out, 1), HR_ERR_INVALID_ARG,
                 "attrs are NULL");
    hr_tensor_free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce_values),
        cmocka_unit_test(test_softmax_and_cumsum_values),
        cmocka_unit_test(test_same_results_for_any_thread_count),
        cmocka_unit_test(test_size_zero_dims),
        cmocka_unit_test(test_norms_and_rope_values),
        cmocka_unit_test(test_rope_inv_freq_formulas),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
