/* Internal types of the tokenizer pipeline, shared by the component units.
 *
 * Encoding follows the `tokenizers` library step by step: added tokens are cut
 * out of the raw text, the rest is normalized, normalized added tokens are cut
 * out, pre-tokenizers split the pieces, the model turns each piece into ids,
 * and the post-processor adds special tokens. A piece is a span of a shared
 * text buffer; a piece whose id is set is already a token and passes through
 * every later step untouched. */
#ifndef HR_TOKENIZER_TK_INTERNAL_H
#define HR_TOKENIZER_TK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "hubrt/tokenizer.h"
#include "tokenizer/tk_map.h"

/* ---- growable buffers ------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
} tk_buf;

hr_status tk_buf_reserve(tk_buf *b, size_t extra);
hr_status tk_buf_append(tk_buf *b, const void *s, size_t n);
void tk_buf_free(tk_buf *b);

typedef struct {
    int32_t *p;
    size_t n, cap;
} tk_ids;

hr_status tk_ids_push(tk_ids *v, int32_t id);
hr_status tk_ids_append(tk_ids *v, const int32_t *ids, size_t n);
void tk_ids_free(tk_ids *v);

/* Where a byte of transformed text came from: the original byte range of
 * the character it stems from, as tokenizers' NormalizedString alignments. */
typedef struct {
    uint32_t start, end;
} tk_align;

typedef struct {
    tk_align *p;
    size_t n, cap;
} tk_aligns;

/* Appends `count` copies of a. */
hr_status tk_aligns_fill(tk_aligns *v, tk_align a, size_t count);
hr_status tk_aligns_append(tk_aligns *v, const tk_align *src, size_t n);
void tk_aligns_free(tk_aligns *v);

/* One piece of the text: bytes [off, off+len) of the owning tk_pieces text. */
typedef struct {
    uint32_t off, len;
    int32_t id;    /* token id when the piece is an added token, else -1 */
    bool first;    /* starts at offset 0 of the original text */
} tk_piece;

typedef struct {
    tk_buf text;
    bool track;   /* alignments are kept (offsets were asked for) */
    tk_aligns al; /* (text.n when track) alignment of every text byte */
    tk_piece *v;  /* (n) */
    size_t n, cap;
} tk_pieces;

void tk_pieces_reset(tk_pieces *ps, bool track);

/* Alignment pointers are NULL when offsets are not tracked. */
static inline const tk_align *tk_al_at(const tk_align *al, size_t i) { return al ? al + i : NULL; }
static inline tk_align tk_al_get(const tk_align *al, size_t i) { return al ? al[i] : (tk_align){0, 0}; }
static inline const tk_align *tk_pieces_al(const tk_pieces *ps, size_t off) { return ps->track ? ps->al.p + off : NULL; }
void tk_pieces_free(tk_pieces *ps);
/* Appends a copy of s[0..n), with its alignments al[0..n) when tracked, as a new piece. */
hr_status tk_pieces_add(tk_pieces *ps, const char *s, const tk_align *al, size_t n, int32_t id, bool first);

/* ---- UTF-8 and Unicode helpers (tk_utf8.c) ---------------------------- */

/* Decodes one code point of s[0..n) (n >= 1, s valid UTF-8); returns its length. */
size_t tk_utf8_decode(const char *s, size_t n, int32_t *cp);
size_t tk_utf8_encode(int32_t cp, char *out);
/* Length of the longest valid UTF-8 prefix of s[0..n). */
size_t tk_utf8_valid_prefix(const char *s, size_t n);
/* Appends s[0..n) to out, replacing invalid sequences with U+FFFD exactly as
 * Rust's String::from_utf8_lossy does. */
hr_status tk_utf8_lossy_append(tk_buf *out, const char *s, size_t n);
/* Unicode predicates with the meaning Rust's char methods give them. */
bool tk_cp_is_whitespace(int32_t cp);
bool tk_cp_is_numeric(int32_t cp);
bool tk_cp_is_punctuation(int32_t cp);
/* General category class: 'L','M','N','P','S','Z','C' and the utf8proc value. */
int tk_cp_category(int32_t cp);

/* GPT-2 byte <-> printable code point mapping. */
extern const uint16_t tk_byte_to_cp[256];
/* Returns the byte for a mapped code point or -1. */
int tk_cp_to_byte(int32_t cp);

/* Alignments of the normal form of s[0..n) (tk_unicode.c): appends one per
 * byte of `want` (utf8proc's result) to al_out and sets *ok, or leaves
 * al_out and clears *ok when its own result differs from `want`. */
