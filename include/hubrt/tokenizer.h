/* hubrt tokenizers: tokenizer.json in C (public API).
 *
 * Reads a Hugging Face tokenizer.json (plus tokenizer_config.json and
 * special_tokens_map.json beside it) and encodes and decodes exactly as the
 * `tokenizers` library does. A loaded tokenizer is immutable and may be used
 * from many threads at once. Arrays returned to the caller are freed with
 * hr_tokenizer_free_array. */
#ifndef HUBRT_TOKENIZER_H
#define HUBRT_TOKENIZER_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_tokenizer hr_tokenizer;

/* `path` is a model folder (holding tokenizer.json), a tokenizer.json file,
 * or a GGUF model (a .gguf file, or a folder whose one .gguf is its model
 * and which has no tokenizer.json): its vocabulary, special tokens and
 * chat template from the metadata (hr_gguf_tokenizer_json and
 * hr_gguf_tokenizer_config_json). tokenizer_config.json and
 * special_tokens_map.json beside a tokenizer.json add special tokens and
 * the chat template. A folder of vocab.json + merges.txt without a
 * tokenizer.json (SD3's CLIP tokenizers) is read as transformers'
 * CLIPTokenizer builds it. */
HR_API hr_status hr_tokenizer_load(const char *path, hr_tokenizer **out);
/* From tokenizer.json text in memory; no tokenizer_config.json. */
HR_API hr_status hr_tokenizer_load_json(const char *json, size_t len, hr_tokenizer **out);
HR_API void hr_tokenizer_free(hr_tokenizer *tok);

/* Encodes text[0..len) (UTF-8; invalid UTF-8 is an error naming the byte).
 * add_special adds the post-processor's special tokens (BOS and the like).
 * *ids is malloc'ed: free it with hr_tokenizer_free_array. */
HR_API hr_status hr_tokenizer_encode(const hr_tokenizer *tok, const char *text, size_t len, bool add_special,
                                     int32_t **ids, size_t *n_ids);
/* A token's range [start, end) in the encoded text; tokens the
 * post-processor adds have (0, 0). */
typedef struct hr_offset {
    uint32_t start, end;
} hr_offset;

typedef enum hr_offset_unit {
    HR_OFFSETS_BYTES = 0, /* as tokenizers' Rust Tokenizer::encode */
    HR_OFFSETS_CHARS = 1, /* code points, as tokenizers' Python Encoding.offsets */
} hr_offset_unit;

/* hr_tokenizer_encode, and each token's range in text (*offsets, one per id,
 * freed with hr_tokenizer_free_array). Ranges follow tokenizers' alignments
 * (a token covering part of a character covers all of it); the unit matters
 * beyond conversion because trim_offsets counts in it, as tokenizers does. */
HR_API hr_status hr_tokenizer_encode_offsets(const hr_tokenizer *tok, const char *text, size_t len, bool add_special,
                                             hr_offset_unit unit, int32_t **ids, hr_offset **offsets, size_t *n_ids);
/* Encodes a pair of texts (a cross-encoder's query and passage) with the
 * post-processor's pair template; *type_ids (may be NULL) gets each token's
 * segment. Both arrays are freed with hr_tokenizer_free_array. */
HR_API hr_status hr_tokenizer_encode_pair(const hr_tokenizer *tok, const char *a, size_t a_len, const char *b,
                                          size_t b_len, bool add_special, int32_t **ids, int32_t **type_ids,
                                          size_t *n_ids);
/* Encodes n texts on up to n_threads threads (0: one per CPU).
 * (*ids)[i] and (*n_ids)[i] hold text i; free with hr_tokenizer_free_batch. */
HR_API hr_status hr_tokenizer_encode_batch(const hr_tokenizer *tok, const char *const *texts, const size_t *lens,
                                           size_t n, bool add_special, int n_threads, int32_t ***ids,
                                           size_t **n_ids);
HR_API void hr_tokenizer_free_batch(int32_t **ids, size_t *n_ids, size_t n);

/* Decodes ids to a NUL-terminated UTF-8 string of *len bytes (malloc'ed).
 * An id outside the vocabulary is an error. */
HR_API hr_status hr_tokenizer_decode(const hr_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                                     char **text, size_t *len);
HR_API void hr_tokenizer_free_array(void *p);

/* Ids are in [0, vocab_size): the model vocabulary and the added tokens. */
HR_API size_t hr_tokenizer_vocab_size(const hr_tokenizer *tok);
/* HR_ERR_NOT_FOUND when the token is unknown. */
HR_API hr_status hr_tokenizer_token_to_id(const hr_tokenizer *tok, const char *token, size_t len, int32_t *id);
/* *token points into the tokenizer (not NUL-terminated; *len bytes). */
HR_API hr_status hr_tokenizer_id_to_token(const hr_tokenizer *tok, int32_t id, const char **token, size_t *len);
HR_API bool hr_tokenizer_is_special(const hr_tokenizer *tok, int32_t id);
/* The model type of tokenizer.json: "BPE", "WordPiece", "WordLevel" or "Unigram". */
HR_API const char *hr_tokenizer_model_type(const hr_tokenizer *tok);

/* Special ids from tokenizer_config.json / special_tokens_map.json; -1 when unset. */
HR_API int32_t hr_tokenizer_bos_id(const hr_tokenizer *tok);
HR_API int32_t hr_tokenizer_eos_id(const hr_tokenizer *tok);
HR_API int32_t hr_tokenizer_pad_id(const hr_tokenizer *tok);
HR_API int32_t hr_tokenizer_unk_id(const hr_tokenizer *tok);
/* add_bos_token / add_eos_token of tokenizer_config.json: 1, 0, or -1 when absent. */
HR_API int hr_tokenizer_add_bos(const hr_tokenizer *tok);
HR_API int hr_tokenizer_add_eos(const hr_tokenizer *tok);
/* The chat_template string of tokenizer_config.json, or NULL. */
HR_API const char *hr_tokenizer_chat_template(const hr_tokenizer *tok);

/* Incremental detokenizer for streaming generation: feed ids one at a time
 * and get back only text that is complete, never a broken UTF-8 sequence;
 * the concatenated output equals hr_tokenizer_decode of all ids. */
typedef struct hr_detokenizer hr_detokenizer;

HR_API hr_status hr_detokenizer_init(const hr_tokenizer *tok, bool skip_special, hr_detokenizer **out);
/* *text (valid until the next call) holds the new text, *len may be 0. */
HR_API hr_status hr_detokenizer_push(hr_detokenizer *d, int32_t id, const char **text, size_t *len);
/* Emits what is left (an unfinished sequence decodes as tokenizers decodes it). */
HR_API hr_status hr_detokenizer_flush(hr_detokenizer *d, const char **text, size_t *len);
HR_API void hr_detokenizer_free(hr_detokenizer *d);

#ifdef __cplusplus
}
#endif
#endif
