/* generate: chunked prefill into a static KV cache, then one token per step
 * for every row of the batch, with left padding handled by the attention
 * mask and positions counted over real tokens, as transformers does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "generate/sampling.h"
#include "hubrt/model.h"
#include "hubrt/runtime.h"

#define HR_MAX_BATCH 64
#define STOP_TAIL 512 /* bytes of decoded text kept per row for stop strings */

void hr_generate_config_init(hr_generate_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->max_new_tokens = 20;
    cfg->temperature = 1.0;
    cfg->top_k = 50;
    cfg->top_p = 1.0;
    cfg->repetition_penalty = 1.0;
    cfg->pad_id = -1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct gen_state {
    int64_t b, seq, cap, t;  /* t: tokens per row so far */
    int64_t *tokens;         /* [b, cap] */
    int64_t *mask;           /* [b, cap] */
    int64_t *last_pos;       /* [b] */
    int64_t *ids, *pos;      /* [b, chunk] staging for one forward */
    int64_t *mask_stage;     /* [b, cap] contiguous prefix of mask */
    bool *done;              /* [b] */
    char *tail;              /* [b, STOP_TAIL] decoded text tails */
    size_t *tail_len;        /* [b] */
    float *row;              /* [nrow][vocab]: one row of f32 logits per picking task */
    int nrow;
    float *raw, *scores;     /* [b][vocab] for on_step's want_scores */
    int64_t *step;           /* [b] this step's tokens */
} gen_state;

static void state_free(gen_state *g) {
    free(g->tokens);
    free(g->mask);
    free(g->last_pos);
    free(g->ids);
    free(g->pos);
    free(g->mask_stage);
    free(g->done);
    free(g->tail);
    free(g->tail_len);
    free(g->row);
    free(g->raw);
    free(g->scores);
    free(g->step);
}

static hr_status state_init(gen_state *g, int64_t b, int64_t seq, int64_t cap, int64_t chunk, int64_t vocab,
                            bool scores) {
    memset(g, 0, sizeof *g);
    g->b = b;
    g->seq = seq;
    g->cap = cap;
    size_t bc = (size_t)(b * cap);
    g->tokens = calloc(bc, sizeof(int64_t));
    g->mask = calloc(bc, sizeof(int64_t));
    g->mask_stage = calloc(bc, sizeof(int64_t));
    g->last_pos = calloc((size_t)b, sizeof(int64_t));
    g->ids = calloc((size_t)(b * chunk), sizeof(int64_t));
    g->pos = calloc((size_t)(b * chunk), sizeof(int64_t));
    g->done = calloc((size_t)b, sizeof(bool));
    g->tail = calloc((size_t)b, STOP_TAIL);
    g->tail_len = calloc((size_t)b, sizeof(size_t));
    g->nrow = hr_num_threads() < b ? hr_num_threads() : (int)b;
    if (g->nrow < 1) g->nrow = 1;
    g->row = malloc(sizeof(float) * (size_t)vocab * (size_t)g->nrow);
    if (!g->tokens || !g->mask || !g->mask_stage || !g->last_pos || !g->ids || !g->pos || !g->done || !g->tail ||
        !g->tail_len || !g->row)
        return hr_error(HR_ERR_OOM, "generate: out of memory for batch %lld x %lld", (long long)b, (long long)cap);
    g->step = calloc((size_t)b, sizeof(int64_t));
    if (scores) {
        g->raw = malloc(sizeof(float) * (size_t)(b * vocab));
        g->scores = malloc(sizeof(float) * (size_t)(b * vocab));
    }
    if (!g->step || (scores && (!g->raw || !g->scores)))
        return hr_error(HR_ERR_OOM, "generate: out of memory for the scores of batch %lld", (long long)b);
    return HR_OK;
}

/* Runs tokens [from, from + n) of every row through the model. */
static hr_status forward_span(hr_model *m, gen_state *g, hr_kv_cache *kv, int64_t from, int64_t n,
                              const int64_t *pos, bool compile, hr_tensor **logits) {
    int64_t b = g->b, t = from + n;
    for (int64_t r = 0; r < b; r++) {
        memcpy(g->ids + r * n, g->tokens + r * g->cap + from, sizeof(int64_t) * (size_t)n);
        memcpy(g->mask_stage + r * t, g->mask + r * g->cap, sizeof(int64_t) * (size_t)t);
    }
    hr_step_args a = {.ids = g->ids, .pos = pos, .mask = g->mask_stage, .batch = b, .seq = n, .cache = kv,
                      .compiled = compile};
    return hr_model_step(m, &a, logits);
}

/* The prefill chunk starting at `from`: the full chunk size eagerly; with
 * compile, the largest power of two that fits, so a prompt of any length
 * needs at most log2(chunk) + 1 compiled shapes. */
static int64_t chunk_len(int64_t remaining, int64_t chunk, bool compile) {
    int64_t n = remaining < chunk ? remaining : chunk;
    if (!compile) return n;
    int64_t p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}

/* Appends the new text of row r to its tail; true when a stop string now
 * ends inside the new bytes. */
static bool hit_stop_string(const hr_generate_config *cfg, gen_state *g, int64_t r, const char *bytes,
                            size_t len) {
    if (!cfg->n_stop_strings || !bytes || !len) return false;
    char *tail = g->tail + r * STOP_TAIL;
    size_t *tl = &g->tail_len[r];
    if (len >= STOP_TAIL) {
        bytes += len - (STOP_TAIL - 1);
        len = STOP_TAIL - 1;
    }
    if (*tl + len > STOP_TAIL) {
        size_t drop = *tl + len - STOP_TAIL;
        memmove(tail, tail + drop, *tl - drop);
        *tl -= drop;
    }
    memcpy(tail + *tl, bytes, len);
    *tl += len;
    for (int i = 0; i < cfg->n_stop_strings; i++) {
        size_t sl = strlen(cfg->stop_strings[i]);
        if (!sl || sl > *tl) continue;
        size_t first_end = *tl - len < sl ? sl : *tl - len + 1; /* end must lie in the new bytes */
        for (size_t end = first_end; end <= *tl; end++)
            if (!memcmp(tail + end - sl, cfg->stop_strings[i], sl)) return true;
    }
    return false;
}

typedef struct pick_ctx {
    hr_sampler *smp;
    gen_state *g;
    const hr_generate_config *cfg;
    const char *logits; /* [b][vocab] of dtype dt */
    hr_dtype dt;
    int64_t vocab, pad;
    const int64_t *eos;
    int n_eos;
    bool masks; /* a processor beyond the sampler's is on */
} pick_ctx;

static bool same_ids(const int64_t *a, const int64_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}

static bool is_eos(const pick_ctx *p, int64_t id) {
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos[i] == id) return true;
    return false;
}

