/* The Stable Diffusion 3 pipeline (diffusers' StableDiffusion3Pipeline),
 * from the prompt embeddings on: latents drawn as torch draws them for the
 * seed (or given), the flow-matching schedule (mu from the latent size when
 * the scheduler shifts dynamically), classifier-free guidance over the
 * [negative, positive] batch, one transformer call per step (compiled once
 * per batch and resolution when asked), the Euler step, then the VAE
 * decode of latents / scaling_factor + shift_factor, mapped to [0, 1]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/path.h"
#include "hubrt/diffusion.h"
#include "hubrt/ops.h"
#include "pipelines/sd3_prompt.h"

struct hr_sd3_pipeline {
    char dir[1024];
    hr_component_options opts; /* for the text encoders, loaded per call */
    char dtype[32], device[64], variant[32];
    hr_sd3_transformer *transformer;
    hr_vae *vae;
    hr_flow_match_config sched;
};

hr_status hr_sd3_pipeline_load(const char *dir, const hr_component_options *opts, hr_sd3_pipeline **out) {
    if (!dir || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_sd3_pipeline_load: NULL argument");
    *out = NULL;
    char path[1200];
    static const char *const needed[] = {"model_index.json", "scheduler/scheduler_config.json",
                                         "transformer/config.json", "vae/config.json"};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, needed[i]);
        if (!hr_path_is_file(path))
            return hr_error(HR_ERR_NOT_FOUND, "%s: missing (a Stable Diffusion 3 folder has model_index.json, "
                            "scheduler/, transformer/ and vae/)", path);
    }
    hr_sd3_pipeline *p = calloc(1, sizeof *p);
    if (!p) return hr_error(HR_ERR_OOM, "sd3 pipeline");
    if (strlen(dir) >= sizeof p->dir - 32) {
        free(p);
        return hr_error(HR_ERR_INVALID_ARG, "%s: path too long", dir);
    }
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    if (opts) { /* kept for the text encoders, which load per call */
        snprintf(p->dtype, sizeof p->dtype, "%s", opts->dtype ? opts->dtype : "");
        snprintf(p->device, sizeof p->device, "%s", opts->device ? opts->device : "");
        snprintf(p->variant, sizeof p->variant, "%s", opts->variant ? opts->variant : "");
        p->opts.dtype = opts->dtype ? p->dtype : NULL;
        p->opts.device = opts->device ? p->device : NULL;
        p->opts.variant = opts->variant ? p->variant : NULL;
    }
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", dir);
    hr_status s = hr_flow_match_config_load(path, &p->sched);
    if (s == HR_OK) {
        snprintf(path, sizeof path, "%s/transformer", dir);
        s = hr_sd3_transformer_load(path, opts, &p->transformer);
    }
    if (s == HR_OK) {
        hr_component_options vo = opts ? *opts : (hr_component_options){0};
        vo.compile = false;
        snprintf(path, sizeof path, "%s/vae", dir);
        s = hr_vae_load(path, &vo, &p->vae);
    }
    if (s == HR_OK && hr_vae_latent_channels(p->vae) != hr_sd3_transformer_in_channels(p->transformer))
        s = hr_error(HR_ERR_FORMAT, "%s: the vae's latent_channels %lld differ from the transformer's in_channels %lld",
                     dir, (long long)hr_vae_latent_channels(p->vae),
                     (long long)hr_sd3_transformer_in_channels(p->transformer));
    if (s != HR_OK) {
        hr_sd3_pipeline_free(p);
        return s;
    }
    *out = p;
    return HR_OK;
}

void hr_sd3_pipeline_free(hr_sd3_pipeline *p) {
    if (!p) return;
    hr_sd3_transformer_free(p->transformer);
    hr_vae_free(p->vae);
    free(p);
}

int64_t hr_sd3_pipeline_default_size(const hr_sd3_pipeline *p) {
    return hr_sd3_transformer_sample_size(p->transformer) * hr_vae_upscale(p->vae);
}

/* The [b, c, h, w] starting latents: the caller's, or torch's randn stream
 * for the seed in the transformer's dtype (diffusers draws them in the
 * prompt embeddings' dtype, the same in a pipeline of one dtype). */
