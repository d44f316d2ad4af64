/* The serving engine (engine.h): a request queue, one prefilling request
 * at a time in a scratch cache, and the running rows decoding together. */
#include "serve/engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/iter.h"
#include "generate/sampling.h"
#include "hubrt/dist.h"
#include "serve/mirror.h"

enum { SLOT_FREE, SLOT_RUNNING, SLOT_IDLE };

struct hr_request {
    /* fixed at submit */
    int64_t n_prompt, max_tokens;
    char **stop;
    int n_stop;
    size_t stop_max;
    bool logprobs;
    int top_logprobs;
    /* the engine thread's */
    hr_sampler smp;
    hr_detokenizer *detok;
    int64_t *tokens; /* [n_prompt + max_tokens]: prompt, then the answer */
    int64_t n_tokens;
    char *hold;      /* decoded text held back while it may begin a stop string */
    size_t hold_len, hold_cap;
    int slot;
    hr_request *next; /* queue */
    /* shared under the engine's lock */
    char *out;
    size_t out_len, out_cap;
    hr_token_logprob *lp; /* since the client last took them */
    size_t lp_len, lp_cap;
    int64_t n_answer, prefilled;
    const char *finish;
    hr_status err;
    char errmsg[512];
    bool cancel;
    int refs;
};

typedef struct slot {
    int state;
    hr_request *req;
    int64_t start, n; /* cells [start, start + n) of the row */
    int64_t *ids;     /* [capacity] the tokens those cells hold */
    uint64_t used;    /* when it last ran (for choosing an idle row to give up) */
} slot;

