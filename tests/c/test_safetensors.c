/* safetensors: reader, writer, checkpoints (single and sharded), and a
 * corpus of malformed files that must each fail with a clear message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hubrt.h"
#include "io/st_internal.h"

static char g_dir[256];

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* A file with header text `json`, a length field of `len_field` (or the
 * real length when 0), then `data` bytes of 0x5a. Returns its size. */
static size_t make_file(const char *path, const char *json, uint64_t len_field, size_t data,
                        uint8_t *img, size_t cap) {
    size_t hl = strlen(json);
    uint64_t lf = len_field ? len_field : hl;
    assert_true(8 + hl + data <= cap);
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)(lf >> (8 * i));
    memcpy(img + 8, json, hl);
    memset(img + 8 + hl, 0x5a, data);
    if (path) write_bytes(path, img, 8 + hl + data);
    return 8 + hl + data;
}

static hr_tensor *make_tensor(hr_dtype dt, int ndim, const int64_t *shape, uint8_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    size_t nb = (size_t)n * hr_dtype_size(dt);
    uint8_t *buf = malloc(nb ? nb : 1);
    for (size_t i = 0; i < nb; i++) buf[i] = (uint8_t)(seed + i * 7);
    if (dt == HR_BOOL)
        for (size_t i = 0; i < nb; i++) buf[i] &= 1;
    hr_tensor *t = NULL;
    assert_int_equal(hr_tensor_from_host(NULL, dt, ndim, shape, buf, nb, &t), HR_OK);
    free(buf);
    return t;
}

static void assert_same_bytes(const hr_tensor *a, const hr_tensor *b) {
    size_t n = hr_tensor_nbytes(a);
    assert_int_equal(n, hr_tensor_nbytes(b));
    assert_int_equal(hr_tensor_dtype(a), hr_tensor_dtype(b));
    assert_int_equal(hr_tensor_ndim(a), hr_tensor_ndim(b));
    assert_memory_equal(hr_tensor_shape(a), hr_tensor_shape(b),
                        sizeof(int64_t) * (size_t)hr_tensor_ndim(a));
    uint8_t *x = malloc(n + 1), *y = malloc(n + 1);
    assert_int_equal(hr_tensor_read(a, x, n), HR_OK);
    assert_int_equal(hr_tensor_read(b, y, n), HR_OK);
    assert_memory_equal(x, y, n);
    free(x);
    free(y);
}

static void assert_error_has(const char *needle) {
    if (!strstr(hr_last_error(), needle))
        fail_msg("error '%s' lacks '%s'", hr_last_error(), needle);
}

/* ---- writer + reader --------------------------------------------------- */

static void test_round_trip_all_dtypes(void **state) {
    const int64_t s2[] = {3, 5}, s1[] = {17}, s0[] = {0, 4};
    hr_tensor *ts[HR_DTYPE_COUNT + 3];
    char names[HR_DTYPE_COUNT + 3][32];
    const char *np[HR_DTYPE_COUNT + 3];
    size_t n = 0;
    for (int d = 0; d < HR_Q8_0; d++, n++) { /* the block types have no safetensors dtype */
        ts[n] = make_tensor((hr_dtype)d, d % 2 ? 2 : 1, d % 2 ? s2 : s1, (uint8_t)d);
        snprintf(names[n], sizeof names[n], "w.%s", hr_dtype_name((hr_dtype)d));
        np[n] = names[n];
    }
    ts[n] = make_tensor(HR_F8_E4M3, 2, s2, 7), np[n++] = "w.f8_e4m3"; /* after the block types */
    ts[n] = make_tensor(HR_F32, 2, s0, 0), np[n++] = "empty";
    ts[n] = make_tensor(HR_BF16, 0, NULL, 9), np[n++] = "scalar";
    const hr_kv meta[] = {{"format", "pt"}, {"note", "caf\xc3\xa9"}};
    const char *path = tmp_path("all.safetensors");
    assert_int_equal(hr_safetensors_write(path, np, (const hr_tensor *const *)ts, n, meta, 2), HR_OK);

    hr_safetensors *st;
    assert_int_equal(hr_safetensors_open(path, &st), HR_OK);
    assert_int_equal(hr_safetensors_count(st), n);
    for (size_t i = 1; i < n; i++)
        assert_true(strcmp(hr_safetensors_name(st, i - 1), hr_safetensors_name(st, i)) < 0);
    assert_null(hr_safetensors_name(st, n));
    assert_string_equal(hr_safetensors_metadata_get(st, "note"), "caf\xc3\xa9");
    assert_int_equal(hr_safetensors_metadata_count(st), 2);
    assert_string_equal(hr_safetensors_metadata_at(st, 0).key, "format");
    assert_null(hr_safetensors_metadata_get(st, "absent"));
    for (size_t i = 0; i < n; i++) {
        hr_tensor_info info;
        assert_int_equal(hr_safetensors_info(st, np[i], &info), HR_OK);
        assert_int_equal(info.nbytes, hr_tensor_nbytes(ts[i]));
        hr_tensor *t;
        assert_int_equal(hr_safetensors_tensor(st, np[i], &t), HR_OK);
        assert_string_equal(hr_tensor_name(t), np[i]);
        assert_same_bytes(t, ts[i]);
        hr_tensor_free(t);
    }
    hr_tensor *t;
    assert_int_equal(hr_safetensors_tensor(st, "nope", &t), HR_ERR_NOT_FOUND);
    assert_null(t);
    assert_error_has("no tensor named 'nope'");
    assert_error_has("all.safetensors");
    hr_safetensors_close(st);
    for (size_t i = 0; i < n; i++) hr_tensor_free(ts[i]);
}

