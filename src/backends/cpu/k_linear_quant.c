/* linear with a block-quantized weight (quant_rows.h): x's rows quantized
 * to int8 once, then each thread takes a contiguous range of weight rows,
 * unpacks a tile of them into L1 and runs every x row against it, so the
 * weights stream from memory once per call whatever the row count. Each
 * output is one dot product, whatever the thread count. */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/k_fused.h"
#include "backends/cpu/k_linear_quant.h"
#include "backends/cpu/quant_rows.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor_impl.h"
#include "core/threadpool.h"

/* Weight rows unpacked at a time: 16 x k bytes stay in L1 up to k = 2048. */
#define TILE 16
/* Bytes of quantized x rows one pass over a weight tile reads (L2). */
#define X_BLOCK_BYTES (256 << 10)

typedef struct qlin {
    hr_qdot_fn dot;
    hr_dtype wdt;
    const uint8_t *w;
    size_t w_rs; /* bytes between weight rows */
    int64_t m, n, k, runs;
    const int8_t *q; /* [m][k] */
    const float *xd, *xs; /* [m][runs] */
    const void *x;
    hr_dtype xdt;
    int64_t x_rs;
    const char *bias;
    hr_dtype bias_dt;
    int64_t bias_s;
    char *out;
    hr_dtype odt;
    int64_t o_rs;
    int64_t x_block; /* x rows per pass */
    bool gemv;       /* few rows of a 32-element type: hr_qgemv_avx512 */
    uint8_t *tiles;  /* per thread: u [TILE][k], s and c [TILE][runs] */
    size_t tile_bytes;
} qlin;

static size_t tile_floats(const qlin *L) { return sizeof(float) * (size_t)TILE * (size_t)L->runs; }

static inline size_t esize(hr_dtype dt) { return hr_dtype_size(dt); }

static float load_f(const char *p, hr_dtype dt) {
    if (dt == HR_F32) return *(const float *)p;
    uint16_t h;
    memcpy(&h, p, 2);
    return dt == HR_BF16 ? hr_bf16_to_f32(h) : hr_f16_to_f32(h);
}

static void store_row(const qlin *L, int64_t i, int64_t j0, int nt, const float *v) {
    char *o = L->out + (size_t)(i * L->o_rs + j0) * esize(L->odt);
    for (int j = 0; j < nt; j++) {
        float y = v[j];
        if (L->bias) y += load_f(L->bias + (size_t)((j0 + j) * L->bias_s) * esize(L->bias_dt), L->bias_dt);
        if (L->odt == HR_F32) ((float *)o)[j] = y;
        else if (L->odt == HR_BF16) ((uint16_t *)o)[j] = hr_f32_to_bf16(y);
        else ((uint16_t *)o)[j] = hr_f32_to_f16(y);
    }
}

static void quant_x_worker(void *arg, int ith, int nth) {
    const qlin *L = arg;
    int64_t b, e;
    hr_split_range(L->m, ith, nth, &b, &e);
    for (int64_t i = b; i < e; i++)
        hr_quant_x_row((const char *)L->x + (size_t)(i * L->x_rs) * esize(L->xdt), L->xdt, L->k,
                       (int8_t *)L->q + i * L->k, (float *)L->xd + i * L->runs, (float *)L->xs + i * L->runs);
}