struct hr_engine {
    hr_model *m;
    const hr_tokenizer *tok;
    int64_t B, C, chunk, max_queue, vocab;
    bool compile, reuse, deterministic;
    const int64_t *eos;
    int n_eos;
    int64_t pad;
    hr_kv_cache *kv, *scratch;
    hr_kv_cache **rows; /* [B + 1]: rows[b] the first b rows of kv (eager steps over fewer rows), made when needed */
    bool split;          /* the model is split over ranks: every cache and model call is mirrored (mirror.h) */
    hr_mirror_caches mc; /* kv, scratch and rows, as mirrored commands name them */
    slot *slots;
    int64_t *ids, *pos, *mask; /* step staging: [B], [B], [B, C]; prefill [chunk] in ids/pos of size max(B, chunk) */
    float *row, *row2;         /* [vocab] each */
    hr_tensor *logits, *pre_logits;
    uint64_t clock;
    /* the request being prefilled: its row, and cells done in the scratch */
    hr_request *pre;
    int64_t pre_done;
    pthread_t thread;
    bool thread_started;
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t work, progress;
    hr_request *queue_head, *queue_tail;
    int64_t queued;
    bool stopping;
    double abort_at; /* running requests are aborted after this time once stopping */
    hr_engine_stats st;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- requests ------------------------------------------------------------------ */

static void request_free(hr_request *r) {
    if (!r) return;
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    hr_sampler_free(&r->smp);
    hr_detokenizer_free(r->detok);
    free(r->tokens);
    free(r->hold);
    free(r->out);
    free(r->lp);
    free(r);
}

static void release_locked(hr_request *r) {
    if (--r->refs == 0) request_free(r);
}

void hr_request_release(hr_engine *e, hr_request *r) {
    if (!r) return;
    pthread_mutex_lock(&e->mu);
    r->cancel = true;
    release_locked(r);
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

void hr_request_cancel(hr_engine *e, hr_request *r) {
    pthread_mutex_lock(&e->mu);
    r->cancel = true;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

static bool grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *p = realloc(*buf, c);
    if (!p) return false;
    *buf = p;
    *cap = c;
    return true;
}

/* Text for the client (under mu). */
static void publish_locked(hr_request *r, const char *text, size_t len) {
    if (!len) return;
    if (!grow(&r->out, &r->out_cap, r->out_len + len + 1)) {
        if (!r->finish) r->err = HR_ERR_OOM, snprintf(r->errmsg, sizeof r->errmsg, "serve: out of memory");
        return;
    }
    memcpy(r->out + r->out_len, text, len);
    r->out_len += len;
}

hr_status hr_request_poll(hr_engine *e, hr_request *r, int timeout_ms, char **text, size_t *len,
                          const char **finish) {
    *text = NULL;
    *len = 0;
    *finish = NULL;
    pthread_mutex_lock(&e->mu);
    if (!r->out_len && !r->finish && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        while (!r->out_len && !r->finish)
            if (pthread_cond_timedwait(&e->progress, &e->mu, &ts) == ETIMEDOUT) break;
    }
    hr_status s = HR_OK;
    if (r->out_len) {
        *text = r->out;
        *len = r->out_len;
        r->out = NULL;
        r->out_len = r->out_cap = 0;
    }
    if (r->finish) *finish = r->finish;
    if (r->err != HR_OK) s = hr_error(r->err, "%s", r->errmsg);
    pthread_mutex_unlock(&e->mu);
    return s;
}

void hr_request_take_logprobs(hr_engine *e, hr_request *r, hr_token_logprob **lp, size_t *n) {
    pthread_mutex_lock(&e->mu);
    *lp = r->lp;
    *n = r->lp_len;
    r->lp = NULL;
    r->lp_len = r->lp_cap = 0;
    pthread_mutex_unlock(&e->mu);
}

void hr_request_counts(hr_engine *e, const hr_request *r, int64_t *prompt, int64_t *completion,
                       int64_t *prefilled) {
    pthread_mutex_lock(&e->mu);
    *prompt = r->n_prompt;
    *completion = r->n_answer;
    *prefilled = r->prefilled;
    pthread_mutex_unlock(&e->mu);
}

hr_status hr_engine_submit(hr_engine *e, const int64_t *ids, int64_t n, const hr_request_params *p,
                           hr_request **out) {
    *out = NULL;
    if (n < 1) return hr_error(HR_ERR_INVALID_ARG, "the prompt is empty");
    if (n >= e->C)
        return hr_error(HR_ERR_INVALID_ARG, "the prompt has %lld tokens; this server's rows hold %lld (prompt and "
                        "answer)", (long long)n, (long long)e->C);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= e->vocab)
            return hr_error(HR_ERR_INVALID_ARG, "prompt token %lld is %lld, outside the vocabulary (%lld)",
                            (long long)i, (long long)ids[i], (long long)e->vocab);
    if (p->max_tokens < 0) return hr_error(HR_ERR_INVALID_ARG, "max_tokens must be >= 1");
    if (p->top_logprobs < 0 || p->top_logprobs > HR_MAX_TOP_LOGPROBS)
        return hr_error(HR_ERR_INVALID_ARG, "top_logprobs must lie in [0, %d]", HR_MAX_TOP_LOGPROBS);
    hr_request *r = calloc(1, sizeof *r);
    if (!r) return hr_error(HR_ERR_OOM, "serve: out of memory");
    r->n_prompt = n;
    r->logprobs = p->logprobs || p->top_logprobs > 0;
    r->top_logprobs = p->top_logprobs;
    /* the last answer token is never fed back: prompt + answer - 1 cells */
    int64_t room = e->C - n + 1;
    r->max_tokens = p->max_tokens && p->max_tokens < room ? p->max_tokens : room;
    r->tokens = malloc(sizeof(int64_t) * (size_t)(n + r->max_tokens));
    r->stop = p->n_stop ? calloc((size_t)p->n_stop, sizeof(char *)) : NULL;
    hr_status s = r->tokens && (r->stop || !p->n_stop) ? HR_OK : hr_error(HR_ERR_OOM, "serve: out of memory");
    for (int i = 0; s == HR_OK && i < p->n_stop; i++) {
        if (!(r->stop[i] = strdup(p->stop[i]))) s = hr_error(HR_ERR_OOM, "serve: out of memory");
        r->n_stop = i + 1;
        size_t sl = strlen(p->stop[i]);
        if (sl > r->stop_max) r->stop_max = sl;
    }
    if (s == HR_OK) {
        hr_generate_config cfg;
        hr_generate_config_init(&cfg);
        cfg.do_sample = p->do_sample;
        cfg.temperature = p->temperature;
        cfg.top_p = p->top_p;
        cfg.top_k = p->top_k;
        cfg.min_p = p->min_p;
        cfg.repetition_penalty = p->repetition_penalty;
        cfg.seed = p->seed;
        s = hr_sampler_init(&r->smp, &cfg, e->vocab);
    }
    if (s == HR_OK) s = hr_detokenizer_init(e->tok, !p->keep_special, &r->detok);
    if (s != HR_OK) {
        request_free(r);
        return s;
    }
    memcpy(r->tokens, ids, sizeof(int64_t) * (size_t)n);
    r->n_tokens = n;
    r->slot = -1;
    r->refs = 2;
    pthread_mutex_lock(&e->mu);
    if (e->stopping || e->queued >= e->max_queue) {
        e->st.rejected++;
        bool stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return hr_error(HR_ERR_UNSUPPORTED, stopping ? "the server is shutting down"
                                                     : "the queue is full (%lld requests waiting)",
                        (long long)e->max_queue);
    }
    if (e->queue_tail) e->queue_tail->next = r;
    else e->queue_head = r;
    e->queue_tail = r;
    e->queued++;
    e->st.queued = e->queued;
    e->st.requests++;
    e->st.prompt_tokens += n;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return HR_OK;
}

/* ---- the engine thread: ending requests ----------------------------------------- */

/* The earliest place in the held text where a stop string begins. */
static bool ends_with_stop(const hr_request *r, size_t *at) {
    bool found = false;
    for (int i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t j = 0; sl && j + sl <= r->hold_len && (!found || j < *at); j++)
            if (!memcmp(r->hold + j, r->stop[i], sl)) {
                *at = j;
                found = true;
                break;
            }
    }
    return found;
}

