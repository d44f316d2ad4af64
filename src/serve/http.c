/* The HTTP side of hubrt serve (serve.h) on libmicrohttpd: one thread per
 * connection, so a handler may wait on the engine; bodies gathered up to a
 * limit; answers whole or as server-sent events; the client's socket
 * watched while it waits, so a client that leaves cancels its request. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "core/error.h"
#include "serve/serve.h"

#define POLL_MS 100

typedef struct server {
    hr_model *m;
    const hr_tokenizer *tok;
    hr_engine *eng;
    const hr_serve_options *o;
    size_t max_body;
    pthread_mutex_t mu;
    int connections;
    uint64_t next_id;
    int64_t responses[6]; /* by status class: [2] 2xx .. [5] 5xx */
    int64_t streams;
    int answering;        /* answers being written (whole or streamed): shutdown waits for them */
} server;

typedef struct body {
    char *data;
    size_t len, cap;
    bool too_large;
} body;

/* ---- responses ------------------------------------------------------------------- */

static void count(server *sv, int status) {
    pthread_mutex_lock(&sv->mu);
    sv->responses[status / 100 < 6 ? status / 100 : 5]++;
    pthread_mutex_unlock(&sv->mu);
}

/* An answer (whole or streamed) starts or ends. */
static void answering(server *sv, int delta) {
    pthread_mutex_lock(&sv->mu);
    sv->answering += delta;
    pthread_mutex_unlock(&sv->mu);
}

static enum MHD_Result send_text(server *sv, struct MHD_Connection *c, int status, const char *type, char *text) {
    if (!text) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count(sv, status);
    return ok;
}

static enum MHD_Result send_json(server *sv, struct MHD_Connection *c, int status, char *json) {
    return send_text(sv, c, status, "application/json", json);
}

static enum MHD_Result send_error(server *sv, struct MHD_Connection *c, int status, const char *message) {
    return send_json(sv, c, status, hr_api_error_json(status, message));
}

static int status_of(hr_status s) {
    switch (s) {
    case HR_ERR_INVALID_ARG:
    case HR_ERR_FORMAT:
    case HR_ERR_SHAPE: return 400;
    case HR_ERR_NOT_FOUND: return 404;
    case HR_ERR_UNSUPPORTED: return 503;
    default: return 500;
    }
}

/* The peer closed its end (a read would return 0 bytes). */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void make_id(server *sv, const char *prefix, char *id, size_t cap) {
    pthread_mutex_lock(&sv->mu);
    uint64_t n = ++sv->next_id;
    pthread_mutex_unlock(&sv->mu);
    snprintf(id, cap, "%s-%llx%06llx", prefix, (unsigned long long)time(NULL), (unsigned long long)n);
}

/* ---- GET ------------------------------------------------------------------------- */

static enum MHD_Result models(server *sv, struct MHD_Connection *c) {
    cJSON *root = cJSON_CreateObject(), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    cJSON_AddStringToObject(m, "id", sv->o->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)time(NULL));
    cJSON_AddStringToObject(m, "owned_by", "hubrt");
    cJSON_AddNumberToObject(m, "max_model_len", (double)hr_engine_capacity(sv->eng));
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return json ? send_json(sv, c, 200, json) : send_error(sv, c, 500, "out of memory");
}

