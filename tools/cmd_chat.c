/* hubrt chat: an interactive conversation in the terminal. Each turn the
 * model's own chat template (tokenizer_config.json's, or a GGUF file's)
 * renders the whole history with add_generation_prompt, as transformers'
 * apply_chat_template does; the answer streams as it is generated and
 * joins the history. /reset forgets the history, /system TEXT sets the
 * system prompt (and resets), /quit or end of input leaves; Ctrl-C stops
 * the answer being written and keeps the session. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "core/error.h"

static const char *usage_text =
    "usage: hubrt chat MODEL [--system TEXT] [-n N] [--greedy | --temp T --top-p P --top-k K --seed S]\n"
    "                  [--no-think] [--dtype D] [--device cpu] [--revision R] [--experts grouped|eager]\n"
    "                  [--dequantize | --quantize q8_0|q4_0|q4_1|q5_0|q5_1|mxfp4|q4_k|q5_k|q6_k]\n"
    "  --tp N [--tp-plan JSON] [--ep N]: split over N ranks (hubrt launch -n N -- hubrt chat ...);\n"
    "  rank 0 reads stdin and prints.\n"
    "  One message per line on stdin; the answer streams to stdout. /reset forgets the conversation,\n"
    "  /system TEXT sets the system prompt, /quit leaves; Ctrl-C stops the current answer.\n"
    "  --no-think passes enable_thinking=false to the template (Qwen3 and others). -n: new tokens\n"
    "  per answer (default 512). Sampling defaults come from generation_config.json.\n";

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

typedef struct chat_args {
    const char *model, *system, *revision;
    hr_model_options opts;
    int64_t n;
    bool greedy, no_think, has_temp, has_top_p, has_top_k, has_seed;
    double temp, top_p, top_k, seed;
} chat_args;

static int parse(int argc, char **argv, chat_args *a) {
    memset(a, 0, sizeof *a);
    a->n = 512;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool flag_only = !strcmp(f, "--greedy") || !strcmp(f, "--no-think") || !strcmp(f, "--dequantize");
        if (f[0] == '-' && !flag_only && !v) {
            fprintf(stderr, "hubrt chat: %s needs a value\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
        double num;
        int tp = hr_cli_tp_flag("chat", f, v, &a->opts);
        if (tp < 0) return HR_EXIT_USAGE;
        if (tp) {
            i++;
            continue;
        }
        if (!strcmp(f, "--greedy")) a->greedy = true;
        else if (!strcmp(f, "--no-think")) a->no_think = true;
        else if (!strcmp(f, "--system")) a->system = argv[++i];
        else if (!strcmp(f, "--revision")) a->revision = argv[++i];
        else if (!strcmp(f, "--dtype")) a->opts.dtype = argv[++i];
        else if (!strcmp(f, "--device")) a->opts.device = argv[++i];
        else if (!strcmp(f, "--experts")) a->opts.experts_implementation = argv[++i];
        else if (!strcmp(f, "--dequantize")) a->opts.dequantize = true;
        else if (!strcmp(f, "--quantize")) a->opts.quantize = argv[++i];
        else if (!strcmp(f, "-n") || !strcmp(f, "--temp") || !strcmp(f, "--top-p") || !strcmp(f, "--top-k") ||
                 !strcmp(f, "--seed")) {
            if (!hr_cli_number("chat", f, argv[++i], &num)) return HR_EXIT_USAGE;
            if (!strcmp(f, "-n")) {
                if (num < 1 || num > 1e7) {
                    fprintf(stderr, "hubrt chat: -n must be >= 1\n");
                    return HR_EXIT_USAGE;
                }
                a->n = (int64_t)num;
            } else if (!strcmp(f, "--temp")) a->temp = num, a->has_temp = true;
            else if (!strcmp(f, "--top-p")) a->top_p = num, a->has_top_p = true;
            else if (!strcmp(f, "--top-k")) a->top_k = num, a->has_top_k = true;
            else a->seed = num, a->has_seed = true;
        } else if (f[0] != '-' && !a->model) a->model = f;
        else {
            fprintf(stderr, "hubrt chat: unknown argument '%s'\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
    }
    if (!a->model) {
        fprintf(stderr, "%s", usage_text);
        return HR_EXIT_USAGE;
    }
    if (a->greedy && (a->has_temp || a->has_top_p || a->has_top_k)) {
        fprintf(stderr, "hubrt chat: --greedy cannot be combined with sampling options\n");
        return HR_EXIT_USAGE;
    }
    return HR_EXIT_OK;
}

typedef struct chat_session {
    const chat_args *a;
    hr_tokenizer *tok;
    hr_model *model;
    const char *template_text;
    cJSON *messages;
    /* one answer */
    hr_detokenizer *detok;
    hr_status err;
    char *reply;
    size_t reply_len, reply_cap;
} chat_session;

static const char *token_text(void *ctx, int64_t row, int64_t token, size_t *len) {
    chat_session *s = ctx;
    return hr_cli_token_text(s->detok, &s->err, token, len);
}

