/* GGUF tensors to hubrt tensors: ggml block formats dequantized row by row
 * (in parallel) into f32, bf16 or f16, dims reversed into row-major order,
 * with llama.cpp's q/k row permutation undone on request. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/half.h"
#include "core/tensor_impl.h"
#include "core/threadpool.h"
#include "io/gguf.h"

/* Q8_0 block: f16 scale d, 32 x int8 q; x = q * d. */
static void dq_q8_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 34, dst += 32) {
        float d = hr_f16_load(src);
        const int8_t *q = (const int8_t *)(src + 2);
        for (int i = 0; i < 32; i++) dst[i] = (float)q[i] * d;
    }
}

/* Q4_0 block: f16 d, 16 bytes; element i < 16 is the low nibble of byte i,
 * element 16 + i its high nibble; x = (q - 8) * d. */
static void dq_q4_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 18, dst += 32) {
        float d = hr_f16_load(src);
        const uint8_t *q = src + 2;
        for (int i = 0; i < 16; i++) {
            dst[i] = (float)((q[i] & 0x0F) - 8) * d;
            dst[i + 16] = (float)((q[i] >> 4) - 8) * d;
        }
    }
}

/* Q4_1 block: f16 d, f16 m, 16 bytes of nibbles as Q4_0; x = q * d + m. */
static void dq_q4_1(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, src += 20, dst += 32) {
        float d = hr_f16_load(src), m = hr_f16_load(src + 2);
        const uint8_t *q = src + 4;
        for (int i = 0; i < 16; i++) {
            dst[i] = (float)(q[i] & 0x0F) * d + m;
            dst[i + 16] = (float)(q[i] >> 4) * d + m;
        }
    }
}

/* Q5_0 block: f16 d, u32 qh (the fifth bits), 16 bytes of nibbles as
 * Q4_0; element i < 16 takes bit i of qh, element 16 + i bit 16 + i; x =
 * (q - 16) * d. Q5_1: f16 d, f16 m first; x = q * d + m. */
static void dq_q5(const uint8_t *src, float *dst, int64_t nb, bool one) {
    size_t head = one ? 4 : 2;
    for (int64_t b = 0; b < nb; b++, src += head + 20, dst += 32) {
        float d = hr_f16_load(src), m = one ? hr_f16_load(src + 2) : 0.0f;
        uint32_t qh;
        memcpy(&qh, src + head, 4);
        const uint8_t *q = src + head + 4;
        for (int i = 0; i < 16; i++) {
            int x0 = (q[i] & 0x0F) | (int)((qh >> i) << 4 & 0x10), x1 = (q[i] >> 4) | (int)((qh >> (i + 12)) & 0x10);
            dst[i] = one ? (float)x0 * d + m : (float)(x0 - 16) * d;
            dst[i + 16] = one ? (float)x1 * d + m : (float)(x1 - 16) * d;
        }
    }
}

void hr_gguf_dequant_row(ggml_type type, const uint8_t *src, float *dst, int64_t n) {
    switch (type) {
    case GGML_F32: memcpy(dst, src, sizeof(float) * (size_t)n); break;
    case GGML_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = hr_f16_load(src + 2 * i);
        break;
    case GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = hr_bf16_to_f32(h);
        }
        break;
    case GGML_Q8_0: dq_q8_0(src, dst, n / 32); break;
    case GGML_Q4_0: dq_q4_0(src, dst, n / 32); break;
    case GGML_Q4_1: dq_q4_1(src, dst, n / 32); break;
    case GGML_Q5_0: dq_q5(src, dst, n / 32, false); break;
    case GGML_Q5_1: dq_q5(src, dst, n / 32, true); break;
    case GGML_Q2_K: hr_gguf_dq_q2_k(src, dst, n / 256); break;
    case GGML_Q3_K: hr_gguf_dq_q3_k(src, dst, n / 256); break;
    case GGML_Q4_K: hr_gguf_dq_q4_k(src, dst, n / 256); break;
    case GGML_Q5_K: hr_gguf_dq_q5_k(src, dst, n / 256); break;
    case GGML_Q6_K: hr_gguf_dq_q6_k(src, dst, n / 256); break;
    case GGML_IQ4_NL: hr_gguf_dq_iq4_nl(src, dst, n / 32); break;
    case GGML_IQ4_XS: hr_gguf_dq_iq4_xs(src, dst, n / 256); break;
    }
}