static enum MHD_Result metrics(server *sv, struct MHD_Connection *c) {
    hr_engine_stats st;
    hr_engine_get_stats(sv->eng, &st);
    int64_t resp[6], streams, conns;
    pthread_mutex_lock(&sv->mu);
    memcpy(resp, sv->responses, sizeof resp);
    streams = sv->streams;
    conns = sv->connections;
    pthread_mutex_unlock(&sv->mu);
    size_t cap = 8192;
    char *t = malloc(cap);
    if (!t) return send_error(sv, c, 500, "out of memory");
    size_t n = 0;
#define METRIC(name, type, help, value)                                                                      \
    n += (size_t)snprintf(t + n, cap - n, "# HELP hubrt_%s %s\n# TYPE hubrt_%s %s\nhubrt_%s %lld\n", name, help, \
                          name, type, name, (long long)(value))
    METRIC("requests_total", "counter", "Requests the engine accepted.", st.requests);
    METRIC("requests_rejected_total", "counter", "Requests refused with 503 (queue full, shutting down).",
           st.rejected);
    METRIC("requests_running", "gauge", "Requests decoding in the running batch.", st.running);
    METRIC("requests_queued", "gauge", "Requests waiting for a row.", st.queued);
    METRIC("streams_total", "counter", "Streaming answers started.", streams);
    METRIC("http_connections", "gauge", "Open HTTP connections.", conns);
    METRIC("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", st.prompt_tokens);
    METRIC("prefill_tokens_total", "counter", "Prompt tokens run through the model.", st.prefill_tokens);
    METRIC("prefix_reused_tokens_total", "counter", "Prompt tokens whose keys a kept row already held.",
           st.reused_tokens);
    METRIC("generated_tokens_total", "counter", "Answer tokens generated.", st.generated_tokens);
    METRIC("decode_steps_total", "counter", "Decode steps of the running batch.", st.decode_steps);
    METRIC("decode_rows_total", "counter", "Rows decoded, summed over steps (over steps: mean batch size).",
           st.decode_rows);
    METRIC("cache_shifts_total", "counter", "Times the KV cache's cells were moved to make room.", st.shifts);
    METRIC("batch_slots", "gauge", "Rows of the running batch.", st.slots);
    METRIC("row_capacity_tokens", "gauge", "Tokens a row holds (prompt and answer).", st.capacity);
#undef METRIC
    n += (size_t)snprintf(t + n, cap - n, "# HELP hubrt_http_responses_total HTTP responses by status class.\n"
                                          "# TYPE hubrt_http_responses_total counter\n");
    for (int k = 2; k < 6; k++)
        n += (size_t)snprintf(t + n, cap - n, "hubrt_http_responses_total{code=\"%dxx\"} %lld\n", k,
                              (long long)resp[k]);
    return send_text(sv, c, 200, "text/plain; version=0.0.4", t);
}

/* ---- POST: whole answers ---------------------------------------------------------- */

/* Appends the request's new log-probabilities to *all. */
static hr_status gather_logprobs(server *sv, hr_request *r, hr_token_logprob **all, size_t *n) {
    hr_token_logprob *got = NULL;
    size_t k = 0;
    hr_request_take_logprobs(sv->eng, r, &got, &k);
    if (!k) return HR_OK;
    hr_token_logprob *p = realloc(*all, (*n + k) * sizeof *p);
    if (!p) {
        free(got);
        return hr_error(HR_ERR_OOM, "serve: out of memory");
    }
    memcpy(p + *n, got, k * sizeof *p);
    *all = p;
    *n += k;
    free(got);
    return HR_OK;
}

static enum MHD_Result whole_answer(server *sv, struct MHD_Connection *c, hr_api_job *job, hr_request *r) {
    char id[64];
    make_id(sv, job->kind == HR_API_CHAT ? "chatcmpl" : "cmpl", id, sizeof id);
    char *all = NULL;
    size_t len = 0, n_lp = 0;
    hr_token_logprob *lp = NULL;
    const char *finish = NULL;
    hr_status s = HR_OK;
    while (!finish && s == HR_OK) {
        char *text = NULL;
        size_t n = 0;
        s = hr_request_poll(sv->eng, r, POLL_MS, &text, &n, &finish);
        if (job->params.logprobs && s == HR_OK) s = gather_logprobs(sv, r, &lp, &n_lp);
        if (n) {
            char *p = realloc(all, len + n + 1);
            if (!p) s = hr_error(HR_ERR_OOM, "serve: out of memory");
            else memcpy(p + len, text, n), len += n, p[len] = '\0', all = p;
        }
        free(text);
        if (!finish && s == HR_OK && client_gone(c)) {
            hr_request_release(sv->eng, r); /* cancels it */
            free(all);
            free(lp);
            return MHD_NO;
        }
    }
    int64_t prompt, completion, prefilled;
    hr_request_counts(sv->eng, r, &prompt, &completion, &prefilled);
    hr_request_release(sv->eng, r);
    if (s != HR_OK) {
        free(all);
        free(lp);
        return send_error(sv, c, 500, hr_last_error());
    }
    size_t offset = 0;
    hr_api_out o = {.kind = job->kind, .id = id, .model = sv->o->model_name, .created = (long)time(NULL),
                    .text = all, .len = len, .finish = finish, .prompt_tokens = prompt, .completion_tokens = completion};
    o.logprobs = job->params.logprobs ? hr_api_logprobs(job->kind, sv->tok, lp, n_lp, &offset) : NULL;
    hr_output_parser *parser = NULL;
    hr_output_delta parts = {0};
    if (job->kind == HR_API_CHAT) {
        s = hr_output_parser_new(&job->style, &parser);
        if (s == HR_OK) s = hr_output_parser_feed(parser, all ? all : "", len, true, &parts);
        o.parts = &parts;
        if (parts.n_calls && !strcmp(finish, "stop")) o.finish = "tool_calls";
    }
    char *json = s == HR_OK ? hr_api_answer_json(&o) : NULL;
    cJSON_Delete(o.logprobs);
    hr_output_delta_clear(&parts);
    hr_output_parser_free(parser);
    free(all);
    free(lp);
    return json ? send_json(sv, c, 200, json) : send_error(sv, c, 500, hr_last_error());
}

