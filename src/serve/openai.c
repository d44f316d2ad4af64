/* OpenAI's API shapes (serve.h): request bodies checked field by field
 * into engine requests, answers and stream chunks written as OpenAI's
 * clients read them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "hubrt/chat.h"
#include "serve/serve.h"

#define MAX_STOP 4 /* OpenAI's limit */

void hr_api_job_free(hr_api_job *job) {
    if (!job) return;
    free(job->ids);
    for (int i = 0; i < job->params.n_stop; i++) free(job->stop[i]);
    free(job->stop);
    memset(job, 0, sizeof *job);
}

static hr_status bad(const char *fmt, const char *field) {
    return hr_error(HR_ERR_INVALID_ARG, fmt, field);
}

/* A number field within [lo, hi]; absent or null leaves *out. */
static hr_status number(const cJSON *body, const char *field, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, field);
    if (!v || cJSON_IsNull(v)) return HR_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bad("'%s' must be a number", field);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return hr_error(HR_ERR_INVALID_ARG, "'%s' is %g; it must lie in [%g, %g]", field, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return HR_OK;
}

static hr_status integer(const cJSON *body, const char *field, double lo, double hi, int64_t *out, bool *given) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, field);
    if (!v || cJSON_IsNull(v)) return HR_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) return bad("'%s' must be an integer", field);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return hr_error(HR_ERR_INVALID_ARG, "'%s' is %.0f; it must lie in [%.0f, %.0f]", field, v->valuedouble, lo, hi);
    *out = (int64_t)v->valuedouble;
    if (given) *given = true;
    return HR_OK;
}

static hr_status boolean(const cJSON *body, const char *field, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, field);
    if (!v || cJSON_IsNull(v)) return HR_OK;
    if (!cJSON_IsBool(v)) return bad("'%s' must be true or false", field);
    *out = cJSON_IsTrue(v);
    return HR_OK;
}

static hr_status stop_strings(const cJSON *body, hr_api_job *job) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, "stop");
    if (!v || cJSON_IsNull(v)) return HR_OK;
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0) return bad("'%s' must be a string or a list of strings", "stop");
    if (n > MAX_STOP) return hr_error(HR_ERR_INVALID_ARG, "'stop' holds %d strings; at most %d", n, MAX_STOP);
    job->stop = calloc((size_t)(n ? n : 1), sizeof(char *));
    if (!job->stop) return hr_error(HR_ERR_OOM, "serve: out of memory");
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_IsString(v) ? v : cJSON_GetArrayItem(v, i);
        if (!cJSON_IsString(s)) return bad("'%s' must be a string or a list of strings", "stop");
        if (!*s->valuestring) return bad("'%s' holds an empty string", "stop");
        if (!(job->stop[i] = strdup(s->valuestring))) return hr_error(HR_ERR_OOM, "serve: out of memory");
        job->params.n_stop = i + 1;
    }
    job->params.stop = (const char *const *)job->stop;
    return HR_OK;
}

static hr_status set_ids(hr_api_job *job, const int32_t *ids, size_t n) {
    job->ids = malloc(sizeof(int64_t) * (n ? n : 1));
    if (!job->ids) return hr_error(HR_ERR_OOM, "serve: out of memory");
    for (size_t i = 0; i < n; i++) job->ids[i] = ids[i];
    job->n_ids = (int64_t)n;
    return HR_OK;
}

static hr_status encode(const hr_tokenizer *tok, const char *text, size_t len, bool add_special, hr_api_job *job) {
    int32_t *ids = NULL;
    size_t n = 0;
    HR_TRY(hr_tokenizer_encode(tok, text, len, add_special, &ids, &n));
    hr_status s = set_ids(job, ids, n);
    hr_tokenizer_free_array(ids);
    return s;
}

