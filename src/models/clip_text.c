/* CLIPTextModel / CLIPTextModelWithProjection (transformers): token and
 * position embeddings, pre-norm causal self-attention layers with a
 * quick_gelu (CLIP-L) or gelu (CLIP-G) MLP, a final layer norm, the pooled
 * row at each prompt's end-of-text token, and the text projection.
 *
 * SD3 reads the penultimate entry of hidden_states (the output of the
 * next-to-last layer, before the final norm) and the projected pooled
 * row, so a forward returns any entry of hidden_states by Python index
 * beside text_embeds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "hubrt/image_models.h"
#include "hubrt/ops.h"
#include "models/component.h"

typedef enum { ACT_QUICK_GELU, ACT_GELU, ACT_GELU_TANH } clip_act;

typedef struct clip_layer {
    hr_tensor *ln1w, *ln1b, *qw, *qb, *kw, *kb, *vw, *vb, *ow, *ob, *ln2w, *ln2b, *f1w, *f1b, *f2w, *f2b;
} clip_layer;

struct hr_clip_text {
    hr_component c;
    int64_t vocab, dim, inter, layers, heads, max_pos, proj_dim, eos_id;
    double eps;
    clip_act act;
    const char *prefix; /* "text_model." (the Hub's files), or "" (transformers 5's CLIPTextModel) */
    hr_tensor *tok, *pos, *flnw, *flnb, *proj; /* proj NULL: CLIPTextModel */
    clip_layer *l;
};

static hr_status read_config(hr_clip_text *m) {
    hr_json_obj r = hr_json_doc_root(m->c.config), t;
    const char *where = m->c.dir;
    /* a CLIPConfig (the whole model) keeps the text model's fields in text_config */
    HR_TRY(hr_json_get_obj(r, "text_config", &t));
    if (hr_json_obj_present(t)) r = t;
    HR_TRY(hr_json_get_i64(r, "vocab_size", 49408, &m->vocab));
    HR_TRY(hr_json_get_i64(r, "hidden_size", 512, &m->dim));
    HR_TRY(hr_json_get_i64(r, "intermediate_size", 2048, &m->inter));
    HR_TRY(hr_json_get_i64(r, "num_hidden_layers", 12, &m->layers));
    HR_TRY(hr_json_get_i64(r, "num_attention_heads", 8, &m->heads));
    HR_TRY(hr_json_get_i64(r, "max_position_embeddings", 77, &m->max_pos));
    HR_TRY(hr_json_get_i64(r, "projection_dim", 512, &m->proj_dim));
    HR_TRY(hr_json_get_i64(r, "eos_token_id", 2, &m->eos_id));
    HR_TRY(hr_json_get_f64(r, "layer_norm_eps", 1e-5, &m->eps));
    const char *act = NULL;
    HR_TRY(hr_json_get_str(r, "hidden_act", "quick_gelu", &act));
    if (!strcmp(act, "quick_gelu"))
        m->act = ACT_QUICK_GELU;
    else if (!strcmp(act, "gelu"))
        m->act = ACT_GELU;
    else if (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh"))
        m->act = ACT_GELU_TANH;
    else
        return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: hidden_act '%s' (hubrt has quick_gelu, gelu, gelu_new)",
                        where, act);
    if (m->vocab < 1 || m->dim < 1 || m->inter < 1 || m->layers < 1 || m->layers > 256 || m->heads < 1 ||
        m->dim % m->heads || m->max_pos < 1)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: sizes must be positive, num_hidden_layers <= 256 and "
                        "hidden_size %lld a multiple of num_attention_heads %lld", where, (long long)m->dim,
                        (long long)m->heads);
    return HR_OK;
}

static hr_status lin(hr_clip_text *m, const char *p, const char *name, int64_t out, int64_t in, hr_tensor **w,
                     hr_tensor **b) {
    char n[256];
    snprintf(n, sizeof n, "%s.%s", p, name);
    return hr_component_wb(&m->c, n, 2, (int64_t[]){out, in}, true, w, b);
}

