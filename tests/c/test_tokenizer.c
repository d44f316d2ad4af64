/* Tokenizer unit tests: known ids for the shared tokenizers, a small BPE
 * built in memory, normal forms by pieces against utf8proc over every code
 * point, streaming detokenization, and errors on bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <utf8proc.h>

#include "hubrt.h"
#include "tokenizer/tk_internal.h"

static hr_tokenizer *load_shared(const char *name) {
    const char *dir = getenv("HUBRT_SHARED_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/data/tokenizers/%s", dir ? dir : "../shared", name);
    hr_tokenizer *t = NULL;
    if (hr_tokenizer_load(path, &t) != HR_OK) {
        print_message("skipping %s: %s\n", name, hr_last_error());
        return NULL;
    }
    return t;
}

static void expect_ids(const hr_tokenizer *t, const char *text, bool special, const int32_t *want, size_t n) {
    int32_t *ids;
    size_t k;
    assert_int_equal(hr_tokenizer_encode(t, text, strlen(text), special, &ids, &k), HR_OK);
    assert_int_equal(k, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    hr_tokenizer_free_array(ids);
}

static void expect_decode(const hr_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *want) {
    char *text;
    size_t len;
    assert_int_equal(hr_tokenizer_decode(t, ids, n, skip, &text, &len), HR_OK);
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    hr_tokenizer_free_array(text);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)

/* ---- the shared tokenizers (ids from the tokenizers library) ---------------- */

static void test_qwen3(void **state) {
    hr_tokenizer *t = load_shared("qwen3");
    if (!t) skip();
    expect_ids(t, "Hello world! 12345", true, IDS(9707, 1879, 0, 220, 16, 17, 18, 19, 20));
    expect_ids(t, "<|im_start|>user\n你好 😀<|im_end|>", false, IDS(151644, 872, 198, 108386, 90316, 151645));
    expect_decode(t, IDS(151644, 872, 198, 108386, 90316, 151645), false, "<|im_start|>user\n你好 😀<|im_end|>");
    expect_decode(t, IDS(151644, 872, 198, 108386, 90316, 151645), true, "user\n你好 😀");
    assert_int_equal(hr_tokenizer_eos_id(t), 151645);
    assert_int_equal(hr_tokenizer_pad_id(t), 151643);
    assert_int_equal(hr_tokenizer_bos_id(t), -1);
    assert_int_equal(hr_tokenizer_add_bos(t), 0);
    assert_non_null(hr_tokenizer_chat_template(t));
    assert_int_equal(hr_tokenizer_vocab_size(t), 151669);
    assert_true(hr_tokenizer_is_special(t, 151644));
    assert_false(hr_tokenizer_is_special(t, 872));
    hr_tokenizer_free(t);
}

static void test_llama3(void **state) {
    hr_tokenizer *t = load_shared("llama3");
    if (!t) skip();
    expect_ids(t, "Hello world! 12345", true, IDS(9906, 1917, 0, 220, 4513, 1774));
    expect_ids(t, "<start_of_turn>x\xE2\x96\x81 y", false, IDS(27, 2527, 3659, 38374, 29357, 10634, 223, 379));
    assert_int_equal(hr_tokenizer_bos_id(t), 128000);
    assert_int_equal(hr_tokenizer_eos_id(t), 128001);
    hr_tokenizer_free(t);
}

static void test_gemma3(void **state) {
    hr_tokenizer *t = load_shared("gemma3");
    if (!t) skip();
    expect_ids(t, "Hello world! 12345", true, IDS(2, 9259, 1902, 236888, 236743, 236770, 236778, 236800, 236812, 236810));
    expect_ids(t, "<start_of_turn>x\xE2\x96\x81 y", true, IDS(2, 105, 236781, 138, 236762));
    /* U+2A6D6 is not in the vocabulary: four byte-fallback tokens. */
    expect_ids(t, "\xF0\xAA\x9B\x96", false, IDS(478, 408, 393, 388));
    expect_decode(t, IDS(478, 408, 393, 388), false, "\xF0\xAA\x9B\x96");
    /* An unfinished sequence decodes as one U+FFFD per byte, as tokenizers does. */
    expect_decode(t, IDS(478, 408), false, "\xEF\xBF\xBD\xEF\xBF\xBD");
    assert_int_equal(hr_tokenizer_bos_id(t), 2);
    assert_int_equal(hr_tokenizer_add_bos(t), 1);
    assert_int_equal(hr_tokenizer_add_eos(t), 0);
    hr_tokenizer_free(t);
}

