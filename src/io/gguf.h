/* GGUF internals shared by the reader, the checkpoint front (HF names), the
 * config and tokenizer builders, and the fuzz target (which parses images
 * straight from memory). */
#ifndef HR_IO_GGUF_H
#define HR_IO_GGUF_H

#include "hubrt/io.h"

/* Metadata value types as the file numbers them. */
typedef enum gguf_type {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12, GGUF_TYPE_COUNT
} gguf_type;

/* The ggml tensor types hubrt dequantizes (ggml's numbering). */
typedef enum ggml_type {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23, GGML_BF16 = 30, GGML_MXFP4 = 39
} ggml_type;

#define GGUF_MAX_DIMS 4

typedef struct gguf_str {
    const char *p; /* into the image; not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    char *key;           /* owned, NUL-free */
    gguf_type type;
    gguf_type arr_type;  /* element type of an array */
    uint64_t n;          /* array length (1 for a scalar) */
    const uint8_t *data; /* scalar value or first array element, in the image */
    gguf_str *strs;      /* [n] for a string or an array of strings; owned */
} gguf_kv;

typedef struct gguf_tensor {
    char *name;          /* owned, NUL-free */
    int ndim;
    int64_t ne[GGUF_MAX_DIMS]; /* ggml order: ne[0] is the contiguous dim */
    ggml_type type;
    uint64_t offset;     /* from the start of the data section */
    uint64_t nbytes;
} gguf_tensor;

typedef struct hr_gguf {
    char *label;         /* file name, first word of every message */
    const uint8_t *buf;  /* the image */
    size_t size;
    struct hr_io_map *map; /* when buf is our file map (st_internal.h; shared with tensor views) */
    uint32_t version;
    gguf_kv *kv;         /* [n_kv] in file order */
    size_t n_kv;
    gguf_tensor *tensors; /* [n_tensors] in file order */
    size_t n_tensors;
    uint64_t alignment;
    uint64_t data_start;
} hr_gguf;

/* Parses and validates a GGUF v2/v3 image of `size` bytes at `buf` (kept,
 * not copied): magic, version, counts, strings, array types, tensor ranks,
 * dims, types, offsets aligned to general.alignment, inside the file and
 * not overlapping. `label` starts every message. */
hr_status hr_gguf_parse(const char *label, const uint8_t *buf, size_t size, hr_gguf **out);
/* Maps `path` and parses it. */
hr_status hr_gguf_open(const char *path, hr_gguf **out);
void hr_gguf_close(hr_gguf *g);
/* Drops the pages of t's stored bytes from this process when g maps its
 * file (MADV_DONTNEED: read again, they come back from the file): for a
 * loader done reading them. */
void hr_gguf_drop_tensor(const hr_gguf *g, const gguf_tensor *t);
/* hr_gguf_drop_tensor for any bytes [p, p + n) of g's file map: true when
 * they lie in it (n == 0 only asks), as hr_safetensors_drop_pages. */
bool hr_gguf_drop_pages(const hr_gguf *g, const void *p, size_t n);
/* The hubrt dtype t's bytes are stored in: F32, F16, BF16, or the block
 * type of the same layout (HR_Q4_1 for GGML_Q4_1, ...). */
hr_dtype hr_gguf_stored_dtype(const gguf_tensor *t);
/* A tensor over t's stored bytes in g's file map (zero-copy; it keeps the
 * map alive), in its stored dtype, for a mapped file; else
 * HR_ERR_UNSUPPORTED. */
hr_status hr_gguf_view(const hr_gguf *g, const gguf_tensor *t, hr_tensor **out);
/* A copy of 2-d tensor t in its stored dtype with its rows put back in HF
 * order (as hr_gguf_dequant with perm_heads): blocks run along rows, so
 * rows move whole. */
hr_status hr_gguf_rows_permuted(const hr_gguf *g, const gguf_tensor *t, int64_t heads, hr_tensor **out);
/* The stored row that HF row r of a q/k weight of `nrow` rows and `heads`
 * heads comes from: HF row r = h*D + t*D/2 + j was stored at h*D + 2*j + t
 * (llama.cpp's converter interleaves the pairs for its rope). */
int64_t hr_gguf_src_row(int64_t nrow, int64_t heads, int64_t r);

const gguf_kv *hr_gguf_find(const hr_gguf *g, const char *key);
long hr_gguf_tensor_index(const hr_gguf *g, const char *name);
/* Typed getters: an integer of any width, any number, a string; absent
 * keys give HR_ERR_NOT_FOUND naming the key, other types HR_ERR_FORMAT. */
