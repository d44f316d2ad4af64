/* Linear weights packed into panels (hr_linear_pack, as the model loader
 * packs them): linear and embedding read the packed copy, exactly; a row's
 * result has the same bits at any row count; a write through an op drops
 * the copy; machines or ISA settings without the kernels read the weight
 * itself. bf16 weights under every ISA setting the CPU has, and f16 ones
 * under AVX2 (the one kernel with f16 panels; a higher setting reads the
 * weight itself). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "hubrt.h"

/* Panels are made and read from AVX2 on (the AVX2, AVX-512 and AMX
 * kernels share them). */
static bool have_kernels(void) {
    const hr_cpu_features *f = hr_cpu_features_get();
    return f->avx2 && f->fma && hr_cpu_isa_get() >= HR_ISA_AVX2;
}

static uint32_t next(uint32_t *seed) { return *seed = *seed * 1664525u + 1013904223u; }

/* The 16-bit float type of the group running: the tensors below, weights
 * and activations alike, are of it. */
static hr_dtype g_dt = HR_BF16;

static uint16_t to_half(float v) { return g_dt == HR_F16 ? hr_f32_to_f16(v) : hr_f32_to_bf16(v); }
static float from_half(uint16_t h) { return g_dt == HR_F16 ? hr_f16_to_f32(h) : hr_bf16_to_f32(h); }

/* g_dt tensor [ndim shape] of small integers (every product and sum below
 * is exact in f32) or, when `wide`, of values with full mantissas; their
 * values as f32 in vals when not NULL. */
static hr_tensor *half_tensor(int ndim, const int64_t *shape, uint32_t seed, bool wide, float *vals) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    uint16_t *h = malloc(2 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        float v = wide ? (float)((int32_t)next(&seed) >> 8) / 8388608.0f : (float)((int)(next(&seed) >> 24) % 7 - 3);
        h[i] = to_half(v);
        if (vals) vals[i] = from_half(h[i]);
    }
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, g_dt, ndim, shape, h, 2 * (size_t)n, &t), HR_OK);
    free(h);
    return t;
}

static uint16_t *read_half(const hr_tensor *t) {
    size_t n = (size_t)hr_tensor_numel(t);
    uint16_t *h = malloc(2 * (n ? n : 1));
    assert_int_equal(hr_tensor_read(t, h, 2 * n), HR_OK);
    return h;
}

static hr_tensor *packed_copy_of(const hr_tensor *w) {
    hr_tensor *p = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, g_dt, 2, hr_tensor_shape(w), hr_tensor_data(w),
                                         hr_tensor_nbytes(w), &p),
                     HR_OK);
    bool packed = false;
    assert_int_equal(hr_linear_pack(p, &packed), HR_OK);
    assert_true(packed);
    return p;
}

/* Odd shapes around the panel (64 weight rows), the tile (6 rows of x), odd
 * K, the AVX2 route's widened form (from 16 rows; 17 leaves a group of
 * five) and its passes of 512 rows: packed linear + bias equals the exact
 * sum, as the weight itself. */
