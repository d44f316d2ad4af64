/* Logits processors and token selection on host f32 logits, in
 * transformers' order: repetition penalty, temperature, top-k, top-p,
 * min-p, then greedy argmax or a seeded draw. */
#ifndef HR_GENERATE_SAMPLING_H
#define HR_GENERATE_SAMPLING_H

#include "hubrt/model.h"

/* xoshiro256** seeded through splitmix64: small, fast, reproducible
 * everywhere (rand() is neither). */
typedef struct hr_rng {
    uint64_t s[4];
} hr_rng;

void hr_rng_seed(hr_rng *r, uint64_t seed);
uint64_t hr_rng_next(hr_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double hr_rng_uniform(hr_rng *r);

typedef struct hr_sampler {
    bool do_sample;
    double temperature, top_p, min_p, repetition_penalty;
    int64_t top_k;
    hr_rng rng;
    int64_t vocab;
    int64_t *idx; /* [vocab] candidate ids */
    float *prob;  /* [vocab] candidate probabilities */
    uint8_t *seen; /* [vocab] zeros: the repetition penalty's marks */
} hr_sampler;

/* Scratch for `vocab` ids; the parameters come from cfg. */
hr_status hr_sampler_init(hr_sampler *s, const hr_generate_config *cfg, int64_t vocab);
void hr_sampler_free(hr_sampler *s);
/* logits [vocab] (modified in place); history [n] the row's tokens so far
 * (for the repetition penalty). Returns the chosen id. */
int64_t hr_sampler_pick(hr_sampler *s, float *logits, const int64_t *history, int64_t n);
/* The same, also writing scores [vocab]: the logits after the penalty and
 * the warpers (temperature; -inf outside top-k, top-p, min-p), as
 * transformers' output_scores holds them. */
int64_t hr_sampler_pick_scored(hr_sampler *s, float *logits, const int64_t *history, int64_t n, float *scores);
/* The scores alone, with no draw from the generator: a finished row's,
 * whose pick is the pad. */
void hr_sampler_scores(hr_sampler *s, float *logits, const int64_t *history, int64_t n, float *scores);
/* Whether s picks the largest logit, unchanged (greedy, no repetition
 * penalty): then hr_sampler_argmax on the row as it is gives its pick. */
bool hr_sampler_is_argmax(const hr_sampler *s);
/* The pick of such a sampler from logits [n] of dtype dt (f32, bf16 or
 * f16), the same as from the row widened to f32. */
int64_t hr_sampler_argmax(const void *logits, hr_dtype dt, int64_t n);

#endif
