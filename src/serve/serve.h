/* hubrt serve: an OpenAI-compatible HTTP server over the engine.
 *
 * http.c carries the HTTP (libmicrohttpd, a thread per connection, so a
 * streaming answer may block on the engine), openai.c turns request
 * bodies into engine requests and answers into OpenAI's JSON and
 * server-sent events, page.c holds the chat page served at "/". */
#ifndef HR_SERVE_SERVE_H
#define HR_SERVE_SERVE_H

#include <signal.h>

#include "serve/engine.h"
#include "serve/output_parse.h"

typedef struct hr_serve_options {
    const char *host;        /* NULL: 127.0.0.1 */
    int port;                /* 0: any free port (printed) */
    const char *model_name;  /* the id /v1/models lists and requests name */
    size_t max_body;         /* bytes; 0: 4 MiB */
    double grace_s;          /* on SIGTERM: time running answers get to finish */
    hr_engine_options engine;
} hr_serve_options;

/* Serves until *stop becomes nonzero (a signal handler sets it), then
 * shuts down: new requests get 503, running answers finish within
 * grace_s or end with finish_reason "abort", every stream gets its end. */
hr_status hr_serve_run(hr_model *m, const hr_tokenizer *tok, const hr_serve_options *o,
                       volatile sig_atomic_t *stop);

/* ---- openai.c ---------------------------------------------------------------- */

typedef enum hr_api_kind { HR_API_COMPLETIONS, HR_API_CHAT } hr_api_kind;

/* A request body turned into what the engine needs. */
typedef struct hr_api_job {
    hr_api_kind kind;
    int64_t *ids;            /* the prompt's tokens (malloc'd) */
    int64_t n_ids;
    hr_request_params params;
    char **stop;             /* owned, params.stop points here */
    bool stream, include_usage;
    hr_output_style style;   /* chat: how the model writes reasoning and tool calls */
} hr_api_job;

/* Parses a POST body for `kind`; HR_ERR_INVALID_ARG with a message naming
 * the field for a bad one, HR_ERR_NOT_FOUND for another model's name.
 * Sampling fields the body leaves out come from gc (generation_config.json),
 * as vLLM does. */
hr_status hr_api_parse(hr_api_kind kind, const char *body, size_t len, const char *model_name,
                       const hr_tokenizer *tok, const hr_generation_config *gc, hr_api_job *job);
void hr_api_job_free(hr_api_job *job);

/* The "logprobs" of a choice for n answer tokens (a cJSON the answer and
 * chunk writers take over): chat's {"content": [...]}, or the completions
 * API's tokens / token_logprobs / top_logprobs / text_offset, the offsets
 * counted on from *offset. */
struct cJSON;
struct cJSON *hr_api_logprobs(hr_api_kind kind, const hr_tokenizer *tok, const hr_token_logprob *lp, size_t n,
                              size_t *offset);
/* {"error": {...}} for a status code and message (malloc'd). */
char *hr_api_error_json(int http_status, const char *message);
/* What an answer or one stream event says. */
typedef struct hr_api_out {
    hr_api_kind kind;
    const char *id, *model;
    long created;
    const char *text;              /* the text (completions; chat without parts) */
    size_t len;
    const hr_output_delta *parts;  /* chat: reasoning, content and tool calls */
    int call_base;                 /* the answer's index of parts' first tool call */
    const char *finish;            /* NULL: not the end */
    struct cJSON *logprobs;        /* taken over; NULL: "logprobs": null */
    bool opening;                  /* a chat stream's first chunk (the role) */
    bool usage_only;               /* the stream's usage chunk */
    int64_t prompt_tokens, completion_tokens;
} hr_api_out;

/* The whole (non-streaming) answer's JSON (malloc'd). */
char *hr_api_answer_json(hr_api_out *o);
/* One server-sent event, "data: {...}\n\n" (malloc'd). */
char *hr_api_chunk_event(hr_api_out *o);

/* ---- page.c -------------------------------------------------------------------- */

extern const char hr_serve_page_html[];

#endif
