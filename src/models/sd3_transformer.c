/* SD3Transformer2DModel (diffusers' MMDiT), on catalog ops.
 *
 *   latents -> patch embedding (conv, kernel = stride = patch) + the
 *   stored position table's centre crop -> image stream x [b, n, d];
 *   prompt embeddings -> context_embedder -> context stream c [b, l, d];
 *   temb = MLP(sinusoid(t)) + MLP(pooled text).
 *
 * Each joint block modulates both streams with adaptive layer norms
 * (shift, scale, gate from linear(silu(temb))), attends over their
 * concatenation (q/k rms-normed per head with qk_norm), and runs each
 * stream's own gelu-tanh MLP; the last block keeps only the image stream
 * (its context norm is the continuous one: scale and shift). SD3.5's
 * dual-attention blocks add a second, image-only attention. Then the
 * continuous adaptive norm, proj_out, and the patches back into latents.
 *
 * Every op rounds where diffusers' modules round (a bf16 model's products
 * and sums each in bf16), so the two agree to f32 rounding in f32. The
 * timestep sinusoid is computed on the host in double and rounded once
 * (torch's f32 exp/sin/cos are within an ulp of it). The forward compiles
 * once per input signature (hr_jit) when the model is compiled. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "hubrt/graph.h"
#include "hubrt/image_models.h"
#include "hubrt/ops.h"
#include "models/component.h"

#define SD3_TIME_DIM 256 /* the sinusoid's width (CombinedTimestepTextProjEmbeddings) */
#define SD3_EPS 1e-6

typedef struct sd3_attn {
    hr_tensor *qw, *qb, *kw, *kb, *vw, *vb, *ow, *ob;         /* image stream */
    hr_tensor *aqw, *aqb, *akw, *akb, *avw, *avb, *aow, *aob; /* context stream (aow NULL: pre-only) */
    hr_tensor *nq, *nk, *naq, *nak;                           /* qk_norm weights, or NULL */
} sd3_attn;

typedef struct sd3_ff {
    hr_tensor *w1, *b1, *w2, *b2;
} sd3_ff;

typedef struct sd3_block {
    bool pre_only, dual;
    hr_tensor *n1w, *n1b, *n1cw, *n1cb; /* adaptive norms' linears: 6d (9d dual); context 6d (2d pre-only) */
    sd3_attn attn, attn2;
    sd3_ff ff, ffc;
} sd3_block;

struct hr_sd3_transformer {
    hr_component c;
    int64_t sample_size, patch, in_ch, out_ch, layers, heads, head_dim, dim, joint_dim, caption_dim, pooled_dim, pos_max;
    bool qk_norm;
    hr_tensor *pew, *peb, *pos;
    hr_tensor *t1w, *t1b, *t2w, *t2b, *x1w, *x1b, *x2w, *x2b;
    hr_tensor *ctxw, *ctxb, *now, *nob, *pow_, *pob;
    sd3_block *blocks;
    hr_jit *jit; /* NULL: eager */
};

/* ---- config ------------------------------------------------------------------ */

