/* Logits processors and token choice (src/generate/sampling.c): the PRNG
 * is reproducible, greedy is argmax, and each processor keeps exactly the
 * tokens transformers keeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "generate/sampling.h"
#include "hubrt.h"

#define V 8

static hr_sampler make(bool sample, double temp, int64_t top_k, double top_p, double min_p, double rep,
                       uint64_t seed) {
    hr_generate_config cfg;
    hr_generate_config_init(&cfg);
    cfg.do_sample = sample;
    cfg.temperature = temp;
    cfg.top_k = top_k;
    cfg.top_p = top_p;
    cfg.min_p = min_p;
    cfg.repetition_penalty = rep;
    cfg.seed = seed;
    hr_sampler s;
    assert_int_equal(hr_sampler_init(&s, &cfg, V), HR_OK);
    return s;
}

/* Counts how often each id is drawn from `logits` over n draws. */
static void histogram(hr_sampler *s, const float *logits, int n, int *counts) {
    memset(counts, 0, sizeof(int) * V);
    for (int i = 0; i < n; i++) {
        float row[V];
        memcpy(row, logits, sizeof row);
        int64_t id = hr_sampler_pick(s, row, NULL, 0);
        assert_true(id >= 0 && id < V);
        counts[id]++;
    }
}

static void test_rng_reproducible(void **state) {
    hr_rng a, b, c;
    hr_rng_seed(&a, 42);
    hr_rng_seed(&b, 42);
    hr_rng_seed(&c, 43);
    int same_c = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = hr_rng_next(&a);
        assert_true(x == hr_rng_next(&b));
        same_c += x == hr_rng_next(&c);
    }
    assert_int_equal(same_c, 0);
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = hr_rng_uniform(&a);
        assert_true(u >= 0 && u < 1);
        sum += u;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.01);
}

static void test_greedy_is_first_argmax(void **state) {
    hr_sampler s = make(false, 1, 0, 1, 0, 1, 0);
    float row[V] = {0, 3, 1, 3, -1, 2, 0, 0};
    assert_int_equal(hr_sampler_pick(&s, row, NULL, 0), 1);
    hr_sampler_free(&s);
}

/* The scan greedy picking is defined by: the first strictly greater value. */
static int64_t scan_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy over long rows (the vector passes and their tails): random values
 * with ties, NaNs, infinities and signed zeros planted, against the scan. */
static void test_greedy_long_rows(void **state) {
    enum { N = 1003 };
    static float row[N];
    hr_rng rng;
    hr_rng_seed(&rng, 11);
    hr_generate_config cfg;
    hr_generate_config_init(&cfg);
    cfg.do_sample = false;
    for (int trial = 0; trial < 400; trial++) {
        int64_t n = 1 + (int64_t)(hr_rng_uniform(&rng) * N);
        for (int64_t i = 0; i < n; i++) row[i] = (float)(int)(hr_rng_uniform(&rng) * 50) - 25.0f;
        int kind = trial % 6;
        int64_t at = (int64_t)(hr_rng_uniform(&rng) * n);
        if (kind == 1) /* NaNs in every lane of the vector passes, the last vector too */
            for (int64_t i = at % 7 + 1; i < n; i += 7) row[i] = NAN;
        if (kind == 2) row[0] = NAN;
        if (kind == 3) row[at] = INFINITY;
        if (kind == 4)
            for (int64_t i = 0; i < n; i++) row[i] = i % 2 ? 0.0f : -0.0f;
        if (kind == 5)
            for (int64_t i = 0; i < n; i++) row[i] = -INFINITY;
        int64_t want = scan_argmax(row, n);
        hr_sampler s;
        assert_int_equal(hr_sampler_init(&s, &cfg, n), HR_OK);
        assert_true(hr_sampler_is_argmax(&s));
        assert_int_equal(hr_sampler_argmax(row, HR_F32, n), want);
        assert_int_equal(hr_sampler_pick(&s, row, NULL, 0), want);
        hr_sampler_free(&s);
        /* the same row in bf16 and f16 (its values are exact in both), read
         * as it is, against the scan over it widened */
        static uint16_t bf[N], hf[N];
        static float wb[N], wh[N];
        for (int64_t i = 0; i < n; i++) {
            bf[i] = hr_f32_to_bf16(row[i]), wb[i] = hr_bf16_to_f32(bf[i]);
            hf[i] = hr_f32_to_f16(row[i]), wh[i] = hr_f16_to_f32(hf[i]);
        }
        assert_int_equal(hr_sampler_argmax(bf, HR_BF16, n), scan_argmax(wb, n));
        assert_int_equal(hr_sampler_argmax(hf, HR_F16, n), scan_argmax(wh, n));
    }
}

/* Values apart in the last bit of bf16 or f16 (a widening that dropped or
 * moved bits would tie them or reorder them). */
static void test_greedy_low_precision_bits(void **state) {
    enum { N = 37 };
    uint16_t bf[N], hf[N];
    for (int pos = 0; pos < N; pos++) {
        for (int i = 0; i < N; i++) bf[i] = 0x3f80, hf[i] = 0x3c00; /* 1.0 */
        bf[pos] = 0x3f81, hf[pos] = 0x3c01;                          /* 1.0 + one ulp */
        assert_int_equal(hr_sampler_argmax(bf, HR_BF16, N), pos);
        assert_int_equal(hr_sampler_argmax(hf, HR_F16, N), pos);
        for (int i = 0; i < N; i++) bf[i] = 0x8001, hf[i] = 0x8001; /* the least negative subnormal */
        bf[pos] = 0x0001, hf[pos] = 0x0001;
        assert_int_equal(hr_sampler_argmax(bf, HR_BF16, N), pos);
        assert_int_equal(hr_sampler_argmax(hf, HR_F16, N), pos);
    }
}