/* The header is byte-identical to what the `safetensors` package writes:
 * larger dtypes first (I64 before F64, F32 before I32, BF16 before F16),
 * then by name, padded with spaces to 8 bytes. */
static void test_header_matches_reference_layout(void **state) {
    const int64_t one[] = {1};
    hr_tensor *ts[] = {make_tensor(HR_F32, 1, one, 0), make_tensor(HR_I64, 1, one, 0),
                       make_tensor(HR_BF16, 1, one, 0), make_tensor(HR_F16, 1, one, 0),
                       make_tensor(HR_BOOL, 1, one, 0), make_tensor(HR_F32, 1, one, 0)};
    const char *names[] = {"b", "i", "h", "g", "q\"\n", "a"};
    const char *path = tmp_path("layout.safetensors");
    assert_int_equal(hr_safetensors_write(path, names, (const hr_tensor *const *)ts, 6, NULL, 0),
                     HR_OK);
    const char *want =
        "{\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]},"
        "\"h\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[16,18]},"
        "\"g\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[18,20]},"
        "\"q\\\"\\n\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[20,21]}}";
    char *text;
    size_t len;
    assert_int_equal(hr_io_read_file(path, 1 << 20, &text, &len), HR_OK);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (uint8_t)text[i];
    assert_int_equal(hl % 8, 0);
    assert_int_equal(len, 8 + hl + 21);
    assert_memory_equal(text + 8, want, strlen(want));
    for (size_t i = strlen(want); i < hl; i++) assert_int_equal(text[8 + i], ' ');
    free(text);
    for (int i = 0; i < 6; i++) hr_tensor_free(ts[i]);
}

static void test_tensor_outlives_handle(void **state) {
    const int64_t shape[] = {4, 3};
    hr_tensor *src = make_tensor(HR_F32, 2, shape, 3);
    const char *name = "x";
    const char *path = tmp_path("outlive.safetensors");
    assert_int_equal(hr_safetensors_write(path, &name, (const hr_tensor *const *)&src, 1, NULL, 0),
                     HR_OK);
    hr_checkpoint *ck;
    assert_int_equal(hr_checkpoint_open(path, &ck), HR_OK);
    hr_tensor *t, *view;
    assert_int_equal(hr_checkpoint_tensor(ck, "x", &t), HR_OK);
    assert_int_equal(hr_tensor_transpose(t, 0, 1, &view), HR_OK);
    hr_checkpoint_close(ck);
    hr_tensor_free(t);
    /* the view alone still holds the map */
    float got[12], want[12];
    assert_int_equal(hr_tensor_read(view, got, sizeof got), HR_OK);
    hr_tensor *srcv;
    assert_int_equal(hr_tensor_transpose(src, 0, 1, &srcv), HR_OK);
    assert_int_equal(hr_tensor_read(srcv, want, sizeof want), HR_OK);
    assert_memory_equal(got, want, sizeof got);
    /* writes land in the process's private copy, never in the file */
    ((float *)hr_tensor_data(view))[0] = 1234.5f;
    hr_tensor_free(view);
    hr_tensor_free(srcv);
    hr_safetensors *st;
    assert_int_equal(hr_safetensors_open(path, &st), HR_OK);
    assert_int_equal(hr_safetensors_tensor(st, "x", &t), HR_OK);
    assert_same_bytes(t, src);
    hr_tensor_free(t);
    hr_safetensors_close(st);
    hr_tensor_free(src);
}

