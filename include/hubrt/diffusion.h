/* Diffusion pipelines: the flow-matching scheduler, torch's seeded noise,
 * and the Stable Diffusion 3 pipeline over the image models of
 * hubrt/image_models.h. */
#ifndef HUBRT_DIFFUSION_H
#define HUBRT_DIFFUSION_H

#include "hubrt/image_models.h"
#include "hubrt/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- FlowMatchEulerDiscreteScheduler (diffusers) ------------------------- */

typedef enum hr_sigma_schedule {
    HR_SIGMAS_DEFAULT = 0, /* linear in t, then shifted */
    HR_SIGMAS_KARRAS = 1,
    HR_SIGMAS_EXPONENTIAL = 2,
    HR_SIGMAS_BETA = 3, /* Beta(0.6, 0.6) quantiles */
} hr_sigma_schedule;

typedef enum hr_time_shift { HR_TIME_SHIFT_EXPONENTIAL = 0, HR_TIME_SHIFT_LINEAR = 1 } hr_time_shift;

/* scheduler_config.json's fields, with diffusers' defaults. */
typedef struct hr_flow_match_config {
    int64_t num_train_timesteps; /* 1000 */
    double shift;                /* 1.0 */
    bool use_dynamic_shifting;   /* then set_timesteps needs mu */
    double base_shift, max_shift;             /* 0.5, 1.15: mu from the image size (hr_flow_match_mu) */
    int64_t base_image_seq_len, max_image_seq_len; /* 256, 4096 */
    bool invert_sigmas;
    double shift_terminal; /* 0: none */
    hr_sigma_schedule schedule;
    hr_time_shift time_shift;
    bool stochastic_sampling; /* refused: it draws noise at every step */
} hr_flow_match_config;

HR_API void hr_flow_match_config_defaults(hr_flow_match_config *c);
/* Reads a scheduler_config.json (its _class_name, when present, must be
 * FlowMatchEulerDiscreteScheduler); fields it lacks keep the defaults. */
HR_API hr_status hr_flow_match_config_load(const char *path, hr_flow_match_config *out);

/* The schedule of `steps` denoising steps, exactly as diffusers'
 * set_timesteps computes it (f64 where it uses NumPy f64, f32 where torch
 * or NumPy f32): sigmas[steps + 1] (the last 0, or 1 with invert_sigmas)
 * and timesteps[steps]. mu is the dynamic shift's (NAN when the config
 * does not shift dynamically). `custom`, when not NULL, gives the
 * `steps` sigmas to shift instead of the linear ramp (diffusers'
 * sigmas=). */
HR_API hr_status hr_flow_match_timesteps(const hr_flow_match_config *c, int64_t steps, double mu,
                                         const float *custom, float *sigmas, float *timesteps);
/* The SD3 pipeline's mu for an image of image_seq_len patches
 * (calculate_shift). */
HR_API double hr_flow_match_mu(const hr_flow_match_config *c, int64_t image_seq_len);
/* One Euler step from sigma to sigma_next: sample (upcast to f32) +
 * (sigma_next - sigma) * model_output, the product in model_output's
 * dtype as torch's promotion computes it (dt rounded to that dtype, the
 * product rounded again), the sum in f32, cast to model_output's dtype
 * (diffusers' step). */
HR_API hr_status hr_flow_match_step(float sigma, float sigma_next, const hr_tensor *sample,
                                    const hr_tensor *model_output, hr_tensor **prev_sample);

/* ---- Stable Diffusion 3 ------------------------------------------------------ */

/* A diffusers StableDiffusion3Pipeline folder: model_index.json,
 * scheduler/, transformer/, vae/, and for text prompts tokenizer/,
 * text_encoder/ (CLIP-L), tokenizer_2/, text_encoder_2/ (CLIP-G) and
 * optionally tokenizer_3/, text_encoder_3/ (T5; absent: zeros in its
 * place, as diffusers). opts apply to every model (compile: to the
 * transformer only). */
typedef struct hr_sd3_pipeline hr_sd3_pipeline;
HR_API hr_status hr_sd3_pipeline_load(const char *dir, const hr_component_options *opts, hr_sd3_pipeline **out);
HR_API void hr_sd3_pipeline_free(hr_sd3_pipeline *p);
/* The default height and width: the transformer's sample_size times the
 * VAE's factor. */
HR_API int64_t hr_sd3_pipeline_default_size(const hr_sd3_pipeline *p);

typedef struct hr_sd3_call {
    /* The text: prompt (prompt_2 for CLIP-G and prompt_3 for T5 default to
     * it) and the negatives for guidance (NULL: ""), encoded by the
     * folder's tokenizers and text encoders, which are loaded for the call
     * and freed before denoising. */
    const char *prompt, *prompt_2, *prompt_3;
    const char *negative_prompt, *negative_prompt_2, *negative_prompt_3;
    int64_t max_sequence_length; /* T5's padded length; 0: 256 */
    bool skip_t5;                /* zeros in T5's place even when the folder has it (less memory) */
    int64_t num_images_per_prompt; /* 0: 1 */
    /* Or the embeddings themselves, [b, l, joint_attention_dim] and [b,
     * pooled_projection_dim] (the negative pair too when guidance_scale >
     * 1); a given embedding wins over the text. */
    const hr_tensor *prompt_embeds, *pooled_prompt_embeds;
    const hr_tensor *negative_prompt_embeds, *negative_pooled_prompt_embeds;
    int64_t steps;         /* 0: 28 */
    double guidance_scale; /* > 1: classifier-free guidance */
    int64_t height, width; /* 0: hr_sd3_pipeline_default_size */
    uint64_t seed;         /* the latents torch draws for it, unless `latents` */
    const hr_tensor *latents; /* [b, latent_channels, height / f, width / f], or NULL */
    const float *sigmas;      /* `steps` custom sigmas, or NULL */
    double mu;                /* NAN: from the latent size when the scheduler shifts dynamically */
    bool output_latents;      /* return the final latents (f32), not the image */
    void (*progress)(void *ctx, int64_t step, int64_t steps); /* after each step, or NULL */
    void *progress_ctx;
} hr_sd3_call;

/* Runs the denoising loop and the decode: *image [b, 3, height, width],
 * f32 in [0, 1] (diffusers' output_type "np", channels first). */
HR_API hr_status hr_sd3_pipeline_run(hr_sd3_pipeline *p, const hr_sd3_call *c, hr_tensor **image);

/* ---- seeded noise -------------------------------------------------------- */

/* out[n] = torch.randn(n, generator=torch.Generator("cpu").manual_seed(seed))
 * bit for bit (f32; n >= 16, fewer is refused): the latents diffusers
 * draws for a seed. */
HR_API hr_status hr_torch_randn(uint64_t seed, int64_t n, float *out);
/* The same in dtype dt (f32, bf16 or f16) into out[n] of that type, bit for
 * bit with torch.randn(n, dtype=...): a bf16 or f16 pipeline's latents
 * (the f32 stream rounded, but for the last 16 values when n is not a
 * multiple of 16, which torch draws another way for those types). */
HR_API hr_status hr_torch_randn_as(uint64_t seed, int64_t n, hr_dtype dt, void *out);

#ifdef __cplusplus
}
#endif
#endif
