/* Model loading, the model's public getters and the public forwards:
 * hr_model_forward on tensors, hr_model_step on host arrays (what a
 * generation loop runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dequant.h"
#include "core/error.h"
#include "hubrt/kernels.h"
#include "ops/experts_impl.h"
#include "models/forward_internal.h"
#include "io/st_internal.h"
#include "models/tp.h"

/* ---- loading ------------------------------------------------------------- */

static hr_status resolve_dtype(const hr_model_options *opts, const hr_model_config *cfg, hr_dtype *out) {
    *out = cfg->dtype;
    if (!opts || !opts->dtype || !strcmp(opts->dtype, "auto")) return HR_OK;
    if (hr_dtype_parse(opts->dtype, out) != HR_OK || !hr_dtype_is_float(*out) || *out == HR_F64)
        return hr_error(HR_ERR_INVALID_ARG, "dtype '%s' is not supported for models (bfloat16, float16, float32)",
                        opts->dtype);
    return HR_OK;
}

/* Named experts implementations: each name, and whether it runs
 * transformers' per-expert rounding. */
static const struct {
    const char *name;
    bool per_expert;
} experts_impls[] = {{"grouped", false}, {"grouped_mm", false}, {"batched_mm", false}, {"eager", true}};

/* The implementation changes: the captured plans hold the old one's attrs. */
static void set_experts(hr_model *m, bool per_expert, int64_t impl) {
    if (m->experts_per_expert != per_expert || m->experts_impl != impl)
        for (int j = 0; j < 2; j++) {
            hr_jit_free(m->jit[j]);
            m->jit[j] = NULL;
        }
    m->experts_per_expert = per_expert;
    m->experts_impl = impl;
}

hr_status hr_model_set_experts_kernel(hr_model *m, int64_t impl_id, bool per_expert) {
    const char *name = NULL;
    if (!m || !impl_id || !hr_experts_impl_find(impl_id, &name))
        return hr_error(HR_ERR_NOT_FOUND, "experts kernel %lld is not loaded (hr_kernel_load)", (long long)impl_id);
    snprintf(m->experts_name, sizeof m->experts_name, "%s", name);
    set_experts(m, per_expert, impl_id);
    return HR_OK;
}

/* "org/name", "org/name@v<N>", "org/name@<revision>", or a folder. */
static hr_status load_hub_kernel(hr_model *m, const char *name) {
    char repo[256], rev[128] = "";
    snprintf(repo, sizeof repo, "%s", name);
    /* a folder path is taken whole; a repository id may end in @revision */
    bool folder = repo[0] == '/' || !strncmp(repo, "./", 2) || !strncmp(repo, "../", 3);
    char *at = folder ? NULL : strrchr(repo, '@');
    if (at) {
        snprintf(rev, sizeof rev, "%s", at + 1);
        *at = 0;
    }
    hr_kernel_options o = {0};
    char *end = NULL;
    long long v = rev[0] == 'v' ? strtoll(rev + 1, &end, 10) : 0;
    if (v > 0 && end && !*end) o.version = v;
    else if (rev[0]) o.revision = rev;
    hr_kernel_info info;
    HR_TRY(hr_kernel_load(repo, &o, &info));
    return hr_model_set_experts_kernel(m, info.impl_id, false);
}

hr_status hr_model_set_experts_implementation(hr_model *m, const char *name) {
    if (!m || !name) return hr_error(HR_ERR_INVALID_ARG, "hr_model_set_experts_implementation: NULL argument");
    for (size_t i = 0; i < sizeof experts_impls / sizeof experts_impls[0]; i++) {
        if (strcmp(name, experts_impls[i].name)) continue;
        set_experts(m, experts_impls[i].per_expert, 0);
        return HR_OK;
    }
    if (strchr(name, '/')) return load_hub_kernel(m, name);
    return hr_error(HR_ERR_INVALID_ARG, "experts implementation '%s' is not known (grouped, eager, or a kernel "
                    "repository org/name[@vN]; transformers' grouped_mm and batched_mm are grouped)", name);
}

const char *hr_model_experts_implementation(const hr_model *m) {
    if (m->experts_impl) return m->experts_name;
    return m->experts_per_expert ? "eager" : "grouped";
}

static hr_status resolve_quantize(const hr_model_options *opts, hr_dtype *out) {
    *out = HR_DTYPE_COUNT;
    if (!opts || !opts->quantize) return HR_OK;
    hr_dtype dt;
    if (hr_dtype_parse(opts->quantize, &dt) != HR_OK || !hr_quantize_supported(dt))
        return hr_error(HR_ERR_INVALID_ARG, "quantize '%s' is not a type hubrt quantizes into (q8_0, q4_0, q4_1, "
                        "q5_0, q5_1, mxfp4, q4_k, q5_k, q6_k)", opts->quantize);
    if (opts->dequantize)
        return hr_error(HR_ERR_INVALID_ARG, "quantize '%s' and dequantize together: pick one", opts->quantize);
    *out = dt;
    return HR_OK;
}

