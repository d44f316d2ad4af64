/* Logits processors and token choice, on one row of host f32 logits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/half.h"
#include "generate/sampling.h"

/* ---- PRNG -------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void hr_rng_seed(hr_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t hr_rng_next(hr_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double hr_rng_uniform(hr_rng *r) { return (double)(hr_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- sampler ------------------------------------------------------------ */

hr_status hr_sampler_init(hr_sampler *s, const hr_generate_config *cfg, int64_t vocab) {
    memset(s, 0, sizeof *s);
    if (cfg->temperature < 0 || cfg->top_p < 0 || cfg->top_p > 1 || cfg->min_p < 0 || cfg->min_p > 1 ||
        cfg->top_k < 0 || cfg->repetition_penalty < 0)
        return hr_error(HR_ERR_INVALID_ARG, "generate: sampling parameters out of range (temperature %g >= 0, "
                        "top_p %g and min_p %g in [0, 1], top_k %lld >= 0, repetition_penalty %g >= 0)",
                        cfg->temperature, cfg->top_p, cfg->min_p, (long long)cfg->top_k, cfg->repetition_penalty);
    s->do_sample = cfg->do_sample;
    s->temperature = cfg->temperature > 0 ? cfg->temperature : 1.0;
    s->top_k = cfg->top_k;
    s->top_p = cfg->top_p > 0 ? cfg->top_p : 1.0;
    s->min_p = cfg->min_p;
    s->repetition_penalty = cfg->repetition_penalty > 0 ? cfg->repetition_penalty : 1.0;
    s->vocab = vocab;
    hr_rng_seed(&s->rng, cfg->seed);
    s->idx = malloc(sizeof(int64_t) * (size_t)vocab);
    s->prob = malloc(sizeof(float) * (size_t)vocab);
    s->seen = calloc((size_t)vocab, 1);
    if (!s->idx || !s->prob || !s->seen) {
        hr_sampler_free(s);
        return hr_error(HR_ERR_OOM, "generate: sampler for %lld tokens", (long long)vocab);
    }
    return HR_OK;
}

void hr_sampler_free(hr_sampler *s) {
    free(s->idx);
    free(s->prob);
    free(s->seen);
    s->idx = NULL;
    s->prob = NULL;
}

/* x[i] of a row of dtype dt (f32, bf16 or f16; a constant wherever this
 * is inlined). */
static inline __attribute__((always_inline)) float elem(const void *x, hr_dtype dt, int64_t i) {
    if (dt == HR_F32) return ((const float *)x)[i];
    uint16_t h = ((const uint16_t *)x)[i];
    return dt == HR_BF16 ? hr_bf16_to_f32(h) : hr_f16_to_f32(h);
}

