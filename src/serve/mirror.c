/* Mirrored engine calls (mirror.h). A command goes as two broadcasts: its
 * fixed header, then a step's arrays. */
#include "serve/mirror.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "hubrt/dist.h"

enum { HEADER = 14 };

static void encode(const hr_mirror_cmd *c, int64_t h[HEADER]) {
    int64_t v[HEADER] = {c->op, c->cache, c->a, c->b, c->c, c->d, c->e, c->f, c->batch, c->seq, c->mask_cols,
                         c->compiled, c->batch_invariant, c->mask != NULL};
    memcpy(h, v, sizeof v);
}

static size_t payload(const int64_t h[HEADER]) {
    if (h[0] != HR_MIR_STEP) return 0;
    return (size_t)(2 * h[8] * h[9] + (h[13] ? h[8] * h[10] : 0));
}

static hr_kv_cache *cache_of(hr_mirror_caches *cs, int64_t id, hr_status *s) {
    if (id == HR_MIR_KV) return cs->kv;
    if (id == HR_MIR_SCRATCH) return cs->scratch;
    int64_t b = id - HR_MIR_ROWS;
    if (b < 0 || b > cs->B) {
        *s = hr_error(HR_ERR_INTERNAL, "serve: mirrored command names cache %lld", (long long)id);
        return NULL;
    }
    if (!cs->rows[b]) *s = hr_kv_cache_rows(cs->kv, b, &cs->rows[b]);
    return cs->rows[b];
}

hr_status hr_mirror_apply(hr_mirror_caches *cs, const hr_mirror_cmd *c, hr_tensor **logits) {
    hr_status s = HR_OK;
    hr_kv_cache *kv = cache_of(cs, c->cache, &s);
    HR_TRY(s);
    switch (c->op) {
    case HR_MIR_STEP: {
        hr_step_args a = {.ids = c->ids, .pos = c->pos, .mask = c->mask, .batch = c->batch, .seq = c->seq,
                          .cache = kv, .compiled = c->compiled, .batch_invariant = c->batch_invariant};
        return hr_model_step(cs->m, &a, logits);
    }
    case HR_MIR_SHIFT: return hr_kv_cache_shift(kv, c->a);
    case HR_MIR_RESET: hr_kv_cache_reset(kv); return HR_OK;
    case HR_MIR_COPY: {
        hr_kv_cache *src = cache_of(cs, c->c, &s);
        HR_TRY(s);
        return hr_kv_cache_copy(kv, c->a, c->b, src, c->d, c->e, c->f);
    }
    case HR_MIR_SET_LEN: return hr_kv_cache_set_len(kv, c->a);
    default: return hr_error(HR_ERR_INTERNAL, "serve: mirrored command %lld is not known", (long long)c->op);
    }
}

hr_status hr_mirror_send(const hr_mirror_cmd *c) {
    if (hr_dist_size() == 1) return HR_OK;
    int64_t h[HEADER];
    encode(c, h);
    HR_TRY(hr_dist_broadcast_idle(h, sizeof h, 0));
    size_t n = payload(h);
    if (!n) return HR_OK;
    int64_t *p = malloc(sizeof(int64_t) * n);
    if (!p) return hr_error(HR_ERR_OOM, "serve: out of memory mirroring a step");
    size_t bs = (size_t)(c->batch * c->seq);
    memcpy(p, c->ids, sizeof(int64_t) * bs);
    memcpy(p + bs, c->pos, sizeof(int64_t) * bs);
    if (c->mask) memcpy(p + 2 * bs, c->mask, sizeof(int64_t) * (size_t)(c->batch * c->mask_cols));
    hr_status s = hr_dist_broadcast(p, sizeof(int64_t) * n, 0);
    free(p);
    return s;
}

hr_status hr_mirror_follow(hr_model *m, int64_t B, int64_t C) {
    hr_mirror_caches cs = {.m = m, .B = B};
    hr_tensor *logits = NULL;
    int64_t *p = NULL;
    size_t cap = 0;
    cs.rows = calloc((size_t)B + 1, sizeof *cs.rows);
    hr_status s = cs.rows ? HR_OK : hr_error(HR_ERR_OOM, "serve: out of memory");
    if (s == HR_OK) s = hr_kv_cache_create(m, B, C, &cs.kv);
    if (s == HR_OK) s = hr_kv_cache_create(m, 1, C, &cs.scratch);
    while (s == HR_OK) {
        int64_t h[HEADER];
        s = hr_dist_broadcast_idle(h, sizeof h, 0);
        if (s != HR_OK || h[0] == HR_MIR_STOP) break;
        size_t n = payload(h);
        if (n > cap) {
            int64_t *grown = realloc(p, sizeof(int64_t) * n);
            if (!grown) {
                s = hr_error(HR_ERR_OOM, "serve: out of memory for a mirrored step");
                break;
            }
            p = grown, cap = n;
        }
        if (n) s = hr_dist_broadcast(p, sizeof(int64_t) * n, 0);
        size_t bs = (size_t)(h[8] * h[9]);
        hr_mirror_cmd c = {.op = h[0], .cache = h[1], .a = h[2], .b = h[3], .c = h[4], .d = h[5], .e = h[6],
                           .f = h[7], .batch = h[8], .seq = h[9], .mask_cols = h[10], .compiled = h[11],
                           .batch_invariant = h[12], .ids = p, .pos = p ? p + bs : NULL,
                           .mask = h[13] && p ? p + 2 * bs : NULL};
        if (s == HR_OK) s = hr_mirror_apply(&cs, &c, &logits);
        if (s != HR_OK) {
            char why[1100];
            snprintf(why, sizeof why, "serve: a mirrored engine call failed: %s", hr_last_error());
            hr_dist_abort(1, why); /* the ranks' caches no longer agree */
        }
    }
    hr_tensor_free(logits);
    free(p);
    for (int64_t b = 0; cs.rows && b <= B; b++) hr_kv_cache_free(cs.rows[b]);
    free(cs.rows);
    hr_kv_cache_free(cs.kv);
    hr_kv_cache_free(cs.scratch);
    return s;
}