static void test_packed_linear_exact(void **state) {
    if (!have_kernels()) skip();
    static const int64_t shapes[][3] = {{1, 1, 1},      {1, 15, 17},    {5, 17, 15},   {6, 64, 4097}, {7, 65, 33},
                                        {13, 130, 1},   {15, 64, 33},   {16, 65, 31},  {17, 64, 4097},
                                        {63, 70, 33},   {64, 70, 33},   {64, 100, 1024},
                                        {300, 70, 4097}, {2, 4097, 16}, {1030, 70, 33}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
        float *xv = malloc(sizeof(float) * m * k), *wv = malloc(sizeof(float) * n * k), *bv = malloc(sizeof(float) * n);
        hr_tensor *x = half_tensor(2, (int64_t[]){m, k}, 1, false, xv);
        hr_tensor *w = half_tensor(2, (int64_t[]){n, k}, 2, false, wv);
        hr_tensor *b = half_tensor(1, (int64_t[]){n}, 3, false, bv);
        hr_tensor *wp = packed_copy_of(w), *y = NULL, *yp = NULL;
        assert_int_equal(hr_linear(x, w, b, &y), HR_OK);
        assert_int_equal(hr_linear(x, wp, b, &yp), HR_OK);
        uint16_t *got = read_half(yp), *plain = read_half(y);
        int bad = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = bv[j];
                for (int64_t p = 0; p < k; p++) s += (double)xv[i * k + p] * wv[j * k + p];
                bad += got[i * n + j] != to_half((float)s) || plain[i * n + j] != got[i * n + j];
            }
        if (bad) print_error("packed linear %lldx%lldx%lld: %d wrong\n", (long long)m, (long long)n, (long long)k, bad);
        assert_int_equal(bad, 0);
        free(got), free(plain), free(xv), free(wv), free(bv);
        hr_tensor_free(x), hr_tensor_free(w), hr_tensor_free(b), hr_tensor_free(wp), hr_tensor_free(y),
            hr_tensor_free(yp);
    }
}

/* x as a batch [2, h, k] and as non-contiguous views (rows 2k apart, and
 * a transposed x whose elements are m apart; each copied first): same bits
 * as the same rows contiguous; into views of C likewise. h = 3 and 33: on
 * AVX2, 6 rows take the bf16 tiles and 66 the widened form. */
