/* The static KV cache (kv_cache.h): every layer's keys and values
 * preallocated once, full layers over the whole capacity, sliding layers
 * in a ring of the window; and the plans that tell a forward call where
 * its new keys go and which slots its queries see. */
#include "models/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* An empty cache of n_layers layers: the per-layer arrays, no buffers. */
static hr_kv_cache *cache_shell(int64_t n_layers) {
    hr_kv_cache *c = calloc(1, sizeof *c);
    if (c) {
        c->n_layers = n_layers;
        c->k = calloc((size_t)n_layers, sizeof *c->k);
        c->v = calloc((size_t)n_layers, sizeof *c->v);
        c->kind = malloc((size_t)n_layers);
        c->source = malloc(sizeof *c->source * (size_t)n_layers);
    }
    if (c && (!c->k || !c->v || !c->kind || !c->source)) {
        hr_kv_cache_free(c);
        c = NULL;
    }
    return c;
}

/* A layer that reads an earlier layer's keys and values has no cache of
 * its own (kv_source; a source is always of the same kind). */
static int64_t source_of(const hr_model *m, int64_t l) {
    return m->cfg.kv_source && m->cfg.kv_source[l] >= 0 ? m->cfg.kv_source[l] : l;
}

/* Each layer's [batch, kv_heads, slots, head_dim] views of its kind's
 * buffers; a sharing layer's are views of its source's. */
static hr_status layer_views(hr_kv_cache *c) {
    int64_t at[HR_LAYER_KINDS] = {0};
    hr_status s = HR_OK;
    for (int64_t l = 0; s == HR_OK && l < c->n_layers; l++) {
        int k = c->kind[l];
        int64_t src = c->source[l];
        if (src != l) {
            s = hr_tensor_alias(c->k[src], &c->k[l]);
            if (s == HR_OK) s = hr_tensor_alias(c->v[src], &c->v[l]);
            continue;
        }
        s = hr_tensor_select(c->k_all[k], 0, at[k], &c->k[l]);
        if (s == HR_OK) s = hr_tensor_select(c->v_all[k], 0, at[k], &c->v[l]);
        at[k]++;
    }
    return s;
}

hr_status hr_kv_cache_create(const hr_model *m, int64_t batch, int64_t max_len, hr_kv_cache **out) {
    if (!m || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_create: NULL argument");
    *out = NULL;
    if (batch < 1 || max_len < 1)
        return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_create: batch %lld and max_len %lld must be >= 1",
                        (long long)batch, (long long)max_len);
    int64_t L = m->cfg.n_layers;
    hr_kv_cache *c = cache_shell(L);
    if (!c) return hr_error(HR_ERR_OOM, "hr_kv_cache_create: out of memory");
    c->batch = batch;
    c->capacity = max_len;
    c->window = m->cfg.sliding_window;
    memcpy(c->kind, m->cfg.layer_kind, (size_t)L);
    for (int64_t l = 0; l < L; l++) c->source[l] = source_of(m, l);
    c->slots[HR_LAYER_FULL] = max_len;
    c->slots[HR_LAYER_SLIDING] = c->window > 0 && c->window < max_len ? c->window : max_len;
    int64_t per_kind[HR_LAYER_KINDS] = {0};
    for (int64_t l = 0; l < L; l++) per_kind[c->kind[l]] += c->source[l] == l;
    hr_status s = HR_OK;
    for (int k = 0; k < HR_LAYER_KINDS && s == HR_OK; k++) {
        if (!per_kind[k]) continue;
        int64_t shape[5] = {per_kind[k], batch, m->cfg.kind_kv_heads[k], c->slots[k], m->cfg.kind_head_dim[k]};
        /* Zeroed: a compiled forward attends over every slot under a mask,
         * and a masked slot still enters P V with weight 0, which garbage
         * (NaN) would poison. */
        s = hr_tensor_zeros(m->dev, m->dtype, 5, shape, &c->k_all[k]);
        if (s == HR_OK) s = hr_tensor_zeros(m->dev, m->dtype, 5, shape, &c->v_all[k]);
    }
    if (s == HR_OK) s = layer_views(c);
    if (s != HR_OK) {
        hr_kv_cache_free(c);
        return hr_error_context(s, "KV cache for batch %lld x %lld tokens", (long long)batch, (long long)max_len);
    }
    *out = c;
    return HR_OK;
}