/* Ends r (under mu): the held text goes out, cut at a stop string. */
static void finish_locked(hr_engine *e, hr_request *r, const char *reason) {
    if (r->finish) return;
    size_t at = r->hold_len;
    if (ends_with_stop(r, &at)) reason = "stop";
    publish_locked(r, r->hold, at);
    r->hold_len = 0;
    r->finish = reason;
    pthread_cond_broadcast(&e->progress);
    release_locked(r);
}

static void fail_locked(hr_engine *e, hr_request *r, hr_status s) {
    r->err = s;
    snprintf(r->errmsg, sizeof r->errmsg, "%s", hr_last_error());
    finish_locked(e, r, "abort");
}

/* Decoded text into the hold; what cannot begin a stop string goes out.
 * Returns true when a stop string is complete. */
static bool emit_text_locked(hr_engine *e, hr_request *r, const char *text, size_t len) {
    if (len && !grow(&r->hold, &r->hold_cap, r->hold_len + len + 1)) {
        r->err = HR_ERR_OOM;
        snprintf(r->errmsg, sizeof r->errmsg, "serve: out of memory");
        return true;
    }
    memcpy(r->hold + r->hold_len, text, len);
    r->hold_len += len;
    size_t at = 0;
    if (r->n_stop && ends_with_stop(r, &at)) return true;
    size_t keep = r->n_stop ? r->stop_max - 1 : 0;
    if (r->hold_len > keep) {
        size_t out = r->hold_len - keep;
        /* whole characters only: each piece goes out as its own JSON string */
        while (out && out < r->hold_len && ((unsigned char)r->hold[out] & 0xC0) == 0x80) out--;
        publish_locked(r, r->hold, out);
        memmove(r->hold, r->hold + out, r->hold_len - out); /* keep bytes, or more when a character was cut */
        r->hold_len -= out;
        pthread_cond_broadcast(&e->progress);
    }
    return false;
}

static bool is_eos(const hr_engine *e, int64_t id) {
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == id) return true;
    return false;
}

/* log-softmax of the row (f32, in double sums) at the chosen token and the
 * k largest, ties to the lower id as torch.topk does on CPU. */
static void logprobs_of(const float *row, int64_t vocab, int64_t tok, int k, hr_token_logprob *out) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < vocab; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) sum += exp((double)row[i] - mx);
    float lse = (float)(mx + log(sum));
    out->id = tok;
    out->logprob = row[tok] - lse;
    out->n_top = 0;
    for (int64_t i = 0; k > 0 && i < vocab; i++) { /* insertion into the k best so far */
        int n = out->n_top;
        if (n == k && !(row[i] > row[out->top_id[k - 1]])) continue;
        int at = n < k ? n : k - 1;
        while (at > 0 && row[i] > row[out->top_id[at - 1]]) {
            out->top_id[at] = out->top_id[at - 1];
            at--;
        }
        out->top_id[at] = i;
        if (n < k) out->n_top++;
    }
    for (int j = 0; j < out->n_top; j++) out->top_logprob[j] = row[out->top_id[j]] - lse;
}

/* Row `row` of logits [*, 1, vocab]: r's next token, its log-probabilities
 * into *lp when r asks for them. */
