/* hubrt: command-line entry point; each subcommand lives in its own file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"info", hr_cmd_info, "devices and CPU features (--json for one JSON object)"},
    {"inspect", hr_cmd_inspect, "tensors of a safetensors file or model folder"},
    {"run", hr_cmd_run, "generate text from a model folder (streams to stdout)"},
    {"chat", hr_cmd_chat, "chat in the terminal with the model's chat template (/reset, /system, /quit)"},
    {"serve", hr_cmd_serve, "OpenAI-compatible server with continuous batching and a chat page"},
    {"quantize", hr_cmd_quantize, "a model folder -> a GGUF file llama.cpp loads (--type q4_k, q8_0, ...)"},
    {"bench", hr_cmd_bench, "time load, prefill and decode (last line: JSON)"},
    {"text-to-image", hr_cmd_text_to_image, "a Stable Diffusion 3 folder, a prompt -> a PNG (text-to-image --help)"},
    {"kernels", hr_cmd_kernels, "kernel hub: list the cache's kernels, verify one, lock one (kernels --help)"},
    {"launch", hr_cmd_launch, "run a command as N MPI ranks (-n N, for --tp) or once per TPU chip (--nproc)"},
    {"tokenize", hr_cmd_tokenize, "JSON strings per line on stdin -> JSON id arrays (--add-special-tokens)"},
    {"detokenize", hr_cmd_detokenize, "JSON id arrays per line on stdin -> JSON strings (--skip-special-tokens)"},
};

int hr_cli_fail(const char *cmd, hr_status s) {
    int code = HR_EXIT_FAIL;
    switch (s) {
    case HR_ERR_INVALID_ARG: case HR_ERR_SHAPE: case HR_ERR_DTYPE: case HR_ERR_FORMAT:
    case HR_ERR_NOT_FOUND: case HR_ERR_UNSUPPORTED: case HR_ERR_IO: case HR_ERR_PERMISSION:
        code = HR_EXIT_USAGE;
        break;
    default:
        break;
    }
    const char *msg = hr_last_error()[0] ? hr_last_error() : hr_status_name(s);
    if (hr_dist_size() > 1) {
        /* one rank failing ends them all: the others would wait on it */
        char why[1200];
        snprintf(why, sizeof why, "hubrt %s: %s", cmd, msg);
        hr_dist_abort(code, why);
    }
    fprintf(stderr, "hubrt %s: %s\n", cmd, msg);
    return code;
}

int hr_cli_tp_flag(const char *cmd, const char *flag, const char *value, hr_model_options *o) {
    if (strcmp(flag, "--tp") && strcmp(flag, "--tp-plan") && strcmp(flag, "--ep")) return 0;
    if (!value) {
        fprintf(stderr, "hubrt %s: %s needs a value\n", cmd, flag);
        return -1;
    }
    if (!strcmp(flag, "--tp-plan")) {
        o->tp_plan = value;
        return 1;
    }
    double n = 0;
    if (!hr_cli_number(cmd, flag, value, &n)) return -1;
    if (n < 1 || n > 4096 || n != (double)(int64_t)n) {
        fprintf(stderr, "hubrt %s: %s must be a whole number of ranks in 1..4096, got '%s'\n", cmd, flag, value);
        return -1;
    }
    *(!strcmp(flag, "--ep") ? &o->ep_size : &o->tp_size) = (int64_t)n;
    return 1;
}

void hr_cli_tp_quiet(void) {
    if (hr_dist_rank() == 0) return;
    fflush(stdout);
    if (!freopen("/dev/null", "w", stdout)) fprintf(stderr, "hubrt: rank %d: cannot silence stdout\n", hr_dist_rank());
}

hr_status hr_cli_model_dir(const char *ref, const char *revision, char **dir) {
    hr_hub_options o = {.revision = revision, .offline = -1, .progress = -1};
    return hr_hub_model_dir(ref, &o, dir);
}

void hr_cli_print_compile_stats(void) {
    hr_compile_stats st;
    hr_compile_stats_get(&st);
    fprintf(stderr,
            "compile cache: %lld requests, %lld hits in memory, %lld from disk, %lld compiled (%.1f ms), "
            "%lld disk entries rejected\n",
            (long long)st.requests, (long long)st.hits, (long long)st.disk_hits, (long long)st.compiles,
            st.compile_ms, (long long)st.disk_rejects);
}

static void usage(FILE *f) {
    fprintf(f, "usage: hubrt <command> [args]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nhubrt %s\n", hr_version());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return HR_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return HR_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("hubrt %s\n", hr_version());
        return HR_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "hubrt: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return HR_EXIT_USAGE;
}
