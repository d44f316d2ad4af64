/* hubrt models and generation (public API).
 *
 * A model is loaded from a folder in the Hugging Face Hub layout
 * (config.json, *.safetensors or model.safetensors.index.json,
 * generation_config.json). The architecture comes from config.json's
 * "architectures"; weights are looked up by their HF names and stay views
 * of the mmapped files when the dtype matches (or are put in the form the
 * device reads fastest). Generation runs over a static KV cache
 * preallocated per layer: [batch, kv_heads, max_len, head_dim] for full
 * attention layers, a ring of the window's size for sliding-window ones. */
#ifndef HUBRT_MODEL_H
#define HUBRT_MODEL_H

#include "io.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_model hr_model;
typedef struct hr_kv_cache hr_kv_cache;

typedef struct hr_model_options {
    /* "bfloat16", "float32", "float16" (any hr_dtype_parse name); NULL or
     * "auto": config.json's torch_dtype / dtype, float32 when absent. */
    const char *dtype;
    const char *device; /* NULL: "cpu" */
    /* A mixture-of-experts model's experts implementation
     * (hr_model_set_experts_implementation); NULL: "grouped". */
    const char *experts_implementation;
    /* A GGUF file's block-quantized weights (Q4_1, Q8_0, Q4_K, ...) stay in
     * their blocks on the CPU, read by the linear and embedding kernels
     * (activations quantized to int8 per 32 elements, as llama.cpp's), and
     * so do the Hub's FP8 weights (repacked into FP8 blocks, activations
     * kept in f32); true dequantizes them to `dtype` at load instead.
     * Other devices always dequantize. */
    bool dequantize;
    /* "q8_0", "q4_0", "q4_1", "q5_0" or "q5_1": the float linear and
     * embedding matrices (last dim a multiple of 32) quantized into that
     * block type while loading, one tensor at a time, as ggml's reference
     * quantizer does (the CPU only); NULL: kept as stored. Weights stored
     * quantized already stay in their own blocks. */
    const char *quantize;
    /* Tensor parallelism: the model split over tp_size processes, one per
     * rank of the MPI group this process belongs to (hubrt/dist.h; 0 or 1:
     * not split). Each rank loads only its slices of the weights. The CPU
     * device, float safetensors checkpoints. */
    int64_t tp_size;
    /* transformers' tp_plan: NULL or "auto" (the architecture's plan), or
     * a JSON object of module pattern -> style laid over it, such as
     * {"layers.*.self_attn.q_proj": "replicated", ...} */
    const char *tp_plan;
    /* Expert parallelism: a mixture-of-experts model's experts split over
     * ep_size ranks (each holds experts [E r / ep, E (r + 1) / ep), the
     * tokens' outputs summed over the ranks), as transformers'
     * enable_expert_parallel does; 0 or 1: replicated. The group is the
     * same as tp_size's: ep_size is 1 or its size (tp_size 1 or the same). */
    int64_t ep_size;
} hr_model_options;

/* Architecture names this build can load, comma separated. */
HR_API const char *hr_model_supported_archs(void);
HR_API hr_status hr_model_load(const char *dir, const hr_model_options *opts, hr_model **out);
HR_API void hr_model_free(hr_model *m);
/* Model folder `dir` (safetensors: Llama, Mistral, Qwen2, Qwen3) written as
 * a GGUF file at `out` that llama.cpp loads: its metadata, tensor names and
 * tokenizer as llama.cpp's converter writes them, the matrices in `type`
 * ("f32", "f16", "bf16", or a block type: q8_0, q4_0, q4_1, q5_0, q5_1,
 * mxfp4, q4_k, q5_k, q6_k, quantized as ggml's reference quantizer does; rows that
 * do not divide into the blocks take llama-quantize's fallback type), the
 * vectors in f32. Streamed tensor by tensor (peak memory: a few MB beyond
 * the file map), atomic (a temporary file renamed over `out`). */
HR_API hr_status hr_model_export_gguf(const char *dir, const char *out, const char *type);
/* The ranks the model is split over (tp_size or ep_size; 1: not split):
 * every rank must make the same calls on it, in the same order. */
HR_API int hr_model_group_size(const hr_model *m);

/* The implementation a mixture-of-experts model's experts run, by name:
 * "grouped" (the default: tokens grouped by expert, each touched expert's
 * weights read once; transformers' "grouped_mm" and "batched_mm" name it
 * too), "eager" (transformers' per-expert loop: each weighted product
 * rounded to the model dtype and added in expert order; the same bits in
 * float32), or a kernel from the kernel hub: "org/name", "org/name@v2"
 * (its version branch) or "org/name@REVISION", or a kernel folder, loaded
 * with hr_kernel_load's checks (trusted publishers only; the lock file of
 * $HUBRT_KERNELS_LOCK). Other names are refused, listing these. Compiled
 * plans of the other implementation are dropped. A model without experts
 * takes any of these and runs as before. */
