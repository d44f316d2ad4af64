/* T5EncoderModel (transformers): SD3's third text encoder (T5 v1.1 XXL).
 *
 * Embedding, then blocks of RMS-normed (T5LayerNorm) self-attention without
 * the 1/sqrt(d) scale, every layer adding the relative position bias that
 * the first layer's table gives (bidirectional buckets: exact up to 8,
 * logarithmic up to max_distance), then an RMS-normed feed-forward (T5
 * v1.1's gelu_new-gated one, or v1.0's relu), and the final norm. In
 * float16 each sublayer's output is clamped as transformers does, to keep
 * overflow finite: to +-(65504 - 1000) when it holds an infinity, else
 * left as it is. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "hubrt/image_models.h"
#include "hubrt/ops.h"
#include "models/component.h"

typedef struct t5_block {
    hr_tensor *ln1, *q, *k, *v, *o, *ln2, *wi0, *wi1, *wo; /* wi1 NULL: not gated (wi0 is wi) */
} t5_block;

struct hr_t5_encoder {
    hr_component c;
    int64_t vocab, d, d_kv, d_ff, layers, heads, buckets, max_distance;
    double eps;
    bool gated;
    hr_gelu_approx act; /* gated: gelu_new (tanh) or gelu (erf); -1 relu */
    bool relu;
    hr_tensor *embed, *rel_bias, *final_ln;
    t5_block *b;
};

static hr_status read_config(hr_t5_encoder *m) {
    hr_json_obj r = hr_json_doc_root(m->c.config);
    const char *where = m->c.dir, *ff = NULL, *act = NULL;
    HR_TRY(hr_json_get_i64(r, "vocab_size", 32128, &m->vocab));
    HR_TRY(hr_json_get_i64(r, "d_model", 512, &m->d));
    HR_TRY(hr_json_get_i64(r, "d_kv", 64, &m->d_kv));
    HR_TRY(hr_json_get_i64(r, "d_ff", 2048, &m->d_ff));
    HR_TRY(hr_json_get_i64(r, "num_layers", 6, &m->layers));
    HR_TRY(hr_json_get_i64(r, "num_heads", 8, &m->heads));
    HR_TRY(hr_json_get_i64(r, "relative_attention_num_buckets", 32, &m->buckets));
    HR_TRY(hr_json_get_i64(r, "relative_attention_max_distance", 128, &m->max_distance));
    HR_TRY(hr_json_get_f64(r, "layer_norm_epsilon", 1e-6, &m->eps));
    HR_TRY(hr_json_get_str(r, "feed_forward_proj", "relu", &ff));
    m->gated = !strncmp(ff, "gated-", 6);
    act = m->gated ? ff + 6 : ff;
    if (!strcmp(act, "relu")) {
        m->relu = true;
    } else if (!strcmp(act, "gelu") && m->gated) {
        m->act = HR_GELU_TANH; /* transformers maps gated-gelu to gelu_new */
    } else if (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh")) {
        m->act = HR_GELU_TANH;
    } else if (!strcmp(act, "gelu")) {
        m->act = HR_GELU_ERF;
    } else {
        return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: feed_forward_proj '%s' (hubrt has relu, gated-gelu, "
                        "gelu_new)", where, ff);
    }
    if (m->vocab < 1 || m->d < 1 || m->d_kv < 1 || m->d_ff < 1 || m->layers < 1 || m->layers > 256 || m->heads < 1 ||
        m->buckets < 4 || m->max_distance < 2)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: sizes must be positive (num_layers <= 256, "
                        "relative_attention_num_buckets >= 4)", where);
    return HR_OK;
}

static hr_status mat(hr_t5_encoder *m, const char *name, int64_t rows, int64_t cols, hr_tensor **out) {
    return hr_component_param(&m->c, name, 2, (int64_t[]){rows, cols}, out);
}

static hr_status vec(hr_t5_encoder *m, const char *name, hr_tensor **out) {
    return hr_component_param(&m->c, name, 1, (int64_t[]){m->d}, out);
}