void hr_kv_cache_free(hr_kv_cache *c) {
    if (!c) return;
    for (int64_t l = 0; l < c->n_layers; l++) {
        if (c->k) hr_tensor_free(c->k[l]);
        if (c->v) hr_tensor_free(c->v[l]);
    }
    free(c->k);
    free(c->v);
    free(c->kind);
    free(c->source);
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        hr_tensor_free(c->k_all[k]);
        hr_tensor_free(c->v_all[k]);
    }
    free(c);
}

int64_t hr_kv_cache_len(const hr_kv_cache *c) { return c ? c->len : 0; }
int64_t hr_kv_cache_capacity(const hr_kv_cache *c) { return c ? c->capacity : 0; }
void hr_kv_cache_reset(hr_kv_cache *c) {
    if (c) c->len = 0;
}

/* ---- plans ------------------------------------------------------------------- */

/* A sliding kind whose ring holds the whole capacity never wraps: it is
 * read and written as a full layer (every distance is under the window). */
static bool ring_wraps(const hr_kv_cache *c, hr_layer_kind kind) {
    return kind == HR_LAYER_SLIDING && c->slots[kind] < c->capacity;
}

static int64_t mod(int64_t x, int64_t n) { return (x % n + n) % n; }

/* The host mask says token `pos` of row r is real (no mask: all are). */
static bool real(const int64_t *mask, int64_t t, int64_t r, int64_t pos) { return !mask || mask[r * t + pos] != 0; }

static bool all_real(const int64_t *mask, int64_t n) {
    for (int64_t i = 0; mask && i < n; i++)
        if (!mask[i]) return false;
    return true;
}

/* The position of key j of a plan's key list for query row (r, i), and
 * whether row r's query i sees it; keys are described by `key_pos`. */
typedef int64_t (*key_pos_fn)(const void *ctx, int64_t j);

typedef struct mask_spec {
    int64_t b, s, past, t;  /* t: tokens so far, the host mask's row length */
    int64_t keys, window;   /* window 0: none */
    const int64_t *mask;
    key_pos_fn pos;         /* < 0: an empty slot */
    const void *ctx;
} mask_spec;

/* bool [b, 1, s, keys]: query i (position past + i) of row r sees key j
 * at position kp when kp <= past + i, within the window, and the token is
 * real or the query itself (which keeps a padding row finite; its
 * outputs are never used). */
static hr_status build_mask(const mask_spec *m, hr_tensor **out) {
    HR_TRY(hr_tensor_empty(hr_device_cpu(), HR_BOOL, 4, (int64_t[]){m->b, 1, m->s, m->keys}, out));
    uint8_t *p = hr_tensor_data(*out);
    for (int64_t r = 0; r < m->b; r++)
        for (int64_t i = 0; i < m->s; i++) {
            uint8_t *row = p + (r * m->s + i) * m->keys;
            int64_t q = m->past + i;
            for (int64_t j = 0; j < m->keys; j++) {
                int64_t kp = m->pos(m->ctx, j);
                row[j] = kp >= 0 && kp <= q && (!m->window || q - kp < m->window) &&
                         (real(m->mask, m->t, r, kp) || kp == q);
            }
        }
    return HR_OK;
}

static hr_status mask_on(hr_device *dev, hr_tensor **t) {
    if (hr_tensor_device(*t) == dev) return HR_OK;
    hr_tensor *d = NULL;
    hr_status s = hr_tensor_to(*t, dev, &d);
    hr_tensor_free(*t);
    *t = d;
    return s;
}

/* Keys listed by slot: slot j of everything up to `past` (APPEND, INDEX). */
static int64_t pos_identity(const void *ctx, int64_t j) { return j; }

typedef struct ring_keys {
    int64_t past, ring, n_ring, split; /* split < 0: physical order */
} ring_keys;

/* RING_STEP: slot j holds the newest position <= past in that slot. */
static int64_t pos_ring_step(const void *ctx, int64_t j) {
    const ring_keys *k = ctx;
    return k->past - mod(k->past - j, k->ring);
}

/* RING_CAT: the ring's filled slots in position order, then the new keys. */
static int64_t pos_ring_cat(const void *ctx, int64_t j) {
    const ring_keys *k = ctx;
    return k->past - k->n_ring + j;
}

/* INDEX_CAT: the whole ring in slot order (the newest position before past
 * in each slot, negative when none), then the new keys. */