HR_API hr_status hr_model_set_experts_implementation(hr_model *m, const char *name);
/* A kernel hr_kernel_load loaded (its info->impl_id) as the experts
 * implementation; per_expert picks the kernel's rounding (as "eager"). */
HR_API hr_status hr_model_set_experts_kernel(hr_model *m, int64_t impl_id, bool per_expert);
/* "grouped", "eager", or the kernel's "org/name@revision". */
HR_API const char *hr_model_experts_implementation(const hr_model *m);

HR_API const char *hr_model_arch(const hr_model *m);
HR_API hr_dtype hr_model_dtype(const hr_model *m);
/* The dtypes the loaded weights are stored in, comma separated in dtype
 * order: "f32,q4_1,q8_0" for a Q4_1 GGUF file kept in its blocks (norms
 * in f32, the embedding in Q8_0), "bf16" for a bf16 checkpoint. */
HR_API const char *hr_model_weight_types(const hr_model *m);
HR_API int64_t hr_model_vocab_size(const hr_model *m);
HR_API int64_t hr_model_max_positions(const hr_model *m);
/* End-of-sequence ids from generation_config.json and config.json (union);
 * *ids stays valid while the model lives. Returns the count. */
HR_API int hr_model_eos_ids(const hr_model *m, const int64_t **ids);
/* pad_token_id from generation_config.json / config.json, -1 when absent. */
HR_API int64_t hr_model_pad_id(const hr_model *m);
/* generation_config.json (transformers' defaults when absent) with
 * config.json's eos/pad/bos ids merged in: the defaults of generation. */
HR_API const hr_generation_config *hr_model_generation_config(const hr_model *m);

/* ---- static KV cache ------------------------------------------------- */

HR_API hr_status hr_kv_cache_create(const hr_model *m, int64_t batch, int64_t max_len,
                                    hr_kv_cache **out);
HR_API void hr_kv_cache_free(hr_kv_cache *c);
/* Tokens already written (the same for every row of the batch). */
HR_API int64_t hr_kv_cache_len(const hr_kv_cache *c);
HR_API int64_t hr_kv_cache_capacity(const hr_kv_cache *c);
HR_API void hr_kv_cache_reset(hr_kv_cache *c);

/* Cell moves for continuous batching (hubrt serve), where rows hold
 * different conversations: cache index i of a row holds one token's keys
 * and values, the mask of each step saying which indices a row owns.
 *
 * hr_kv_cache_copy copies row src_row's cells [src_at, src_at + n) to row
 * dst_row's [dst_at, dst_at + n) of a cache of the same model (src and dst
 * may be one cache). A sliding layer's ring keeps the last `window` cells,
 * so only the last window of the n cells are copied there, and the source
 * must still hold them (its length at most window past src_at + n). */
HR_API hr_status hr_kv_cache_copy(hr_kv_cache *dst, int64_t dst_row, int64_t dst_at, const hr_kv_cache *src,
                                  int64_t src_row, int64_t src_at, int64_t n);
/* Moves every row's cells by delta (< 0: toward index 0, dropping the
 * first -delta; > 0: toward the end) and the length with them. */
HR_API hr_status hr_kv_cache_shift(hr_kv_cache *c, int64_t delta);
/* A cache over rows [0, rows) of c, sharing its buffers (freed with
 * hr_kv_cache_free; the buffers stay c's), so an eager step can run fewer
 * rows than c holds. Its length starts as c's; the caller keeps the two
 * in step (hr_kv_cache_set_len). */
HR_API hr_status hr_kv_cache_rows(const hr_kv_cache *c, int64_t rows, hr_kv_cache **out);
/* Sets the tokens written (cells past it are written by the next step). */
HR_API hr_status hr_kv_cache_set_len(hr_kv_cache *c, int64_t len);
/* Whether sliding layers keep fewer cells than the capacity: then cells a
 * row stopped writing are overwritten by the other rows' steps, and a
 * finished row's cache cannot be reused. */
HR_API bool hr_kv_cache_ring_wraps(const hr_kv_cache *c);

/* ---- forward --------------------------------------------------------- */

typedef struct hr_forward_args {
    const hr_tensor *input_ids;      /* i64/i32 [b, s] */
    /* [b, past + s] (any int/bool dtype), nonzero = real token; NULL: no
     * padding. `past` is the cache's length before the call. */
    const hr_tensor *attention_mask;
    const hr_tensor *positions;      /* i64 [b, s]; NULL: past + arange(s) */
    hr_kv_cache *cache;              /* NULL: a cache for this call alone */
    bool last_only;                  /* logits of the last position only */
} hr_forward_args;

/* Writes the s new tokens into the cache (advancing it) and returns new
 * f32 logits [b, s, vocab] ([b, 1, vocab] with last_only). A model runs
 * one forward at a time: its activation buffers are reused across calls. */
HR_API hr_status hr_model_forward(hr_model *m, const hr_forward_args *args, hr_tensor **logits);

/* One step of a generation loop, on host arrays: token ids and positions
 * [batch, seq], the mask [batch, past + seq] (nonzero = real token; NULL:
 * no padding). */
