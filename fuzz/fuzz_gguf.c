/* libFuzzer target: GGUF parsing from memory. An image that validates must
 * describe tensors inside the input: dequantizing every one (to f32 and
 * bf16, with the q/k permutation when the rows allow it) lets ASan prove
 * it; so must building config.json, tokenizer.json and
 * tokenizer_config.json from its metadata
 * (rope_freqs read from its tensor). Block-quantized matrices are also
 * kept in their blocks and read by the CPU's linear and embedding kernels.
 * Every failure carries a message naming the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hubrt/ops.h"
#include "io/gguf.h"
#include "fuzz_limits.h"

/* A block-quantized matrix kept in its blocks (rows put back in HF order)
 * as the CPU model reads it: a linear over every row and an embedding of
 * its first and last rows. */
static void read_blocks(const hr_gguf *g, const gguf_tensor *t) {
    hr_tensor *w = NULL, *x = NULL, *ids = NULL, *y = NULL, *e = NULL;
    if (hr_gguf_rows_permuted(g, t, 1, &w) != HR_OK) {
        if (strncmp(hr_last_error(), "fuzz.gguf: ", 11) && !strstr(hr_last_error(), "out of memory")) abort();
        return;
    }
    int64_t k = t->ne[0], last = t->ne[1] - 1;
    if (hr_tensor_zeros(NULL, HR_F32, 2, (int64_t[]){1, k}, &x) == HR_OK && hr_linear(x, w, NULL, &y) != HR_OK)
        abort();
    if (hr_tensor_from_host(NULL, HR_I64, 1, (int64_t[]){2}, (int64_t[]){0, last}, 16, &ids) == HR_OK &&
        hr_embedding(w, ids, &e) != HR_OK)
        abort();
    hr_tensor_free(e);
    hr_tensor_free(ids);
    hr_tensor_free(y);
    hr_tensor_free(x);
    hr_tensor_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hr_gguf *g = NULL;
    if (hr_gguf_parse("fuzz.gguf", data, size, &g) != HR_OK) {
        if (strncmp(hr_last_error(), "fuzz.gguf: ", 11)) abort();
        return 0;
    }
    for (size_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        if (hr_gguf_find(g, kv->key) != kv) abort();
        bool ints = kv->type == GGUF_ARRAY && kv->arr_type != GGUF_STRING && kv->arr_type != GGUF_F32 &&
                    kv->arr_type != GGUF_F64 && kv->arr_type != GGUF_BOOL;
        for (uint64_t k = 0; ints && k < kv->n && k < 64; k++) (void)hr_gguf_arr_int(kv, k);
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->ne[d];
        if (numel > (1 << 20)) continue; /* bytes inside the input, but not worth the memory */
        int64_t rows = numel / (t->ne[0] ? t->ne[0] : 1);
        hr_tensor *out = NULL;
        if (hr_gguf_dequant(g, t, HR_F32, 0, &out) == HR_OK) hr_tensor_free(out);
        int64_t heads = t->ndim == 2 && rows % 2 == 0 && rows ? 1 : 0;
        if (hr_gguf_dequant(g, t, HR_BF16, heads, &out) == HR_OK) hr_tensor_free(out);
        if (heads && hr_dtype_is_quantized(hr_gguf_stored_dtype(t))) read_blocks(g, t);
    }
    char *json = NULL;
    size_t len = 0;
    hr_status (*const builders[])(const hr_gguf *, char **, size_t *) = {
        hr_gguf_config_json_of, hr_gguf_tokenizer_json_of, hr_gguf_tokenizer_config_json_of};
    for (int b = 0; b < 3; b++) {
        if (builders[b](g, &json, &len) == HR_OK) {
            if (!json || strlen(json) != len) abort();
            free(json);
        } else if (strncmp(hr_last_error(), "fuzz.gguf: ", 11) && !strstr(hr_last_error(), "out of memory")) {
            abort();
        }
    }
    hr_gguf_close(g);
    return 0;
}
