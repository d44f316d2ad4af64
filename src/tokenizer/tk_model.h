/* The models (BPE, WordPiece, Unigram) and the vocabulary they share. */
#ifndef HR_TOKENIZER_TK_MODEL_H
#define HR_TOKENIZER_TK_MODEL_H

#include "tokenizer/tk_internal.h"

/* id <-> token string. Strings live in one arena; ids are mostly dense
 * [0, n). A file may claim any id for an entry (tokenizers takes any u32):
 * ids far past the entry count sit in a map instead of sizing the arrays. */
typedef struct {
    char *arena;
    uint32_t *off, *len; /* (n) */
    size_t n;       /* dense ids 0..n-1 (holes read as unset) */
    size_t entries; /* strings in the file's vocab: tokenizers' vocab size */
    tk_u64map far;  /* id >= n -> off << 32 | len */
    int64_t max_id;
    tk_strmap map;
} tk_vocab;

/* The string of any id (dense or far); NULL when unset. */
const char *tk_vocab_token(const tk_vocab *v, int32_t id, size_t *len);

/* Fills v from a JSON object {token: id}; `what` names it in errors. */
hr_status tk_vocab_from_object(const cJSON *obj, const char *what, tk_vocab *v);
/* Fills v from Unigram's [[token, score], ...], writing scores. */
hr_status tk_vocab_from_pairs(const cJSON *arr, const char *what, tk_vocab *v, double **scores);
void tk_vocab_free(tk_vocab *v);
static inline int32_t tk_vocab_get(const tk_vocab *v, const char *s, size_t n) { return tk_strmap_get(&v->map, s, n); }

/* Characters of the Basic Multilingual Plane (the byte-level alphabet among them). */
#define TK_CHAR_IDS 0x10000

typedef enum { TK_MODEL_BPE, TK_MODEL_WORDPIECE, TK_MODEL_UNIGRAM, TK_MODEL_WORDLEVEL } tk_model_type;

struct tk_model {
    tk_model_type type;
    tk_vocab vocab;
    int32_t unk_id;             /* -1 when none */
    char *prefix, *suffix;      /* continuing_subword_prefix, end_of_word_suffix ("" when none) */
    size_t prefix_len, suffix_len;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_ids[256];      /* <0xXX> token ids for byte fallback, -1 when absent */
    int32_t char_ids[TK_CHAR_IDS]; /* BPE: id of each one-character token in the BMP, or -1 */
    tk_u64map merges;           /* BPE: (left << 32 | right) -> (rank << 32 | merged id) */
    size_t max_input_chars;     /* WordPiece */
    double *scores;             /* Unigram (vocab.n) */
    double min_score;
    tk_u64map trie;             /* Unigram: (node << 8 | byte) -> child node */
    int32_t *trie_ids;          /* Unigram: token id ending at each node, -1 (n_trie) */
    size_t n_trie;
};

hr_status tk_bpe_parse(const cJSON *j, tk_model *m);
hr_status tk_bpe_tokenize(const tk_model *m, const char *s, size_t n, tk_ids *out, tk_ids *offs, tk_ws *ws);
void tk_bpe_scratch_free(void *scratch);

hr_status tk_wordpiece_parse(const cJSON *j, tk_model *m);
hr_status tk_wordpiece_tokenize(const tk_model *m, const char *s, size_t n, tk_ids *out, tk_ids *offs);

hr_status tk_wordlevel_parse(const cJSON *j, tk_model *m);

hr_status tk_unigram_parse(const cJSON *j, tk_model *m);
hr_status tk_unigram_tokenize(const tk_model *m, const char *s, size_t n, tk_ids *out, tk_ids *offs, tk_ws *ws);
void tk_unigram_scratch_free(void *scratch);

#endif