static void check_batched_and_strided(int64_t h) {
    int64_t k = 37, n = 70, m = 2 * h;
    hr_tensor *w = half_tensor(2, (int64_t[]){n, k}, 4, true, NULL), *wp = packed_copy_of(w);
    hr_tensor *x = half_tensor(3, (int64_t[]){2, h, k}, 5, true, NULL), *flat = NULL, *wide = NULL;
    assert_int_equal(hr_tensor_reshape(x, 2, (int64_t[]){m, k}, &flat), HR_OK);
    hr_tensor *y3 = NULL, *y2 = NULL, *yt = NULL;
    assert_int_equal(hr_linear(x, wp, NULL, &y3), HR_OK);
    assert_int_equal(hr_linear(flat, wp, NULL, &y2), HR_OK);
    uint16_t *a = read_half(y3), *b = read_half(y2);
    assert_memory_equal(a, b, 2 * (size_t)(m * n));
    /* rows 2*k apart: a slice of a [m, 2k] tensor */
    hr_tensor *big = half_tensor(2, (int64_t[]){m, 2 * k}, 6, true, NULL), *cont = NULL;
    assert_int_equal(hr_tensor_narrow(big, 1, 0, k, &wide), HR_OK);
    assert_int_equal(hr_tensor_empty(NULL, g_dt, 2, (int64_t[]){m, k}, &cont), HR_OK);
    assert_int_equal(hr_copy_(cont, wide), HR_OK);
    assert_int_equal(hr_linear(wide, wp, NULL, &yt), HR_OK);
    hr_tensor *yc = NULL;
    assert_int_equal(hr_linear(cont, wp, NULL, &yc), HR_OK);
    uint16_t *c = read_half(yt), *d = read_half(yc);
    assert_memory_equal(c, d, 2 * (size_t)(m * n));
    /* x transposed: a [k, m] tensor's transpose, its elements m apart */
    hr_tensor *xkm = half_tensor(2, (int64_t[]){k, m}, 11, true, NULL), *xtv = NULL, *xtc = NULL, *ytv = NULL,
              *ytc = NULL;
    assert_int_equal(hr_tensor_transpose(xkm, 0, 1, &xtv), HR_OK);
    assert_int_equal(hr_tensor_empty(NULL, g_dt, 2, (int64_t[]){m, k}, &xtc), HR_OK);
    assert_int_equal(hr_copy_(xtc, xtv), HR_OK);
    assert_int_equal(hr_linear(xtv, wp, NULL, &ytv), HR_OK);
    assert_int_equal(hr_linear(xtc, wp, NULL, &ytc), HR_OK);
    uint16_t *tv = read_half(ytv), *tc = read_half(ytc);
    assert_memory_equal(tv, tc, 2 * (size_t)(m * n));
    free(tv), free(tc);
    hr_tensor_free(xkm), hr_tensor_free(xtv), hr_tensor_free(xtc), hr_tensor_free(ytv), hr_tensor_free(ytc);
    /* into views of C: rows 2n apart, and a transposed one (columns apart) */
    hr_op lin;
    assert_int_equal(hr_op_find("linear", &lin), HR_OK);
    hr_tensor *wide_out = NULL, *rows_view = NULL, *tall = NULL, *cols_view = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, g_dt, 2, (int64_t[]){m, 2 * n}, &wide_out), HR_OK);
    assert_int_equal(hr_tensor_narrow(wide_out, 1, n, n, &rows_view), HR_OK);
    assert_int_equal(hr_tensor_zeros(NULL, g_dt, 2, (int64_t[]){n, m}, &tall), HR_OK);
    assert_int_equal(hr_tensor_transpose(tall, 0, 1, &cols_view), HR_OK);
    const hr_tensor *in[2] = {cont, wp};
    assert_int_equal(hr_op_run(lin, NULL, in, 2, &rows_view, 1), HR_OK);
    assert_int_equal(hr_op_run(lin, NULL, in, 2, &cols_view, 1), HR_OK);
    uint16_t *e = read_half(wide_out), *f = read_half(tall);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            assert_int_equal(e[i * 2 * n + j], 0);
            assert_int_equal(e[i * 2 * n + n + j], d[i * n + j]);
            assert_int_equal(f[j * m + i], d[i * n + j]);
        }
    free(e), free(f);
    /* a batch whose rows are not evenly spaced: [2, h] of a [2, h + 1] grid */
    hr_tensor *grid = NULL, *uneven = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, g_dt, 3, (int64_t[]){2, h + 1, n}, &grid), HR_OK);
    assert_int_equal(hr_tensor_narrow(grid, 1, 0, h, &uneven), HR_OK);
    const hr_tensor *in3[2] = {x, wp};
    assert_int_equal(hr_op_run(lin, NULL, in3, 2, &uneven, 1), HR_OK);
    uint16_t *g = read_half(grid);
    for (int64_t bi = 0; bi < 2; bi++)
        for (int64_t r = 0; r <= h; r++)
            for (int64_t j = 0; j < n; j++)
                assert_int_equal(g[(bi * (h + 1) + r) * n + j], r < h ? a[(bi * h + r) * n + j] : 0);
    free(g);
    hr_tensor_free(grid), hr_tensor_free(uneven);
    hr_tensor_free(wide_out), hr_tensor_free(rows_view), hr_tensor_free(tall), hr_tensor_free(cols_view);
    free(a), free(b), free(c), free(d);
    hr_tensor_free(w), hr_tensor_free(wp), hr_tensor_free(x), hr_tensor_free(flat), hr_tensor_free(wide);
    hr_tensor_free(big), hr_tensor_free(cont), hr_tensor_free(y3), hr_tensor_free(y2);
    hr_tensor_free(yt), hr_tensor_free(yc);
}

static void test_packed_linear_batched_and_strided(void **state) {
    if (!have_kernels()) skip();
    check_batched_and_strided(3);
    check_batched_and_strided(33);
}

/* With full-mantissa data, row i of a 200-row call has the same bits as
 * the same row alone and in 7-, 16- and 17-row calls (the unpacked routes
 * sum in another order at each of these counts; on AVX2 1 and 7 rows take
 * the bf16 tiles, the others the widened form, 17 with a group of five),
 * and every unit is computed once whatever the thread count (tasks claim
 * units from both ends of their segments). K even and odd (a lone last
 * element). */
