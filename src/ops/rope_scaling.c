/* Rope inverse frequencies and attention scaling for each rope_type, as
 * transformers' modeling_rope_utils computes them.
 *
 * transformers mixes float64 Python scalars with float32 tensors, and the
 * rounding of every step shows in the result, so each step is mirrored
 * with the precision torch gives it:
 *   - Python scalar arithmetic (factors, yarn's correction range, mscale)
 *     is double;
 *   - a Python scalar meeting an f32 tensor is first rounded to f32, and
 *     the tensor op runs in f32 (mul, div, sub, comparisons);
 *   - `s / t` with a scalar s is torch's __rtruediv__: reciprocal(t) * s,
 *     two roundings;
 *   - pow of f32 values is f32 pow.
 * torch's f32 pow is SLEEF's 1-ulp powf; here it is the correctly rounded
 * value, so a frequency may differ from transformers' by 1 ulp (a few of
 * 64 with some thetas). Every other step matches bit for bit, as long as
 * the compiler fuses no multiply-add (C11 mode: GCC's -ffp-contract=off). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "ops/op_impl.h"

/* The last bits above depend on no multiply-add being fused: GCC keeps
 * them apart in ISO C mode, clang needs telling. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

hr_rope_type hr_rope_type_parse(const char *name, bool *ok) {
    static const char *const names[] = {"default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"};
    if (ok) *ok = true;
    if (!name) return HR_ROPE_DEFAULT;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(name, names[i])) return (hr_rope_type)i;
    if (ok) *ok = false;
    return HR_ROPE_DEFAULT;
}

static float pow_f32(float base, float e) { return (float)pow((double)base, (double)e); }

/* torch's `1.0 / t` and `s / t`: reciprocal, then a multiply. */
static float rdiv_f32(float s, float t) { return (1.0f / t) * s; }

/* base ** (arange(0, dim, 2).float() / dim), all f32. */
static float pos_freq(float base, int64_t i, int64_t dim) { return pow_f32(base, (float)(2 * i) / (float)dim); }

static void default_inv_freq(float base, int64_t dim, float *inv) {
    for (int64_t i = 0; i < dim / 2; i++) inv[i] = rdiv_f32(1.0f, pos_freq(base, i, dim));
}

/* Dynamic NTK: theta grows with the sequence beyond max_position_embeddings.
 * transformers computes it in Python doubles at init (seq_len clamped up to
 * max_position_embeddings) but in f32 tensors once the forward sees a longer
 * sequence (seq_len is then max(position_ids) + 1, a tensor). */
static float dynamic_base(const hr_rope_config *c, int64_t seq_len) {
    int64_t dim = c->rotary_dim, maxp = c->max_position_embeddings;
    double factor = c->factor;
    if (seq_len <= maxp) {
        double b = c->theta * pow((factor * (double)maxp / (double)maxp) - (factor - 1),
                                  (double)dim / (double)(dim - 2));
        return (float)b;
    }
    float t = (float)factor * (float)seq_len;
    t = t / (float)maxp;
    t = t - (float)(factor - 1);
    /* pow(f32 tensor, Python float) keeps the exponent in double */
    t = (float)pow((double)t, (double)dim / (double)(dim - 2));
    return (float)c->theta * t;
}

static double yarn_mscale(double scale, double mscale) {
    if (scale <= 1) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double rotations, int64_t dim, double base, int64_t maxp) {
    return ((double)dim * log((double)maxp / (rotations * 2 * M_PI))) / (2 * log(base));
}

