/* JSON config reader: typed getters, defaults, nested objects, int-or-list
 * fields, generation_config.json, and messages naming file and field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hubrt.h"

static const char *CONFIG =
    "{\"model_type\":\"qwen3\",\"hidden_size\":1024,\"rms_norm_eps\":1e-06,"
    "\"rope_theta\":1000000,\"tie_word_embeddings\":true,\"sliding_window\":null,"
    "\"eos_token_id\":151645,\"bad_int\":1.5,\"big\":1e300,\"str_num\":\"12\","
    "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768,"
    "\"beta\":\"fast\",\"long_factor\":[1,1.5,2]},\"ids\":[1,2,3],\"mixed\":[1,\"x\"]}";

static void assert_error_is(const char *want) {
    if (strcmp(hr_last_error(), want)) fail_msg("error '%s' != '%s'", hr_last_error(), want);
}

static hr_json_doc *parse(const char *text) {
    hr_json_doc *doc = NULL;
    assert_int_equal(hr_json_doc_parse("config.json", text, strlen(text), &doc), HR_OK);
    return doc;
}

static void test_typed_getters(void **state) {
    hr_json_doc *doc = parse(CONFIG);
    hr_json_obj root = hr_json_doc_root(doc);
    int64_t i;
    double f;
    bool b;
    const char *s;
    assert_int_equal(hr_json_get_i64(root, "hidden_size", 0, &i), HR_OK);
    assert_int_equal(i, 1024);
    assert_int_equal(hr_json_get_i64(root, "num_layers", 28, &i), HR_OK);
    assert_int_equal(i, 28);
    assert_int_equal(hr_json_get_i64(root, "sliding_window", 4096, &i), HR_OK); /* null */
    assert_int_equal(i, 4096);
    assert_int_equal(hr_json_get_f64(root, "rms_norm_eps", 0, &f), HR_OK);
    assert_true(f == 1e-6);
    assert_int_equal(hr_json_get_f64(root, "rope_theta", 0, &f), HR_OK); /* int as float */
    assert_true(f == 1e6);
    assert_int_equal(hr_json_get_bool(root, "tie_word_embeddings", false, &b), HR_OK);
    assert_true(b);
    assert_int_equal(hr_json_get_str(root, "model_type", NULL, &s), HR_OK);
    assert_string_equal(s, "qwen3");
    assert_int_equal(hr_json_get_str(root, "absent", NULL, &s), HR_OK);
    assert_null(s);
    assert_true(hr_json_has(root, "hidden_size"));
    assert_false(hr_json_has(root, "sliding_window"));
    assert_int_equal(hr_json_require(root, "hidden_size"), HR_OK);
    hr_json_doc_free(doc);
}

