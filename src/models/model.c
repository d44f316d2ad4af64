/* Model loading and the forward pass shared by the decoder-only
 * architectures: embedding, the architecture's layers over the static KV
 * cache, final norm, lm_head. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/kv_cache.h"
#include "io/st_internal.h"
#include "models/model_impl.h"
#include "models/weights_anon.h"

#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})

/* ---- loading ------------------------------------------------------------- */

static bool rope_depends_on_len(const hr_rope_config *r) {
    return r->type == HR_ROPE_DYNAMIC || r->type == HR_ROPE_LONGROPE;
}

static hr_status load_weights(hr_model *m) {
    const hr_model_config *c = &m->cfg;
    int64_t emb_shape[2] = {c->vocab_size, c->hidden_size};
    HR_TRY(hr_model_weight(m, "model.embed_tokens.weight", 2, emb_shape, &m->embed));
    HR_TRY(hr_model_weight(m, "model.norm.weight", 1, &c->hidden_size, &m->final_norm));
    if (c->tie_word_embeddings)
        HR_TRY(hr_tensor_alias(m->embed, &m->lm_head));
    else
        HR_TRY(hr_model_weight(m, "lm_head.weight", 2, emb_shape, &m->lm_head));
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return hr_error(HR_ERR_OOM, "model layers");
    for (int64_t i = 0; i < c->n_layers; i++) HR_TRY(m->arch->load_layer(m, i, &m->layers[i]));
    /* Every weight went to the device as it loaded (hr_model_weight drops
     * its pages then); pages mapped back around later reads go now. */
    if (m->dev != hr_device_cpu()) hr_checkpoint_drop_all(m->ckpt);
    return hr_model_weights_to_anon(m);
}

static hr_status resolve_dtype(const hr_model_options *opts, const hr_model_config *cfg, hr_dtype *out) {
    *out = cfg->dtype;
    if (!opts || !opts->dtype || !strcmp(opts->dtype, "auto")) return HR_OK;
    if (hr_dtype_parse(opts->dtype, out) != HR_OK || !hr_dtype_is_float(*out) || *out == HR_F64)
        return hr_error(HR_ERR_INVALID_ARG, "dtype '%s' is not supported for models (bfloat16, float16, float32)",
                        opts->dtype);
    return HR_OK;
}

static hr_status model_init(hr_model *m, const char *dir, const hr_model_options *opts) {
    hr_json_doc *doc = NULL;
    HR_TRY(hr_model_config_load(dir, &m->cfg, &doc));
    hr_status s = HR_OK;
    m->arch = hr_arch_find(m->cfg.arch);
    if (!m->arch)
        s = hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: architecture '%s' is not supported; supported: %s", dir,
                     m->cfg.arch, hr_model_supported_archs());
    if (s == HR_OK) s = m->arch->configure(hr_json_doc_root(doc), &m->cfg);
    hr_json_doc_free(doc);
    HR_TRY(s);
    HR_TRY(resolve_dtype(opts, &m->cfg, &m->dtype));
    HR_TRY(hr_device_get(opts && opts->device ? opts->device : "cpu", &m->dev));
    if (!rope_depends_on_len(&m->cfg.rope)) {
        m->inv_freq = malloc(sizeof(float) * (size_t)(m->cfg.rope.rotary_dim / 2));
        if (!m->inv_freq) return hr_error(HR_ERR_OOM, "rope frequencies");
        HR_TRY(hr_rope_inv_freq(&m->cfg.rope, m->cfg.max_position_embeddings, m->inv_freq, &m->attn_scaling));
    }
    HR_TRY(hr_checkpoint_open(dir, &m->ckpt));
    return load_weights(m);
}

hr_status hr_model_load(const char *dir, const hr_model_options *opts, hr_model **out) {
    if (!dir || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_model_load: NULL argument");
    *out = NULL;
    hr_model *m = calloc(1, sizeof *m);
    if (!m) return hr_error(HR_ERR_OOM, "hr_model_load: out of memory");
    hr_status s = model_init(m, dir, opts);
    if (s != HR_OK) {
        hr_model_free(m);
        return s;
    }
    *out = m;
    return HR_OK;
}

void hr_model_scratch_free(hr_scratch *sc) {
    hr_tensor **all[] = {&sc->x, &sc->h, &sc->q, &sc->k, &sc->v, &sc->qn, &sc->kn, &sc->qr,
                         &sc->attn, &sc->o, &sc->gate, &sc->up, &sc->act, &sc->cos, &sc->sin,
                         &sc->head};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        hr_tensor_free(*all[i]);
        *all[i] = NULL;
    }
    sc->b = sc->s = 0;
}

