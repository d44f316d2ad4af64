/* Small-op micro-benchmark: bytes/s of the memory- or cache-bound ops of
 * prefill and batched decode (rope, rms_norm, add_rms_norm, silu_mul, the
 * logits' cast) at the Qwen3-0.6B shapes and strides the model runs them
 * with, next to a plain memcpy of the same bytes measured moments apart.
 *
 * Bytes are each operand's bytes read or written once (cos/sin count once,
 * though every head reads them). A sample times --reps calls; samples of
 * the op and of the memcpy (half the bytes read and half written, the
 * faster of the op's thread count and one thread, since starting threads
 * dominates the small copies) alternate, and the best of --samples is
 * reported with the median.
 *
 * --dump DIR writes every case's outputs (after one call on fixed pseudo-
 * random inputs) to DIR/<case>.bin, so two builds' bytes can be compared
 * with cmp.
 *
 * Built by `make` (CMake target bench_smallops in the build folder).
 * Run: B/bench_smallops [--dtype bf16|f16|f32] [--threads T] [--samples S]
 *                       [--reps R] [--only SUBSTR] [--dump DIR] */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "hubrt.h"

#define PROG "bench_smallops"
#define MAX_T 8

/* One op call: its inputs and outputs (views included) and the tensors to
 * free afterwards. */
typedef struct bench_case {
    char name[64];
    hr_op op;
    hr_attrs_norm norm;
    hr_attrs_cast cast;
    const void *attrs;
    const hr_tensor *in[3];
    hr_tensor *out[2];
    int n_in, n_out;
    hr_tensor *owned[MAX_T];
    int n_owned;
    double bytes;
} bench_case;

static uint32_t g_seed = 12345u;

/* Pseudo-random values in [-4, 4) as f32, converted by the library. */
static hr_tensor *rand_tensor(bench_case *c, hr_dtype dt, int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) {
        g_seed = g_seed * 1664525u + 1013904223u;
        v[i] = ((float)(g_seed >> 8) / 16777216.0f - 0.5f) * 8.0f;
    }
    hr_tensor *f, *t;
    bench_check(PROG, hr_tensor_from_host(hr_device_cpu(), HR_F32, nd, shape, v, (size_t)n * 4, &f), "input");
    hr_op cast;
    bench_check(PROG, hr_op_find("cast", &cast), "cast");
    hr_attrs_cast a = {.dtype = dt};
    bench_check(PROG, hr_tensor_empty(hr_device_cpu(), dt, nd, shape, &t), "input");
    bench_check(PROG, hr_op_run(cast, &a, (const hr_tensor *[]){f}, 1, &t, 1), "cast");
    hr_tensor_free(f);
    free(v);
    c->owned[c->n_owned++] = t;
    return t;
}

static hr_tensor *empty_tensor(bench_case *c, hr_dtype dt, int nd, const int64_t *shape) {
    hr_tensor *t;
    bench_check(PROG, hr_tensor_empty(hr_device_cpu(), dt, nd, shape, &t), "output");
    c->owned[c->n_owned++] = t;
    return t;
}

static hr_tensor *keep(bench_case *c, hr_tensor *t) {
    c->owned[c->n_owned++] = t;
    return t;
}

static void set_op(bench_case *c, const char *op) { bench_check(PROG, hr_op_find(op, &c->op), op); }

/* rope on q or k as project_rope runs it: x a [b, n, s, d] view of the
 * projection [b, s, n, d], cos/sin [b, 1, s, d], the output contiguous (q's
 * scratch) or a narrow of a cache of `slots` positions (k). */