static hr_status read_config(hr_sd3_transformer *m, bool *dual_layers, int64_t cap) {
    hr_json_obj r = hr_json_doc_root(m->c.config);
    const char *where = m->c.dir;
    HR_TRY(hr_json_get_i64(r, "sample_size", 128, &m->sample_size));
    HR_TRY(hr_json_get_i64(r, "patch_size", 2, &m->patch));
    HR_TRY(hr_json_get_i64(r, "in_channels", 16, &m->in_ch));
    HR_TRY(hr_json_get_i64(r, "num_layers", 18, &m->layers));
    HR_TRY(hr_json_get_i64(r, "attention_head_dim", 64, &m->head_dim));
    HR_TRY(hr_json_get_i64(r, "num_attention_heads", 18, &m->heads));
    HR_TRY(hr_json_get_i64(r, "joint_attention_dim", 4096, &m->joint_dim));
    HR_TRY(hr_json_get_i64(r, "caption_projection_dim", 1152, &m->caption_dim));
    HR_TRY(hr_json_get_i64(r, "pooled_projection_dim", 2048, &m->pooled_dim));
    HR_TRY(hr_json_get_i64(r, "out_channels", m->in_ch, &m->out_ch));
    HR_TRY(hr_json_get_i64(r, "pos_embed_max_size", 0, &m->pos_max));
    m->dim = m->heads * m->head_dim;
    if (m->patch < 1 || m->in_ch < 1 || m->out_ch < 1 || m->layers < 1 || m->heads < 1 || m->head_dim < 1 ||
        m->joint_dim < 1 || m->pooled_dim < 1 || m->layers > cap)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: patch_size, channels, num_layers (<= %lld), heads and dims "
                        "must be >= 1", where, (long long)cap);
    if (m->caption_dim != m->dim)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: caption_projection_dim %lld must equal num_attention_heads x "
                        "attention_head_dim = %lld (the two streams share the blocks' width)", where,
                        (long long)m->caption_dim, (long long)m->dim);
    if (m->pos_max < 1)
        return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: pos_embed_max_size is required (the stored position "
                        "table SD3 crops)", where);
    const char *qk = NULL;
    HR_TRY(hr_json_get_str(r, "qk_norm", NULL, &qk));
    if (qk && strcmp(qk, "rms_norm") != 0)
        return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: qk_norm '%s' (hubrt has rms_norm, SD3.5's)", where, qk);
    m->qk_norm = qk != NULL;
    const cJSON *dl = cJSON_GetObjectItemCaseSensitive((const cJSON *)r.node, "dual_attention_layers");
    if (dl && !cJSON_IsNull(dl)) {
        if (!cJSON_IsArray(dl))
            return hr_error(HR_ERR_FORMAT, "%s/config.json: dual_attention_layers must be a list", where);
        const cJSON *e;
        cJSON_ArrayForEach(e, dl) {
            if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble)
                return hr_error(HR_ERR_FORMAT, "%s/config.json: dual_attention_layers holds a non-integer", where);
            int64_t i = (int64_t)e->valuedouble;
            if (i >= 0 && i < m->layers) dual_layers[i] = true; /* diffusers ignores indices past the blocks */
        }
    }
    return HR_OK;
}

/* ---- weights ----------------------------------------------------------------- */

static hr_status lin(hr_sd3_transformer *m, const char *prefix, int64_t out, int64_t in, hr_tensor **w, hr_tensor **b) {
    return hr_component_wb(&m->c, prefix, 2, (int64_t[]){out, in}, true, w, b);
}

static hr_status vec(hr_sd3_transformer *m, const char *name, int64_t n, hr_tensor **t) {
    return hr_component_param(&m->c, name, 1, (int64_t[]){n}, t);
}