/* transformers' NoRepeatNGram, NoBadWords and MinNewTokensLength
 * processors on row r's f32 logits: -inf on the tokens they forbid. */
static void apply_masks(const pick_ctx *p, int64_t r, float *row) {
    const hr_generate_config *cfg = p->cfg;
    const gen_state *g = p->g;
    const int64_t *toks = g->tokens + r * g->cap, t = g->t;
    int64_t n = cfg->no_repeat_ngram_size;
    if (n > 0 && t + 1 >= n) /* every earlier n-gram whose first n - 1 ids are the last n - 1 */
        for (int64_t i = 0; i + n <= t; i++)
            if (same_ids(toks + i, toks + t - (n - 1), n - 1)) row[toks[i + n - 1]] = -INFINITY;
    const int64_t *w = cfg->bad_words;
    for (int k = 0; k < cfg->n_bad_words; w += cfg->bad_word_lens[k++]) {
        int64_t len = cfg->bad_word_lens[k];
        if (len == 1 && is_eos(p, w[0])) continue;
        if (len - 1 <= t && same_ids(toks + t - (len - 1), w, len - 1)) row[w[len - 1]] = -INFINITY;
    }
    if (t - g->seq < cfg->min_new_tokens)
        for (int i = 0; i < p->n_eos; i++)
            if (p->eos[i] >= 0 && p->eos[i] < p->vocab) row[p->eos[i]] = -INFINITY;
}

