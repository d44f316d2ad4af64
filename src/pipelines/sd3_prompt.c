/* SD3's prompt encoding (StableDiffusion3Pipeline.encode_prompt): the two
 * CLIP encoders' penultimate hidden states side by side, zero-padded to
 * T5's width, then T5's states after them (or max_sequence_length rows
 * of zeros without text_encoder_3, as diffusers 0.42); the pooled embedding is the two CLIP text_embeds side
 * by side. Each tokenizer pads to its length (CLIP 77, T5
 * max_sequence_length) and truncates the text so its special tokens stay.
 * The encoders are loaded for the call and freed before it returns, so
 * they never share memory with the denoising transformer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/path.h"
#include "hubrt/diffusion.h"
#include "hubrt/ops.h"
#include "hubrt/tokenizer.h"
#include "pipelines/sd3_prompt.h"

#define CLIP_LEN 77

/* ids of text padded to `len` with pad, its content truncated so the
 * special tokens the tokenizer wraps it in are kept (transformers'
 * padding="max_length", truncation=True). */
static hr_status tokenize(const hr_tokenizer *tok, const char *what, const char *text, int64_t len, int64_t *out) {
    int32_t *full = NULL, *content = NULL, *empty = NULL;
    size_t nf = 0, nc = 0, ne = 0;
    hr_status s = hr_tokenizer_encode(tok, text, strlen(text), true, &full, &nf);
    if (s == HR_OK) s = hr_tokenizer_encode(tok, text, strlen(text), false, &content, &nc);
    if (s == HR_OK) s = hr_tokenizer_encode(tok, "", 0, true, &empty, &ne);
    /* full = empty[:p] + content + empty[p:] for the p the template puts the text at */
    size_t p = ne + 1;
    for (size_t q = 0; s == HR_OK && q <= ne && p > ne; q++) {
        bool ok = nf == nc + ne && (q == 0 || !memcmp(full, empty, q * sizeof *full)) &&
                  (nc == 0 || !memcmp(full + q, content, nc * sizeof *full)) &&
                  (ne == q || !memcmp(full + q + nc, empty + q, (ne - q) * sizeof *full));
        if (ok) p = q;
    }
    if (s == HR_OK && p > ne)
        s = hr_error(HR_ERR_UNSUPPORTED, "%s: its special tokens do not wrap the text in one place", what);
    if (s == HR_OK && (int64_t)ne >= len)
        s = hr_error(HR_ERR_INVALID_ARG, "%s: %zu special tokens leave no room in %lld", what, ne, (long long)len);
    int32_t pad = hr_tokenizer_pad_id(tok);
    if (s == HR_OK && pad < 0) s = hr_error(HR_ERR_FORMAT, "%s: no pad token to pad the prompt with", what);
    if (s == HR_OK) {
        int64_t keep = (int64_t)nc < len - (int64_t)ne ? (int64_t)nc : len - (int64_t)ne, n = 0;
        for (size_t i = 0; i < p; i++) out[n++] = empty[i];
        for (int64_t i = 0; i < keep; i++) out[n++] = content[i];
        for (size_t i = p; i < ne; i++) out[n++] = empty[i];
        while (n < len) out[n++] = pad;
    }
    hr_tokenizer_free_array(full);
    hr_tokenizer_free_array(content);
    hr_tokenizer_free_array(empty);
    return s;
}

typedef struct encoders {
    hr_tokenizer *tok[3];
    hr_clip_text *clip[2];
    hr_t5_encoder *t5; /* NULL without text_encoder_3 */
    int64_t t5_len;
} encoders;

static void encoders_free(encoders *e) {
    for (int i = 0; i < 3; i++) hr_tokenizer_free(e->tok[i]);
    hr_clip_text_free(e->clip[0]);
    hr_clip_text_free(e->clip[1]);
    hr_t5_encoder_free(e->t5);
    memset(e, 0, sizeof *e);
}