static void test_stream_holds_partial_characters(void **state) {
    hr_tokenizer *t = load_shared("gemma3");
    if (!t) skip();
    hr_detokenizer *d;
    assert_int_equal(hr_detokenizer_init(t, false, &d), HR_OK);
    const int32_t ids[] = {9259, 478, 408, 393, 388, 236781};
    const char *want[] = {"Hello", "", "", "", "\xF0\xAA\x9B\x96", "x"};
    for (size_t i = 0; i < 6; i++) {
        const char *s;
        size_t n;
        assert_int_equal(hr_detokenizer_push(d, ids[i], &s, &n), HR_OK);
        assert_int_equal(n, strlen(want[i]));
        assert_memory_equal(s, want[i], n);
    }
    const char *s;
    size_t n;
    assert_int_equal(hr_detokenizer_push(d, 1 << 30, &s, &n), HR_ERR_NOT_FOUND);
    assert_int_equal(hr_detokenizer_flush(d, &s, &n), HR_OK);
    assert_int_equal(n, 0);
    hr_detokenizer_free(d);
    hr_tokenizer_free(t);
}

/* ---- a small BPE in memory ------------------------------------------------------ */

static const char TINY[] =
    "{\"added_tokens\": [{\"id\": 9, \"content\": \"<s>\", \"special\": true, \"normalized\": false}],"
    " \"normalizer\": {\"type\": \"Lowercase\"},"
    " \"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"},"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
    "   {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [9], \"tokens\": [\"<s>\"]}}},"
    " \"decoder\": {\"type\": \"Fuse\"},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"?\", \"fuse_unk\": true,"
    "   \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \"aa\": 6, \"?\": 7, \"<s>\": 9},"
    "   \"merges\": [\"a b\", [\"a\", \"a\"], \"b c\", \"ab c\"]}}";

static void test_tiny_bpe(void **state) {
    hr_tokenizer *t;
    assert_int_equal(hr_tokenizer_load_json(TINY, strlen(TINY), &t), HR_OK);
    expect_ids(t, "ABC aaa bcx", false, IDS(5, 6, 0, 4, 7));
    expect_ids(t, "xyz<s>ab", true, IDS(9, 7, 9, 3));
    expect_ids(t, "", true, IDS(9));
    expect_decode(t, IDS(5, 6, 9, 7), false, "abcaa<s>?");
    expect_decode(t, IDS(5, 6, 9, 7), true, "abcaa?");
    assert_int_equal(hr_tokenizer_vocab_size(t), 10);
    int32_t id;
    assert_int_equal(hr_tokenizer_token_to_id(t, "abc", 3, &id), HR_OK);
    assert_int_equal(id, 5);
    assert_int_equal(hr_tokenizer_token_to_id(t, "zz", 2, &id), HR_ERR_NOT_FOUND);
    const char *tok;
    size_t len;
    assert_int_equal(hr_tokenizer_id_to_token(t, 4, &tok, &len), HR_OK);
    assert_int_equal(len, 2);
    assert_memory_equal(tok, "bc", 2);
    assert_int_equal(hr_tokenizer_id_to_token(t, 8, &tok, &len), HR_ERR_NOT_FOUND);

    const char *texts[] = {"abc", "", "c b a", "aaaa"};
    int32_t **ids;
    size_t *counts;
    assert_int_equal(hr_tokenizer_encode_batch(t, texts, NULL, 4, false, 3, &ids, &counts), HR_OK);
    assert_int_equal(counts[0], 1);
    assert_int_equal(counts[1], 0);
    assert_int_equal(counts[2], 3);
    assert_int_equal(counts[3], 2);
    hr_tokenizer_free_batch(ids, counts, 4);
    hr_tokenizer_free(t);
}

