/* GEMM/GEMV kernel paths against the portable reference, and matmul,
 * linear and sdpa through the public API. Data are small integers, so
 * every product and partial sum is exact in f32 and the paths must agree
 * bit for bit whatever their summation order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/simd_math.h"
#include "core/half.h"
#include "hubrt.h"

static float small_int(uint32_t *seed) {
    *seed = *seed * 1664525u + 1013904223u;
    return (float)((int)(*seed >> 24) % 7 - 3);
}

static void fill_ints(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) x[i] = small_int(&seed);
}

static void test_ukr_avx2_matches_scalar(void **state) {
    enum { KC = 37, MR = HR_GEMM_F32_MR, NR = HR_GEMM_F32_NR, LDC = NR + 3 };
    float a[KC * MR], b[KC * NR], c0[MR * LDC], c1[MR * LDC];
    fill_ints(a, KC * MR, 1);
    fill_ints(b, KC * NR, 2);
    for (int acc = 0; acc < 2; acc++) {
        fill_ints(c0, MR * LDC, 3);
        memcpy(c1, c0, sizeof c0);
        hr_gemm_ukr_f32_scalar(KC, a, b, c0, LDC, acc);
        hr_gemm_ukr_f32_avx2(KC, a, b, c1, LDC, acc);
        assert_memory_equal(c0, c1, sizeof c0);
    }
}

static void test_ukr_bf16_pairs(void **state) {
    if (!hr_gemm_use_avx512_bf16()) skip();
    enum { KP = 19, MR = HR_GEMM_BF16_MR, NR = HR_GEMM_BF16_NR, LDC = NR + 5 };
    float af[KP * MR * 2], bf[KP * NR * 2], c[MR * LDC], ref[MR * LDC];
    uint32_t ap[KP * MR];
    uint16_t bp[KP * NR * 2];
    fill_ints(af, KP * MR * 2, 4);
    fill_ints(bf, KP * NR * 2, 5);
    for (int i = 0; i < KP * MR; i++)
        ap[i] = hr_f32_to_bf16(af[2 * i]) | (uint32_t)hr_f32_to_bf16(af[2 * i + 1]) << 16;
    for (int i = 0; i < KP * NR * 2; i++) bp[i] = hr_f32_to_bf16(bf[i]);
    fill_ints(c, MR * LDC, 6);
    memcpy(ref, c, sizeof c);
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            for (int p = 0; p < KP; p++)
                for (int e = 0; e < 2; e++) ref[i * LDC + j] += af[(p * MR + i) * 2 + e] * bf[(p * NR + j) * 2 + e];
    hr_gemm_ukr_bf16_avx512(KP, ap, bp, c, LDC, true);
    assert_memory_equal(c, ref, sizeof c);
}

/* Every GEMV variant (rows 1..4, 1..4 weight rows, K with and without a
 * vector tail, each weight dtype) equals the scalar one. */
static void test_gemv_paths(void **state) {
    static const int64_t ks[] = {1, 7, 8, 33, 4097};
    static const hr_dtype dts[] = {HR_F32, HR_BF16, HR_F16};
    bool bf16_ok = hr_gemm_use_avx512_bf16();
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
        int64_t k = ks[ki], ldw = k + 2;
        float *x = malloc(sizeof(float) * 4 * k), *wf = malloc(sizeof(float) * 4 * ldw);
        uint16_t *xh = malloc(2 * 4 * k), *wh = malloc(2 * 4 * ldw);
        fill_ints(x, 4 * k, 7);
        fill_ints(wf, 4 * ldw, 8);
        for (int64_t i = 0; i < 4 * k; i++) xh[i] = hr_f32_to_bf16(x[i]);
        for (size_t di = 0; di < 3; di++) {
            hr_dtype dt = dts[di];
            for (int64_t i = 0; i < 4 * ldw; i++) wh[i] = dt == HR_F16 ? hr_f32_to_f16(wf[i]) : hr_f32_to_bf16(wf[i]);
            const void *w = dt == HR_F32 ? (const void *)wf : wh;
            for (int rows = 1; rows <= 4; rows++)
                for (int nw = 1; nw <= 4; nw++) {
                    float y0[4 * 4] = {0}, y1[4 * 4] = {0}, y2[4 * 4] = {0};
                    hr_gemv_scalar(k, rows, x, w, dt, ldw, nw, y0, 4);
                    hr_gemv_avx2(k, rows, x, w, dt, ldw, nw, y1, 4);
                    assert_memory_equal(y0, y1, sizeof y0);
                    if (bf16_ok && dt == HR_BF16) {
                        hr_gemv_bf16_avx512(k, rows, xh, w, dt, ldw, nw, y2, 4);
                        assert_memory_equal(y0, y2, sizeof y0);
                    }
                }
        }
        free(x), free(wf), free(xh), free(wh);
    }
}

