/* linear with an FP8-block weight (the Hub's FP8 checkpoints, repacked at
 * load by models/weights_fp8.c): x's rows in f32, each thread a contiguous
 * range of weight tiles streamed from memory once per call:
 *   - up to 4 x rows: each block decoded in registers and dotted with
 *     every row (fp8_dot.h);
 *   - more: a tile of TILE weight rows dequantized to f32 (in L2), and
 *     every block of x rows run against it, 4 x 4 dot products at a time.
 * Activations stay f32: no FP8 rounding of x, the dequantize-then-f32
 * result up to the order of the additions (which depends on the path and
 * k, never on the thread count). Without AVX-512 the same in plain C. */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/fp8_dot.h"
#include "backends/cpu/k_fused.h"
#include "backends/cpu/k_linear_quant.h"
#include "core/dequant.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/tensor_impl.h"
#include "core/threadpool.h"

#define TILE 16
/* Up to this many x rows decode each block once in registers. */
#define GEMV_ROWS 4
/* Bytes of f32 x rows one pass over a weight tile reads (from L2). */
#define X_BLOCK_BYTES (256 << 10)

typedef struct f8lin {
    const uint8_t *w;
    size_t w_rs;
    int64_t m, n, k;
    float *x;         /* [m][k] */
    hr_linear_out o;
    bool simd;
    int64_t x_block;  /* x rows per pass over a tile */
    float *scratch;   /* per thread: the tile [TILE][k], outputs [x_block][TILE] */
    size_t scratch_floats;
} f8lin;

typedef struct x_job {
    const char *x;
    hr_dtype dt;
    int64_t rs, k;
    float *out;
    int64_t m;
} x_job;

static void x_worker(void *arg, int ith, int nth) {
    const x_job *j = arg;
    int64_t b, e;
    hr_split_range(j->m, ith, nth, &b, &e);
    for (int64_t i = b; i < e; i++)
        hr_load_f32(j->out + i * j->k, j->x + (size_t)(i * j->rs) * hr_dtype_size(j->dt), j->dt, j->k, 1);
}

static void dots_scalar(const float *wf, int nw, const float *x, int m, int64_t k, float *out, int64_t ors) {
    for (int r = 0; r < m; r++)
        for (int j = 0; j < nw; j++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < k; i++) acc += wf[j * k + i] * x[r * k + i];
            out[r * ors + j] = acc;
        }
}

static void tiles(const f8lin *L, float *scratch, int64_t t0, int64_t t1) {
    float *wf = scratch, *o = scratch + TILE * L->k;
    for (int64_t t = t0; t < t1; t++) {
        int64_t j0 = t * TILE;
        int nt = L->n - j0 < TILE ? (int)(L->n - j0) : TILE;
        const uint8_t *wt = L->w + (size_t)j0 * L->w_rs;
        if (L->simd && L->m <= GEMV_ROWS) {
            hr_fp8_gemv_avx512(wt, L->w_rs, L->k, nt, L->x, (int)L->m, o, TILE);
            for (int64_t i = 0; i < L->m; i++) hr_linear_out_row(&L->o, i, j0, nt, o + i * TILE);
            continue;
        }
        if (L->simd) hr_fp8_dequant_avx512(wt, L->w_rs, L->k, nt, wf);
        else
            for (int j = 0; j < nt; j++) hr_dequant_row(HR_FP8, wt + (size_t)j * L->w_rs, wf + j * L->k, L->k);
        for (int64_t i0 = 0; i0 < L->m; i0 += L->x_block) {
            int mb = (int)(L->m - i0 < L->x_block ? L->m - i0 : L->x_block);
            const float *xb = L->x + i0 * L->k;
            if (L->simd) hr_f32_dots_avx512(wf, nt, xb, mb, L->k, o, TILE);
            else dots_scalar(wf, nt, xb, mb, L->k, o, TILE);
            for (int i = 0; i < mb; i++) hr_linear_out_row(&L->o, i0 + i, j0, nt, o + i * TILE);
        }
    }
}

static void dot_worker(void *arg, int ith, int nth) {
    const f8lin *L = arg;
    int64_t n_tiles = (L->n + TILE - 1) / TILE, t0, t1;
    hr_split_range(n_tiles, ith, nth, &t0, &t1);
    if (t0 < t1) tiles(L, L->scratch + (size_t)ith * L->scratch_floats, t0, t1);
}

hr_status hr_cpu_linear_fp8(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out) {
    f8lin L = {.w = hr_tensor_ptr(w), .n = w->shape[0], .k = w->shape[1], .simd = hr_fp8_avx512_ok()};
    int64_t x_rs;
    if (!hr_linear_quant_fits(x, w, out) || !hr_fused_rows(x, &L.m, &x_rs))
        return hr_error(HR_ERR_UNSUPPORTED, "linear: a %s weight '%s' takes x and out as rows of one stride",
                        hr_dtype_name(w->dtype), w->name);
    HR_TRY(hr_linear_out_of(w, bias, out, L.m, &L.o));
    if (L.m == 0 || L.n == 0) return HR_OK;
    L.w_rs = hr_dtype_nbytes(w->dtype, w->strides[0]);
    L.x_block = X_BLOCK_BYTES / (4 * L.k) > 0 ? X_BLOCK_BYTES / (4 * L.k) : 1;
    if (L.x_block > L.m) L.x_block = L.m;
    int nth = hr_parallel_threads_for(L.m * L.n * L.k, HR_GRAIN_MATMUL);
    L.scratch_floats = (size_t)((TILE * L.k + L.x_block * TILE + 15) / 16 * 16);
    size_t x_floats = (size_t)((L.m * L.k + 15) / 16 * 16);
    float *buf = aligned_alloc(64, sizeof(float) * (x_floats + (size_t)nth * L.scratch_floats));
    if (!buf)
        return hr_error(HR_ERR_OOM, "linear: out of memory for %lld x %lld f32 activations of '%s'", (long long)L.m,
                        (long long)L.k, w->name);
    L.x = buf;
    L.scratch = buf + x_floats;
    x_job xj = {.x = hr_tensor_ptr(x), .dt = x->dtype, .rs = x_rs, .k = L.k, .out = L.x, .m = L.m};
    hr_parallel_run(x_worker, &xj, hr_parallel_threads_for(L.m * L.k, HR_GRAIN_ROWS));
    hr_parallel_run(dot_worker, &L, nth);
    free(buf);
    return HR_OK;
}