/* ---- POST: server-sent events ------------------------------------------------------ */

typedef struct stream {
    server *sv;
    struct MHD_Connection *c;
    hr_request *r;
    hr_api_kind kind;
    bool include_usage, opened, ended, logprobs;
    size_t text_offset;
    hr_output_parser *parser; /* chat: reasoning and tool calls out of the text */
    int calls;                /* tool calls sent so far */
    char id[64];
    long created;
    char *buf;
    size_t len, off, cap;
} stream;

static bool put(stream *st, char *ev) {
    if (!ev) return false;
    size_t n = strlen(ev);
    if (st->len + n > st->cap) {
        size_t cap = (st->len + n) * 2;
        char *p = realloc(st->buf, cap);
        if (!p) {
            free(ev);
            return false;
        }
        st->buf = p;
        st->cap = cap;
    }
    memcpy(st->buf + st->len, ev, n);
    st->len += n;
    free(ev);
    return true;
}

/* One chunk of text (and log-probabilities): through the parser for a
 * chat; nothing when the parser holds it all back. */
static bool put_piece(stream *st, const char *text, size_t n, cJSON *lpj, bool final) {
    hr_api_out o = {.kind = st->kind, .id = st->id, .model = st->sv->o->model_name, .created = st->created,
                    .text = text, .len = n, .logprobs = lpj, .call_base = st->calls};
    hr_output_delta parts = {0};
    bool ok = true;
    if (st->parser) {
        ok = hr_output_parser_feed(st->parser, text ? text : "", n, final, &parts) == HR_OK;
        o.parts = &parts;
        st->calls += parts.n_calls;
    }
    if (ok && (parts.reasoning || parts.content || parts.n_calls || (!st->parser && (n || lpj)) || (st->parser && lpj)))
        ok = put(st, hr_api_chunk_event(&o));
    cJSON_Delete(o.logprobs);
    hr_output_delta_clear(&parts);
    return ok;
}

