/* sdpa micro-benchmark: GFLOP/s of bf16 attention at model shapes, the
 * kernel at the best ISA the CPU has next to the same call at
 * HUBRT_CPU_ISA=avx2 (the AVX2 path), samples of the two
 * alternating so both see the same machine load.
 *
 * The "model" cases make the call a model's eager decode step makes: K/V
 * narrowed views of a static cache [b, hkv, cap, d] holding t keys (or,
 * "compiled", the whole cache under a bool mask [b, 1, s, cap] that shows
 * each query the filled slots up to its own, as a compiled step or
 * prefill attends), and,
 * "cold", one such cache per layer (all in one buffer, as the model's KV
 * cache is) with a layer's linear weights streamed by the GEMV between two
 * calls, so that K/V come from memory as they do in a step (repeating one
 * call keeps them in cache). A cold sample is the mean call over the
 * layers.
 *
 * FLOPs count 2 (d + dv) per (query, key) pair; causal (or its mask) with
 * s = t counts half. Reports the best and the median of --samples, and the best as a
 * share of --peak GFLOP/s (default 466: vdpbf16ps on 2 threads here).
 *
 * Built by `make` (CMake target bench_attention in the build folder).
 * Run: B/bench_attention [--threads T] [--samples S] [--peak G] [--case SUBSTRING] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "hubrt.h"

typedef struct attn_case {
    const char *name;
    int64_t b, hq, hkv, s, t, d;
    bool causal;
    int64_t cap;    /* cache capacity K/V are narrowed from; 0: t */
    int64_t layers; /* cold: caches cycled with weights streamed between calls; 0: one call repeated */
    bool masked;    /* the whole cache under a mask instead of a narrowed view */
} attn_case;

/* Qwen3-0.6B: 28 layers of 31.5 MB of linear weights each */
#define QWEN3_LAYERS 28
#define QWEN3_LAYER_BYTES ((size_t)31457280)
#define QWEN3_HIDDEN 1024

static const attn_case CASES[] = {
    {"qwen3 prefill 512", 1, 16, 8, 512, 512, 128, true, 0, 0, false},
    {"llama-1b prefill 512", 1, 32, 8, 512, 512, 64, true, 0, 0, false},
    {"qwen3 prefill 512/640 compiled", 1, 16, 8, 512, 512, 128, false, 640, 0, true},
    /* SmolLM2-135M's heads: 9 query heads on 3 KV heads of 64 */
    {"smollm2 prefill 512", 1, 9, 3, 512, 512, 64, true, 0, 0, false},
    {"smollm2 prefill 512/640 compiled", 1, 9, 3, 512, 512, 64, false, 640, 0, true},
    {"qwen3 decode b=64 t=48", 64, 16, 8, 1, 48, 128, false, 0, 0, false},
    {"qwen3 decode b=1 t=640", 1, 16, 8, 1, 640, 128, false, 0, 0, false},
    {"model b=1 t=540/640 cold", 1, 16, 8, 1, 540, 128, false, 640, QWEN3_LAYERS, false},
    {"model b=1 t=540/640 compiled cold", 1, 16, 8, 1, 540, 128, false, 640, QWEN3_LAYERS, true},
    {"model smollm2 b=1 t=540/640 cold", 1, 9, 3, 1, 540, 64, false, 640, QWEN3_LAYERS, false},
    {"model smollm2 b=1 t=540/640 compiled cold", 1, 9, 3, 1, 540, 64, false, 640, QWEN3_LAYERS, true},
    {"model b=64 t=48/52", 64, 16, 8, 1, 48, 128, false, 52, 0, false},
    {"model b=64 t=48/52 cold", 64, 16, 8, 1, 48, 128, false, 52, QWEN3_LAYERS, false},
    {"model b=64 t=48/128 compiled cold", 64, 16, 8, 1, 48, 128, false, 128, 8, true},
};

static void check(hr_status s, const char *what) { bench_check("bench_attention", s, what); }

/* A bf16 tensor of uniform values in [-2, 2). */
static hr_tensor *random_bf16(int64_t n0, int64_t n1, int64_t n2, int64_t n3, uint32_t *seed) {
    int64_t shape[4] = {n0, n1, n2, n3}, n = n0 * n1 * n2 * n3;
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
    if (!h) check(HR_ERR_OOM, "host buffer");
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        float f = ((float)(*seed >> 8) / 16777216.0f - 0.5f) * 4.0f;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        h[i] = (uint16_t)(bits >> 16);
    }
    hr_tensor *t;
    check(hr_tensor_from_host(hr_device_cpu(), HR_BF16, 4, shape, h, sizeof(uint16_t) * (size_t)n, &t), "tensor");
    free(h);
    return t;
}