static int64_t pos_index_cat(const void *ctx, int64_t j) {
    const ring_keys *k = ctx;
    if (j >= k->ring) return k->past + j - k->ring;
    return k->past - 1 - mod(k->past - 1 - j, k->ring);
}

hr_status hr_kv_plan_eager(const hr_kv_cache *c, hr_layer_kind kind, int64_t s, const int64_t *mask, hr_device *dev,
                           hr_kv_plan *p, hr_tensor **mask_out) {
    memset(p, 0, sizeof *p);
    *mask_out = NULL;
    int64_t past = c->len, t = past + s, ring = c->slots[kind];
    bool padded = !all_real(mask, c->batch * t);
    mask_spec ms = {.b = c->batch, .s = s, .past = past, .t = t, .mask = padded ? mask : NULL};
    ring_keys rk = {.past = past, .ring = ring};
    if (!ring_wraps(c, kind) || t <= ring) {
        p->mode = HR_KV_APPEND;
        p->at = past;
        p->n_attend = t;
        p->causal = !padded && s > 1;
        ms.keys = t;
        ms.pos = pos_identity;
    } else if (s == 1) {
        p->mode = HR_KV_RING_STEP;
        p->at = past % ring;
        ms.keys = ring;
        ms.pos = pos_ring_step;
        ms.ctx = &rk;
    } else {
        p->mode = HR_KV_RING_CAT;
        p->n_ring = rk.n_ring = past < ring ? past : ring;
        p->split = past >= ring ? past % ring : 0;
        p->keep = s < ring ? s : ring;
        p->keep_at = (t - p->keep) % ring;
        p->window = c->window;
        p->causal = !padded;
        ms.keys = rk.n_ring + s;
        ms.window = c->window;
        ms.pos = pos_ring_cat;
        ms.ctx = &rk;
    }
    if (!padded) return HR_OK;
    HR_TRY(build_mask(&ms, mask_out));
    HR_TRY(mask_on(dev, mask_out));
    p->mask = *mask_out;
    p->window = 0; /* the mask holds it */
    return HR_OK;
}

void hr_kv_plan_compiled(const hr_kv_cache *c, hr_layer_kind kind, int64_t s, const hr_tensor *mask,
                         const hr_tensor *slots, hr_kv_plan *p) {
    int64_t ring = c->slots[kind];
    memset(p, 0, sizeof *p);
    p->mode = ring_wraps(c, kind) && s > 1 ? HR_KV_INDEX_CAT : HR_KV_INDEX;
    p->keep = s < ring ? s : ring;
    p->mask = mask;
    p->slots = slots;
}

hr_status hr_kv_inputs_compiled(const hr_kv_cache *c, hr_layer_kind kind, int64_t s, const int64_t *mask,
                                hr_tensor **mask_out, hr_tensor **slots_out) {
    *mask_out = *slots_out = NULL;
    int64_t past = c->len, t = past + s, ring = c->slots[kind];
    ring_keys rk = {.past = past, .ring = ring};
    mask_spec ms = {.b = c->batch, .s = s, .past = past, .t = t, .mask = mask, .ctx = &rk};
    int64_t n_slots = s, first = past;
    if (!ring_wraps(c, kind)) {
        ms.keys = c->capacity;
        ms.pos = pos_identity;
    } else if (s == 1) {
        ms.keys = ring;
        ms.pos = pos_ring_step;
        first = past % ring;
    } else {
        ms.keys = ring + s;
        ms.window = c->window;
        ms.pos = pos_index_cat;
        n_slots = s < ring ? s : ring;
        first = t - n_slots;
    }
    HR_TRY(build_mask(&ms, mask_out));
    hr_status st = hr_tensor_empty(hr_device_cpu(), HR_I64, 1, &n_slots, slots_out);
    if (st == HR_OK) {
        int64_t *v = hr_tensor_data(*slots_out);
        for (int64_t i = 0; i < n_slots; i++) v[i] = ring_wraps(c, kind) ? (first + i) % ring : first + i;
    }
    if (st != HR_OK) {
        hr_tensor_free(*mask_out);
        *mask_out = NULL;
    }
    return st;
}

/* ---- moving cells (continuous batching) -------------------------------------- */

/* The slot that cache index i lives in, for a kind. */
static int64_t slot_of(const hr_kv_cache *c, int kind, int64_t i) {
    return ring_wraps(c, (hr_layer_kind)kind) ? i % c->slots[kind] : i;
}

