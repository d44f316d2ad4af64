/* A GGUF v3 writer, streamed: metadata is serialized as it is added,
 * tensors are declared with their shape and type and an emitter that
 * produces their bytes only when the file is written, one tensor at a
 * time, so a model is never held whole in memory. The file is atomic
 * (io/atomic_file.h); data offsets are aligned to 32 bytes, as ggml's
 * default general.alignment. */
#ifndef HR_IO_GGUF_WRITE_H
#define HR_IO_GGUF_WRITE_H

#include <stdbool.h>
#include <stdint.h>

#include "io/gguf.h"

typedef struct hr_gguf_writer hr_gguf_writer;
typedef struct hr_gguf_sink hr_gguf_sink;

/* Writes exactly the tensor's bytes through hr_gguf_sink_put. */
typedef hr_status (*hr_gguf_emit_fn)(void *ctx, hr_gguf_sink *sink);

hr_status hr_gguf_writer_new(const char *label, hr_gguf_writer **out);
void hr_gguf_writer_free(hr_gguf_writer *w);

/* Metadata, in the order added (keys unique, values copied). */
hr_status hr_gguf_w_str(hr_gguf_writer *w, const char *key, const char *v);
hr_status hr_gguf_w_u32(hr_gguf_writer *w, const char *key, uint32_t v);
hr_status hr_gguf_w_f32(hr_gguf_writer *w, const char *key, float v);
hr_status hr_gguf_w_bool(hr_gguf_writer *w, const char *key, bool v);
/* An array of n strings (lens[i] bytes each; NULL lens: NUL-terminated). */
hr_status hr_gguf_w_arr_str(hr_gguf_writer *w, const char *key, const char *const *v, const size_t *lens, uint64_t n);
hr_status hr_gguf_w_arr_i32(hr_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
bool hr_gguf_w_has(const hr_gguf_writer *w, const char *key);

/* A tensor of `ndim` dims ne[] in ggml order (ne[0] contiguous, a multiple
 * of the type's block) and ggml type `type`, whose bytes emit(ctx) writes
 * when the file is. */
hr_status hr_gguf_w_tensor(hr_gguf_writer *w, const char *name, int ndim, const int64_t *ne, ggml_type type,
                           hr_gguf_emit_fn emit, void *ctx);

/* The file at `path`: header, metadata, tensor infos, then each tensor's
 * bytes from its emitter; the emitted byte counts are checked. */
hr_status hr_gguf_w_write(hr_gguf_writer *w, const char *path);

/* The tokenizer metadata of model folder `dir` (tokenizer.json and its
 * companions; gguf_tok_write.c), the vocabulary padded to vocab_size. */
hr_status hr_gguf_w_tokenizer(hr_gguf_writer *w, const char *dir, int64_t vocab_size);

hr_status hr_gguf_sink_put(hr_gguf_sink *s, const void *p, size_t n);
/* Where this sink writes, for messages. */
const char *hr_gguf_sink_label(const hr_gguf_sink *s);

#endif