/* A layer's linear weights, streamed between two attention calls by the
 * GEMV a decode step runs (both threads, as in a model: a stream on the
 * calling thread alone let the idle worker fall asleep, and every cold
 * call then paid its wake-up). */
typedef struct layer_weights {
    hr_op linear;
    hr_tensor *x, *y, *w[QWEN3_LAYERS];
} layer_weights;

static void stream(const layer_weights *lw, int64_t l) {
    const hr_tensor *in[2] = {lw->x, lw->w[l % QWEN3_LAYERS]};
    hr_tensor *y = lw->y;
    check(hr_op_run(lw->linear, NULL, in, 2, &y, 1), "linear");
}

/* Mean seconds of one sdpa call at isa over the layers' inputs in[l],
 * each call after streaming layer l's weights. */
static double time_cold(hr_op op, const hr_attrs_sdpa *a, const hr_tensor *const (*in)[4], int n_in, int64_t layers,
                        hr_tensor *o, hr_cpu_isa isa, const layer_weights *lw) {
    check(hr_cpu_isa_set(isa), "isa");
    double sum = 0;
    for (int64_t l = 0; l < layers; l++) {
        stream(lw, l);
        double t0 = bench_now_s();
        check(hr_op_run(op, a, in[l], n_in, &o, 1), "sdpa");
        sum += bench_now_s() - t0;
    }
    return sum / (double)layers;
}

/* Seconds of one sdpa call at isa; enough calls to last ~20 ms. */
static double time_call(hr_op op, const hr_attrs_sdpa *a, const hr_tensor *const *in, int n_in, hr_tensor *o,
                        hr_cpu_isa isa) {
    check(hr_cpu_isa_set(isa), "isa");
    check(hr_op_run(op, a, in, n_in, &o, 1), "sdpa");
    int reps = 1;
    double t0 = bench_now_s(), dt;
    for (;;) {
        for (int i = 0; i < reps; i++) check(hr_op_run(op, a, in, n_in, &o, 1), "sdpa");
        dt = bench_now_s() - t0;
        if (dt > 0.02) break;
        reps *= 2;
        t0 = bench_now_s();
    }
    return dt / reps;
}

