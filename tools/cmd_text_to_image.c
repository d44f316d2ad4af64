/* hubrt text-to-image: a Stable Diffusion 3 folder, a prompt, a PNG. */
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core/error.h"

static const char *usage_text =
    "usage: hubrt text-to-image DIR -p PROMPT [--negative-prompt TEXT] [--steps N] [--guidance G]\n"
    "                           [--size WxH] [--seed S] [--no-t5] [--max-sequence-length N]\n"
    "                           [--dtype D] [--device cpu] [--no-compile] -o OUT.png\n"
    "  DIR is a diffusers StableDiffusion3Pipeline folder (model_index.json, scheduler/, transformer/,\n"
    "  vae/, tokenizer*/ and text_encoder*/; text_encoder_3 may be absent) or its Hub id. Defaults:\n"
    "  28 steps, guidance 7, the transformer's sample size, seed 0 (the latents diffusers draws with\n"
    "  torch.Generator(\"cpu\").manual_seed(seed)). --no-t5 puts zeros in T5's place without loading\n"
    "  it. The transformer is compiled once for the size unless --no-compile.\n";

typedef struct progress {
    bool tty;
    struct timespec start;
} progress;

static double seconds_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* A bar over the denoising steps on a terminal; nothing otherwise. */
static void on_step(void *ctx, int64_t step, int64_t steps) {
    progress *p = ctx;
    if (!p->tty) return;
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int64_t filled = steps ? step * WIDTH / steps : WIDTH;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    double t = seconds_since(&p->start);
    fprintf(stderr, "\r[%s] %lld/%lld steps  %.2f s/step", bar, (long long)step, (long long)steps, t / (double)step);
    if (step == steps) fputc('\n', stderr);
    fflush(stderr);
}

/* image [1, 3, h, w] f32 in [0, 1] -> an 8-bit RGB PNG at path, written to
 * a temporary name and renamed, so a failure leaves no half-written file. */
static hr_status write_png(const hr_tensor *image, const char *path) {
    const int64_t *sh = hr_tensor_shape(image);
    int64_t h = sh[2], w = sh[3], n = 3 * h * w;
    float *px = malloc((size_t)n * sizeof *px);
    unsigned char *rgb = malloc((size_t)n);
    png_bytep *rows = malloc((size_t)h * sizeof *rows);
    char tmp[4200];
    hr_status s = px && rgb && rows ? HR_OK : hr_error(HR_ERR_OOM, "%s: image buffers", path);
    if (s == HR_OK && snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid()) >= (int)sizeof tmp)
        s = hr_error(HR_ERR_INVALID_ARG, "%s: path too long", path);
    if (s == HR_OK) s = hr_tensor_read(image, px, (size_t)n * sizeof *px);
    for (int64_t y = 0; s == HR_OK && y < h; y++) { /* channels first -> interleaved, rounded as PIL's */
        for (int64_t x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                float v = px[(c * h + y) * w + x] * 255.0f;
                rgb[(y * w + x) * 3 + c] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : (int)(v + 0.5f));
            }
        rows[y] = rgb + y * w * 3;
    }
    FILE *f = NULL;
    png_structp png = NULL;
    png_infop info = NULL;
    if (s == HR_OK && !(f = fopen(tmp, "wb"))) s = hr_error(HR_ERR_IO, "%s: cannot write", path);
    if (s == HR_OK) {
        png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
        info = png ? png_create_info_struct(png) : NULL;
        if (!png || !info) s = hr_error(HR_ERR_OOM, "%s: libpng", path);
    }
    if (s == HR_OK) {
        if (setjmp(png_jmpbuf(png))) {
            s = hr_error(HR_ERR_IO, "%s: libpng failed writing the image", path);
        } else {
            png_init_io(png, f);
            png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                         PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
            png_write_info(png, info);
            png_write_image(png, rows);
            png_write_end(png, NULL);
        }
    }
    if (png) png_destroy_write_struct(&png, &info);
    if (f && fclose(f) != 0 && s == HR_OK) s = hr_error(HR_ERR_IO, "%s: write failed", path);
    if (s == HR_OK && rename(tmp, path) != 0) s = hr_error(HR_ERR_IO, "%s: cannot rename the written image", path);
    if (s != HR_OK && f) remove(tmp);
    free(px);
    free(rgb);
    free(rows);
    return s;
}