static hr_status encoders_load(const char *dir, const hr_component_options *opts, bool skip_t5, encoders *e) {
    static const char *const toks[3] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    static const char *const encs[3] = {"text_encoder", "text_encoder_2", "text_encoder_3"};
    char path[1200];
    hr_component_options eo = opts ? *opts : (hr_component_options){0};
    eo.compile = false;
    hr_status s = HR_OK;
    for (int i = 0; s == HR_OK && i < (skip_t5 ? 2 : 3); i++) {
        snprintf(path, sizeof path, "%s/%s/config.json", dir, encs[i]);
        bool has = hr_path_is_file(path);
        if (!has && i < 2) {
            s = hr_error(HR_ERR_NOT_FOUND, "%s: missing (a text prompt needs SD3's CLIP encoders; pass prompt "
                         "embeddings otherwise)", path);
            break;
        }
        if (!has) continue; /* no T5: zeros in its place, as diffusers */
        snprintf(path, sizeof path, "%s/%s", dir, toks[i]);
        s = hr_tokenizer_load(path, &e->tok[i]);
        snprintf(path, sizeof path, "%s/%s", dir, encs[i]);
        if (s == HR_OK && i < 2) s = hr_clip_text_load(path, &eo, &e->clip[i]);
        if (s == HR_OK && i == 2) s = hr_t5_encoder_load(path, &eo, &e->t5);
    }
    if (s == HR_OK && hr_clip_text_projection_dim(e->clip[0]) * hr_clip_text_projection_dim(e->clip[1]) == 0)
        s = hr_error(HR_ERR_FORMAT, "%s: SD3's CLIP encoders must be CLIPTextModelWithProjection (pooled embeddings)",
                     dir);
    if (s != HR_OK) encoders_free(e);
    return s;
}

/* ids [1, len] of text on the CPU */
static hr_status ids_tensor(const hr_tokenizer *tok, const char *what, const char *text, int64_t len, hr_tensor **out) {
    int64_t *ids = malloc((size_t)len * sizeof *ids);
    if (!ids) return hr_error(HR_ERR_OOM, "%s: ids", what);
    hr_status s = tokenize(tok, what, text, len, ids);
    if (s == HR_OK) s = hr_tensor_from_host(hr_device_cpu(), HR_I64, 2, (int64_t[]){1, len}, ids, (size_t)len * 8, out);
    free(ids);
    return s;
}

/* Replaces *t with a copy on the CPU when it lives elsewhere. */
static hr_status to_host(hr_tensor **t) {
    if (hr_tensor_device(*t) == hr_device_cpu()) return HR_OK;
    hr_tensor *h = NULL;
    HR_TRY(hr_tensor_to(*t, hr_device_cpu(), &h));
    hr_tensor_free(*t);
    *t = h;
    return HR_OK;
}