static void case_rope(bench_case *c, hr_dtype dt, int64_t b, int64_t s, int64_t n, int64_t d, int64_t slots) {
    snprintf(c->name, sizeof c->name, "rope %s b%lld s%lld h%lld d%lld", slots ? "k->cache" : "q", (long long)b,
             (long long)s, (long long)n, (long long)d);
    set_op(c, "rope");
    hr_tensor *proj = rand_tensor(c, dt, 4, (int64_t[]){b, s, n, d}), *x;
    bench_check(PROG, hr_tensor_transpose(proj, 1, 2, &x), "transpose");
    c->in[0] = keep(c, x);
    c->in[1] = rand_tensor(c, dt, 4, (int64_t[]){b, 1, s, d});
    c->in[2] = rand_tensor(c, dt, 4, (int64_t[]){b, 1, s, d});
    if (slots) {
        hr_tensor *cache = empty_tensor(c, dt, 4, (int64_t[]){b, n, slots, d}), *y;
        bench_check(PROG, hr_tensor_narrow(cache, 2, 0, s, &y), "narrow");
        c->out[0] = keep(c, y);
    } else {
        c->out[0] = empty_tensor(c, dt, 4, (int64_t[]){b, n, s, d});
    }
    c->n_in = 3, c->n_out = 1;
    c->bytes = (double)hr_tensor_nbytes(proj) * 2 + 2.0 * (double)hr_tensor_nbytes(c->in[1]);
}

/* rms_norm over the last dim of [rows, groups, h] (groups: heads of the
 * per-head q/k norms) with a weight [h]. */
static void case_rms_norm(bench_case *c, hr_dtype dt, int64_t rows, int64_t groups, int64_t h) {
    snprintf(c->name, sizeof c->name, "rms_norm %lldx%lldx%lld", (long long)rows, (long long)groups, (long long)h);
    set_op(c, "rms_norm");
    c->norm = (hr_attrs_norm){.eps = 1e-6};
    c->attrs = &c->norm;
    c->in[0] = rand_tensor(c, dt, 3, (int64_t[]){rows, groups, h});
    c->in[1] = rand_tensor(c, dt, 1, (int64_t[]){h});
    c->out[0] = empty_tensor(c, dt, 3, (int64_t[]){rows, groups, h});
    c->n_in = 2, c->n_out = 1;
    c->bytes = 2.0 * (double)hr_tensor_nbytes(c->in[0]);
}

/* add_rms_norm as residual_norm runs it: the sum into the residual stream
 * in place, the normed rows to a scratch. Every call grows the residual,
 * which changes no byte count. */
static void case_add_rms_norm(bench_case *c, hr_dtype dt, int64_t rows, int64_t h) {
    snprintf(c->name, sizeof c->name, "add_rms_norm %lldx%lld", (long long)rows, (long long)h);
    set_op(c, "add_rms_norm");
    c->norm = (hr_attrs_norm){.eps = 1e-6};
    c->attrs = &c->norm;
    hr_tensor *res = rand_tensor(c, dt, 2, (int64_t[]){rows, h});
    c->in[0] = rand_tensor(c, dt, 2, (int64_t[]){rows, h});
    c->in[1] = res;
    c->in[2] = rand_tensor(c, dt, 1, (int64_t[]){h});
    c->out[0] = empty_tensor(c, dt, 2, (int64_t[]){rows, h});
    c->out[1] = res;
    c->n_in = 3, c->n_out = 2;
    c->bytes = 4.0 * (double)hr_tensor_nbytes(res);
}

static void case_silu_mul(bench_case *c, hr_dtype dt, int64_t rows, int64_t h) {
    snprintf(c->name, sizeof c->name, "silu_mul %lldx%lld", (long long)rows, (long long)h);
    set_op(c, "silu_mul");
    c->in[0] = rand_tensor(c, dt, 2, (int64_t[]){rows, h});
    c->in[1] = rand_tensor(c, dt, 2, (int64_t[]){rows, h});
    c->out[0] = empty_tensor(c, dt, 2, (int64_t[]){rows, h});
    c->n_in = 2, c->n_out = 1;
    c->bytes = 3.0 * (double)hr_tensor_nbytes(c->in[0]);
}