static hr_status initial_latents(const hr_sd3_pipeline *p, const hr_sd3_call *c, int64_t b, int64_t h, int64_t w,
                                 hr_tensor **out) {
    hr_dtype dt = hr_sd3_transformer_dtype(p->transformer);
    int64_t ch = hr_sd3_transformer_in_channels(p->transformer), shape[4] = {b, ch, h, w};
    if (c->latents) {
        const int64_t *ls = hr_tensor_shape(c->latents);
        bool ok = hr_tensor_ndim(c->latents) == 4;
        for (int i = 0; ok && i < 4; i++) ok = ls[i] == shape[i];
        if (!ok) {
            char got[160], want[160];
            return hr_error(HR_ERR_SHAPE, "sd3 pipeline: latents %s must be %s for this size and batch",
                            hr_shape_str(hr_tensor_ndim(c->latents), ls, got, sizeof got),
                            hr_shape_str(4, shape, want, sizeof want));
        }
        hr_tensor *cast = NULL;
        HR_TRY(hr_cast(c->latents, dt, &cast));
        hr_status s = hr_tensor_to(cast, hr_sd3_transformer_device(p->transformer), out);
        hr_tensor_free(cast);
        return s;
    }
    int64_t n = b * ch * h * w;
    bool f32 = dt != HR_BF16 && dt != HR_F16; /* torch draws bf16 and f16 latents in their own stream */
    void *noise = malloc((size_t)n * (f32 ? 4 : 2));
    if (!noise) return hr_error(HR_ERR_OOM, "sd3 pipeline: %lld latent values", (long long)n);
    hr_status s = hr_torch_randn_as(c->seed, n, f32 ? HR_F32 : dt, noise);
    hr_tensor *f = NULL;
    if (s == HR_OK)
        s = hr_tensor_from_host(hr_device_cpu(), f32 ? HR_F32 : dt, 4, shape, noise, (size_t)n * (f32 ? 4 : 2), &f);
    free(noise);
    hr_tensor *cast = NULL;
    if (s == HR_OK) s = hr_cast(f, dt, &cast);
    if (s == HR_OK) s = hr_tensor_to(cast, hr_sd3_transformer_device(p->transformer), out);
    hr_tensor_free(f);
    hr_tensor_free(cast);
    return s;
}

/* uncond + g * (text - uncond) over the halves of the [2b, ...] output. */
static hr_status guide(const hr_tensor *pred, double g, hr_tensor **out) {
    int64_t b2 = hr_tensor_shape(pred)[0];
    hr_tensor *un = NULL, *tx = NULL, *d = NULL, *gd = NULL;
    hr_status s = hr_tensor_narrow(pred, 0, 0, b2 / 2, &un);
    if (s == HR_OK) s = hr_tensor_narrow(pred, 0, b2 / 2, b2 / 2, &tx);
    if (s == HR_OK) s = hr_sub(tx, un, &d);
    if (s == HR_OK) s = hr_scale(d, g, 0, &gd);
    if (s == HR_OK) s = hr_add(un, gd, out);
    hr_tensor_free(un);
    hr_tensor_free(tx);
    hr_tensor_free(d);
    hr_tensor_free(gd);
    return s;
}

static hr_status denoise_and_decode(hr_sd3_pipeline *p, const hr_sd3_call *c, int64_t b, hr_tensor **image);

static hr_status check_embeds(const char *what, const hr_tensor *t, int ndim, int64_t b, const char *layout) {
    if (!t) return hr_error(HR_ERR_INVALID_ARG, "sd3 pipeline: %s is required with guidance when no prompt is given", what);
    if (hr_tensor_ndim(t) != ndim || hr_tensor_shape(t)[0] != b) {
        char sh[160];
        return hr_error(HR_ERR_SHAPE, "sd3 pipeline: %s %s must be %s with the batch of prompt_embeds", what,
                        hr_shape_str(hr_tensor_ndim(t), hr_tensor_shape(t), sh, sizeof sh), layout);
    }
    return HR_OK;
}

