/* hubrt serve: the OpenAI-compatible server (src/serve/serve.h) for one
 * model, until SIGTERM or SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "serve/serve.h"

static const char *usage_text =
    "usage: hubrt serve MODEL [--port P] [--host ADDR] [--model-name NAME] [--slots N] [--ctx N]\n"
    "                   [--tp N [--tp-plan JSON]] [--ep N]   (under hubrt launch -n N: rank 0 serves)\n"
    "                   [--prefill-chunk N] [--queue N] [--max-body BYTES] [--grace S] [--no-prefix-reuse]\n"
    "                   [--compile | --deterministic] [--dtype D] [--device cpu] [--revision R]\n"
    "                   [--experts grouped|eager] [--dequantize | --quantize q8_0|q4_0|q4_1|q5_0|q5_1|mxfp4|q4_k|q5_k|q6_k]\n"
    "  /v1/chat/completions, /v1/completions (streaming with server-sent events), /v1/models,\n"
    "  /health, /metrics (Prometheus) and a chat page at /. Requests join the running batch of\n"
    "  --slots rows (default 8) at each step; --ctx tokens per row (prompt and answer; default the\n"
    "  model's, at most 4096). --port (default 8080; 0 picks a free port) is printed on stderr when listening.\n"
    "  On SIGTERM: new requests get 503, running answers get --grace seconds (default 10) to end.\n"
    "  --deterministic: each request's logits bitwise what it gets alone, whatever else runs (slower).\n";

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

typedef struct serve_args {
    const char *model, *revision;
    hr_model_options opts;
    hr_serve_options so;
} serve_args;

static int parse(int argc, char **argv, serve_args *a) {
    memset(a, 0, sizeof *a);
    a->so.port = 8080;
    a->so.grace_s = 10;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int tp = hr_cli_tp_flag("serve", f, v, &a->opts);
        if (tp < 0) return HR_EXIT_USAGE;
        if (tp) {
            i++;
            continue;
        }
        bool flag_only = !strcmp(f, "--compile") || !strcmp(f, "--no-prefix-reuse") || !strcmp(f, "--deterministic") ||
                         !strcmp(f, "--dequantize");
        if (f[0] == '-' && !flag_only && !v) {
            fprintf(stderr, "hubrt serve: %s needs a value\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
        double num = 0;
        bool numeric = !strcmp(f, "--port") || !strcmp(f, "--slots") || !strcmp(f, "--ctx") ||
                       !strcmp(f, "--prefill-chunk") || !strcmp(f, "--queue") || !strcmp(f, "--max-body") ||
                       !strcmp(f, "--grace");
        if (numeric) {
            if (!hr_cli_number("serve", f, argv[++i], &num)) return HR_EXIT_USAGE;
            bool ok = !strcmp(f, "--port") ? num >= 0 && num <= 65535
                    : !strcmp(f, "--grace") ? num >= 0 && num <= 3600
                    : num >= 1 && num <= 1e12;
            if (!ok || (strcmp(f, "--grace") && num != (double)(int64_t)num)) {
                fprintf(stderr, "hubrt serve: %s %s is out of range\n", f, argv[i]);
                return HR_EXIT_USAGE;
            }
            if (!strcmp(f, "--port")) a->so.port = (int)num;
            else if (!strcmp(f, "--slots")) a->so.engine.slots = (int64_t)num;
            else if (!strcmp(f, "--ctx")) a->so.engine.capacity = (int64_t)num;
            else if (!strcmp(f, "--prefill-chunk")) a->so.engine.prefill_chunk = (int64_t)num;
            else if (!strcmp(f, "--queue")) a->so.engine.max_queue = (int64_t)num;
            else if (!strcmp(f, "--max-body")) a->so.max_body = (size_t)num;
            else a->so.grace_s = num;
        } else if (!strcmp(f, "--compile")) a->so.engine.compile = true;
        else if (!strcmp(f, "--no-prefix-reuse")) a->so.engine.no_prefix_reuse = true;
        else if (!strcmp(f, "--deterministic")) a->so.engine.deterministic = true;
        else if (!strcmp(f, "--host")) a->so.host = argv[++i];
        else if (!strcmp(f, "--model-name")) a->so.model_name = argv[++i];
        else if (!strcmp(f, "--revision")) a->revision = argv[++i];
        else if (!strcmp(f, "--dtype")) a->opts.dtype = argv[++i];
        else if (!strcmp(f, "--device")) a->opts.device = argv[++i];
        else if (!strcmp(f, "--experts")) a->opts.experts_implementation = argv[++i];
        else if (!strcmp(f, "--dequantize")) a->opts.dequantize = true;
        else if (!strcmp(f, "--quantize")) a->opts.quantize = argv[++i];
        else if (f[0] != '-' && !a->model) a->model = f;
        else {
            fprintf(stderr, "hubrt serve: unknown argument '%s'\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
    }
    if (!a->model) {
        fprintf(stderr, "%s", usage_text);
        return HR_EXIT_USAGE;
    }
    if (!a->so.model_name) a->so.model_name = a->model;
    return HR_EXIT_OK;
}

int hr_cmd_serve(int argc, char **argv) {
    serve_args a;
    int rc = parse(argc, argv, &a);
    if (rc != HR_EXIT_OK) return rc;
    char *dir = NULL;
    hr_tokenizer *tok = NULL;
    hr_model *model = NULL;
    hr_status st = hr_cli_model_dir(a.model, a.revision, &dir);
    if (st == HR_OK) st = hr_tokenizer_load(dir, &tok);
    if (st == HR_OK) st = hr_model_load(dir, &a.opts, &model);
    if (st == HR_OK && hr_model_group_size(model) > 1 && hr_dist_rank() > 0) {
        /* a split model's other ranks make rank 0's engine calls; rank 0
         * serves, and its shutdown (mpirun hands SIGTERM to every rank) ends
         * theirs: they return when its engine stops */
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        st = hr_engine_follow(model, &a.so.engine);
    } else if (st == HR_OK) {
        struct sigaction sa = {.sa_handler = on_signal};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        signal(SIGPIPE, SIG_IGN); /* a client that left: its write fails, the server goes on */
        st = hr_serve_run(model, tok, &a.so, &g_stop);
    }
    if (st != HR_OK) rc = hr_cli_fail("serve", st);
    hr_model_free(model);
    hr_tokenizer_free(tok);
    free(dir);
    return rc;
}