static bool append_reply(chat_session *s, const char *text, size_t len) {
    if (s->reply_len + len + 1 > s->reply_cap) {
        size_t cap = (s->reply_len + len + 1) * 2;
        char *p = realloc(s->reply, cap);
        if (!p) return false;
        s->reply = p;
        s->reply_cap = cap;
    }
    memcpy(s->reply + s->reply_len, text, len);
    s->reply_len += len;
    s->reply[s->reply_len] = '\0';
    return true;
}

static bool on_token(void *ctx, int64_t row, int64_t token, const char *text, size_t len) {
    chat_session *s = ctx;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        if (!append_reply(s, text, len)) s->err = hr_error(HR_ERR_OOM, "chat: out of memory");
    }
    return s->err == HR_OK && !g_interrupted;
}

static const char *special_token(const hr_tokenizer *tok, int32_t id) {
    static char buf[2][256];
    static int k;
    const char *t = NULL;
    size_t n = 0;
    if (id < 0 || hr_tokenizer_id_to_token(tok, id, &t, &n) != HR_OK) return "";
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%.*s", (int)n, t);
    return buf[k];
}

/* The template's rendering of the history, ready for the answer. */
static hr_status render(chat_session *s, char **text, size_t *len) {
    cJSON *ctx = cJSON_CreateObject();
    if (!ctx) return hr_error(HR_ERR_OOM, "chat: out of memory");
    cJSON_AddItemReferenceToObject(ctx, "messages", s->messages);
    cJSON_AddNullToObject(ctx, "tools");
    cJSON_AddNullToObject(ctx, "documents");
    cJSON_AddTrueToObject(ctx, "add_generation_prompt");
    cJSON_AddStringToObject(ctx, "bos_token", special_token(s->tok, hr_tokenizer_bos_id(s->tok)));
    cJSON_AddStringToObject(ctx, "eos_token", special_token(s->tok, hr_tokenizer_eos_id(s->tok)));
    if (s->a->no_think) cJSON_AddFalseToObject(ctx, "enable_thinking");
    char *json = cJSON_PrintUnformatted(ctx);
    cJSON_Delete(ctx);
    if (!json) return hr_error(HR_ERR_OOM, "chat: out of memory");
    hr_status st = hr_chat_template_render(s->template_text, strlen(s->template_text), json, strlen(json), text, len);
    cJSON_free(json);
    return st;
}

static hr_status add_message(cJSON *messages, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content) ||
        !cJSON_AddItemToArray(messages, m)) {
        cJSON_Delete(m);
        return hr_error(HR_ERR_OOM, "chat: out of memory");
    }
    return HR_OK;
}

static hr_status reset(chat_session *s, const char *system) {
    cJSON_Delete(s->messages);
    s->messages = cJSON_CreateArray();
    if (!s->messages) return hr_error(HR_ERR_OOM, "chat: out of memory");
    return system && *system ? add_message(s->messages, "system", system) : HR_OK;
}

static void apply_sampling(const chat_args *a, const hr_generation_config *gc, hr_generate_config *cfg) {
    bool sample = a->has_temp || a->has_top_p || a->has_top_k;
    cfg->max_new_tokens = a->n;
    cfg->do_sample = a->greedy ? false : sample ? true : gc->do_sample;
    cfg->temperature = a->has_temp ? a->temp : gc->temperature;
    cfg->top_p = a->has_top_p ? a->top_p : gc->top_p;
    cfg->top_k = a->has_top_k ? (int64_t)a->top_k : gc->top_k;
    cfg->min_p = gc->min_p;
    cfg->repetition_penalty = gc->repetition_penalty;
    cfg->seed = a->has_seed ? (uint64_t)a->seed : 0;
}

/* One user message: render, generate with the answer streaming, keep it. */
static hr_status turn(chat_session *s, const char *line) {
    HR_TRY(add_message(s->messages, "user", line));
    char *text = NULL;
    size_t len = 0;
    int32_t *ids32 = NULL;
    size_t n_ids = 0;
    int64_t *ids = NULL, *out = NULL;
    hr_status st = render(s, &text, &len);
    if (st == HR_OK) st = hr_tokenizer_encode(s->tok, text, len, false, &ids32, &n_ids);
    free(text);
    if (st == HR_OK && !n_ids) st = hr_error(HR_ERR_INVALID_ARG, "chat: the template rendered no tokens");
    if (st == HR_OK) st = hr_detokenizer_init(s->tok, true, &s->detok);
    if (st == HR_OK) {
        ids = malloc(sizeof *ids * n_ids);
        out = malloc(sizeof *out * (n_ids + (size_t)s->a->n));
        if (!ids || !out) st = hr_error(HR_ERR_OOM, "chat: out of memory");
    }
    if (st == HR_OK) {
        for (size_t i = 0; i < n_ids; i++) ids[i] = ids32[i];
        hr_generate_config cfg;
        hr_generate_config_init(&cfg);
        apply_sampling(s->a, hr_model_generation_config(s->model), &cfg);
        cfg.token_text = token_text;
        cfg.on_token = on_token;
        cfg.ctx = s;
        s->err = HR_OK;
        s->reply_len = 0;
        if (s->reply) s->reply[0] = '\0';
        g_interrupted = 0;
        int64_t out_len = 0;
        st = hr_generate(s->model, ids, NULL, 1, (int64_t)n_ids, &cfg, out, &out_len, NULL);
        if (st == HR_OK) st = s->err;
    }
    if (st == HR_OK) {
        const char *rest = NULL;
        size_t n = 0;
        st = hr_detokenizer_flush(s->detok, &rest, &n);
        if (st == HR_OK && n) {
            fwrite(rest, 1, n, stdout);
            if (!append_reply(s, rest, n)) st = hr_error(HR_ERR_OOM, "chat: out of memory");
        }
        printf("\n");
        fflush(stdout);
    }
    if (st == HR_OK) st = add_message(s->messages, "assistant", s->reply ? s->reply : "");
    hr_detokenizer_free(s->detok);
    s->detok = NULL;
    hr_tokenizer_free_array(ids32);
    free(ids);
    free(out);
    return st;
}

