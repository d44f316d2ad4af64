/* The experts op alone at a MoE layer's decode and prefill shapes, against
 * the memory bound: a step must read the weights of the experts its tokens
 * touch, once, and nothing else. Default shape: Qwen3-30B-A3B's layer
 * (hidden 2048, 128 experts of moe_intermediate 768, top-8, bf16: 9.4 MB
 * per expert, 1.2 GB per layer).
 *
 * --layers distinct layers (default 2: 2.4 GB, far above the L3) are
 * cycled, so each call's experts come from memory as in a model step.
 * Each token's top-k experts are drawn uniformly (a fresh draw per call),
 * and a call's bound is the bytes of the distinct experts it touches over
 * the read bandwidth of a plain read of the same weights by the same
 * threads, measured alternately with the op (bench_read_pass). The best
 * of --samples is reported with the median.
 *
 * --type T (q8_0, q4_k, q4_0, ...) quantizes the experts into T blocks
 * first (hr_tensor_quantize), as a GGUF file's experts are kept: the bound
 * then counts T's bytes.
 *
 * Built by `make` (CMake target bench_moe in the build folder).
 * Run: B/bench_moe [--rows 1,16,64,512] [--layers L] [--samples S] [--threads T]
 *                  [--hidden H] [--inter I] [--experts E] [--top-k K] [--eager] [--type T] */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>

#include "bench_util.h"

typedef struct moe_shape {
    int64_t h, i, e, k;
} moe_shape;

static hr_tensor *wrap(char *p, int64_t e, int64_t n, int64_t k) {
    hr_tensor *t = NULL;
    int64_t shape[3] = {e, n, k};
    bench_check("bench_moe", hr_tensor_wrap_host(HR_BF16, 3, shape, NULL, p, (size_t)(e * n * k) * 2, NULL, NULL, &t),
                "wrap experts");
    return t;
}

/* k distinct experts per row, uniform, weights summing to 1; returns the
 * count of distinct experts the rows touch. */
static int64_t draw_routing(uint32_t *seed, const moe_shape *s, int64_t rows, int64_t *idx, float *w) {
    char *seen = calloc((size_t)s->e, 1);
    int64_t distinct = 0;
    for (int64_t r = 0; r < rows; r++) {
        float sum = 0;
        for (int64_t j = 0; j < s->k; j++) {
            int64_t e;
            bool dup;
            do {
                *seed = *seed * 1664525u + 1013904223u;
                e = (int64_t)(*seed >> 8) % s->e;
                dup = false;
                for (int64_t q = 0; q < j; q++) dup |= idx[r * s->k + q] == e;
            } while (dup);
            idx[r * s->k + j] = e;
            w[r * s->k + j] = (float)(1 + j);
            sum += (float)(1 + j);
            distinct += !seen[e];
            seen[e] = 1;
        }
        for (int64_t j = 0; j < s->k; j++) w[r * s->k + j] /= sum;
    }
    free(seen);
    return distinct;
}

static void bench_rows(const moe_shape *s, int64_t rows, int layers, hr_tensor **gu, hr_tensor **dn, char *buf,
                       size_t bytes, int nth, int samples, bool eager) {
    size_t expert_bytes = hr_dtype_nbytes(hr_tensor_dtype(gu[0]), 3 * s->i * s->h);
    int64_t xs[2] = {rows, s->h}, rs[2] = {rows, s->k};
    uint16_t *xh = malloc((size_t)(rows * s->h) * 2);
    for (int64_t q = 0; q < rows * s->h; q++) xh[q] = (uint16_t)(0x3c00u | (q * 7 & 127));
    int64_t *idx = malloc((size_t)(rows * s->k) * sizeof *idx);
    float *w = malloc((size_t)(rows * s->k) * sizeof *w);
    hr_tensor *x, *y = NULL;
    bench_check("bench_moe", hr_tensor_from_host(hr_device_cpu(), HR_BF16, 2, xs, xh, (size_t)(rows * s->h) * 2, &x), "x");
    double *gbs = malloc((size_t)samples * sizeof *gbs), *rbs = malloc((size_t)samples * sizeof *rbs);
    double *ms = malloc((size_t)samples * sizeof *ms);
    uint32_t seed = 777u;
    double touched = 0;
    hr_attrs_experts a = {.act = HR_EXPERTS_SILU, .per_expert = eager};
    for (int it = -1; it < samples; it++) { /* it -1 warms up */
        double t = 0, moved = 0;
        for (int l = 0; l < layers; l++) {
            int64_t distinct = draw_routing(&seed, s, rows, idx, w);
            hr_tensor *ti, *tw;
            bench_check("bench_moe", hr_tensor_from_host(hr_device_cpu(), HR_I64, 2, rs, idx,
                                                         (size_t)(rows * s->k) * 8, &ti), "indices");
            bench_check("bench_moe", hr_tensor_from_host(hr_device_cpu(), HR_F32, 2, rs, w,
                                                         (size_t)(rows * s->k) * 4, &tw), "weights");
            double t0 = bench_now_s();
            hr_tensor *out = NULL;
            bench_check("bench_moe", hr_experts(x, tw, ti, gu[l], dn[l], NULL, NULL, &a, &out), "experts");
            t += bench_now_s() - t0;
            moved += (double)distinct * (double)expert_bytes;
            hr_tensor_free(y);
            y = out;
            hr_tensor_free(ti);
            hr_tensor_free(tw);
        }
        double r = bench_read_pass(buf, bytes, nth);
        if (it < 0) continue;
        gbs[it] = moved / t / 1e9;
        rbs[it] = r;
        ms[it] = t / layers * 1e3;
        touched = moved / layers;
    }
    qsort(gbs, (size_t)samples, sizeof *gbs, bench_cmp_double);
    qsort(rbs, (size_t)samples, sizeof *rbs, bench_cmp_double);
    qsort(ms, (size_t)samples, sizeof *ms, bench_cmp_double);
    printf("experts%s %s rows=%4lld H=%lld I=%lld E=%lld k=%lld thr=%d  %7.2f ms/layer (med %7.2f)  touched %7.1f MB  "
           "%5.1f GB/s (med %5.1f) | read best %5.1f med %5.1f GB/s | %3.0f%% of the bound\n",
           eager ? "(eager)" : "", hr_dtype_name(hr_tensor_dtype(gu[0])), (long long)rows, (long long)s->h, (long long)s->i, (long long)s->e, (long long)s->k,
           nth, ms[0], ms[samples / 2], touched / 1e6, gbs[samples - 1], gbs[samples / 2], rbs[samples - 1],
           rbs[samples / 2], 100.0 * gbs[samples - 1] / rbs[samples - 1]);
    fflush(stdout);
    hr_tensor_free(y);
    hr_tensor_free(x);
    free(xh);
    free(idx);
    free(w);
    free(gbs);
    free(rbs);
    free(ms);
}

