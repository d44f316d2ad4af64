/* Encoding through the pipeline (ids, and offsets when asked for), the
 * workspace pool, and batch encoding on threads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenizer/tk_internal.h"

/* ---- workspaces ---------------------------------------------------------------- */

void tk_ws_clear(tk_ws *ws) {
    tk_pieces_free(&ws->pa);
    tk_pieces_free(&ws->pb);
    tk_buf_free(&ws->t1);
    tk_buf_free(&ws->t2);
    tk_buf_free(&ws->t3);
    tk_aligns_free(&ws->a1);
    tk_aligns_free(&ws->a2);
    tk_aligns_free(&ws->a3);
    free(ws->spans.v);
    memset(&ws->spans, 0, sizeof ws->spans);
    tk_ids_free(&ws->ids);
    tk_ids_free(&ws->offs);
}

hr_status tk_ws_acquire(hr_tokenizer *tok, tk_ws **out) {
    pthread_mutex_lock(tok->pool_lock);
    tk_ws *ws = tok->pool;
    if (ws) tok->pool = ws->next;
    pthread_mutex_unlock(tok->pool_lock);
    if (!ws && !(ws = calloc(1, sizeof *ws))) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    *out = ws;
    return HR_OK;
}

/* Bytes a workspace holds beyond its bounded caches. */
static size_t ws_held(const tk_ws *ws) {
    return ws->pa.text.cap + ws->pb.text.cap + (ws->pa.al.cap + ws->pb.al.cap) * sizeof(tk_align) +
           (ws->pa.cap + ws->pb.cap) * sizeof(tk_piece) + ws->t1.cap + ws->t2.cap + ws->t3.cap +
           (ws->a1.cap + ws->a2.cap + ws->a3.cap) * sizeof(tk_align) + (ws->ids.cap + ws->offs.cap) * sizeof(int32_t);
}

/* A workspace that grew for a huge text gives its memory back before it is
 * pooled, so one long document does not pin gigabytes per thread. */
#define WS_KEEP_BYTES (32u << 20)

void tk_ws_release(hr_tokenizer *tok, tk_ws *ws) {
    if (ws_held(ws) > WS_KEEP_BYTES) {
        tk_ws_clear(ws);
        tk_model_scratch_free(tok->model, ws->model_scratch);
        ws->model_scratch = NULL;
    }
    pthread_mutex_lock(tok->pool_lock);
    ws->next = tok->pool;
    tok->pool = ws;
    pthread_mutex_unlock(tok->pool_lock);
}

void tk_ws_pool_free(hr_tokenizer *tok) {
    while (tok->pool) {
        tk_ws *ws = tok->pool;
        tok->pool = ws->next;
        tk_model_scratch_free(tok->model, ws->model_scratch);
        tk_ws_clear(ws);
        free(ws);
    }
}

/* ---- encode ---------------------------------------------------------------------- */

/* Each byte of the input is aligned with its whole character, as
 * tokenizers' NormalizedString starts. */
static hr_status input_alignments(const char *text, size_t len, tk_aligns *al) {
    al->n = 0;
    HR_TRY(tk_aligns_fill(al, (tk_align){0, 0}, len + 1));
    for (size_t i = 0; i < len;) {
        size_t k = 1;
        while (i + k < len && ((unsigned char)text[i + k] & 0xC0) == 0x80) k++;
        for (size_t q = 0; q < k; q++) al->p[i + q] = (tk_align){(uint32_t)i, (uint32_t)(i + k)};
        i += k;
    }
    return HR_OK;
}

static hr_status encode_pieces(const hr_tokenizer *tok, const char *text, size_t len, bool track, tk_ws *ws) {
    tk_pieces *raw = &ws->pa, *norm = &ws->pb;
    tk_pieces_reset(raw, track);
    tk_pieces_reset(norm, track);
    if (track) HR_TRY(input_alignments(text, len, &ws->a1));
    HR_TRY(tk_added_split(tok->added, false, text, track ? ws->a1.p : NULL, len, true, raw));
    for (size_t i = 0; i < raw->n; i++) {
        const tk_piece *pc = &raw->v[i];
        const char *s = raw->text.p + pc->off;
        const tk_align *al = tk_pieces_al(raw, pc->off);
        if (pc->id >= 0) {
            HR_TRY(tk_pieces_add(norm, s, al, pc->len, pc->id, pc->first));
            continue;
        }
        size_t n = pc->len;
        if (tok->normalizer) {
            HR_TRY(tk_normalize(tok->normalizer, s, al, n, &ws->t3, track ? &ws->a3 : NULL, ws));
            s = ws->t3.p;
            al = track ? ws->a3.p : NULL;
            n = ws->t3.n;
        }
        HR_TRY(tk_added_split(tok->added, true, s, al, n, pc->first, norm));
    }
    if (!tok->pretok) {
        tk_pieces t = ws->pa;
        ws->pa = ws->pb;
        ws->pb = t;
        return HR_OK;
    }
    return tk_pretokenize(tok->pretok, norm, raw, ws);
}