typedef struct hr_step_args {
    const int64_t *ids, *pos, *mask;
    int64_t batch, seq;
    hr_kv_cache *cache;
    /* The static-shape forward, compiled once per [batch, seq, capacity]
     * and replayed (hubrt/graph.h); false: eager, op by op. */
    bool compiled;
    /* Eager, CPU: a one-token step's attention sums each row's keys one
     * after another in position order (sdpa's exact path), so a row's
     * logits do not depend on where its cells lie in the cache or on the
     * other rows (with the batch size fixed; hubrt serve --deterministic).
     * A compiled step refuses it. */
    bool batch_invariant;
} hr_step_args;

/* Writes the seq tokens into the cache (advancing it) and the last
 * position's head output into *logits: [batch, 1, vocab] in the model's
 * dtype (a bf16 model's logits as bf16 values, not widened). An eager
 * step reuses *logits when it has that shape; a compiled one replaces it. */
HR_API hr_status hr_model_step(hr_model *m, const hr_step_args *args, hr_tensor **logits);

/* ---- generation ------------------------------------------------------ */

typedef struct hr_generate_config {
    int64_t max_new_tokens;   /* >= 1 */
    bool do_sample;           /* false: greedy */
    double temperature;       /* 0 = 1 */
    int64_t top_k;            /* 0 = off */
    double top_p;             /* 0 or 1 = off */
    double min_p;             /* 0 = off */
    double repetition_penalty;/* 0 or 1 = off */
    uint64_t seed;
    const int64_t *eos_ids;   /* NULL: the model's */
    int n_eos;
    int64_t pad_id;           /* filler after eos; < 0: the model's, else eos */
    int64_t prefill_chunk;    /* tokens per prefill step; 0: 512 */
    /* Stop strings: a row ends once its decoded text holds one of them,
     * ending inside its newest token's text. Needs token_text. */
    const char *const *stop_strings;
    int n_stop_strings;
    /* The text a row's new token adds (an incremental detokenizer per row),
     * valid until the next call; NULL: no text. */
    const char *(*token_text)(void *ctx, int64_t row, int64_t token, size_t *len);
    /* Called for each new token of each live row with its text (NULL
     * without token_text); return false to stop that row. */
    bool (*on_token)(void *ctx, int64_t row, int64_t token, const char *text, size_t len);
    void *ctx;
    /* Compiled forward (static shapes): prefill chunks take power-of-two
     * sizes up to prefill_chunk, so one plan serves each size, and the
     * decode step is compiled once; plans are cached in memory and on disk
     * (see hubrt/graph.h). false: eager, op by op. */
    bool compile;
    /* transformers' logits processors beyond sampling, in its order after
     * the repetition penalty: no n-gram of this size twice in a row's ids
     * (prompt and padding included; 0: off), none of the bad-word
     * sequences (n_bad_words sequences of bad_word_lens[i] ids, one after
     * another in bad_words; a one-id sequence equal to an eos id is
     * dropped), and no eos before min_new_tokens new tokens. */
    int64_t no_repeat_ngram_size;
    const int64_t *bad_words;
    const int64_t *bad_word_lens;
    int n_bad_words;
    int64_t min_new_tokens;
    /* Called after each step with the step's token of every row [b] (pad
     * for finished rows); with want_scores, also the rows' raw logits and
     * their scores after every processor and warper ([b][vocab] f32 each,
     * -inf where a token is excluded), as transformers' output_logits and
     * output_scores keep them. Return false to stop generating. */
    bool (*on_step)(void *ctx, const int64_t *tokens, const float *raw, const float *scores, int64_t b,
                    int64_t vocab);
    bool want_scores;
} hr_generate_config;

/* Fills cfg with transformers' defaults: greedy, temperature 1, top_k 50,
 * top_p 1, repetition_penalty 1, max_new_tokens 20. */
HR_API void hr_generate_config_init(hr_generate_config *cfg);

typedef struct hr_generate_stats {
    int64_t prompt_tokens;    /* per row, padding included */
    int64_t new_tokens;       /* decode steps taken (incl. the first token) */
    double prefill_s, decode_s;
    /* The same spans in the process's CPU time (every thread, a pool
     * thread's spin-waiting included): with one thread, the work itself,
     * steady when other processes share the cores. */
    double prefill_cpu_s, decode_cpu_s;
} hr_generate_stats;

/* input_ids/attention_mask [batch, seq] row-major (mask NULL: no padding;
 * padding must be on the left). out_ids [batch, seq + max_new_tokens]
 * receives prompt + new tokens, finished rows filled with pad as
 * transformers does; *out_len gets seq + steps taken. stats may be NULL. */
HR_API hr_status hr_generate(hr_model *m, const int64_t *input_ids, const int64_t *attention_mask,
                             int64_t batch, int64_t seq, const hr_generate_config *cfg,
                             int64_t *out_ids, int64_t *out_len, hr_generate_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
