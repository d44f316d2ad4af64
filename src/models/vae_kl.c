/* AutoencoderKL's decoder (diffusers), on catalog ops:
 *
 *   z -> [post_quant_conv 1x1] -> conv_in 3x3
 *     -> mid block: resnet, attention (one head over every pixel), resnet
 *     -> up blocks, widest first: layers_per_block + 1 resnets each, then
 *        nearest 2x upsampling and a 3x3 conv (all but the last block)
 *     -> group norm, silu, conv_out 3x3
 *
 * A resnet is x + conv2(silu(norm2(conv1(silu(norm1(x)))))), x through a
 * 1x1 conv_shortcut where the channel count changes; every group norm has
 * norm_num_groups groups and eps 1e-6, as diffusers builds the decoder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "hubrt/image_models.h"
#include "hubrt/ops.h"
#include "models/component.h"

#define VAE_MAX_BLOCKS 8
#define VAE_MAX_RESNETS 8
#define VAE_EPS 1e-6

typedef struct vae_resnet {
    hr_tensor *n1w, *n1b, *c1w, *c1b, *n2w, *n2b, *c2w, *c2b;
    hr_tensor *scw, *scb; /* conv_shortcut, or NULL */
} vae_resnet;

typedef struct vae_attn {
    hr_tensor *gnw, *gnb, *qw, *qb, *kw, *kb, *vw, *vb, *ow, *ob;
} vae_attn;

typedef struct vae_up {
    vae_resnet res[VAE_MAX_RESNETS];
    hr_tensor *upw, *upb; /* upsamplers.0.conv, or NULL for the last block */
} vae_up;

typedef struct vae_down {
    vae_resnet res[VAE_MAX_RESNETS];
    hr_tensor *dw, *db; /* downsamplers.0.conv (stride 2 after a right/bottom zero pad), or NULL: the last block */
} vae_down;

/* The encoder, loaded on the first encode (a decode-only user never pays
 * for it). */
typedef struct vae_encoder {
    bool loaded;
    int64_t in_ch;
    bool quant;
    hr_tensor *cinw, *cinb, *now, *nob, *coutw, *coutb, *qw, *qb;
    vae_resnet mid[2];
    vae_attn attn;
    vae_down down[VAE_MAX_BLOCKS];
} vae_encoder;

struct hr_vae {
    hr_component c;
    int64_t latent, out_ch, groups, layers, n_blocks, boc[VAE_MAX_BLOCKS];
    double scaling, shift;
    bool post_quant, mid_attn;
    hr_tensor *pqw, *pqb, *cinw, *cinb, *now, *nob, *coutw, *coutb;
    vae_resnet mid[2];
    vae_attn attn;
    vae_up up[VAE_MAX_BLOCKS];
    vae_encoder enc;
};

/* ---- config ------------------------------------------------------------------- */

