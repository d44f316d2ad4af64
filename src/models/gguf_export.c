/* A model folder written as a GGUF file that llama.cpp loads
 * (hr_model_export_gguf; `hubrt quantize`): the metadata and tensor names
 * llama.cpp's converter (convert_hf_to_gguf.py) writes for the
 * architecture, the tokenizer as GGUF metadata (io/gguf_tok_write.c), and
 * each weight streamed from the checkpoint's map a chunk of rows at a time
 * (dequantized to f32 per row, then converted or quantized as ggml's
 * reference quantizer does), so that peak memory is a chunk, not a model.
 *
 * Types: matrices take the asked type; vectors (norms, biases) stay f32,
 * as the converter keeps them. A matrix whose rows do not divide into the
 * type's blocks takes llama-quantize's fallback (q4_k -> q5_0, q5_k ->
 * q5_1, q6_k -> q8_0; f16 when even 32 does not divide). With a block type
 * every matrix is quantized alike, llama-quantize's --pure: the Q4_K_M-
 * style mixes are its own policy.
 *
 * Architectures: those whose weight tables carry llama.cpp's names for
 * every tensor of the checkpoint (Llama, Mistral without a window, Qwen2,
 * Qwen3); q and k rows of "llama" files permuted for its interleaved rope
 * as the converter permutes them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dequant.h"
#include "core/error.h"
#include "core/tensor_impl.h"
#include "core/threadpool.h"
#include "io/gguf_write.h"
#include "io/st_internal.h"
#include "models/model_impl.h"

/* Rows converted per write: a few MB of output at most. */
#define CHUNK_BYTES ((size_t)4 << 20)

typedef struct ex_tensor {
    const hr_checkpoint *ck;
    char hf[160];
    int64_t rows, cols, perm_heads;
    hr_dtype out;
    const float *values; /* rope_freqs: computed, not read */
} ex_tensor;

/* The HF row stored at row s of a q/k weight of `heads` heads: the
 * converter interleaves each head's rotate-half pairs (the inverse of
 * hr_gguf_src_row). */
static int64_t hf_row(int64_t s, int64_t rows, int64_t heads) {
    int64_t d = rows / heads, h = s / d, w = s % d;
    return h * d + (w % 2) * (d / 2) + w / 2;
}

typedef struct chunk_job {
    const ex_tensor *t;
    const uint8_t *src;
    hr_dtype src_dt;
    size_t src_row, out_row;
    int64_t r0, n;
    uint8_t *dst;
    float *tmp; /* [threads][cols] */
} chunk_job;

static void convert_rows(void *arg, int ith, int nth) {
    const chunk_job *j = arg;
    const ex_tensor *t = j->t;
    int64_t b, e;
    hr_split_range(j->n, ith, nth, &b, &e);
    float *f = j->tmp + (size_t)ith * (size_t)t->cols;
    for (int64_t i = b; i < e; i++) {
        int64_t r = j->r0 + i, from = t->perm_heads ? hf_row(r, t->rows, t->perm_heads) : r;
        hr_dequant_row(j->src_dt, j->src + (size_t)from * j->src_row, f, t->cols);
        hr_encode_row(t->out, f, j->dst + (size_t)i * j->out_row, t->cols);
    }
}

