/* FlowMatchEulerDiscreteScheduler, computed as diffusers computes it.
 *
 * diffusers mixes three arithmetics, and the last bits of the schedule
 * depend on each: the training sigmas of __init__ are torch f32 (the
 * sigma_max and sigma_min that bound the inference ramp come from them);
 * set_timesteps works in NumPy f64 on its own ramp, but in NumPy f32 on
 * sigmas the caller gives (a Python float meeting an f32 array stays f32,
 * NEP 50); the result is rounded to f32 and the timesteps are sigma * N
 * in f32. Each step below names which it follows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/half.h"
#include "hubrt/diffusion.h"
#include "hubrt/io.h"
#include "hubrt/ops.h"
#include "pipelines/beta_quantile.h"

#define MAX_STEPS 100000

void hr_flow_match_config_defaults(hr_flow_match_config *c) {
    *c = (hr_flow_match_config){.num_train_timesteps = 1000, .shift = 1.0, .base_shift = 0.5, .max_shift = 1.15,
                                .base_image_seq_len = 256, .max_image_seq_len = 4096};
}

hr_status hr_flow_match_config_load(const char *path, hr_flow_match_config *out) {
    hr_flow_match_config c;
    hr_flow_match_config_defaults(&c);
    hr_json_doc *doc = NULL;
    HR_TRY(hr_json_doc_load(path, &doc));
    hr_json_obj r = hr_json_doc_root(doc);
    const char *cls = NULL, *shift_type = NULL;
    bool karras = false, expo = false, beta = false;
    hr_status s = hr_json_get_str(r, "_class_name", NULL, &cls);
    if (s == HR_OK && cls && strcmp(cls, "FlowMatchEulerDiscreteScheduler") != 0)
        s = hr_error(HR_ERR_UNSUPPORTED, "%s: _class_name '%s' is not a scheduler hubrt has "
                     "(FlowMatchEulerDiscreteScheduler)", path, cls);
    if (s == HR_OK) s = hr_json_get_i64(r, "num_train_timesteps", c.num_train_timesteps, &c.num_train_timesteps);
    if (s == HR_OK) s = hr_json_get_f64(r, "shift", c.shift, &c.shift);
    if (s == HR_OK) s = hr_json_get_bool(r, "use_dynamic_shifting", false, &c.use_dynamic_shifting);
    if (s == HR_OK) s = hr_json_get_f64(r, "base_shift", c.base_shift, &c.base_shift);
    if (s == HR_OK) s = hr_json_get_f64(r, "max_shift", c.max_shift, &c.max_shift);
    if (s == HR_OK) s = hr_json_get_i64(r, "base_image_seq_len", c.base_image_seq_len, &c.base_image_seq_len);
    if (s == HR_OK) s = hr_json_get_i64(r, "max_image_seq_len", c.max_image_seq_len, &c.max_image_seq_len);
    if (s == HR_OK) s = hr_json_get_bool(r, "invert_sigmas", false, &c.invert_sigmas);
    if (s == HR_OK) s = hr_json_get_f64(r, "shift_terminal", 0, &c.shift_terminal);
    if (s == HR_OK) s = hr_json_get_bool(r, "use_karras_sigmas", false, &karras);
    if (s == HR_OK) s = hr_json_get_bool(r, "use_exponential_sigmas", false, &expo);
    if (s == HR_OK) s = hr_json_get_bool(r, "use_beta_sigmas", false, &beta);
    if (s == HR_OK) s = hr_json_get_bool(r, "stochastic_sampling", false, &c.stochastic_sampling);
    if (s == HR_OK) s = hr_json_get_str(r, "time_shift_type", "exponential", &shift_type);
    if (s == HR_OK) {
        if (karras + expo + beta > 1)
            s = hr_error(HR_ERR_FORMAT, "%s: only one of use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas "
                         "may be set", path);
        else if (strcmp(shift_type, "exponential") && strcmp(shift_type, "linear"))
            s = hr_error(HR_ERR_FORMAT, "%s: time_shift_type '%s' must be exponential or linear", path, shift_type);
        else if (c.num_train_timesteps < 1 || c.num_train_timesteps > 1000000)
            s = hr_error(HR_ERR_FORMAT, "%s: num_train_timesteps %lld must be in [1, 1e6]", path,
                         (long long)c.num_train_timesteps);
        else if (c.shift_terminal >= 1)
            s = hr_error(HR_ERR_FORMAT, "%s: shift_terminal %g must be below 1", path, c.shift_terminal);
        else if (c.use_dynamic_shifting && c.max_image_seq_len == c.base_image_seq_len)
            s = hr_error(HR_ERR_FORMAT, "%s: max_image_seq_len must differ from base_image_seq_len", path);
    }
    c.schedule = karras ? HR_SIGMAS_KARRAS : expo ? HR_SIGMAS_EXPONENTIAL : beta ? HR_SIGMAS_BETA : HR_SIGMAS_DEFAULT;
    c.time_shift = shift_type && strcmp(shift_type, "linear") == 0 ? HR_TIME_SHIFT_LINEAR : HR_TIME_SHIFT_EXPONENTIAL;
    hr_json_doc_free(doc);
    if (s == HR_OK) *out = c;
    return s;
}

double hr_flow_match_mu(const hr_flow_match_config *c, int64_t image_seq_len) {
    double m = (c->max_shift - c->base_shift) / (double)(c->max_image_seq_len - c->base_image_seq_len);
    double b = c->base_shift - m * (double)c->base_image_seq_len;
    return (double)image_seq_len * m + b;
}

/* v rounded to f32 when `f32` (NumPy f32 arithmetic), else kept. */
static double rnd(bool f32, double v) { return f32 ? (double)(float)v : v; }