static hr_status read_config(hr_vae *v) {
    hr_json_obj root = hr_json_doc_root(v->c.config);
    const char *where = v->c.dir;
    int n = 0;
    HR_TRY(hr_json_get_i64_list(root, "block_out_channels", v->boc, VAE_MAX_BLOCKS, &n));
    if (n < 1) return hr_error(HR_ERR_FORMAT, "%s/config.json: block_out_channels is missing or empty", where);
    v->n_blocks = n;
    HR_TRY(hr_json_get_i64(root, "latent_channels", 4, &v->latent));
    HR_TRY(hr_json_get_i64(root, "out_channels", 3, &v->out_ch));
    HR_TRY(hr_json_get_i64(root, "norm_num_groups", 32, &v->groups));
    HR_TRY(hr_json_get_i64(root, "layers_per_block", 1, &v->layers));
    HR_TRY(hr_json_get_f64(root, "scaling_factor", 0.18215, &v->scaling));
    HR_TRY(hr_json_get_f64(root, "shift_factor", 0.0, &v->shift));
    HR_TRY(hr_json_get_bool(root, "use_post_quant_conv", true, &v->post_quant));
    HR_TRY(hr_json_get_bool(root, "mid_block_add_attention", true, &v->mid_attn));
    const char *act = NULL, *norm = NULL;
    HR_TRY(hr_json_get_str(root, "act_fn", "silu", &act));
    if (strcmp(act, "silu") != 0)
        return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: act_fn '%s' (only silu is supported)", where, act);
    HR_TRY(hr_json_get_str(root, "norm_type", "group", &norm));
    if (strcmp(norm, "group") != 0)
        return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: norm_type '%s' (only group is supported)", where, norm);
    if (v->layers < 0 || v->layers + 1 > VAE_MAX_RESNETS)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: layers_per_block %lld must be in [0, %d]", where,
                        (long long)v->layers, VAE_MAX_RESNETS - 1);
    if (v->latent < 1 || v->out_ch < 1 || v->groups < 1 || v->scaling == 0)
        return hr_error(HR_ERR_FORMAT, "%s/config.json: latent_channels, out_channels, norm_num_groups must be >= 1 "
                        "and scaling_factor nonzero", where);
    for (int i = 0; i < n; i++)
        if (v->boc[i] < 1 || v->boc[i] % v->groups)
            return hr_error(HR_ERR_FORMAT, "%s/config.json: block_out_channels[%d] = %lld is not a positive multiple of "
                            "norm_num_groups %lld", where, i, (long long)v->boc[i], (long long)v->groups);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive((const cJSON *)root.node, "up_block_types");
    if (types) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != n)
            return hr_error(HR_ERR_FORMAT, "%s/config.json: up_block_types must list %d block types", where, n);
        for (int i = 0; i < n; i++) {
            const cJSON *t = cJSON_GetArrayItem(types, i);
            if (!cJSON_IsString(t) || strcmp(t->valuestring, "UpDecoderBlock2D") != 0)
                return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: up_block_types[%d] '%s' is not a block type hubrt "
                                "has (UpDecoderBlock2D)", where, i, cJSON_IsString(t) ? t->valuestring : "?");
        }
    }
    return HR_OK;
}

/* ---- weights ------------------------------------------------------------------ */

static hr_status conv_wb(hr_vae *v, const char *prefix, int64_t o, int64_t i, int64_t k, hr_tensor **w,
                         hr_tensor **b) {
    return hr_component_wb(&v->c, prefix, 4, (int64_t[]){o, i, k, k}, true, w, b);
}

static hr_status norm_wb(hr_vae *v, const char *prefix, int64_t ch, hr_tensor **w, hr_tensor **b) {
    return hr_component_wb(&v->c, prefix, 1, (int64_t[]){ch}, true, w, b);
}

static hr_status load_resnet(hr_vae *v, const char *prefix, int64_t in, int64_t out, vae_resnet *r) {
    char p[256];
    snprintf(p, sizeof p, "%s.norm1", prefix);
    HR_TRY(norm_wb(v, p, in, &r->n1w, &r->n1b));
    snprintf(p, sizeof p, "%s.conv1", prefix);
    HR_TRY(conv_wb(v, p, out, in, 3, &r->c1w, &r->c1b));
    snprintf(p, sizeof p, "%s.norm2", prefix);
    HR_TRY(norm_wb(v, p, out, &r->n2w, &r->n2b));
    snprintf(p, sizeof p, "%s.conv2", prefix);
    HR_TRY(conv_wb(v, p, out, out, 3, &r->c2w, &r->c2b));
    if (in == out) return HR_OK;
    snprintf(p, sizeof p, "%s.conv_shortcut", prefix);
    return conv_wb(v, p, out, in, 1, &r->scw, &r->scb);
}

/* <blocks>.i: n resnets (the first from `in` channels) and, when
 * `sampler` is set, its <sampler>.0.conv. */
static hr_status load_block(hr_vae *v, const char *blocks, int64_t i, int64_t n, int64_t in, int64_t out,
                            vae_resnet *res, const char *sampler, hr_tensor **sw, hr_tensor **sb) {
    char p[200];
    for (int64_t j = 0; j < n; j++) {
        snprintf(p, sizeof p, "%s.%lld.resnets.%lld", blocks, (long long)i, (long long)j);
        HR_TRY(load_resnet(v, p, j == 0 ? in : out, out, &res[j]));
    }
    if (!sampler) return HR_OK;
    snprintf(p, sizeof p, "%s.%lld.%s.0.conv", blocks, (long long)i, sampler);
    return conv_wb(v, p, out, out, 3, sw, sb);
}

