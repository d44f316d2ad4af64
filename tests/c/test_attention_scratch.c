/* The CPU sdpa kernel's per-worker scratch (k_attention.h) does not grow
 * with the number of keys or queries: each path's request, as the kernel
 * plans it, is the same for 512 and 131072 tokens; nor do the decode
 * splits' partial results past 64 splits (16384 keys with a pool of as
 * many threads as kv heads, whose splits are 256 keys). Decode splits
 * are 256 keys times the kv heads per thread. The tensors are broadcast
 * views (stride 0 along the tokens), since the plan reads only shapes,
 * strides and dtypes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_attention.h"
#include "hubrt.h"

enum { HQ = 16, HKV = 8, D = 128 };

/* A [1, heads, n, D] view of one zeroed row per head. */
static hr_tensor *rows_view(int64_t heads, int64_t n, hr_dtype dt) {
    int64_t one[4] = {1, heads, 1, D}, shape[4] = {1, heads, n, D};
    hr_tensor *row = NULL, *view = NULL;
    assert_int_equal(hr_tensor_zeros(NULL, dt, 4, one, &row), HR_OK);
    assert_int_equal(hr_tensor_expand(row, 4, shape, &view), HR_OK);
    hr_tensor_free(row);
    return view;
}

/* The planned call's scratch bytes per worker for s queries over t keys;
 * *bf16 tells whether it took the AVX-512 BF16 paths, *parts gets the
 * bytes of its decode splits' partial results. */
static size_t scratch_for(int64_t s, int64_t t, hr_dtype dt, bool *bf16, size_t *parts) {
    hr_tensor *q = rows_view(HQ, s, dt), *k = rows_view(HKV, t, dt), *v = rows_view(HKV, t, dt);
    hr_tensor *o = rows_view(HQ, s, dt);
    const hr_tensor *in[3] = {q, k, v};
    hr_attrs_sdpa a = {.is_causal = true};
    attn_ctx c;
    hr_attn_plan(&c, &a, in, 3, o);
    size_t n = hr_attn_scratch_bytes(&c);
    *bf16 = c.bf16;
    *parts = hr_attn_parts_bytes(&c);
    hr_tensor_free(q), hr_tensor_free(k), hr_tensor_free(v), hr_tensor_free(o);
    return n;
}

static void check_isa(hr_cpu_isa isa, hr_dtype dt) {
    if (hr_cpu_isa_set(isa) != HR_OK) return; /* the CPU lacks it */
    bool bf16_short, bf16_long = false;
    size_t parts_short, parts_long;
    for (int decode = 0; decode < 2; decode++) { /* prefill: s = t; decode: one query per sequence */
        size_t short_bytes = scratch_for(decode ? 1 : 512, 512, dt, &bf16_short, &parts_short);
        size_t long_bytes = scratch_for(decode ? 1 : 131072, 131072, dt, &bf16_long, &parts_long);
        assert_int_equal(bf16_short, bf16_long);
        assert_int_equal(short_bytes, long_bytes);
        /* a fixed key block and the chunk's query rows: well under what
         * 131072 keys of one kv head take (64 MB here) */
        assert_true(long_bytes < ((size_t)2 << 20));
        assert_true(long_bytes > 0);
        if (!decode) assert_int_equal(parts_long, 0);
    }
    /* decode: 64 splits of the (batch, kv head) pairs' two rows at most, as
     * many as 16384 keys make */
    size_t most = sizeof(float) * 64 * HKV * (HQ / HKV) * (2 + D);
    assert_int_equal(parts_long, most);
    scratch_for(1, 16384, dt, &bf16_short, &parts_short);
    assert_int_equal(parts_short, most);
    scratch_for(1, 16128, dt, &bf16_short, &parts_short); /* 63 splits */
    assert_int_equal(parts_short, most / 64 * 63);
    /* bf16 under AVX-512 takes the BF16 paths where the CPU has them */
    assert_int_equal(bf16_long, dt == HR_BF16 && isa >= HR_ISA_AVX512 && hr_gemm_use_avx512_bf16());
}

static void test_scratch_bounded(void **state) {
    (void)state;
    int threads = hr_num_threads();
    assert_int_equal(hr_set_num_threads(HKV), HR_OK); /* one kv head per thread: splits of 256 keys */
    hr_cpu_isa best = hr_cpu_isa_get();
    for (int isa = HR_ISA_SCALAR; isa <= (int)best; isa++) {
        check_isa((hr_cpu_isa)isa, HR_BF16);
        check_isa((hr_cpu_isa)isa, HR_F32);
    }
    assert_int_equal(hr_cpu_isa_set(best), HR_OK);
    assert_int_equal(hr_set_num_threads(threads), HR_OK);
}

/* Splits of 256 keys times the kv heads per thread of the pool (1 to 8):
 * 8 kv heads on 2 threads read 1024 keys per split, on 1 thread 2048, on
 * 16 threads 256; no partial results while one split holds every key. */
static void test_decode_split_length(void **state) {
    (void)state;
    int threads = hr_num_threads();
    static const struct { int threads; int64_t split; } cases[] = {{2, 1024}, {1, 2048}, {16, 256}, {4, 512}};
    size_t row_parts = sizeof(float) * HKV * (HQ / HKV) * (2 + D);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(hr_set_num_threads(cases[i].threads), HR_OK);
        bool bf16;
        size_t parts;
        scratch_for(1, cases[i].split, HR_BF16, &bf16, &parts);
        assert_int_equal(parts, 0);
        scratch_for(1, cases[i].split + 1, HR_BF16, &bf16, &parts);
        assert_int_equal(parts, 2 * row_parts);
        scratch_for(1, 5 * cases[i].split, HR_BF16, &bf16, &parts);
        assert_int_equal(parts, 5 * row_parts);
    }
    assert_int_equal(hr_set_num_threads(threads), HR_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scratch_bounded),
        cmocka_unit_test(test_decode_split_length),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