/* Row r's next token (pad when it is done) into its slot t. */
static void pick_row(const pick_ctx *p, int64_t r, float *row) {
    gen_state *g = p->g;
    int64_t t = g->t, tok = p->pad;
    const char *lr = p->logits + r * p->vocab * (int64_t)hr_dtype_size(p->dt);
    bool scored = p->cfg->on_step && p->cfg->want_scores;
    if (!g->done[r] && !p->masks && !scored && hr_sampler_is_argmax(p->smp)) {
        tok = hr_sampler_argmax(lr, p->dt, p->vocab);
    } else if (!g->done[r] || scored) {
        /* widened to f32: a bf16 or f16 model's head output holds the values
         * transformers' f32 logits would */
        hr_load_f32(row, lr, p->dt, p->vocab, 1);
        if (scored) memcpy(g->raw + r * p->vocab, row, sizeof(float) * (size_t)p->vocab);
        if (p->masks) apply_masks(p, r, row);
        /* history: the row's real tokens */
        int64_t first = 0;
        while (first < t && !g->mask[r * g->cap + first]) first++;
        const int64_t *hist = g->tokens + r * g->cap + first;
        float *sc = scored ? g->scores + r * p->vocab : NULL;
        if (!g->done[r]) tok = hr_sampler_pick_scored(p->smp, row, hist, t - first, sc);
        else hr_sampler_scores(p->smp, row, hist, t - first, sc); /* transformers scores finished rows too */
    }
    g->tokens[r * g->cap + t] = tok;
}

/* Rows [ith * b / nth, ...) with task ith's row buffer: greedy picking has
 * no shared state (a draw's generator runs row after row instead). */
static void pick_worker(void *arg, int ith, int nth) {
    const pick_ctx *p = arg;
    int64_t lo, hi;
    hr_split_range(p->g->b, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) pick_row(p, r, p->g->row + (int64_t)ith * p->vocab);
}

/* Picks the next token of every row from logits [b, 1, vocab] (f32, or the
 * model's bf16/f16); returns whether any row is still live. */
static hr_status pick_tokens(hr_model *m, const hr_generate_config *cfg, hr_sampler *smp, gen_state *g,
                             const int64_t *eos, int n_eos, int64_t pad, const hr_tensor *logits, bool *live) {
    int64_t b = g->b, t = g->t;
    /* Sampling runs on the host: logits on another device come over first. */
    hr_tensor *host = NULL;
    if (!hr_tensor_data(logits)) HR_TRY(hr_tensor_to(logits, hr_device_cpu(), &host));
    const hr_tensor *lt = host ? host : logits;
    pick_ctx p = {.smp = smp, .g = g, .cfg = cfg, .logits = hr_tensor_data(lt), .dt = hr_tensor_dtype(lt),
                  .vocab = hr_model_vocab_size(m), .pad = pad, .eos = eos, .n_eos = n_eos,
                  .masks = cfg->no_repeat_ngram_size > 0 || cfg->n_bad_words > 0 || cfg->min_new_tokens > 0};
    /* a batch-64 greedy step widens and scans 64 rows of a 152k vocabulary:
     * 1.5% of the step on one thread */
    int tasks = smp->do_sample ? 1 : hr_parallel_threads_for(b * p.vocab, HR_GRAIN_ELTWISE);
    if (tasks > g->nrow) tasks = g->nrow;
    if (tasks > 1)
        hr_parallel_run(pick_worker, &p, tasks);
    else
        for (int64_t r = 0; r < b; r++) pick_row(&p, r, g->row);
    *live = false;
    for (int64_t r = 0; r < b; r++) {
        int64_t tok = g->tokens[r * g->cap + t];
        g->mask[r * g->cap + t] = 1;
        if (g->done[r]) continue;
        size_t len = 0;
        const char *text = cfg->token_text ? cfg->token_text(cfg->ctx, r, tok, &len) : NULL;
        bool stop = cfg->on_token && !cfg->on_token(cfg->ctx, r, tok, text, len);
        for (int i = 0; i < n_eos; i++) stop |= tok == eos[i];
        stop |= hit_stop_string(cfg, g, r, text, len);
        g->done[r] = stop;
        *live |= !stop;
    }
    if (cfg->on_step) {
        for (int64_t r = 0; r < b; r++) g->step[r] = g->tokens[r * g->cap + t];
        bool want = cfg->want_scores;
        if (!cfg->on_step(cfg->ctx, g->step, want ? g->raw : NULL, want ? g->scores : NULL, b, p.vocab))
            *live = false;
    }
    g->t = t + 1;
    hr_tensor_free(host);
    return HR_OK;
}

