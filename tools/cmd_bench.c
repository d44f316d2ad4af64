/* hubrt bench MODEL_DIR: load time, then one timed greedy generation over a
 * fixed pseudo-random prompt; the last stdout line is one JSON object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"

static const char *usage_text =
    "usage: hubrt bench MODEL_DIR [--prompt-len P] [--gen G] [--batch B] [--dtype D] [--device D]\n"
    "                   [--compile] [--stats] [--experts grouped|eager] [--dequantize | --quantize T]\n"
    "  defaults: --prompt-len 128 --gen 64 --batch 1, dtype from config.json, device cpu, eager\n"
    "  --dequantize: a GGUF file's block-quantized weights cast to the dtype at load (default: kept)\n"
    "  --quantize q8_0|q4_0|q4_1|q5_0|q5_1|mxfp4|q4_k|q5_k|q6_k: float linear and embedding matrices quantized at load\n"
    "  --compile: compiled forward (static shapes, plans cached in memory and on disk)\n"
    "  --stats: print the compile-cache statistics to stderr\n"
    "  --tp N [--tp-plan JSON]: split over N ranks (hubrt launch -n N -- hubrt bench ...); each rank\n"
    "  prints its own JSON line, with \"tp\" and \"rank\"\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

/* Ends each row at its `left`-th new token (the rows all count alike). */
typedef struct {
    int64_t left;
} stop_after;

static bool count_token(void *ctx, int64_t row, int64_t token, const char *text, size_t len) {
    (void)token, (void)text, (void)len;
    stop_after *s = ctx;
    if (row == 0) s->left--;
    return s->left > 0;
}

/* Greedy generation of `gen` tokens for `batch` prompts of `plen` ids,
 * eos ignored so every run does the same work; with `stop` > 0 every row
 * ends at its stop-th new token (the cache is still sized for `gen`). */
static hr_status timed_generate(hr_model *m, int64_t batch, int64_t plen, int64_t gen, bool compile, int64_t stop,
                                hr_generate_stats *stats) {
    int64_t vocab = hr_model_vocab_size(m);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(batch * plen));
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(batch * (plen + gen)));
    if (!ids || !out) {
        free(ids);
        free(out);
        fprintf(stderr, "hubrt bench: out of memory\n");
        return HR_ERR_OOM;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < batch * plen; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int64_t)(x % (uint64_t)vocab);
    }
    hr_generate_config cfg;
    hr_generate_config_init(&cfg);
    static const int64_t no_eos[1] = {-1};
    cfg.max_new_tokens = gen;
    cfg.eos_ids = no_eos;
    cfg.n_eos = 0;
    cfg.compile = compile;
    stop_after left = {stop};
    if (stop > 0) cfg.on_token = count_token, cfg.ctx = &left;
    int64_t out_len = 0;
    hr_status s = hr_generate(m, ids, NULL, batch, plen, &cfg, out, &out_len, stats);
    free(ids);
    free(out);
    return s;
}