static hr_status emit(void *ctx, hr_gguf_sink *sink) {
    ex_tensor *t = ctx;
    if (t->values) return hr_gguf_sink_put(sink, t->values, sizeof(float) * (size_t)t->cols);
    hr_tensor *v = NULL;
    HR_TRY(hr_checkpoint_tensor(t->ck, t->hf, &v));
    chunk_job j = {.t = t, .src = hr_tensor_ptr(v), .src_dt = hr_tensor_dtype(v)};
    j.src_row = (size_t)t->cols * hr_dtype_size(j.src_dt);
    j.out_row = hr_dtype_nbytes(t->out, t->cols);
    int64_t per = (int64_t)(CHUNK_BYTES / (j.out_row ? j.out_row : 1));
    per = per < 1 ? 1 : per > t->rows ? t->rows : per;
    int nth = hr_parallel_threads_for(per * t->cols, HR_GRAIN_ROWS);
    j.dst = malloc((size_t)per * j.out_row);
    j.tmp = malloc(sizeof(float) * (size_t)nth * (size_t)t->cols);
    hr_status s = j.dst && j.tmp ? HR_OK : hr_error(HR_ERR_OOM, "%s: out of memory", hr_gguf_sink_label(sink));
    for (int64_t r = 0; r < t->rows && s == HR_OK; r += per) {
        j.r0 = r;
        j.n = t->rows - r < per ? t->rows - r : per;
        hr_parallel_run(convert_rows, &j, nth);
        s = hr_gguf_sink_put(sink, j.dst, (size_t)j.n * j.out_row);
    }
    free(j.dst);
    free(j.tmp);
    hr_tensor_free(v);
    hr_checkpoint_drop_tensor(t->ck, t->hf); /* its pages are done with */
    return s;
}

/* llama-quantize's type for a matrix whose rows do not divide into `want`'s
 * blocks. */
static hr_dtype fit_type(hr_dtype want, int64_t cols) {
    if (cols % hr_dtype_block(want) == 0) return want;
    hr_dtype alt = want == HR_Q4_K ? HR_Q5_0 : want == HR_Q5_K ? HR_Q5_1 : want == HR_Q6_K ? HR_Q8_0 : HR_F16;
    return cols % hr_dtype_block(alt) == 0 ? alt : HR_F16;
}

/* llama.cpp's general.file_type for a file of `dt` matrices (llama_ftype:
 * the k-quants as their _S mixes, which --pure files are labelled). */
static uint32_t file_type(hr_dtype dt) {
    switch (dt) {
    case HR_F32: return 0;
    case HR_F16: return 1;
    case HR_Q4_0: return 2;
    case HR_Q4_1: return 3;
    case HR_Q8_0: return 7;
    case HR_Q5_0: return 8;
    case HR_Q5_1: return 9;
    case HR_Q4_K: return 14;
    case HR_Q5_K: return 16;
    case HR_Q6_K: return 18;
    case HR_BF16: return 32;
    case HR_MXFP4: return 38; /* LLAMA_FTYPE_MOSTLY_MXFP4_MOE, the only MXFP4 label llama.cpp has */
    default: return 0;
    }
}

typedef struct exporter {
    const char *dir, *out;
    hr_gguf_writer *w;
    hr_checkpoint *ck;
    hr_model_config cfg;
    const hr_arch *arch;
    void *arch_cfg;
    hr_dtype type;
    ex_tensor *t; /* [cap] */
    size_t n_t, cap;
    bool *used;   /* [checkpoint count]: tensors written */
    float *rope_freqs;
} exporter;

static hr_status add_tensor(exporter *e, const char *gguf, const char *hf, int64_t perm_heads) {
    hr_tensor_info info;
    HR_TRY(hr_checkpoint_info(e->ck, hf, &info));
    if (info.ndim < 1 || info.ndim > 2)
        return hr_error(HR_ERR_SHAPE, "%s: tensor '%s' has %d dims; GGUF weights of this kind have 1 or 2", e->dir, hf,
                        info.ndim);
    if (info.dtype != HR_F32 && info.dtype != HR_BF16 && info.dtype != HR_F16)
        return hr_error(HR_ERR_DTYPE, "%s: tensor '%s' is %s; hubrt writes weights stored as f32, bf16 or f16", e->dir,
                        hf, hr_dtype_name(info.dtype));
    ex_tensor *t = &e->t[e->n_t++];
    *t = (ex_tensor){.ck = e->ck, .perm_heads = perm_heads};
    snprintf(t->hf, sizeof t->hf, "%s", hf);
    t->cols = info.shape[info.ndim - 1];
    t->rows = info.ndim == 2 ? info.shape[0] : 1;
    if (info.ndim == 1 && perm_heads) { /* a q/k bias: its elements move as rows would */
        t->rows = t->cols;
        t->cols = 1;
    }
    if (perm_heads && t->rows % (2 * perm_heads))
        return hr_error(HR_ERR_SHAPE, "%s: tensor '%s' has %lld rows, not pairs per each of %lld heads", e->dir, hf,
                        (long long)t->rows, (long long)perm_heads);
    t->out = info.ndim == 1 ? HR_F32 : fit_type(e->type, t->cols);
    for (size_t i = 0; i < hr_checkpoint_count(e->ck); i++)
        if (!strcmp(hr_checkpoint_name(e->ck, i), hf)) e->used[i] = true;
    int64_t ne[2] = {info.shape[info.ndim - 1], t->rows};
    return hr_gguf_w_tensor(e->w, gguf, info.ndim, ne, (ggml_type)hr_gguf_dtype_type(t->out), emit, t);
}

