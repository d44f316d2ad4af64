/* Unigram: Viterbi over the lattice of vocabulary pieces (a byte trie gives
 * the pieces starting at each position); unknown characters cost the lowest
 * score minus 10 and consecutive ones are fused, as in tokenizers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tk_model.h"

#define UNK_PENALTY 10.0

static hr_status trie_add(tk_model *m, const char *s, size_t n, int32_t id, size_t *cap) {
    uint64_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = node << 8 | (unsigned char)s[i], child;
        if (!tk_u64map_get(&m->trie, key, &child)) {
            if (m->n_trie == *cap) {
                size_t c = *cap * 2;
                int32_t *p = realloc(m->trie_ids, c * sizeof *p);
                if (!p) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
                m->trie_ids = p;
                *cap = c;
            }
            child = m->n_trie++;
            m->trie_ids[child] = -1;
            HR_TRY(tk_u64map_put(&m->trie, key, child));
        }
        node = child;
    }
    m->trie_ids[node] = id;
    return HR_OK;
}

hr_status tk_unigram_parse(const cJSON *j, tk_model *m) {
    HR_TRY(tk_vocab_from_pairs(tk_json_get(j, "vocab"), "model 'Unigram'", &m->vocab, &m->scores));
    const cJSON *unk = tk_json_get(j, "unk_id");
    if (cJSON_IsNumber(unk)) {
        if (unk->valuedouble < 0 || unk->valuedouble >= (double)m->vocab.n)
            return hr_error(HR_ERR_FORMAT, "model 'Unigram': unk_id %g is outside the vocab", unk->valuedouble);
        m->unk_id = (int32_t)unk->valuedouble;
    }
    m->byte_fallback = tk_json_bool(j, "byte_fallback", false);
    m->fuse_unk = true;
    m->min_score = 1e300;
    for (size_t i = 0; i < m->vocab.n; i++)
        if (m->scores[i] < m->min_score) m->min_score = m->scores[i];
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = tk_vocab_get(&m->vocab, name, 6);
    }
    size_t cap = 1024;
    m->trie_ids = malloc(cap * sizeof *m->trie_ids);
    if (!m->trie_ids) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    m->trie_ids[0] = -1;
    m->n_trie = 1;
    HR_TRY(tk_u64map_init(&m->trie, m->vocab.n * 4));
    for (size_t i = 0; i < m->vocab.n; i++)
        HR_TRY(trie_add(m, m->vocab.arena + m->vocab.off[i], m->vocab.len[i], (int32_t)i, &cap));
    return HR_OK;
}

typedef struct {
    double score;
    int32_t id;
    int32_t start; /* -1: not reached yet */
} node;

typedef struct {
    node *nodes;
    size_t cap;
} uni_scratch;

void tk_unigram_scratch_free(void *p) {
    uni_scratch *s = p;
    free(s->nodes);
    free(s);
}

/* Emits piece s[start..end) (every token of it spans the whole piece). */
static hr_status emit_piece(const tk_model *m, const char *s, size_t start, size_t end, int32_t id, tk_ids *out,
                            tk_ids *offs) {
    size_t n = end - start, count = 1;
    s += start;
    if (id < 0) id = tk_vocab_get(&m->vocab, s, n);
    if (id >= 0) {
        HR_TRY(tk_ids_push(out, id));
    } else {
        bool all = m->byte_fallback;
        for (size_t i = 0; all && i < n; i++) all = m->byte_ids[(unsigned char)s[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < n; i++) HR_TRY(tk_ids_push(out, m->byte_ids[(unsigned char)s[i]]));
            count = n;
        } else if (m->unk_id < 0) {
            return hr_error(HR_ERR_UNSUPPORTED, "model 'Unigram': text needs the unknown token but unk_id is null");
        } else {
            HR_TRY(tk_ids_push(out, m->unk_id));
        }
    }
    for (size_t i = 0; offs && i < count; i++) {
        HR_TRY(tk_ids_push(offs, (int32_t)start));
        HR_TRY(tk_ids_push(offs, (int32_t)end));
    }
    return HR_OK;
}

hr_status tk_unigram_tokenize(const tk_model *m, const char *s, size_t n, tk_ids *out, tk_ids *offs, tk_ws *ws) {
    if (!ws->model_scratch) {
        ws->model_scratch = calloc(1, sizeof(uni_scratch));
        if (!ws->model_scratch) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
    }
    uni_scratch *sc = ws->model_scratch;
    if (sc->cap < n + 1) {
        node *p = realloc(sc->nodes, (n + 1) * sizeof *p);
        if (!p) return hr_error(HR_ERR_OOM, "tokenizer: out of memory");
        sc->nodes = p;
        sc->cap = n + 1;
    }
    node *best = sc->nodes;
    for (size_t i = 0; i <= n; i++) best[i] = (node){0, -1, -1};
    double unk_score = m->min_score - UNK_PENALTY;
    for (size_t at = 0; at < n;) {
        double base = best[at].score;
        size_t mblen = 1;
        while (at + mblen < n && ((unsigned char)s[at + mblen] & 0xC0) == 0x80) mblen++;
        bool single = false;
        uint64_t nd = 0;
        for (size_t k = at; k < n; k++) {
            uint64_t child;
            if (!tk_u64map_get(&m->trie, nd << 8 | (unsigned char)s[k], &child)) break;
            nd = child;
            int32_t id = m->trie_ids[nd];
            if (id < 0) continue;
            size_t end = k + 1;
            double cand = base + m->scores[id];
            if (best[end].start < 0 || cand > best[end].score) best[end] = (node){cand, id, (int32_t)at};
            if (end - at == mblen) single = true;
        }
        if (!single) {
            double cand = base + unk_score;
            if (best[at + mblen].start < 0 || cand > best[at + mblen].score)
                best[at + mblen] = (node){cand, m->unk_id, (int32_t)at};
        }
        at += mblen;
    }
    /* Walk back, then emit in order; runs of unknowns become one piece. */
    size_t first = out->n;
    for (size_t end = n; end > 0;) {
        size_t start = (size_t)best[end].start;
        HR_TRY(tk_ids_push(out, (int32_t)end));
        end = start;
    }
    size_t k = out->n - first;
    for (size_t i = 0; i < k / 2; i++) {
        int32_t t = out->p[first + i];
        out->p[first + i] = out->p[first + k - 1 - i];
        out->p[first + k - 1 - i] = t;
    }
    /* out[first..] now holds piece end offsets; rewrite them into ids. */
    size_t ends_n = k;
    tk_ids ends = {0};
    hr_status st = tk_ids_append(&ends, out->p + first, ends_n);
    out->n = first;
    for (size_t i = 0; st == HR_OK && i < ends_n;) {
        size_t end = (size_t)ends.p[i], start = (size_t)best[end].start;
        int32_t id = best[end].id;
        if (m->unk_id >= 0 && id == m->unk_id) {
            while (i + 1 < ends_n && best[ends.p[i + 1]].id == m->unk_id) end = (size_t)ends.p[++i];
            st = emit_piece(m, s, start, end, -1, out, offs);
        } else {
            st = emit_piece(m, s, start, end, id, out, offs);
        }
        i++;
    }
    tk_ids_free(&ends);
    return st;
}