static hr_status index_tensor(hr_device *dev, const int64_t *v, int64_t n, hr_tensor **out) {
    return hr_tensor_from_host(dev, HR_I64, 1, &n, v, sizeof(int64_t) * (size_t)n, out);
}

/* dst[.., didx[i], ..] = src[.., sidx[i], ..] along dim, through a copy,
 * so source and destination may be the same tensor. */
static hr_status move_cells(hr_tensor *dst, const hr_tensor *src, int dim, const int64_t *sidx, const int64_t *didx,
                            int64_t n) {
    if (!n) return HR_OK;
    hr_device *dev = hr_tensor_device(dst);
    hr_tensor *si = NULL, *di = NULL, *tmp = NULL;
    hr_status s = index_tensor(dev, sidx, n, &si);
    if (s == HR_OK) s = index_tensor(dev, didx, n, &di);
    if (s == HR_OK) s = hr_index_select(src, dim, si, &tmp);
    if (s == HR_OK) s = hr_index_copy_(dst, dim, di, tmp);
    hr_tensor_free(si);
    hr_tensor_free(di);
    hr_tensor_free(tmp);
    return s;
}

static hr_status same_layout(const hr_kv_cache *a, const hr_kv_cache *b) {
    for (int k = 0; k < HR_LAYER_KINDS; k++) {
        const hr_tensor *x = a->k_all[k], *y = b->k_all[k];
        if (!x != !y || (x && (hr_tensor_dtype(x) != hr_tensor_dtype(y) || hr_tensor_device(x) != hr_tensor_device(y) ||
                               hr_tensor_shape(x)[0] != hr_tensor_shape(y)[0] ||
                               hr_tensor_shape(x)[2] != hr_tensor_shape(y)[2] ||
                               hr_tensor_shape(x)[4] != hr_tensor_shape(y)[4])))
            return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_copy: the caches belong to different models");
    }
    return HR_OK;
}

hr_status hr_kv_cache_copy(hr_kv_cache *dst, int64_t dst_row, int64_t dst_at, const hr_kv_cache *src,
                           int64_t src_row, int64_t src_at, int64_t n) {
    if (!dst || !src) return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_copy: NULL cache");
    if (n < 0 || dst_row < 0 || dst_row >= dst->batch || src_row < 0 || src_row >= src->batch || dst_at < 0 ||
        src_at < 0 || dst_at + n > dst->capacity || src_at + n > src->capacity)
        return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_copy: rows %lld <- %lld, cells [%lld, +%lld) <- [%lld, "
                        "+%lld) outside the caches (batch %lld x %lld <- %lld x %lld)", (long long)dst_row,
                        (long long)src_row, (long long)dst_at, (long long)n, (long long)src_at, (long long)n,
                        (long long)dst->batch, (long long)dst->capacity, (long long)src->batch,
                        (long long)src->capacity);
    HR_TRY(same_layout(dst, src));
    if (!n) return HR_OK;
    int64_t *sidx = malloc(sizeof(int64_t) * (size_t)n), *didx = malloc(sizeof(int64_t) * (size_t)n);
    hr_status s = sidx && didx ? HR_OK : hr_error(HR_ERR_OOM, "hr_kv_cache_copy: out of memory");
    for (int k = 0; k < HR_LAYER_KINDS && s == HR_OK; k++) {
        if (!dst->k_all[k]) continue;
        /* a ring keeps the last cells only: the ones that land there last */
        int64_t keep = n;
        if (ring_wraps(dst, (hr_layer_kind)k) && keep > dst->slots[k]) keep = dst->slots[k];
        if (ring_wraps(src, (hr_layer_kind)k) && keep > src->slots[k]) keep = src->slots[k];
        for (int64_t i = 0; i < keep; i++) {
            sidx[i] = slot_of(src, k, src_at + n - keep + i);
            didx[i] = slot_of(dst, k, dst_at + n - keep + i);
        }
        hr_tensor *sv[2] = {NULL, NULL}, *dv[2] = {NULL, NULL};
        hr_tensor *sa[2] = {src->k_all[k], src->v_all[k]}, *da[2] = {dst->k_all[k], dst->v_all[k]};
        for (int j = 0; j < 2 && s == HR_OK; j++) {
            s = hr_tensor_select(sa[j], 1, src_row, &sv[j]);
            if (s == HR_OK) s = hr_tensor_select(da[j], 1, dst_row, &dv[j]);
            /* [layers, kv_heads, slots, head_dim]: cells along dim 2 */
            if (s == HR_OK) s = move_cells(dv[j], sv[j], 2, sidx, didx, keep);
        }
        for (int j = 0; j < 2; j++) hr_tensor_free(sv[j]), hr_tensor_free(dv[j]);
    }
    free(sidx);
    free(didx);
    return s;
}