/* <half>.mid_block.attentions.0: a group norm and four [ch, ch] linears. */
static hr_status load_attn(hr_vae *v, const char *half, int64_t ch, vae_attn *a) {
    static const char *const names[5] = {"group_norm", "to_q", "to_k", "to_v", "to_out.0"};
    hr_tensor **w[5] = {&a->gnw, &a->qw, &a->kw, &a->vw, &a->ow}, **b[5] = {&a->gnb, &a->qb, &a->kb, &a->vb, &a->ob};
    char p[200];
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s.mid_block.attentions.0.%s", half, names[i]);
        HR_TRY(hr_component_wb(&v->c, p, i ? 2 : 1, (int64_t[]){ch, ch}, true, w[i], b[i]));
    }
    return HR_OK;
}

static hr_status load_weights(hr_vae *v) {
    int64_t top = v->boc[v->n_blocks - 1];
    if (v->post_quant) HR_TRY(conv_wb(v, "post_quant_conv", v->latent, v->latent, 1, &v->pqw, &v->pqb));
    HR_TRY(conv_wb(v, "decoder.conv_in", top, v->latent, 3, &v->cinw, &v->cinb));
    HR_TRY(load_resnet(v, "decoder.mid_block.resnets.0", top, top, &v->mid[0]));
    HR_TRY(load_resnet(v, "decoder.mid_block.resnets.1", top, top, &v->mid[1]));
    if (v->mid_attn) HR_TRY(load_attn(v, "decoder", top, &v->attn));
    int64_t prev = top;
    for (int64_t i = 0; i < v->n_blocks; i++) {
        int64_t out = v->boc[v->n_blocks - 1 - i];
        HR_TRY(load_block(v, "decoder.up_blocks", i, v->layers + 1, prev, out, v->up[i].res,
                          i < v->n_blocks - 1 ? "upsamplers" : NULL, &v->up[i].upw, &v->up[i].upb));
        prev = out;
    }
    HR_TRY(norm_wb(v, "decoder.conv_norm_out", v->boc[0], &v->now, &v->nob));
    return conv_wb(v, "decoder.conv_out", v->out_ch, v->boc[0], 3, &v->coutw, &v->coutb);
}

/* The encoder's weights and config fields, on the first encode. */
static hr_status load_encoder(hr_vae *v) {
    vae_encoder *e = &v->enc;
    if (e->loaded) return HR_OK;
    hr_json_obj root = hr_json_doc_root(v->c.config);
    HR_TRY(hr_json_get_i64(root, "in_channels", 3, &e->in_ch));
    HR_TRY(hr_json_get_bool(root, "use_quant_conv", true, &e->quant));
    const cJSON *types = cJSON_GetObjectItemCaseSensitive((const cJSON *)root.node, "down_block_types");
    for (int i = 0; types && i < cJSON_GetArraySize(types); i++) {
        const cJSON *t = cJSON_GetArrayItem(types, i);
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "DownEncoderBlock2D") != 0)
            return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: down_block_types[%d] '%s' is not a block type hubrt "
                            "has (DownEncoderBlock2D)", v->c.dir, i, cJSON_IsString(t) ? t->valuestring : "?");
    }
    if (e->in_ch < 1) return hr_error(HR_ERR_FORMAT, "%s/config.json: in_channels must be >= 1", v->c.dir);
    int64_t top = v->boc[v->n_blocks - 1], prev = v->boc[0];
    HR_TRY(conv_wb(v, "encoder.conv_in", v->boc[0], e->in_ch, 3, &e->cinw, &e->cinb));
    for (int64_t i = 0; i < v->n_blocks; i++) {
        HR_TRY(load_block(v, "encoder.down_blocks", i, v->layers, prev, v->boc[i], e->down[i].res,
                          i < v->n_blocks - 1 ? "downsamplers" : NULL, &e->down[i].dw, &e->down[i].db));
        prev = v->boc[i];
    }
    HR_TRY(load_resnet(v, "encoder.mid_block.resnets.0", top, top, &e->mid[0]));
    HR_TRY(load_resnet(v, "encoder.mid_block.resnets.1", top, top, &e->mid[1]));
    if (v->mid_attn) HR_TRY(load_attn(v, "encoder", top, &e->attn));
    HR_TRY(norm_wb(v, "encoder.conv_norm_out", top, &e->now, &e->nob));
    HR_TRY(conv_wb(v, "encoder.conv_out", 2 * v->latent, top, 3, &e->coutw, &e->coutb));
    if (e->quant) HR_TRY(conv_wb(v, "quant_conv", 2 * v->latent, 2 * v->latent, 1, &e->qw, &e->qb));
    e->loaded = true;
    return HR_OK;
}