/* llama.cpp's rope_freqs tensor, the converter's computation of a llama3
 * rope_scaling: one divisor per rotary pair (1 for short wavelengths, the
 * factor for long ones, a blend between). */
static hr_status llama3_freqs(exporter *e, const hr_rope_config *r) {
    int64_t half = r->rotary_dim / 2;
    if (!(e->rope_freqs = malloc(sizeof(float) * (size_t)half))) return hr_error(HR_ERR_OOM, "out of memory");
    float old = (float)r->original_max_position_embeddings, lo = (float)r->low_freq_factor,
          hi = (float)r->high_freq_factor, factor = (float)r->factor;
    float lo_wave = old / lo, hi_wave = old / hi;
    for (int64_t i = 0; i < half; i++) {
        float freq = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)r->rotary_dim);
        float wave = 6.2831853071795865f / freq; /* 2 pi */
        if (wave < hi_wave) e->rope_freqs[i] = 1.0f;
        else if (wave > lo_wave) e->rope_freqs[i] = factor;
        else {
            float smooth = (old / wave - lo) / (hi - lo);
            e->rope_freqs[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
        }
    }
    ex_tensor *t = &e->t[e->n_t++];
    *t = (ex_tensor){.ck = e->ck, .rows = 1, .cols = half, .out = HR_F32, .values = e->rope_freqs};
    return hr_gguf_w_tensor(e->w, "rope_freqs.weight", 1, &half, GGML_F32, emit, t);
}

static hr_status arch_key(exporter *e, const char *suffix, char *buf, size_t cap) {
    if ((size_t)snprintf(buf, cap, "%s.%s", e->arch->gguf_arch, suffix) >= cap)
        return hr_error(HR_ERR_INTERNAL, "metadata key too long");
    return HR_OK;
}

static hr_status put_u32(exporter *e, const char *suffix, int64_t v) {
    char k[96];
    HR_TRY(arch_key(e, suffix, k, sizeof k));
    if (v < 0 || v > UINT32_MAX) return hr_error(HR_ERR_FORMAT, "%s: %s = %lld does not fit GGUF's u32", e->dir, k, (long long)v);
    return hr_gguf_w_u32(e->w, k, (uint32_t)v);
}

static hr_status put_f32(exporter *e, const char *suffix, double v) {
    char k[96];
    HR_TRY(arch_key(e, suffix, k, sizeof k));
    return hr_gguf_w_f32(e->w, k, (float)v);
}