typedef struct dq_job {
    const uint8_t *src;  /* the tensor's bytes */
    uint64_t row_bytes;
    int64_t ncol, nrow;
    ggml_type type;
    int64_t heads;       /* > 0: undo the q/k permutation */
    hr_dtype dt;
    uint8_t *dst;        /* [nrow, ncol] in dt */
    float *tmp;          /* [nth, ncol] */
} dq_job;

/* HF row r of head h is r = h*D + t*D/2 + j; llama.cpp stored it at
 * h*D + 2*j + t (pairs interleaved for its rope). */
static int64_t src_row(const dq_job *j, int64_t r) {
    if (j->heads <= 0) return r;
    int64_t D = j->nrow / j->heads, half = D / 2, h = r / D, w = r % D;
    return h * D + 2 * (w % half) + w / half;
}

static void dq_rows(void *ctx, int ith, int nth) {
    const dq_job *j = ctx;
    int64_t r0, r1;
    hr_split_range(j->nrow, ith, nth, &r0, &r1);
    size_t isz = hr_dtype_size(j->dt);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *s = j->src + (uint64_t)src_row(j, r) * j->row_bytes;
        uint8_t *d = j->dst + (size_t)r * (size_t)j->ncol * isz;
        if (j->dt == HR_F32) {
            hr_gguf_dequant_row(j->type, s, (float *)d, j->ncol);
            continue;
        }
        float *t = j->tmp + (size_t)ith * (size_t)j->ncol;
        hr_gguf_dequant_row(j->type, s, t, j->ncol);
        uint16_t *o = (uint16_t *)d;
        if (j->dt == HR_BF16)
            for (int64_t i = 0; i < j->ncol; i++) o[i] = hr_f32_to_bf16(t[i]);
        else
            for (int64_t i = 0; i < j->ncol; i++) o[i] = hr_f32_to_f16(t[i]);
    }
}

hr_status hr_gguf_dequant(const hr_gguf *g, const gguf_tensor *t, hr_dtype dt, int64_t perm_heads, hr_tensor **out) {
    *out = NULL;
    if (dt != HR_F32 && dt != HR_BF16 && dt != HR_F16)
        return hr_error(HR_ERR_DTYPE, "%s: tensor '%s': cannot dequantize to %s", g->label, t->name, hr_dtype_name(dt));
    int64_t shape[GGUF_MAX_DIMS], nrow = 1;
    for (int i = 0; i < t->ndim; i++) shape[i] = t->ne[t->ndim - 1 - i];
    for (int i = 1; i < t->ndim; i++) nrow *= t->ne[i];
    if (perm_heads > 0 && (t->ndim != 2 || nrow % (2 * perm_heads)))
        return hr_error(HR_ERR_SHAPE, "%s: tensor '%s': %lld rows do not split into %lld heads of pairs", g->label,
                        t->name, (long long)nrow, (long long)perm_heads);
    hr_tensor *o = NULL;
    HR_TRY(hr_tensor_empty(hr_device_cpu(), dt, t->ndim, shape, &o));
    dq_job j = {.src = g->buf + g->data_start + t->offset, .ncol = t->ne[0], .nrow = nrow, .type = t->type,
                .heads = perm_heads, .dt = dt, .dst = hr_tensor_ptr(o)};
    j.row_bytes = nrow ? t->nbytes / (uint64_t)nrow : 0;
    /* an empty tensor may still have a huge ne[0]: nothing to convert */
    if (nrow * t->ne[0] > 0) {
        int nth = hr_parallel_threads_for(nrow * t->ne[0], (int64_t)1 << 16);
        if (dt != HR_F32 && !(j.tmp = malloc(sizeof(float) * (size_t)nth * (size_t)t->ne[0]))) {
            hr_tensor_free(o);
            return hr_error(HR_ERR_OOM, "%s: tensor '%s': out of memory", g->label, t->name);
        }
        hr_parallel_run(dq_rows, &j, nth);
        free(j.tmp);
    }
    hr_tensor_set_name(o, t->name);
    *out = o;
    return HR_OK;
}
