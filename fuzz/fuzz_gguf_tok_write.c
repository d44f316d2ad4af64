/* libFuzzer target: a model folder's tokenizer files as GGUF tokenizer
 * metadata (io/gguf_tok_write.c, what `hubrt quantize` writes). The input
 * is tokenizer.json, tokenizer_config.json and config.json separated by a
 * line "\n--\n", written into one scratch folder. A tokenizer that is
 * written must make a GGUF file that hubrt's own reader parses back with
 * a table of the asked size and a tokenizer.json it can build; one that is
 * not must say why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "io/gguf_write.h"
#include "fuzz_folder.h"
#include "fuzz_limits.h"

#define VOCAB 128

static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "config.json", "out.gguf"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_folder(data, size, names, 4, 3);
    char out[96];
    snprintf(out, sizeof out, "%s/%s", dir, names[3]);
    hr_gguf_writer *w = NULL;
    if (hr_gguf_writer_new(out, &w) != HR_OK) abort();
    hr_status st = hr_gguf_w_tokenizer(w, dir, VOCAB);
    if (st == HR_OK) st = hr_gguf_w_write(w, out);
    hr_gguf_writer_free(w);
    if (st != HR_OK) {
        if (!hr_last_error()[0]) abort();
        return 0;
    }
    hr_gguf *g = NULL;
    if (hr_gguf_open(out, &g) != HR_OK) abort(); /* what we write, we read */
    const gguf_kv *toks = hr_gguf_find(g, "tokenizer.ggml.tokens");
    if (!toks || toks->n != VOCAB) abort();
    char *json = NULL;
    size_t len = 0;
    if (hr_gguf_tokenizer_json_of(g, &json, &len) != HR_OK && !hr_last_error()[0]) abort();
    free(json);
    hr_gguf_close(g);
    return 0;
}