static void yarn_inv_freq(const hr_rope_config *c, double factor, float *inv, double *scaling) {
    int64_t dim = c->rotary_dim, omax = c->original_max_position_embeddings;
    if (c->attention_factor > 0)
        *scaling = c->attention_factor;
    else if (c->mscale != 0 && c->mscale_all_dim != 0)
        *scaling = yarn_mscale(factor, c->mscale) / yarn_mscale(factor, c->mscale_all_dim);
    else
        *scaling = yarn_mscale(factor, 1);
    double beta_fast = c->beta_fast != 0 ? c->beta_fast : 32;
    double beta_slow = c->beta_slow != 0 ? c->beta_slow : 1;
    double low = yarn_correction_dim(beta_fast, dim, c->theta, omax);
    double high = yarn_correction_dim(beta_slow, dim, c->theta, omax);
    if (!c->no_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0 ? low : 0;
    high = high < (double)(dim - 1) ? high : (double)(dim - 1);
    if (low == high) high += 0.001; /* transformers: avoid a zero-width ramp */
    float flow = (float)low, span = (float)(high - low), ffactor = (float)factor, base = (float)c->theta;
    for (int64_t i = 0; i < dim / 2; i++) {
        float pf = pos_freq(base, i, dim);
        float extrap = rdiv_f32(1.0f, pf);
        float interp = rdiv_f32(1.0f, ffactor * pf);
        float ramp = ((float)i - flow) / span;
        ramp = ramp < 0 ? 0.0f : ramp > 1 ? 1.0f : ramp;
        float extrap_factor = 1.0f - ramp;
        float a = interp * (1.0f - extrap_factor);
        float b = extrap * extrap_factor;
        inv[i] = a + b;
    }
}

static void llama3_inv_freq(const hr_rope_config *c, float *inv) {
    int64_t dim = c->rotary_dim;
    double omax = (double)c->original_max_position_embeddings;
    float low_wl = (float)(omax / c->low_freq_factor), high_wl = (float)(omax / c->high_freq_factor);
    float factor = (float)c->factor, low_ff = (float)c->low_freq_factor;
    float span = (float)(c->high_freq_factor - c->low_freq_factor);
    default_inv_freq((float)c->theta, dim, inv);
    for (int64_t i = 0; i < dim / 2; i++) {
        float wavelen = rdiv_f32((float)(2 * M_PI), inv[i]);
        float f = wavelen > low_wl ? inv[i] / factor : inv[i];
        float smooth = (rdiv_f32((float)omax, wavelen) - low_ff) / span;
        float smoothed = ((1.0f - smooth) * f) / factor + smooth * f;
        bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
        inv[i] = medium ? smoothed : f;
    }
}

static void longrope_inv_freq(const hr_rope_config *c, double factor, int64_t seq_len, float *inv,
                              double *scaling) {
    int64_t dim = c->rotary_dim, omax = c->original_max_position_embeddings;
    if (c->attention_factor > 0)
        *scaling = c->attention_factor;
    else
        *scaling = factor <= 1.0 ? 1.0 : sqrt(1 + log(factor) / log((double)omax));
    const double *ext = seq_len > omax ? c->long_factor : c->short_factor;
    float base = (float)c->theta;
    for (int64_t i = 0; i < dim / 2; i++) inv[i] = rdiv_f32(1.0f, (float)ext[i] * pos_freq(base, i, dim));
}

static hr_status check_config(const hr_rope_config *c) {
    static const char *const names[] = {"default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"};
    if ((unsigned)c->type > HR_ROPE_PROPORTIONAL)
        return hr_error(HR_ERR_INVALID_ARG, "rope: unknown rope type %d", (int)c->type);
    const char *ty = names[c->type];
    if (c->rotary_dim < 2 || c->rotary_dim % 2)
        return hr_error(HR_ERR_INVALID_ARG, "rope (%s): rotary_dim must be even and >= 2, got %lld", ty,
                        (long long)c->rotary_dim);
    if (!(c->theta > 0)) return hr_error(HR_ERR_INVALID_ARG, "rope (%s): theta must be > 0, got %g", ty, c->theta);
    bool needs_factor = c->type == HR_ROPE_LINEAR || c->type == HR_ROPE_DYNAMIC || c->type == HR_ROPE_LLAMA3;
    if (needs_factor && !(c->factor > 0))
        return hr_error(HR_ERR_INVALID_ARG, "rope (%s): factor must be > 0, got %g", ty, c->factor);
    if (c->type == HR_ROPE_DYNAMIC && (c->max_position_embeddings <= 0 || c->rotary_dim <= 2))
        return hr_error(HR_ERR_INVALID_ARG, "rope (dynamic): needs max_position_embeddings > 0 and rotary_dim > 2");
    bool needs_omax = c->type == HR_ROPE_YARN || c->type == HR_ROPE_LLAMA3 || c->type == HR_ROPE_LONGROPE;
    if (needs_omax && c->original_max_position_embeddings <= 0)
        return hr_error(HR_ERR_INVALID_ARG, "rope (%s): original_max_position_embeddings must be > 0", ty);
    if ((c->type == HR_ROPE_YARN || c->type == HR_ROPE_LONGROPE) && c->factor <= 0 &&
        c->max_position_embeddings <= 0)
        return hr_error(HR_ERR_INVALID_ARG, "rope (%s): no factor and no max_position_embeddings to derive it", ty);
    if (c->type == HR_ROPE_LLAMA3 && !(c->high_freq_factor != c->low_freq_factor && c->low_freq_factor > 0 &&
                                       c->high_freq_factor > 0))
        return hr_error(HR_ERR_INVALID_ARG, "rope (llama3): low_freq_factor %g and high_freq_factor %g must be "
                        "positive and differ", c->low_freq_factor, c->high_freq_factor);
    if (c->type == HR_ROPE_PROPORTIONAL && (c->rotated_dim < 0 || c->rotated_dim > c->rotary_dim || c->rotated_dim % 2))
        return hr_error(HR_ERR_INVALID_ARG, "rope (proportional): rotated_dim %lld must be even and in 0..%lld",
                        (long long)c->rotated_dim, (long long)c->rotary_dim);
    if (c->type == HR_ROPE_PROPORTIONAL && c->factor < 0)
        return hr_error(HR_ERR_INVALID_ARG, "rope (proportional): factor must be > 0, got %g", c->factor);
    if (c->type == HR_ROPE_LONGROPE && (!c->short_factor || !c->long_factor))
        return hr_error(HR_ERR_INVALID_ARG, "rope (longrope): short_factor and long_factor are required");
    return HR_OK;
}

/* yarn and longrope without a factor take max / original max. */
static double derived_factor(const hr_rope_config *c) {
    if (c->factor > 0) return c->factor;
    return (double)c->max_position_embeddings / (double)c->original_max_position_embeddings;
}

hr_status hr_rope_inv_freq(const hr_rope_config *cfg, int64_t seq_len, float *inv_freq, double *attention_scaling) {
    if (!cfg || !inv_freq || !attention_scaling)
        return hr_error(HR_ERR_INVALID_ARG, "rope: cfg, inv_freq and attention_scaling must not be NULL");
    HR_TRY(check_config(cfg));
    int64_t dim = cfg->rotary_dim;
    *attention_scaling = 1.0;
    switch (cfg->type) {
    case HR_ROPE_DEFAULT: default_inv_freq((float)cfg->theta, dim, inv_freq); break;
    case HR_ROPE_LINEAR:
        default_inv_freq((float)cfg->theta, dim, inv_freq);
        for (int64_t i = 0; i < dim / 2; i++) inv_freq[i] /= (float)cfg->factor;
        break;
    case HR_ROPE_DYNAMIC: default_inv_freq(dynamic_base(cfg, seq_len), dim, inv_freq); break;
    case HR_ROPE_YARN: yarn_inv_freq(cfg, derived_factor(cfg), inv_freq, attention_scaling); break;
    case HR_ROPE_LLAMA3: llama3_inv_freq(cfg, inv_freq); break;
    case HR_ROPE_LONGROPE: longrope_inv_freq(cfg, derived_factor(cfg), seq_len, inv_freq, attention_scaling); break;
    case HR_ROPE_PROPORTIONAL:
        /* the frequencies of the whole head's rope for the first
         * rotated_dim / 2 pairs, 0 (no turn) for the rest, all / factor */
        for (int64_t i = 0; i < dim / 2; i++)
            inv_freq[i] = (i < cfg->rotated_dim / 2 ? rdiv_f32(1.0f, pos_freq((float)cfg->theta, i, dim)) : 0.0f) /
                          (cfg->factor > 0 ? (float)cfg->factor : 1.0f);
        break;
    }
    return HR_OK;
}