hr_status hr_sd3_pipeline_run(hr_sd3_pipeline *p, const hr_sd3_call *c, hr_tensor **image) {
    if (!p || !c || !image) return hr_error(HR_ERR_INVALID_ARG, "hr_sd3_pipeline_run: NULL argument");
    *image = NULL;
    if (!c->prompt && !c->prompt_embeds)
        return hr_error(HR_ERR_INVALID_ARG, "sd3 pipeline: give a prompt or prompt_embeds");
    bool cfg = c->guidance_scale > 1;
    hr_sd3_call call = *c;
    hr_tensor *enc[4] = {0}, *rep[4] = {0};
    bool text = c->prompt && !(c->prompt_embeds && (!cfg || c->negative_prompt_embeds));
    if (text) { /* encoded here, the encoders freed before denoising */
        hr_sd3_prompts sp = {c->prompt, c->prompt_2, c->prompt_3, c->negative_prompt, c->negative_prompt_2,
                             c->negative_prompt_3, cfg, c->max_sequence_length, c->skip_t5};
        HR_TRY(hr_sd3_encode_prompts(p->dir, &p->opts, &sp, hr_sd3_transformer_joint_dim(p->transformer),
                                     hr_sd3_transformer_dtype(p->transformer), enc));
        if (!c->prompt_embeds) call.prompt_embeds = enc[0], call.pooled_prompt_embeds = enc[1];
        if (cfg && !c->negative_prompt_embeds)
            call.negative_prompt_embeds = enc[2], call.negative_pooled_prompt_embeds = enc[3];
    }
    int64_t per = c->num_images_per_prompt > 0 ? c->num_images_per_prompt : 1;
    hr_status s = HR_OK;
    if (per > 1) { /* each prompt's embeddings repeated, as diffusers' num_images_per_prompt */
        const hr_tensor **slots[4] = {&call.prompt_embeds, &call.pooled_prompt_embeds, &call.negative_prompt_embeds,
                                      &call.negative_pooled_prompt_embeds};
        for (int i = 0; s == HR_OK && i < 4; i++)
            if (*slots[i]) {
                const hr_tensor *parts[16];
                if (per > 16) {
                    s = hr_error(HR_ERR_INVALID_ARG, "sd3 pipeline: num_images_per_prompt %lld (at most 16)",
                                 (long long)per);
                    break;
                }
                for (int64_t k = 0; k < per; k++) parts[k] = *slots[i];
                s = hr_cat(parts, (int)per, 0, &rep[i]);
                *slots[i] = rep[i];
            }
    }
    c = &call;
    int64_t b = c->prompt_embeds ? hr_tensor_shape(c->prompt_embeds)[0] : 0;
    if (s == HR_OK) s = check_embeds("prompt_embeds", c->prompt_embeds, 3, b, "[b, l, joint_attention_dim]");
    if (s == HR_OK) s = check_embeds("pooled_prompt_embeds", c->pooled_prompt_embeds, 2, b, "[b, pooled_projection_dim]");
    if (s == HR_OK && cfg) {
        s = check_embeds("negative_prompt_embeds", c->negative_prompt_embeds, 3, b, "[b, l, joint_attention_dim]");
        if (s == HR_OK)
            s = check_embeds("negative_pooled_prompt_embeds", c->negative_pooled_prompt_embeds, 2, b,
                             "[b, pooled_projection_dim]");
    }
    if (s == HR_OK) s = denoise_and_decode(p, c, b, image);
    for (int i = 0; i < 4; i++) hr_tensor_free(enc[i]), hr_tensor_free(rep[i]);
    return s;
}

