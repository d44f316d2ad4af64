/* hubrt file formats (public API): safetensors files, Hugging Face
 * checkpoints (one file or shards through model.safetensors.index.json),
 * config.json / generation_config.json.
 *
 * Hub files are read as they are; there is no converter. Tensors read from a
 * checkpoint are zero-copy views of a private memory map: they stay valid
 * after the file or checkpoint handle is closed (each holds a reference on
 * the map), and writing to one changes the process's copy, never the file.
 * Every error names the file and the tensor or field at fault. */
#ifndef HUBRT_IO_H
#define HUBRT_IO_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a header says about one tensor. */
typedef struct hr_tensor_info {
    hr_dtype dtype;
    int ndim;
    int64_t shape[HR_MAX_DIMS];
    size_t nbytes; /* numel * itemsize */
} hr_tensor_info;

/* One `__metadata__` entry (string -> string). */
typedef struct hr_kv {
    const char *key;
    const char *value;
} hr_kv;

/* ---- one .safetensors file ------------------------------------------- */

typedef struct hr_safetensors hr_safetensors;

/* Maps the file and validates the whole header: the 8-byte length fits the
 * file, the header is a JSON object in valid UTF-8, every entry has a known
 * dtype, a shape of rank <= 8 with non-negative sizes, data_offsets inside
 * the data section whose length is numel * itemsize, no two tensors
 * overlap, and `__metadata__` maps strings to strings. */
HR_API hr_status hr_safetensors_open(const char *path, hr_safetensors **out);
HR_API void hr_safetensors_close(hr_safetensors *st);
HR_API size_t hr_safetensors_count(const hr_safetensors *st);
/* The i-th tensor name in byte order (0 <= i < count); NULL past the end. */
HR_API const char *hr_safetensors_name(const hr_safetensors *st, size_t i);
HR_API hr_status hr_safetensors_info(const hr_safetensors *st, const char *name,
                                     hr_tensor_info *out);
/* A zero-copy tensor over the map (named `name`); free it with
 * hr_tensor_free, before or after closing `st`. */
HR_API hr_status hr_safetensors_tensor(const hr_safetensors *st, const char *name,
                                       hr_tensor **out);
HR_API size_t hr_safetensors_metadata_count(const hr_safetensors *st);
/* The i-th `__metadata__` entry, keys in byte order; pointers live as long
 * as `st`. */
HR_API hr_kv hr_safetensors_metadata_at(const hr_safetensors *st, size_t i);
/* The metadata value for `key`, NULL when absent. */
HR_API const char *hr_safetensors_metadata_get(const hr_safetensors *st, const char *key);

/* Writes `n` tensors (any strides, any host-readable device) named
 * `names[i]` as safetensors, laid out as the `safetensors` Python package
 * lays them out (larger dtypes first, then by name; header padded with
 * spaces to 8 bytes). Atomic: the bytes go to "<path>.tmp.<pid>", which is
 * fsynced and renamed over `path`; on any error the temporary file is
 * removed and an existing `path` is left untouched. `meta` may be NULL. */
HR_API hr_status hr_safetensors_write(const char *path, const char *const *names,
                                      const hr_tensor *const *tensors, size_t n,
                                      const hr_kv *meta, size_t n_meta);

/* ---- a checkpoint: file or model folder ------------------------------ */

typedef struct hr_checkpoint hr_checkpoint;

/* `path` is a .safetensors file, a model.safetensors.index.json, a folder
 * holding model.safetensors (preferred, as transformers does) or
 * model.safetensors.index.json, or a GGUF file (see hr_gguf_resolve), whose
 * tensors are dequantized copies rather than views. With an index every shard is opened and
 * every tensor of its weight_map must be in the shard named for it. */
HR_API hr_status hr_checkpoint_open(const char *path, hr_checkpoint **out);
HR_API void hr_checkpoint_close(hr_checkpoint *ck);
HR_API size_t hr_checkpoint_count(const hr_checkpoint *ck);
/* The i-th tensor name in byte order; NULL past the end. */
HR_API const char *hr_checkpoint_name(const hr_checkpoint *ck, size_t i);
HR_API bool hr_checkpoint_has(const hr_checkpoint *ck, const char *name);
HR_API hr_status hr_checkpoint_info(const hr_checkpoint *ck, const char *name,
                                    hr_tensor_info *out);
/* Zero-copy, as hr_safetensors_tensor; outlives `ck`. */
HR_API hr_status hr_checkpoint_tensor(const hr_checkpoint *ck, const char *name,
                                      hr_tensor **out);
/* The tensor in floating dtype `dt`: the zero-copy view when stored so,
 * else a converted copy (GGUF blocks are dequantized straight to `dt`).
 * A block dtype (HR_Q4_1, ...) asks for a GGUF tensor's blocks as stored
 * (a view; a copy when q/k rows are put back in HF order); another block
 * type than the stored one is refused. */
HR_API hr_status hr_checkpoint_tensor_as(const hr_checkpoint *ck, const char *name, hr_dtype dt,
                                         hr_tensor **out);
/* The dtype tensor `name`'s bytes are stored in: a block type for a
 * quantized GGUF tensor (hr_checkpoint_info says f32, what it dequantizes
 * to); HR_DTYPE_COUNT when absent. */
HR_API hr_dtype hr_checkpoint_stored_dtype(const hr_checkpoint *ck, const char *name);
HR_API size_t hr_checkpoint_shard_count(const hr_checkpoint *ck);
HR_API const hr_safetensors *hr_checkpoint_shard(const hr_checkpoint *ck, size_t i);
/* Path of shard i as opened. */
HR_API const char *hr_checkpoint_shard_path(const hr_checkpoint *ck, size_t i);
/* `__metadata__` of the first shard (NULL when absent). */
HR_API const char *hr_checkpoint_metadata_get(const hr_checkpoint *ck, const char *key);