void hr_model_free(hr_model *m) {
    if (!m) return;
    hr_model_scratch_free(&m->scratch);
    hr_jit_free(m->jit[0]);
    hr_jit_free(m->jit[1]);
    if (m->layers)
        for (int64_t i = 0; i < m->cfg.n_layers; i++) hr_layer_weights_free(&m->layers[i]);
    free(m->layers);
    hr_tensor_free(m->embed);
    hr_tensor_free(m->final_norm);
    hr_tensor_free(m->lm_head);
    hr_checkpoint_close(m->ckpt);
    free(m->inv_freq);
    hr_model_config_free(&m->cfg);
    free(m);
}

const char *hr_model_arch(const hr_model *m) { return m->cfg.arch; }
hr_dtype hr_model_dtype(const hr_model *m) { return m->dtype; }
int64_t hr_model_vocab_size(const hr_model *m) { return m->cfg.vocab_size; }
int64_t hr_model_max_positions(const hr_model *m) { return m->cfg.max_position_embeddings; }
int64_t hr_model_pad_id(const hr_model *m) { return m->cfg.gen.pad_token_id; }
const hr_generation_config *hr_model_generation_config(const hr_model *m) { return &m->cfg.gen; }
int hr_model_eos_ids(const hr_model *m, const int64_t **ids) {
    *ids = m->cfg.gen.eos_token_ids;
    return m->cfg.gen.n_eos;
}

/* ---- forward ------------------------------------------------------------- */

static hr_status empty(const hr_model *m, hr_dtype dt, int ndim, const int64_t *shape, hr_tensor **t) {
    return hr_tensor_empty(m->dev, dt, ndim, shape, t);
}

/* Activations for [b, s], reallocated only when the shape changes. */
hr_status hr_model_scratch_prepare(hr_model *m, int64_t b, int64_t s) {
    if (m->scratch.b == b && m->scratch.s == s) return HR_OK;
    hr_model_scratch_free(&m->scratch);
    return hr_model_scratch_alloc(m, b, s, &m->scratch);
}

hr_status hr_model_scratch_alloc(const hr_model *m, int64_t b, int64_t s, hr_scratch *sc) {
    memset(sc, 0, sizeof *sc);
    const hr_model_config *c = &m->cfg;
    hr_dtype dt = m->dtype;
    int64_t H = c->hidden_size, d = c->head_dim, hq = c->n_heads, hkv = c->n_kv_heads;
    int64_t rot = c->rope.rotary_dim;
    hr_status st = HR_OK;
    /* named, so that errors and a debugger show which activation is at fault */
#define ALLOC_(field, dtype_, ...)                                                                          \
    if (st == HR_OK) st = empty(m, dtype_, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),      \
                                (int64_t[]){__VA_ARGS__}, &sc->field);                                     \
    if (st == HR_OK) hr_tensor_set_name(sc->field, "act." #field)
    ALLOC_(x, dt, b, s, H);
    ALLOC_(h, dt, b, s, H);
    ALLOC_(q, dt, b, s, hq * d);
    ALLOC_(k, dt, b, s, hkv * d);
    ALLOC_(v, dt, b, s, hkv * d);
    ALLOC_(qn, dt, b, s, hq, d);
    ALLOC_(kn, dt, b, s, hkv, d);
    ALLOC_(qr, dt, b, hq, s, d);
    ALLOC_(attn, dt, b, s, hq, d);
    ALLOC_(o, dt, b, s, H);
    ALLOC_(gate, dt, b, s, c->intermediate_size);
    ALLOC_(up, dt, b, s, c->intermediate_size);
    ALLOC_(act, dt, b, s, c->intermediate_size);
    ALLOC_(cos, dt, b, 1, s, rot);
    ALLOC_(sin, dt, b, 1, s, rot);
#undef ALLOC_
    if (st != HR_OK) {
        hr_model_scratch_free(sc);
        return hr_error_context(st, "activations for batch %lld x %lld tokens", (long long)b, (long long)s);
    }
    sc->b = b;
    sc->s = s;
    return HR_OK;
}

/* cos/sin [b, 1, s, rot] for positions [b, s]; dynamic and longrope rope
 * recompute their frequencies from the largest position, as transformers
 * does per forward. */
hr_status hr_model_to_device(const hr_model *m, hr_tensor **t) {
    if (hr_tensor_device(*t) == m->dev) return HR_OK;
    hr_tensor *d = NULL;
    hr_status s = hr_tensor_to(*t, m->dev, &d);
    hr_tensor_free(*t);
    *t = d;
    return s;
}