/* Model tokens of every piece into ws->ids; with `offsets`, their original
 * byte ranges into ws->offs (two values a token). */
static hr_status encode_model(const hr_tokenizer *tok, tk_ws *ws, bool offsets) {
    const tk_pieces *ps = &ws->pa;
    ws->ids.n = ws->offs.n = 0;
    tk_ids local = {0};
    hr_status st = HR_OK;
    for (size_t i = 0; st == HR_OK && i < ps->n; i++) {
        const tk_piece *pc = &ps->v[i];
        const tk_align *al = tk_pieces_al(ps, pc->off);
        if (pc->id >= 0) {
            st = tk_ids_push(&ws->ids, pc->id);
            if (st == HR_OK && offsets && (st = tk_ids_push(&ws->offs, (int32_t)al[0].start)) == HR_OK)
                st = tk_ids_push(&ws->offs, (int32_t)al[pc->len - 1].end);
            continue;
        }
        local.n = 0;
        st = tk_model_tokenize(tok->model, ps->text.p + pc->off, pc->len, &ws->ids, offsets ? &local : NULL, ws);
        for (size_t k = 0; st == HR_OK && k + 1 < local.n; k += 2) {
            int32_t a = local.p[k], b = local.p[k + 1];
            if (a < 0 || b <= a || (uint32_t)b > pc->len) {
                st = hr_error(HR_ERR_INTERNAL, "tokenizer: token range %d..%d outside a piece of %u bytes", a, b, pc->len);
                break;
            }
            if ((st = tk_ids_push(&ws->offs, (int32_t)al[a].start)) == HR_OK)
                st = tk_ids_push(&ws->offs, (int32_t)al[b - 1].end);
        }
    }
    tk_ids_free(&local);
    return st;
}

/* Byte offsets to code point offsets, as tokenizers' BytesToCharOffsetConverter:
 * a byte inside a character maps to that character; an end at the text's
 * end maps past the last character; a start at the end stays as it is. */
static hr_status offsets_to_chars(const char *text, size_t len, tk_ids *offs) {
    uint32_t *char_of = malloc((len + 1) * sizeof *char_of);
    if (!char_of) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    uint32_t c = 0;
    for (size_t i = 0; i < len; i++) {
        if (i && ((unsigned char)text[i] & 0xC0) != 0x80) c++;
        char_of[i] = c;
    }
    for (size_t i = 0; i + 1 < offs->n; i += 2) {
        size_t a = (size_t)offs->p[i], z = (size_t)offs->p[i + 1];
        if (a >= len) continue;
        offs->p[i] = (int32_t)char_of[a];
        offs->p[i + 1] = (int32_t)(z < len ? char_of[z] : z ? char_of[z - 1] + 1 : 0);
    }
    free(char_of);
    return HR_OK;
}

