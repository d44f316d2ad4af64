/* Model output into reasoning, content and tool calls (output_parse.h). */
#include "serve/output_parse.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define DS_CALLS_OPEN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_CLOSE "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_OPEN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_CLOSE "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
#define PYTHON_TAG "<|python_tag|>"
#define H_CHANNEL "<|channel|>"
#define H_MESSAGE "<|message|>"

typedef enum { S_CONTENT, S_REASONING, S_TOOL, S_JSON, S_H_HEADER, S_H_BODY } state;

/* what a harmony message's body is */
typedef enum { H_CONTENT, H_REASONING, H_CALL } h_kind;

struct hr_output_parser {
    hr_output_style st;
    state s;
    char *buf; /* text not yet given out */
    size_t len;
    bool started;    /* some output has been given out (a <think> may open only before) */
    bool strip_ws;   /* drop whitespace after </think> */
    h_kind hk;
    char *h_name;    /* the function a harmony call goes to */
};

hr_output_style hr_output_style_detect(const char *tmpl, const char *prompt, size_t prompt_len, bool has_tools) {
    hr_output_style st = {0};
    if (!tmpl) return st;
    if (strstr(tmpl, H_CHANNEL)) {
        st.harmony = st.keep_special = true;
        return st;
    }
    st.think = strstr(tmpl, THINK_CLOSE) != NULL;
    if (st.think && prompt) { /* the prompt ends with an open <think> (and whitespace) */
        size_t n = prompt_len;
        while (n && isspace((unsigned char)prompt[n - 1])) n--;
        size_t k = strlen(THINK_OPEN);
        st.think_open = n >= k && !memcmp(prompt + n - k, THINK_OPEN, k);
    }
    if (!has_tools) return st;
    if (strstr(tmpl, DS_CALLS_OPEN)) st.tools = HR_TOOLS_DEEPSEEK, st.keep_special = true;
    else if (strstr(tmpl, HERMES_OPEN)) st.tools = HR_TOOLS_HERMES;
    else if (strstr(tmpl, PYTHON_TAG) || strstr(tmpl, "ipython")) st.tools = HR_TOOLS_LLAMA3_JSON;
    return st;
}

hr_status hr_output_parser_new(const hr_output_style *style, hr_output_parser **out) {
    hr_output_parser *p = calloc(1, sizeof *p);
    if (!p) return hr_error(HR_ERR_OOM, "serve: out of memory");
    p->st = *style;
    p->s = style->harmony ? S_H_HEADER : style->think_open ? S_REASONING : S_CONTENT;
    *out = p;
    return HR_OK;
}

void hr_output_parser_free(hr_output_parser *p) {
    if (!p) return;
    free(p->buf);
    free(p->h_name);
    free(p);
}

void hr_output_delta_clear(hr_output_delta *d) {
    free(d->reasoning);
    free(d->content);
    for (int i = 0; i < d->n_calls; i++) free(d->calls[i].name), free(d->calls[i].arguments);
    free(d->calls);
    memset(d, 0, sizeof *d);
}

/* ---- output pieces ------------------------------------------------------------- */

static bool append(char **s, size_t *len, const char *text, size_t n) {
    if (!n) return true;
    char *p = realloc(*s, *len + n + 1);
    if (!p) return false;
    memcpy(p + *len, text, n);
    *len += n;
    p[*len] = '\0';
    *s = p;
    return true;
}

static hr_status emit(hr_output_parser *p, hr_output_delta *d, bool reasoning, const char *text, size_t n) {
    if (p->strip_ws && !reasoning) {
        while (n && isspace((unsigned char)*text)) text++, n--;
        if (n) p->strip_ws = false;
    }
    if (!n) return HR_OK;
    p->started = true;
    bool ok = reasoning ? append(&d->reasoning, &d->reasoning_len, text, n) : append(&d->content, &d->content_len, text, n);
    return ok ? HR_OK : hr_error(HR_ERR_OOM, "serve: out of memory");
}

static char *dup_n(const char *s, size_t n) {
    char *c = malloc(n + 1);
    if (c) memcpy(c, s, n), c[n] = '\0';
    return c;
}

