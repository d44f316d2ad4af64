/* hubrt run MODEL_DIR -p PROMPT: generate text, streamed to stdout through
 * the incremental detokenizer, then one stats line on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_STOPS 8

static const char *usage_text =
    "usage: hubrt run MODEL -p PROMPT [-n N] [--greedy | --temp T --top-p P --top-k K --min-p P --seed S]\n"
    "                 [--repetition-penalty R] [--stop TEXT]... [--dtype D] [--device cpu] [--compile] [--stats]\n"
    "                 [--experts grouped|eager] [--dequantize | --quantize q8_0|q4_0|q4_1|q5_0|q5_1|mxfp4|q4_k|q5_k|q6_k]\n"
    "                 [--tp N [--tp-plan JSON]] [--ep N]\n"
    "  Sampling defaults come from the model's generation_config.json; --temp/--top-p/--top-k/--min-p\n"
    "  turn sampling on, --greedy turns it off. -n defaults to 128 new tokens.\n"
    "  --compile runs the compiled forward (plans cached in memory and on disk); --stats prints the\n"
    "  compile-cache statistics to stderr before the final line.\n"
    "  --experts: a mixture-of-experts model's experts implementation (default grouped; eager is\n"
    "  transformers' per-expert loop).\n"
    "  --dequantize: a GGUF file's block-quantized weights (Q4_1, Q8_0, Q4_K, ...) are cast to the\n"
    "  dtype at load; by default they stay in their blocks on the CPU. --quantize: a float checkpoint's\n"
    "  linear and embedding matrices quantized into that block type while loading.\n"
    "  --tp N: the model split over N ranks, one process each (hubrt launch -n N -- hubrt run ...);\n"
    "  --tp-plan: transformers' tp_plan entries laid over the model's, as a JSON object.\n"
    "  --ep N: a mixture-of-experts model's experts split over the N ranks.\n"
    "  MODEL is a folder, a GGUF file or a Hub repository id (org/name, --revision R), read from\n"
    "  the Hugging Face cache and fetched into it when missing (HF_HUB_OFFLINE=1: the cache only).\n";

typedef struct run_ctx {
    hr_detokenizer *detok;
    hr_status err;
} run_ctx;

const char *hr_cli_token_text(hr_detokenizer *d, hr_status *err, int64_t token, size_t *len) {
    const char *text = NULL;
    *len = 0;
    hr_status s = hr_detokenizer_push(d, (int32_t)token, &text, len);
    if (s != HR_OK) {
        *err = s;
        return NULL;
    }
    return text;
}

static const char *token_text(void *ctx, int64_t row, int64_t token, size_t *len) {
    run_ctx *rc = ctx;
    return hr_cli_token_text(rc->detok, &rc->err, token, len);
}

static bool on_token(void *ctx, int64_t row, int64_t token, const char *text, size_t len) {
    run_ctx *rc = ctx;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return rc->err == HR_OK;
}

/* Parses a number argument; false (with a message) on junk. */
bool hr_cli_number(const char *cmd, const char *flag, const char *text, double *out) {
    char *end = NULL;
    *out = strtod(text, &end);
    if (!end || *end || end == text) {
        fprintf(stderr, "hubrt %s: %s expects a number, got '%s'\n", cmd, flag, text);
        return false;
    }
    return true;
}

typedef struct run_args {
    const char *dir, *prompt, *revision;
    hr_model_options opts;
    int64_t n;
    bool greedy, sample, compile, stats;
    double temp, top_p, top_k, min_p, rep, seed;
    bool has_temp, has_top_p, has_top_k, has_min_p, has_rep, has_seed;
    const char *stops[MAX_STOPS];
    int n_stops;
} run_args;