/* "prompt": a string, a list of one string, or a list of token ids. */
static hr_status completion_prompt(const cJSON *body, const hr_tokenizer *tok, hr_api_job *job) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) return encode(tok, p->valuestring, strlen(p->valuestring), true, job);
    if (!cJSON_IsArray(p) || !cJSON_GetArraySize(p))
        return bad("'%s' must be a string, a list of one string or a list of token ids", "prompt");
    int n = cJSON_GetArraySize(p);
    job->ids = malloc(sizeof(int64_t) * (size_t)n);
    if (!job->ids) return hr_error(HR_ERR_OOM, "serve: out of memory");
    int i = 0;
    for (const cJSON *x = p->child; x; x = x->next, i++) {
        if (cJSON_IsString(x)) return bad("'%s' holds several prompts; send one per request", "prompt");
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble > 2147483647.0)
            return bad("'%s' must be a string, a list of one string or a list of token ids", "prompt");
        job->ids[i] = (int64_t)x->valuedouble;
    }
    job->n_ids = n;
    return HR_OK;
}

static const char *special_token(const hr_tokenizer *tok, int32_t id, char *buf, size_t cap) {
    const char *t = NULL;
    size_t n = 0;
    if (id < 0 || hr_tokenizer_id_to_token(tok, id, &t, &n) != HR_OK) return "";
    snprintf(buf, cap, "%.*s", (int)n, t);
    return buf;
}

/* "messages" through the model's chat template, as transformers'
 * apply_chat_template(add_generation_prompt=True) renders them. */
static hr_status chat_prompt(const cJSON *body, const hr_tokenizer *tok, hr_api_job *job) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs)) return bad("'%s' must be a non-empty list", "messages");
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return hr_error(HR_ERR_INVALID_ARG, "'messages[%d]' must be an object with a string 'role'", i);
    }
    const char *tmpl = hr_tokenizer_chat_template(tok);
    if (!tmpl) return hr_error(HR_ERR_UNSUPPORTED, "this model's tokenizer has no chat template; use /v1/completions");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    const cJSON *kwargs = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) return bad("'%s' must be a list", "tools");
    if (kwargs && !cJSON_IsNull(kwargs) && !cJSON_IsObject(kwargs)) return bad("'%s' must be an object", "chat_template_kwargs");
    cJSON *ctx = cJSON_CreateObject();
    if (!ctx) return hr_error(HR_ERR_OOM, "serve: out of memory");
    char bos[256], eos[256];
    for (const cJSON *k = kwargs && cJSON_IsObject(kwargs) ? kwargs->child : NULL; k; k = k->next)
        cJSON_AddItemToObject(ctx, k->string, cJSON_Duplicate(k, true));
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "messages");
    cJSON_AddItemReferenceToObject(ctx, "messages", (cJSON *)msgs);
    if (!cJSON_HasObjectItem(ctx, "tools")) {
        if (cJSON_IsArray(tools)) cJSON_AddItemReferenceToObject(ctx, "tools", (cJSON *)tools);
        else cJSON_AddNullToObject(ctx, "tools");
    }
    if (!cJSON_HasObjectItem(ctx, "add_generation_prompt")) cJSON_AddTrueToObject(ctx, "add_generation_prompt");
    if (!cJSON_HasObjectItem(ctx, "bos_token"))
        cJSON_AddStringToObject(ctx, "bos_token", special_token(tok, hr_tokenizer_bos_id(tok), bos, sizeof bos));
    if (!cJSON_HasObjectItem(ctx, "eos_token"))
        cJSON_AddStringToObject(ctx, "eos_token", special_token(tok, hr_tokenizer_eos_id(tok), eos, sizeof eos));
    char *json = cJSON_PrintUnformatted(ctx);
    cJSON_Delete(ctx);
    if (!json) return hr_error(HR_ERR_OOM, "serve: out of memory");
    char *text = NULL;
    size_t len = 0;
    hr_status s = hr_chat_template_render(tmpl, strlen(tmpl), json, strlen(json), &text, &len);
    cJSON_free(json);
    if (s != HR_OK) return hr_error_context(s, "the chat template");
    /* the template writes the special tokens itself */
    s = encode(tok, text, len, false, job);
    job->style = hr_output_style_detect(tmpl, text, len, cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0);
    job->params.keep_special = job->style.keep_special;
    free(text);
    return s;
}