static hr_status add_call(hr_output_delta *d, const char *name, size_t name_len, const char *args, size_t args_len) {
    hr_tool_call *c = realloc(d->calls, sizeof *c * (size_t)(d->n_calls + 1));
    if (!c) return hr_error(HR_ERR_OOM, "serve: out of memory");
    d->calls = c;
    while (name_len && isspace((unsigned char)*name)) name++, name_len--;
    while (name_len && isspace((unsigned char)name[name_len - 1])) name_len--;
    c[d->n_calls].name = dup_n(name, name_len);
    c[d->n_calls].arguments = dup_n(args, args_len);
    if (!c[d->n_calls].name || !c[d->n_calls].arguments) {
        free(c[d->n_calls].name), free(c[d->n_calls].arguments);
        return hr_error(HR_ERR_OOM, "serve: out of memory");
    }
    d->n_calls++;
    return HR_OK;
}

/* A JSON object {"name": N, "arguments"|"parameters": A} as a call, the
 * arguments printed back as JSON text; false when it is not one. */
static bool json_call(const char *text, size_t len, hr_output_delta *d, hr_status *err) {
    cJSON *j = cJSON_ParseWithLength(text, len);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    bool ok = cJSON_IsObject(j) && cJSON_IsString(name) && (!args || cJSON_IsObject(args) || cJSON_IsString(args));
    if (ok) {
        char *a = !args ? strdup("{}") : cJSON_IsString(args) ? strdup(args->valuestring) : cJSON_PrintUnformatted(args);
        *err = a ? add_call(d, name->valuestring, strlen(name->valuestring), a, strlen(a))
                 : hr_error(HR_ERR_OOM, "serve: out of memory");
        free(a);
    }
    cJSON_Delete(j);
    return ok;
}

/* ---- scanning ------------------------------------------------------------------ */

static const char *find(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == marker[0] && !memcmp(s + i, marker, m)) return s + i;
    return NULL;
}

/* Bytes at the end of s that could begin one of the markers. */
static size_t held(const char *s, size_t n, const char *const *markers, int k) {
    size_t most = 0;
    for (int i = 0; i < k; i++) {
        if (!markers[i]) continue;
        size_t m = strlen(markers[i]);
        for (size_t l = m - 1 < n ? m - 1 : n; l > most; l--)
            if (!memcmp(s + n - l, markers[i], l)) {
                most = l;
                break;
            }
    }
    return most;
}

static void consume(hr_output_parser *p, size_t n) {
    memmove(p->buf, p->buf + n, p->len - n);
    p->len -= n;
}

static const char *tool_open(const hr_output_parser *p) {
    return p->st.tools == HR_TOOLS_HERMES ? HERMES_OPEN : p->st.tools == HR_TOOLS_DEEPSEEK ? DS_CALLS_OPEN : NULL;
}

/* DeepSeek's block of calls (between the calls markers). */
static hr_status deepseek_calls(const char *s, size_t n, hr_output_delta *d) {
    const char *end = s + n;
    for (const char *c = find(s, n, DS_CALL_OPEN); c; c = find(c, (size_t)(end - c), DS_CALL_OPEN)) {
        c += strlen(DS_CALL_OPEN);
        const char *ce = find(c, (size_t)(end - c), DS_CALL_CLOSE), *sep = find(c, (size_t)(end - c), DS_SEP);
        if (!ce) ce = end;
        if (!sep || sep > ce) continue;
        const char *rest = sep + strlen(DS_SEP);
        size_t left = (size_t)(sep - c), rlen = (size_t)(ce - rest);
        const char *fence = find(rest, rlen, "```json");
        if (left == 8 && !memcmp(c, "function", 8) && fence) { /* R1: function<sep>NAME\n```json\nARGS\n``` */
            const char *args = fence + 7, *close = find(args, (size_t)(ce - args), "```");
            if (!close) close = ce;
            HR_TRY(add_call(d, rest, (size_t)(fence - rest), args, (size_t)(close - args)));
        } else { /* V3.1: NAME<sep>ARGS */
            HR_TRY(add_call(d, c, left, rest, rlen));
        }
        c = ce;
    }
    /* arguments as compact JSON where they parse */
    for (int i = 0; i < d->n_calls; i++) {
        cJSON *j = cJSON_Parse(d->calls[i].arguments);
        char *a = j ? cJSON_PrintUnformatted(j) : NULL;
        if (a) free(d->calls[i].arguments), d->calls[i].arguments = a;
        cJSON_Delete(j);
    }
    return HR_OK;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i])) return false;
    return true;
}