/* ---- GGUF files (llama.cpp) ------------------------------------------- *
 *
 * A llama-architecture GGUF file (v2/v3) stands in for a model folder:
 * hr_checkpoint_open serves its tensors under their HF names, dequantized
 * from F32/F16/BF16 and every block type of HR_QTYPE_LIST at load, or kept
 * in their blocks (hr_checkpoint_tensor_as with the block dtype); q and k
 * rows put back in HF's rotate-half order; its metadata yields config.json
 * and tokenizer.json equivalents. */

/* *out = a malloc'd path to the GGUF file `path` names: `path` itself when
 * it ends in ".gguf", or the one .gguf of a folder holding no safetensors;
 * NULL when `path` is not a GGUF model (a folder with several .gguf and no
 * safetensors is an error). */
HR_API hr_status hr_gguf_resolve(const char *path, char **out);
/* config.json text (malloc'd, free() it) for the GGUF file at `path`. */
HR_API hr_status hr_gguf_config_json(const char *path, char **json, size_t *len);
/* tokenizer.json text (malloc'd) for the GGUF file's gpt2 BPE vocabulary:
 * merges, control tokens as special added tokens, the pre-tokenizer that
 * tokenizer.ggml.pre names, ByteLevel decoder. */
HR_API hr_status hr_gguf_tokenizer_json(const char *path, char **json, size_t *len);
/* tokenizer_config.json text (malloc'd) for the GGUF file: bos/eos/pad/unk
 * tokens by their strings, and tokenizer.chat_template as chat_template. */
HR_API hr_status hr_gguf_tokenizer_config_json(const char *path, char **json, size_t *len);

/* ---- JSON configs (config.json and friends) --------------------------- *
 *
 * A document owns the parsed file; an hr_json_obj is a cheap by-value handle
 * on one object inside it (or on nothing: an absent object, whose getters
 * all return their defaults). Getters treat a missing key and JSON null
 * alike (HF configs write "rope_scaling": null) and fail with a message such
 * as "config.json: field 'rope_scaling.factor' must be a number". */

typedef struct hr_json_doc hr_json_doc;

typedef struct hr_json_obj {
    const hr_json_doc *doc;
    const void *node;  /* the cJSON object; NULL for an absent object */
    char prefix[96];   /* dotted path of this object for messages, "" at root */
} hr_json_obj;

/* Reads and parses `path`; its top level must be an object. Messages name
 * the file by `path` as given. */
HR_API hr_status hr_json_doc_load(const char *path, hr_json_doc **out);
/* The same over `len` bytes of memory; `label` names it in messages. */
HR_API hr_status hr_json_doc_parse(const char *label, const char *text, size_t len,
                                   hr_json_doc **out);
HR_API void hr_json_doc_free(hr_json_doc *doc);
HR_API hr_json_obj hr_json_doc_root(const hr_json_doc *doc);

HR_API bool hr_json_obj_present(hr_json_obj obj);
/* True when `key` is present and not null. */
HR_API bool hr_json_has(hr_json_obj obj, const char *key);
/* HR_ERR_NOT_FOUND "config.json: missing field 'hidden_size'" unless present. */
HR_API hr_status hr_json_require(hr_json_obj obj, const char *key);
/* An integral number within +-2^53. */
HR_API hr_status hr_json_get_i64(hr_json_obj obj, const char *key, int64_t def, int64_t *out);
HR_API hr_status hr_json_get_f64(hr_json_obj obj, const char *key, double def, double *out);
HR_API hr_status hr_json_get_bool(hr_json_obj obj, const char *key, bool def, bool *out);
/* The string lives as long as the document; `def` may be NULL. */
HR_API hr_status hr_json_get_str(hr_json_obj obj, const char *key, const char *def,
                                 const char **out);
/* A nested object; absent (hr_json_obj_present false) when missing/null. */
HR_API hr_status hr_json_get_obj(hr_json_obj obj, const char *key, hr_json_obj *out);
/* An integer or a list of integers (eos_token_id is either) into out[cap];
 * *n = 0 when missing/null, HR_ERR_FORMAT past `cap`. */
HR_API hr_status hr_json_get_i64_list(hr_json_obj obj, const char *key, int64_t *out,
                                      int cap, int *n);
/* A list of numbers (longrope's short_factor) into out[cap]. */
HR_API hr_status hr_json_get_f64_list(hr_json_obj obj, const char *key, double *out,
                                      int cap, int *n);

/* ---- generation_config.json ------------------------------------------ */

#define HR_GEN_MAX_EOS 16

/* transformers' GenerationConfig fields that generation needs, with its
 * defaults; an absent token id is -1, an absent max_new_tokens is -1. */
typedef struct hr_generation_config {
    int64_t bos_token_id;
    int64_t pad_token_id;
    int64_t eos_token_ids[HR_GEN_MAX_EOS];
    int n_eos;
    int64_t max_length;      /* 20 */
    int64_t max_new_tokens;  /* -1 */
    bool do_sample;          /* false */
    double temperature;      /* 1.0 */
    int64_t top_k;           /* 50 */
    double top_p;            /* 1.0 */
    double min_p;            /* 0.0 (off) */
    double repetition_penalty; /* 1.0 */
} hr_generation_config;

HR_API void hr_generation_config_defaults(hr_generation_config *gc);
/* Defaults overlaid with the file at `path`. */
HR_API hr_status hr_generation_config_load(const char *path, hr_generation_config *out);

#ifdef __cplusplus
}
#endif
#endif