static hr_status check_args(const hr_model *m, const int64_t *ids, const int64_t *mask, int64_t b, int64_t seq,
                            const hr_generate_config *cfg) {
    if (!m || !ids || !cfg) return hr_error(HR_ERR_INVALID_ARG, "generate: NULL argument");
    if (cfg->max_new_tokens < 1)
        return hr_error(HR_ERR_INVALID_ARG, "generate: max_new_tokens must be >= 1 (got %lld)",
                        (long long)cfg->max_new_tokens);
    if (b < 1 || b > HR_MAX_BATCH)
        return hr_error(HR_ERR_INVALID_ARG, "generate: batch %lld outside 1..%d", (long long)b, HR_MAX_BATCH);
    if (seq < 1) return hr_error(HR_ERR_INVALID_ARG, "generate: the prompt is empty");
    if (mask)
        for (int64_t r = 0; r < b; r++) {
            const int64_t *mr = mask + r * seq;
            if (!mr[seq - 1])
                return hr_error(HR_ERR_INVALID_ARG, "generate: row %lld ends with padding; pad on the left",
                                (long long)r);
            for (int64_t j = 1; j < seq; j++)
                if (mr[j - 1] && !mr[j])
                    return hr_error(HR_ERR_INVALID_ARG, "generate: row %lld has padding after a real token; "
                                    "pad on the left", (long long)r);
        }
    if (cfg->no_repeat_ngram_size < 0 || cfg->min_new_tokens < 0 || cfg->n_bad_words < 0 ||
        (cfg->n_bad_words && (!cfg->bad_words || !cfg->bad_word_lens)))
        return hr_error(HR_ERR_INVALID_ARG, "generate: no_repeat_ngram_size, min_new_tokens and the bad words "
                        "must be >= 0 (and given when counted)");
    const int64_t *w = cfg->bad_words;
    for (int k = 0; k < cfg->n_bad_words; w += cfg->bad_word_lens[k++]) {
        if (cfg->bad_word_lens[k] < 1)
            return hr_error(HR_ERR_INVALID_ARG, "generate: bad_words_ids[%d] is empty", k);
        for (int64_t i = 0; i < cfg->bad_word_lens[k]; i++)
            if (w[i] < 0 || w[i] >= hr_model_vocab_size(m))
                return hr_error(HR_ERR_INVALID_ARG, "generate: bad_words_ids[%d][%lld] = %lld is outside the "
                                "vocabulary (%lld)", k, (long long)i, (long long)w[i],
                                (long long)hr_model_vocab_size(m));
    }
    return HR_OK;
}