/* One pass over the buffer; *more when a state changed and another pass
 * may go further. */
static hr_status step_text(hr_output_parser *p, bool final, hr_output_delta *d, bool *more) {
    *more = false;
    char *b = p->buf;
    size_t n = p->len;
    if (p->s == S_CONTENT) {
        if (p->st.tools == HR_TOOLS_LLAMA3_JSON && !p->started) { /* one JSON answer: wait for all of it */
            size_t i = 0;
            while (i < n && isspace((unsigned char)b[i])) i++;
            if (i == n && !final) return HR_OK;
            if (i < n && (b[i] == '{' || !strncmp(b + i, PYTHON_TAG, n - i < strlen(PYTHON_TAG) ? n - i : strlen(PYTHON_TAG)))) {
                p->s = S_JSON;
                *more = true;
                return HR_OK;
            }
        }
        const char *think = p->st.think && !p->started ? find(b, n, THINK_OPEN) : NULL;
        const char *tool = tool_open(p) ? find(b, n, tool_open(p)) : NULL;
        if (think && !blank(b, (size_t)(think - b))) think = NULL; /* only before any answer */
        const char *m = think && (!tool || think < tool) ? think : tool;
        if (m) {
            if (m != think) HR_TRY(emit(p, d, false, b, (size_t)(m - b))); /* whitespace before <think> goes */
            consume(p, (size_t)(m - b) + strlen(m == think ? THINK_OPEN : tool_open(p)));
            p->s = m == think ? S_REASONING : S_TOOL;
            *more = true;
            return HR_OK;
        }
        const char *markers[2] = {p->st.think && !p->started ? THINK_OPEN : NULL, tool_open(p)};
        size_t keep = final ? 0 : held(b, n, markers, 2);
        if (p->st.think && !p->started && !final && blank(b, n - keep)) return HR_OK; /* a <think> may follow */
        HR_TRY(emit(p, d, false, b, n - keep));
        consume(p, n - keep);
        return HR_OK;
    }
    if (p->s == S_REASONING) {
        const char *m = find(b, n, THINK_CLOSE);
        if (m) {
            HR_TRY(emit(p, d, true, b, (size_t)(m - b)));
            consume(p, (size_t)(m - b) + strlen(THINK_CLOSE));
            p->s = S_CONTENT;
            p->started = p->strip_ws = true;
            *more = true;
            return HR_OK;
        }
        const char *markers[1] = {THINK_CLOSE};
        size_t keep = final ? 0 : held(b, n, markers, 1);
        HR_TRY(emit(p, d, true, b, n - keep));
        consume(p, n - keep);
        return HR_OK;
    }
    if (p->s == S_TOOL) {
        const char *close = p->st.tools == HR_TOOLS_HERMES ? HERMES_CLOSE : DS_CALLS_CLOSE;
        const char *m = find(b, n, close);
        if (!m && !final) return HR_OK;
        size_t body = m ? (size_t)(m - b) : n;
        hr_status err = HR_OK;
        bool ok = true;
        if (p->st.tools == HR_TOOLS_HERMES) ok = json_call(b, body, d, &err);
        else err = deepseek_calls(b, body, d);
        HR_TRY(err);
        if (!ok) { /* not a call after all: the text as it was */
            const char *open = tool_open(p);
            HR_TRY(emit(p, d, false, open, strlen(open)));
            HR_TRY(emit(p, d, false, b, m ? body + strlen(close) : body));
        }
        p->started = true;
        consume(p, m ? body + strlen(close) : body);
        p->s = S_CONTENT;
        p->strip_ws = true;
        *more = p->len > 0;
        return HR_OK;
    }
    /* S_JSON: the whole answer */
    if (!final) return HR_OK;
    const char *j = b;
    size_t jn = n;
    const char *tag = find(b, n, PYTHON_TAG);
    if (tag) j = tag + strlen(PYTHON_TAG), jn = n - (size_t)(j - b);
    hr_status err = HR_OK;
    if (!json_call(j, jn, d, &err)) HR_TRY(emit(p, d, false, b, n));
    HR_TRY(err);
    consume(p, n);
    p->s = S_CONTENT;
    return HR_OK;
}