/* The logits' cast to f32 (model.c) at a batch-64 decode step: [rows, vocab]. */
static void case_cast(bench_case *c, hr_dtype dt, int64_t rows, int64_t vocab) {
    snprintf(c->name, sizeof c->name, "cast->f32 %lldx%lld", (long long)rows, (long long)vocab);
    set_op(c, "cast");
    c->cast = (hr_attrs_cast){.dtype = HR_F32};
    c->attrs = &c->cast;
    c->in[0] = rand_tensor(c, dt, 2, (int64_t[]){rows, vocab});
    c->out[0] = empty_tensor(c, HR_F32, 2, (int64_t[]){rows, vocab});
    c->n_in = 1, c->n_out = 1;
    c->bytes = (double)hr_tensor_nbytes(c->in[0]) + (double)hr_tensor_nbytes(c->out[0]);
}

static void run_case(const bench_case *c) {
    bench_check(PROG, hr_op_run(c->op, c->attrs, c->in, c->n_in, (hr_tensor **)c->out, c->n_out), c->name);
}

/* ---- the peer: memcpy of half the bytes, split over the threads ---- */

typedef struct copy_arg {
    char *dst;
    const char *src;
    size_t n;
} copy_arg;

static void *copy_share(void *arg) {
    copy_arg *a = arg;
    memcpy(a->dst, a->src, a->n);
    return NULL;
}

/* nth threads copy n bytes; 1 runs on the calling thread alone. */
static void copy_pass(char *dst, const char *src, size_t n, int nth) {
    pthread_t th[64];
    copy_arg args[64];
    size_t share = (n / (size_t)nth) & ~(size_t)63;
    for (int i = 0; i < nth; i++) {
        size_t len = i + 1 < nth ? share : n - share * (size_t)(nth - 1);
        args[i] = (copy_arg){dst + (size_t)i * share, src + (size_t)i * share, len};
        if (i > 0) pthread_create(&th[i], NULL, copy_share, &args[i]);
    }
    copy_share(&args[0]);
    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
}

static void bench(const bench_case *c, int nth, int samples, int reps) {
    size_t half = (size_t)(c->bytes / 2);
    char *src = malloc(half), *dst = malloc(half);
    memset(src, 1, half);
    memset(dst, 2, half);
    double *o = malloc((size_t)samples * sizeof *o), *m = malloc((size_t)samples * sizeof *m);
    for (int it = -1; it < samples; it++) { /* it -1 warms up */
        double t0 = bench_now_s();
        for (int r = 0; r < reps; r++) run_case(c);
        double t1 = bench_now_s();
        for (int r = 0; r < reps; r++) copy_pass(dst, src, half, nth);
        double t2 = bench_now_s();
        for (int r = 0; r < reps; r++) copy_pass(dst, src, half, 1);
        double t3 = bench_now_s(), tm = t2 - t1 < t3 - t2 ? t2 - t1 : t3 - t2;
        if (it >= 0) o[it] = c->bytes * reps / (t1 - t0) / 1e9, m[it] = c->bytes * reps / tm / 1e9;
    }
    qsort(o, (size_t)samples, sizeof *o, bench_cmp_double);
    qsort(m, (size_t)samples, sizeof *m, bench_cmp_double);
    printf("%-30s %7.2f MB  op best %6.1f med %6.1f GB/s %8.1f us | memcpy best %6.1f med %6.1f GB/s | %3.0f%%\n",
           c->name, c->bytes / 1e6, o[samples - 1], o[samples / 2], c->bytes / o[samples - 1] / 1e3,
           m[samples - 1], m[samples / 2], 100.0 * o[samples - 1] / m[samples - 1]);
    fflush(stdout);
    free(src);
    free(dst);
    free(o);
    free(m);
}