hr_status hr_gguf_get_int(const hr_gguf *g, const char *key, int64_t *out);
hr_status hr_gguf_get_num(const hr_gguf *g, const char *key, double *out);
hr_status hr_gguf_get_str(const hr_gguf *g, const char *key, gguf_str *out);
/* The `i`-th element of an integer array. */
int64_t hr_gguf_arr_int(const gguf_kv *kv, uint64_t i);

/* Tensor `t` dequantized to `dt` (f32, bf16, f16) with the dims reversed
 * into row-major order. When `perm_heads` > 0 the rows, taken as
 * [perm_heads, 2, rows/heads/2] interleaved pairs, are put back in the
 * rotate-half order of HF (llama.cpp's converter permutes q and k). */
hr_status hr_gguf_dequant(const hr_gguf *g, const gguf_tensor *t, hr_dtype dt, int64_t perm_heads,
                          hr_tensor **out);
/* Dequantizes `n` elements of type `type` at `src` into f32 (n a multiple
 * of the block size; core/dequant.c). */
void hr_gguf_dequant_row(ggml_type type, const uint8_t *src, float *dst, int64_t n);
/* The hubrt dtype of a ggml type's bytes; HR_DTYPE_COUNT for none. */
hr_dtype hr_gguf_type_dtype(ggml_type type);

/* ---- GGUF files as HF checkpoints (gguf_hub.c) -------------------------- */

struct cJSON;

/* What a GGUF file of one llama.cpp architecture needs to read as a Hub
 * checkpoint. The model layer registers one for each architecture it runs
 * (models/gguf_archs.c), from the architecture's own weight table. */
typedef struct hr_gguf_arch {
    const char *name;     /* general.architecture: "llama" */
    const char *hf_class; /* config.json's architectures[0] */
    /* The HF name of GGUF tensor `gguf_name` into buf, and the head count
     * whose row permutation to undo (0: none); false: none of its names. */
    bool (*hf_name)(const struct hr_gguf_arch *a, const hr_gguf *g, const char *gguf_name, char *buf, size_t cap,
                    int64_t *perm_heads);
    /* Adds (or replaces) the architecture's own config.json fields after
     * the common ones (NULL: none). */
    hr_status (*config)(const struct hr_gguf_arch *a, const hr_gguf *g, struct cJSON *config);
    const void *ctx; /* the registrant's */
} hr_gguf_arch;

hr_status hr_gguf_arch_register(const hr_gguf_arch *a);
/* The split regexes of the tokenizers behind llama.cpp's "llama-bpe" /
 * "smaug-bpe" (Llama 3: digits in threes) and "qwen2" (digits one by one)
 * pre-tokenizer names, as their tokenizer.json files spell them. */
extern const char *const hr_gguf_llama3_split, *const hr_gguf_qwen2_split;
/* The ggml type whose bytes are hubrt dtype dt's (F32, F16, BF16, a block
 * type); -1 for none. */
int hr_gguf_dtype_type(hr_dtype dt);
/* The adapter of g's general.architecture, or NULL. */
const hr_gguf_arch *hr_gguf_arch_of(const hr_gguf *g);
/* "<arch>.<suffix>" into buf; the integer under that key, or def. */
const char *hr_gguf_arch_key(const hr_gguf_arch *a, const char *suffix, char *buf, size_t cap);
int64_t hr_gguf_arch_int(const hr_gguf *g, const hr_gguf_arch *a, const char *suffix, int64_t def);
/* Sets config[name] = v, replacing what was there. */
hr_status hr_gguf_json_num(struct cJSON *config, const char *name, double v);

/* The HF name of GGUF tensor `name` ("blk.3.attn_q.weight" ->
 * "model.layers.3.self_attn.q_proj.weight") into buf, by its
 * architecture's adapter; false when it has none. *perm_heads is the head
 * count whose permutation to undo, or 0. */
bool hr_gguf_hf_name(const hr_gguf *g, const char *name, char *buf, size_t cap, int64_t *perm_heads);

/* hr_gguf_config_json, hr_gguf_tokenizer_json and
 * hr_gguf_tokenizer_config_json (hubrt/io.h) of a parsed image: the JSON
 * text (free()) from its metadata. */
hr_status hr_gguf_config_json_of(const hr_gguf *g, char **json, size_t *len);
hr_status hr_gguf_tokenizer_json_of(const hr_gguf *g, char **json, size_t *len);
hr_status hr_gguf_tokenizer_config_json_of(const hr_gguf *g, char **json, size_t *len);

#endif