static hr_status encode_ws(const hr_tokenizer *tok, const char *text, size_t len, bool add_special, tk_ws *ws,
                           hr_offset_unit unit, int32_t **ids, hr_offset **offsets, size_t *n_ids) {
    size_t valid = tk_utf8_valid_prefix(text, len);
    if (valid != len) return hr_error(HR_ERR_INVALID_ARG, "tokenizer: text is not valid UTF-8 at byte %zu", valid);
    if (len > INT32_MAX) return hr_error(HR_ERR_INVALID_ARG, "tokenizer: text of %zu bytes is longer than 2 GiB", len);
    HR_TRY(encode_pieces(tok, text, len, offsets != NULL, ws));
    HR_TRY(encode_model(tok, ws, offsets != NULL));
    /* Characters before post-processing: trim_offsets counts in the unit. */
    if (offsets && unit == HR_OFFSETS_CHARS) HR_TRY(offsets_to_chars(text, len, &ws->offs));
    tk_ids fin = {0}, fin_offs = {0};
    hr_status st;
    /* Without special tokens the post-processor only changes offsets. */
    if (tok->post && (add_special || offsets)) {
        st = tk_post_process(tok->post, tok, add_special, &ws->ids, offsets ? &ws->offs : NULL, &fin,
                             offsets ? &fin_offs : NULL);
    } else {
        st = tk_ids_append(&fin, ws->ids.p, ws->ids.n);
        if (st == HR_OK && offsets) st = tk_ids_append(&fin_offs, ws->offs.p, ws->offs.n);
    }
    if (st == HR_OK && !fin.p && !(fin.p = malloc(sizeof *fin.p))) st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    if (st == HR_OK && offsets && !(*offsets = malloc((fin.n + 1) * sizeof **offsets)))
        st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    if (st != HR_OK) {
        tk_ids_free(&fin);
        tk_ids_free(&fin_offs);
        return st;
    }
    for (size_t i = 0; offsets && i < fin.n; i++)
        (*offsets)[i] = (hr_offset){(uint32_t)fin_offs.p[2 * i], (uint32_t)fin_offs.p[2 * i + 1]};
    tk_ids_free(&fin_offs);
    *ids = fin.p;
    *n_ids = fin.n;
    return HR_OK;
}

static hr_status encode(const hr_tokenizer *tok, const char *text, size_t len, bool add_special, hr_offset_unit unit,
                        int32_t **ids, hr_offset **offsets, size_t *n_ids) {
    if (!tok || (!text && len) || !ids || !n_ids) return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_encode: NULL argument");
    *ids = NULL;
    if (offsets) *offsets = NULL;
    *n_ids = 0;
    if (!text) text = "";
    hr_tokenizer *t = (hr_tokenizer *)tok; /* only the workspace pool changes */
    tk_ws *ws = NULL;
    HR_TRY(tk_ws_acquire(t, &ws));
    hr_status st = encode_ws(tok, text, len, add_special, ws, unit, ids, offsets, n_ids);
    tk_ws_release(t, ws);
    return st;
}

hr_status hr_tokenizer_encode(const hr_tokenizer *tok, const char *text, size_t len, bool add_special, int32_t **ids,
                              size_t *n_ids) {
    return encode(tok, text, len, add_special, HR_OFFSETS_BYTES, ids, NULL, n_ids);
}

hr_status hr_tokenizer_encode_offsets(const hr_tokenizer *tok, const char *text, size_t len, bool add_special,
                                      hr_offset_unit unit, int32_t **ids, hr_offset **offsets, size_t *n_ids) {
    if (!offsets) return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_encode_offsets: NULL argument");
    if (unit != HR_OFFSETS_BYTES && unit != HR_OFFSETS_CHARS)
        return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_encode_offsets: unknown offset unit %d", (int)unit);
    return encode(tok, text, len, add_special, unit, ids, offsets, n_ids);
}

void hr_tokenizer_free_array(void *p) { free(p); }

/* The model ids of one text (no post-processing) into out. */
static hr_status encode_plain(const hr_tokenizer *tok, const char *text, size_t len, tk_ws *ws, tk_ids *out) {
    size_t valid = tk_utf8_valid_prefix(text, len);
    if (valid != len) return hr_error(HR_ERR_INVALID_ARG, "tokenizer: text is not valid UTF-8 at byte %zu", valid);
    if (len > INT32_MAX) return hr_error(HR_ERR_INVALID_ARG, "tokenizer: text of %zu bytes is longer than 2 GiB", len);
    HR_TRY(encode_pieces(tok, text, len, false, ws));
    HR_TRY(encode_model(tok, ws, false));
    out->n = 0;
    return tk_ids_append(out, ws->ids.p, ws->ids.n);
}

