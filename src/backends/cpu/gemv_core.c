/* The GEMV route: a few rows of A (decode: x) against a K-contiguous B
 * (x @ W^T), streaming B from memory once while every row reuses it. */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"

#define GEMV_CHUNK 64

static inline const char *gemv_elem(const hr_gemm_mat *x, int64_t off, int64_t i, int64_t j) {
    return x->base + (off + i * x->rs + j * x->cs) * (x->dt == HR_F32 ? 4 : 2);
}

typedef struct gemv_ctx {
    const hr_gemm *g;
    hr_gemv_fn fn;
    const char *x; /* [rows][k] f32, or bf16 for the avx512 kernel */
    size_t xsz;    /* its element size */
    int rows;
    int64_t row_off_c[HR_GEMV_ROUTE_ROWS]; /* element offset of each C row */
    int64_t blocks; /* of 4 output columns */
} gemv_ctx;

static void gemv_worker(void *arg, int ith, int nth) {
    gemv_ctx *ctx = arg;
    const hr_gemm *g = ctx->g;
    int64_t begin, end;
    hr_split_range(ctx->blocks, ith, nth, &begin, &end);
    float y[HR_GEMV_ROUTE_ROWS][GEMV_CHUNK], bias[GEMV_CHUNK];
    size_t wsz = hr_dtype_size(g->b.dt);
    for (int64_t j0 = begin * 4; j0 < end * 4 && j0 < g->n; j0 += GEMV_CHUNK) {
        int64_t jend = j0 + GEMV_CHUNK < end * 4 ? j0 + GEMV_CHUNK : end * 4;
        if (jend > g->n) jend = g->n;
        for (int64_t j = j0; j < jend; j += 4) {
            int nw = jend - j < 4 ? (int)(jend - j) : 4;
            const char *w = g->b.base + j * g->b.cs * (int64_t)wsz;
            for (int r = 0; r < ctx->rows; r += HR_GEMV_MAX_ROWS)
                ctx->fn(g->k, ctx->rows - r < HR_GEMV_MAX_ROWS ? ctx->rows - r : HR_GEMV_MAX_ROWS,
                        ctx->x + (size_t)r * (size_t)g->k * ctx->xsz, w, g->b.dt, g->b.cs, nw, &y[r][j - j0],
                        GEMV_CHUNK);
        }
        int64_t nc = jend - j0;
        if (g->bias) hr_load_f32(bias, g->bias + j0 * g->bias_s * (int64_t)hr_dtype_size(g->bias_dt),
                                 g->bias_dt, nc, g->bias_s);
        for (int r = 0; r < ctx->rows; r++) {
            if (g->bias)
                for (int64_t j = 0; j < nc; j++) y[r][j] += bias[j];
            hr_store_f32((char *)gemv_elem(&g->c, ctx->row_off_c[r], 0, j0), g->c.dt, y[r], nc, g->c.cs);
        }
    }
}

hr_status hr_gemv_run(const hr_gemm *g, int rows) {
    gemv_ctx ctx = {.g = g, .rows = rows, .blocks = (g->n + 3) / 4};
    bool bf16 = g->a.dt == HR_BF16 && g->b.dt == HR_BF16 && hr_gemm_use_avx512_bf16();
    ctx.fn = bf16 ? hr_gemv_bf16_avx512 : hr_cpu_isa_get() >= HR_ISA_AVX2 ? hr_gemv_avx2 : hr_gemv_scalar;
    size_t esz = ctx.xsz = bf16 ? 2 : 4;
    char *x = malloc((size_t)rows * (size_t)g->k * esz + 64);
    if (!x) return hr_error(HR_ERR_OOM, "gemv: out of memory for %d x %lld activations", rows, (long long)g->k);
    for (int r = 0; r < rows; r++) {
        int64_t oa, ob, oc;
        hr_gemm_batch_offsets(g, r / g->m, &oa, &ob, &oc);
        ctx.row_off_c[r] = oc + (r % g->m) * g->c.rs;
        const char *src = gemv_elem(&g->a, oa, r % g->m, 0);
        char *dst = x + (size_t)r * (size_t)g->k * esz;
        if (bf16) {
            for (int64_t p = 0; p < g->k; p++) memcpy(dst + 2 * p, src + 2 * p * g->a.cs, 2);
        } else {
            hr_load_f32((float *)dst, src, g->a.dt, g->k, g->a.cs);
        }
    }
    ctx.x = x;
    int nth = hr_parallel_threads_for((int64_t)rows * g->n * g->k, 1 << 16);
    if (nth > ctx.blocks) nth = (int)ctx.blocks;
    hr_parallel_run(gemv_worker, &ctx, nth);
    free(x);
    return HR_OK;
}
