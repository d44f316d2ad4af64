/* linear with a block-quantized weight (quant_rows.h): x's rows quantized
 * to int8 once, then each thread takes a contiguous range of weight rows
 * and streams them from memory once per call, whatever the row count:
 *   - a decode row of a 32-element type, Q4_K, Q5_K or Q6_K on AVX-512
 *     VNNI (up to GEMV_MAX_ROWS rows of a 32-element type, each in turn
 *     against a tile of weight rows in L2): each block unpacked in
 *     registers and dotted with the row;
 *   - otherwise a tile of TILE weight rows unpacked into L1 and every x row
 *     of a block of them run against it: on AVX-512 VNNI interleaved so
 *     that int32 lanes sum whole runs, in 4 x 4 blocks (32-element types,
 *     Q4_K and Q5_K unpacked there with SIMD), else one dot at a time.
 * Each output is one dot product whose order of additions depends on the
 * path and the row count, never on the thread count. */
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
/* Bytes of interleaved int8 x rows one pass over a weight tile reads, from
 * L2 (their run scales and sums add half as much again). */
#define X_BLOCK_BYTES (384 << 10)
/* Rows up to which the 32-element types' blocks are read in registers,
 * row by row, rather than unpacked into a tile (bench_moe, Qwen3-30B-A3B's
 * experts at Q8_0, ~1 to 4 rows an expert, AMD EPYC, 2 threads: 16 tokens
 * 24.4 -> 14.9 ms a layer, 64 tokens 65.8 -> 43.7); the k-quants, whose
 * blocks cost more to unpack, take it for one row only (Q4_K: 19.7 ->
 * 23.3 and 56 -> 68 ms through registers). */
#define GEMV_MAX_ROWS 4
/* Rows up to which the types unpacked in plain C (Q2_K, Q3_K, Q6_K,
 * IQ4_XS) take one dot at a time rather than the interleaved tile. */
#define DOT_MAX_ROWS 4

typedef enum { PATH_GEMV, PATH_GEMM, PATH_DOT } qpath;

typedef struct qlin {
    qpath path;
    hr_qdot_fn dot;
    hr_dtype wdt;
    const uint8_t *w;
    size_t w_rs; /* bytes between weight rows */
    int64_t m, n, k, runs;
    int8_t *q;        /* [m][k] */
    float *xd, *xs;   /* [m][runs] */
    float *xsb;       /* [m][k / 32]: x's block sums, PATH_GEMV */
    int8_t *qi;       /* [m][k], q interleaved, PATH_GEMM */
    const void *x;
    hr_dtype xdt;
    int64_t x_rs;
    hr_linear_out o;
    int64_t x_block; /* x rows per pass over a tile */
    uint8_t *scratch; /* per thread: the tile and its outputs */
    size_t scratch_bytes;
} qlin;

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

static inline size_t esize(hr_dtype dt) { return hr_dtype_size(dt); }

static float load_f(const char *p, hr_dtype dt) {
    if (dt == HR_F32) return *(const float *)p;
    uint16_t h;
    memcpy(&h, p, 2);
    return dt == HR_BF16 ? hr_bf16_to_f32(h) : hr_f16_to_f32(h);
}

void hr_linear_out_row(const hr_linear_out *L, int64_t i, int64_t j0, int nt, const float *v) {
    char *o = L->out + (size_t)(i * L->o_rs + j0) * esize(L->odt);
    for (int j = 0; j < nt; j++) {
        float y = v[j];
        if (L->bias) y += load_f(L->bias + (size_t)((j0 + j) * L->bias_s) * esize(L->bias_dt), L->bias_dt);
        if (L->odt == HR_F32) ((float *)o)[j] = y;
        else if (L->odt == HR_BF16) ((uint16_t *)o)[j] = hr_f32_to_bf16(y);
        else ((uint16_t *)o)[j] = hr_f32_to_f16(y);
    }
}

hr_status hr_linear_quant_args(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out,
                               int64_t *m, int64_t *x_rs, size_t *w_rs, hr_linear_out *o) {
    int64_t om;
    *o = (hr_linear_out){.out = hr_tensor_ptr(out), .odt = out->dtype};
    if (!hr_linear_quant_fits(x, w, out) || !hr_fused_rows(x, m, x_rs) || !hr_fused_rows(out, &om, &o->o_rs) ||
        om != *m)
        return hr_error(HR_ERR_UNSUPPORTED, "linear: a %s weight '%s' takes x and out as rows of one stride",
                        hr_dtype_name(w->dtype), w->name);
    *w_rs = hr_dtype_nbytes(w->dtype, w->strides[0]);
    if (bias) {
        o->bias = hr_tensor_ptr(bias);
        o->bias_dt = bias->dtype;
        o->bias_s = bias->strides[0];
    }
    return HR_OK;
}