static int64_t pick(hr_engine *e, hr_request *r, const hr_tensor *logits, int64_t row, hr_token_logprob *lp) {
    hr_dtype dt = hr_tensor_dtype(logits);
    const char *lr = (const char *)hr_tensor_data(logits) + row * e->vocab * (int64_t)hr_dtype_size(dt);
    if (!r->logprobs && hr_sampler_is_argmax(&r->smp)) return hr_sampler_argmax(lr, dt, e->vocab);
    hr_load_f32(e->row, lr, dt, e->vocab, 1);
    if (!r->logprobs) return hr_sampler_pick(&r->smp, e->row, r->tokens, r->n_tokens);
    memcpy(e->row2, e->row, sizeof(float) * (size_t)e->vocab);
    int64_t tok = hr_sampler_pick(&r->smp, e->row, r->tokens, r->n_tokens);
    logprobs_of(e->row2, e->vocab, tok, r->top_logprobs, lp);
    return tok;
}

static void publish_logprob_locked(hr_request *r, const hr_token_logprob *lp) {
    if (r->lp_len == r->lp_cap) {
        size_t cap = r->lp_cap ? r->lp_cap * 2 : 16;
        hr_token_logprob *p = realloc(r->lp, cap * sizeof *p);
        if (!p) return; /* the text still goes out; its log-probabilities are lost */
        r->lp = p;
        r->lp_cap = cap;
    }
    r->lp[r->lp_len++] = *lp;
}

/* r's new token: into its tokens, its text out; false when r has ended. */
static bool take_token(hr_engine *e, hr_request *r, int64_t tok, const hr_token_logprob *lp) {
    const char *text = NULL;
    size_t len = 0;
    hr_status s = is_eos(e, tok) ? HR_OK : hr_detokenizer_push(r->detok, (int32_t)tok, &text, &len);
    if (s == HR_ERR_NOT_FOUND) { /* an id of the model's padded vocabulary the tokenizer lacks: no text */
        s = HR_OK;
        text = NULL;
        len = 0;
    }
    r->tokens[r->n_tokens++] = tok;
    pthread_mutex_lock(&e->mu);
    if (r->logprobs) publish_logprob_locked(r, lp);
    r->n_answer++;
    e->st.generated_tokens++;
    const char *reason = NULL;
    if (s != HR_OK) reason = "error";
    else if (is_eos(e, tok) || emit_text_locked(e, r, text, len)) reason = "stop";
    else if (r->cancel) reason = "abort";
    else if (r->n_answer >= r->max_tokens) reason = "length";
    if (reason && s == HR_OK && (s = hr_detokenizer_flush(r->detok, &text, &len)) == HR_OK)
        emit_text_locked(e, r, text, len); /* bytes of an unfinished character */
    if (s != HR_OK) fail_locked(e, r, s);
    else if (reason) finish_locked(e, r, reason);
    bool ended = reason != NULL;
    pthread_mutex_unlock(&e->mu);
    return !ended;
}

/* ---- the engine thread: rows ----------------------------------------------------- */