static void test_errors_name_file_and_field(void **state) {
    hr_json_doc *doc = parse(CONFIG);
    hr_json_obj root = hr_json_doc_root(doc), rs;
    int64_t i;
    double f;
    bool b;
    const char *s;
    assert_int_equal(hr_json_get_i64(root, "bad_int", 0, &i), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'bad_int' must be an integer");
    assert_int_equal(hr_json_get_i64(root, "big", 0, &i), HR_ERR_FORMAT);
    assert_int_equal(hr_json_get_i64(root, "str_num", 0, &i), HR_ERR_FORMAT);
    assert_int_equal(hr_json_get_i64(root, "model_type", 0, &i), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'model_type' must be an integer");
    assert_int_equal(hr_json_get_f64(root, "model_type", 0, &f), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'model_type' must be a number");
    assert_int_equal(hr_json_get_bool(root, "hidden_size", false, &b), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'hidden_size' must be true or false");
    assert_int_equal(hr_json_get_str(root, "hidden_size", NULL, &s), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'hidden_size' must be a string");
    assert_int_equal(hr_json_require(root, "vocab_size"), HR_ERR_NOT_FOUND);
    assert_error_is("config.json: missing field 'vocab_size'");
    assert_int_equal(hr_json_get_obj(root, "hidden_size", &rs), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'hidden_size' must be an object");
    assert_int_equal(hr_json_get_obj(root, "rope_scaling", &rs), HR_OK);
    assert_int_equal(hr_json_get_f64(rs, "beta", 32, &f), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'rope_scaling.beta' must be a number");
    assert_int_equal(hr_json_require(rs, "rope_theta"), HR_ERR_NOT_FOUND);
    assert_error_is("config.json: missing field 'rope_scaling.rope_theta'");
    hr_json_doc_free(doc);
}

static void test_nested_and_lists(void **state) {
    hr_json_doc *doc = parse(CONFIG);
    hr_json_obj root = hr_json_doc_root(doc), rs, none;
    assert_int_equal(hr_json_get_obj(root, "rope_scaling", &rs), HR_OK);
    assert_true(hr_json_obj_present(rs));
    const char *type;
    double f;
    int64_t i;
    assert_int_equal(hr_json_get_str(rs, "rope_type", "default", &type), HR_OK);
    assert_string_equal(type, "yarn");
    assert_int_equal(hr_json_get_f64(rs, "factor", 1, &f), HR_OK);
    assert_true(f == 4.0);
    assert_int_equal(hr_json_get_i64(rs, "original_max_position_embeddings", 0, &i), HR_OK);
    assert_int_equal(i, 32768);
    double lf[4];
    int n;
    assert_int_equal(hr_json_get_f64_list(rs, "long_factor", lf, 4, &n), HR_OK);
    assert_int_equal(n, 3);
    assert_true(lf[1] == 1.5);
    assert_int_equal(hr_json_get_f64_list(rs, "long_factor", lf, 2, &n), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'rope_scaling.long_factor' has 3 entries, at most 2 are supported");

    /* an absent object answers every getter with its default */
    assert_int_equal(hr_json_get_obj(root, "rope_parameters", &none), HR_OK);
    assert_false(hr_json_obj_present(none));
    assert_int_equal(hr_json_get_f64(none, "factor", 8.0, &f), HR_OK);
    assert_true(f == 8.0);
    assert_int_equal(hr_json_require(none, "factor"), HR_ERR_NOT_FOUND);
    assert_error_is("config.json: missing field 'rope_parameters.factor'");

    int64_t ids[4];
    assert_int_equal(hr_json_get_i64_list(root, "eos_token_id", ids, 4, &n), HR_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 151645);
    assert_int_equal(hr_json_get_i64_list(root, "ids", ids, 4, &n), HR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 3);
    assert_int_equal(hr_json_get_i64_list(root, "missing", ids, 4, &n), HR_OK);
    assert_int_equal(n, 0);
    assert_int_equal(hr_json_get_i64_list(root, "mixed", ids, 4, &n), HR_ERR_FORMAT);
    assert_error_is("config.json: field 'mixed' must be an integer or a list of integers");
    assert_int_equal(hr_json_get_i64_list(root, "ids", ids, 2, &n), HR_ERR_FORMAT);
    hr_json_doc_free(doc);
}

static void test_bad_documents(void **state) {
    hr_json_doc *doc = (hr_json_doc *)1;
    assert_int_equal(hr_json_doc_parse("config.json", "{\"a\":", 5, &doc), HR_ERR_FORMAT);
    assert_null(doc);
    assert_non_null(strstr(hr_last_error(), "config.json: not valid JSON"));
    assert_int_equal(hr_json_doc_parse("config.json", "[1]", 3, &doc), HR_ERR_FORMAT);
    assert_error_is("config.json: the top level must be a JSON object");
    assert_int_equal(hr_json_doc_parse("config.json", "{} {}", 5, &doc), HR_ERR_FORMAT);
    assert_non_null(strstr(hr_last_error(), "trailing bytes"));
    assert_int_equal(hr_json_doc_parse("config.json", "", 0, &doc), HR_ERR_FORMAT);
    /* the length bounds the parse: no reading past it */
    assert_int_equal(hr_json_doc_parse("config.json", "{}garbage", 2, &doc), HR_OK);
    hr_json_doc_free(doc);
    assert_int_equal(hr_json_doc_load("/nonexistent/config.json", &doc), HR_ERR_NOT_FOUND);
    assert_non_null(strstr(hr_last_error(), "/nonexistent/config.json: cannot open"));
}

static void test_generation_config(void **state) {
    char path[] = "/tmp/hubrt_test_gen_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\"bos_token_id\":1,\"eos_token_id\":[2,7],\"do_sample\":true,"
                       "\"temperature\":0.6,\"top_p\":0.95,\"top_k\":20,\"pad_token_id\":null,"
                       "\"transformers_version\":\"4.51.0\"}";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    hr_generation_config gc;
    assert_int_equal(hr_generation_config_load(path, &gc), HR_OK);
    assert_int_equal(gc.bos_token_id, 1);
    assert_int_equal(gc.n_eos, 2);
    assert_int_equal(gc.eos_token_ids[1], 7);
    assert_true(gc.do_sample);
    assert_true(gc.temperature == 0.6);
    assert_int_equal(gc.top_k, 20);
    assert_int_equal(gc.pad_token_id, -1);
    assert_int_equal(gc.max_length, 20);       /* transformers' defaults */
    assert_int_equal(gc.max_new_tokens, -1);
    assert_true(gc.repetition_penalty == 1.0);

    FILE *f = fopen(path, "w");
    fputs("{\"top_k\":\"many\"}", f);
    fclose(f);
    assert_int_equal(hr_generation_config_load(path, &gc), HR_ERR_FORMAT);
    assert_non_null(strstr(hr_last_error(), ": field 'top_k' must be an integer"));
    assert_int_equal(gc.top_k, 50); /* left at the defaults */
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_typed_getters),
        cmocka_unit_test(test_errors_name_file_and_field),
        cmocka_unit_test(test_nested_and_lists),
        cmocka_unit_test(test_bad_documents),
        cmocka_unit_test(test_generation_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