/* A contiguous copy of t (for comparing a view's bytes). */
static hr_tensor *contiguous(const hr_tensor *t) {
    hr_tensor *c = NULL;
    assert_int_equal(hr_tensor_empty(NULL, hr_tensor_dtype(t), hr_tensor_ndim(t), hr_tensor_shape(t), &c), HR_OK);
    assert_int_equal(hr_copy_(c, t), HR_OK);
    return c;
}

/* Opened by ranges, a file gives the same tensors as mapped whole, and
 * slices of any dim equal the whole tensor's narrowed; a slice outside
 * the tensor is refused naming it. */
static void test_ranged_matches_mapped(void **state) {
    const int64_t s2[] = {7, 5}, s3[] = {3, 4, 6}, s1[] = {9};
    hr_tensor *ts[4] = {make_tensor(HR_F32, 2, s2, 1), make_tensor(HR_BF16, 3, s3, 2), make_tensor(HR_F16, 1, s1, 3),
                        make_tensor(HR_I64, 2, s2, 4)};
    const char *np[4] = {"a", "b", "c", "d"};
    const char *path = tmp_path("ranged.safetensors");
    assert_int_equal(hr_safetensors_write(path, np, (const hr_tensor *const *)ts, 4, NULL, 0), HR_OK);
    hr_safetensors *whole, *ranged;
    assert_int_equal(hr_safetensors_open(path, &whole), HR_OK);
    assert_int_equal(hr_safetensors_open_ranged(path, &ranged), HR_OK);
    for (int i = 0; i < 4; i++) {
        hr_tensor *a, *b;
        assert_int_equal(hr_safetensors_tensor(ranged, np[i], &a), HR_OK);
        assert_same_bytes(a, ts[i]);
        hr_tensor_free(a);
        for (int d = 0; d < hr_tensor_ndim(ts[i]); d++) {
            int64_t n = hr_tensor_shape(ts[i])[d], first = n / 3, len = n - n / 3 - 1;
            hr_tensor *want, *want_c;
            assert_int_equal(hr_tensor_narrow(ts[i], d, first, len, &want), HR_OK);
            want_c = contiguous(want);
            assert_int_equal(hr_safetensors_rows(ranged, np[i], d, first, len, &a), HR_OK);
            assert_int_equal(hr_safetensors_rows(whole, np[i], d, first, len, &b), HR_OK);
            assert_string_equal(hr_tensor_name(a), np[i]);
            assert_same_bytes(a, want_c);
            assert_same_bytes(b, want_c);
            hr_tensor_free(a);
            hr_tensor_free(b);
            hr_tensor_free(want);
            hr_tensor_free(want_c);
        }
    }
    hr_tensor *t = NULL;
    assert_int_equal(hr_safetensors_rows(ranged, "a", 1, 3, 3, &t), HR_ERR_INVALID_ARG);
    assert_error_has("rows 3..6 of dim 1 of tensor 'a' are outside it");
    assert_int_equal(hr_safetensors_rows(ranged, "a", 2, 0, 1, &t), HR_ERR_INVALID_ARG);
    assert_int_equal(hr_safetensors_rows(ranged, "zz", 0, 0, 1, &t), HR_ERR_NOT_FOUND);
    assert_null(t);
    /* the tensors outlive the handle: each holds its own range */
    assert_int_equal(hr_safetensors_rows(ranged, "b", 0, 1, 2, &t), HR_OK);
    hr_safetensors_close(ranged);
    hr_safetensors_close(whole);
    hr_tensor *want, *want_c;
    assert_int_equal(hr_tensor_narrow(ts[1], 0, 1, 2, &want), HR_OK);
    want_c = contiguous(want);
    assert_same_bytes(t, want_c);
    hr_tensor_free(t);
    hr_tensor_free(want);
    hr_tensor_free(want_c);
    for (int i = 0; i < 4; i++) hr_tensor_free(ts[i]);
}