/* The next line of stdin into *line (length in *got, -1 at the end), as
 * getline gives it. Split over ranks, rank 0 reads (mpirun feeds stdin to
 * rank 0 alone) and hands each line to the others, so every rank runs
 * the same turns. */
static hr_status read_line(char **line, size_t *cap, ssize_t *got) {
    errno = 0;
    if (hr_dist_size() == 1) {
        *got = getline(line, cap, stdin);
        return HR_OK;
    }
    int64_t n = -1;
    if (hr_dist_rank() == 0) {
        do {
            errno = 0;
            *got = getline(line, cap, stdin);
        } while (*got < 0 && errno == EINTR && (clearerr(stdin), 1));
        n = *got;
    }
    HR_TRY(hr_dist_broadcast(&n, sizeof n, 0));
    *got = (ssize_t)n;
    if (n < 0) return HR_OK;
    if ((size_t)n + 1 > *cap) {
        char *grown = realloc(*line, (size_t)n + 1);
        if (!grown) return hr_error(HR_ERR_OOM, "chat: out of memory for a %lld-byte line", (long long)n);
        *line = grown;
        *cap = (size_t)n + 1;
    }
    HR_TRY(hr_dist_broadcast(*line, (size_t)n + 1, 0));
    return HR_OK;
}

static hr_status session(chat_session *s) {
    const char *system = s->a->system;
    char *system_owned = NULL, *line = NULL;
    size_t cap = 0;
    bool tty = isatty(STDIN_FILENO);
    hr_status st = reset(s, system);
    while (st == HR_OK) {
        if (tty && hr_dist_rank() == 0) fputs("> ", stderr);
        ssize_t got = 0;
        st = read_line(&line, &cap, &got);
        if (st != HR_OK) break;
        if (got < 0) {
            if (errno == EINTR) { /* Ctrl-C at the prompt: a new prompt */
                clearerr(stdin);
                g_interrupted = 0;
                fputc('\n', stderr);
                continue;
            }
            break;
        }
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (!got) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            st = reset(s, system);
            continue;
        }
        if (!strncmp(line, "/system", 7) && (line[7] == ' ' || !line[7])) {
            free(system_owned);
            system = system_owned = strdup(line[7] ? line + 8 : "");
            st = system_owned ? reset(s, system) : (hr_status)hr_error(HR_ERR_OOM, "chat: out of memory");
            continue;
        }
        st = turn(s, line);
    }
    free(line);
    free(system_owned);
    return st;
}

int hr_cmd_chat(int argc, char **argv) {
    chat_args a;
    int rc = parse(argc, argv, &a);
    if (rc != HR_EXIT_OK) return rc;
    chat_session s = {.a = &a};
    char *dir = NULL;
    hr_status st = hr_cli_model_dir(a.model, a.revision, &dir);
    if (st == HR_OK) st = hr_tokenizer_load(dir, &s.tok);
    if (st == HR_OK && !(s.template_text = hr_tokenizer_chat_template(s.tok)))
        st = hr_error(HR_ERR_NOT_FOUND, "%s: the tokenizer has no chat template (tokenizer_config.json's "
                      "chat_template, or the GGUF file's tokenizer.chat_template)", a.model);
    if (st == HR_OK) st = hr_model_load(dir, &a.opts, &s.model);
    if (st == HR_OK) hr_cli_tp_quiet();
    if (st == HR_OK) {
        /* no SA_RESTART: a Ctrl-C at the prompt interrupts the read */
        struct sigaction sa = {.sa_handler = on_sigint};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        st = session(&s);
    }
    if (st != HR_OK) rc = hr_cli_fail("chat", st);
    cJSON_Delete(s.messages);
    free(s.reply);
    hr_model_free(s.model);
    hr_tokenizer_free(s.tok);
    free(dir);
    return rc;
}