static hr_status rope_meta(exporter *e) {
    const hr_rope_config *r = &e->cfg.rope[HR_LAYER_FULL];
    HR_TRY(put_f32(e, "rope.freq_base", r->theta));
    HR_TRY(put_u32(e, "rope.dimension_count", r->rotary_dim));
    char k[96];
    switch (r->type) {
    case HR_ROPE_DEFAULT: return HR_OK;
    case HR_ROPE_LINEAR:
        HR_TRY(arch_key(e, "rope.scaling.type", k, sizeof k));
        HR_TRY(hr_gguf_w_str(e->w, k, "linear"));
        return put_f32(e, "rope.scaling.factor", r->factor);
    case HR_ROPE_YARN:
        if (r->mscale || r->mscale_all_dim || r->no_truncate)
            return hr_error(HR_ERR_UNSUPPORTED, "%s: a yarn rope with mscale or truncate: false has no llama.cpp keys",
                            e->dir);
        HR_TRY(arch_key(e, "rope.scaling.type", k, sizeof k));
        HR_TRY(hr_gguf_w_str(e->w, k, "yarn"));
        HR_TRY(put_f32(e, "rope.scaling.factor", r->factor));
        HR_TRY(put_u32(e, "rope.scaling.original_context_length", r->original_max_position_embeddings));
        if (r->attention_factor) HR_TRY(put_f32(e, "rope.scaling.yarn_attn_factor", r->attention_factor));
        if (r->beta_fast != 32.0) HR_TRY(put_f32(e, "rope.scaling.yarn_beta_fast", r->beta_fast));
        if (r->beta_slow != 1.0) HR_TRY(put_f32(e, "rope.scaling.yarn_beta_slow", r->beta_slow));
        return HR_OK;
    case HR_ROPE_LLAMA3:
        if (strcmp(e->arch->gguf_arch, "llama"))
            return hr_error(HR_ERR_UNSUPPORTED, "%s: llama3 rope scaling is written for llama files only", e->dir);
        return HR_OK; /* a rope_freqs tensor (tensors) */
    default:
        return hr_error(HR_ERR_UNSUPPORTED, "%s: rope_type %d (dynamic, longrope, ...) has no llama.cpp keys here",
                        e->dir, (int)r->type);
    }
}

static hr_status metadata(exporter *e) {
    const hr_model_config *c = &e->cfg;
    const char *base = strrchr(e->dir, '/');
    base = base && base[1] ? base + 1 : e->dir;
    HR_TRY(hr_gguf_w_str(e->w, "general.architecture", e->arch->gguf_arch));
    HR_TRY(hr_gguf_w_str(e->w, "general.type", "model"));
    HR_TRY(hr_gguf_w_str(e->w, "general.name", base));
    HR_TRY(put_u32(e, "block_count", c->n_layers));
    HR_TRY(put_u32(e, "context_length", c->max_position_embeddings));
    HR_TRY(put_u32(e, "embedding_length", c->hidden_size));
    HR_TRY(put_u32(e, "feed_forward_length", c->intermediate_size));
    HR_TRY(put_u32(e, "attention.head_count", c->n_heads));
    HR_TRY(put_u32(e, "attention.head_count_kv", c->n_kv_heads));
    HR_TRY(put_f32(e, "attention.layer_norm_rms_epsilon", c->rms_norm_eps));
    HR_TRY(put_u32(e, "attention.key_length", c->head_dim));
    HR_TRY(put_u32(e, "attention.value_length", c->head_dim));
    HR_TRY(hr_gguf_w_u32(e->w, "general.file_type", file_type(e->type)));
    HR_TRY(put_u32(e, "vocab_size", c->vocab_size));
    HR_TRY(rope_meta(e));
    HR_TRY(hr_gguf_w_u32(e->w, "general.quantization_version", 2));
    return hr_gguf_w_tokenizer(e->w, e->dir, c->vocab_size);
}

/* What this architecture and config cannot be written as, by name. */
static hr_status check_model(exporter *e) {
    const char *name = e->arch->name;
    if (!e->arch->gguf_arch || e->arch->model_weights || e->cfg.n_experts ||
        (strcmp(e->arch->gguf_arch, "llama") && strcmp(e->arch->gguf_arch, "qwen2") && strcmp(e->arch->gguf_arch, "qwen3")))
        return hr_error(HR_ERR_UNSUPPORTED, "%s: %s: hubrt writes GGUF files of Llama, Mistral, Qwen2 and Qwen3 models",
                        e->dir, name);
    if (e->cfg.sliding_window)
        return hr_error(HR_ERR_UNSUPPORTED, "%s: %s with a sliding_window: llama.cpp's %s files have no window", e->dir,
                        name, e->arch->gguf_arch);
    if (e->cfg.from_gguf)
        return hr_error(HR_ERR_UNSUPPORTED, "%s: already a GGUF file; hubrt quantizes safetensors checkpoints", e->dir);
    return HR_OK;
}