#if defined(__AVX2__)
static inline __attribute__((always_inline)) __m256 elem8(const void *x, hr_dtype dt, int64_t i) {
    if (dt == HR_F32) return _mm256_loadu_ps((const float *)x + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    if (dt == HR_F16) return _mm256_cvtph_ps(h); /* F16C: part of the x86-64-v3 baseline */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

/* The first index of the largest logit: what a scan that moves only on a
 * strictly greater value gives, NaNs never chosen unless x[0] is one (then
 * 0). Two vector passes, the max then its first index: a batch-64 decode
 * step picks over 64 rows of a 152k vocabulary, where the scalar scan took
 * about 1% of the step. A bf16 or f16 row is read as it is, each value
 * widened exactly as the f32 row would hold it. */
static inline __attribute__((always_inline)) int64_t argmax_dt(const void *x, hr_dtype dt, int64_t n) {
    if (n <= 0 || isnan(elem(x, dt, 0))) return 0;
    float m = elem(x, dt, 0);
    int64_t i = 1;
#if defined(__AVX2__)
    /* max_ps(a, b) returns b when a is NaN: NaNs are skipped */
    __m256 vm = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(elem8(x, dt, i), vm);
    float lanes[8];
    _mm256_storeu_ps(lanes, vm);
    for (int j = 0; j < 8; j++)
        if (lanes[j] > m) m = lanes[j];
#endif
    for (; i < n; i++)
        if (elem(x, dt, i) > m) m = elem(x, dt, i);
    i = 0;
#if defined(__AVX2__)
    for (__m256 want = _mm256_set1_ps(m); i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(elem8(x, dt, i), want, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#endif
    while (elem(x, dt, i) != m) i++; /* m is one of x's values */
    return i;
}

static int64_t argmax(const float *x, int64_t n) { return argmax_dt(x, HR_F32, n); }

bool hr_sampler_is_argmax(const hr_sampler *s) { return !s->do_sample && s->repetition_penalty == 1.0; }

int64_t hr_sampler_argmax(const void *logits, hr_dtype dt, int64_t n) {
    switch (dt) {
    case HR_BF16: return argmax_dt(logits, HR_BF16, n);
    case HR_F16: return argmax_dt(logits, HR_F16, n);
    default: return argmax_dt(logits, HR_F32, n);
    }
}

/* transformers' RepetitionPenaltyLogitsProcessor: each token seen before is
 * made less likely once, whatever its count. */
static void repetition_penalty(float *logits, int64_t vocab, const int64_t *hist, int64_t n, double p, uint8_t *seen) {
    /* seen (all zero between calls) marks the ids done: one pass over the
     * history, not one per id (a 4k-token history was 8M compares a token) */
    for (int64_t i = 0; i < n; i++) {
        int64_t id = hist[i];
        if (id < 0 || id >= vocab || seen[id]) continue;
        seen[id] = 1;
        float x = logits[id];
        logits[id] = (float)(x < 0 ? x * p : x / p);
    }
    for (int64_t i = 0; i < n; i++)
        if (hist[i] >= 0 && hist[i] < vocab) seen[hist[i]] = 0;
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *logits = ctx;
    float x = logits[*(const int64_t *)a], y = logits[*(const int64_t *)b];
    if (x != y) return x < y ? 1 : -1;
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    return (i > j) - (i < j);
}

/* Moves the ids whose logit is at least the k-th largest to the front of
 * idx[0..n) (quickselect), returning how many (ties at the k-th kept, as
 * transformers keeps them). */
static int64_t keep_top_k(const float *logits, int64_t *idx, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = logits[idx[(lo + hi) / 2]];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (logits[idx[i]] > pivot) i++;
            while (logits[idx[j]] < pivot) j--;
            if (i <= j) {
                int64_t t = idx[i];
                idx[i++] = idx[j];
                idx[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    float kth = logits[idx[want]];
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (logits[idx[i]] >= kth) {
            int64_t t = idx[m];
            idx[m++] = idx[i];
            idx[i] = t;
        }
    return m;
}

static int64_t pick_impl(hr_sampler *s, float *logits, const int64_t *history, int64_t n_hist, float *scores,
                         bool draw);

int64_t hr_sampler_pick(hr_sampler *s, float *logits, const int64_t *history, int64_t n_hist) {
    return pick_impl(s, logits, history, n_hist, NULL, true);
}

int64_t hr_sampler_pick_scored(hr_sampler *s, float *logits, const int64_t *history, int64_t n_hist, float *scores) {
    return pick_impl(s, logits, history, n_hist, scores, true);
}

void hr_sampler_scores(hr_sampler *s, float *logits, const int64_t *history, int64_t n_hist, float *scores) {
    pick_impl(s, logits, history, n_hist, scores, false);
}

/* scores[idx[0..n)] = logits there, -inf elsewhere */
static void kept_scores(float *scores, const float *logits, const int64_t *idx, int64_t n, int64_t V) {
    if (!scores) return;
    for (int64_t i = 0; i < V; i++) scores[i] = -INFINITY;
    for (int64_t i = 0; i < n; i++) scores[idx[i]] = logits[idx[i]];
}

/* draw false: the scores only, the generator untouched (a finished row's). */
static int64_t pick_impl(hr_sampler *s, float *logits, const int64_t *history, int64_t n_hist, float *scores,
                         bool draw) {
    int64_t V = s->vocab;
    if (s->repetition_penalty != 1.0) repetition_penalty(logits, V, history, n_hist, s->repetition_penalty, s->seen);
    if (!s->do_sample) {
        if (scores) memcpy(scores, logits, sizeof(float) * (size_t)V);
        return argmax(logits, V);
    }
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] > -INFINITY) s->idx[n++] = i;
    if (n == 0) {
        if (scores) memcpy(scores, logits, sizeof(float) * (size_t)V);
        return argmax(logits, V);
    }
    for (int64_t i = 0; i < n; i++) logits[s->idx[i]] = (float)(logits[s->idx[i]] / s->temperature);
    if (s->top_k > 0 && s->top_k < n) n = keep_top_k(logits, s->idx, n, s->top_k);
    qsort_r(s->idx, (size_t)n, sizeof(int64_t), cmp_desc, logits);
    /* softmax over the candidates, best first */
    double mx = logits[s->idx[0]], sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (s->prob[i] = (float)exp(logits[s->idx[i]] - mx));
    for (int64_t i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (s->top_p < 1.0) {
        /* keep the smallest prefix whose mass reaches top_p (transformers
         * drops tokens whose ascending cumulative mass is <= 1 - top_p) */
        double tail = 0;
        int64_t m = n;
        while (m > 1 && tail + s->prob[m - 1] <= 1.0 - s->top_p) tail += s->prob[--m];
        n = m;
    }
    if (s->min_p > 0) {
        double floor_p = s->min_p * s->prob[0];
        int64_t m = 1;
        while (m < n && s->prob[m] >= floor_p) m++;
        n = m;
    }
    kept_scores(scores, logits, s->idx, n, V);
    if (!draw) return -1;
    double total = 0;
    for (int64_t i = 0; i < n; i++) total += s->prob[i];
    double u = hr_rng_uniform(&s->rng) * total, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += s->prob[i];
        if (u < acc) return s->idx[i];
    }
    return s->idx[n - 1];
}