static void dump(const bench_case *c, const char *dir) {
    run_case(c);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.bin", dir, c->name);
    for (char *p = path + strlen(dir) + 1; *p; p++)
        if (*p == ' ' || *p == '>') *p = '_';
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "%s: cannot write %s\n", PROG, path);
        exit(1);
    }
    for (int k = 0; k < c->n_out; k++) {
        /* outputs may be strided views: read them through a contiguous copy */
        hr_tensor *t;
        bench_check(PROG, hr_tensor_empty(hr_device_cpu(), hr_tensor_dtype(c->out[k]), hr_tensor_ndim(c->out[k]),
                                          hr_tensor_shape(c->out[k]), &t), "dump");
        hr_op copy;
        bench_check(PROG, hr_op_find("copy", &copy), "copy");
        bench_check(PROG, hr_op_run(copy, NULL, (const hr_tensor *[]){c->out[k]}, 1, &t, 1), "copy");
        size_t nb = hr_tensor_nbytes(t);
        void *buf = malloc(nb);
        bench_check(PROG, hr_tensor_read(t, buf, nb), "read");
        fwrite(buf, 1, nb, f);
        free(buf);
        hr_tensor_free(t);
    }
    fclose(f);
}

int main(int argc, char **argv) {
    int nth = 2, samples = 7, reps = 20;
    const char *only = NULL, *dir = NULL;
    hr_dtype dt = HR_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--samples") && i + 1 < argc) samples = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            i++;
            dt = !strcmp(argv[i], "f32") ? HR_F32 : !strcmp(argv[i], "f16") ? HR_F16 : HR_BF16;
        } else {
            fprintf(stderr, "usage: %s [--dtype bf16|f16|f32] [--threads T] [--samples S] [--reps R] "
                            "[--only SUBSTR] [--dump DIR]\n", argv[0]);
            return 2;
        }
    }
    if (nth < 1 || nth > 64 || samples < 1 || reps < 1) {
        fprintf(stderr, "%s: threads, samples and reps must be >= 1 (threads <= 64)\n", PROG);
        return 2;
    }
    bench_check(PROG, hr_set_num_threads(nth), "threads");
    if (!dir)
        printf("isa %s, %d threads, %s, best of %d samples of %d calls\n", hr_cpu_isa_name(hr_cpu_isa_get()), nth,
               dt == HR_F32 ? "f32" : dt == HR_F16 ? "f16" : "bf16", samples, reps);
    /* Qwen3-0.6B: hidden 1024, 16 q heads, 8 kv heads, head_dim 128,
     * intermediate 3072; prefill of 512 tokens and a batch-64 decode step. */
    enum { N_CASES = 16 };
    for (int k = 0; k < N_CASES; k++) {
        bench_case c = {0};
        switch (k) {
        case 0: case_rope(&c, dt, 1, 512, 16, 128, 0); break;
        case 1: case_rope(&c, dt, 1, 512, 8, 128, 1024); break;
        case 2: case_rope(&c, dt, 64, 1, 16, 128, 0); break;
        case 3: case_rope(&c, dt, 64, 1, 8, 128, 64); break;
        case 4: case_rms_norm(&c, dt, 512, 1, 1024); break;
        case 5: case_rms_norm(&c, dt, 512, 16, 128); break;
        case 6: case_rms_norm(&c, dt, 64, 1, 1024); break;
        case 7: case_rms_norm(&c, dt, 64, 16, 128); break;
        case 8: case_add_rms_norm(&c, dt, 512, 1024); break;
        case 9: case_add_rms_norm(&c, dt, 64, 1024); break;
        case 10: case_silu_mul(&c, dt, 512, 3072); break;
        case 11: case_silu_mul(&c, dt, 64, 3072); break;
        case 12: case_rms_norm(&c, dt, 7, 3, 4097); break;
        case 13: case_silu_mul(&c, dt, 17, 4097); break;
        case 14: case_rope(&c, dt, 2, 17, 3, 34, 20); break; /* odd sizes: a partial vector */
        case 15: case_cast(&c, dt, 64, 151936); break;
        }
        if (!only || strstr(c.name, only)) {
            if (dir) dump(&c, dir);
            else bench(&c, nth, samples, reps);
        }
        for (int i = c.n_owned - 1; i >= 0; i--) hr_tensor_free(c.owned[i]);
    }
    return 0;
}