static void test_write_strided_views(void **state) {
    const int64_t shape[] = {5, 7};
    hr_tensor *src = make_tensor(HR_BF16, 2, shape, 1), *tv, *sl;
    assert_int_equal(hr_tensor_transpose(src, 0, 1, &tv), HR_OK);
    assert_int_equal(hr_tensor_slice(src, 1, 1, 7, 3, &sl), HR_OK);
    const hr_tensor *ts[] = {tv, sl};
    const char *names[] = {"t", "s"};
    const char *path = tmp_path("views.safetensors");
    assert_int_equal(hr_safetensors_write(path, names, ts, 2, NULL, 0), HR_OK);
    hr_checkpoint *ck;
    assert_int_equal(hr_checkpoint_open(path, &ck), HR_OK);
    for (int i = 0; i < 2; i++) {
        hr_tensor *t;
        assert_int_equal(hr_checkpoint_tensor(ck, names[i], &t), HR_OK);
        assert_true(hr_tensor_is_contiguous(t));
        assert_same_bytes(t, ts[i]);
        hr_tensor_free(t);
    }
    hr_checkpoint_close(ck);
    hr_tensor_free(tv);
    hr_tensor_free(sl);
    hr_tensor_free(src);
}

static int count_tmp_files(void) {
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static void test_write_is_atomic(void **state) {
    const int64_t shape[] = {2};
    hr_tensor *a = make_tensor(HR_F32, 1, shape, 1);
    const char *path = tmp_path("atomic.safetensors");
    const char *one[] = {"a"}, *two[] = {"a", "a"};
    const hr_tensor *ts[] = {a, a};
    assert_int_equal(hr_safetensors_write(path, one, ts, 1, NULL, 0), HR_OK);
    char *before;
    size_t blen;
    assert_int_equal(hr_io_read_file(path, 1 << 20, &before, &blen), HR_OK);

    assert_int_equal(hr_safetensors_write(path, two, ts, 2, NULL, 0), HR_ERR_INVALID_ARG);
    assert_error_has("duplicate tensor name 'a'");
    const char *bad_names[] = {"__metadata__"};
    assert_int_equal(hr_safetensors_write(path, bad_names, ts, 1, NULL, 0), HR_ERR_INVALID_ARG);
    const hr_kv dup[] = {{"k", "1"}, {"k", "2"}};
    assert_int_equal(hr_safetensors_write(path, one, ts, 1, dup, 2), HR_ERR_INVALID_ARG);
    assert_error_has("duplicate metadata key 'k'");
    const char *bad_utf8[] = {"\xc3\x28"};
    assert_int_equal(hr_safetensors_write(path, bad_utf8, ts, 1, NULL, 0), HR_ERR_INVALID_ARG);
    assert_error_has("not valid UTF-8");
    assert_int_equal(hr_safetensors_write(tmp_path("no/such/dir.safetensors"), one, ts, 1, NULL, 0),
                     HR_ERR_IO);
    assert_error_has("cannot create temporary file");
    /* rename onto a folder fails after the data is written: the temp goes */
    assert_int_equal(hr_safetensors_write(g_dir, one, ts, 1, NULL, 0), HR_ERR_IO);
    assert_error_has("cannot rename");

    char *after;
    size_t alen;
    assert_int_equal(hr_io_read_file(path, 1 << 20, &after, &alen), HR_OK);
    assert_int_equal(alen, blen);
    assert_memory_equal(before, after, blen);
    assert_int_equal(count_tmp_files(), 0);
    free(before);
    free(after);
    hr_tensor_free(a);
}

/* Another writer may leave data unaligned for its dtype: the reader copies
 * such a tensor instead of handing kernels a misaligned pointer. */
static void test_unaligned_tensor(void **state) {
    uint8_t img[256];
    const char *json = "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                       "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]}}";
    size_t n = make_file(NULL, json, 0, 9, img, sizeof img);
    size_t hl = strlen(json);
    const float v[2] = {1.5f, -2.25f};
    memcpy(img + 8 + hl + 1, v, sizeof v);
    const char *path = tmp_path("unaligned.safetensors");
    write_bytes(path, img, n);
    hr_safetensors *st;
    assert_int_equal(hr_safetensors_open(path, &st), HR_OK);
    hr_tensor *t;
    assert_int_equal(hr_safetensors_tensor(st, "f", &t), HR_OK);
    assert_int_equal((uintptr_t)hr_tensor_data(t) % 4, 0);
    assert_memory_equal(hr_tensor_data(t), v, sizeof v);
    hr_tensor_free(t);
    hr_safetensors_close(st);
}