hr_status tk_unicode_traced(bool compose_form, bool compat, const char *s, const tk_align *al, size_t n, tk_buf *want,
                            tk_aligns *al_out, bool *ok);

/* ---- regex (tk_regex.c) ---------------------------------------------- */

typedef struct tk_regex tk_regex;

/* Compiles an Oniguruma-style pattern (as tokenizers uses) with PCRE2 JIT;
 * `literal` treats the pattern as a plain string. */
hr_status tk_regex_compile(const char *pattern, size_t len, bool literal, tk_regex **out);
void tk_regex_free(tk_regex *re);

/* Parses {"String": s} or {"Regex": r}; `what` names the component for errors. */
hr_status tk_pattern_parse(const cJSON *j, const char *what, tk_regex **out);

/* One match or gap of a text: [start, end), match or not. */
typedef struct {
    uint32_t start, end;
    bool match;
} tk_span;

typedef struct {
    tk_span *v;
    size_t n, cap;
} tk_spans;

hr_status tk_spans_push(tk_spans *s, uint32_t start, uint32_t end, bool match);
/* Fills `out` with the matches of `re` in s[0..n) and the gaps between them,
 * covering the whole text, as tokenizers' Pattern::find_matches. */
hr_status tk_regex_find(const tk_regex *re, const char *s, size_t n, tk_spans *out);

/* ---- components --------------------------------------------------------- */

typedef struct tk_normalizer tk_normalizer;
typedef struct tk_pretok tk_pretok;
typedef struct tk_model tk_model;
typedef struct tk_post tk_post;
typedef struct tk_decoder tk_decoder;
typedef struct tk_added tk_added;
typedef struct tk_ws tk_ws;

/* Scratch state of one encode call, pooled by the tokenizer. */
struct tk_ws {
    tk_ws *next;
    tk_pieces pa, pb;
    tk_buf t1, t2, t3;
    tk_aligns a1, a2, a3; /* alignments of t1, t2, t3; a1 first holds the input's */
    tk_spans spans;
    tk_ids ids, offs;
    void *model_scratch; /* owned by the model unit */
};

hr_status tk_normalizer_parse(const cJSON *j, tk_normalizer **out);
void tk_normalizer_free(tk_normalizer *n);
/* Writes the normalized form of s[0..n) into out and the alignment of each
 * output byte into al_out (both cleared first); al gives s's alignments.
 * al and al_out are NULL when offsets are not tracked. */
hr_status tk_normalize(const tk_normalizer *nz, const char *s, const tk_align *al, size_t n, tk_buf *out,
                       tk_aligns *al_out, tk_ws *ws);

hr_status tk_pretok_parse(const cJSON *j, tk_pretok **out);
void tk_pretok_free(tk_pretok *p);
/* Splits the untokenized pieces of `in` into `out` (reset first). */
hr_status tk_pretokenize(const tk_pretok *p, const tk_pieces *in, tk_pieces *out, tk_ws *ws);

hr_status tk_model_parse(const cJSON *j, tk_model **out);
void tk_model_free(tk_model *m);
void tk_model_scratch_free(const tk_model *m, void *scratch);
/* Appends the ids of one pre-tokenized piece, and to offs (when not NULL)
 * each token's byte range in the piece as two values. */
hr_status tk_model_tokenize(const tk_model *m, const char *s, size_t n, tk_ids *out, tk_ids *offs, tk_ws *ws);
int32_t tk_model_token_to_id(const tk_model *m, const char *s, size_t n);
/* NULL when out of range. */
const char *tk_model_id_to_token(const tk_model *m, int32_t id, size_t *len);
size_t tk_model_vocab_size(const tk_model *m);
/* Entries of the vocab as the file lists them (tokenizers' get_vocab_size). */
size_t tk_model_entries(const tk_model *m);

/* Added vocabulary: parsed from "added_tokens", matched with a byte trie. */
hr_status tk_added_parse(const cJSON *j, const tk_normalizer *nz, const tk_model *model, tk_added **out);
void tk_added_free(tk_added *a);
/* Splits s[0..n) on the added tokens (normalized or not) into `out` (appended). */
hr_status tk_added_split(const tk_added *a, bool normalized, const char *s, const tk_align *al, size_t n, bool first,
                         tk_pieces *out);
int32_t tk_added_token_to_id(const tk_added *a, const char *s, size_t n);
const char *tk_added_id_to_token(const tk_added *a, int32_t id, size_t *len, bool *special);
size_t tk_added_count(const tk_added *a);
int32_t tk_added_max_id(const tk_added *a);