static hr_status norm(hr_clip_text *m, const char *p, const char *name, hr_tensor **w, hr_tensor **b) {
    char n[256];
    snprintf(n, sizeof n, "%s.%s", p, name);
    return hr_component_wb(&m->c, n, 1, (int64_t[]){m->dim}, true, w, b);
}

static hr_status load_weights(hr_clip_text *m) {
    int64_t d = m->dim;
    char p[128];
    m->prefix = hr_checkpoint_has(m->c.ck, "text_model.embeddings.token_embedding.weight") ? "text_model." : "";
    snprintf(p, sizeof p, "%sembeddings.token_embedding.weight", m->prefix);
    HR_TRY(hr_component_param(&m->c, p, 2, (int64_t[]){m->vocab, d}, &m->tok));
    snprintf(p, sizeof p, "%sembeddings.position_embedding.weight", m->prefix);
    HR_TRY(hr_component_param(&m->c, p, 2, (int64_t[]){m->max_pos, d}, &m->pos));
    for (int64_t i = 0; i < m->layers; i++) {
        clip_layer *l = &m->l[i];
        snprintf(p, sizeof p, "%sencoder.layers.%lld", m->prefix, (long long)i);
        HR_TRY(norm(m, p, "layer_norm1", &l->ln1w, &l->ln1b));
        HR_TRY(lin(m, p, "self_attn.q_proj", d, d, &l->qw, &l->qb));
        HR_TRY(lin(m, p, "self_attn.k_proj", d, d, &l->kw, &l->kb));
        HR_TRY(lin(m, p, "self_attn.v_proj", d, d, &l->vw, &l->vb));
        HR_TRY(lin(m, p, "self_attn.out_proj", d, d, &l->ow, &l->ob));
        HR_TRY(norm(m, p, "layer_norm2", &l->ln2w, &l->ln2b));
        HR_TRY(lin(m, p, "mlp.fc1", m->inter, d, &l->f1w, &l->f1b));
        HR_TRY(lin(m, p, "mlp.fc2", d, m->inter, &l->f2w, &l->f2b));
    }
    snprintf(p, sizeof p, "%sfinal_layer_norm", m->prefix);
    HR_TRY(hr_component_wb(&m->c, p, 1, (int64_t[]){d}, true, &m->flnw, &m->flnb));
    if (hr_checkpoint_has(m->c.ck, "text_projection.weight"))
        HR_TRY(hr_component_param(&m->c, "text_projection.weight", 2, (int64_t[]){m->proj_dim, d}, &m->proj));
    return HR_OK;
}

/* ---- forward ------------------------------------------------------------------ */

static hr_status heads(const hr_clip_text *m, const hr_tensor *x, const hr_tensor *w, const hr_tensor *b,
                       hr_tensor **out) {
    const int64_t *xs = hr_tensor_shape(x);
    hr_tensor *y = NULL, *v = NULL;
    hr_status s = hr_linear(x, w, b, &y);
    if (s == HR_OK) s = hr_tensor_view(y, 4, (int64_t[]){xs[0], xs[1], m->heads, m->dim / m->heads}, &v);
    if (s == HR_OK) s = hr_tensor_transpose(v, 1, 2, out);
    hr_tensor_free(y);
    hr_tensor_free(v);
    return s;
}

static hr_status activation(const hr_clip_text *m, const hr_tensor *x, hr_tensor **out) {
    if (m->act == ACT_GELU) return hr_gelu(x, HR_GELU_ERF, out);
    if (m->act == ACT_GELU_TANH) return hr_gelu(x, HR_GELU_TANH, out);
    hr_tensor *a = NULL, *sg = NULL; /* x * sigmoid(1.702 x) */
    hr_status s = hr_scale(x, 1.702, 0, &a);
    if (s == HR_OK) s = hr_sigmoid(a, &sg);
    if (s == HR_OK) s = hr_mul(x, sg, out);
    hr_tensor_free(a);
    hr_tensor_free(sg);
    return s;
}