/* A tensor of small integers in dt (vals receives them as f32). */
static hr_tensor *ints_tensor(hr_dtype dt, int ndim, const int64_t *shape, uint32_t seed, float *vals) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    fill_ints(vals, (size_t)n, seed);
    hr_tensor *t = NULL;
    if (dt == HR_F32) {
        assert_int_equal(hr_tensor_from_host(NULL, dt, ndim, shape, vals, sizeof(float) * (size_t)n, &t), HR_OK);
        return t;
    }
    uint16_t *h = malloc(2 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) h[i] = hr_f32_to_bf16(vals[i]);
    assert_int_equal(hr_tensor_from_host(NULL, dt, ndim, shape, h, 2 * (size_t)n, &t), HR_OK);
    free(h);
    return t;
}

/* n elements of a contiguous f32 or bf16 tensor, as f32. */
static void read_f32(const hr_tensor *t, float *dst, int64_t n) {
    if (hr_tensor_dtype(t) == HR_F32) {
        assert_int_equal(hr_tensor_read(t, dst, sizeof(float) * (size_t)n), HR_OK);
        return;
    }
    uint16_t *h = malloc(2 * (size_t)n);
    assert_int_equal(hr_tensor_read(t, h, 2 * (size_t)n), HR_OK);
    for (int64_t i = 0; i < n; i++) dst[i] = hr_bf16_to_f32(h[i]);
    free(h);
}

/* linear over shapes that cross the tile sizes (K past one K block, M past
 * one M tile, N past one N tile) under every ISA the CPU has; exact. */
static void test_linear_exact_all_isas(void **state) {
    static const int64_t shapes[][3] = {{5, 7, 300}, {97, 33, 5}, {2, 300, 17}, {130, 260, 1}, {1, 5, 4097},
                                        {20, 40, 777}, {200, 41, 777}, {64, 100, 8191}, {300, 70, 4097}};
    hr_cpu_isa saved = hr_cpu_isa_get();
    for (int isa = HR_ISA_SCALAR; isa <= (int)saved && isa <= HR_ISA_AVX512; isa++) {
        assert_int_equal(hr_cpu_isa_set((hr_cpu_isa)isa), HR_OK);
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
            float *xv = malloc(sizeof(float) * m * k), *wv = malloc(sizeof(float) * n * k);
            float *bv = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * m * n);
            for (int di = 0; di < 2; di++) {
                hr_dtype dt = di ? HR_BF16 : HR_F32;
                hr_tensor *x = ints_tensor(dt, 2, (int64_t[]){m, k}, 11, xv);
                hr_tensor *w = ints_tensor(dt, 2, (int64_t[]){n, k}, 12, wv);
                hr_tensor *b = ints_tensor(dt, 1, (int64_t[]){n}, 13, bv);
                hr_tensor *y = NULL;
                assert_int_equal(hr_linear(x, w, b, &y), HR_OK);
                read_f32(y, got, m * n);
                int bad = 0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double s = bv[j];
                        for (int64_t p = 0; p < k; p++) s += (double)xv[i * k + p] * wv[j * k + p];
                        /* bf16 keeps integers up to 256 exactly; compare what it can hold */
                        double want = dt == HR_BF16 ? hr_bf16_to_f32(hr_f32_to_bf16((float)s)) : s;
                        bad += got[i * n + j] != (float)want;
                    }
                if (bad) print_error("linear %lldx%lldx%lld %s isa %d: %d wrong\n", (long long)m, (long long)n,
                                     (long long)k, hr_dtype_name(dt), isa, bad);
                assert_int_equal(bad, 0);
                hr_tensor_free(x), hr_tensor_free(w), hr_tensor_free(b), hr_tensor_free(y);
            }
            free(xv), free(wv), free(bv), free(got);
        }
    }
    assert_int_equal(hr_cpu_isa_set(saved), HR_OK);
}

/* The GEMM epilogues' inline bf16 store against hr_f32_to_bf16: ties to
 * even, NaNs (quiet and signalling), infinities, subnormals, random bits,
 * with and without a bias, every length up to 40 (the masked tail). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void store_rows_check(void) {
    enum { N = 40 };
    float src[N], bias[N];
    uint16_t got[N + 1];
    static const uint32_t special[] = {0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x7f800000u, 0xff800000u,
                                       0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                       0x7f7fffffu, 0x00000000u, 0x80000000u};
    uint32_t seed = 7;
    for (int trial = 0; trial < 50; trial++) {
        for (int i = 0; i < N; i++) {
            seed = seed * 1664525u + 1013904223u;
            uint32_t u = trial % 2 ? special[(seed >> 8) % (sizeof special / sizeof *special)] : seed;
            memcpy(&src[i], &u, 4);
            bias[i] = (float)((int)(seed >> 28) - 8) * 0.25f;
        }
        for (int n = 1; n <= N; n++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                got[n] = 0xabcd;
                hr_bf16_row_store_avx512(got, src, with_bias ? bias : NULL, n);
                for (int i = 0; i < n; i++) /* no bias: no "+ 0", which would turn -0 into +0 */
                    assert_int_equal(got[i], hr_f32_to_bf16(with_bias ? src[i] + bias[i] : src[i]));
                assert_int_equal(got[n], 0xabcd); /* nothing past n written */
            }
    }
}