static void quant_x_worker(void *arg, int ith, int nth) {
    const qlin *L = arg;
    int64_t b, e;
    hr_split_range(L->m, ith, nth, &b, &e);
    for (int64_t i = b; i < e; i++) {
        float *xd = L->xd + i * L->runs, *xs = L->xs + i * L->runs;
        hr_quant_x_row((const char *)L->x + (size_t)(i * L->x_rs) * esize(L->xdt), L->xdt, L->k, L->q + i * L->k, xd,
                       xs);
        if (L->path == PATH_GEMM)
            hr_quant_interleave((const uint8_t *)(L->q + i * L->k), L->k, (uint8_t *)(L->qi + i * L->k));
    }
}

/* Each of up to GEMV_MAX_ROWS x rows against each tile of weight rows in
 * turn: the tile comes from memory for the first row and from L2 for the
 * others. */
static void gemv_tiles(const qlin *L, int64_t t0, int64_t t1) {
    float o[TILE];
    int64_t nb = L->k / 32;
    for (int64_t t = t0; t < t1; t++) {
        int64_t j0 = t * TILE;
        int nt = L->n - j0 < TILE ? (int)(L->n - j0) : TILE;
        for (int64_t i = 0; i < L->m; i++) {
            hr_qx x = {.q = L->q + i * L->k, .xd = L->xd + i * L->runs, .xs = L->xs + i * L->runs};
            hr_qgemv_avx512(L->wdt, L->w + (size_t)j0 * L->w_rs, L->w_rs, L->k, nt, x, L->xsb + i * nb, o);
            hr_linear_out_row(&L->o, i, j0, nt, o);
        }
    }
}

/* The tile paths: scratch holds u [TILE][k], s and c [TILE][runs], (GEMM)
 * u interleaved [TILE][k] and c transposed [runs][TILE], and the outputs
 * [x_block][TILE]. */
static void tile_rows(const qlin *L, uint8_t *scratch, int64_t t0, int64_t t1) {
    size_t runs_b = up64(sizeof(float) * (size_t)(TILE * L->runs)), u_b = up64((size_t)(TILE * L->k));
    uint8_t *u = scratch;
    float *s = (float *)(u + u_b), *c = (float *)((char *)s + runs_b);
    uint8_t *ui = (uint8_t *)c + runs_b;
    float *ct = (float *)(ui + u_b), *o = (float *)((char *)ct + runs_b);
    for (int64_t i0 = 0; i0 < L->m; i0 += L->x_block) {
        int64_t i1 = i0 + L->x_block < L->m ? i0 + L->x_block : L->m;
        for (int64_t t = t0; t < t1; t++) {
            int64_t j0 = t * TILE;
            int nt = L->n - j0 < TILE ? (int)(L->n - j0) : TILE;
            const uint8_t *wt = L->w + (size_t)j0 * L->w_rs;
            if (L->path == PATH_GEMM && hr_quant_tile_has(L->wdt)) {
                hr_quant_tile_avx512(L->wdt, wt, L->w_rs, L->k, nt, ui, s, ct, TILE);
            } else {
                hr_quant_unpack_rows(L->wdt, wt, L->w_rs, L->k, nt, u, s, c);
                for (int j = 0; L->path == PATH_GEMM && j < nt; j++) {
                    hr_quant_interleave(u + j * L->k, L->k, ui + j * L->k);
                    for (int64_t r = 0; r < L->runs; r++) ct[r * TILE + j] = c[j * L->runs + r];
                }
            }
            if (L->path == PATH_GEMM) {
                hr_qgemm_avx512(L->k, nt, ui, s, ct, (int)(i1 - i0), L->qi + i0 * L->k, L->xd + i0 * L->runs,
                                L->xs + i0 * L->runs, o, TILE);
            } else {
                for (int64_t i = i0; i < i1; i++) {
                    hr_qx x = {.q = L->q + i * L->k, .xd = L->xd + i * L->runs, .xs = L->xs + i * L->runs};
                    L->dot(L->k, nt, u, s, c, x, o + (i - i0) * TILE);
                }
            }
            for (int64_t i = i0; i < i1; i++) hr_linear_out_row(&L->o, i, j0, nt, o + (i - i0) * TILE);
        }
    }
}

