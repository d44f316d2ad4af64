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
    {"bench", hr_cmd_bench, "time load, prefill and decode (last line: JSON)"},
    {"text-to-image", hr_cmd_text_to_image, "a Stable Diffusion 3 folder, a prompt -> a PNG (text-to-image --help)"},
    {"kernels", hr_cmd_kernels, "kernel hub: list the cache's kernels, verify one, lock one (kernels --help)"},
    {"launch", hr_cmd_launch, "run a command once per TPU chip with libtpu's per-process environment"},
    {"tokenize", hr_cmd_tokenize, "JSON strings per line on stdin -> JSON id arrays (--add-special-tokens)"},
    {"detokenize", hr_cmd_detokenize, "JSON id arrays per line on stdin -> JSON strings (--skip-special-tokens)"},
};

int hr_cli_fail(const char *cmd, hr_status s) {
    fprintf(stderr, "hubrt %s: %s\n", cmd, hr_last_error()[0] ? hr_last_error() : hr_status_name(s));
    switch (s) {
    case HR_ERR_INVALID_ARG: case HR_ERR_SHAPE: case HR_ERR_DTYPE: case HR_ERR_FORMAT:
    case HR_ERR_NOT_FOUND: case HR_ERR_UNSUPPORTED: case HR_ERR_IO: case HR_ERR_PERMISSION:
        return HR_EXIT_USAGE;
    default:
        return HR_EXIT_FAIL;
    }
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