/* The events up to the request's end: [DONE] last, always. */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    stream *st = cls;
    for (;;) {
        if (st->off < st->len) {
            size_t n = st->len - st->off < max ? st->len - st->off : max;
            memcpy(out, st->buf + st->off, n);
            st->off += n;
            return (ssize_t)n;
        }
        st->off = st->len = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        hr_api_out o = {.kind = st->kind, .id = st->id, .model = st->sv->o->model_name, .created = st->created};
        if (!st->opened) {
            st->opened = true;
            o.opening = true;
            if (st->kind == HR_API_CHAT && !put(st, hr_api_chunk_event(&o))) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        char *text = NULL;
        size_t n = 0;
        const char *finish = NULL;
        hr_status s = hr_request_poll(st->sv->eng, st->r, POLL_MS, &text, &n, &finish);
        hr_token_logprob *lp = NULL;
        size_t n_lp = 0;
        if (st->logprobs) hr_request_take_logprobs(st->sv->eng, st->r, &lp, &n_lp);
        cJSON *lpj = n_lp ? hr_api_logprobs(st->kind, st->sv->tok, lp, n_lp, &st->text_offset) : NULL;
        bool ok = n || lpj || (finish && st->parser) ? put_piece(st, text, n, lpj, finish != NULL) : true;
        free(lp);
        free(text);
        if (s != HR_OK) {
            char *err = hr_api_error_json(500, hr_last_error());
            if (err) {
                size_t m = strlen(err) + 16;
                char *ev = malloc(m);
                if (ev) snprintf(ev, m, "data: %s\n\n", err);
                ok &= put(st, ev);
                free(err);
            }
            ok &= put(st, strdup("data: [DONE]\n\n"));
            st->ended = true;
        } else if (finish) {
            int64_t prefilled;
            hr_request_counts(st->sv->eng, st->r, &o.prompt_tokens, &o.completion_tokens, &prefilled);
            o.finish = st->calls && !strcmp(finish, "stop") ? "tool_calls" : finish;
            ok &= put(st, hr_api_chunk_event(&o));
            if (st->include_usage) {
                o.finish = NULL;
                o.usage_only = true;
                ok &= put(st, hr_api_chunk_event(&o));
            }
            ok &= put(st, strdup("data: [DONE]\n\n"));
            st->ended = true;
        } else if (!n && client_gone(st->c)) {
            hr_request_cancel(st->sv->eng, st->r);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    hr_request_release(st->sv->eng, st->r); /* cancels it if it still runs */
    hr_output_parser_free(st->parser);
    answering(st->sv, -1);
    free(st->buf);
    free(st);
}

static enum MHD_Result stream_answer(server *sv, struct MHD_Connection *c, hr_api_job *job, hr_request *r) {
    stream *st = calloc(1, sizeof *st);
    if (!st) {
        hr_request_release(sv->eng, r);
        return send_error(sv, c, 500, "out of memory");
    }
    answering(sv, 1); /* until stream_free */
    st->sv = sv;
    st->c = c;
    st->r = r;
    st->kind = job->kind;
    st->include_usage = job->include_usage;
    st->logprobs = job->params.logprobs;
    if (job->kind == HR_API_CHAT && hr_output_parser_new(&job->style, &st->parser) != HR_OK) {
        stream_free(st);
        return send_error(sv, c, 500, "out of memory");
    }
    st->created = (long)time(NULL);
    make_id(sv, job->kind == HR_API_CHAT ? "chatcmpl" : "cmpl", st->id, sizeof st->id);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    count(sv, 200);
    pthread_mutex_lock(&sv->mu);
    sv->streams++;
    pthread_mutex_unlock(&sv->mu);
    return ok;
}

static enum MHD_Result generate(server *sv, struct MHD_Connection *c, hr_api_kind kind, const body *b) {
    hr_api_job job;
    hr_status s = hr_api_parse(kind, b->data ? b->data : "", b->len, sv->o->model_name, sv->tok,
                               hr_model_generation_config(sv->m), &job);
    if (s != HR_OK) return send_error(sv, c, s == HR_ERR_UNSUPPORTED ? 400 : status_of(s), hr_last_error());
    hr_request *r = NULL;
    s = hr_engine_submit(sv->eng, job.ids, job.n_ids, &job.params, &r);
    enum MHD_Result ok;
    if (s != HR_OK) ok = send_error(sv, c, status_of(s), hr_last_error());
    else if (job.stream) ok = stream_answer(sv, c, &job, r); /* stream_free ends the answer */
    else {
        answering(sv, 1);
        ok = whole_answer(sv, c, &job, r);
        answering(sv, -1);
    }
    hr_api_job_free(&job);
    return ok;
}

/* ---- routing ----------------------------------------------------------------------- */

static enum MHD_Result route(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                             const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    server *sv = cls;
    body *b = *con_cls;
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return MHD_NO;
        *con_cls = b;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > sv->max_body) b->too_large = true;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!b->too_large && b->len + *upload_size > sv->max_body) b->too_large = true;
        if (!b->too_large) {
            if (b->len + *upload_size + 1 > b->cap) {
                size_t cap = (b->len + *upload_size + 1) * 2;
                char *p = realloc(b->data, cap);
                if (!p) return MHD_NO;
                b->data = p;
                b->cap = cap;
            }
            memcpy(b->data + b->len, upload, *upload_size);
            b->len += *upload_size;
            b->data[b->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (b->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is larger than this server's limit of %zu bytes", sv->max_body);
        return send_error(sv, c, 413, msg);
    }
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions")) {
        if (!post) return send_error(sv, c, 405, "use POST");
        return generate(sv, c, url[4] == 'c' && url[5] == 'h' ? HR_API_CHAT : HR_API_COMPLETIONS, b);
    }
    if (!get) return send_error(sv, c, !strcmp(url, "/") || !strcmp(url, "/health") || !strcmp(url, "/metrics") ||
                                                 !strcmp(url, "/v1/models") ? 405 : 404, "no such endpoint");
    if (!strcmp(url, "/health")) return send_json(sv, c, 200, strdup("{\"status\":\"ok\"}"));
    if (!strcmp(url, "/v1/models")) return models(sv, c);
    if (!strcmp(url, "/metrics")) return metrics(sv, c);
    if (!strcmp(url, "/")) return send_text(sv, c, 200, "text/html; charset=utf-8", strdup(hr_serve_page_html));
    char msg[300];
    snprintf(msg, sizeof msg, "no such endpoint: %.200s", url);
    return send_error(sv, c, 404, msg);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode code) {
    (void)cls, (void)c, (void)code;
    body *b = *con_cls;
    if (b) free(b->data);
    free(b);
    *con_cls = NULL;
}

static void connection_event(void *cls, struct MHD_Connection *c, void **socket_ctx,
                             enum MHD_ConnectionNotificationCode code) {
    (void)c, (void)socket_ctx;
    server *sv = cls;
    pthread_mutex_lock(&sv->mu);
    sv->connections += code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
    pthread_mutex_unlock(&sv->mu);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

hr_status hr_serve_run(hr_model *m, const hr_tokenizer *tok, const hr_serve_options *o, volatile sig_atomic_t *stop) {
    server sv = {.m = m, .tok = tok, .o = o, .max_body = o->max_body ? o->max_body : 4u << 20};
    pthread_mutex_init(&sv.mu, NULL);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    const char *host = o->host ? o->host : "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return hr_error(HR_ERR_INVALID_ARG, "--host %s is not an IPv4 address", host);
    HR_TRY(hr_engine_create(m, tok, &o->engine, &sv.eng));
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC, 0, NULL, NULL, route, &sv,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed, &sv,
        MHD_OPTION_NOTIFY_CONNECTION, connection_event, &sv, MHD_OPTION_CONNECTION_LIMIT, 512u,
        MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
    if (!d) {
        hr_engine_free(sv.eng);
        return hr_error(HR_ERR_IO, "cannot listen on %s:%d: %s", host, o->port, strerror(errno));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "hubrt serve: %s on http://%s:%u (%lld rows of %lld tokens)\n", o->model_name, host,
            di ? di->port : (unsigned)o->port, (long long)(o->engine.slots ? o->engine.slots : 8),
            (long long)hr_engine_capacity(sv.eng));
    fflush(stderr);
    while (!*stop) sleep_ms(50);
    fprintf(stderr, "hubrt serve: shutting down\n");
    /* no new connections are accepted (those that arrive wait in the
     * listen queue until the socket closes, below) */
    MHD_socket listen_fd = MHD_quiesce_daemon(d);
    hr_engine_shutdown(sv.eng, o->grace_s);
    /* every request has ended: let each answer write its last events (a
     * slow reader's too), but not wait on idle keep-alive connections */
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&sv.mu);
        int busy = sv.answering;
        pthread_mutex_unlock(&sv.mu);
        if (!busy) break;
        sleep_ms(50);
    }
    MHD_stop_daemon(d);
    if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd); /* ours once quiesced, after the threads are gone */
    hr_engine_free(sv.eng);
    pthread_mutex_destroy(&sv.mu);
    return HR_OK;
}