static hr_status load_weights(hr_t5_encoder *m) {
    int64_t inner = m->heads * m->d_kv;
    /* the embedding is tied: stored as shared.weight, encoder.embed_tokens.weight or both */
    const char *emb = hr_checkpoint_has(m->c.ck, "encoder.embed_tokens.weight") ? "encoder.embed_tokens.weight"
                                                                                 : "shared.weight";
    HR_TRY(mat(m, emb, m->vocab, m->d, &m->embed));
    HR_TRY(mat(m, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", m->buckets, m->heads,
               &m->rel_bias));
    for (int64_t i = 0; i < m->layers; i++) {
        t5_block *b = &m->b[i];
        char n[200];
#define P_(fmt) (snprintf(n, sizeof n, "encoder.block.%lld.layer." fmt, (long long)i), n)
        HR_TRY(vec(m, P_("0.layer_norm.weight"), &b->ln1));
        HR_TRY(mat(m, P_("0.SelfAttention.q.weight"), inner, m->d, &b->q));
        HR_TRY(mat(m, P_("0.SelfAttention.k.weight"), inner, m->d, &b->k));
        HR_TRY(mat(m, P_("0.SelfAttention.v.weight"), inner, m->d, &b->v));
        HR_TRY(mat(m, P_("0.SelfAttention.o.weight"), m->d, inner, &b->o));
        HR_TRY(vec(m, P_("1.layer_norm.weight"), &b->ln2));
        if (m->gated) {
            HR_TRY(mat(m, P_("1.DenseReluDense.wi_0.weight"), m->d_ff, m->d, &b->wi0));
            HR_TRY(mat(m, P_("1.DenseReluDense.wi_1.weight"), m->d_ff, m->d, &b->wi1));
        } else {
            HR_TRY(mat(m, P_("1.DenseReluDense.wi.weight"), m->d_ff, m->d, &b->wi0));
        }
        HR_TRY(mat(m, P_("1.DenseReluDense.wo.weight"), m->d, m->d_ff, &b->wo));
#undef P_
    }
    return vec(m, "encoder.final_layer_norm.weight", &m->final_ln);
}

/* ---- forward -------------------------------------------------------------------- */

/* T5's bidirectional relative-position bucket of key j seen from query i,
 * with the f32 arithmetic transformers uses for the logarithmic part. */
static int64_t bucket(const hr_t5_encoder *m, int64_t i, int64_t j) {
    int64_t nb = m->buckets / 2, rel = j - i, out = rel > 0 ? nb : 0;
    rel = rel < 0 ? -rel : rel;
    int64_t exact = nb / 2;
    if (rel < exact) return out + rel;
    float scaled = logf((float)rel / (float)exact) / (float)log((double)m->max_distance / (double)exact) *
                   (float)(nb - exact);
    int64_t large = exact + (int64_t)scaled;
    return out + (large < nb - 1 ? large : nb - 1);
}

/* The position bias [1, heads, l, l] in the model's dtype. */
static hr_status position_bias(const hr_t5_encoder *m, int64_t l, hr_tensor **out) {
    int64_t *idx = malloc((size_t)(l * l) * sizeof *idx);
    if (!idx) return hr_error(HR_ERR_OOM, "t5: position buckets");
    for (int64_t i = 0; i < l; i++)
        for (int64_t j = 0; j < l; j++) idx[i * l + j] = bucket(m, i, j);
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *it, *e, *p, *pc;
    T(it, hr_tensor_from_host(hr_tensor_device(m->rel_bias), HR_I64, 2, (int64_t[]){l, l}, idx,
                              (size_t)(l * l) * sizeof *idx, &it));
    T(e, hr_embedding(m->rel_bias, it, &e)); /* [l, l, heads] */
    T(p, hr_tensor_permute(e, 3, (const int[]){2, 0, 1}, &p));
    T(pc, hr_contiguous(p, &pc));
    RUN(hr_tensor_unsqueeze(pc, 0, out));
done:
    free(idx);
    hr_temps_free(&tp);
    return s;
}

/* T5LayerNorm: x * rsqrt(mean(x^2) + eps) in f32, rounded to the weight's
 * 16-bit dtype, times the weight: hr_rms_norm's Llama form. */
static hr_status t5_norm(const hr_t5_encoder *m, const hr_tensor *x, const hr_tensor *w, hr_tensor **out) {
    return hr_rms_norm(x, w, m->eps, 0, out);
}

/* transformers' float16 clamp of a sublayer's output (see the top). */
static hr_status fp16_clamp(hr_tensor **x) {
    if (hr_tensor_dtype(*x) != HR_F16) return HR_OK;
    hr_tensor *a = NULL, *flat = NULL, *mx = NULL, *f = NULL, *c = NULL;
    int64_t n = hr_tensor_numel(*x);
    float amax = 0;
    hr_status s = hr_abs(*x, &a);
    if (s == HR_OK) s = hr_tensor_reshape(a, 1, &n, &flat);
    if (s == HR_OK) s = hr_max(flat, 0, false, &mx);
    if (s == HR_OK) s = hr_cast(mx, HR_F32, &f);
    if (s == HR_OK) s = hr_tensor_read(f, &amax, sizeof amax);
    if (s == HR_OK && isinf(amax)) {
        const double lo = -(65504.0 - 1000), hi = 65504.0 - 1000;
        s = hr_clamp(*x, &lo, &hi, &c);
        if (s == HR_OK) {
            hr_tensor_free(*x);
            *x = c;
        }
    }
    hr_tensor_free(a);
    hr_tensor_free(flat);
    hr_tensor_free(mx);
    hr_tensor_free(f);
    return s;
}

static hr_status heads(const hr_t5_encoder *m, const hr_tensor *x, const hr_tensor *w, hr_tensor **out) {
    const int64_t *xs = hr_tensor_shape(x);
    hr_tensor *y = NULL, *v = NULL;
    hr_status s = hr_linear(x, w, NULL, &y);
    if (s == HR_OK) s = hr_tensor_view(y, 4, (int64_t[]){xs[0], xs[1], m->heads, m->d_kv}, &v);
    if (s == HR_OK) s = hr_tensor_transpose(v, 1, 2, out);
    hr_tensor_free(y);
    hr_tensor_free(v);
    return s;
}

