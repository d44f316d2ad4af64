/* The GEMV route: a few rows of A (decode: x) against a K-contiguous B
 * (x @ W^T), streaming B from memory once while every row reuses it. */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_eltwise.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"

/* Output columns per kernel call (at most); the f32 results of one chunk
 * wait in a stack buffer for bias and the store in C's dtype. */
#define GEMV_CHUNK 64
/* Weight bytes of a chunk at most when x takes several calls per chunk, so
 * that the later calls find the chunk in L2 (1 MiB here). */
#define GEMV_CHUNK_L2 (512 << 10)
/* A thread's share of the output columns is a multiple of this, so the
 * threads' stores never share a 64-byte line (32 bf16 or 16 f32 values
 * of a 64-aligned row), and each thread streams one contiguous byte range
 * of the weights. */
#define GEMV_SPLIT 32
/* x converted for the kernel lives on the stack up to this size. */
#define GEMV_STACK_X 16384

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
    int64_t units;                         /* of GEMV_SPLIT output columns */
    int group;                             /* x rows per kernel call */
    int chunk;                             /* output columns per kernel call */
} gemv_ctx;

static void gemv_worker(void *arg, int ith, int nth) {
    gemv_ctx *ctx = arg;
    const hr_gemm *g = ctx->g;
    int64_t begin, end;
    hr_split_range(ctx->units, ith, nth, &begin, &end);
    begin *= GEMV_SPLIT;
    end = end * GEMV_SPLIT < g->n ? end * GEMV_SPLIT : g->n;
    float y[HR_GEMV_ROUTE_ROWS][GEMV_CHUNK], bias[GEMV_CHUNK];
    size_t wsz = hr_dtype_size(g->b.dt);
    bool simd = hr_k_simd();
    for (int64_t j0 = begin; j0 < end; j0 += ctx->chunk) {
        int nc = end - j0 < ctx->chunk ? (int)(end - j0) : ctx->chunk;
        const char *w = g->b.base + j0 * g->b.cs * (int64_t)wsz;
        for (int r = 0; r < ctx->rows; r += ctx->group)
            ctx->fn(g->k, ctx->rows - r < ctx->group ? ctx->rows - r : ctx->group,
                    ctx->x + (size_t)r * (size_t)g->k * ctx->xsz, w, g->b.dt, g->b.cs, nc, y[r], GEMV_CHUNK);
        if (g->bias) hr_load_f32(bias, g->bias + j0 * g->bias_s * (int64_t)hr_dtype_size(g->bias_dt),
                                 g->bias_dt, nc, g->bias_s);
        for (int r = 0; r < ctx->rows; r++) {
            if (g->bias)
                for (int j = 0; j < nc; j++) y[r][j] += bias[j];
            hr_k_store_f32((char *)gemv_elem(&g->c, ctx->row_off_c[r], 0, j0), g->c.dt, y[r], nc, g->c.cs,
                           simd);
        }
    }
}

hr_gemv_fn hr_gemv_kernel_for(hr_dtype xdt, hr_dtype wdt, size_t *xsz) {
    bool bf16 = xdt == HR_BF16 && wdt == HR_BF16 && hr_gemm_use_avx512_bf16();
    *xsz = bf16 ? 2 : 4;
    return bf16 ? hr_gemv_bf16_avx512 : hr_cpu_isa_get() >= HR_ISA_AVX2 ? hr_gemv_avx2 : hr_gemv_scalar;
}

void hr_gemv_load_x(char *dst, const char *src, hr_dtype dt, int64_t k, int64_t cs, size_t xsz) {
    if (xsz == 2 && cs == 1)
        memcpy(dst, src, (size_t)k * 2);
    else if (xsz == 2)
        for (int64_t p = 0; p < k; p++) memcpy(dst + 2 * p, src + 2 * p * cs, 2);
    else
        hr_load_f32((float *)dst, src, dt, k, cs);
}

hr_status hr_gemv_run(const hr_gemm *g, int rows) {
    gemv_ctx ctx = {.g = g, .rows = rows, .units = (g->n + GEMV_SPLIT - 1) / GEMV_SPLIT};
    ctx.fn = hr_gemv_kernel_for(g->a.dt, g->b.dt, &ctx.xsz);
    size_t esz = ctx.xsz;
    ctx.group = hr_gemv_group_rows(g->k, esz);
    ctx.chunk = GEMV_CHUNK;
    while (rows > ctx.group && ctx.chunk > 16 && ctx.chunk * g->k * (int64_t)hr_dtype_size(g->b.dt) > GEMV_CHUNK_L2)
        ctx.chunk /= 2;
    size_t xbytes = (size_t)rows * (size_t)g->k * esz;
    _Alignas(64) char stack_x[GEMV_STACK_X];
    char *x = xbytes <= sizeof stack_x ? stack_x : malloc(xbytes);
    if (!x) return hr_error(HR_ERR_OOM, "gemv: out of memory for %d x %lld activations", rows, (long long)g->k);
    for (int r = 0; r < rows; r++) {
        int64_t oa, ob, oc;
        hr_gemm_batch_offsets(g, r / g->m, &oa, &ob, &oc);
        ctx.row_off_c[r] = oc + (r % g->m) * g->c.rs;
        hr_gemv_load_x(x + (size_t)r * (size_t)g->k * esz, gemv_elem(&g->a, oa, r % g->m, 0), g->a.dt, g->k,
                       g->a.cs, esz);
    }
    ctx.x = x;
    int nth = hr_parallel_threads_for((int64_t)rows * g->n * g->k, HR_GRAIN_MATMUL);
    if (nth > ctx.units) nth = (int)ctx.units;
    hr_parallel_run(gemv_worker, &ctx, nth);
    if (x != stack_x) free(x);
    return HR_OK;
}
