/* libFuzzer target: a CLIPTokenizer folder without tokenizer.json (vocab.json
 * + merges.txt + tokenizer_config.json, as SD3 ships them), built into a
 * tokenizer (tokenizer/tk_clip.c). The input is the three files' bytes
 * separated by a line "\n--\n"; they are written into one scratch folder.
 * A folder that loads must encode a few texts and decode its own ids; one
 * that does not must say why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hubrt/tokenizer.h"
#include "fuzz_folder.h"
#include "fuzz_limits.h"

static const char *const names[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_folder(data, size, names, 3, 3);
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