static void test_processors_are_not_argmax(void **state) {
    hr_sampler s = make(false, 1, 0, 1, 0, 1.5, 0);
    assert_false(hr_sampler_is_argmax(&s));
    hr_sampler_free(&s);
    s = make(true, 1, 0, 1, 0, 1, 0);
    assert_false(hr_sampler_is_argmax(&s));
    hr_sampler_free(&s);
}

/* transformers: positive logits divided by the penalty, negative ones
 * multiplied, each seen token once. */
static void test_repetition_penalty(void **state) {
    hr_sampler s = make(false, 1, 0, 1, 0, 2.0, 0);
    float row[V] = {4, 3.9f, -1, 0, 0, 0, 0, 3.5f};
    int64_t hist[] = {0, 0, 2};
    /* 4 / 2 = 2 < 3.9: token 1 wins; -1 * 2 = -2 */
    assert_int_equal(hr_sampler_pick(&s, row, hist, 3), 1);
    assert_true(row[0] == 2.0f);
    assert_true(row[2] == -2.0f);
    hr_sampler_free(&s);
}

static void test_top_k_keeps_k_best(void **state) {
    float logits[V] = {1, 5, 2, 4, 0, 3, -1, 4.5f};
    hr_sampler s = make(true, 1, 3, 1, 0, 1, 7);
    int counts[V];
    histogram(&s, logits, 3000, counts);
    for (int i = 0; i < V; i++) assert_true((counts[i] > 0) == (i == 1 || i == 3 || i == 7));
    hr_sampler_free(&s);
}

static void test_top_k_keeps_ties(void **state) {
    float logits[V] = {1, 2, 2, 2, 0, 0, 0, 0};
    hr_sampler s = make(true, 1, 2, 1, 0, 1, 7);
    int counts[V];
    histogram(&s, logits, 3000, counts);
    assert_true(counts[1] > 0 && counts[2] > 0 && counts[3] > 0);
    assert_int_equal(counts[0], 0);
    hr_sampler_free(&s);
}

/* probs 0.5, 0.25, 0.125, ...: top_p 0.7 keeps the two best (cumulative
 * ascending mass of the rest is 0.25 <= 0.3). */
static void test_top_p(void **state) {
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)(-i * log(2.0));
    hr_sampler s = make(true, 1, 0, 0.7, 0, 1, 9);
    int counts[V];
    histogram(&s, logits, 6000, counts);
    for (int i = 0; i < V; i++) assert_true((counts[i] > 0) == (i < 2));
    /* the kept mass is renormalised: 2/3 vs 1/3 */
    assert_true(fabs(counts[0] / 6000.0 - 2.0 / 3.0) < 0.03);
    hr_sampler_free(&s);
}

/* min_p 0.2: tokens below 0.2 * p_max are dropped (0.5 -> floor 0.1). */
static void test_min_p(void **state) {
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)(-i * log(2.0));
    hr_sampler s = make(true, 1, 0, 1, 0.2, 1, 11);
    int counts[V];
    histogram(&s, logits, 6000, counts);
    for (int i = 0; i < V; i++) assert_true((counts[i] > 0) == (i < 3));
    hr_sampler_free(&s);
}

/* A low temperature concentrates the draws on the best token. */
static void test_temperature(void **state) {
    float logits[V] = {1, 2, 0, 0, 0, 0, 0, 0};
    hr_sampler hot = make(true, 1.0, 0, 1, 0, 1, 5), cold = make(true, 0.1, 0, 1, 0, 1, 5);
    int ch[V], cc[V];
    histogram(&hot, logits, 4000, ch);
    histogram(&cold, logits, 4000, cc);
    assert_true(cc[1] > 3900);
    assert_true(ch[1] < 3000 && ch[1] > 1500);
    hr_sampler_free(&hot);
    hr_sampler_free(&cold);
}

static void test_seeded_draws_repeat(void **state) {
    float logits[V] = {1, 1, 1, 1, 1, 1, 1, 1};
    hr_sampler a = make(true, 1, 0, 1, 0, 1, 123), b = make(true, 1, 0, 1, 0, 1, 123);
    for (int i = 0; i < 200; i++) {
        float ra[V], rb[V];
        memcpy(ra, logits, sizeof ra);
        memcpy(rb, logits, sizeof rb);
        assert_int_equal(hr_sampler_pick(&a, ra, NULL, 0), hr_sampler_pick(&b, rb, NULL, 0));
    }
    hr_sampler_free(&a);
    hr_sampler_free(&b);
}

static void test_bad_parameters_refused(void **state) {
    hr_generate_config cfg;
    hr_generate_config_init(&cfg);
    cfg.top_p = 1.5;
    hr_sampler s;
    assert_int_equal(hr_sampler_init(&s, &cfg, V), HR_ERR_INVALID_ARG);
    assert_non_null(strstr(hr_last_error(), "top_p"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_reproducible),   cmocka_unit_test(test_greedy_is_first_argmax),
        cmocka_unit_test(test_greedy_low_precision_bits), cmocka_unit_test(test_processors_are_not_argmax),
        cmocka_unit_test(test_greedy_long_rows),
        cmocka_unit_test(test_repetition_penalty), cmocka_unit_test(test_top_k_keeps_k_best),
        cmocka_unit_test(test_top_k_keeps_ties),   cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),              cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_seeded_draws_repeat), cmocka_unit_test(test_bad_parameters_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