static void check_packed_rows_batch_invariant(int64_t k) {
    int64_t n = 300, m = 200;
    hr_tensor *w = half_tensor(2, (int64_t[]){n, k}, 7, true, NULL), *wp = packed_copy_of(w);
    hr_tensor *x = half_tensor(2, (int64_t[]){m, k}, 8, true, NULL), *y = NULL;
    assert_int_equal(hr_linear(x, wp, NULL, &y), HR_OK);
    uint16_t *all = read_half(y);
    static const int64_t counts[] = {1, 7, 16, 17};
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
        for (int64_t rows = counts[ci], r0 = 0; r0 + rows <= m; r0 += 53) {
            hr_tensor *xs = NULL, *ys = NULL;
            assert_int_equal(hr_tensor_narrow(x, 0, r0, rows, &xs), HR_OK);
            assert_int_equal(hr_linear(xs, wp, NULL, &ys), HR_OK);
            uint16_t *part = read_half(ys);
            assert_memory_equal(part, all + r0 * n, 2 * (size_t)(rows * n));
            free(part);
            hr_tensor_free(xs), hr_tensor_free(ys);
        }
    /* and at any thread count: 1, 3 (a task with no partner) and 5 */
    int threads = hr_num_threads();
    for (int nth = 1; nth <= 5; nth += 2) {
        assert_int_equal(hr_set_num_threads(nth), HR_OK);
        hr_tensor *yt = NULL;
        assert_int_equal(hr_linear(x, wp, NULL, &yt), HR_OK);
        uint16_t *part = read_half(yt);
        assert_memory_equal(part, all, 2 * (size_t)(m * n));
        free(part);
        hr_tensor_free(yt);
    }
    assert_int_equal(hr_set_num_threads(threads), HR_OK);
    free(all);
    hr_tensor_free(w), hr_tensor_free(wp), hr_tensor_free(x), hr_tensor_free(y);
}

static void test_packed_rows_batch_invariant(void **state) {
    if (!have_kernels()) skip();
    check_packed_rows_batch_invariant(1000);
    check_packed_rows_batch_invariant(1001);
}

/* After packing, the weight's own bytes are overwritten behind the
 * runtime's back: linear and embedding still give the packed values, so
 * both read the panels (the model loader lets the file pages go). */
static void test_packed_copy_is_what_is_read(void **state) {
    if (!have_kernels()) skip();
    int64_t n = 131, k = 45;
    hr_tensor *w = half_tensor(2, (int64_t[]){n, k}, 9, true, NULL), *wp = packed_copy_of(w);
    hr_tensor *x = half_tensor(2, (int64_t[]){3, k}, 10, true, NULL), *want_y = NULL, *got_y = NULL;
    int64_t ids_v[5] = {0, 63, 64, 130, 7};
    hr_tensor *ids = NULL, *want_e = NULL, *got_e = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_I64, 1, (int64_t[]){5}, ids_v, sizeof ids_v, &ids), HR_OK);
    assert_int_equal(hr_linear(x, wp, NULL, &want_y), HR_OK);
    assert_int_equal(hr_embedding(w, ids, &want_e), HR_OK);
    memset(hr_tensor_data(wp), 0x7f, hr_tensor_nbytes(wp));
    assert_int_equal(hr_linear(x, wp, NULL, &got_y), HR_OK);
    assert_int_equal(hr_embedding(wp, ids, &got_e), HR_OK);
    uint16_t *a = read_half(want_y), *b = read_half(got_y), *c = read_half(want_e), *d = read_half(got_e);
    assert_memory_equal(a, b, 2 * 3 * (size_t)n);
    assert_memory_equal(c, d, 2 * 5 * (size_t)k);
    free(a), free(b), free(c), free(d);
    hr_tensor_free(w), hr_tensor_free(wp), hr_tensor_free(x), hr_tensor_free(want_y), hr_tensor_free(got_y);
    hr_tensor_free(ids), hr_tensor_free(want_e), hr_tensor_free(got_e);
}

/* An op writing the weight drops the packed copy: linear then reads the
 * new values. */