int main(int argc, char **argv) {
    moe_shape s = {.h = 2048, .i = 768, .e = 128, .k = 8};
    int layers = 2, samples = 5, nth = hr_num_threads();
    bool eager = false;
    char rows_list[256] = "1,16,64,512", type[32] = "";
    for (int a = 1; a < argc; a++) {
        const char *f = argv[a], *v = a + 1 < argc ? argv[a + 1] : "";
        if (!strcmp(f, "--eager")) {
            eager = true;
            continue;
        }
        a++;
        if (!strcmp(f, "--rows")) snprintf(rows_list, sizeof rows_list, "%s", v);
        else if (!strcmp(f, "--layers")) layers = atoi(v);
        else if (!strcmp(f, "--samples")) samples = atoi(v);
        else if (!strcmp(f, "--threads")) nth = atoi(v);
        else if (!strcmp(f, "--hidden")) s.h = atoll(v);
        else if (!strcmp(f, "--inter")) s.i = atoll(v);
        else if (!strcmp(f, "--experts")) s.e = atoll(v);
        else if (!strcmp(f, "--top-k")) s.k = atoll(v);
        else if (!strcmp(f, "--type")) snprintf(type, sizeof type, "%s", v);
        else {
            fprintf(stderr, "bench_moe: unknown argument '%s'\n", f);
            return 2;
        }
    }
    if (layers < 1 || samples < 1 || nth < 1 || s.k < 1 || s.k > s.e) {
        fprintf(stderr, "bench_moe: --layers, --samples, --threads >= 1 and 1 <= --top-k <= --experts\n");
        return 2;
    }
    hr_set_num_threads(nth);
    size_t gu_bytes = (size_t)(s.e * 2 * s.i * s.h) * 2, layer_bytes = (size_t)(s.e * 3 * s.i * s.h) * 2;
    size_t bytes = layer_bytes * (size_t)layers;
    char *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        fprintf(stderr, "bench_moe: cannot map %zu bytes\n", bytes);
        return 1;
    }
    madvise(buf, bytes, MADV_HUGEPAGE);
    uint32_t seed = 12345u;
    for (size_t q = 0; q < bytes / 2; q++) {
        seed = seed * 1664525u + 1013904223u;
        ((uint16_t *)buf)[q] = (uint16_t)(0x3c00u | (seed >> 25));
    }
    hr_tensor *gu[64], *dn[64];
    if (layers > 64) layers = 64;
    for (int l = 0; l < layers; l++) {
        char *p = buf + (size_t)l * layer_bytes;
        gu[l] = wrap(p, s.e, 2 * s.i, s.h);
        dn[l] = wrap(p + gu_bytes, s.e, s.h, s.i);
        if (!type[0]) continue;
        hr_dtype qt;
        hr_tensor *q[2];
        bench_check("bench_moe", hr_dtype_parse(type, &qt), "--type");
        bench_check("bench_moe", hr_tensor_quantize(gu[l], qt, &q[0]), "quantize gate_up");
        bench_check("bench_moe", hr_tensor_quantize(dn[l], qt, &q[1]), "quantize down");
        hr_tensor_free(gu[l]);
        hr_tensor_free(dn[l]);
        gu[l] = q[0];
        dn[l] = q[1];
    }
    printf("bench_moe: %d layers of %.2f GB cycled, %s\n", layers, (double)layer_bytes / 1e9, hr_cpu_isa_name(hr_cpu_isa_get()));
    for (char *tok = strtok(rows_list, ","); tok; tok = strtok(NULL, ","))
        bench_rows(&s, atoll(tok), layers, gu, dn, buf, bytes, nth, samples, eager);
    for (int l = 0; l < layers; l++) {
        hr_tensor_free(gu[l]);
        hr_tensor_free(dn[l]);
    }
    munmap(buf, bytes);
    return 0;
}