/* ---- harmony ------------------------------------------------------------------- */

static const char *const h_ends[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};

/* One pass of gpt-oss's messages: a header up to <|message|> names the
 * channel (and a recipient), the body runs to an end marker. */
static hr_status step_harmony(hr_output_parser *p, bool final, hr_output_delta *d, bool *more) {
    *more = false;
    char *b = p->buf;
    size_t n = p->len;
    if (p->s == S_H_HEADER) {
        const char *m = find(b, n, H_MESSAGE);
        if (!m) return HR_OK; /* at the end, the feed gives out what is left */
        const char *ch = find(b, (size_t)(m - b), H_CHANNEL), *to = find(b, (size_t)(m - b), "to=functions.");
        size_t hl = (size_t)(m - b);
        free(p->h_name);
        p->h_name = NULL;
        p->hk = H_CONTENT;
        if (to) {
            const char *s = to + 13, *e = s;
            while (e < m && !isspace((unsigned char)*e) && *e != '<') e++;
            p->h_name = dup_n(s, (size_t)(e - s));
            if (!p->h_name) return hr_error(HR_ERR_OOM, "serve: out of memory");
            p->hk = H_CALL;
        } else if (ch && hl - (size_t)(ch - b) >= strlen(H_CHANNEL) + 8 && !memcmp(ch + strlen(H_CHANNEL), "analysis", 8)) {
            p->hk = H_REASONING;
        }
        consume(p, hl + strlen(H_MESSAGE));
        p->s = S_H_BODY;
        *more = true;
        return HR_OK;
    }
    const char *end = NULL, *which = NULL;
    for (size_t i = 0; i < sizeof h_ends / sizeof *h_ends; i++) {
        const char *e = find(b, n, h_ends[i]);
        if (e && (!end || e < end)) end = e, which = h_ends[i];
    }
    if (p->hk == H_CALL) {
        if (!end && !final) return HR_OK;
        size_t body = end ? (size_t)(end - b) : n;
        cJSON *j = cJSON_ParseWithLength(b, body);
        char *args = j ? cJSON_PrintUnformatted(j) : NULL;
        cJSON_Delete(j);
        hr_status s = args ? add_call(d, p->h_name, strlen(p->h_name), args, strlen(args))
                           : add_call(d, p->h_name, strlen(p->h_name), b, body);
        free(args);
        HR_TRY(s);
        consume(p, end ? body + strlen(which) : body);
    } else if (end) {
        HR_TRY(emit(p, d, p->hk == H_REASONING, b, (size_t)(end - b)));
        consume(p, (size_t)(end - b) + strlen(which));
    } else {
        size_t keep = final ? 0 : held(b, n, h_ends, 4);
        HR_TRY(emit(p, d, p->hk == H_REASONING, b, n - keep));
        consume(p, n - keep);
        return HR_OK;
    }
    p->s = S_H_HEADER;
    *more = p->len > 0;
    return HR_OK;
}

hr_status hr_output_parser_feed(hr_output_parser *p, const char *text, size_t len, bool final, hr_output_delta *d) {
    memset(d, 0, sizeof *d);
    if (len && !append(&p->buf, &p->len, text, len)) return hr_error(HR_ERR_OOM, "serve: out of memory");
    bool more = true;
    hr_status s = HR_OK;
    while (more && s == HR_OK) s = p->st.harmony ? step_harmony(p, final, d, &more) : step_text(p, final, d, &more);
    if (s == HR_OK && final && p->len) { /* an unfinished header or call: the text as it came */
        bool reasoning = p->s == S_REASONING || (p->s == S_H_BODY && p->hk == H_REASONING);
        s = emit(p, d, reasoning, p->buf, p->len);
        p->len = 0;
    }
    return s;
}