hr_status hr_tokenizer_encode_pair(const hr_tokenizer *tok, const char *a, size_t a_len, const char *b, size_t b_len,
                                   bool add_special, int32_t **ids, int32_t **type_ids, size_t *n_ids) {
    if (!tok || (!a && a_len) || (!b && b_len) || !ids || !n_ids)
        return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_encode_pair: NULL argument");
    *ids = NULL;
    if (type_ids) *type_ids = NULL;
    *n_ids = 0;
    hr_tokenizer *t = (hr_tokenizer *)tok;
    tk_ws *ws = NULL;
    HR_TRY(tk_ws_acquire(t, &ws));
    tk_ids ia = {0}, ib = {0}, out = {0}, types = {0};
    hr_status st = encode_plain(tok, a ? a : "", a_len, ws, &ia);
    if (st != HR_OK) hr_error_context(st, "first text");
    if (st == HR_OK && (st = encode_plain(tok, b ? b : "", b_len, ws, &ib)) != HR_OK) hr_error_context(st, "second text");
    tk_ws_release(t, ws);
    if (st == HR_OK) st = tk_post_process_pair(tok->post, add_special, &ia, &ib, &out, type_ids ? &types : NULL);
    if (st == HR_OK && !out.p && !(out.p = malloc(sizeof *out.p))) st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    if (st == HR_OK && type_ids && !types.p && !(types.p = malloc(sizeof *types.p)))
        st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    tk_ids_free(&ia);
    tk_ids_free(&ib);
    if (st != HR_OK) {
        tk_ids_free(&out);
        tk_ids_free(&types);
        return st;
    }
    *ids = out.p;
    *n_ids = out.n;
    if (type_ids) *type_ids = types.p;
    return HR_OK;
}

/* ---- batch ------------------------------------------------------------------------- */

typedef struct {
    const hr_tokenizer *tok;
    const char *const *texts;
    const size_t *lens;
    size_t n, stride, first;
    bool add_special;
    int32_t **ids;
    size_t *n_ids;
    hr_status st;
    size_t failed;
    char msg[512];
} batch_job;

static void *batch_worker(void *arg) {
    batch_job *job = arg;
    for (size_t i = job->first; i < job->n; i += job->stride) {
        hr_status st = hr_tokenizer_encode(job->tok, job->texts[i], job->lens ? job->lens[i] : strlen(job->texts[i]),
                                           job->add_special, &job->ids[i], &job->n_ids[i]);
        if (st != HR_OK) {
            job->st = st;
            job->failed = i;
            snprintf(job->msg, sizeof job->msg, "%s", hr_last_error());
            break;
        }
    }
    return NULL;
}

void hr_tokenizer_free_batch(int32_t **ids, size_t *n_ids, size_t n) {
    if (ids)
        for (size_t i = 0; i < n; i++) free(ids[i]);
    free(ids);
    free(n_ids);
}

hr_status hr_tokenizer_encode_batch(const hr_tokenizer *tok, const char *const *texts, const size_t *lens, size_t n,
                                    bool add_special, int n_threads, int32_t ***ids, size_t **n_ids) {
    if (!tok || (!texts && n) || !ids || !n_ids) return hr_error(HR_ERR_INVALID_ARG, "hr_tokenizer_encode_batch: NULL argument");
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    if ((size_t)n_threads > n) n_threads = n ? (int)n : 1;
    *ids = calloc(n + 1, sizeof **ids);
    *n_ids = calloc(n + 1, sizeof **n_ids);
    batch_job *jobs = calloc((size_t)n_threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    bool *running = calloc((size_t)n_threads, sizeof *running);
    hr_status st = HR_OK;
    if (!*ids || !*n_ids || !jobs || !th || !running) st = hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    for (int k = 0; st == HR_OK && k < n_threads; k++) {
        jobs[k] = (batch_job){tok, texts, lens, n, (size_t)n_threads, (size_t)k, add_special, *ids, *n_ids, HR_OK, 0, ""};
        /* The last slice, or one that gets no thread, runs on this thread. */
        running[k] = k < n_threads - 1 && pthread_create(&th[k], NULL, batch_worker, &jobs[k]) == 0;
        if (!running[k]) batch_worker(&jobs[k]);
    }
    for (int k = 0; st == HR_OK && k < n_threads; k++)
        if (running[k]) pthread_join(th[k], NULL);
    for (int k = 0; st == HR_OK && k < n_threads; k++)
        if (jobs[k].st != HR_OK) st = hr_error(jobs[k].st, "text %zu: %s", jobs[k].failed, jobs[k].msg);
    free(jobs);
    free(th);
    free(running);
    if (st != HR_OK) {
        hr_tokenizer_free_batch(*ids, *n_ids, n);
        *ids = NULL;
        *n_ids = NULL;
    }
    return st;
}