static void test_tiny_offsets(void **state) {
    hr_tokenizer *t;
    assert_int_equal(hr_tokenizer_load_json(TINY, strlen(TINY), &t), HR_OK);
    /* "\xC3\x84" (Ä) lowercases to ä, unknown: one unk over both bytes. */
    const char *text = "ABC aaa \xC3\x84" "bc";
    int32_t *ids;
    hr_offset *offs;
    size_t n;
    assert_int_equal(hr_tokenizer_encode_offsets(t, text, strlen(text), true, HR_OFFSETS_BYTES, &ids, &offs, &n), HR_OK);
    const int32_t want_ids[] = {9, 5, 6, 0, 7, 4};
    const hr_offset want_bytes[] = {{0, 0}, {0, 3}, {4, 6}, {6, 7}, {8, 10}, {10, 12}};
    assert_int_equal(n, 6);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ids[i], want_ids[i]);
        assert_int_equal(offs[i].start, want_bytes[i].start);
        assert_int_equal(offs[i].end, want_bytes[i].end);
    }
    hr_tokenizer_free_array(ids);
    hr_tokenizer_free_array(offs);
    assert_int_equal(hr_tokenizer_encode_offsets(t, text, strlen(text), false, HR_OFFSETS_CHARS, &ids, &offs, &n), HR_OK);
    assert_int_equal(n, 5);
    assert_int_equal(offs[3].start, 8);
    assert_int_equal(offs[3].end, 9);
    assert_int_equal(offs[4].start, 9);
    assert_int_equal(offs[4].end, 11);
    hr_tokenizer_free_array(ids);
    hr_tokenizer_free_array(offs);
    assert_int_equal(hr_tokenizer_encode_offsets(t, "a", 1, false, (hr_offset_unit)7, &ids, &offs, &n), HR_ERR_INVALID_ARG);
    hr_tokenizer_free(t);
}

static void test_tiny_pair(void **state) {
    hr_tokenizer *t;
    assert_int_equal(hr_tokenizer_load_json(TINY, strlen(TINY), &t), HR_OK);
    int32_t *ids, *types;
    size_t n;
    assert_int_equal(hr_tokenizer_encode_pair(t, "abc", 3, "aa b", 4, false, &ids, &types, &n), HR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 5);
    assert_int_equal(types[0], 0);
    assert_int_equal(ids[2], 1);
    assert_int_equal(types[2], 1);
    hr_tokenizer_free_array(ids);
    hr_tokenizer_free_array(types);
    /* TINY's template has no pair form. */
    assert_int_equal(hr_tokenizer_encode_pair(t, "abc", 3, "b", 1, true, &ids, NULL, &n), HR_ERR_UNSUPPORTED);
    assert_int_equal(hr_tokenizer_encode_pair(t, "abc", 3, "\xFF", 1, false, &ids, NULL, &n), HR_ERR_INVALID_ARG);
    assert_non_null(strstr(hr_last_error(), "second text"));
    hr_tokenizer_free(t);
}

/* ---- errors --------------------------------------------------------------------- */

static void expect_load_error(const char *json, hr_status code, const char *fragment) {
    hr_tokenizer *t = NULL;
    assert_int_equal(hr_tokenizer_load_json(json, strlen(json), &t), code);
    assert_null(t);
    if (!strstr(hr_last_error(), fragment)) fail_msg("error '%s' lacks '%s'", hr_last_error(), fragment);
}

static void test_load_errors(void **state) {
    expect_load_error("{\"model\": {\"type\": \"BPE\",", HR_ERR_FORMAT, "malformed JSON");
    expect_load_error("[]", HR_ERR_FORMAT, "top level must be an object");
    expect_load_error("{}", HR_ERR_FORMAT, "missing field 'model'");
    expect_load_error("{\"pre_tokenizer\": {\"type\": \"Foo\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
                      HR_ERR_UNSUPPORTED, "unsupported pre-tokenizer 'Foo'");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a q\"]}}", HR_ERR_FORMAT,
                      "merge 0 names token 'q' that is not in the vocab");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}", HR_ERR_FORMAT,
                      "produces 'aa'");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", HR_ERR_FORMAT,
                      "vocab entry 'a'");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"normalizer\": {\"type\": \"Replace\"}}",
                      HR_ERR_FORMAT, "field 'pattern'");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\","
                      " \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
                      HR_ERR_FORMAT, "does not compile");
    expect_load_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\"]]}}", HR_ERR_FORMAT, "vocab entry 0");
    hr_tokenizer *t;
    assert_int_equal(hr_tokenizer_load("/nonexistent/tokenizer.json", &t), HR_ERR_NOT_FOUND);
}

