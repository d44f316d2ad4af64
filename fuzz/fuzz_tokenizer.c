/* libFuzzer target: the tokenizer.json loader and encode/decode.
 *
 * The first byte picks the mode. Mode 0: the rest is a tokenizer.json; one
 * that loads must encode and decode a few fixed texts. Otherwise the rest is
 * text for a fixed tokenizer that chains many components. Either way, ids
 * must come out the same with and without offsets, offsets must lie in the
 * text, own ids must decode, and the input read as ids must decode or fail
 * cleanly. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hubrt/tokenizer.h"
#include "fuzz_limits.h"

static const char PIPELINE[] =
    "{\"added_tokens\": ["
    "  {\"id\": 12, \"content\": \"<s>\", \"special\": true, \"normalized\": false, \"lstrip\": true, \"rstrip\": true},"
    "  {\"id\": 13, \"content\": \"ab\", \"special\": false, \"normalized\": true, \"single_word\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Lowercase\"},"
    "   {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"content\": \" \"}, {\"type\": \"Prepend\", \"prepend\": \"_\"}]},"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "   {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}| ?\\\\p{L}+|\\\\s+(?!\\\\S)\"}, \"behavior\": \"Isolated\", \"invert\": false},"
    "   {\"type\": \"Digits\", \"individual_digits\": true}, {\"type\": \"Metaspace\", \"prepend_scheme\": \"first\"},"
    "   {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
    "   {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [12], \"tokens\": [\"<s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteLevel\"}, {\"type\": \"ByteFallback\"},"
    "   {\"type\": \"Metaspace\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 1}, {\"type\": \"Fuse\"}]},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"?\", \"fuse_unk\": true, \"byte_fallback\": true,"
    "   \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \"aa\": 6, \"?\": 7,"
    "     \"<0x41>\": 8, \"<0xC3>\": 9, \"<0xA9>\": 10, \"\\u0120\": 11, \"<s>\": 12, \"ab\\u0120\": 14},"
    "   \"merges\": [\"a b\", \"a a\", \"b c\", \"ab c\", \"ab \\u0120\"]}}";

static hr_tokenizer *fixed;
static volatile size_t sink;

static void roundtrip(const hr_tokenizer *t, const char *text, size_t len) {
    int32_t *ids;
    size_t n;
    if (hr_tokenizer_encode(t, text, len, true, &ids, &n) != HR_OK) {
        if (!hr_last_error()[0]) abort();
        return;
    }
    char *out;
    size_t out_len;
    if (hr_tokenizer_decode(t, ids, n, false, &out, &out_len) != HR_OK) abort(); /* own ids always decode */
    sink += out_len + strlen(out);
    hr_tokenizer_free_array(out);
    /* With offsets: the same ids, and every range inside the text. */
    int32_t *ids2;
    hr_offset *offs;
    size_t n2;
    for (int unit = HR_OFFSETS_BYTES; unit <= HR_OFFSETS_CHARS; unit++) {
        if (hr_tokenizer_encode_offsets(t, text, len, true, (hr_offset_unit)unit, &ids2, &offs, &n2) != HR_OK || n2 != n ||
            memcmp(ids, ids2, n * sizeof *ids))
            abort();
        for (size_t i = 0; i < n; i++)
            if (offs[i].start > offs[i].end || offs[i].end > len) abort();
        hr_tokenizer_free_array(offs);
        hr_tokenizer_free_array(ids2);
    }
    /* The text as both halves of a pair: twice the ids, or a clean error. */
    int32_t *types;
    if (hr_tokenizer_encode_pair(t, text, len, text, len, false, &ids2, &types, &n2) == HR_OK) {
        for (size_t i = 0; i < n2; i++)
            if (types[i] < 0 || types[i] > 1) abort();
        hr_tokenizer_free_array(types);
        hr_tokenizer_free_array(ids2);
    } else if (!hr_last_error()[0]) {
        abort();
    }
    hr_tokenizer_free_array(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (!fixed && hr_tokenizer_load_json(PIPELINE, strlen(PIPELINE), &fixed) != HR_OK) abort();
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] == 0) {
        hr_tokenizer *t;
        if (hr_tokenizer_load_json(rest, n, &t) != HR_OK) {
            if (!hr_last_error()[0]) abort();
            return 0;
        }
        static const char *texts[] = {"", "Hello world", "  a\tb\n\n123 \xC3\xA9\xF0\x9F\x98\x80 <s></s>"};
        for (int i = 0; i < 3; i++) roundtrip(t, texts[i], strlen(texts[i]));
        hr_tokenizer_free(t);
        return 0;
    }
    roundtrip(fixed, rest, n);
    int32_t ids[64];
    size_t k = 0;
    for (size_t i = 0; i + 1 < n && k < 64; i += 2) ids[k++] = (int32_t)(int8_t)rest[i] * 4 + (rest[i + 1] & 3);
    char *out;
    size_t out_len;
    if (hr_tokenizer_decode(fixed, ids, k, data[0] & 1, &out, &out_len) == HR_OK) {
        sink += out_len;
        hr_tokenizer_free_array(out);
    } else if (!hr_last_error()[0]) {
        abort();
    }
    return 0;
}
