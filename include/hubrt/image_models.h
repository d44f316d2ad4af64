/* The models of image pipelines, each read from its diffusers folder as
 * the Hub stores it (config.json, diffusion_pytorch_model.safetensors,
 * sharded or not, fp32/fp16/bf16): the AutoencoderKL decoder, SD3's
 * transformer, its CLIP and T5 text encoders. */
#ifndef HUBRT_IMAGE_MODELS_H
#define HUBRT_IMAGE_MODELS_H

#include "hubrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_component_options {
    /* "float32", "bfloat16", "float16" (hr_dtype_parse names); NULL or
     * "auto": the dtype the weights are stored in. */
    const char *dtype;
    const char *device;  /* NULL: "cpu" */
    const char *variant; /* "fp16": diffusion_pytorch_model.fp16.safetensors; NULL: the plain file */
    /* Compile the forward once per input signature (hubrt/graph.h) and
     * replay it; false runs it op by op. Components without a compiled
     * path ignore it. */
    bool compile;
} hr_component_options;

/* AutoencoderKL (diffusers): the decoder, as SD3's and SDXL's VAEs build
 * it (UNetMidBlock2D with its attention, UpDecoderBlock2D blocks, group
 * norms, nearest upsampling), with post_quant_conv when the config uses
 * it; and the encoder (DownEncoderBlock2D blocks, quant_conv). */
typedef struct hr_vae hr_vae;
/* `dir` is the pipeline's vae/ folder (or any AutoencoderKL folder). */
HR_API hr_status hr_vae_load(const char *dir, const hr_component_options *opts, hr_vae **out);
HR_API void hr_vae_free(hr_vae *v);
/* z [b, latent_channels, h, w], any float dtype (cast to the VAE's) ->
 * the image [b, out_channels, h * f, w * f] in the VAE's dtype, f =
 * hr_vae_upscale(v); what AutoencoderKL.decode(z).sample gives: the
 * pipeline unscales latents first (latents / scaling_factor +
 * shift_factor). */
HR_API hr_status hr_vae_decode(hr_vae *v, const hr_tensor *z, hr_tensor **out);
/* image [b, in_channels, h, w] (h, w multiples of hr_vae_upscale; pixels
 * in [-1, 1]) -> the latent distribution's *mean [b, latent_channels, h /
 * f, w / f] and, when logvar is not NULL, its *logvar clamped to [-30, 20]
 * (AutoencoderKL.encode(x).latent_dist, with quant_conv when the config
 * uses it). The encoder's weights load on the first call. */
HR_API hr_status hr_vae_encode(hr_vae *v, const hr_tensor *image, hr_tensor **mean, hr_tensor **logvar);
HR_API int64_t hr_vae_latent_channels(const hr_vae *v);
HR_API int64_t hr_vae_upscale(const hr_vae *v);
HR_API double hr_vae_scaling_factor(const hr_vae *v);
HR_API double hr_vae_shift_factor(const hr_vae *v); /* 0 when the config has none */
HR_API hr_dtype hr_vae_dtype(const hr_vae *v);

/* SD3Transformer2DModel (diffusers' MMDiT, SD3 and SD3.5: qk_norm
 * "rms_norm", dual_attention_layers). */
typedef struct hr_sd3_transformer hr_sd3_transformer;
HR_API hr_status hr_sd3_transformer_load(const char *dir, const hr_component_options *opts,
                                         hr_sd3_transformer **out);
HR_API void hr_sd3_transformer_free(hr_sd3_transformer *m);
/* x [b, in_channels, h, w] latents (h, w multiples of the patch, at most
 * pos_embed_max_size patches), context [b, l, joint_attention_dim] prompt
 * embeddings, pooled [b, pooled_projection_dim], timesteps[b] on the host
 * (the scheduler's, 0 .. num_train_timesteps) -> the model output [b,
 * out_channels, h, w] in the model's dtype (diffusers' .sample). Inputs
 * are cast to the model's dtype and moved to its device. */
HR_API hr_status hr_sd3_transformer_forward(hr_sd3_transformer *m, const hr_tensor *x, const hr_tensor *context,
                                            const hr_tensor *pooled, const float *timesteps, hr_tensor **out);
HR_API int64_t hr_sd3_transformer_in_channels(const hr_sd3_transformer *m);
HR_API int64_t hr_sd3_transformer_patch_size(const hr_sd3_transformer *m);
HR_API int64_t hr_sd3_transformer_joint_dim(const hr_sd3_transformer *m);
HR_API int64_t hr_sd3_transformer_sample_size(const hr_sd3_transformer *m); /* latent pixels, the default size */
HR_API hr_dtype hr_sd3_transformer_dtype(const hr_sd3_transformer *m);
HR_API hr_device *hr_sd3_transformer_device(const hr_sd3_transformer *m);

/* CLIPTextModelWithProjection / CLIPTextModel (transformers), the text
 * encoders of SD3 (CLIP-L, quick_gelu; CLIP-G, gelu). */
typedef struct hr_clip_text hr_clip_text;
HR_API hr_status hr_clip_text_load(const char *dir, const hr_component_options *opts, hr_clip_text **out);
HR_API void hr_clip_text_free(hr_clip_text *m);
/* ids [b, l] (integer, l <= max_position_embeddings) -> *hidden =
 * hidden_states[hidden_index] (Python indexing over the n_layers + 1
 * states: 0 the embeddings, -1 the last layer's output, -2 the one SD3
 * reads) and *text_embeds [b, projection_dim] (the final-normed row at
 * each prompt's end-of-text token, projected); either output may be NULL
 * to skip it. */
HR_API hr_status hr_clip_text_forward(hr_clip_text *m, const hr_tensor *ids, int hidden_index, hr_tensor **hidden,
                                      hr_tensor **text_embeds);
HR_API int64_t hr_clip_text_hidden_size(const hr_clip_text *m);
HR_API int64_t hr_clip_text_projection_dim(const hr_clip_text *m); /* 0 without a projection */

/* T5EncoderModel (transformers): SD3's text_encoder_3 (T5 v1.1's
 * gated-gelu, or v1.0's relu), with float16's overflow clamp. */
typedef struct hr_t5_encoder hr_t5_encoder;
HR_API hr_status hr_t5_encoder_load(const char *dir, const hr_component_options *opts, hr_t5_encoder **out);
HR_API void hr_t5_encoder_free(hr_t5_encoder *m);
/* ids [b, l] (integer) -> last_hidden_state [b, l, d_model] */
HR_API hr_status hr_t5_encoder_forward(hr_t5_encoder *m, const hr_tensor *ids, hr_tensor **out);
HR_API int64_t hr_t5_encoder_d_model(const hr_t5_encoder *m);

#ifdef __cplusplus
}
#endif
#endif