/* ---- malformed files ---------------------------------------------------- */

typedef struct bad_case {
    const char *name;
    const char *json;
    uint64_t len_field; /* 0: the real length */
    size_t data;
    const char *want;   /* substring of the message */
} bad_case;

#define E(dt, shape, off) "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"

static const bad_case bad_cases[] = {
    {"header_len_huge", "{}", 0xFFFFFFFFFFull, 0, "header length 1099511627775 exceeds"},
    {"header_len_past_end", "{\"a\":1}", 64, 0, "header length 64 exceeds the 7 bytes"},
    {"not_json", "{\"a\": [1, 2", 0, 0, "header is not valid JSON"},
    {"not_object", "[1,2]", 0, 0, "does not start with '{'"},
    {"trailing", "{} x", 0, 0, "trailing bytes"},
    {"overlap", "{\"a\":" E("F32", "[2]", "[0,8]") ",\"b\":" E("F32", "[2]", "[4,12]") "}", 0, 12,
     "tensors 'a' [0, 8] and 'b' [4, 12] overlap"},
    {"dtype_size", "{\"w\":" E("F32", "[3]", "[0,8]") "}", 0, 8,
     "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8"},
    {"outside", "{\"w\":" E("U8", "[400]", "[0,400]") "}", 0, 8,
     "tensor 'w': data_offsets [0, 400] outside the data section of 8 bytes"},
    {"begin_after_end", "{\"w\":" E("U8", "[0]", "[8,4]") "}", 0, 8, "end before begin"},
    {"unknown_dtype", "{\"w\":" E("F8_E5M2", "[1]", "[0,1]") "}", 0, 1,
     "tensor 'w': unsupported dtype 'F8_E5M2'"},
    {"non_utf8_name", "{\"a\xff\xfe\":" E("U8", "[1]", "[0,1]") "}", 0, 1,
     "tensor name #0 \"a\\xff\\xfe\" is not valid UTF-8"},
    {"overlong_utf8_name", "{\"\xc0\xaf\":" E("U8", "[1]", "[0,1]") "}", 0, 1, "not valid UTF-8"},
    {"negative_shape", "{\"w\":" E("U8", "[-1]", "[0,1]") "}", 0, 1,
     "tensor 'w': shape[0] must be an integer in 0..2^53"},
    {"fractional_shape", "{\"w\":" E("U8", "[1.5]", "[0,1]") "}", 0, 1,
     "shape[0] must be an integer in 0..2^53"},
    {"rank_9", "{\"w\":" E("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 0, 1,
     "tensor 'w': rank 9 exceeds hubrt's maximum 8"},
    {"missing_dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1,
     "tensor 'w': missing field 'dtype'"},
    {"offsets_not_pair", "{\"w\":" E("U8", "[1]", "[0]") "}", 0, 1, "'data_offsets' must be [begin, end]"},
    {"shape_overflow", "{\"w\":" E("F64", "[4294967296,4294967296,4294967296]", "[0,8]") "}", 0, 8,
     "needs more than 2^64 bytes"},
    {"entry_not_object", "{\"w\":3}", 0, 0, "tensor 'w': entry must be an object"},
    {"metadata_not_string", "{\"__metadata__\":{\"k\":1}}", 0, 0,
     "'__metadata__': value of 'k' must be a string"},
    {"duplicate_name", "{\"w\":" E("U8", "[1]", "[0,1]") ",\"w\":" E("U8", "[1]", "[1,2]") "}", 0, 2,
     "duplicate tensor name 'w'"},
    {"bad_utf8_value", "{\"__metadata__\":{\"k\":\"\xff\"}}", 0, 0, "header is not valid UTF-8"},
};

static void test_malformed_files(void **state) {
    uint8_t img[1024];
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        char fname[96];
        snprintf(fname, sizeof fname, "bad_%s.safetensors", c->name);
        const char *path = tmp_path(fname);
        size_t n = make_file(path, c->json, c->len_field, c->data, img, sizeof img);
        for (int ranged = 0; ranged < 2; ranged++) {
            hr_safetensors *st = (hr_safetensors *)1;
            hr_status s = ranged ? hr_safetensors_open_ranged(path, &st) : hr_safetensors_open(path, &st);
            if (s == HR_OK) fail_msg("%s: opened%s", c->name, ranged ? " by ranges" : "");
            assert_null(st);
            if (!strstr(hr_last_error(), c->want) || !strstr(hr_last_error(), fname))
                fail_msg("%s: error '%s' lacks '%s' or the file name", c->name, hr_last_error(), c->want);
        }
        /* from memory, and every truncation of it, fails cleanly too */
        st_header h;
        assert_int_not_equal(hr_st_parse("mem", img, n, &h), HR_OK);
        for (size_t cut = 0; cut < n; cut++) {
            if (hr_st_parse("mem", img, cut, &h) == HR_OK) hr_st_header_free(&h);
        }
    }
}