static hr_status load_attn(hr_sd3_transformer *m, const char *p, bool joint, bool pre_only, sd3_attn *a) {
    char n[256];
    int64_t d = m->dim, hd = m->head_dim;
#define LIN_(field, name) \
    snprintf(n, sizeof n, "%s.%s", p, name); \
    HR_TRY(lin(m, n, d, d, &a->field##w, &a->field##b))
    LIN_(q, "to_q");
    LIN_(k, "to_k");
    LIN_(v, "to_v");
    LIN_(o, "to_out.0");
    if (joint) {
        LIN_(aq, "add_q_proj");
        LIN_(ak, "add_k_proj");
        LIN_(av, "add_v_proj");
        if (!pre_only) {
            LIN_(ao, "to_add_out");
        }
    }
#undef LIN_
    if (!m->qk_norm) return HR_OK;
#define NORM_(field, name) \
    snprintf(n, sizeof n, "%s.%s.weight", p, name); \
    HR_TRY(vec(m, n, hd, &a->field))
    NORM_(nq, "norm_q");
    NORM_(nk, "norm_k");
    if (joint) {
        NORM_(naq, "norm_added_q");
        NORM_(nak, "norm_added_k");
    }
#undef NORM_
    return HR_OK;
}

static hr_status load_ff(hr_sd3_transformer *m, const char *p, sd3_ff *f) {
    char n[256];
    snprintf(n, sizeof n, "%s.net.0.proj", p);
    HR_TRY(lin(m, n, 4 * m->dim, m->dim, &f->w1, &f->b1));
    snprintf(n, sizeof n, "%s.net.2", p);
    return lin(m, n, m->dim, 4 * m->dim, &f->w2, &f->b2);
}

static hr_status load_weights(hr_sd3_transformer *m) {
    int64_t d = m->dim, p = m->patch;
    HR_TRY(hr_component_wb(&m->c, "pos_embed.proj", 4, (int64_t[]){d, m->in_ch, p, p}, true, &m->pew, &m->peb));
    HR_TRY(hr_component_param(&m->c, "pos_embed.pos_embed", 3, (int64_t[]){1, m->pos_max * m->pos_max, d}, &m->pos));
    HR_TRY(lin(m, "time_text_embed.timestep_embedder.linear_1", d, SD3_TIME_DIM, &m->t1w, &m->t1b));
    HR_TRY(lin(m, "time_text_embed.timestep_embedder.linear_2", d, d, &m->t2w, &m->t2b));
    HR_TRY(lin(m, "time_text_embed.text_embedder.linear_1", d, m->pooled_dim, &m->x1w, &m->x1b));
    HR_TRY(lin(m, "time_text_embed.text_embedder.linear_2", d, d, &m->x2w, &m->x2b));
    HR_TRY(lin(m, "context_embedder", d, m->joint_dim, &m->ctxw, &m->ctxb));
    for (int64_t i = 0; i < m->layers; i++) {
        sd3_block *b = &m->blocks[i];
        char n[256];
        snprintf(n, sizeof n, "transformer_blocks.%lld.norm1.linear", (long long)i);
        HR_TRY(lin(m, n, (b->dual ? 9 : 6) * d, d, &b->n1w, &b->n1b));
        snprintf(n, sizeof n, "transformer_blocks.%lld.norm1_context.linear", (long long)i);
        HR_TRY(lin(m, n, (b->pre_only ? 2 : 6) * d, d, &b->n1cw, &b->n1cb));
        snprintf(n, sizeof n, "transformer_blocks.%lld.attn", (long long)i);
        HR_TRY(load_attn(m, n, true, b->pre_only, &b->attn));
        if (b->dual) {
            snprintf(n, sizeof n, "transformer_blocks.%lld.attn2", (long long)i);
            HR_TRY(load_attn(m, n, false, false, &b->attn2));
        }
        snprintf(n, sizeof n, "transformer_blocks.%lld.ff", (long long)i);
        HR_TRY(load_ff(m, n, &b->ff));
        if (!b->pre_only) {
            snprintf(n, sizeof n, "transformer_blocks.%lld.ff_context", (long long)i);
            HR_TRY(load_ff(m, n, &b->ffc));
        }
    }
    HR_TRY(lin(m, "norm_out.linear", 2 * d, d, &m->now, &m->nob));
    return lin(m, "proj_out", p * p * m->out_ch, d, &m->pow_, &m->pob);
}

/* ---- forward ------------------------------------------------------------------- */


/* Chunk i of k of emb [b, k*d] as [b, 1, d] (a view). */
static hr_status chunk(const hr_tensor *emb, int64_t i, int64_t d, hr_tensor **out) {
    hr_tensor *n = NULL;
    HR_TRY(hr_tensor_narrow(emb, 1, i * d, d, &n));
    hr_status s = hr_tensor_unsqueeze(n, 1, out);
    hr_tensor_free(n);
    return s;
}

/* x * (1 + scale) + shift, each op rounded in x's dtype as diffusers'. */
static hr_status modulate(const hr_tensor *x, const hr_tensor *scale, const hr_tensor *shift, hr_tensor **out) {
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *one_plus, *scaled;
    T(one_plus, hr_scale(scale, 1, 1, &one_plus));
    T(scaled, hr_mul(x, one_plus, &scaled));
    RUN(hr_add(scaled, shift, out));
done:
    hr_temps_free(&tp);
    return s;
}

/* x + gate * y */
static hr_status gated_add(const hr_tensor *x, const hr_tensor *gate, const hr_tensor *y, hr_tensor **out) {
    hr_tensor *g = NULL;
    HR_TRY(hr_mul(gate, y, &g));
    hr_status s = hr_add(x, g, out);
    hr_tensor_free(g);
    return s;
}

/* linear(x) as heads [b, h, s, hd], rms-normed per head when norm is set. */
static hr_status heads_of(const hr_sd3_transformer *m, const hr_tensor *x, const hr_tensor *w, const hr_tensor *b,
                          const hr_tensor *norm, hr_tensor **out) {
    hr_temps tp = {0};
    hr_status s;
    const int64_t *xs = hr_tensor_shape(x);
    hr_tensor *y, *v, *t;
    T(y, hr_linear(x, w, b, &y));
    T(v, hr_tensor_view(y, 4, (int64_t[]){xs[0], xs[1], m->heads, m->head_dim}, &v));
    if (!norm) {
        RUN(hr_tensor_transpose(v, 1, 2, out));
    } else {
        T(t, hr_tensor_transpose(v, 1, 2, &t));
        RUN(hr_rms_norm(t, norm, SD3_EPS, 0, out));
    }
done:
    hr_temps_free(&tp);
    return s;
}

/* Attention over x's rows and, when ctx is set, the context's rows after
 * them (one sequence); out_x, out_c: each stream's projected output
 * (out_c NULL for a pre-only block or no context). */
static hr_status attend(const hr_sd3_transformer *m, const sd3_attn *a, const hr_tensor *x, const hr_tensor *ctx,
                        hr_tensor **out_x, hr_tensor **out_c) {
    hr_temps tp = {0};
    hr_status s;
    int64_t b = hr_tensor_shape(x)[0], n = hr_tensor_shape(x)[1], l = ctx ? hr_tensor_shape(ctx)[1] : 0;
    hr_tensor *q, *k, *v, *cq, *ck, *cv, *o, *ot, *oc, *flat, *xo, *co;
    T(q, heads_of(m, x, a->qw, a->qb, a->nq, &q));
    T(k, heads_of(m, x, a->kw, a->kb, a->nk, &k));
    T(v, heads_of(m, x, a->vw, a->vb, NULL, &v));
    if (ctx) {
        T(cq, heads_of(m, ctx, a->aqw, a->aqb, a->naq, &cq));
        T(ck, heads_of(m, ctx, a->akw, a->akb, a->nak, &ck));
        T(cv, heads_of(m, ctx, a->avw, a->avb, NULL, &cv));
        T(q, hr_cat((const hr_tensor *[]){q, cq}, 2, 2, &q));
        T(k, hr_cat((const hr_tensor *[]){k, ck}, 2, 2, &k));
        T(v, hr_cat((const hr_tensor *[]){v, cv}, 2, 2, &v));
    }
    hr_attrs_sdpa sa = {0};
    T(o, hr_sdpa(q, k, v, NULL, &sa, &o)); /* [b, h, n + l, hd] */
    T(ot, hr_tensor_transpose(o, 1, 2, &ot));
    T(oc, hr_contiguous(ot, &oc));
    T(flat, hr_tensor_view(oc, 3, (int64_t[]){b, n + l, m->dim}, &flat));
    if (!ctx) {
        RUN(hr_linear(flat, a->ow, a->ob, out_x));
        goto done;
    }
    T(xo, hr_tensor_narrow(flat, 1, 0, n, &xo));
    RUN(hr_linear(xo, a->ow, a->ob, out_x));
    if (a->aow) {
        T(co, hr_tensor_narrow(flat, 1, n, l, &co));
        s = hr_linear(co, a->aow, a->aob, out_c);
        if (s != HR_OK) {
            hr_tensor_free(*out_x);
            *out_x = NULL;
        }
    }
done:
    hr_temps_free(&tp);
    return s;
}

/* linear2(act(linear1(x))): the feed-forwards (gelu-tanh) and the time and
 * text embedders (silu). */
static hr_status two_linears(const hr_tensor *x, const hr_tensor *w1, const hr_tensor *b1, bool silu,
                             const hr_tensor *w2, const hr_tensor *b2, hr_tensor **out) {
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *h, *a;
    T(h, hr_linear(x, w1, b1, &h));
    T(a, silu ? hr_silu(h, &a) : hr_gelu(h, HR_GELU_TANH, &a));
    RUN(hr_linear(a, w2, b2, out));
done:
    hr_temps_free(&tp);
    return s;
}

static hr_status feed_forward(const sd3_ff *f, const hr_tensor *x, hr_tensor **out) {
    return two_linears(x, f->w1, f->b1, false, f->w2, f->b2, out);
}

/* One joint block: replaces *x and *c (owned); *c becomes NULL after the
 * pre-only block. act = silu(temb) [b, d]. */
static hr_status block(const hr_sd3_transformer *m, const sd3_block *bk, const hr_tensor *act, hr_tensor **xp,
                       hr_tensor **cp) {
    hr_temps tp = {0};
    hr_status s;
    int64_t d = m->dim;
    hr_tensor *x = *xp, *c = *cp, *nx_ = NULL, *nc_ = NULL;
    hr_tensor *e, *ec, *ch[9] = {0}, *cc[6] = {0}, *nx, *h1, *h2 = NULL, *nc, *hc, *ax, *acx = NULL, *a2, *ff, *ffc;
    T(e, hr_linear(act, bk->n1w, bk->n1b, &e));
    for (int i = 0; i < (bk->dual ? 9 : 6); i++) T(ch[i], chunk(e, i, d, &ch[i]));
    /* shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp[, shift_msa2, scale_msa2, gate_msa2] */
    T(nx, hr_layer_norm(x, NULL, NULL, SD3_EPS, &nx));
    T(h1, modulate(nx, ch[1], ch[0], &h1));
    if (bk->dual) T(h2, modulate(nx, ch[7], ch[6], &h2));
    T(ec, hr_linear(act, bk->n1cw, bk->n1cb, &ec));
    T(nc, hr_layer_norm(c, NULL, NULL, SD3_EPS, &nc));
    if (bk->pre_only) { /* AdaLayerNormContinuous: scale first, then shift */
        for (int i = 0; i < 2; i++) T(cc[i], chunk(ec, i, d, &cc[i]));
        T(hc, modulate(nc, cc[0], cc[1], &hc));
    } else {
        for (int i = 0; i < 6; i++) T(cc[i], chunk(ec, i, d, &cc[i]));
        T(hc, modulate(nc, cc[1], cc[0], &hc));
    }
    RUN(attend(m, &bk->attn, h1, hc, &ax, &acx));
    KEEP(ax);
    KEEP(acx);
    T(x, gated_add(x, ch[2], ax, &x));
    if (bk->dual) {
        RUN(attend(m, &bk->attn2, h2, NULL, &a2, NULL));
        KEEP(a2);
        T(x, gated_add(x, ch[8], a2, &x));
    }
    T(nx, hr_layer_norm(x, NULL, NULL, SD3_EPS, &nx));
    T(nx, modulate(nx, ch[4], ch[3], &nx));
    T(ff, feed_forward(&bk->ff, nx, &ff));
    RUN(gated_add(x, ch[5], ff, &nx_));
    if (!bk->pre_only) {
        T(c, gated_add(c, cc[2], acx, &c));
        T(nc, hr_layer_norm(c, NULL, NULL, SD3_EPS, &nc));
        T(nc, modulate(nc, cc[4], cc[3], &nc));
        T(ffc, feed_forward(&bk->ffc, nc, &ffc));
        RUN(gated_add(c, cc[5], ffc, &nc_));
    }
done:
    hr_temps_free(&tp);
    if (s != HR_OK) {
        hr_tensor_free(nx_);
        return s;
    }
    hr_tensor_free(*xp);
    hr_tensor_free(*cp);
    *xp = nx_;
    *cp = nc_;
    return HR_OK;
}

/* temb [b, d] = MLP(sinusoid) + MLP(pooled) */
static hr_status time_text(const hr_sd3_transformer *m, const hr_tensor *sinus, const hr_tensor *pooled,
                           hr_tensor **out) {
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *t, *p;
    T(t, two_linears(sinus, m->t1w, m->t1b, true, m->t2w, m->t2b, &t));
    T(p, two_linears(pooled, m->x1w, m->x1b, true, m->x2w, m->x2b, &p));
    RUN(hr_add(t, p, out));
done:
    hr_temps_free(&tp);
    return s;
}

/* conv patches + the position table's centre crop -> [b, n, d] */
static hr_status patch_embed(const hr_sd3_transformer *m, const hr_tensor *x, hr_tensor **out) {
    hr_temps tp = {0};
    hr_status s;
    const int64_t *xs = hr_tensor_shape(x);
    int64_t b = xs[0], h = xs[2] / m->patch, w = xs[3] / m->patch, top = (m->pos_max - h) / 2,
            left = (m->pos_max - w) / 2;
    hr_attrs_conv2d ca = {.stride_h = m->patch, .stride_w = m->patch, .dilation_h = 1, .dilation_w = 1, .groups = 1};
    hr_tensor *y, *yp, *grid, *rows, *crop, *sum;
    T(y, hr_conv2d(x, m->pew, m->peb, &ca, &y)); /* [b, d, h, w] */
    T(yp, hr_tensor_permute(y, 4, (const int[]){0, 2, 3, 1}, &yp));
    T(grid, hr_tensor_view(m->pos, 3, (int64_t[]){m->pos_max, m->pos_max, m->dim}, &grid));
    T(rows, hr_tensor_narrow(grid, 0, top, h, &rows));
    T(crop, hr_tensor_narrow(rows, 1, left, w, &crop));
    T(sum, hr_add(yp, crop, &sum)); /* [b, h, w, d] */
    RUN(hr_tensor_view(sum, 3, (int64_t[]){b, h * w, m->dim}, out));
done:
    hr_temps_free(&tp);
    return s;
}

/* [b, n, p*p*c] -> [b, c, h*p, w*p] */
static hr_status unpatchify(const hr_sd3_transformer *m, const hr_tensor *y, int64_t h, int64_t w, hr_tensor **out) {
    hr_temps tp = {0};
    hr_status s;
    int64_t b = hr_tensor_shape(y)[0], p = m->patch, c = m->out_ch;
    hr_tensor *v, *pm, *cont;
    T(v, hr_tensor_view(y, 6, (int64_t[]){b, h, w, p, p, c}, &v));
    T(pm, hr_tensor_permute(v, 6, (const int[]){0, 5, 1, 3, 2, 4}, &pm));
    T(cont, hr_contiguous(pm, &cont));
    RUN(hr_tensor_view(cont, 4, (int64_t[]){b, c, h * p, w * p}, out));
done:
    hr_temps_free(&tp);
    return s;
}

/* The forward on tensors: inputs x, context, pooled, sinusoid [b, 256]. */
static hr_status forward_fn(void *ctx, const hr_tensor *const *in, int n_in, hr_tensor **outs, int n_out) {
    const hr_sd3_transformer *m = ctx;
    hr_temps tp = {0};
    hr_status s;
    const hr_tensor *x0 = in[0];
    int64_t h = hr_tensor_shape(x0)[2] / m->patch, w = hr_tensor_shape(x0)[3] / m->patch;
    hr_tensor *x = NULL, *c = NULL, *temb, *act, *e, *sc, *sh, *nx, *mx, *y;
    RUN(patch_embed(m, x0, &x));
    RUN(hr_linear(in[1], m->ctxw, m->ctxb, &c));
    T(temb, time_text(m, in[3], in[2], &temb));
    T(act, hr_silu(temb, &act));
    for (int64_t i = 0; i < m->layers; i++) RUN(block(m, &m->blocks[i], act, &x, &c));
    T(e, hr_linear(act, m->now, m->nob, &e));
    T(sc, chunk(e, 0, m->dim, &sc)); /* scale, then shift */
    T(sh, chunk(e, 1, m->dim, &sh));
    T(nx, hr_layer_norm(x, NULL, NULL, SD3_EPS, &nx));
    T(mx, modulate(nx, sc, sh, &mx));
    T(y, hr_linear(mx, m->pow_, m->pob, &y));
    RUN(unpatchify(m, y, h, w, &outs[0]));
done:
    hr_temps_free(&tp);
    hr_tensor_free(x);
    hr_tensor_free(c);
    return s;
}

/* get_timestep_embedding(t, 256, flip_sin_to_cos=True, shift 0): [cos, sin]
 * of t * exp(-ln(10000) i / 128), the frequency and product in f32 as
 * torch forms them, cos and sin in double, rounded once. */
static void sinusoid(const float *t, int64_t b, float *out) {
    const int half = SD3_TIME_DIM / 2;
    for (int64_t r = 0; r < b; r++)
        for (int i = 0; i < half; i++) {
            float expo = (float)-log(10000.0) * (float)i;
            expo = expo / (float)half;
            float freq = (float)exp((double)expo);
            float arg = t[r] * freq;
            out[r * SD3_TIME_DIM + i] = (float)cos((double)arg);
            out[r * SD3_TIME_DIM + half + i] = (float)sin((double)arg);
        }
}

hr_status hr_sd3_transformer_forward(hr_sd3_transformer *m, const hr_tensor *x, const hr_tensor *context,
                                     const hr_tensor *pooled, const float *timesteps, hr_tensor **out) {
    if (!m || !x || !context || !pooled || !timesteps || !out)
        return hr_error(HR_ERR_INVALID_ARG, "sd3 transformer: NULL argument");
    *out = NULL;
    const int64_t *xs = hr_tensor_shape(x), *cs = hr_tensor_shape(context), *ps = hr_tensor_shape(pooled);
    char s1[160], s2[160], s3[160];
    int64_t b = xs[0];
    if (hr_tensor_ndim(x) != 4 || xs[1] != m->in_ch || xs[2] % m->patch || xs[3] % m->patch ||
        xs[2] / m->patch > m->pos_max || xs[3] / m->patch > m->pos_max || hr_tensor_ndim(context) != 3 ||
        cs[0] != b || cs[2] != m->joint_dim || hr_tensor_ndim(pooled) != 2 || ps[0] != b || ps[1] != m->pooled_dim)
        return hr_error(HR_ERR_SHAPE, "sd3 transformer: latents %s must be [b, %lld, h, w] with h and w multiples of "
                        "the patch %lld and at most %lld patches; context %s [b, l, %lld]; pooled %s [b, %lld]",
                        hr_shape_str(hr_tensor_ndim(x), xs, s1, sizeof s1), (long long)m->in_ch, (long long)m->patch,
                        (long long)m->pos_max, hr_shape_str(hr_tensor_ndim(context), cs, s2, sizeof s2),
                        (long long)m->joint_dim, hr_shape_str(hr_tensor_ndim(pooled), ps, s3, sizeof s3),
                        (long long)m->pooled_dim);
    hr_temps tp = {0};
    hr_status s;
    float *sin_host = malloc((size_t)b * SD3_TIME_DIM * sizeof(float));
    if (!sin_host) return hr_error(HR_ERR_OOM, "sd3 transformer: timestep embedding");
    sinusoid(timesteps, b, sin_host);
    hr_tensor *sin32, *sinm, *xm, *cm, *pm;
    hr_dtype dt = m->c.dtype;
    hr_device *dev = m->c.dev;
    T(sin32, hr_tensor_from_host(dev, HR_F32, 2, (int64_t[]){b, SD3_TIME_DIM}, sin_host,
                                 (size_t)b * SD3_TIME_DIM * sizeof(float), &sin32));
    /* the sinusoid goes to the pooled projections' dtype, the inputs to the model's, on its device */
    T(sinm, hr_cast(sin32, dt, &sinm));
    T(xm, hr_component_input(&m->c, x, dt, &xm));
    T(cm, hr_component_input(&m->c, context, dt, &cm));
    T(pm, hr_component_input(&m->c, pooled, dt, &pm));
    const hr_tensor *ins[4] = {xm, cm, pm, sinm};
    if (m->jit)
        RUN(hr_jit_call(m->jit, ins, 4, out, 1));
    else
        RUN(forward_fn(m, ins, 4, out, 1));
done:
    free(sin_host);
    hr_temps_free(&tp);
    return s;
}

/* ---- lifetime -------------------------------------------------------------------- */

static const char *const sd3_classes[] = {"SD3Transformer2DModel", NULL};

hr_status hr_sd3_transformer_load(const char *dir, const hr_component_options *opts, hr_sd3_transformer **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_sd3_transformer_load: NULL argument");
    *out = NULL;
    enum { MAX_LAYERS = 1024 };
    hr_sd3_transformer *m = calloc(1, sizeof *m);
    bool *dual = calloc(MAX_LAYERS, sizeof *dual);
    hr_status s = m && dual ? hr_component_open(&m->c, dir, sd3_classes, opts)
                            : hr_error(HR_ERR_OOM, "sd3 transformer");
    if (s == HR_OK) s = read_config(m, dual, MAX_LAYERS);
    if (s == HR_OK && !(m->blocks = calloc((size_t)m->layers, sizeof *m->blocks)))
        s = hr_error(HR_ERR_OOM, "sd3 transformer: %lld blocks", (long long)m->layers);
    for (int64_t i = 0; s == HR_OK && i < m->layers; i++) {
        m->blocks[i].pre_only = i == m->layers - 1;
        m->blocks[i].dual = dual[i];
    }
    free(dual);
    if (s == HR_OK) s = load_weights(m);
    if (s == HR_OK && opts && opts->compile) {
        hr_jit_options jo = {.name = "sd3_transformer", .fn = forward_fn, .ctx = m, .fold_constants = true};
        s = hr_jit_create(&jo, &m->jit);
    }
    if (s != HR_OK) {
        hr_sd3_transformer_free(m);
        return s;
    }
    *out = m;
    return HR_OK;
}

void hr_sd3_transformer_free(hr_sd3_transformer *m) {
    if (!m) return;
    hr_jit_free(m->jit);
    hr_component_close(&m->c);
    free(m->blocks);
    free(m);
}

int64_t hr_sd3_transformer_in_channels(const hr_sd3_transformer *m) { return m->in_ch; }
int64_t hr_sd3_transformer_joint_dim(const hr_sd3_transformer *m) { return m->joint_dim; }
int64_t hr_sd3_transformer_sample_size(const hr_sd3_transformer *m) { return m->sample_size; }
int64_t hr_sd3_transformer_patch_size(const hr_sd3_transformer *m) { return m->patch; }
hr_dtype hr_sd3_transformer_dtype(const hr_sd3_transformer *m) { return m->c.dtype; }
hr_device *hr_sd3_transformer_device(const hr_sd3_transformer *m) { return m->c.dev; }
