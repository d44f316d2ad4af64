/* GGUF tensors to hubrt tensors: ggml block formats dequantized row by row
 * (in parallel, core/dequant.c) into f32, bf16 or f16, dims reversed into
 * row-major order, with llama.cpp's q/k row permutation undone on request. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/tensor_impl.h"
#include "core/threadpool.h"
#include "core/dequant.h"
#include "io/gguf.h"

void hr_gguf_dequant_row(ggml_type type, const uint8_t *src, float *dst, int64_t n) {
    hr_dequant_row(hr_gguf_type_dtype(type), src, dst, n);
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

int64_t hr_gguf_src_row(int64_t nrow, int64_t heads, int64_t r) {
    if (heads <= 0) return r;
    int64_t D = nrow / heads, half = D / 2, h = r / D, w = r % D;
    return h * D + 2 * (w % half) + w / half;
}

static int64_t src_row(const dq_job *j, int64_t r) { return hr_gguf_src_row(j->nrow, j->heads, r); }

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
        hr_encode_row(j->dt, t, d, j->ncol);
    }
}

hr_status hr_gguf_dequant(const hr_gguf *g, const gguf_tensor *t, hr_dtype dt, int64_t perm_heads, hr_tensor **out) {
    *out = NULL;
    if (dt != HR_F32 && dt != HR_BF16 && dt != HR_F16)
        return hr_error(HR_ERR_DTYPE, "%s: tensor '%s': cannot dequantize to %s", g->label, t->name, hr_dtype_name(dt));
    int64_t shape[GGUF_MAX_DIMS], nrow = 1, ncol = t->ne[0];
    for (int i = 0; i < t->ndim; i++) shape[i] = t->ne[t->ndim - 1 - i];
    for (int i = 1; i < t->ndim; i++) nrow *= t->ne[i];
    /* a q/k bias: the converter moved its elements as it moved the weight's rows */
    bool vector = t->ndim == 1 && perm_heads > 0 && hr_dtype_block(hr_gguf_stored_dtype(t)) == 1;
    if (vector) nrow = ncol, ncol = 1;
    if (perm_heads > 0 && ((t->ndim != 2 && !vector) || nrow % (2 * perm_heads)))
        return hr_error(HR_ERR_SHAPE, "%s: tensor '%s': %lld rows do not split into %lld heads of pairs", g->label,
                        t->name, (long long)nrow, (long long)perm_heads);
    hr_tensor *o = NULL;
    HR_TRY(hr_tensor_empty(hr_device_cpu(), dt, t->ndim, shape, &o));
    dq_job j = {.src = g->buf + g->data_start + t->offset, .ncol = ncol, .nrow = nrow, .type = t->type,
                .heads = perm_heads, .dt = dt, .dst = hr_tensor_ptr(o)};
    j.row_bytes = nrow ? t->nbytes / (uint64_t)nrow : 0;
    /* an empty tensor may still have a huge ne[0]: nothing to convert */
    if (nrow * ncol > 0) {
        int nth = hr_parallel_threads_for(nrow * ncol, (int64_t)1 << 16);
        if (dt != HR_F32 && !(j.tmp = malloc(sizeof(float) * (size_t)nth * (size_t)ncol))) {
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
