/* linear with an FP8-block weight (the Hub's FP8 checkpoints, repacked at
 * load by models/weights_fp8.c):
 *   - up to GEMV_ROWS x rows (decode): x's rows widened to f32, each thread
 *     a contiguous range of weight tiles streamed from memory once, each
 *     block decoded in registers and dotted with every row (fp8_dot.h):
 *     the dequantize-then-f32 result up to the order of the additions;
 *   - more (prefill, batches): CHUNK weight rows at a time dequantized
 *     into x's dtype (the model dtype: what transformers runs an FP8
 *     checkpoint in on a CPU) and multiplied by the GEMM engine (gemm.h),
 *     so the dequantization is paid once per CHUNK x k weights for all the
 *     rows, and the product runs at the bf16 kernels' speed.
 * The order of additions depends on the path and the shapes, never on the
 * thread count. Without AVX-512 the same in plain C. */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/fp8_dot.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/k_fused.h"
#include "backends/cpu/k_linear_quant.h"
#include "core/dequant.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/tensor_impl.h"
#include "core/threadpool.h"

#define TILE 16
/* Up to this many x rows decode the blocks in registers; more dequantize
 * for the GEMM engine (Zen 4, 2 threads, Qwen3-0.6B shapes, batch 16:
 * 128 tok/s decoding in registers once per 8 rows, 150 rounding them to
 * bf16 in registers for one vdpbf16ps a row, 185-214 through the GEMM;
 * bf16 weights 340-380). */
#define GEMV_ROWS 4
/* Weight rows dequantized per GEMM: 256 x 4096 bf16 is 2 MB. */
#define CHUNK 256

typedef struct f8lin {
    const uint8_t *w;
    size_t w_rs;
    int64_t m, n, k;
    const char *x;
    hr_dtype xdt;
    int64_t x_rs;
    float *xf;      /* [m][k] f32, the GEMV path */
    hr_linear_out o;
    bool simd;
    float *scratch; /* per thread: the tile [TILE][k] (plain C), outputs [GEMV_ROWS][TILE] */
    size_t scratch_floats;
    /* the GEMM path: weight rows [j0, j0 + nc) into wq [nc][k] of xdt */
    int64_t j0, nc;
    char *wq;
} f8lin;

static void x_worker(void *arg, int ith, int nth) {
    const f8lin *L = arg;
    int64_t b, e;
    hr_split_range(L->m, ith, nth, &b, &e);
    for (int64_t i = b; i < e; i++)
        hr_load_f32(L->xf + i * L->k, L->x + (size_t)(i * L->x_rs) * hr_dtype_size(L->xdt), L->xdt, L->k, 1);
}

static void dots_scalar(const float *wf, int nw, const float *x, int m, int64_t k, float *out, int64_t ors) {
    for (int r = 0; r < m; r++)
        for (int j = 0; j < nw; j++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < k; i++) acc += wf[j * k + i] * x[r * k + i];
            out[r * ors + j] = acc;
        }
}

static void gemv_worker(void *arg, int ith, int nth) {
    const f8lin *L = arg;
    int64_t n_tiles = (L->n + TILE - 1) / TILE, t0, t1;
    hr_split_range(n_tiles, ith, nth, &t0, &t1);
    float *o = L->scratch + (size_t)ith * L->scratch_floats, *wf = o + GEMV_ROWS * TILE;
    for (int64_t t = t0; t < t1; t++) {
        int64_t j0 = t * TILE;
        int nt = L->n - j0 < TILE ? (int)(L->n - j0) : TILE;
        const uint8_t *wt = L->w + (size_t)j0 * L->w_rs;
        if (L->simd) {
            hr_fp8_gemv_avx512(wt, L->w_rs, L->k, nt, L->xf, (int)L->m, o, TILE);
        } else {
            for (int j = 0; j < nt; j++) hr_dequant_row(HR_FP8, wt + (size_t)j * L->w_rs, wf + j * L->k, L->k);
            dots_scalar(wf, nt, L->xf, (int)L->m, L->k, o, TILE);
        }
        for (int64_t i = 0; i < L->m; i++) hr_linear_out_row(&L->o, i, j0, nt, o + i * TILE);
    }
}