/* ---- forward ------------------------------------------------------------------- */


static hr_status conv(const hr_tensor *x, const hr_tensor *w, const hr_tensor *b, int64_t pad, hr_tensor **out) {
    hr_attrs_conv2d a = {.stride_h = 1, .stride_w = 1, .pad_h = pad, .pad_w = pad, .dilation_h = 1, .dilation_w = 1,
                         .groups = 1};
    return hr_conv2d(x, w, b, &a, out);
}

/* silu(group_norm(x)) */
static hr_status norm_silu(const hr_vae *v, const hr_tensor *x, const hr_tensor *w, const hr_tensor *b,
                           hr_tensor **out) {
    hr_tensor *n = NULL;
    HR_TRY(hr_group_norm(x, w, b, v->groups, VAE_EPS, &n));
    hr_status s = hr_silu(n, out);
    hr_tensor_free(n);
    return s;
}

static hr_status resnet(const hr_vae *v, const vae_resnet *r, const hr_tensor *x, hr_tensor **out) {
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *h, *skip = (hr_tensor *)x;
    RUN(norm_silu(v, x, r->n1w, r->n1b, &h)); KEEP(h);
    RUN(conv(h, r->c1w, r->c1b, 1, &h)); KEEP(h);
    RUN(norm_silu(v, h, r->n2w, r->n2b, &h)); KEEP(h);
    RUN(conv(h, r->c2w, r->c2b, 1, &h)); KEEP(h);
    if (r->scw) {
        RUN(conv(x, r->scw, r->scb, 0, &skip)); KEEP(skip);
    }
    RUN(hr_add(skip, h, out));
done:
    hr_temps_free(&tp);
    return s;
}

/* x + to_out(attention(group_norm(x))) over the h*w pixels as one
 * sequence, one head of every channel (diffusers' VAE attention). */
static hr_status attention(const hr_vae *v, const vae_attn *a, const hr_tensor *x, hr_tensor **out) {
    const int64_t *xs = hr_tensor_shape(x);
    int64_t b = xs[0], c = xs[1], hw = xs[2] * xs[3];
    hr_temps tp = {0};
    hr_status s;
    hr_tensor *n, *seq, *q, *k, *val, *o, *img;
    RUN(hr_group_norm(x, a->gnw, a->gnb, v->groups, VAE_EPS, &n)); KEEP(n);
    RUN(hr_tensor_view(n, 3, (int64_t[]){b, c, hw}, &seq)); KEEP(seq);
    RUN(hr_tensor_transpose(seq, 1, 2, &seq)); KEEP(seq); /* [b, hw, c] */
    RUN(hr_linear(seq, a->qw, a->qb, &q)); KEEP(q);
    RUN(hr_linear(seq, a->kw, a->kb, &k)); KEEP(k);
    RUN(hr_linear(seq, a->vw, a->vb, &val)); KEEP(val);
    RUN(hr_tensor_unsqueeze(q, 1, &q)); KEEP(q); /* [b, 1, hw, c]: one head */
    RUN(hr_tensor_unsqueeze(k, 1, &k)); KEEP(k);
    RUN(hr_tensor_unsqueeze(val, 1, &val)); KEEP(val);
    hr_attrs_sdpa sa = {0};
    RUN(hr_sdpa(q, k, val, NULL, &sa, &o)); KEEP(o);
    RUN(hr_tensor_view(o, 3, (int64_t[]){b, hw, c}, &o)); KEEP(o);
    RUN(hr_linear(o, a->ow, a->ob, &o)); KEEP(o);
    RUN(hr_tensor_transpose(o, 1, 2, &o)); KEEP(o); /* [b, c, hw] */
    RUN(hr_contiguous(o, &o)); KEEP(o);
    RUN(hr_tensor_view(o, 4, xs, &img)); KEEP(img);
    RUN(hr_add(img, x, out));
done:
    hr_temps_free(&tp);
    return s;
}