int main(int argc, char **argv) {
    int nth = 2, samples = 7;
    double peak = 466.0;
    const char *only = NULL; /* run the cases whose name contains it */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads"))
            nth = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--samples"))
            samples = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--peak"))
            peak = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--case"))
            only = argv[i + 1];
        else {
            fprintf(stderr, "usage: %s [--threads T] [--samples S] [--peak GFLOPS] [--case SUBSTRING]\n", argv[0]);
            return 2;
        }
    }
    if (samples < 1 || samples > 1000) samples = 7;
    check(hr_set_num_threads(nth), "threads");
    hr_cpu_isa best = hr_cpu_isa_get();
    printf("best isa %s vs avx2, %d threads, best and median of %d samples\n", hr_cpu_isa_name(best), nth, samples);
    hr_op op;
    check(hr_op_find("sdpa", &op), "op");
    /* the weights the cold cases stream: as many bytes as a whole model step */
    layer_weights lw = {0};
    for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
        const attn_case *c = &CASES[ci];
        if (only && !strstr(c->name, only)) continue;
        uint32_t seed = 12345u + (uint32_t)ci;
        int64_t cap = c->cap ? c->cap : c->t, nl = c->layers ? c->layers : 1;
        if (c->layers && !lw.x) {
            uint32_t wseed = 777u;
            check(hr_op_find("linear", &lw.linear), "op");
            lw.x = random_bf16(1, 1, 1, QWEN3_HIDDEN, &wseed);
            int64_t wshape[2] = {QWEN3_LAYER_BYTES / 2 / QWEN3_HIDDEN, QWEN3_HIDDEN};
            for (int l = 0; l < QWEN3_LAYERS; l++) {
                hr_tensor *w4 = random_bf16(1, 1, wshape[0], wshape[1], &wseed);
                check(hr_tensor_reshape(w4, 2, wshape, &lw.w[l]), "weights");
                hr_tensor_free(w4);
            }
            int64_t yshape[4] = {1, 1, 1, wshape[0]};
            check(hr_tensor_empty(hr_device_cpu(), HR_BF16, 4, yshape, &lw.y), "linear out");
        }
        hr_tensor *q = random_bf16(c->b, c->hq, c->s, c->d, &seed);
        hr_tensor *kc[QWEN3_LAYERS], *vc[QWEN3_LAYERS], *k[QWEN3_LAYERS], *v[QWEN3_LAYERS];
        /* every layer's cache in one buffer, as the model's KV cache is */
        hr_tensor *kall = random_bf16(nl, c->b * c->hkv, cap, c->d, &seed);
        hr_tensor *vall = random_bf16(nl, c->b * c->hkv, cap, c->d, &seed);
        int64_t lshape[4] = {c->b, c->hkv, cap, c->d};
        const hr_tensor *in[QWEN3_LAYERS][4];
        hr_tensor *mask = NULL;
        if (c->masked) {
            /* query i holds slot t - s + i and sees the slots up to it */
            int64_t mshape[4] = {c->b, 1, c->s, cap}, n = c->b * c->s * cap;
            uint8_t *keep = malloc((size_t)n);
            if (!keep) check(HR_ERR_OOM, "mask");
            for (int64_t i = 0; i < n; i++) keep[i] = i % cap <= c->t - c->s + i / cap % c->s;
            check(hr_tensor_from_host(hr_device_cpu(), HR_BOOL, 4, mshape, keep, (size_t)n, &mask), "mask");
            free(keep);
        }
        for (int64_t l = 0; l < nl; l++) {
            hr_tensor *kl, *vl;
            check(hr_tensor_select(kall, 0, l, &kl), "select k");
            check(hr_tensor_select(vall, 0, l, &vl), "select v");
            check(hr_tensor_view(kl, 4, lshape, &kc[l]), "view k");
            check(hr_tensor_view(vl, 4, lshape, &vc[l]), "view v");
            hr_tensor_free(kl);
            hr_tensor_free(vl);
            int64_t nt = c->masked ? cap : c->t;
            check(hr_tensor_narrow(kc[l], 2, 0, nt, &k[l]), "narrow k");
            check(hr_tensor_narrow(vc[l], 2, 0, nt, &v[l]), "narrow v");
            in[l][0] = q, in[l][1] = k[l], in[l][2] = v[l], in[l][3] = mask;
        }
        int n_in = c->masked ? 4 : 3;
        int64_t oshape[4] = {c->b, c->hq, c->s, c->d};
        hr_tensor *o;
        check(hr_tensor_empty(hr_device_cpu(), HR_BF16, 4, oshape, &o), "out");
        hr_attrs_sdpa a = {.is_causal = c->causal};
        double flop = 2.0 * (double)(c->b * c->hq * c->s * c->t) * (double)(2 * c->d);
        if ((c->causal || c->masked) && c->s == c->t) flop *= 0.5;
        double tn[1000], to[1000];
        for (int i = 0; i < samples; i++) {
            tn[i] = c->layers ? time_cold(op, &a, in, n_in, nl, o, best, &lw) : time_call(op, &a, in[0], n_in, o, best);
            to[i] = c->layers ? time_cold(op, &a, in, n_in, nl, o, HR_ISA_AVX2, &lw)
                              : time_call(op, &a, in[0], n_in, o, HR_ISA_AVX2);
        }
        qsort(tn, (size_t)samples, sizeof(double), bench_cmp_double);
        qsort(to, (size_t)samples, sizeof(double), bench_cmp_double);
        /* K and V bytes read once, as a share of 24 GB/s (LIMITS.md) */
        double kv = 2.0 * (double)(c->b * c->hkv * c->t * c->d) * 2;
        printf("%-24s %-6s best %8.1f us %6.1f GFLOP/s (%4.1f%% of peak) %5.1f GB/s K/V, median %8.1f us\n",
               c->name, hr_cpu_isa_name(best), tn[0] * 1e6, flop / tn[0] / 1e9, 100 * flop / tn[0] / 1e9 / peak,
               kv / tn[0] / 1e9, tn[samples / 2] * 1e6);
        printf("%-24s %-6s best %8.1f us %6.1f GFLOP/s (%4.1f%% of peak) %5.1f GB/s K/V, median %8.1f us\n", "",
               "avx2", to[0] * 1e6, flop / to[0] / 1e9, 100 * flop / to[0] / 1e9 / peak, kv / to[0] / 1e9,
               to[samples / 2] * 1e6);
        hr_tensor_free(q);
        for (int64_t l = 0; l < nl; l++) {
            hr_tensor_free(k[l]);
            hr_tensor_free(v[l]);
            hr_tensor_free(kc[l]);
            hr_tensor_free(vc[l]);
        }
        hr_tensor_free(kall);
        hr_tensor_free(vall);
        hr_tensor_free(o);
        hr_tensor_free(mask);
    }
    hr_tensor_free(lw.x);
    hr_tensor_free(lw.y);
    for (int l = 0; l < QWEN3_LAYERS; l++) hr_tensor_free(lw.w[l]);
    check(hr_cpu_isa_set(best), "isa");
    return 0;
}