static void test_write_drops_packed_copy(void **state) {
    if (!have_kernels()) skip();
    int64_t n = 70, k = 33;
    float *xv = malloc(sizeof(float) * 2 * k), *wv = malloc(sizeof(float) * n * k);
    hr_tensor *w = half_tensor(2, (int64_t[]){n, k}, 11, false, NULL), *wp = packed_copy_of(w);
    hr_tensor *src = half_tensor(2, (int64_t[]){n, k}, 12, false, wv), *x = half_tensor(2, (int64_t[]){2, k}, 13, false, xv);
    assert_int_equal(hr_copy_(wp, src), HR_OK);
    hr_tensor *y = NULL;
    assert_int_equal(hr_linear(x, wp, NULL, &y), HR_OK);
    uint16_t *got = read_half(y);
    for (int64_t i = 0; i < 2; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = 0;
            for (int64_t p = 0; p < k; p++) s += xv[i * k + p] * wv[j * k + p];
            assert_int_equal(got[i * n + j], to_half(s));
        }
    free(got), free(xv), free(wv);
    hr_tensor_free(w), hr_tensor_free(wp), hr_tensor_free(src), hr_tensor_free(x), hr_tensor_free(y);
}

/* No copy where it would not be read: f32 weights, 1-D or strided ones,
 * the scalar ISA setting; a packed weight under it is read as it is. Bad
 * arguments are errors. */
static void test_pack_applies_only_where_read(void **state) {
    bool packed = true;
    assert_int_not_equal(hr_linear_pack(NULL, &packed), HR_OK);
    float fv[6] = {1, 2, 3, 4, 5, 6};
    hr_tensor *f = NULL, *v = half_tensor(1, (int64_t[]){8}, 14, false, NULL), *w = NULL, *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, HR_F32, 2, (int64_t[]){2, 3}, fv, sizeof fv, &f), HR_OK);
    assert_int_equal(hr_linear_pack(f, &packed), HR_OK);
    assert_false(packed);
    packed = true;
    assert_int_equal(hr_linear_pack(v, &packed), HR_OK);
    assert_false(packed);
    w = half_tensor(2, (int64_t[]){5, 9}, 15, false, NULL);
    assert_int_equal(hr_tensor_transpose(w, 0, 1, &t), HR_OK);
    packed = true;
    assert_int_equal(hr_linear_pack(t, &packed), HR_OK);
    assert_false(packed);
    if (have_kernels()) {
        float xv[2 * 9], wv[5 * 9];
        hr_tensor *w2 = half_tensor(2, (int64_t[]){5, 9}, 16, false, wv), *x = half_tensor(2, (int64_t[]){2, 9}, 17, false, xv);
        assert_int_equal(hr_linear_pack(w2, &packed), HR_OK);
        assert_true(packed);
        hr_cpu_isa saved = hr_cpu_isa_get();
        assert_int_equal(hr_cpu_isa_set(HR_ISA_SCALAR), HR_OK);
        hr_tensor *w3 = half_tensor(2, (int64_t[]){5, 9}, 16, false, NULL), *y = NULL;
        assert_int_equal(hr_linear_pack(w3, &packed), HR_OK);
        assert_false(packed);
        assert_int_equal(hr_linear(x, w2, NULL, &y), HR_OK);
        assert_int_equal(hr_cpu_isa_set(saved), HR_OK);
        uint16_t *got = read_half(y);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 5; j++) {
                float s = 0;
                for (int p = 0; p < 9; p++) s += xv[i * 9 + p] * wv[j * 9 + p];
                assert_int_equal(got[i * 5 + j], to_half(s));
            }
        free(got);
        hr_tensor_free(w2), hr_tensor_free(w3), hr_tensor_free(x), hr_tensor_free(y);
    }
    hr_tensor_free(f), hr_tensor_free(v), hr_tensor_free(w), hr_tensor_free(t);
}

static hr_cpu_isa g_best; /* the CPU's best ISA setting */

/* f16 panels are the AVX2 kernel's: packed under that setting, then read
 * under a higher one (AVX-512 BF16, AMX), linear and embedding read the
 * weight itself, exactly. Runs where the CPU has more than AVX2. */