/* np.linspace(start, stop, n)[i]: i * step + start, the last one stop. */
static double linspace_at(double start, double stop, int64_t n, int64_t i) {
    if (n == 1) return start;
    if (i == n - 1) return stop;
    double step = (stop - start) / (double)(n - 1);
    return (double)i * step + start;
}

/* The static or dynamic shift of one sigma, in f64 or in f32. */
static double shift_sigma(const hr_flow_match_config *c, bool f32, double mu, double s) {
    if (!c->use_dynamic_shifting) {
        double num = rnd(f32, rnd(f32, c->shift) * s);
        double den = rnd(f32, 1 + rnd(f32, rnd(f32, c->shift - 1) * s));
        return rnd(f32, num / den);
    }
    double t = rnd(f32, rnd(f32, 1 / s) - 1); /* (1 / t - 1) ** 1.0 */
    double e = c->time_shift == HR_TIME_SHIFT_LINEAR ? rnd(f32, mu) : rnd(f32, exp(mu));
    return rnd(f32, e / rnd(f32, e + t));
}

hr_status hr_flow_match_timesteps(const hr_flow_match_config *c, int64_t steps, double mu, const float *custom,
                                  float *sigmas, float *timesteps) {
    if (steps < 1 || steps > MAX_STEPS)
        return hr_error(HR_ERR_INVALID_ARG, "scheduler: %lld steps (must be in [1, %d])", (long long)steps, MAX_STEPS);
    if (c->use_dynamic_shifting && !isfinite(mu))
        return hr_error(HR_ERR_INVALID_ARG, "scheduler: use_dynamic_shifting needs mu");
    if (c->stochastic_sampling)
        return hr_error(HR_ERR_UNSUPPORTED, "scheduler: stochastic_sampling is not supported (it draws noise at "
                        "every step)");
    int64_t n_train = c->num_train_timesteps;
    float nf = (float)n_train;
    /* __init__'s training sigmas, torch f32: only the first and last are used */
    double ends[2];
    for (int k = 0; k < 2; k++) {
        float s = (float)(k == 0 ? n_train : 1) / nf;
        if (!c->use_dynamic_shifting) {
            float sh = (float)c->shift;
            s = (sh * s) / (1.0f + (float)(c->shift - 1) * s);
        }
        ends[k] = s;
    }
    double sigma_max = ends[0], sigma_min = ends[1];
    bool f32 = custom != NULL;
    /* the linear ramp (f64) or the caller's sigmas (f32), shifted */
    double *v = (double *)malloc((size_t)steps * sizeof *v);
    if (!v) return hr_error(HR_ERR_OOM, "scheduler: %lld sigmas", (long long)steps);
    for (int64_t i = 0; i < steps; i++) {
        double s = custom ? (double)custom[i]
                          : linspace_at(sigma_max * (double)n_train, sigma_min * (double)n_train, steps, i) /
                                (double)n_train;
        v[i] = shift_sigma(c, f32, mu, s);
    }
    if (c->shift_terminal > 0) {
        double scale = rnd(f32, rnd(f32, 1 - v[steps - 1]) / rnd(f32, 1 - c->shift_terminal));
        for (int64_t i = 0; i < steps; i++) v[i] = rnd(f32, 1 - rnd(f32, rnd(f32, 1 - v[i]) / scale));
    }
    if (c->schedule != HR_SIGMAS_DEFAULT) {
        double lo = v[steps - 1], hi = v[0]; /* .item(): the values as stored */
        for (int64_t i = 0; i < steps; i++) {
            double ramp = linspace_at(0, 1, steps, i);
            if (c->schedule == HR_SIGMAS_KARRAS) {
                double mn = pow(lo, 1 / 7.0), mx = pow(hi, 1 / 7.0);
                v[i] = pow(mx + ramp * (mn - mx), 7.0);
            } else if (c->schedule == HR_SIGMAS_EXPONENTIAL) {
                v[i] = exp(linspace_at(log(hi), log(lo), steps, i));
            } else {
                v[i] = lo + hr_beta_quantile(1 - ramp, 0.6, 0.6) * (hi - lo);
            }
        }
    }
    for (int64_t i = 0; i < steps; i++) {
        float s = (float)v[i];
        if (c->invert_sigmas) s = 1.0f - s;
        sigmas[i] = s;
        timesteps[i] = s * nf;
    }
    sigmas[steps] = c->invert_sigmas ? 1.0f : 0.0f;
    free(v);
    return HR_OK;
}