static int64_t common_prefix(const int64_t *a, int64_t na, const int64_t *b, int64_t nb) {
    int64_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* The row for r and how many of its prompt tokens that row already holds:
 * the idle row sharing the longest prefix, else a free row, else the idle
 * row used longest ago; -1 when every row runs. */
static int choose_slot(hr_engine *e, const hr_request *r, int64_t *reuse) {
    int best = -1, free_row = -1, oldest = -1;
    int64_t best_k = 0;
    for (int i = 0; i < e->B; i++) {
        slot *s = &e->slots[i];
        if (s->state == SLOT_FREE && free_row < 0) free_row = i;
        if (s->state != SLOT_IDLE) continue;
        if (oldest < 0 || s->used < e->slots[oldest].used) oldest = i;
        int64_t k = e->reuse ? common_prefix(s->ids, s->n, r->tokens, r->n_prompt) : 0;
        if (k > r->n_prompt - 1) k = r->n_prompt - 1; /* one token at least runs, for its logits */
        if (k > best_k) best = i, best_k = k;
    }
    *reuse = best >= 0 ? best_k : 0;
    return best >= 0 ? best : free_row >= 0 ? free_row : oldest;
}

/* A cache or model call, made here and, for a split model, first sent to
 * the other ranks, which make it on their caches (mirror.h). */
static hr_status engine_call(hr_engine *e, const hr_mirror_cmd *c, hr_tensor **logits) {
    if (e->split) HR_TRY(hr_mirror_send(c));
    return hr_mirror_apply(&e->mc, c, logits);
}

static hr_status cache_set_len(hr_engine *e, int64_t cache, int64_t len) {
    return engine_call(e, &(hr_mirror_cmd){.op = HR_MIR_SET_LEN, .cache = cache, .a = len}, NULL);
}

static hr_status cache_copy(hr_engine *e, int64_t dst, int64_t dst_row, int64_t dst_at, int64_t src, int64_t src_row,
                            int64_t src_at, int64_t n) {
    hr_mirror_cmd c = {.op = HR_MIR_COPY, .cache = dst, .a = dst_row, .b = dst_at, .c = src, .d = src_row, .e = src_at,
                       .f = n};
    return engine_call(e, &c, NULL);
}

/* A model step on cache `cache`; mask_cols: the columns of a->mask. */
static hr_status engine_step(hr_engine *e, int64_t cache, const hr_step_args *a, int64_t mask_cols,
                             hr_tensor **logits) {
    hr_mirror_cmd c = {.op = HR_MIR_STEP, .cache = cache, .batch = a->batch, .seq = a->seq, .ids = a->ids,
                       .pos = a->pos, .mask = a->mask, .mask_cols = a->mask ? mask_cols : 0,
                       .compiled = a->compiled, .batch_invariant = a->batch_invariant};
    return engine_call(e, &c, logits);
}

static void slot_clear(slot *s) {
    s->state = SLOT_FREE;
    s->req = NULL;
    s->start = s->n = 0;
}

/* Shifts every row's cells by delta; idle rows pushed off the start are
 * given up. */
static hr_status shift_rows(hr_engine *e, int64_t delta) {
    HR_TRY(engine_call(e, &(hr_mirror_cmd){.op = HR_MIR_SHIFT, .cache = HR_MIR_KV, .a = delta}, NULL));
    for (int i = 0; i < e->B; i++) {
        slot *s = &e->slots[i];
        if (s->state == SLOT_FREE) continue;
        if (s->start + delta < 0) slot_clear(s);
        else s->start += delta;
    }
    pthread_mutex_lock(&e->mu);
    e->st.shifts++;
    pthread_mutex_unlock(&e->mu);
    return HR_OK;
}

/* Takes the next queued request into the scratch cache (copying the cells
 * its row already holds). */
static hr_status start_prefill(hr_engine *e, hr_request *r) {
    int64_t k = 0;
    int i = choose_slot(e, r, &k);
    slot *s = &e->slots[i];
    e->pre = r; /* from here on a failure ends it through fail_all_locked */
    r->slot = i;
    if (s->state == SLOT_IDLE && !k) slot_clear(s);
    s->state = SLOT_RUNNING; /* reserved: not chosen again, not decoded until placed */
    s->req = NULL;
    HR_TRY(engine_call(e, &(hr_mirror_cmd){.op = HR_MIR_RESET, .cache = HR_MIR_SCRATCH}, NULL));
    if (k) HR_TRY(cache_copy(e, HR_MIR_SCRATCH, 0, 0, HR_MIR_KV, i, s->start, k));
    HR_TRY(cache_set_len(e, HR_MIR_SCRATCH, k));
    e->pre_done = k;
    pthread_mutex_lock(&e->mu);
    r->prefilled = r->n_prompt - k;
    e->st.reused_tokens += k;
    pthread_mutex_unlock(&e->mu);
    return HR_OK;
}

/* The prefilled prompt moves into its row, ending at the write index. */
static hr_status place(hr_engine *e, hr_request *r) {
    int64_t p = r->n_prompt, L = hr_kv_cache_len(e->kv);
    slot *s = &e->slots[r->slot];
    s->state = SLOT_FREE; /* its old cells are not kept through a shift */
    if (L < p) {
        bool any = false;
        for (int i = 0; i < e->B; i++) any |= e->slots[i].state != SLOT_FREE;
        if (any) HR_TRY(shift_rows(e, p - L));
        else HR_TRY(cache_set_len(e, HR_MIR_KV, p));
        L = p;
    }
    HR_TRY(cache_copy(e, HR_MIR_KV, r->slot, L - p, HR_MIR_SCRATCH, 0, 0, p));
    s->state = SLOT_RUNNING;
    s->req = r;
    s->start = L - p;
    s->n = p;
    s->used = ++e->clock;
    memcpy(s->ids, r->tokens, sizeof(int64_t) * (size_t)p);
    return HR_OK;
}

/* A row whose request ended keeps its cells (idle) for a later turn. */
static void row_done(hr_engine *e, slot *s) {
    s->req = NULL;
    s->state = e->reuse ? SLOT_IDLE : SLOT_FREE;
    s->used = ++e->clock;
}

/* One chunk of the prefilling request; when its prompt is done, the row
 * joins the batch with its first token. */
static hr_status prefill_step(hr_engine *e) {
    hr_request *r = e->pre;
    int64_t n = r->n_prompt - e->pre_done;
    if (n > e->chunk) n = e->chunk;
    if (e->compile) { /* power-of-two chunks: one compiled shape each */
        int64_t q = 1;
        while (q * 2 <= n) q *= 2;
        n = q;
    }
    for (int64_t j = 0; j < n; j++) {
        e->ids[j] = r->tokens[e->pre_done + j];
        e->pos[j] = e->pre_done + j;
    }
    hr_step_args a = {.ids = e->ids, .pos = e->pos, .batch = 1, .seq = n, .cache = e->scratch,
                      .compiled = e->compile};
    HR_TRY(engine_step(e, HR_MIR_SCRATCH, &a, 0, &e->pre_logits));
    e->pre_done += n;
    pthread_mutex_lock(&e->mu);
    e->st.prefill_tokens += n;
    pthread_mutex_unlock(&e->mu);
    if (e->pre_done < r->n_prompt) return HR_OK;
    HR_TRY(place(e, r));
    e->pre = NULL;
    slot *s = &e->slots[r->slot];
    hr_tensor *host = NULL;
    if (!hr_tensor_data(e->pre_logits)) HR_TRY(hr_tensor_to(e->pre_logits, hr_device_cpu(), &host));
    hr_token_logprob lp;
    int64_t tok = pick(e, r, host ? host : e->pre_logits, 0, &lp);
    hr_tensor_free(host);
    if (!take_token(e, r, tok, &lp)) row_done(e, s);
    return HR_OK;
}

/* One decode step of every running row. */
static hr_status decode_step(hr_engine *e) {
    int64_t L = hr_kv_cache_len(e->kv);
    if (L == e->C) { /* full: drop the cells before the oldest running row */
        int64_t d = e->C;
        for (int i = 0; i < e->B; i++)
            if (e->slots[i].state == SLOT_RUNNING && e->slots[i].req && e->slots[i].start < d) d = e->slots[i].start;
        if (d <= 0) return hr_error(HR_ERR_INTERNAL, "serve: a running row fills the cache");
        HR_TRY(shift_rows(e, -d));
        L -= d;
    }
    /* an eager step runs the rows up to the last running one: a lone
     * request decodes at batch 1, not at the server's batch */
    int64_t t = L + 1, rows = 0, b = e->B;
    if (!e->compile && !e->deterministic) { /* a batch-invariant step keeps the batch size */
        b = 0;
        for (int i = 0; i < e->B; i++)
            if (e->slots[i].state == SLOT_RUNNING && e->slots[i].req) b = i + 1;
    }
    hr_kv_cache *kv = e->kv;
    int64_t kv_id = HR_MIR_KV;
    if (b < e->B) {
        kv_id = HR_MIR_ROWS + b; /* made on first use (mirror.c) */
        HR_TRY(cache_set_len(e, kv_id, L));
        kv = e->rows[b];
    }
    memset(e->mask, 0, sizeof(int64_t) * (size_t)(b * t));
    for (int i = 0; i < b; i++) {
        slot *s = &e->slots[i];
        bool run = s->state == SLOT_RUNNING && s->req;
        e->ids[i] = run ? s->req->tokens[s->req->n_tokens - 1] : e->pad;
        e->pos[i] = run ? s->n : 0;
        if (run) {
            for (int64_t j = s->start; j < t; j++) e->mask[i * t + j] = 1;
            rows++;
        }
    }
    hr_step_args a = {.ids = e->ids, .pos = e->pos, .mask = e->mask, .batch = b, .seq = 1, .cache = kv,
                      .compiled = e->compile, .batch_invariant = e->deterministic};
    HR_TRY(engine_step(e, kv_id, &a, t, &e->logits));
    if (kv != e->kv) HR_TRY(cache_set_len(e, HR_MIR_KV, L + 1));
    hr_tensor *host = NULL;
    if (!hr_tensor_data(e->logits)) HR_TRY(hr_tensor_to(e->logits, hr_device_cpu(), &host));
    const hr_tensor *lg = host ? host : e->logits;
    for (int i = 0; i < b; i++) {
        slot *s = &e->slots[i];
        if (s->state != SLOT_RUNNING || !s->req) continue;
        hr_request *r = s->req;
        s->ids[s->n++] = r->tokens[r->n_tokens - 1];
        s->used = ++e->clock;
        hr_token_logprob lp;
        int64_t tok = pick(e, r, lg, i, &lp);
        if (!take_token(e, r, tok, &lp)) row_done(e, s);
    }
    hr_tensor_free(host);
    pthread_mutex_lock(&e->mu);
    e->st.decode_steps++;
    e->st.decode_rows += rows;
    pthread_mutex_unlock(&e->mu);
    return HR_OK;
}

static bool any_running(const hr_engine *e) {
    for (int i = 0; i < e->B; i++)
        if (e->slots[i].state == SLOT_RUNNING && e->slots[i].req) return true;
    return false;
}

static bool row_available(const hr_engine *e) {
    for (int i = 0; i < e->B; i++)
        if (e->slots[i].state != SLOT_RUNNING) return true;
    return false;
}

/* Ends the requests their clients cancelled, and all of them once the
 * shutdown's grace is over (under mu). */
static void reap_locked(hr_engine *e) {
    bool abort_all = e->stopping && now_s() >= e->abort_at;
    for (int i = 0; i < e->B; i++) {
        slot *s = &e->slots[i];
        if (s->state == SLOT_RUNNING && s->req && (s->req->cancel || abort_all)) {
            finish_locked(e, s->req, "abort");
            s->req = NULL;
            s->state = e->reuse ? SLOT_IDLE : SLOT_FREE;
        }
    }
    if (e->pre && (e->pre->cancel || abort_all)) {
        slot_clear(&e->slots[e->pre->slot]);
        finish_locked(e, e->pre, "abort");
        e->pre = NULL;
    }
    for (hr_request **pp = &e->queue_head; *pp;) {
        hr_request *r = *pp;
        if (r->cancel || e->stopping) {
            *pp = r->next;
            e->queued--;
            e->st.queued = e->queued;
            finish_locked(e, r, "abort");
        } else pp = &r->next;
    }
    e->queue_tail = NULL;
    for (hr_request *r = e->queue_head; r; r = r->next) e->queue_tail = r;
}

static void fail_all_locked(hr_engine *e, hr_status s) {
    for (int i = 0; i < e->B; i++) {
        slot *sl = &e->slots[i];
        if (sl->state == SLOT_RUNNING && sl->req) fail_locked(e, sl->req, s);
        slot_clear(sl);
    }
    if (e->pre) fail_locked(e, e->pre, s);
    e->pre = NULL;
    /* a failed mirrored call has ended every rank already (mirror.c) */
    engine_call(e, &(hr_mirror_cmd){.op = HR_MIR_RESET, .cache = HR_MIR_KV}, NULL);
}

static void *engine_main(void *arg) {
    hr_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        reap_locked(e);
        bool running = any_running(e);
        e->st.running = 0; /* (the gauge: rows reaped here too) */
        for (int i = 0; i < e->B; i++) e->st.running += e->slots[i].state == SLOT_RUNNING && e->slots[i].req;
        if (e->stopping && !running && !e->pre && !e->queue_head) break;
        if (!running && !e->pre && (!e->queue_head || !row_available(e))) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000L; /* wake to honour the shutdown's deadline */
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&e->work, &e->mu, &ts);
            continue;
        }
        hr_request *next = NULL;
        if (!e->pre && e->queue_head && row_available(e)) {
            next = e->queue_head;
            e->queue_head = next->next;
            if (!e->queue_head) e->queue_tail = NULL;
            e->queued--;
            e->st.queued = e->queued;
        }
        pthread_mutex_unlock(&e->mu);
        hr_status s = HR_OK;
        if (next) s = start_prefill(e, next);
        if (s == HR_OK && e->pre) s = prefill_step(e);
        if (s == HR_OK && any_running(e)) s = decode_step(e);
        pthread_mutex_lock(&e->mu);
        if (s != HR_OK) fail_all_locked(e, s);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- the engine ------------------------------------------------------------------ */