static void test_truncated_and_missing(void **state) {
    const char *path = tmp_path("short.safetensors");
    write_bytes(path, "\x02\0\0", 3);
    hr_safetensors *st;
    assert_int_equal(hr_safetensors_open(path, &st), HR_ERR_FORMAT);
    assert_error_has("3 bytes is too short");
    assert_int_equal(hr_safetensors_open(tmp_path("absent.safetensors"), &st), HR_ERR_NOT_FOUND);
    assert_error_has("absent.safetensors: cannot open");
    assert_int_equal(hr_safetensors_open(g_dir, &st), HR_ERR_INVALID_ARG);
    assert_error_has("not a regular file");
    /* a valid file cut short loses its data section */
    const int64_t shape[] = {64};
    hr_tensor *t = make_tensor(HR_F32, 1, shape, 0);
    const char *name = "w";
    const char *full = tmp_path("full.safetensors");
    assert_int_equal(hr_safetensors_write(full, &name, (const hr_tensor *const *)&t, 1, NULL, 0), HR_OK);
    char *text;
    size_t len;
    assert_int_equal(hr_io_read_file(full, 1 << 20, &text, &len), HR_OK);
    write_bytes(path, text, len - 10);
    assert_int_equal(hr_safetensors_open(path, &st), HR_ERR_FORMAT);
    assert_error_has("tensor 'w': data_offsets [0, 256] outside the data section of 246 bytes");
    assert_int_equal(hr_safetensors_open_ranged(path, &st), HR_ERR_FORMAT);
    assert_error_has("tensor 'w': data_offsets [0, 256] outside the data section of 246 bytes");
    free(text);
    hr_tensor_free(t);
}

/* The committed fuzz seeds: bad_* files fail naming themselves, the others
 * (written by the safetensors package) open and yield every tensor. */
static void test_seed_corpus(void **state) {
    const char *src = getenv("HUBRT_SOURCE_DIR");
    if (!src) skip();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/fuzz_safetensors", src);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int bad = 0, good = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[800];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        hr_safetensors *st;
        hr_status s = hr_safetensors_open(path, &st);
        if (!strncmp(e->d_name, "bad_", 4)) {
            if (s == HR_OK) fail_msg("%s opened", e->d_name);
            assert_error_has(e->d_name);
            bad++;
            continue;
        }
        if (s != HR_OK) fail_msg("%s: %s", e->d_name, hr_last_error());
        for (size_t i = 0; i < hr_safetensors_count(st); i++) {
            hr_tensor *t;
            assert_int_equal(hr_safetensors_tensor(st, hr_safetensors_name(st, i), &t), HR_OK);
            hr_tensor_free(t);
        }
        hr_safetensors_close(st);
        good++;
    }
    closedir(d);
    assert_true(bad >= 10 && good >= 3);
}

/* ---- checkpoints -------------------------------------------------------- */

static void write_shard(const char *path, const char *const *names, size_t n, uint8_t seed) {
    const int64_t shape[] = {3, 2};
    hr_tensor *ts[4];
    for (size_t i = 0; i < n; i++) ts[i] = make_tensor(HR_BF16, 2, shape, (uint8_t)(seed + i));
    assert_int_equal(hr_safetensors_write(path, names, (const hr_tensor *const *)ts, n, NULL, 0), HR_OK);
    for (size_t i = 0; i < n; i++) hr_tensor_free(ts[i]);
}