/* One prompt triple -> embeds [1, 77 + t5_len, joint], pooled [1, pooled]. */
static hr_status encode_one(const encoders *e, const char *const prompts[3], int64_t joint, hr_dtype dt,
                            hr_tensor **embeds, hr_tensor **pooled) {
    hr_tensor *ids[3] = {0}, *hid[2] = {0}, *pool[2] = {0}, *h2 = NULL, *clip = NULL, *padded = NULL, *t5 = NULL,
              *zeros = NULL, *e32 = NULL, *p32 = NULL;
    hr_status s = HR_OK;
    static const char *const names[3] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    for (int i = 0; s == HR_OK && i < 2; i++) {
        s = ids_tensor(e->tok[i], names[i], prompts[i], CLIP_LEN, &ids[i]);
        if (s == HR_OK) s = hr_clip_text_forward(e->clip[i], ids[i], -2, &hid[i], &pool[i]);
        if (s == HR_OK) s = to_host(&hid[i]); /* composed on the CPU, whatever device encoded them */
        if (s == HR_OK) s = to_host(&pool[i]);
    }
    /* CLIP-G's states in CLIP-L's dtype (diffusers casts to text_encoder's) */
    if (s == HR_OK) s = hr_cast(hid[1], hr_tensor_dtype(hid[0]), &h2);
    if (s == HR_OK) s = hr_cat((const hr_tensor *[]){hid[0], h2}, 2, 2, &clip);
    int64_t width = s == HR_OK ? hr_tensor_shape(clip)[2] : 0;
    if (s == HR_OK && width > joint)
        s = hr_error(HR_ERR_FORMAT, "sd3: the CLIP states' width %lld exceeds the transformer's joint_attention_dim "
                     "%lld", (long long)width, (long long)joint);
    if (s == HR_OK && e->t5) {
        s = ids_tensor(e->tok[2], names[2], prompts[2], e->t5_len, &ids[2]);
        if (s == HR_OK) s = hr_t5_encoder_forward(e->t5, ids[2], &t5);
        if (s == HR_OK) s = to_host(&t5);
        if (s == HR_OK && hr_tensor_shape(t5)[2] != joint)
            s = hr_error(HR_ERR_FORMAT, "sd3: T5's d_model %lld differs from the transformer's joint_attention_dim %lld",
                         (long long)hr_tensor_shape(t5)[2], (long long)joint);
    } else if (s == HR_OK) {
        s = hr_tensor_zeros(hr_device_cpu(), HR_F32, 3, (int64_t[]){1, e->t5_len, joint}, &t5);
    }
    hr_tensor *c32 = NULL, *t32 = NULL;
    if (s == HR_OK) s = hr_cast(clip, HR_F32, &c32);
    if (s == HR_OK && width < joint) s = hr_tensor_zeros(hr_device_cpu(), HR_F32, 3,
                                                         (int64_t[]){1, CLIP_LEN, joint - width}, &zeros);
    if (s == HR_OK) s = zeros ? hr_cat((const hr_tensor *[]){c32, zeros}, 2, 2, &padded) : hr_tensor_alias(c32, &padded);
    if (s == HR_OK) s = hr_cast(t5, HR_F32, &t32);
    if (s == HR_OK) s = hr_cat((const hr_tensor *[]){padded, t32}, 2, 1, &e32);
    if (s == HR_OK) {
        hr_tensor *a = NULL, *b = NULL;
        s = hr_cast(pool[0], HR_F32, &a);
        if (s == HR_OK) s = hr_cast(pool[1], HR_F32, &b);
        if (s == HR_OK) s = hr_cat((const hr_tensor *[]){a, b}, 2, 1, &p32);
        hr_tensor_free(a);
        hr_tensor_free(b);
    }
    if (s == HR_OK) s = hr_cast(e32, dt, embeds);
    if (s == HR_OK) s = hr_cast(p32, dt, pooled);
    for (int i = 0; i < 3; i++) hr_tensor_free(ids[i]);
    for (int i = 0; i < 2; i++) hr_tensor_free(hid[i]), hr_tensor_free(pool[i]);
    hr_tensor_free(h2);
    hr_tensor_free(clip);
    hr_tensor_free(c32);
    hr_tensor_free(zeros);
    hr_tensor_free(padded);
    hr_tensor_free(t5);
    hr_tensor_free(t32);
    hr_tensor_free(e32);
    hr_tensor_free(p32);
    return s;
}

hr_status hr_sd3_encode_prompts(const char *dir, const hr_component_options *opts, const hr_sd3_prompts *p,
                                int64_t joint, hr_dtype dt, hr_tensor *out[4]) {
    memset(out, 0, 4 * sizeof *out);
    encoders e = {0};
    HR_TRY(encoders_load(dir, opts, p->skip_t5, &e));
    e.t5_len = p->max_sequence_length ? p->max_sequence_length : 256;
    const char *pos[3] = {p->prompt, p->prompt_2 ? p->prompt_2 : p->prompt, p->prompt_3 ? p->prompt_3 : p->prompt};
    const char *neg0 = p->negative_prompt ? p->negative_prompt : "";
    const char *neg[3] = {neg0, p->negative_prompt_2 ? p->negative_prompt_2 : neg0,
                          p->negative_prompt_3 ? p->negative_prompt_3 : neg0};
    hr_status s = encode_one(&e, pos, joint, dt, &out[0], &out[1]);
    if (s == HR_OK && p->negative) s = encode_one(&e, neg, joint, dt, &out[2], &out[3]);
    encoders_free(&e);
    if (s != HR_OK)
        for (int i = 0; i < 4; i++) hr_tensor_free(out[i]), out[i] = NULL;
    return s;
}
