/* `hubrt quantize MODEL OUT.gguf [--type T]`: a model folder (or Hub id)
 * written as a GGUF file that llama.cpp loads, its matrices quantized
 * (hr_model_export_gguf). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"

static int usage(void) {
    fprintf(stderr,
            "usage: hubrt quantize MODEL OUT.gguf [--type T] [--revision R]\n"
            "  MODEL: a model folder (safetensors: Llama, Mistral, Qwen2, Qwen3) or a Hub id\n"
            "  --type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|mxfp4|q4_k|q5_k|q6_k (default q8_0): the matrices'\n"
            "         type, quantized as llama.cpp's reference quantizer does (without an importance\n"
            "         matrix; every matrix alike, llama-quantize --pure); norms and biases stay f32\n");
    return HR_EXIT_USAGE;
}

int hr_cmd_quantize(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *type = "q8_0", *revision = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return HR_EXIT_OK;
        }
        if (!strcmp(argv[i], "--type") || !strcmp(argv[i], "--revision")) {
            if (i + 1 >= argc) return usage();
            *(!strcmp(argv[i], "--type") ? &type : &revision) = argv[i + 1];
            i++;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "hubrt quantize: unknown option %s\n", argv[i]);
            return usage();
        } else if (!model) model = argv[i];
        else if (!out) out = argv[i];
        else return usage();
    }
    if (!model || !out) return usage();
    char *dir = NULL;
    hr_status s = hr_cli_model_dir(model, revision, &dir);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (s == HR_OK) s = hr_model_export_gguf(dir, out, type);
    free(dir);
    if (s != HR_OK) return hr_cli_fail("quantize", s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "hubrt quantize: wrote %s (%s) in %.1f s, peak RSS %.0f MB\n", out, type,
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), (double)ru.ru_maxrss / 1024.0);
    return HR_EXIT_OK;
}