static void test_store_bf16_rows(void **state) {
    const hr_cpu_features *f = hr_cpu_features_get();
    if (!f->avx512f || !f->avx512bw || !f->avx512vl) skip();
    store_rows_check();
}

static void test_linear_zero_k_gives_bias(void **state) {
    float xv[1] = {0}, wv[1] = {0}, bv[4], got[12];
    hr_tensor *x = ints_tensor(HR_F32, 2, (int64_t[]){3, 0}, 1, xv);
    hr_tensor *w = ints_tensor(HR_F32, 2, (int64_t[]){4, 0}, 2, wv);
    hr_tensor *b = ints_tensor(HR_F32, 1, (int64_t[]){4}, 3, bv);
    hr_tensor *y = NULL;
    assert_int_equal(hr_linear(x, w, b, &y), HR_OK);
    read_f32(y, got, 12);
    for (int i = 0; i < 12; i++) assert_true(got[i] == bv[i % 4]);
    hr_tensor_free(x), hr_tensor_free(w), hr_tensor_free(b), hr_tensor_free(y);
}

/* With q = 0 every allowed key weighs the same: causal row i is the mean
 * of v[0..i] (s == t), and a window of 2 the mean of the last two. */
static void test_sdpa_uniform_weights(void **state) {
    enum { T = 70, DV = 3 };
    float qv[T * 4] = {0}, kv[T * 4], vv[T * DV], got[T * DV];
    hr_tensor *q = NULL, *k = ints_tensor(HR_F32, 4, (int64_t[]){1, 1, T, 4}, 21, kv);
    hr_tensor *v = ints_tensor(HR_F32, 4, (int64_t[]){1, 1, T, DV}, 22, vv);
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, 4, (int64_t[]){1, 1, T, 4}, qv, sizeof qv, &q), HR_OK);
    for (int window = 0; window <= 2; window += 2) {
        hr_attrs_sdpa a = {.is_causal = true, .window = window};
        hr_tensor *o = NULL;
        assert_int_equal(hr_sdpa(q, k, v, NULL, &a, &o), HR_OK);
        read_f32(o, got, T * DV);
        for (int i = 0; i < T; i++)
            for (int e = 0; e < DV; e++) {
                int lo = window && i - window + 1 > 0 ? i - window + 1 : 0;
                double s = 0;
                for (int j = lo; j <= i; j++) s += vv[j * DV + e];
                assert_float_equal(got[i * DV + e], s / (i - lo + 1), 1e-5);
            }
        hr_tensor_free(o);
    }
    hr_tensor_free(q), hr_tensor_free(k), hr_tensor_free(v);
}

static void test_errors_name_op_and_input(void **state) {
    float buf[64];
    hr_tensor *x = ints_tensor(HR_F32, 2, (int64_t[]){2, 8}, 1, buf);
    hr_tensor *w = ints_tensor(HR_F32, 2, (int64_t[]){4, 9}, 2, buf);
    hr_tensor *y = NULL;
    assert_int_equal(hr_linear(x, w, NULL, &y), HR_ERR_SHAPE);
    assert_non_null(strstr(hr_last_error(), "op 'linear'"));
    assert_non_null(strstr(hr_last_error(), "weight"));
    assert_int_equal(hr_matmul(x, x, &y), HR_ERR_SHAPE);
    assert_non_null(strstr(hr_last_error(), "op 'matmul'"));
    hr_attrs_sdpa a = {0};
    assert_int_equal(hr_sdpa(x, x, x, NULL, &a, &y), HR_ERR_SHAPE);
    assert_non_null(strstr(hr_last_error(), "input 0 (q)"));
    assert_null(y);
    hr_tensor_free(x), hr_tensor_free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ukr_avx2_matches_scalar),
        cmocka_unit_test(test_ukr_bf16_pairs),
        cmocka_unit_test(test_gemv_paths),
        cmocka_unit_test(test_linear_exact_all_isas),
        cmocka_unit_test(test_store_bf16_rows),
        cmocka_unit_test(test_linear_zero_k_gives_bias),
        cmocka_unit_test(test_sdpa_uniform_weights),
        cmocka_unit_test(test_errors_name_op_and_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