static int parse(int argc, char **argv, run_args *a) {
    memset(a, 0, sizeof *a);
    a->n = 128;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double num = 0;
        bool takes = strcmp(f, "--greedy") && strcmp(f, "--compile") && strcmp(f, "--stats") &&
                     strcmp(f, "--dequantize") && f[0] == '-';
        if (takes && !v) {
            fprintf(stderr, "hubrt run: %s needs a value\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
#define NUM_(flag, field, has)                                                      \
    if (!strcmp(f, flag)) {                                                         \
        if (!hr_cli_number("run", flag, v, &num)) return HR_EXIT_USAGE;             \
        a->field = num;                                                             \
        a->has = true;                                                              \
        i++;                                                                        \
        continue;                                                                   \
    }
        NUM_("--temp", temp, has_temp)
        NUM_("--top-p", top_p, has_top_p)
        NUM_("--top-k", top_k, has_top_k)
        NUM_("--min-p", min_p, has_min_p)
        NUM_("--seed", seed, has_seed)
        NUM_("--repetition-penalty", rep, has_rep)
#undef NUM_
        int tp = hr_cli_tp_flag("run", f, v, &a->opts);
        if (tp < 0) return HR_EXIT_USAGE;
        if (tp) {
            i++;
            continue;
        }
        if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) {
            a->prompt = argv[++i];
        } else if (!strcmp(f, "-n")) {
            if (!hr_cli_number("run", "-n", v, &num)) return HR_EXIT_USAGE;
            a->n = (int64_t)num;
            i++;
        } else if (!strcmp(f, "--greedy")) {
            a->greedy = true;
        } else if (!strcmp(f, "--compile")) {
            a->compile = true;
        } else if (!strcmp(f, "--stats")) {
            a->stats = true;
        } else if (!strcmp(f, "--stop")) {
            if (a->n_stops == MAX_STOPS) {
                fprintf(stderr, "hubrt run: at most %d --stop strings\n", MAX_STOPS);
                return HR_EXIT_USAGE;
            }
            a->stops[a->n_stops++] = argv[++i];
        } else if (!strcmp(f, "--dtype")) {
            a->opts.dtype = argv[++i];
        } else if (!strcmp(f, "--device")) {
            a->opts.device = argv[++i];
        } else if (!strcmp(f, "--experts")) {
            a->opts.experts_implementation = argv[++i];
        } else if (!strcmp(f, "--dequantize")) {
            a->opts.dequantize = true;
        } else if (!strcmp(f, "--quantize")) {
            a->opts.quantize = argv[++i];
        } else if (!strcmp(f, "--revision")) {
            a->revision = argv[++i];
        } else if (f[0] != '-' && !a->dir) {
            a->dir = f;
        } else {
            fprintf(stderr, "hubrt run: unknown argument '%s'\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
    }
    if (!a->dir || !a->prompt) {
        fprintf(stderr, "%s", usage_text);
        return HR_EXIT_USAGE;
    }
    a->sample = a->has_temp || a->has_top_p || a->has_top_k || a->has_min_p;
    if (a->greedy && a->sample) {
        fprintf(stderr, "hubrt run: --greedy cannot be combined with sampling options\n");
        return HR_EXIT_USAGE;
    }
    return HR_EXIT_OK;
}

static void apply_sampling(const run_args *a, const hr_generation_config *gc, hr_generate_config *cfg) {
    cfg->max_new_tokens = a->n;
    cfg->do_sample = a->greedy ? false : a->sample ? true : gc->do_sample;
    cfg->temperature = a->has_temp ? a->temp : gc->temperature;
    cfg->top_p = a->has_top_p ? a->top_p : gc->top_p;
    cfg->top_k = a->has_top_k ? (int64_t)a->top_k : gc->top_k;
    cfg->min_p = a->has_min_p ? a->min_p : gc->min_p;
    cfg->repetition_penalty = a->has_rep ? a->rep : gc->repetition_penalty;
    cfg->seed = a->has_seed ? (uint64_t)a->seed : 0;
    cfg->stop_strings = a->stops;
    cfg->n_stop_strings = a->n_stops;
    cfg->compile = a->compile;
}

int hr_cmd_run(int argc, char **argv) {
    run_args a;
    int rc = parse(argc, argv, &a);
    if (rc != HR_EXIT_OK) return rc;
    hr_tokenizer *tok = NULL;
    hr_model *model = NULL;
    run_ctx ctx = {0};
    int32_t *ids32 = NULL;
    int64_t *ids = NULL, *out = NULL;
    size_t n_ids = 0;
    hr_generate_stats stats = {0};
    char *dir = NULL;
    hr_status s = hr_cli_model_dir(a.dir, a.revision, &dir);
    if (s == HR_OK) s = hr_tokenizer_load(dir, &tok); /* a GGUF file's too */
    if (s == HR_OK) s = hr_model_load(dir, &a.opts, &model);
    if (s == HR_OK) hr_cli_tp_quiet();
    if (s == HR_OK) s = hr_tokenizer_encode(tok, a.prompt, strlen(a.prompt), true, &ids32, &n_ids);
    if (s == HR_OK && n_ids == 0) {
        fprintf(stderr, "hubrt run: the prompt encodes to no tokens\n");
        rc = HR_EXIT_USAGE;
        goto done;
    }
    if (s == HR_OK) s = hr_detokenizer_init(tok, true, &ctx.detok);
    if (s == HR_OK) {
        ids = malloc(sizeof(int64_t) * n_ids);
        out = malloc(sizeof(int64_t) * (n_ids + (size_t)(a.n > 0 ? a.n : 0)));
        if (!ids || !out) {
            fprintf(stderr, "hubrt run: out of memory\n");
            rc = HR_EXIT_FAIL;
            goto done;
        }
        for (size_t i = 0; i < n_ids; i++) ids[i] = ids32[i];
        hr_generate_config cfg;
        hr_generate_config_init(&cfg);
        apply_sampling(&a, hr_model_generation_config(model), &cfg);
        cfg.token_text = token_text;
        cfg.on_token = on_token;
        cfg.ctx = &ctx;
        int64_t out_len = 0;
        s = hr_generate(model, ids, NULL, 1, (int64_t)n_ids, &cfg, out, &out_len, &stats);
        if (s == HR_OK) s = ctx.err;
    }
    if (s == HR_OK) {
        const char *rest = NULL;
        size_t len = 0;
        s = hr_detokenizer_flush(ctx.detok, &rest, &len);
        if (s == HR_OK) fwrite(rest, 1, len, stdout);
        printf("\n");
        fflush(stdout);
        if (a.stats) hr_cli_print_compile_stats();
        if (hr_dist_rank() > 0) goto done; /* rank 0 reports */
        double decode = stats.new_tokens > 1 && stats.decode_s > 0 ? (double)(stats.new_tokens - 1) / stats.decode_s : 0;
        fprintf(stderr,
                "prompt tokens: %lld, generated tokens: %lld, prefill: %.1f tok/s, decode: %.1f tok/s, weights: %s\n",
                (long long)stats.prompt_tokens, (long long)stats.new_tokens,
                stats.prefill_s > 0 ? (double)stats.prompt_tokens / stats.prefill_s : 0, decode,
                hr_model_weight_types(model));
    }
    if (s != HR_OK) rc = hr_cli_fail("run", s);
done:
    free(ids);
    free(out);
    hr_tokenizer_free_array(ids32);
    hr_detokenizer_free(ctx.detok);
    hr_model_free(model);
    hr_tokenizer_free(tok);
    free(dir);
    return rc;
}