static void dot_worker(void *arg, int ith, int nth) {
    const qlin *L = arg;
    int64_t tiles = (L->n + TILE - 1) / TILE, t0, t1;
    hr_split_range(tiles, ith, nth, &t0, &t1);
    if (t0 >= t1) return;
    if (L->path == PATH_GEMV) gemv_tiles(L, t0, t1);
    else tile_rows(L, L->scratch + (size_t)ith * L->scratch_bytes, t0, t1);
}

bool hr_linear_quant_fits(const hr_tensor *x, const hr_tensor *w, const hr_tensor *out) {
    int64_t rows, rs;
    return hr_dtype_is_quantized(w->dtype) && w->ndim == 2 && w->strides[1] == 1 && hr_fused_rows(x, &rows, &rs) &&
           hr_fused_rows(out, &rows, &rs);
}

hr_status hr_cpu_linear_quant(const hr_tensor *x, const hr_tensor *w, const hr_tensor *bias, hr_tensor *out) {
    if (w->dtype == HR_FP8) return hr_cpu_linear_fp8(x, w, bias, out);
    qlin L = {.dot = hr_qdot_pick(), .wdt = w->dtype, .w = hr_tensor_ptr(w), .n = w->shape[0], .k = w->shape[1],
              .x = hr_tensor_ptr(x), .xdt = x->dtype};
    HR_TRY(hr_linear_quant_args(x, w, bias, out, &L.m, &L.x_rs, &L.w_rs, &L.o));
    if (L.m == 0 || L.n == 0) return HR_OK;
    L.runs = L.k / HR_QSUB;
    bool avx512 = L.dot == hr_qdot_avx512;
    /* the other types unpack through plain C: a tile of them pays for its
     * interleaving from DOT_MAX_ROWS rows on */
    bool simd_tile = hr_quant_tile_has(L.wdt);
    /* one row reads the blocks in registers (PATH_GEMV) rather than through
     * a tile (Zen 4, a Q4_0 [1536, 576] weight, 2 threads: 1 row 44 GOP/s
     * in registers, 26 through a tile; 4 rows 83 and 95; 16 rows 91 and
     * 159, before the two-block kernel) */
    int64_t gemv_rows = hr_dtype_block(L.wdt) == 32 ? GEMV_MAX_ROWS : 1;
    L.path = L.m <= gemv_rows && hr_qgemv_has(L.wdt)           ? PATH_GEMV
             : avx512 && (simd_tile || L.m > DOT_MAX_ROWS) ? PATH_GEMM
                                                               : PATH_DOT;
    L.x_block = X_BLOCK_BYTES / L.k > 0 ? X_BLOCK_BYTES / L.k : 1;
    if (L.x_block > L.m) L.x_block = L.m;
    int nth = hr_parallel_threads_for(L.m * L.n * L.k, HR_GRAIN_MATMUL);
    /* one allocation: x's int8 rows and scales, then each thread's scratch */
    size_t qb = up64((size_t)(L.m * L.k)), rb = up64(sizeof(float) * (size_t)(L.m * L.runs));
    size_t lb = L.path == PATH_GEMM ? qb : 0;
    size_t runs_b = up64(sizeof(float) * (size_t)(TILE * L.runs)), u_b = up64((size_t)(TILE * L.k));
    L.scratch_bytes = L.path == PATH_GEMV ? 0
                                         : 2 * u_b + 3 * runs_b +
                                               up64(sizeof(float) * (size_t)(L.x_block * TILE));
    size_t sb = L.path == PATH_GEMV ? up64(sizeof(float) * (size_t)(L.m * (L.k / 32))) : 0;
    size_t x_bytes = qb + 2 * rb + lb + sb;
    char *buf = aligned_alloc(64, x_bytes + (size_t)nth * L.scratch_bytes);
    if (!buf)
        return hr_error(HR_ERR_OOM, "linear: out of memory quantizing %lld x %lld activations for '%s'", (long long)L.m,
                        (long long)L.k, w->name);
    L.q = (int8_t *)buf;
    L.xd = (float *)(buf + qb);
    L.xs = (float *)(buf + qb + rb);
    L.qi = (int8_t *)(buf + qb + 2 * rb);
    L.xsb = (float *)(buf + qb + 2 * rb + lb);
    L.scratch = (uint8_t *)buf + x_bytes;
    hr_parallel_run(quant_x_worker, &L, hr_parallel_threads_for(L.m * L.k, HR_GRAIN_ROWS));
    for (int64_t b = 0; L.path == PATH_GEMV && b < L.m * (L.k / 32); b++) L.xsb[b] = L.xs[2 * b] + L.xs[2 * b + 1];
    hr_parallel_run(dot_worker, &L, nth);
    free(buf);
    return HR_OK;
}