hr_status hr_model_rope_tables(hr_model *m, const int64_t *pos, int64_t n, const hr_tensor *positions) {
    const hr_rope_config *r = &m->cfg.rope;
    int64_t half = r->rotary_dim / 2;
    float local[512];
    float *inv = m->inv_freq;
    double scaling = m->attn_scaling;
    if (!inv) {
        int64_t maxp = 0;
        for (int64_t i = 0; i < n; i++) maxp = pos[i] > maxp ? pos[i] : maxp;
        if (half > 512) return hr_error(HR_ERR_UNSUPPORTED, "rotary dim %lld too large", (long long)r->rotary_dim);
        inv = local;
        int64_t len = maxp + 1;
        if (r->type == HR_ROPE_DYNAMIC && len < r->max_position_embeddings) len = r->max_position_embeddings;
        HR_TRY(hr_rope_inv_freq(r, len, inv, &scaling));
    }
    hr_tensor *inv_t = NULL, *cos_v = NULL, *sin_v = NULL;
    const hr_scratch *sc = &m->scratch;
    HR_TRY(hr_tensor_wrap_host(HR_F32, 1, &half, NULL, inv, sizeof(float) * (size_t)half, NULL, NULL, &inv_t));
    hr_tensor *pos_dev = NULL;
    hr_status s = hr_model_to_device(m, &inv_t);
    if (s == HR_OK) s = hr_tensor_alias(positions, &pos_dev);
    if (s == HR_OK) s = hr_model_to_device(m, &pos_dev);
    if (s != HR_OK) {
        hr_tensor_free(inv_t);
        hr_tensor_free(pos_dev);
        return s;
    }
    /* rope_cos_sin gives [b, s, rot]; the scratch is [b, 1, s, rot]. */
    s = hr_tensor_view(sc->cos, 3, (int64_t[]){sc->b, sc->s, r->rotary_dim}, &cos_v);
    if (s == HR_OK) s = hr_tensor_view(sc->sin, 3, (int64_t[]){sc->b, sc->s, r->rotary_dim}, &sin_v);
    if (s == HR_OK) {
        hr_attrs_rope_cos_sin a = {.attention_scaling = scaling, .dtype = m->dtype};
        hr_tensor *o[2] = {cos_v, sin_v};
        s = hr_op_run(HR_OP_rope_cos_sin, &a, IN_(pos_dev, inv_t), 2, o, 2);
    }
    hr_tensor_free(inv_t);
    hr_tensor_free(pos_dev);
    hr_tensor_free(cos_v);
    hr_tensor_free(sin_v);
    return s;
}

/* bool [b, 1, s, t]: query i (at cache slot past + i) sees slot j <= past + i
 * when j holds a real token. A padding query sees itself, which keeps its
 * row finite; its outputs are never used. */
static hr_status build_mask(hr_model *m, const int64_t *mask, int64_t b, int64_t s, int64_t past,
                            hr_tensor **out) {
    int64_t t = past + s;
    hr_tensor *mt = NULL;
    HR_TRY(hr_tensor_empty(hr_device_cpu(), HR_BOOL, 4, (int64_t[]){b, 1, s, t}, &mt));
    uint8_t *p = hr_tensor_data(mt);
    for (int64_t r = 0; r < b; r++)
        for (int64_t i = 0; i < s; i++) {
            uint8_t *row = p + (r * s + i) * t;
            for (int64_t j = 0; j < t; j++)
                row[j] = j <= past + i && (mask[r * t + j] != 0 || j == past + i);
        }
    if (m->dev == hr_device_cpu()) {
        *out = mt;
        return HR_OK;
    }
    hr_status st = hr_tensor_to(mt, m->dev, out);
    hr_tensor_free(mt);
    return st;
}

static bool all_ones(const int64_t *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!v[i]) return false;
    return true;
}

static bool has_shape(const hr_tensor *t, hr_dtype dt, int64_t b, int64_t n, int64_t v) {
    return t && t->dtype == dt && t->ndim == 3 && t->shape[0] == b && t->shape[1] == n && t->shape[2] == v;
}

/* Logits of h [b, n, hidden] into *logits, reused when it already has the
 * shape and dtype (decode steps): f32, a reduced-precision model's head
 * output cast through a reused scratch as transformers' logits are; with
 * `f32` false, the head output itself, in the model's dtype (the caller
 * widens the rows it reads, skipping a pass over [b, n, vocab]). */
