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
#include <unistd.h>

#include "io/gguf.h"
#include "io/gguf_write.h"
#include "fuzz_limits.h"

#define VOCAB 128

static char dir[64], out[96];
static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "config.json"};

static void cleanup(void) { /* the scratch folder goes with the process */
    char path[128];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    unlink(out);
    rmdir(dir);
}

static void put(const char *name, const char *data, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    fclose(f);
}

/* The next part of [*p, end) up to the separator (or the end). */
static size_t part(const char **p, const char *end, const char **start) {
    static const char sep[] = "\n--\n";
    *start = *p;
    const char *hit = memmem(*p, (size_t)(end - *p), sep, sizeof sep - 1);
    size_t n = hit ? (size_t)(hit - *p) : (size_t)(end - *p);
    *p = hit ? hit + sizeof sep - 1 : end;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/hubrt-fuzz-tokw-XXXXXX");
        if (!mkdtemp(dir)) abort();
        snprintf(out, sizeof out, "%s/out.gguf", dir);
        atexit(cleanup);
    }
    const char *p = (const char *)data, *end = p + size, *s;
    for (int i = 0; i < 3; i++) {
        size_t n = part(&p, end, &s);
        put(names[i], s, n);
    }
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