static hr_status block(const hr_t5_encoder *m, const t5_block *b, const hr_tensor *bias, hr_tensor **xp) {
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *x = *xp, *h, *q, *k, *v, *o, *ot, *oc, *flat, *ao, *x1 = NULL, *h2, *g, *ga, *lin, *prod, *f, *x2 = NULL;
    const int64_t *xs = hr_tensor_shape(x);
    T(h, t5_norm(m, x, b->ln1, &h));
    T(q, heads(m, h, b->q, &q));
    T(k, heads(m, h, b->k, &k));
    T(v, heads(m, h, b->v, &v));
    hr_attrs_sdpa sa = {.scale = 1.0}; /* T5 folds the scale into its weights */
    T(o, hr_sdpa(q, k, v, bias, &sa, &o));
    T(ot, hr_tensor_transpose(o, 1, 2, &ot));
    T(oc, hr_contiguous(ot, &oc));
    T(flat, hr_tensor_view(oc, 3, (int64_t[]){xs[0], xs[1], m->heads * m->d_kv}, &flat));
    T(ao, hr_linear(flat, b->o, NULL, &ao));
    RUN(hr_add(x, ao, &x1));
    RUN(fp16_clamp(&x1));
    T(h2, t5_norm(m, x1, b->ln2, &h2));
    T(g, hr_linear(h2, b->wi0, NULL, &g));
    if (m->relu)
        T(ga, hr_relu(g, &ga));
    else
        T(ga, hr_gelu(g, m->act, &ga));
    if (m->gated) {
        T(lin, hr_linear(h2, b->wi1, NULL, &lin));
        T(prod, hr_mul(ga, lin, &prod));
    } else {
        prod = ga;
    }
    T(f, hr_linear(prod, b->wo, NULL, &f));
    RUN(hr_add(x1, f, &x2));
    RUN(fp16_clamp(&x2));
done:
    hr_temps_free(&tp);
    hr_tensor_free(x1);
    if (s != HR_OK) {
        hr_tensor_free(x2);
        return s;
    }
    hr_tensor_free(*xp);
    *xp = x2;
    return HR_OK;
}

hr_status hr_t5_encoder_forward(hr_t5_encoder *m, const hr_tensor *ids, hr_tensor **out) {
    if (!m || !ids || !out) return hr_error(HR_ERR_INVALID_ARG, "t5 encoder: NULL argument");
    *out = NULL;
    const int64_t *is = hr_tensor_shape(ids);
    if (hr_tensor_ndim(ids) != 2 || is[1] < 1 || hr_dtype_is_float(hr_tensor_dtype(ids))) {
        char sh[160];
        return hr_error(HR_ERR_SHAPE, "t5 encoder: input_ids %s %s must be integer [b, l]",
                        hr_shape_str(hr_tensor_ndim(ids), is, sh, sizeof sh), hr_dtype_name(hr_tensor_dtype(ids)));
    }
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *x = NULL, *bias, *idv;
    T(idv, hr_component_input(&m->c, ids, HR_DTYPE_COUNT, &idv));
    T(bias, position_bias(m, is[1], &bias));
    RUN(hr_embedding(m->embed, idv, &x));
    for (int64_t i = 0; i < m->layers; i++) RUN(block(m, &m->b[i], bias, &x));
    RUN(t5_norm(m, x, m->final_ln, out));
done:
    hr_temps_free(&tp);
    hr_tensor_free(x);
    return s;
}

static const char *const t5_archs[] = {"T5EncoderModel", "T5ForConditionalGeneration", "T5Model", NULL};

hr_status hr_t5_encoder_load(const char *dir, const hr_component_options *opts, hr_t5_encoder **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_t5_encoder_load: NULL argument");
    *out = NULL;
    hr_t5_encoder *m = calloc(1, sizeof *m);
    hr_status s = m ? hr_component_open(&m->c, dir, NULL, opts) : hr_error(HR_ERR_OOM, "t5 encoder");
    if (s == HR_OK) s = hr_component_check_arch(&m->c, t5_archs, "a T5 model");
    if (s == HR_OK) s = read_config(m);
    if (s == HR_OK && !(m->b = calloc((size_t)m->layers, sizeof *m->b))) s = hr_error(HR_ERR_OOM, "t5 blocks");
    if (s == HR_OK) s = load_weights(m);
    if (s != HR_OK) {
        hr_t5_encoder_free(m);
        return s;
    }
    *out = m;
    return HR_OK;
}

void hr_t5_encoder_free(hr_t5_encoder *m) {
    if (!m) return;
    hr_component_close(&m->c);
    free(m->b);
    free(m);
}

int64_t hr_t5_encoder_d_model(const hr_t5_encoder *m) { return m->d; }
