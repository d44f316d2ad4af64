/* libFuzzer target: JSON config parsing and the typed getters, the way
 * model code reads config.json (nested objects, int-or-list fields). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hubrt/io.h"
#include "fuzz_limits.h"

/* Keeps the reads of returned strings from being optimised away. */
static volatile size_t sink;

static void read_fields(hr_json_obj o) {
    int64_t i;
    double f;
    bool b;
    const char *s;
    int64_t ids[8];
    double fl[8];
    int n;
    (void)hr_json_get_i64(o, "hidden_size", 0, &i);
    (void)hr_json_get_f64(o, "rope_theta", 1e4, &f);
    (void)hr_json_get_bool(o, "tie_word_embeddings", false, &b);
    (void)hr_json_get_str(o, "model_type", NULL, &s);
    if (s) sink += strlen(s);
    (void)hr_json_get_i64_list(o, "eos_token_id", ids, 8, &n);
    (void)hr_json_get_f64_list(o, "short_factor", fl, 8, &n);
    (void)hr_json_require(o, "vocab_size");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hr_json_doc *doc;
    if (hr_json_doc_parse("config.json", (const char *)data, size, &doc) != HR_OK) return 0;
    hr_json_obj root = hr_json_doc_root(doc), rope, inner;
    read_fields(root);
    if (hr_json_get_obj(root, "rope_scaling", &rope) == HR_OK) {
        read_fields(rope);
        if (hr_json_get_obj(rope, "rope_parameters", &inner) == HR_OK) read_fields(inner);
    }
    hr_json_doc_free(doc);
    return 0;
}