/* x + attn(ln1(x)), then + mlp(ln2(.)): the next hidden state. */
static hr_status layer(const hr_clip_text *m, const clip_layer *l, const hr_tensor *x, hr_tensor **out) {
    hr_temps tp = {0};
    hr_status s;
    const int64_t *xs = hr_tensor_shape(x);
    hr_tensor *h, *q, *k, *v, *o, *ot, *oc, *flat, *ao, *x1, *h2, *f1, *fa, *f2;
    T(h, hr_layer_norm(x, l->ln1w, l->ln1b, m->eps, &h));
    T(q, heads(m, h, l->qw, l->qb, &q));
    T(k, heads(m, h, l->kw, l->kb, &k));
    T(v, heads(m, h, l->vw, l->vb, &v));
    hr_attrs_sdpa sa = {.is_causal = true};
    T(o, hr_sdpa(q, k, v, NULL, &sa, &o));
    T(ot, hr_tensor_transpose(o, 1, 2, &ot));
    T(oc, hr_contiguous(ot, &oc));
    T(flat, hr_tensor_view(oc, 3, xs, &flat));
    T(ao, hr_linear(flat, l->ow, l->ob, &ao));
    T(x1, hr_add(x, ao, &x1));
    T(h2, hr_layer_norm(x1, l->ln2w, l->ln2b, m->eps, &h2));
    T(f1, hr_linear(h2, l->f1w, l->f1b, &f1));
    T(fa, activation(m, f1, &fa));
    T(f2, hr_linear(fa, l->f2w, l->f2b, &f2));
    RUN(hr_add(x1, f2, out));
done:
    hr_temps_free(&tp);
    return s;
}

/* The rows of last [b, l, d] at each prompt's end-of-text token: the
 * largest id (configs with the old eos_token_id 2, as transformers keeps
 * it) or the first eos_token_id. */
static hr_status pooled_rows(const hr_clip_text *m, const hr_tensor *ids, const hr_tensor *last, hr_tensor **out) {
    int64_t b = hr_tensor_shape(ids)[0], l = hr_tensor_shape(ids)[1];
    int64_t *host = malloc((size_t)(b * l) * sizeof *host), *rows = malloc((size_t)b * sizeof *rows);
    hr_tensor *i64 = NULL, *flat = NULL, *idx = NULL;
    hr_status s = host && rows ? hr_cast(ids, HR_I64, &i64) : hr_error(HR_ERR_OOM, "clip: ids");
    if (s == HR_OK) s = hr_tensor_read(i64, host, (size_t)(b * l) * sizeof *host);
    for (int64_t r = 0; s == HR_OK && r < b; r++) {
        int64_t at = 0;
        for (int64_t j = 0; j < l; j++) {
            const int64_t *row = host + r * l;
            if (m->eos_id == 2 ? (int32_t)row[j] > (int32_t)row[at] : row[j] == m->eos_id) {
                at = j;
                if (m->eos_id != 2) break;
            }
        }
        rows[r] = r * l + at;
    }
    if (s == HR_OK) s = hr_tensor_view(last, 2, (int64_t[]){b * l, m->dim}, &flat);
    if (s == HR_OK) s = hr_tensor_from_host(hr_tensor_device(last), HR_I64, 1, &b, rows, (size_t)b * sizeof *rows, &idx);
    if (s == HR_OK) s = hr_index_select(flat, 0, idx, out);
    free(host);
    free(rows);
    hr_tensor_free(i64);
    hr_tensor_free(flat);
    hr_tensor_free(idx);
    return s;
}

