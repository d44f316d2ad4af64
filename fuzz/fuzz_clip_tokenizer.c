/* libFuzzer target: a CLIPTokenizer folder without tokenizer.json (vocab.json
 * + merges.txt + tokenizer_config.json, as SD3 ships them), built into a
 * tokenizer (tokenizer/tk_clip.c). The input is the three files' bytes
 * separated by a line "\n--\n"; they are written into one scratch folder.
 * A folder that loads must encode a few texts and decode its own ids; one
 * that does not must say why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hubrt/tokenizer.h"
#include "fuzz_limits.h"

static char dir[64];

static void cleanup(void) { /* the scratch folder goes with the process */
    static const char *const names[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};
    char path[128];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
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
        snprintf(dir, sizeof dir, "/tmp/hubrt-fuzz-clip-XXXXXX");
        if (!mkdtemp(dir)) abort();
        atexit(cleanup);
    }
    const char *p = (const char *)data, *end = p + size, *s;
    size_t n = part(&p, end, &s);
    put("vocab.json", s, n);
    n = part(&p, end, &s);
    put("merges.txt", s, n);
    n = part(&p, end, &s);
    put("tokenizer_config.json", s, n);
    hr_tokenizer *t = NULL;
    if (hr_tokenizer_load(dir, &t) != HR_OK) {
        if (!hr_last_error()[0]) abort();
        return 0;
    }
    static const char *texts[] = {"", "a photo of a cat!!", "  Caf\xC3\xA9 <|startoftext|>12 we'll\tgo <|endoftext|>"};
    for (int i = 0; i < 3; i++) {
        int32_t *ids;
        size_t m;
        if (hr_tokenizer_encode(t, texts[i], strlen(texts[i]), true, &ids, &m) != HR_OK) {
            if (!hr_last_error()[0]) abort();
            continue;
        }
        char *out;
        size_t out_len;
        if (hr_tokenizer_decode(t, ids, m, false, &out, &out_len) != HR_OK) abort(); /* own ids always decode */
        hr_tokenizer_free_array(out);
        hr_tokenizer_free_array(ids);
    }
    hr_tokenizer_free(t);
    return 0;
}
