/* The batch-invariant path of the CPU sdpa kernel (hr_attrs_sdpa.exact):
 * one query row at a time, its visible keys in key order from exact_from,
 * the max over all of them first, then the denominator and the numerators
 * summed key after key. No key blocks, splits or lanes across keys, so a
 * row's result is a function of its query and its own visible keys in
 * their order: it does not change with where those keys lie in the cache
 * (the masked cells around them), with the batch's other rows or with the
 * thread count. hubrt serve --deterministic decodes with it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/k_attention.h"
#include "core/iter.h"
#include "core/threadpool.h"

typedef struct exact_ctx {
    const attn_ctx *c;
    int64_t from;
    atomic_int failed;
} exact_ctx;

/* Key j's score for row (bi, h, qi) at position pos, or -inf when hidden. */
static float score(const attn_ctx *c, int64_t bi, int64_t h, int64_t qi, int64_t pos, int64_t j, const float *q,
                   float *krow) {
    float add = 0.0f;
    if (c->mask) {
        const char *mp = (const char *)hr_tensor_ptr(c->mask) +
                         (bi * c->mstr[0] + h * c->mstr[1] + qi * c->mstr[2] + j * c->mstr[3]) *
                             (int64_t)hr_dtype_size(c->mask->dtype);
        if (c->mask->dtype == HR_BOOL) {
            if (!*(const uint8_t *)mp) return -INFINITY;
        } else {
            hr_load_f32(&add, mp, c->mask->dtype, 1, 1);
            if (add == -INFINITY) return -INFINITY;
        }
    }
    if (c->causal && j > pos) return -INFINITY;
    if (c->window > 0 && pos - j >= c->window) return -INFINITY;
    hr_gemm_load_f32(krow, hr_attn_at(c->k, bi, h / c->rep, j), c->k->dtype, c->d, c->k->strides[3], false);
    float sc = 0.0f;
    for (int64_t e = 0; e < c->d; e++) sc += q[e] * krow[e];
    if (c->softcap > 0) sc = c->softcap * tanhf(sc / c->softcap);
    return sc + add;
}

static void exact_row(const exact_ctx *x, int64_t row, float *q, float *kv, float *p, float *o) {
    const attn_ctx *c = x->c;
    int64_t qi = row % c->s, h = (row / c->s) % c->hq, bi = row / (c->s * c->hq), t = c->t;
    int64_t pos = t - c->s + qi, from = t ? ((x->from % t) + t) % t : 0;
    hr_gemm_load_f32(q, hr_attn_at(c->q, bi, h, qi), c->q->dtype, c->d, c->q->strides[3], false);
    for (int64_t e = 0; e < c->d; e++) q[e] *= c->scale;
    float mx = -INFINITY;
    for (int64_t n = 0; n < t; n++) {
        int64_t j = (from + n) % t;
        p[n] = score(c, bi, h, qi, pos, j, q, kv);
        if (p[n] > mx) mx = p[n];
    }
    memset(o, 0, sizeof(float) * (size_t)c->dv);
    float l = 0.0f;
    for (int64_t n = 0; mx != -INFINITY && n < t; n++) {
        if (p[n] == -INFINITY) continue;
        float w = expf(p[n] - mx);
        l += w;
        hr_gemm_load_f32(kv, hr_attn_at(c->v, bi, h / c->rep, (from + n) % t), c->v->dtype, c->dv, c->v->strides[3],
                         false);
        for (int64_t e = 0; e < c->dv; e++) o[e] += w * kv[e];
    }
    l = hr_attn_den(c, h, mx, l);
    float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int64_t e = 0; e < c->dv; e++) o[e] *= inv;
    hr_store_f32(hr_attn_at(c->o, bi, h, qi), c->o->dtype, o, c->dv, c->o->strides[3]);
}

static void exact_worker(void *arg, int ith, int nth) {
    exact_ctx *x = arg;
    const attn_ctx *c = x->c;
    int64_t lo, hi, width = c->d > c->dv ? c->d : c->dv;
    hr_split_range(c->b * c->hq * c->s, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    float *mem = malloc(sizeof(float) * (size_t)(c->d + width + c->t + c->dv + 1));
    if (!mem) {
        atomic_store(&x->failed, 1);
        return;
    }
    for (int64_t r = lo; r < hi; r++) exact_row(x, r, mem, mem + c->d, mem + c->d + width, mem + c->d + width + c->t);
    free(mem);
}

bool hr_attn_exact(const attn_ctx *c, int64_t from) {
    exact_ctx x = {.c = c, .from = from};
    atomic_init(&x.failed, 0);
    int nth = hr_parallel_threads_for(c->b * c->hq * c->s * (c->t + 1) * (c->d + c->dv + 1), HR_GRAIN_MATMUL);
    if (nth > c->b * c->hq * c->s) nth = (int)(c->b * c->hq * c->s);
    if (nth < 1) nth = 1;
    hr_parallel_run(exact_worker, &x, nth);
    return !atomic_load(&x.failed);
}