static bool parse_size(const char *v, int64_t *w, int64_t *h) {
    char *end = NULL;
    long long a = strtoll(v, &end, 10);
    if (!end || (*end != 'x' && *end != 'X')) return false;
    long long b = strtoll(end + 1, &end, 10);
    if (!end || *end || a < 1 || b < 1 || a > 16384 || b > 16384) return false;
    *w = a, *h = b;
    return true;
}

int hr_cmd_text_to_image(int argc, char **argv) {
    const char *ref = NULL, *out = NULL;
    hr_component_options opts = {.compile = true};
    hr_sd3_call call = {.steps = 28, .guidance_scale = 7.0, .mu = NAN};
    double num = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool flag_only = !strcmp(f, "--no-t5") || !strcmp(f, "--no-compile") || !strcmp(f, "-h") || !strcmp(f, "--help");
        if (f[0] == '-' && !flag_only && !v) {
            fprintf(stderr, "hubrt text-to-image: %s needs a value\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(usage_text, stdout);
            return HR_EXIT_OK;
        } else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) {
            call.prompt = argv[++i];
        } else if (!strcmp(f, "--negative-prompt")) {
            call.negative_prompt = argv[++i];
        } else if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            out = argv[++i];
        } else if (!strcmp(f, "--steps") || !strcmp(f, "--seed") || !strcmp(f, "--max-sequence-length")) {
            if (!hr_cli_number("text-to-image", f, v, &num)) return HR_EXIT_USAGE;
            if (num < 0 || num != (double)(int64_t)num) {
                fprintf(stderr, "hubrt text-to-image: %s expects a whole number >= 0, got '%s'\n", f, v);
                return HR_EXIT_USAGE;
            }
            if (!strcmp(f, "--steps")) call.steps = (int64_t)num;
            else if (!strcmp(f, "--seed")) call.seed = (uint64_t)num;
            else call.max_sequence_length = (int64_t)num;
            i++;
        } else if (!strcmp(f, "--guidance")) {
            if (!hr_cli_number("text-to-image", f, v, &call.guidance_scale)) return HR_EXIT_USAGE;
            i++;
        } else if (!strcmp(f, "--size")) {
            if (!parse_size(v, &call.width, &call.height)) {
                fprintf(stderr, "hubrt text-to-image: --size expects WxH (e.g. 512x512), got '%s'\n", v);
                return HR_EXIT_USAGE;
            }
            i++;
        } else if (!strcmp(f, "--no-t5")) {
            call.skip_t5 = true;
        } else if (!strcmp(f, "--no-compile")) {
            opts.compile = false;
        } else if (!strcmp(f, "--dtype")) {
            opts.dtype = argv[++i];
        } else if (!strcmp(f, "--device")) {
            opts.device = argv[++i];
        } else if (f[0] != '-' && !ref) {
            ref = f;
        } else {
            fprintf(stderr, "hubrt text-to-image: unknown argument '%s'\n%s", f, usage_text);
            return HR_EXIT_USAGE;
        }
    }
    if (!ref || !call.prompt || !out) {
        fprintf(stderr, "hubrt text-to-image: DIR, -p PROMPT and -o OUT.png are required\n%s", usage_text);
        return HR_EXIT_USAGE;
    }
    if (call.steps < 1) {
        fprintf(stderr, "hubrt text-to-image: --steps must be >= 1\n");
        return HR_EXIT_USAGE;
    }
    char *dir = NULL;
    hr_status s = hr_cli_model_dir(ref, NULL, &dir);
    if (s != HR_OK) return hr_cli_fail("text-to-image", s);
    hr_sd3_pipeline *p = NULL;
    s = hr_sd3_pipeline_load(dir, &opts, &p);
    free(dir);
    if (s != HR_OK) return hr_cli_fail("text-to-image", s);
    progress prog = {.tty = isatty(2)};
    clock_gettime(CLOCK_MONOTONIC, &prog.start);
    call.progress = on_step;
    call.progress_ctx = &prog;
    hr_tensor *image = NULL;
    s = hr_sd3_pipeline_run(p, &call, &image);
    double secs = seconds_since(&prog.start);
    if (s == HR_OK) s = write_png(image, out);
    if (s == HR_OK)
        fprintf(stderr, "wrote %s (%lldx%lld, %lld steps, %.1f s)\n", out, (long long)hr_tensor_shape(image)[3],
                (long long)hr_tensor_shape(image)[2], (long long)call.steps, secs);
    hr_tensor_free(image);
    hr_sd3_pipeline_free(p);
    return s == HR_OK ? HR_EXIT_OK : hr_cli_fail("text-to-image", s);
}
