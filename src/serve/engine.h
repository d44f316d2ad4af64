/* The serving engine: continuous batching over one static KV cache.
 *
 * The cache has `slots` rows of `capacity` cells, and one write index L
 * shared by every row (a decode step writes each row's token at L). A row
 * holds one conversation as the contiguous cells [start, L); the step's
 * mask says which cells each row owns, and positions are counted per
 * conversation, so rows that joined at different times decode together.
 * A request's prompt is prefilled in chunks into a one-row scratch cache,
 * one chunk between two decode steps of the running batch, then its cells
 * are copied into a free row ending at L. When L reaches the capacity the
 * cache shifts left by the oldest running row's start.
 *
 * A finished conversation keeps its row (idle) until the row is needed:
 * a later request whose tokens begin with the same tokens (the next turn
 * of a chat) takes that row and prefills only what is new. Models whose
 * sliding layers keep a ring smaller than the capacity cannot keep idle
 * rows (the running rows overwrite their rings), so they reuse nothing.
 *
 * One engine thread runs the model; any thread submits requests and reads
 * their text as it comes. */
#ifndef HR_SERVE_ENGINE_H
#define HR_SERVE_ENGINE_H

#include "hubrt/model.h"
#include "hubrt/tokenizer.h"

typedef struct hr_engine hr_engine;
typedef struct hr_request hr_request;

typedef struct hr_engine_options {
    int64_t slots;         /* rows of the running batch; 0: 8 */
    int64_t capacity;      /* cells per row (prompt + answer); 0: min(max positions, 4096) */
    int64_t prefill_chunk; /* prompt tokens per prefill step; 0: 256 */
    int64_t max_queue;     /* requests waiting for a row; 0: 64 */
    bool compile;          /* compiled forward (hubrt/graph.h) */
    bool no_prefix_reuse;
    /* Batch-invariant decoding: each row's logits bitwise what the request
     * gets alone, whatever else runs and in whichever row (eager steps over
     * every row, attention through sdpa's exact path, no prefix reuse:
     * reused cells were computed by other steps than a lone prefill's).
     * Not with compile. */
    bool deterministic;
} hr_engine_options;

typedef struct hr_request_params {
    int64_t max_tokens;    /* 0: until the row is full */
    bool do_sample;
    double temperature, top_p, min_p, repetition_penalty;
    int64_t top_k;
    uint64_t seed;
    const char *const *stop; /* stop strings (copied); the text ends before them */
    int n_stop;
    /* log-probabilities of each answer token and of the top_logprobs most
     * likely ones, from the model's logits before any sampling processor */
    bool logprobs;
    int top_logprobs; /* 0..HR_MAX_TOP_LOGPROBS */
    bool keep_special; /* the text keeps special tokens (markers an output parser reads) */
} hr_request_params;

#define HR_MAX_TOP_LOGPROBS 20

typedef struct hr_token_logprob {
    int64_t id;
    float logprob;
    int n_top;
    int64_t top_id[HR_MAX_TOP_LOGPROBS];
    float top_logprob[HR_MAX_TOP_LOGPROBS];
} hr_token_logprob;

/* A snapshot of the engine's counters (for /metrics). */
typedef struct hr_engine_stats {
    int64_t requests, rejected, running, queued;
    int64_t prompt_tokens, prefill_tokens, reused_tokens, generated_tokens;
    int64_t decode_steps, decode_rows, shifts;
    int64_t slots, capacity;
} hr_engine_stats;

hr_status hr_engine_create(hr_model *m, const hr_tokenizer *tok, const hr_engine_options *opts, hr_engine **out);
/* A rank other than 0 of a split model (hr_model_group_size > 1): makes
 * every cache and model call rank 0's engine makes (mirror.h), until that
 * engine is freed. */
hr_status hr_engine_follow(hr_model *m, const hr_engine_options *opts);
/* Stops taking requests, aborts the queued ones, lets running ones finish
 * for up to grace_s seconds and aborts the rest, then stops the thread.
 * Requests can still be polled and released afterwards. */
void hr_engine_shutdown(hr_engine *e, double grace_s);
/* Shuts down at once (no grace) if not done, and frees the engine. */
void hr_engine_free(hr_engine *e);
int64_t hr_engine_capacity(const hr_engine *e);
void hr_engine_get_stats(hr_engine *e, hr_engine_stats *s);

/* Queues a request for the prompt's ids; *out is the caller's to release.
 * HR_ERR_UNSUPPORTED when the queue is full or the engine is stopping
 * (the server's 503); HR_ERR_INVALID_ARG for a prompt the rows cannot hold
 * or bad parameters. */
hr_status hr_engine_submit(hr_engine *e, const int64_t *ids, int64_t n, const hr_request_params *p,
                           hr_request **out);
/* Waits up to timeout_ms for new text or the end. *text (malloc'd, NULL
 * when none) gets the text produced since the last call; *finish the
 * finish reason once the request has ended ("stop", "length", "abort"),
 * else NULL. Returns the request's error if it failed. */
hr_status hr_request_poll(hr_engine *e, hr_request *r, int timeout_ms, char **text, size_t *len,
                          const char **finish);
/* The log-probabilities of the answer tokens since the last call
 * (malloc'd array, *lp NULL when none). */
void hr_request_take_logprobs(hr_engine *e, hr_request *r, hr_token_logprob **lp, size_t *n);
/* Tokens of the prompt, of the answer so far, and the prompt tokens that
 * were prefilled (the rest came from a kept row). */
void hr_request_counts(hr_engine *e, const hr_request *r, int64_t *prompt, int64_t *completion,
                       int64_t *prefilled);
/* Asks the engine to end the request (a client that went away). */
void hr_request_cancel(hr_engine *e, hr_request *r);
void hr_request_release(hr_engine *e, hr_request *r);

#endif