static void test_encode_decode_errors(void **state) {
    hr_tokenizer *t;
    assert_int_equal(hr_tokenizer_load_json(TINY, strlen(TINY), &t), HR_OK);
    int32_t *ids;
    size_t n;
    assert_int_equal(hr_tokenizer_encode(t, "ab\xC3(", 4, false, &ids, &n), HR_ERR_INVALID_ARG);
    assert_non_null(strstr(hr_last_error(), "byte 2"));
    assert_int_equal(hr_tokenizer_encode(t, "\xED\xA0\x80", 3, false, &ids, &n), HR_ERR_INVALID_ARG);
    char *text;
    assert_int_equal(hr_tokenizer_decode(t, IDS(0, 42), false, &text, &n), HR_ERR_INVALID_ARG);
    assert_non_null(strstr(hr_last_error(), "id 42 at position 1"));
    assert_int_equal(hr_tokenizer_decode(t, IDS(-3), false, &text, &n), HR_ERR_INVALID_ARG);
    assert_int_equal(hr_tokenizer_encode(NULL, "a", 1, false, &ids, &n), HR_ERR_INVALID_ARG);
    hr_tokenizer_free(t);
}

/* ---- Unicode normal forms by pieces ------------------------------------------------ */

static void check_form(const tk_normalizer *nz, utf8proc_option_t opt, tk_ws *ws, tk_buf *out, const int32_t *cps,
                       size_t n) {
    char s[32];
    size_t len = 0;
    for (size_t i = 0; i < n; i++) len += tk_utf8_encode(cps[i], s + len);
    tk_align al[32];
    for (size_t i = 0; i < len; i++) al[i] = (tk_align){(uint32_t)i, (uint32_t)i + 1};
    tk_aligns out_al = {0};
    assert_int_equal(tk_normalize(nz, s, al, len, out, &out_al, ws), HR_OK);
    assert_int_equal(out_al.n, out->n);
    tk_aligns_free(&out_al);
    utf8proc_uint8_t *want = NULL;
    utf8proc_ssize_t wn = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &want, UTF8PROC_STABLE | opt);
    assert_true(wn >= 0);
    if ((size_t)wn != out->n || memcmp(want, out->p, out->n))
        fail_msg("normal form %d differs for U+%04X in context U+%04X..U+%04X", (int)opt, cps[1], cps[0], cps[n - 1]);
    free(want);
}

/* Normalizing piece by piece between cuts must equal normalizing the whole,
 * for every code point between neighbours that compose, reorder or
 * decompose. */
static void test_normal_forms_by_pieces(void **state) {
    static const struct {
        const char *json;
        utf8proc_option_t opt;
    } forms[] = {
        {"{\"type\": \"NFC\"}", UTF8PROC_COMPOSE},
        {"{\"type\": \"NFD\"}", UTF8PROC_DECOMPOSE},
        {"{\"type\": \"NFKC\"}", UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
        {"{\"type\": \"NFKD\"}", UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT},
    };
    for (size_t f = 0; f < 4; f++) {
        cJSON *j = cJSON_Parse(forms[f].json);
        tk_normalizer *nz;
        assert_int_equal(tk_normalizer_parse(j, &nz), HR_OK);
        cJSON_Delete(j);
        tk_ws ws = {0};
        tk_buf out = {0};
        for (int32_t cp = 0x80; cp < 0x32000; cp++) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            if (cp >= 0x20000 && cp < 0x2F800 && (cp & 0xFF)) continue; /* unified ideographs: sample */
            check_form(nz, forms[f].opt, &ws, &out, (const int32_t[]){'a', cp, 0x301, 'b'}, 4);
            check_form(nz, forms[f].opt, &ws, &out, (const int32_t[]){0x1100, cp, 0x1161, 0x11A8}, 4);
            check_form(nz, forms[f].opt, &ws, &out, (const int32_t[]){0xE9, cp, 0x327, 0x300}, 4);
        }
        tk_buf_free(&out);
        tk_ws_clear(&ws);
        tk_normalizer_free(nz);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_stream_holds_partial_characters),
        cmocka_unit_test(test_tiny_bpe),
        cmocka_unit_test(test_tiny_offsets),
        cmocka_unit_test(test_tiny_pair),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_encode_decode_errors),
        cmocka_unit_test(test_normal_forms_by_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