/* The loop and the decode for b prompts of embeddings. */
static hr_status denoise_and_decode(hr_sd3_pipeline *p, const hr_sd3_call *c, int64_t b, hr_tensor **image) {
    bool cfg = c->guidance_scale > 1;
    int64_t f = hr_vae_upscale(p->vae), patch = hr_sd3_transformer_patch_size(p->transformer);
    int64_t height = c->height ? c->height : hr_sd3_pipeline_default_size(p);
    int64_t width = c->width ? c->width : hr_sd3_pipeline_default_size(p);
    if (height < 1 || width < 1 || height % (f * patch) || width % (f * patch))
        return hr_error(HR_ERR_INVALID_ARG, "sd3 pipeline: size %lldx%lld must be positive multiples of %lld (the "
                        "vae's factor %lld times the patch %lld)", (long long)width, (long long)height,
                        (long long)(f * patch), (long long)f, (long long)patch);
    int64_t steps = c->steps ? c->steps : 28, lh = height / f, lw = width / f;
    float *sigmas = malloc((size_t)(steps + 1) * sizeof *sigmas), *ts = malloc((size_t)steps * sizeof *ts);
    float *tb = malloc((size_t)(2 * b) * sizeof *tb);
    hr_tensor *lat = NULL, *ctx = NULL, *pooled = NULL, *z = NULL, *dec = NULL, *img = NULL, *img01 = NULL;
    hr_status s = sigmas && ts && tb ? HR_OK : hr_error(HR_ERR_OOM, "sd3 pipeline: %lld steps", (long long)steps);
    double mu = c->mu;
    if (s == HR_OK && p->sched.use_dynamic_shifting && !isfinite(mu))
        mu = hr_flow_match_mu(&p->sched, (lh / patch) * (lw / patch));
    if (s == HR_OK) s = hr_flow_match_timesteps(&p->sched, steps, mu, c->sigmas, sigmas, ts);
    if (s == HR_OK) s = initial_latents(p, c, b, lh, lw, &lat);
    if (s == HR_OK && cfg) {
        s = hr_cat((const hr_tensor *[]){c->negative_prompt_embeds, c->prompt_embeds}, 2, 0, &ctx);
        if (s == HR_OK)
            s = hr_cat((const hr_tensor *[]){c->negative_pooled_prompt_embeds, c->pooled_prompt_embeds}, 2, 0, &pooled);
    } else if (s == HR_OK) {
        s = hr_tensor_alias(c->prompt_embeds, &ctx);
        if (s == HR_OK) s = hr_tensor_alias(c->pooled_prompt_embeds, &pooled);
    }
    hr_device *dev = hr_sd3_transformer_device(p->transformer);
    if (s == HR_OK && hr_tensor_device(ctx) != dev) { /* the prompt's rows once on the transformer's device */
        hr_tensor *dc = NULL, *dp = NULL;
        s = hr_tensor_to(ctx, dev, &dc);
        if (s == HR_OK) s = hr_tensor_to(pooled, dev, &dp);
        hr_tensor_free(ctx);
        hr_tensor_free(pooled);
        ctx = dc;
        pooled = dp;
    }
    for (int64_t i = 0; s == HR_OK && i < steps; i++) {
        hr_tensor *in = NULL, *pred = NULL, *guided = NULL, *next = NULL;
        for (int64_t k = 0; k < (cfg ? 2 : 1) * b; k++) tb[k] = ts[i];
        s = cfg ? hr_cat((const hr_tensor *[]){lat, lat}, 2, 0, &in) : hr_tensor_alias(lat, &in);
        if (s == HR_OK) s = hr_sd3_transformer_forward(p->transformer, in, ctx, pooled, tb, &pred);
        if (s == HR_OK) s = cfg ? guide(pred, c->guidance_scale, &guided) : hr_tensor_alias(pred, &guided);
        if (s == HR_OK) s = hr_flow_match_step(sigmas[i], sigmas[i + 1], lat, guided, &next);
        hr_tensor_free(in);
        hr_tensor_free(pred);
        hr_tensor_free(guided);
        if (s == HR_OK) {
            hr_tensor_free(lat);
            lat = next;
            if (c->progress) c->progress(c->progress_ctx, i + 1, steps);
        }
    }
    if (s == HR_OK && c->output_latents) {
        s = hr_cast(lat, HR_F32, image);
    } else if (s == HR_OK) {
        hr_tensor *sf = NULL; /* latents / scaling_factor: a division, as torch's */
        s = hr_tensor_scalar(hr_tensor_device(lat), hr_tensor_dtype(lat), hr_vae_scaling_factor(p->vae), &sf);
        if (s == HR_OK) s = hr_div(lat, sf, &z);
        hr_tensor_free(sf);
        if (s == HR_OK && hr_vae_shift_factor(p->vae) != 0) { /* (latents / scaling) + shift, two roundings */
            hr_tensor *zs = NULL;
            s = hr_scale(z, 1, hr_vae_shift_factor(p->vae), &zs);
            hr_tensor_free(z);
            z = zs;
        }
        if (s == HR_OK) s = hr_vae_decode(p->vae, z, &dec);
        if (s == HR_OK) s = hr_scale(dec, 0.5, 0.5, &img); /* VaeImageProcessor.denormalize */
        if (s == HR_OK) s = hr_clamp(img, &(double){0}, &(double){1}, &img01);
        if (s == HR_OK) s = hr_cast(img01, HR_F32, image);
    }
    free(sigmas);
    free(ts);
    free(tb);
    hr_tensor_free(lat);
    hr_tensor_free(ctx);
    hr_tensor_free(pooled);
    hr_tensor_free(z);
    hr_tensor_free(dec);
    hr_tensor_free(img);
    hr_tensor_free(img01);
    return s;
}