static hr_status lm_head(hr_model *m, const hr_tensor *h, bool f32, hr_tensor **logits) {
    int64_t b = h->shape[0], n = h->shape[1], v = m->cfg.vocab_size;
    hr_dtype dt = f32 ? HR_F32 : m->dtype;
    hr_scratch *sc = &m->scratch;
    if (!has_shape(*logits, dt, b, n, v)) {
        hr_tensor_free(*logits);
        *logits = NULL;
        HR_TRY(hr_tensor_empty(m->dev, dt, 3, (int64_t[]){b, n, v}, logits));
    }
    if (dt == m->dtype) return hr_op_run(HR_OP_linear, NULL, IN_(h, m->lm_head), 2, logits, 1);
    if (!has_shape(sc->head, m->dtype, b, n, v)) {
        hr_tensor_free(sc->head);
        sc->head = NULL;
        HR_TRY(hr_tensor_empty(m->dev, m->dtype, 3, (int64_t[]){b, n, v}, &sc->head));
    }
    HR_TRY(hr_op_run(HR_OP_linear, NULL, IN_(h, m->lm_head), 2, &sc->head, 1));
    hr_attrs_cast a = {.dtype = HR_F32};
    return hr_op_run(HR_OP_cast, &a, IN_(sc->head), 1, logits, 1);
}