static hr_status tensors(exporter *e) {
    const hr_model_config *c = &e->cfg;
    size_t n_ck = hr_checkpoint_count(e->ck);
    e->cap = n_ck + 1;
    e->t = calloc(e->cap, sizeof *e->t);
    e->used = calloc(n_ck ? n_ck : 1, sizeof *e->used);
    if (!e->t || !e->used) return hr_error(HR_ERR_OOM, "out of memory");
    if (c->rope[HR_LAYER_FULL].type == HR_ROPE_LLAMA3) HR_TRY(llama3_freqs(e, &c->rope[HR_LAYER_FULL]));
    HR_TRY(add_tensor(e, "token_embd.weight", "model.embed_tokens.weight", 0));
    char hf[160], gg[160];
    for (int64_t il = 0; il < c->n_layers; il++)
        for (int i = 0; i < e->arch->n_layer_weights; i++) {
            const hr_weight_spec *w = &e->arch->layer_weights[i];
            snprintf(hf, sizeof hf, "model.layers.%lld.%s", (long long)il, w->hf);
            if (!hr_checkpoint_has(e->ck, hf)) continue; /* absent optional weights; the load checks the rest */
            if (!w->gguf)
                return hr_error(HR_ERR_UNSUPPORTED, "%s: tensor '%s' has no place in llama.cpp's %s files", e->dir, hf,
                                e->arch->gguf_arch);
            snprintf(gg, sizeof gg, "blk.%lld.%s", (long long)il, w->gguf);
            int64_t perm = w->gguf_rows == HR_GGUF_ROWS_PERM_HEADS      ? c->n_heads
                           : w->gguf_rows == HR_GGUF_ROWS_PERM_KV_HEADS ? c->n_kv_heads
                                                                        : 0;
            HR_TRY(add_tensor(e, gg, hf, perm));
        }
    HR_TRY(add_tensor(e, "output_norm.weight", "model.norm.weight", 0));
    bool head = hr_checkpoint_has(e->ck, "lm_head.weight");
    if (head && !c->tie_word_embeddings) HR_TRY(add_tensor(e, "output.weight", "lm_head.weight", 0));
    for (size_t i = 0; i < n_ck; i++) {
        const char *name = hr_checkpoint_name(e->ck, i);
        if (e->used[i] || (head && c->tie_word_embeddings && !strcmp(name, "lm_head.weight")) ||
            strstr(name, "rotary_emb.inv_freq"))
            continue;
        return hr_error(HR_ERR_UNSUPPORTED, "%s: tensor '%s' is not one hubrt knows a GGUF name for (%s)", e->dir, name,
                        e->arch->name);
    }
    return HR_OK;
}

hr_status hr_model_export_gguf(const char *dir, const char *out, const char *type) {
    if (!dir || !out || !type) return hr_error(HR_ERR_INVALID_ARG, "hr_model_export_gguf: NULL argument");
    exporter e = {.dir = dir, .out = out};
    if (hr_dtype_parse(type, &e.type) != HR_OK ||
        !(e.type == HR_F32 || e.type == HR_F16 || e.type == HR_BF16 || hr_quantize_supported(e.type)))
        return hr_error(HR_ERR_INVALID_ARG, "type '%s': hubrt writes GGUF files of f32, f16, bf16, q8_0, q4_0, q4_1, "
                        "q5_0, q5_1, mxfp4, q4_k, q5_k or q6_k", type);
    hr_status s = hr_model_config_load(dir, &e.cfg, &e.arch, &e.arch_cfg);
    if (s == HR_OK) s = check_model(&e);
    if (s == HR_OK) s = hr_checkpoint_open(dir, &e.ck);
    if (s == HR_OK) s = hr_gguf_writer_new(out, &e.w);
    if (s == HR_OK) s = metadata(&e);
    if (s == HR_OK) s = tensors(&e);
    if (s == HR_OK) s = hr_gguf_w_write(e.w, out);
    hr_gguf_writer_free(e.w);
    hr_checkpoint_close(e.ck);
    free(e.t);
    free(e.used);
    free(e.rope_freqs);
    hr_model_config_free(&e.cfg);
    free(e.arch_cfg);
    return s;
}