/* The cache's rows and cells the options give for m. */
static void engine_dims(const hr_model *m, const hr_engine_options *o, int64_t *B, int64_t *C) {
    *B = o && o->slots > 0 ? o->slots : 8;
    int64_t maxpos = hr_model_max_positions(m);
    *C = o && o->capacity > 0 ? o->capacity : maxpos > 0 && maxpos < 4096 ? maxpos : 4096;
}

hr_status hr_engine_follow(hr_model *m, const hr_engine_options *o) {
    int64_t B, C;
    engine_dims(m, o, &B, &C);
    return hr_mirror_follow(m, B, C);
}

hr_status hr_engine_create(hr_model *m, const hr_tokenizer *tok, const hr_engine_options *o, hr_engine **out) {
    *out = NULL;
    hr_engine *e = calloc(1, sizeof *e);
    if (!e) return hr_error(HR_ERR_OOM, "serve: out of memory");
    e->m = m;
    e->tok = tok;
    engine_dims(m, o, &e->B, &e->C);
    e->chunk = o && o->prefill_chunk > 0 ? o->prefill_chunk : 256;
    e->max_queue = o && o->max_queue > 0 ? o->max_queue : 64;
    e->compile = o && o->compile;
    e->deterministic = o && o->deterministic;
    e->vocab = hr_model_vocab_size(m);
    e->n_eos = hr_model_eos_ids(m, &e->eos);
    e->pad = hr_model_pad_id(m) >= 0 ? hr_model_pad_id(m) : e->n_eos ? e->eos[0] : 0;
    e->st.slots = e->B;
    e->st.capacity = e->C;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->progress, NULL);
    hr_status s = HR_OK;
    if (e->B > 256 || e->C < 2)
        s = hr_error(HR_ERR_INVALID_ARG, "serve: %lld rows of %lld tokens (rows 1..256, tokens >= 2)",
                     (long long)e->B, (long long)e->C);
    e->split = hr_model_group_size(m) > 1;
    if (s == HR_OK && e->split && hr_dist_rank() != 0)
        s = hr_error(HR_ERR_INVALID_ARG, "serve: rank %d of a split model follows rank 0 (hr_engine_follow); only "
                     "rank 0 runs the engine", hr_dist_rank());
    if (s == HR_OK) s = hr_kv_cache_create(m, e->B, e->C, &e->kv);
    if (s == HR_OK) s = hr_kv_cache_create(m, 1, e->C, &e->scratch);
    e->reuse = !(o && o->no_prefix_reuse) && !e->deterministic && !hr_kv_cache_ring_wraps(e->kv);
    if (s == HR_OK && e->deterministic && e->compile)
        s = hr_error(HR_ERR_INVALID_ARG, "serve: --deterministic runs eager steps; it cannot be combined with --compile");
    int64_t stage = e->B > e->chunk ? e->B : e->chunk;
    if (s == HR_OK) {
        e->slots = calloc((size_t)e->B, sizeof *e->slots);
        e->rows = calloc((size_t)e->B + 1, sizeof *e->rows);
        e->ids = malloc(sizeof(int64_t) * (size_t)stage);
        e->pos = malloc(sizeof(int64_t) * (size_t)stage);
        e->mask = malloc(sizeof(int64_t) * (size_t)(e->B * e->C));
        e->row = malloc(sizeof(float) * (size_t)e->vocab);
        e->row2 = malloc(sizeof(float) * (size_t)e->vocab);
        if (!e->slots || !e->rows || !e->ids || !e->pos || !e->mask || !e->row || !e->row2) s = hr_error(HR_ERR_OOM, "serve: out of memory");
    }
    for (int64_t i = 0; s == HR_OK && i < e->B; i++)
        if (!(e->slots[i].ids = malloc(sizeof(int64_t) * (size_t)e->C))) s = hr_error(HR_ERR_OOM, "serve: out of memory");
    e->mc = (hr_mirror_caches){.m = m, .kv = e->kv, .scratch = e->scratch, .rows = e->rows, .B = e->B};
    if (s == HR_OK) {
        if (pthread_create(&e->thread, NULL, engine_main, e))
            s = hr_error(HR_ERR_INTERNAL, "serve: cannot start the engine thread");
        else e->thread_started = true;
    }
    if (s != HR_OK) {
        hr_engine_free(e);
        return s;
    }
    *out = e;
    return HR_OK;
}

void hr_engine_shutdown(hr_engine *e, double grace_s) {
    if (!e || !e->thread_started) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    e->abort_at = now_s() + grace_s;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_started = false;
}

void hr_engine_free(hr_engine *e) {
    if (!e) return;
    hr_engine_shutdown(e, 0);
    if (e->split && e->kv) hr_mirror_send(&(hr_mirror_cmd){.op = HR_MIR_STOP}); /* the followers return */
    for (int64_t i = 0; e->slots && i < e->B; i++) free(e->slots[i].ids);
    free(e->slots);
    for (int64_t b = 0; e->rows && b <= e->B; b++) hr_kv_cache_free(e->rows[b]);
    free(e->rows);
    free(e->ids);
    free(e->pos);
    free(e->mask);
    free(e->row);
    free(e->row2);
    hr_tensor_free(e->logits);
    hr_tensor_free(e->pre_logits);
    hr_kv_cache_free(e->kv);
    hr_kv_cache_free(e->scratch);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->progress);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int64_t hr_engine_capacity(const hr_engine *e) { return e->C; }

void hr_engine_get_stats(hr_engine *e, hr_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->st;
    pthread_mutex_unlock(&e->mu);
}