/* Replaces *x (owned) with step(*x). */
#define STEP(call) \
    do { \
        hr_tensor *next_ = NULL; \
        s = (call); \
        hr_tensor_free(x); \
        x = next_; \
        if (s != HR_OK) goto done; \
    } while (0)

hr_status hr_vae_decode(hr_vae *v, const hr_tensor *z, hr_tensor **out) {
    if (!v || !z || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_vae_decode: NULL argument");
    *out = NULL;
    const int64_t *zs = hr_tensor_shape(z);
    if (hr_tensor_ndim(z) != 4 || zs[1] != v->latent) {
        char sz[160];
        return hr_error(HR_ERR_SHAPE, "vae decode: latents %s must be [b, %lld, h, w]",
                        hr_shape_str(hr_tensor_ndim(z), zs, sz, sizeof sz), (long long)v->latent);
    }
    hr_status s;
    hr_tensor *x = NULL;
    HR_TRY(hr_component_input(&v->c, z, v->c.dtype, &x));
    if (v->post_quant) STEP(conv(x, v->pqw, v->pqb, 0, &next_));
    STEP(conv(x, v->cinw, v->cinb, 1, &next_));
    STEP(resnet(v, &v->mid[0], x, &next_));
    if (v->mid_attn) STEP(attention(v, &v->attn, x, &next_));
    STEP(resnet(v, &v->mid[1], x, &next_));
    for (int64_t i = 0; i < v->n_blocks; i++) {
        for (int64_t j = 0; j <= v->layers; j++) STEP(resnet(v, &v->up[i].res[j], x, &next_));
        if (v->up[i].upw) {
            STEP(hr_upsample_nearest(x, 2, &next_));
            STEP(conv(x, v->up[i].upw, v->up[i].upb, 1, &next_));
        }
    }
    STEP(norm_silu(v, x, v->now, v->nob, &next_));
    STEP(conv(x, v->coutw, v->coutb, 1, &next_));
    *out = x;
    return HR_OK;
done:
    return s;
}

/* x zero-padded by one column on the right and one row at the bottom (the
 * downsampler's F.pad(x, (0, 1, 0, 1))), then its stride-2 3x3 conv. */
static hr_status downsample(const hr_vae *v, const vae_down *d, const hr_tensor *x, hr_tensor **out) {
    const int64_t *xs = hr_tensor_shape(x);
    hr_device *dev = hr_tensor_device(x);
    hr_dtype dt = hr_tensor_dtype(x);
    hr_tensor *zc = NULL, *zr = NULL, *wide = NULL, *tall = NULL;
    hr_status s = hr_tensor_zeros(dev, dt, 4, (int64_t[]){xs[0], xs[1], xs[2], 1}, &zc);
    if (s == HR_OK) s = hr_cat((const hr_tensor *[]){x, zc}, 2, 3, &wide);
    if (s == HR_OK) s = hr_tensor_zeros(dev, dt, 4, (int64_t[]){xs[0], xs[1], 1, xs[3] + 1}, &zr);
    if (s == HR_OK) s = hr_cat((const hr_tensor *[]){wide, zr}, 2, 2, &tall);
    hr_attrs_conv2d a = {.stride_h = 2, .stride_w = 2, .dilation_h = 1, .dilation_w = 1, .groups = 1};
    if (s == HR_OK) s = hr_conv2d(tall, d->dw, d->db, &a, out);
    hr_tensor_free(zc);
    hr_tensor_free(zr);
    hr_tensor_free(wide);
    hr_tensor_free(tall);
    return s;
}

hr_status hr_vae_encode(hr_vae *v, const hr_tensor *image, hr_tensor **mean, hr_tensor **logvar) {
    if (!v || !image || !mean) return hr_error(HR_ERR_INVALID_ARG, "hr_vae_encode: NULL argument");
    *mean = NULL;
    if (logvar) *logvar = NULL;
    HR_TRY(load_encoder(v));
    const vae_encoder *e = &v->enc;
    const int64_t *is = hr_tensor_shape(image);
    int64_t f = hr_vae_upscale(v);
    if (hr_tensor_ndim(image) != 4 || is[1] != e->in_ch || is[2] % f || is[3] % f) {
        char si[160];
        return hr_error(HR_ERR_SHAPE, "vae encode: image %s must be [b, %lld, h, w] with h and w multiples of %lld",
                        hr_shape_str(hr_tensor_ndim(image), is, si, sizeof si), (long long)e->in_ch, (long long)f);
    }
    hr_status s;
    hr_tensor *x = NULL, *lv = NULL;
    HR_TRY(hr_component_input(&v->c, image, v->c.dtype, &x));
    STEP(conv(x, e->cinw, e->cinb, 1, &next_));
    for (int64_t i = 0; i < v->n_blocks; i++) {
        for (int64_t j = 0; j < v->layers; j++) STEP(resnet(v, &e->down[i].res[j], x, &next_));
        if (e->down[i].dw) STEP(downsample(v, &e->down[i], x, &next_));
    }
    STEP(resnet(v, &e->mid[0], x, &next_));
    if (v->mid_attn) STEP(attention(v, &e->attn, x, &next_));
    STEP(resnet(v, &e->mid[1], x, &next_));
    STEP(norm_silu(v, x, e->now, e->nob, &next_));
    STEP(conv(x, e->coutw, e->coutb, 1, &next_));
    if (e->quant) STEP(conv(x, e->qw, e->qb, 0, &next_));
    /* the moments: mean, then log-variance clamped to [-30, 20] (DiagonalGaussianDistribution) */
    if ((s = hr_tensor_narrow(x, 1, 0, v->latent, &lv)) != HR_OK) goto done;
    s = hr_contiguous(lv, mean);
    hr_tensor_free(lv);
    lv = NULL;
    if (s == HR_OK && logvar) {
        s = hr_tensor_narrow(x, 1, v->latent, v->latent, &lv);
        if (s == HR_OK) s = hr_clamp(lv, &(double){-30.0}, &(double){20.0}, logvar);
        hr_tensor_free(lv);
    }
    hr_tensor_free(x);
    if (s != HR_OK) {
        hr_tensor_free(*mean);
        *mean = NULL;
    }
    return s;
done:
    return s;
}

/* ---- lifetime -------------------------------------------------------------------- */

static const char *const vae_classes[] = {"AutoencoderKL", NULL};

hr_status hr_vae_load(const char *dir, const hr_component_options *opts, hr_vae **out) {
    if (!out) return hr_error(HR_ERR_INVALID_ARG, "hr_vae_load: NULL argument");
    *out = NULL;
    hr_vae *v = calloc(1, sizeof *v);
    if (!v) return hr_error(HR_ERR_OOM, "vae");
    hr_status s = hr_component_open(&v->c, dir, vae_classes, opts);
    if (s == HR_OK) s = read_config(v);
    if (s == HR_OK) s = load_weights(v);
    if (s != HR_OK) {
        hr_vae_free(v);
        return s;
    }
    *out = v;
    return HR_OK;
}

void hr_vae_free(hr_vae *v) {
    if (!v) return;
    hr_component_close(&v->c);
    free(v);
}

int64_t hr_vae_latent_channels(const hr_vae *v) { return v->latent; }
int64_t hr_vae_upscale(const hr_vae *v) { return (int64_t)1 << (v->n_blocks - 1); }
double hr_vae_scaling_factor(const hr_vae *v) { return v->scaling; }
double hr_vae_shift_factor(const hr_vae *v) { return v->shift; }
hr_dtype hr_vae_dtype(const hr_vae *v) { return v->c.dtype; }