static void test_f16_panels_unread_above_avx2(void **state) {
    if (g_dt != HR_F16 || g_best <= HR_ISA_AVX2 || !have_kernels()) skip();
    int64_t n = 70, k = 33;
    float xv[3 * 33], wv[70 * 33];
    hr_tensor *w = half_tensor(2, (int64_t[]){n, k}, 18, false, wv), *wp = packed_copy_of(w);
    hr_tensor *x = half_tensor(2, (int64_t[]){3, k}, 19, false, xv), *y = NULL, *e = NULL, *ids = NULL;
    int64_t ids_v[3] = {0, 64, 69};
    assert_int_equal(hr_tensor_from_host(NULL, HR_I64, 1, (int64_t[]){3}, ids_v, sizeof ids_v, &ids), HR_OK);
    hr_cpu_isa saved = hr_cpu_isa_get();
    assert_int_equal(hr_cpu_isa_set(g_best), HR_OK);
    assert_int_equal(hr_linear(x, wp, NULL, &y), HR_OK);
    assert_int_equal(hr_embedding(wp, ids, &e), HR_OK);
    assert_int_equal(hr_cpu_isa_set(saved), HR_OK);
    uint16_t *got = read_half(y), *rows = read_half(e), *wh = read_half(w);
    for (int64_t i = 0; i < 3; i++) {
        for (int64_t j = 0; j < n; j++) {
            float s = 0;
            for (int64_t p = 0; p < k; p++) s += xv[i * k + p] * wv[j * k + p];
            assert_int_equal(got[i * n + j], to_half(s));
        }
        assert_memory_equal(rows + i * k, wh + ids_v[i] * k, 2 * (size_t)k);
    }
    free(got), free(rows), free(wh);
    hr_tensor_free(w), hr_tensor_free(wp), hr_tensor_free(x), hr_tensor_free(y), hr_tensor_free(e),
        hr_tensor_free(ids);
}

/* The same tests with the panel route on the AMX kernel: the tiles where
 * the CPU has them, else their emulator (HUBRT_AMX_EMULATE=1, set in main
 * before the features are read; it needs AVX-512 BF16); and on the AVX2
 * kernel where the CPU has more. */
static int use_amx(void **state) {
    (void)state;
    return hr_cpu_isa_set(HR_ISA_AMX) == HR_OK ? 0 : -1;
}

static int use_avx2(void **state) {
    (void)state;
    return hr_cpu_isa_set(HR_ISA_AVX2) == HR_OK ? 0 : -1;
}

static int use_f16(void **state) {
    g_dt = HR_F16;
    return use_avx2(state);
}

static int back_to_bf16(void **state) {
    (void)state;
    g_dt = HR_BF16;
    return 0;
}

int main(void) {
    setenv("HUBRT_AMX_EMULATE", "1", 0);
    hr_cpu_isa best = g_best = hr_cpu_isa_get();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_linear_exact),
        cmocka_unit_test(test_packed_linear_batched_and_strided),
        cmocka_unit_test(test_packed_rows_batch_invariant),
        cmocka_unit_test(test_packed_copy_is_what_is_read),
        cmocka_unit_test(test_write_drops_packed_copy),
        cmocka_unit_test(test_pack_applies_only_where_read),
        cmocka_unit_test(test_f16_panels_unread_above_avx2),
    };
    int failed = cmocka_run_group_tests_name("best ISA", tests, NULL, NULL);
    const hr_cpu_features *f = hr_cpu_features_get();
    if ((f->amx_bf16 && f->amx_usable) || f->amx_emulated) {
        failed += cmocka_run_group_tests_name("amx", tests, use_amx, NULL);
        assert_int_equal(hr_cpu_isa_set(best), HR_OK);
    }
    if (best > HR_ISA_AVX2) {
        failed += cmocka_run_group_tests_name("avx2", tests, use_avx2, NULL);
        assert_int_equal(hr_cpu_isa_set(best), HR_OK);
    }
    if (best >= HR_ISA_AVX2) {
        failed += cmocka_run_group_tests_name("f16 on avx2", tests, use_f16, back_to_bf16);
        assert_int_equal(hr_cpu_isa_set(best), HR_OK);
    }
    return failed;
}