static uint64_t fresh_seed(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return x;
}

static hr_status parse_body(hr_api_kind kind, const cJSON *body, const char *model_name, const hr_tokenizer *tok,
                            const hr_generation_config *gc, hr_api_job *job) {
    if (!cJSON_IsObject(body)) return hr_error(HR_ERR_INVALID_ARG, "the body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) return bad("'%s' must be a string", "model");
    if (cJSON_IsString(model) && strcmp(model->valuestring, model_name))
        return hr_error(HR_ERR_NOT_FOUND, "the model '%s' does not exist; this server serves '%s'",
                        model->valuestring, model_name);
    hr_request_params *p = &job->params;
    double temperature = gc && gc->do_sample ? gc->temperature : 0, top_p = gc ? gc->top_p : 1, n = 1;
    double min_p = gc ? gc->min_p : 0, rep = gc ? gc->repetition_penalty : 1, zero = 0;
    int64_t top_k = gc && gc->do_sample ? gc->top_k : 0, seed = 0, max_tokens = kind == HR_API_COMPLETIONS ? 16 : 0;
    HR_TRY(number(body, "temperature", 0, 2, &temperature));
    HR_TRY(number(body, "top_p", 0, 1, &top_p));
    HR_TRY(number(body, "min_p", 0, 1, &min_p));
    HR_TRY(number(body, "repetition_penalty", 0.01, 100, &rep));
    HR_TRY(integer(body, "top_k", -1, 1e9, &top_k, NULL));
    bool seeded = false;
    HR_TRY(integer(body, "seed", -9.2e18, 9.2e18, &seed, &seeded));
    HR_TRY(integer(body, "max_tokens", 1, 1e9, &max_tokens, NULL));
    if (kind == HR_API_CHAT) HR_TRY(integer(body, "max_completion_tokens", 1, 1e9, &max_tokens, NULL));
    HR_TRY(number(body, "n", 1, 1, &n));
    HR_TRY(number(body, "frequency_penalty", 0, 0, &zero));
    HR_TRY(number(body, "presence_penalty", 0, 0, &zero));
    HR_TRY(boolean(body, "stream", &job->stream));
    int64_t top = 0;
    bool top_given = false;
    if (kind == HR_API_CHAT) {
        HR_TRY(boolean(body, "logprobs", &p->logprobs));
        HR_TRY(integer(body, "top_logprobs", 0, HR_MAX_TOP_LOGPROBS, &top, &top_given));
        if (top_given && !p->logprobs) return bad("'%s' needs \"logprobs\": true", "top_logprobs");
    } else {
        HR_TRY(integer(body, "logprobs", 0, 5, &top, &p->logprobs)); /* the legacy API's count */
    }
    p->top_logprobs = (int)top;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return bad("'%s' must be an object", "stream_options");
        HR_TRY(boolean(so, "include_usage", &job->include_usage));
    }
    HR_TRY(stop_strings(body, job));
    p->do_sample = temperature > 0;
    p->temperature = temperature > 0 ? temperature : 1;
    p->top_p = top_p > 0 ? top_p : 1;
    p->top_k = top_k > 0 ? top_k : 0;
    p->min_p = min_p;
    p->repetition_penalty = rep;
    p->seed = seeded ? (uint64_t)seed : fresh_seed(); /* unseeded draws differ, as OpenAI's and vLLM's do */
    p->max_tokens = max_tokens;
    return kind == HR_API_CHAT ? chat_prompt(body, tok, job) : completion_prompt(body, tok, job);
}