hr_status hr_generate(hr_model *m, const int64_t *input_ids, const int64_t *attention_mask, int64_t b,
                      int64_t seq, const hr_generate_config *cfg, int64_t *out_ids, int64_t *out_len,
                      hr_generate_stats *stats) {
    HR_TRY(check_args(m, input_ids, attention_mask, b, seq, cfg));
    const int64_t *eos = cfg->eos_ids;
    int n_eos = cfg->n_eos;
    if (!eos) n_eos = hr_model_eos_ids(m, &eos);
    int64_t pad = cfg->pad_id >= 0 ? cfg->pad_id : hr_model_pad_id(m) >= 0 ? hr_model_pad_id(m) : n_eos ? eos[0] : 0;
    int64_t chunk = cfg->prefill_chunk > 0 ? cfg->prefill_chunk : 512;
    if (chunk > seq) chunk = seq;
    int64_t cap = seq + cfg->max_new_tokens;
    gen_state g;
    hr_sampler smp;
    hr_kv_cache *kv = NULL;
    hr_tensor *logits = NULL;
    memset(&smp, 0, sizeof smp);
    double t0 = now_s(), t1 = t0, c0 = cpu_s(), c1 = c0;
    hr_status st = state_init(&g, b, seq, cap, chunk, hr_model_vocab_size(m), cfg->on_step && cfg->want_scores);
    if (st == HR_OK) st = hr_sampler_init(&smp, cfg, hr_model_vocab_size(m));
    if (st == HR_OK) st = hr_kv_cache_create(m, b, cap, &kv);
    if (st == HR_OK) {
        /* positions count real tokens: cumsum(mask) - 1, padding at 0 */
        for (int64_t r = 0; r < b; r++) {
            int64_t c = 0;
            for (int64_t j = 0; j < seq; j++) {
                int64_t mk = attention_mask ? attention_mask[r * seq + j] != 0 : 1;
                g.tokens[r * cap + j] = input_ids[r * seq + j];
                g.mask[r * cap + j] = mk;
                c += mk;
            }
            g.last_pos[r] = c - 1;
        }
    }
    /* prefill, chunk by chunk; only the last chunk's logits are used */
    for (int64_t from = 0, n = 0; st == HR_OK && from < seq; from += n) {
        n = chunk_len(seq - from, chunk, cfg->compile);
        for (int64_t r = 0; r < b; r++) {
            int64_t c = 0;
            for (int64_t j = 0; j < from; j++) c += g.mask[r * cap + j];
            for (int64_t j = 0; j < n; j++) {
                int64_t mk = g.mask[r * cap + from + j];
                g.pos[r * n + j] = mk ? c : 0;
                c += mk;
            }
        }
        st = forward_span(m, &g, kv, from, n, g.pos, cfg->compile, &logits);
    }
    g.t = seq;
    bool live = true;
    int64_t steps = 0;
    while (st == HR_OK) {
        st = pick_tokens(m, cfg, &smp, &g, eos, n_eos, pad, logits, &live);
        if (st != HR_OK) break;
        if (steps++ == 0) t1 = now_s(), c1 = cpu_s();
        if (!live || steps == cfg->max_new_tokens) break;
        for (int64_t r = 0; r < b; r++) g.pos[r] = ++g.last_pos[r];
        st = forward_span(m, &g, kv, g.t - 1, 1, g.pos, cfg->compile, &logits);
    }
    double t2 = now_s(), c2 = cpu_s();
    if (st == HR_OK) {
        for (int64_t r = 0; r < b; r++)
            memcpy(out_ids + r * cap, g.tokens + r * cap, sizeof(int64_t) * (size_t)cap);
        if (out_len) *out_len = g.t;
        if (stats) {
            stats->prompt_tokens = seq;
            stats->new_tokens = steps;
            stats->prefill_s = t1 - t0;
            stats->decode_s = t2 - t1;
            stats->prefill_cpu_s = c1 - c0;
            stats->decode_cpu_s = c2 - c1;
        }
    }
    hr_tensor_free(logits);
    hr_kv_cache_free(kv);
    hr_sampler_free(&smp);
    state_free(&g);
    return st;
}