hr_status hr_model_check_forward(const hr_model *m, const int64_t *ids, int64_t b, int64_t s,
                                 const hr_kv_cache *cache) {
    if (cache->batch != b)
        return hr_error(HR_ERR_SHAPE, "forward: batch %lld does not match the KV cache's batch %lld", (long long)b,
                        (long long)cache->batch);
    int64_t past = cache->len, t = past + s;
    if (t > cache->capacity)
        return hr_error(HR_ERR_INVALID_ARG, "forward: %lld cached + %lld new tokens do not fit the KV cache of %lld",
                        (long long)past, (long long)s, (long long)cache->capacity);
    for (int64_t i = 0; i < b * s; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
            return hr_error(HR_ERR_INVALID_ARG, "forward: input_ids[%lld] = %lld is outside the vocabulary of %lld",
                            (long long)i, (long long)ids[i], (long long)m->cfg.vocab_size);
    return HR_OK;
}

hr_status hr_model_forward_core(hr_model *m, const hr_tensor *ids_t, const hr_fwd_ctx *f, bool last_only,
                                bool f32_logits, hr_tensor **logits) {
    hr_scratch *sc = &m->scratch;
    hr_tensor *h_last = NULL, *o[1] = {sc->x};
    int64_t s = sc->s;
    hr_status st = hr_op_run(HR_OP_embedding, NULL, IN_(m->embed, ids_t), 2, o, 1);
    for (int64_t l = 0; st == HR_OK && l < m->cfg.n_layers; l++)
        st = m->arch->forward_layer(m, &m->layers[l], l, f);
    if (st == HR_OK) st = hr_block_norm(m, sc->x, m->final_norm, sc->h);
    if (st == HR_OK) st = last_only ? hr_tensor_narrow(sc->h, 1, s - 1, 1, &h_last) : hr_tensor_alias(sc->h, &h_last);
    if (st == HR_OK) st = lm_head(m, h_last, f32_logits, logits);
    hr_tensor_free(h_last);
    return st;
}

hr_status hr_model_forward_host(hr_model *m, const int64_t *ids, const int64_t *mask, const int64_t *pos,
                                int64_t b, int64_t s, hr_kv_cache *cache, bool last_only, bool f32_logits,
                                hr_tensor **logits) {
    HR_TRY(hr_model_check_forward(m, ids, b, s, cache));
    int64_t past = cache->len, t = past + s;
    HR_TRY(hr_model_scratch_prepare(m, b, s));
    hr_scratch *sc = &m->scratch;
    hr_tensor *ids_t = NULL, *pos_t = NULL, *mask_t = NULL;
    hr_fwd_ctx f = {.cache = cache, .past = past, .cos = sc->cos, .sin = sc->sin};
    int64_t shape[2] = {b, s};
    hr_status st = hr_tensor_wrap_host(HR_I64, 2, shape, NULL, (void *)ids, sizeof(int64_t) * (size_t)(b * s),
                                       NULL, NULL, &ids_t);
    if (st == HR_OK)
        st = hr_tensor_wrap_host(HR_I64, 2, shape, NULL, (void *)pos, sizeof(int64_t) * (size_t)(b * s), NULL,
                                 NULL, &pos_t);
    if (st == HR_OK) st = hr_model_rope_tables(m, pos, b * s, pos_t);
    if (st == HR_OK) st = hr_model_to_device(m, &ids_t);
    if (st == HR_OK && mask && !all_ones(mask, b * t)) {
        st = build_mask(m, mask, b, s, past, &mask_t);
        f.mask = mask_t;
    }
    if (st == HR_OK) st = hr_model_forward_core(m, ids_t, &f, last_only, f32_logits, logits);
    hr_tensor_free(ids_t);
    hr_tensor_free(pos_t);
    hr_tensor_free(mask_t);
    if (st == HR_OK) cache->len = t;
    return st;
}

/* ---- forward on tensors --------------------------------------------------- */

/* Integer/bool tensor [rows, cols] -> malloc'd i64 array; errors name `what`. */
static hr_status read_i64(const hr_tensor *t, const char *what, int64_t rows, int64_t cols, int64_t **out) {
    *out = NULL;
    const int64_t *sh = hr_tensor_shape(t);
    if (hr_tensor_ndim(t) != 2 || sh[0] != rows || sh[1] != cols) {
        char a[160];
        return hr_error(HR_ERR_SHAPE, "forward: %s has shape %s, expected [%lld, %lld]", what,
                        hr_shape_str(hr_tensor_ndim(t), sh, a, sizeof a), (long long)rows, (long long)cols);
    }
    hr_dtype dt = hr_tensor_dtype(t);
    if (hr_dtype_is_float(dt))
        return hr_error(HR_ERR_DTYPE, "forward: %s must be an integer or bool tensor, not %s", what, hr_dtype_name(dt));
    size_t n = (size_t)(rows * cols), isz = hr_dtype_size(dt);
    int64_t *v = malloc(sizeof(int64_t) * (n ? n : 1));
    unsigned char *raw = malloc(isz * (n ? n : 1));
    hr_status s = v && raw ? hr_tensor_read(t, raw, isz * n) : hr_error(HR_ERR_OOM, "forward: %s", what);
    for (size_t i = 0; s == HR_OK && i < n; i++) {
        const unsigned char *p = raw + i * isz;
        switch (dt) {
        case HR_I64: { int64_t x; memcpy(&x, p, 8); v[i] = x; break; }
        case HR_I32: { int32_t x; memcpy(&x, p, 4); v[i] = x; break; }
        case HR_I16: { int16_t x; memcpy(&x, p, 2); v[i] = x; break; }
        case HR_I8: v[i] = (int8_t)*p; break;
        default: v[i] = *p; break; /* u8, bool */
        }
    }
    free(raw);
    if (s != HR_OK) {
        free(v);
        return s;
    }
    *out = v;
    return HR_OK;
}

hr_status hr_model_forward(hr_model *m, const hr_forward_args *a, hr_tensor **logits) {
    if (!m || !a || !a->input_ids || !logits) return hr_error(HR_ERR_INVALID_ARG, "hr_model_forward: NULL argument");
    *logits = NULL;
    const hr_tensor *ids_t = a->input_ids;
    if (hr_tensor_ndim(ids_t) != 2 || hr_tensor_shape(ids_t)[1] < 1)
        return hr_error(HR_ERR_SHAPE, "forward: input_ids must be [batch, seq] with seq >= 1");
    int64_t b = hr_tensor_shape(ids_t)[0], s = hr_tensor_shape(ids_t)[1];
    hr_kv_cache *cache = a->cache, *tmp = NULL;
    if (!cache) HR_TRY(hr_kv_cache_create(m, b, s, &tmp));
    if (tmp) cache = tmp;
    int64_t past = cache->len;
    int64_t *ids = NULL, *mask = NULL, *pos = NULL;
    hr_status st = read_i64(ids_t, "input_ids", b, s, &ids);
    if (st == HR_OK && a->attention_mask) st = read_i64(a->attention_mask, "attention_mask", b, past + s, &mask);
    if (st == HR_OK && a->positions) {
        st = read_i64(a->positions, "positions", b, s, &pos);
    } else if (st == HR_OK) {
        pos = malloc(sizeof(int64_t) * (size_t)(b * s));
        if (!pos) st = hr_error(HR_ERR_OOM, "forward: positions");
        for (int64_t i = 0; pos && i < b * s; i++) pos[i] = past + i % s;
    }
    if (st == HR_OK) st = hr_model_forward_host(m, ids, mask, pos, b, s, cache, a->last_only, true, logits);
    if (st != HR_OK) {
        hr_tensor_free(*logits);
        *logits = NULL;
    }
    free(ids);
    free(mask);
    free(pos);
    hr_kv_cache_free(tmp);
    return st;
}