hr_status hr_api_parse(hr_api_kind kind, const char *body, size_t len, const char *model_name,
                       const hr_tokenizer *tok, const hr_generation_config *gc, hr_api_job *job) {
    memset(job, 0, sizeof *job);
    job->kind = kind;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        return hr_error(HR_ERR_INVALID_ARG, "the body is not valid JSON (near byte %zu)", at);
    }
    hr_status s = parse_body(kind, root, model_name, tok, gc, job);
    cJSON_Delete(root);
    if (s != HR_OK) hr_api_job_free(job);
    return s;
}

/* ---- answers ------------------------------------------------------------------- */

static const char *error_type(int http_status) {
    switch (http_status) {
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 503: return "server_overloaded";
    default: return http_status >= 500 ? "server_error" : "invalid_request_error";
    }
}

char *hr_api_error_json(int http_status, const char *message) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", message);
    cJSON_AddStringToObject(err, "type", error_type(http_status));
    cJSON_AddNullToObject(err, "param");
    cJSON_AddNumberToObject(err, "code", http_status);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static cJSON *head(hr_api_kind kind, const char *id, long created, const char *model, bool chunk) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", id);
    cJSON_AddStringToObject(root, "object", kind == HR_API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                                 : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)created);
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddStringToObject(root, "system_fingerprint", "hubrt");
    return root;
}

static void add_usage(cJSON *root, int64_t prompt, int64_t completion) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
}

/* A JSON string of len bytes (cJSON strings end at NUL; text holds none). */
static cJSON *string_n(const char *text, size_t len) {
    char *s = malloc(len + 1);
    if (!s) return NULL;
    memcpy(s, text ? text : "", len);
    s[len] = '\0';
    cJSON *j = cJSON_CreateString(s);
    free(s);
    return j;
}

static void add_finish(cJSON *choice, const char *finish) {
    if (finish) cJSON_AddStringToObject(choice, "finish_reason", finish);
    else cJSON_AddNullToObject(choice, "finish_reason");
}

static char *print_free(cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* The text of one token alone, as OpenAI's "token" shows it. */
static cJSON *token_string(const hr_tokenizer *tok, int64_t id, cJSON **bytes, size_t *len) {
    char *text = NULL;
    size_t n = 0;
    int32_t one = (int32_t)id;
    if (hr_tokenizer_decode(tok, &one, 1, false, &text, &n) != HR_OK) text = NULL, n = 0;
    cJSON *s = string_n(text, n);
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(*bytes, cJSON_CreateNumber((unsigned char)text[i]));
    }
    if (len) { /* in characters, as Python's str offsets count */
        *len = 0;
        for (size_t i = 0; i < n; i++) *len += ((unsigned char)text[i] & 0xC0) != 0x80;
    }
    hr_tokenizer_free_array(text);
    return s;
}

static cJSON *chat_entry(const hr_tokenizer *tok, int64_t id, float logprob) {
    cJSON *e = cJSON_CreateObject(), *bytes = NULL;
    cJSON_AddItemToObject(e, "token", token_string(tok, id, &bytes, NULL));
    cJSON_AddNumberToObject(e, "logprob", logprob);
    cJSON_AddItemToObject(e, "bytes", bytes);
    return e;
}