static void test_sharded_checkpoint(void **state) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/sharded", g_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    char p1[400], p2[400], idx[400];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    const char *n1[] = {"embed", "layers.0.w"}, *n2[] = {"layers.1.w", "lm_head"};
    write_shard(p1, n1, 2, 10);
    write_shard(p2, n2, 2, 20);
    const char *index =
        "{\"metadata\":{\"total_size\":48},\"weight_map\":{"
        "\"lm_head\":\"model-00002-of-00002.safetensors\","
        "\"embed\":\"model-00001-of-00002.safetensors\","
        "\"layers.0.w\":\"model-00001-of-00002.safetensors\","
        "\"layers.1.w\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes(idx, index, strlen(index));

    hr_checkpoint *ck;
    assert_int_equal(hr_checkpoint_open(dir, &ck), HR_OK);
    assert_int_equal(hr_checkpoint_count(ck), 4);
    assert_int_equal(hr_checkpoint_shard_count(ck), 2);
    assert_string_equal(hr_checkpoint_name(ck, 0), "embed");
    assert_string_equal(hr_checkpoint_name(ck, 3), "lm_head");
    assert_true(hr_checkpoint_has(ck, "layers.1.w"));
    assert_false(hr_checkpoint_has(ck, "layers.2.w"));
    hr_tensor *t;
    assert_int_equal(hr_checkpoint_tensor(ck, "lm_head", &t), HR_OK);
    hr_checkpoint_close(ck);
    const int64_t shape[] = {3, 2};
    hr_tensor *want = make_tensor(HR_BF16, 2, shape, 21);
    assert_same_bytes(t, want);
    hr_tensor_free(t);
    hr_tensor_free(want);
    assert_int_equal(hr_checkpoint_open(idx, &ck), HR_OK); /* the index itself */
    hr_tensor_info info;
    assert_int_equal(hr_checkpoint_info(ck, "embed", &info), HR_OK);
    assert_int_equal(info.dtype, HR_BF16);
    assert_int_equal(hr_checkpoint_info(ck, "nope", &info), HR_ERR_NOT_FOUND);
    assert_error_has("no tensor named 'nope'");
    hr_checkpoint_close(ck);

    /* a tensor the index places in a shard that lacks it */
    const char *bad_map =
        "{\"weight_map\":{\"embed\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes(idx, bad_map, strlen(bad_map));
    assert_int_equal(hr_checkpoint_open(dir, &ck), HR_ERR_NOT_FOUND);
    assert_error_has("tensor 'embed' is missing from its shard 'model-00002-of-00002.safetensors'");
    /* a missing shard */
    const char *missing = "{\"weight_map\":{\"embed\":\"model-00003-of-00003.safetensors\"}}";
    write_bytes(idx, missing, strlen(missing));
    assert_int_equal(hr_checkpoint_open(dir, &ck), HR_ERR_NOT_FOUND);
    assert_error_has("shard 'model-00003-of-00003.safetensors' of the weight_map");
    const char *escape = "{\"weight_map\":{\"embed\":\"../x.safetensors\"}}";
    write_bytes(idx, escape, strlen(escape));
    assert_int_equal(hr_checkpoint_open(dir, &ck), HR_ERR_FORMAT);
    assert_error_has("not a file name inside the model folder");
    write_bytes(idx, "{\"weight_map\":[]}", 17);
    assert_int_equal(hr_checkpoint_open(dir, &ck), HR_ERR_FORMAT);
    assert_error_has("field 'weight_map' must be an object");

    /* model.safetensors wins over the index, as in transformers */
    char single[400];
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    write_shard(single, n1, 1, 0);
    assert_int_equal(hr_checkpoint_open(dir, &ck), HR_OK);
    assert_int_equal(hr_checkpoint_count(ck), 1);
    hr_checkpoint_close(ck);

    char empty[300];
    snprintf(empty, sizeof empty, "%s/empty", g_dir);
    assert_int_equal(mkdir(empty, 0755), 0);
    assert_int_equal(hr_checkpoint_open(empty, &ck), HR_ERR_NOT_FOUND);
    assert_error_has("no model.safetensors or model.safetensors.index.json");
}

static int setup(void **state) {
    snprintf(g_dir, sizeof g_dir, "/tmp/hubrt_test_st_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_all_dtypes),
        cmocka_unit_test(test_header_matches_reference_layout),
        cmocka_unit_test(test_tensor_outlives_handle),
        cmocka_unit_test(test_ranged_matches_mapped),
        cmocka_unit_test(test_write_strided_views),
        cmocka_unit_test(test_write_is_atomic),
        cmocka_unit_test(test_unaligned_tensor),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_truncated_and_missing),
        cmocka_unit_test(test_seed_corpus),
        cmocka_unit_test(test_sharded_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