static void dot_worker(void *arg, int ith, int nth) {
    const qlin *L = arg;
    int64_t tiles = (L->n + TILE - 1) / TILE, t0, t1;
    hr_split_range(tiles, ith, nth, &t0, &t1);
    uint8_t *u = L->tiles + (size_t)ith * L->tile_bytes;
    float *s = (float *)(u + (size_t)TILE * (size_t)L->k), *c = (float *)((char *)s + tile_floats(L)), v[TILE];
    if (L->gemv) {
        /* decode rows: blocks read in registers, no unpacked tile */
        hr_qx x[HR_QGEMV_ROWS];
        float o[HR_QGEMV_ROWS * TILE];
        for (int r = 0; r < L->m; r++)
            x[r] = (hr_qx){.q = L->q + r * L->k, .xd = L->xd + r * L->runs, .xs = L->xs + r * L->runs};
        for (int64_t t = t0; t < t1; t++) {
            int64_t j0 = t * TILE;
            int nt = L->n - j0 < TILE ? (int)(L->n - j0) : TILE;
            hr_qgemv_avx512(L->wdt, L->w + (size_t)j0 * L->w_rs, L->w_rs, L->k, nt, (int)L->m, x, o, TILE);
            for (int r = 0; r < L->m; r++) store_row(L, r, j0, nt, o + r * TILE);
        }
        return;
    }
    for (int64_t i0 = 0; i0 < L->m; i0 += L->x_block) {
        int64_t i1 = i0 + L->x_block < L->m ? i0 + L->x_block : L->m;
        for (int64_t t = t0; t < t1; t++) {
            int64_t j0 = t * TILE;
            int nt = L->n - j0 < TILE ? (int)(L->n - j0) : TILE;
            hr_quant_unpack_rows(L->wdt, L->w + (size_t)j0 * L->w_rs, L->w_rs, L->k, nt, u, s, c);
            for (int64_t i = i0; i < i1; i++) {
                hr_qx x = {.q = L->q + i * L->k, .xd = L->xd + i * L->runs, .xs = L->xs + i * L->runs};
                L->dot(L->k, nt, u, s, c, x, v);
                store_row(L, i, j0, nt, v);
            }
        }
    }
}

bool hr_linear_quant_fits(const hr_tensor *x, const hr_tensor *w, const hr_tensor *out) {
    int64_t rows, rs;
    return hr_dtype_is_quantized(w->dtype) && w->ndim == 2 && w->strides[1] == 1 && hr_fused_rows(x, &rows, &rs) &&
           hr_fused_rows(out, &rows, &rs);
}

hr_status hr_cpu_linear_quant(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out) {
    qlin L = {.dot = hr_qdot_pick(), .wdt = w->dtype, .w = hr_tensor_ptr(w), .n = w->shape[0], .k = w->shape[1],
              .x = hr_tensor_ptr(x), .xdt = x->dtype, .out = hr_tensor_ptr(out), .odt = out->dtype};
    int64_t om;
    if (!hr_linear_quant_fits(x, w, out) || !hr_fused_rows(x, &L.m, &L.x_rs) || !hr_fused_rows(out, &om, &L.o_rs) ||
        om != L.m)
        return hr_error(HR_ERR_UNSUPPORTED, "linear: a %s weight '%s' takes x and out as rows of one stride",
                        hr_dtype_name(w->dtype), w->name);
    if (L.m == 0 || L.n == 0) return HR_OK;
    L.w_rs = hr_dtype_nbytes(w->dtype, w->strides[0]);
    L.runs = L.k / HR_QSUB;
    if (bias) {
        L.bias = hr_tensor_ptr(bias);
        L.bias_dt = bias->dtype;
        L.bias_s = bias->strides[0];
    }
    L.x_block = X_BLOCK_BYTES / L.k > 0 ? X_BLOCK_BYTES / L.k : 1;
    L.gemv = L.m <= HR_QGEMV_ROWS && hr_qgemv_has(L.wdt);
    int nth = hr_parallel_threads_for(L.m * L.n * L.k, HR_GRAIN_MATMUL);
    /* one allocation: x's int8 rows and scales, then each thread's tile */
    size_t qb = (size_t)(L.m * L.k + 63) / 64 * 64, fb = sizeof(float) * (size_t)(L.m * L.runs);
    L.tile_bytes = ((size_t)TILE * (size_t)L.k + 2 * tile_floats(&L) + 63) / 64 * 64;
    size_t tiles_at = (qb + 2 * fb + 63) / 64 * 64;
    char *buf = aligned_alloc(64, tiles_at + (size_t)nth * L.tile_bytes);
    if (!buf) return hr_error(HR_ERR_OOM, "linear: out of memory quantizing %lld x %lld activations", (long long)L.m,
                              (long long)L.k);
    L.q = (const int8_t *)buf;
    L.xd = (const float *)(buf + qb);
    L.xs = L.xd + L.m * L.runs;
    L.tiles = (uint8_t *)buf + tiles_at;
    hr_parallel_run(quant_x_worker, &L, hr_parallel_threads_for(L.m * L.k, HR_GRAIN_ROWS));
    hr_parallel_run(dot_worker, &L, nth);
    free(buf);
    return HR_OK;
}