hr_status hr_flow_match_step(float sigma, float sigma_next, const hr_tensor *sample, const hr_tensor *model_output,
                             hr_tensor **prev_sample) {
    if (!sample || !model_output || !prev_sample)
        return hr_error(HR_ERR_INVALID_ARG, "scheduler step: NULL argument");
    *prev_sample = NULL;
    hr_dtype dt = hr_tensor_dtype(model_output);
    float d = sigma_next - sigma;
    /* torch multiplies the 0-dim f32 dt into a bf16/f16 model_output in
     * that dtype: dt is rounded to it first */
    if (dt == HR_BF16) d = hr_bf16_to_f32(hr_f32_to_bf16(d));
    if (dt == HR_F16) d = hr_f16_to_f32(hr_f32_to_f16(d));
    hr_tensor *upd = NULL, *upd32 = NULL, *s32 = NULL, *sum = NULL;
    hr_status s = hr_scale(model_output, d, 0, &upd); /* dt * model_output, in model_output's dtype */
    if (s == HR_OK) s = hr_cast(upd, HR_F32, &upd32);
    if (s == HR_OK) s = hr_cast(sample, HR_F32, &s32);
    if (s == HR_OK) s = hr_add(s32, upd32, &sum);
    if (s == HR_OK) s = hr_cast(sum, dt, prev_sample);
    hr_tensor_free(upd);
    hr_tensor_free(upd32);
    hr_tensor_free(s32);
    hr_tensor_free(sum);
    return s;
}