hr_status tk_post_parse(const cJSON *j, tk_post **out);
void tk_post_free(tk_post *p);
/* Applies the post-processor to one sequence: with add_special, the special
 * tokens of the single-sequence template; offs (pairs, may be NULL) follows,
 * special tokens getting (0, 0), and ByteLevel/Roberta trim_offsets drops
 * the spaces at the ends of each token from its range. */
hr_status tk_post_process(const tk_post *p, const hr_tokenizer *tok, bool add_special, const tk_ids *in,
                          const tk_ids *in_offs, tk_ids *out, tk_ids *out_offs);
/* Joins the ids of a pair (p may be NULL) with the pair template, and
 * writes each token's type id to types (may be NULL). */
hr_status tk_post_process_pair(const tk_post *p, bool add_special, const tk_ids *a, const tk_ids *b, tk_ids *out,
                               tk_ids *types);

hr_status tk_decoder_parse(const cJSON *j, tk_decoder **out);
void tk_decoder_free(tk_decoder *d);

/* A list of token strings being decoded; each decoder step rewrites it. */
typedef struct {
    tk_buf text;
    uint32_t *off, *len; /* (n) */
    size_t n, cap;
} tk_strs;

hr_status tk_strs_push(tk_strs *s, const char *p, size_t n);
void tk_strs_reset(tk_strs *s);
void tk_strs_free(tk_strs *s);
/* Runs the decoder chain and writes the joined string to out. */
hr_status tk_decode_tokens(const tk_decoder *d, tk_strs *toks, tk_buf *out);

/* Shared helper: applies a Split behavior to the spans of one piece and adds
 * the resulting sub-pieces of s to out. */
typedef enum {
    TK_SPLIT_REMOVED,
    TK_SPLIT_ISOLATED,
    TK_SPLIT_MERGED_WITH_PREVIOUS,
    TK_SPLIT_MERGED_WITH_NEXT,
    TK_SPLIT_CONTIGUOUS,
} tk_split_behavior;

hr_status tk_split_apply(tk_spans *spans, tk_split_behavior b, const char *s, const tk_align *al, bool first,
                         tk_pieces *out);
hr_status tk_split_behavior_parse(const cJSON *j, const char *field, tk_split_behavior *out);

/* ---- JSON helpers (tk_json.c) ------------------------------------------ */

/* Field access with errors naming the component and field. */
const cJSON *tk_json_get(const cJSON *obj, const char *key);
hr_status tk_json_string(const cJSON *obj, const char *key, const char *what, const char **out);
/* Optional string: NULL when missing or null. */
hr_status tk_json_opt_string(const cJSON *obj, const char *key, const char *what, const char **out);
bool tk_json_bool(const cJSON *obj, const char *key, bool dflt);
const char *tk_json_type(const cJSON *obj);
/* Position of the object's "type" in names[0..n) (indexed by a component
 * enum); errors name the component kind `what` ("unsupported decoder 'X'"). */
hr_status tk_json_type_index(const cJSON *obj, const char *const *names, int n, const char *what, int *index);

/* ---- CLIPTokenizer from vocab.json + merges.txt (tk_clip.c) --------------- */

/* The tokenizer.json tree transformers' CLIPTokenizer builds from dir's
 * vocab.json, merges.txt and tokenizer_config.json. */
hr_status tk_clip_build(const char *dir, cJSON **out);

/* dir/name (kept inside dir; `path` receives it) into *text, NUL-ended,
 * under the tokenizer files' size and memory bounds (tk_load.c); *text is
 * NULL when the file is absent. */
hr_status tk_read_optional(const char *dir, const char *name, char *path, size_t cap, char **text, size_t *len);

/* ---- the tokenizer ---------------------------------------------------- */

struct hr_tokenizer {
    tk_normalizer *normalizer;
    tk_pretok *pretok;
    tk_model *model;
    tk_added *added;
    tk_post *post;
    tk_decoder *decoder;

    int32_t bos_id, eos_id, pad_id, unk_id;
    bool add_bos, add_eos;        /* from tokenizer_config.json, -1/false when absent */
    bool has_add_bos, has_add_eos;
    char *chat_template;          /* NULL when absent */

    void *pool_lock;              /* pthread_mutex_t * guarding `pool` */
    tk_ws *pool;
};

/* Frees a workspace's buffers (not its model scratch). */
void tk_ws_clear(tk_ws *ws);
/* The string of a token id (added tokens first), NULL when out of range. */
const char *tk_token_str(const hr_tokenizer *tok, int32_t id, size_t *len);
hr_status tk_ws_acquire(hr_tokenizer *tok, tk_ws **out);
void tk_ws_release(hr_tokenizer *tok, tk_ws *ws);
void tk_ws_pool_free(hr_tokenizer *tok);

#endif