hr_status hr_kv_cache_shift(hr_kv_cache *c, int64_t delta) {
    if (!c) return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_shift: NULL cache");
    if (-delta > c->len || c->len + delta > c->capacity)
        return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_shift: %lld cells by %lld leaves the capacity %lld",
                        (long long)c->len, (long long)delta, (long long)c->capacity);
    int64_t len = c->len + delta;
    if (!delta || !len) {
        c->len = len;
        return HR_OK;
    }
    int64_t most = c->slots[HR_LAYER_FULL] > c->slots[HR_LAYER_SLIDING] ? c->slots[HR_LAYER_FULL]
                                                                          : c->slots[HR_LAYER_SLIDING];
    int64_t *sidx = malloc(sizeof(int64_t) * (size_t)most), *didx = malloc(sizeof(int64_t) * (size_t)most);
    hr_status s = sidx && didx ? HR_OK : hr_error(HR_ERR_OOM, "hr_kv_cache_shift: out of memory");
    for (int k = 0; k < HR_LAYER_KINDS && s == HR_OK; k++) {
        if (!c->k_all[k]) continue;
        /* the cells that survive: new indices [max(0, delta), len) */
        int64_t lo = delta > 0 ? delta : 0, n = len - lo;
        if (ring_wraps(c, (hr_layer_kind)k) && n > c->slots[k]) lo = len - c->slots[k], n = c->slots[k];
        for (int64_t i = 0; i < n; i++) {
            sidx[i] = slot_of(c, k, lo + i - delta);
            didx[i] = slot_of(c, k, lo + i);
        }
        /* [layers, batch, kv_heads, slots, head_dim]: cells along dim 3 */
        s = move_cells(c->k_all[k], c->k_all[k], 3, sidx, didx, n);
        if (s == HR_OK) s = move_cells(c->v_all[k], c->v_all[k], 3, sidx, didx, n);
    }
    free(sidx);
    free(didx);
    if (s == HR_OK) c->len = len;
    return s;
}

hr_status hr_kv_cache_rows(const hr_kv_cache *c, int64_t rows, hr_kv_cache **out) {
    if (!c || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_rows: NULL argument");
    *out = NULL;
    if (rows < 1 || rows > c->batch)
        return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_rows: %lld rows of a batch of %lld", (long long)rows,
                        (long long)c->batch);
    hr_kv_cache *v = cache_shell(c->n_layers);
    if (!v) return hr_error(HR_ERR_OOM, "hr_kv_cache_rows: out of memory");
    memcpy(v->kind, c->kind, (size_t)c->n_layers);
    memcpy(v->source, c->source, sizeof *v->source * (size_t)c->n_layers);
    v->batch = rows;
    v->capacity = c->capacity;
    v->len = c->len;
    v->window = c->window;
    memcpy(v->slots, c->slots, sizeof v->slots);
    hr_status s = HR_OK;
    for (int k = 0; k < HR_LAYER_KINDS && s == HR_OK; k++) {
        if (!c->k_all[k]) continue;
        s = hr_tensor_narrow(c->k_all[k], 1, 0, rows, &v->k_all[k]);
        if (s == HR_OK) s = hr_tensor_narrow(c->v_all[k], 1, 0, rows, &v->v_all[k]);
    }
    if (s == HR_OK) s = layer_views(v);
    if (s != HR_OK) {
        hr_kv_cache_free(v);
        return s;
    }
    *out = v;
    return HR_OK;
}

hr_status hr_kv_cache_set_len(hr_kv_cache *c, int64_t len) {
    if (!c) return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_set_len: NULL cache");
    if (len < 0 || len > c->capacity)
        return hr_error(HR_ERR_INVALID_ARG, "hr_kv_cache_set_len: %lld outside 0..%lld", (long long)len,
                        (long long)c->capacity);
    c->len = len;
    return HR_OK;
}

bool hr_kv_cache_ring_wraps(const hr_kv_cache *c) {
    return c && c->k_all[HR_LAYER_SLIDING] && ring_wraps(c, HR_LAYER_SLIDING);
}