hr_status hr_clip_text_forward(hr_clip_text *m, const hr_tensor *ids, int hidden_index, hr_tensor **hidden,
                               hr_tensor **text_embeds) {
    if (!m || !ids) return hr_error(HR_ERR_INVALID_ARG, "clip text: NULL argument");
    if (hidden) *hidden = NULL;
    if (text_embeds) *text_embeds = NULL;
    const int64_t *is = hr_tensor_shape(ids);
    if (hr_tensor_ndim(ids) != 2 || is[1] < 1 || is[1] > m->max_pos || hr_dtype_is_float(hr_tensor_dtype(ids))) {
        char sh[160];
        return hr_error(HR_ERR_SHAPE, "clip text: input_ids %s %s must be integer [b, l] with l <= %lld",
                        hr_shape_str(hr_tensor_ndim(ids), is, sh, sizeof sh), hr_dtype_name(hr_tensor_dtype(ids)),
                        (long long)m->max_pos);
    }
    int n_states = (int)m->layers + 1, want = hidden_index < 0 ? hidden_index + n_states : hidden_index;
    if (hidden && (want < 0 || want >= n_states))
        return hr_error(HR_ERR_INVALID_ARG, "clip text: hidden state %d of %d", hidden_index, n_states);
    if (text_embeds && !m->proj)
        return hr_error(HR_ERR_UNSUPPORTED, "clip text: %s has no text_projection (a CLIPTextModel, not "
                        "CLIPTextModelWithProjection)", m->c.dir);
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *idv, *tok, *pos, *x = NULL, *last, *pooled;
    T(idv, hr_component_input(&m->c, ids, HR_DTYPE_COUNT, &idv));
    T(tok, hr_embedding(m->tok, idv, &tok));
    T(pos, hr_tensor_narrow(m->pos, 0, 0, is[1], &pos));
    RUN(hr_add(tok, pos, &x));
    for (int64_t i = 0; i <= m->layers; i++) {
        if (hidden && i == want) RUN(hr_tensor_alias(x, hidden));
        if (i == m->layers || (!text_embeds && i >= want)) break;
        hr_tensor *next = NULL;
        s = layer(m, &m->l[i], x, &next);
        hr_tensor_free(x);
        x = next;
        if (s != HR_OK) goto done;
    }
    if (text_embeds) {
        T(last, hr_layer_norm(x, m->flnw, m->flnb, m->eps, &last));
        T(pooled, pooled_rows(m, ids, last, &pooled));
        RUN(hr_linear(pooled, m->proj, NULL, text_embeds));
    }
done:
    hr_temps_free(&tp);
    hr_tensor_free(x);
    if (s != HR_OK && hidden) {
        hr_tensor_free(*hidden);
        *hidden = NULL;
    }
    return s;
}

static const char *const clip_classes[] = {"CLIPTextModelWithProjection", "CLIPTextModel", NULL};

hr_status hr_clip_text_load(const char *dir, const hr_component_options *opts, hr_clip_text **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_clip_text_load: NULL argument");
    *out = NULL;
    hr_clip_text *m = calloc(1, sizeof *m);
    hr_status s = m ? hr_component_open(&m->c, dir, NULL, opts) : hr_error(HR_ERR_OOM, "clip text");
    if (s == HR_OK) s = hr_component_check_arch(&m->c, clip_classes, "a CLIP text model");
    if (s == HR_OK) s = read_config(m);
    if (s == HR_OK && !(m->l = calloc((size_t)m->layers, sizeof *m->l))) s = hr_error(HR_ERR_OOM, "clip layers");
    if (s == HR_OK) s = load_weights(m);
    if (s != HR_OK) {
        hr_clip_text_free(m);
        return s;
    }
    *out = m;
    return HR_OK;
}

void hr_clip_text_free(hr_clip_text *m) {
    if (!m) return;
    hr_component_close(&m->c);
    free(m->l);
    free(m);
}

int64_t hr_clip_text_hidden_size(const hr_clip_text *m) { return m->dim; }
int64_t hr_clip_text_projection_dim(const hr_clip_text *m) { return m->proj ? m->proj_dim : 0; }