static hr_status gemv(f8lin *L) {
    int nth = hr_parallel_threads_for(L->m * L->n * L->k, HR_GRAIN_MATMUL);
    L->scratch_floats = (size_t)(GEMV_ROWS * TILE + (L->simd ? 0 : TILE * L->k) + 15) / 16 * 16;
    size_t x_floats = (size_t)((L->m * L->k + 15) / 16 * 16);
    float *buf = aligned_alloc(64, sizeof(float) * (x_floats + (size_t)nth * L->scratch_floats));
    if (!buf) return hr_error(HR_ERR_OOM, "linear: out of memory for %lld f32 activations", (long long)L->m);
    L->xf = buf;
    L->scratch = buf + x_floats;
    hr_parallel_run(x_worker, L, hr_parallel_threads_for(L->m * L->k, HR_GRAIN_ROWS));
    hr_parallel_run(gemv_worker, L, nth);
    free(buf);
    return HR_OK;
}

static void dequant_worker(void *arg, int ith, int nth) {
    const f8lin *L = arg;
    int64_t b, e;
    hr_split_range(L->nc, ith, nth, &b, &e);
    size_t es = hr_dtype_size(L->xdt);
    const uint8_t *w = L->w + (size_t)(L->j0 + b) * L->w_rs;
    char *out = L->wq + (size_t)(b * L->k) * es;
    if (L->simd) {
        hr_fp8_dequant_avx512(w, L->w_rs, L->k, (int)(e - b), L->xdt, out);
        return;
    }
    float *row = L->scratch + (size_t)ith * (size_t)L->k;
    for (int64_t j = b; j < e; j++, w += L->w_rs, out += (size_t)L->k * es) {
        hr_dequant_row(HR_FP8, w, row, L->k);
        hr_encode_row(L->xdt, row, (uint8_t *)out, L->k);
    }
}

static hr_status gemm(f8lin *L) {
    size_t es = hr_dtype_size(L->xdt), osz = hr_dtype_size(L->o.odt);
    int64_t rows = L->n < CHUNK ? L->n : CHUNK;
    int nth = hr_parallel_threads_for(rows * L->k, HR_GRAIN_ELTWISE);
    L->wq = aligned_alloc(64, ((size_t)(rows * L->k) * es + 63) / 64 * 64);
    L->scratch = L->simd ? NULL : malloc(sizeof(float) * (size_t)L->k * (size_t)nth);
    hr_status s = L->wq && (L->simd || L->scratch)
                      ? HR_OK
                      : hr_error(HR_ERR_OOM, "linear: out of memory for %lld dequantized weight rows", (long long)rows);
    for (L->j0 = 0; s == HR_OK && L->j0 < L->n; L->j0 += CHUNK) {
        L->nc = L->n - L->j0 < CHUNK ? L->n - L->j0 : CHUNK;
        hr_parallel_run(dequant_worker, L, nth);
        hr_gemm g = {.m = L->m, .n = L->nc, .k = L->k,
                     .a = {(char *)L->x, L->xdt, L->x_rs, 1},
                     .b = {L->wq, L->xdt, 1, L->k},
                     .c = {L->o.out + (size_t)L->j0 * osz, L->o.odt, L->o.o_rs, 1}};
        if (L->o.bias) {
            g.bias = L->o.bias + (size_t)(L->j0 * L->o.bias_s) * hr_dtype_size(L->o.bias_dt);
            g.bias_dt = L->o.bias_dt;
            g.bias_s = L->o.bias_s;
        }
        s = hr_gemm_run(&g);
    }
    free(L->wq);
    free(L->scratch);
    return s;
}

hr_status hr_cpu_linear_fp8(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out) {
    f8lin L = {.w = hr_tensor_ptr(w), .n = w->shape[0], .k = w->shape[1], .x = hr_tensor_ptr(x), .xdt = x->dtype,
               .simd = hr_fp8_avx512_ok()};
    HR_TRY(hr_linear_quant_args(x, w, bias, out, &L.m, &L.x_rs, &L.w_rs, &L.o));
    if (L.m == 0 || L.n == 0) return HR_OK;
    return L.m <= GEMV_ROWS ? gemv(&L) : gemm(&L);
}