static hr_status model_init(hr_model *m, const char *dir, const hr_model_options *opts) {
    if (opts && opts->experts_implementation)
        HR_TRY(hr_model_set_experts_implementation(m, opts->experts_implementation));
    HR_TRY(hr_model_config_load(dir, &m->cfg, &m->arch, &m->arch_cfg));
    HR_TRY(resolve_dtype(opts, &m->cfg, &m->dtype));
    m->dequantize = opts && opts->dequantize;
    HR_TRY(resolve_quantize(opts, &m->quantize));
    HR_TRY(hr_device_get(opts && opts->device ? opts->device : "cpu", &m->dev));
    HR_TRY(hr_model_rope_init(m));
    /* a rank of a split model maps its slices alone, not the files */
    bool split = opts && (opts->tp_size > 1 || opts->ep_size > 1);
    HR_TRY(split ? hr_checkpoint_open_ranged(dir, &m->ckpt) : hr_checkpoint_open(dir, &m->ckpt));
    hr_status s = hr_model_check_weights(m);
    if (s != HR_OK) return hr_error_context(s, "%s", dir);
    /* the checkpoint checked whole, then this rank's view of the config */
    HR_TRY(hr_tp_setup(m, opts ? opts->tp_size : 1, opts ? opts->ep_size : 1, opts ? opts->tp_plan : NULL));
    return hr_model_load_weights(m);
}

hr_status hr_model_load(const char *dir, const hr_model_options *opts, hr_model **out) {
    if (!dir || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_model_load: NULL argument");
    *out = NULL;
    hr_model *m = calloc(1, sizeof *m);
    if (!m) return hr_error(HR_ERR_OOM, "hr_model_load: out of memory");
    m->tp.size = 1;
    hr_status s = model_init(m, dir, opts);
    if (s != HR_OK) {
        hr_model_free(m);
        return s;
    }
    *out = m;
    return HR_OK;
}

void hr_model_free(hr_model *m) {
    if (!m) return;
    hr_scratch_free(&m->scratch);
    hr_jit_free(m->jit[0]);
    hr_jit_free(m->jit[1]);
    if (m->arch) hr_model_free_weights(m);
    hr_checkpoint_close(m->ckpt);
    for (int k = 0; k < HR_LAYER_KINDS; k++) free(m->inv_freq[k]);
    hr_model_config_free(&m->cfg);
    free(m->arch_cfg);
    free(m);
}

const char *hr_model_arch(const hr_model *m) { return m->cfg.arch; }
int hr_model_group_size(const hr_model *m) { return m->tp.size > 1 ? m->tp.size : 1; }
hr_dtype hr_model_dtype(const hr_model *m) { return m->dtype; }
int64_t hr_model_vocab_size(const hr_model *m) { return m->cfg.vocab_size; }
int64_t hr_model_max_positions(const hr_model *m) { return m->cfg.max_position_embeddings; }
int64_t hr_model_pad_id(const hr_model *m) { return m->cfg.gen.pad_token_id; }
const hr_generation_config *hr_model_generation_config(const hr_model *m) { return &m->cfg.gen; }
int hr_model_eos_ids(const hr_model *m, const int64_t **ids) {
    *ids = m->cfg.gen.eos_token_ids;
    return m->cfg.gen.n_eos;
}

hr_status hr_model_step(hr_model *m, const hr_step_args *a, hr_tensor **logits) {
    if (!m || !a || !a->ids || !a->pos || !a->cache || !logits)
        return hr_error(HR_ERR_INVALID_ARG, "hr_model_step: NULL argument");
    if (a->batch < 1 || a->seq < 1)
        return hr_error(HR_ERR_INVALID_ARG, "hr_model_step: batch %lld and seq %lld must be >= 1", (long long)a->batch,
                        (long long)a->seq);
    if (a->batch_invariant && a->compiled)
        return hr_error(HR_ERR_UNSUPPORTED, "hr_model_step: a compiled step is not batch-invariant; run it eagerly");
    if (!a->compiled)
        return hr_model_forward_host(m, a->ids, a->mask, a->pos, a->batch, a->seq, a->cache, true, false, logits,
                                     a->batch_invariant && a->seq == 1);
    hr_tensor_free(*logits);
    *logits = NULL;
    return hr_model_forward_compiled(m, a->ids, a->mask, a->pos, a->batch, a->seq, a->cache, true, logits);
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
    if (st == HR_OK) st = hr_model_forward_host(m, ids, mask, pos, b, s, cache, a->last_only, true, logits, false);
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