int hr_cmd_bench(int argc, char **argv) {
    const char *dir = NULL;
    hr_model_options opts = {0};
    int64_t plen = 128, gen = 64, batch = 1;
    bool compile = false, stats = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        double num = 0;
        if (f[0] != '-' && !dir) {
            dir = f;
            continue;
        }
        if (!strcmp(f, "--compile") || !strcmp(f, "--stats")) {
            *(!strcmp(f, "--compile") ? &compile : &stats) = true;
            continue;
        }
        if (!strcmp(f, "--dequantize")) {
            opts.dequantize = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "hubrt bench: %s needs a value\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
        const char *v = argv[++i];
        int tp = hr_cli_tp_flag("bench", f, v, &opts);
        if (tp < 0) return HR_EXIT_USAGE;
        if (tp) continue;
        if (!strcmp(f, "--dtype")) {
            opts.dtype = v;
        } else if (!strcmp(f, "--device")) {
            opts.device = v;
        } else if (!strcmp(f, "--experts")) {
            opts.experts_implementation = v;
        } else if (!strcmp(f, "--quantize")) {
            opts.quantize = v;
        } else if (!strcmp(f, "--prompt-len") || !strcmp(f, "--gen") || !strcmp(f, "--batch")) {
            if (!hr_cli_number("bench", f, v, &num)) return HR_EXIT_USAGE;
            if (num < 1 || num > 1e7) {
                fprintf(stderr, "hubrt bench: %s must be >= 1\n", f);
                return HR_EXIT_USAGE;
            }
            *(!strcmp(f, "--gen") ? &gen : !strcmp(f, "--batch") ? &batch : &plen) = (int64_t)num;
        } else {
            fprintf(stderr, "hubrt bench: unknown argument '%s'\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
    }
    if (!dir) {
        fprintf(stderr, "%s", usage_text);
        return HR_EXIT_USAGE;
    }
    hr_model *m = NULL;
    char *local = NULL;
    hr_status s = hr_cli_model_dir(dir, NULL, &local);
    if (s != HR_OK) return hr_cli_fail("bench", s);
    double t0 = now_s();
    s = hr_model_load(local, &opts, &m);
    free(local);
    double load_s = now_s() - t0;
    hr_generate_stats warm = {0}, st = {0};
    /* A short warm-up run starts the thread pool and faults in the weights.
     * Compiled, it runs the measured shapes (prefill and two new tokens
     * into a cache of the same size), so the figures are the plans'
     * replays, as a served model runs them; compile_ms says what compiling
     * cost. */
    if (s == HR_OK) s = compile ? timed_generate(m, batch, plen, gen, true, 2, &warm)
                                : timed_generate(m, 1, 4, 2, false, 0, &warm);
    hr_compile_stats before;
    hr_compile_stats_get(&before);
    if (s == HR_OK) s = timed_generate(m, batch, plen, gen, compile, 0, &st);
    if (s != HR_OK) {
        int rc = hr_cli_fail("bench", s);
        hr_model_free(m);
        return rc;
    }
    double prefill = st.prefill_s > 0 ? (double)(batch * plen) / st.prefill_s : 0;
    double decode = st.new_tokens > 1 && st.decode_s > 0 ? (double)(batch * (st.new_tokens - 1)) / st.decode_s : 0;
    fprintf(stderr, "%s (%s, %s): load %.2f s, prefill %.1f tok/s, decode %.1f tok/s, batch %lld, threads %d\n",
            dir, hr_model_arch(m), hr_dtype_name(hr_model_dtype(m)), load_s, prefill, decode, (long long)batch,
            hr_num_threads());
    if (stats) hr_cli_print_compile_stats();
    /* every rank of a split model reports: its memory is its own */
    if (hr_dist_size() > 1) printf("{\"tp\":%d,\"rank\":%d,", hr_dist_size(), hr_dist_rank());
    else printf("{");
    printf("\"arch\":\"%s\",\"dtype\":\"%s\",\"weights\":\"%s\",\"threads\":%d,\"batch\":%lld,\"prompt_len\":%lld,"
           "\"gen\":%lld,\"load_s\":%.4f,\"prefill_s\":%.4f,\"decode_s\":%.4f,\"prefill_tok_s\":%.2f,"
           "\"decode_tok_s\":%.2f,\"prefill_cpu_s\":%.4f,\"decode_cpu_s\":%.4f,\"peak_rss_mb\":%.1f",
           hr_model_arch(m), hr_dtype_name(hr_model_dtype(m)), hr_model_weight_types(m), hr_num_threads(), (long long)batch,
           (long long)plen, (long long)gen, load_s, st.prefill_s, st.decode_s, prefill, decode, st.prefill_cpu_s,
           st.decode_cpu_s, peak_rss_mb());
    if (compile) {
        /* process totals, warm-up included: plans found on disk are hits, not compiles */
        hr_compile_stats cs;
        hr_compile_stats_get(&cs);
        /* timed_misses: plans the timed run did not find in memory */
        long long misses = (long long)(cs.compiles + cs.disk_hits - before.compiles - before.disk_hits);
        printf(",\"compile\":true,\"compiles\":%lld,\"cache_hits\":%lld,\"disk_hits\":%lld,\"compile_ms\":%.1f,"
               "\"timed_misses\":%lld",
               (long long)cs.compiles, (long long)(cs.hits + cs.disk_hits), (long long)cs.disk_hits, cs.compile_ms,
               misses);
    }
    printf("}\n");
    hr_model_free(m);
    return HR_EXIT_OK;
}