cJSON *hr_api_logprobs(hr_api_kind kind, const hr_tokenizer *tok, const hr_token_logprob *lp, size_t n,
                       size_t *offset) {
    cJSON *root = cJSON_CreateObject();
    if (kind == HR_API_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(root, "content");
        for (size_t i = 0; i < n; i++) {
            cJSON *e = chat_entry(tok, lp[i].id, lp[i].logprob), *top = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int j = 0; j < lp[i].n_top; j++)
                cJSON_AddItemToArray(top, chat_entry(tok, lp[i].top_id[j], lp[i].top_logprob[j]));
            cJSON_AddItemToArray(content, e);
        }
        return root;
    }
    cJSON *tokens = cJSON_AddArrayToObject(root, "tokens"), *lps = cJSON_AddArrayToObject(root, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(root, "top_logprobs"), *offs = cJSON_AddArrayToObject(root, "text_offset");
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        cJSON_AddItemToArray(tokens, token_string(tok, lp[i].id, NULL, &len));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp[i].logprob));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += len;
        cJSON *top = cJSON_CreateObject();
        for (int j = 0; j < lp[i].n_top; j++) {
            cJSON *name = token_string(tok, lp[i].top_id[j], NULL, NULL);
            if (!cJSON_HasObjectItem(top, name->valuestring))
                cJSON_AddNumberToObject(top, name->valuestring, lp[i].top_logprob[j]);
            cJSON_Delete(name);
        }
        cJSON_AddItemToArray(tops, top);
    }
    return root;
}

static void add_logprobs(cJSON *choice, cJSON *logprobs) {
    if (logprobs) cJSON_AddItemToObject(choice, "logprobs", logprobs);
    else cJSON_AddNullToObject(choice, "logprobs");
}

/* An assistant message's parts: reasoning_content and tool_calls beside
 * the content when a parser split the output. */
static void add_parts(cJSON *msg, const hr_api_out *o, bool delta) {
    const hr_output_delta *d = o->parts;
    if (!d) {
        if (!delta || o->opening || o->text) cJSON_AddItemToObject(msg, "content", string_n(o->text, o->len));
        return;
    }
    if (d->reasoning) cJSON_AddItemToObject(msg, "reasoning_content", string_n(d->reasoning, d->reasoning_len));
    if (d->content || (!delta && !d->n_calls)) cJSON_AddItemToObject(msg, "content", string_n(d->content, d->content_len));
    else if (!delta || o->opening) cJSON_AddNullToObject(msg, "content");
    if (!d->n_calls) return;
    cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
    for (int i = 0; i < d->n_calls; i++) {
        cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
        char id[48];
        snprintf(id, sizeof id, "call_%s_%d", o->id, o->call_base + i);
        if (delta) cJSON_AddNumberToObject(c, "index", o->call_base + i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(f, "name", d->calls[i].name);
        cJSON_AddStringToObject(f, "arguments", d->calls[i].arguments);
        cJSON_AddItemToObject(c, "function", f);
        cJSON_AddItemToArray(calls, c);
    }
}

char *hr_api_answer_json(hr_api_out *o) {
    cJSON *root = head(o->kind, o->id, o->created, o->model, false);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (o->kind == HR_API_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        add_parts(msg, o, false);
    } else {
        cJSON_AddItemToObject(c, "text", string_n(o->text, o->len));
    }
    add_logprobs(c, o->logprobs);
    o->logprobs = NULL;
    add_finish(c, o->finish);
    add_usage(root, o->prompt_tokens, o->completion_tokens);
    return print_free(root);
}

char *hr_api_chunk_event(hr_api_out *o) {
    cJSON *root = head(o->kind, o->id, o->created, o->model, true);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    if (o->usage_only) {
        add_usage(root, o->prompt_tokens, o->completion_tokens);
    } else {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", 0);
        if (o->kind == HR_API_CHAT) {
            cJSON *delta = cJSON_AddObjectToObject(c, "delta");
            if (o->opening) cJSON_AddStringToObject(delta, "role", "assistant");
            add_parts(delta, o, true);
        } else {
            cJSON_AddItemToObject(c, "text", string_n(o->text, o->len));
        }
        add_logprobs(c, o->logprobs);
        o->logprobs = NULL;
        add_finish(c, o->finish);
    }
    cJSON_Delete(o->logprobs);
    o->logprobs = NULL;
    char *json = print_free(root);
    if (!json) return NULL;
    size_t n = strlen(json);
    char *ev = malloc(n + 9);
    if (ev) snprintf(ev, n + 9, "data: %s\n\n", json);
    cJSON_free(json);
    return ev;
}
