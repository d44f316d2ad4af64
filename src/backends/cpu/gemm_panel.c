/* The panel route: bf16 A against a K-contiguous bf16 B (x @ W^T) in
 * outer-product form, on AVX-512 BF16, with B in K-pair panels: either the
 * weight's panels made once at load (linear_pack.c; any row count), or,
 * for an unpacked weight with many rows of A (prefill), panels packed per
 * call.
 *
 * The skinny route (gemm_skinny.c) reads the weights in place in
 * dot-product form, which ends every (row, weight row, K block) with a
 * horizontal reduction: about three shuffles or adds per 32 vdpbf16ps at
 * K = 1024, and each x vector is loaded once per four weight rows. Here a
 * block of PN weight rows is a K-pair panel [K/2][PN] (the pair p of row j
 * at p * PN + j; it stays in L2), and every row of A goes over it: a 6 x 64
 * tile broadcasts one bf16 pair of a row against four panel vectors, with
 * no reduction, its sums in registers from the first K to the last. Packing
 * per call (16 x 16 u32 register transposes) costs about 0.25 shuffles per
 * weight pair against rows / 16 vdpbf16ps, so without packed weights the
 * route pays only with many rows (HR_GEMM_PANEL_MIN_ROWS).
 *
 * With the amx ISA, blocks of up to 32 rows go to the AMX kernel
 * (gemm_amx.c), which reads the same panels as tiles, and K's last
 * k % 32 elements to this file's tile, from the tiles' sums.
 *
 * Each column's sum runs over the K pairs in order, whatever the row count,
 * tile or thread split: with packed weights a row's result has the same
 * bits in a batch of 1 or of 500. */
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_panel.h"
#include "backends/cpu/transpose_avx512.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE_ static inline __attribute__((always_inline)) TARGET_

#define PN HR_GEMM_PANEL_N
/* Rows of A per tile (6 x 4 accumulators + 4 panel vectors fit the 32 zmm
 * registers). */
#define PR 6
/* One K pair (the lone last element when `lone`) of every row against the
 * panel's four vectors at b. Row r's pair is at q0 + r * s for r < 3 and
 * q3 + (r - 3) * s after (bytes): three registers address the six rows
 * (base + stride * 1 or 2), where six row pointers ran the loop out of
 * general registers and moved through vector ones, on the ports the
 * vdpbf16ps need (7% of a batch-64 linear). */
INLINE_ void tile_step(__m512 acc[PR][4], int rows, const char *q0, const char *q3, int64_t s, const uint32_t *b,
                       bool lone) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
    __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + 32), b3 = (__m512bh)_mm512_loadu_si512(b + 48);
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) {
        const char *a = r < 3 ? q0 + r * s : q3 + (r - 3) * s;
        uint32_t v;
        if (lone) {
            uint16_t h;
            memcpy(&h, a, 2);
            v = h;
        } else {
            memcpy(&v, a, 4);
        }
        __m512bh av = (__m512bh)_mm512_set1_epi32((int)v);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], av, b2);
        acc[r][3] = _mm512_dpbf16_ps(acc[r][3], av, b3);
    }
}

/* y[r][0..PN) (+)= x row r . panel over K [k0, k), r < rows (<= PR), k0
 * even; with `add` the sums start from y's values (the AMX kernel's over
 * K's first elements), else from zero. x rows ldx apart (bf16), panel
 * [(k + 1) / 2][PN] u32, y [rows][PN] f32. An odd k ends with a lone
 * element, broadcast with a zero partner, so the element after it (which
 * may not exist) is never read. */
INLINE_ void tile(int rows, int64_t k0, int64_t k, const uint16_t *x, int64_t ldx, const uint32_t *panel, float *y,
                  bool add, pf_panel *pf) {
    __m512 acc[PR][4];
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = add ? _mm512_loadu_ps(y + r * PN + 16 * j) : _mm512_setzero_ps();
    int64_t kp = k / 2, s = ldx * 2;
    const char *q0 = (const char *)(x + k0), *q3 = q0 + 3 * s;
    for (int64_t p = k0 / 2; p < kp; p++, q0 += 4, q3 += 4) {
        pf_lines(pf);
        tile_step(acc, rows, q0, q3, s, panel + p * PN, false);
    }
    if (k & 1) tile_step(acc, rows, q0, q3, s, panel + kp * PN, true);
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(y + r * PN + 16 * j, acc[r][j]);
}

/* tile() with the row count (1..PR) a constant in each copy, so the
 * loops over rows unroll into registers. */
INLINE_ void tile_rows(int rows, int64_t k0, int64_t k, const uint16_t *x, int64_t ldx, const uint32_t *panel,
                       float *y, bool add, pf_panel *pf) {
    switch (rows) {
    case 1: tile(1, k0, k, x, ldx, panel, y, add, pf); break;
    case 2: tile(2, k0, k, x, ldx, panel, y, add, pf); break;
    case 3: tile(3, k0, k, x, ldx, panel, y, add, pf); break;
    case 4: tile(4, k0, k, x, ldx, panel, y, add, pf); break;
    case 5: tile(5, k0, k, x, ldx, panel, y, add, pf); break;
    default: tile(PR, k0, k, x, ldx, panel, y, add, pf); break;
    }
}

/* y[r][0..PN) = x row r . panel over k, r < rows (<= HR_GEMM_AMX_ROWS), on
 * the AMX kernel `amx`: K's whole blocks of 32 on the tiles, then the rest
 * on AVX-512 in groups of PR rows, from the tiles' sums. [pf, pf +
 * pf_len) is prefetched meanwhile. */
static TARGET_ void amx_rows(hr_gemm_amx_fn amx, int rows, int64_t k, const uint16_t *x, int64_t ldx,
                             const uint32_t *panel, float *y, const char *pf, size_t pf_len) {
    int64_t k32 = k / 32 * 32;
    amx(rows, k32, x, ldx, panel, y, pf, pf_len);
    if (k32 == k) return;
    pf_panel none = {0};
    for (int r = 0; r < rows; r += PR)
        tile_rows(rows - r < PR ? rows - r : PR, k32, k, x + r * ldx, ldx, panel, y + r * PN, true, &none);
}

/* Weight rows [0, nj) (nj <= PN, ldw apart) x K [0, kc) into panel
 * [(kc + 1) / 2][PN] u32: the pair p of row j at p * PN + j. Rows past nj
 * and the partner of an odd last element are zero. */
TARGET_ void hr_gemm_pack_panel(const uint16_t *w, int64_t ldw, int nj, int64_t kc, uint32_t *panel) {
    int64_t kp = (kc + 1) / 2;
    for (int g = 0; g < PN; g += 16) {
        for (int64_t h = 0; h < kp; h += 16) {
            int64_t left = kc - 2 * h; /* bf16 elements of this 32-wide strip */
            __mmask32 m = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1u);
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = g + i < nj ? _mm512_maskz_loadu_epi16(m, w + (g + i) * ldw + 2 * h) : _mm512_setzero_si512();
            hr_transpose16_u32(r);
            int np = kp - h < 16 ? (int)(kp - h) : 16;
            for (int i = 0; i < np; i++) _mm512_storeu_si512(panel + (h + i) * PN + g, r[i]);
        }
    }
}

/* C's rows at `r`.. (rows of them) and columns [j0, j0 + nj): y + bias. */
static TARGET_ void store_rows(const panel_ctx *ctx, int64_t r, int rows, int64_t j0, int nj, float *y,
                               const float *bias, bool simd) {
    const hr_gemm *g = ctx->g;
    size_t csz = hr_dtype_size(g->c.dt);
    for (int i = 0; i < rows; i++) {
        int64_t row = ctx->ldc >= 0 ? (r + i) * ctx->ldc : hr_gemm_row_offset(g, true, r + i);
        hr_gemm_store_row(g, g->c.base + (row + j0 * g->c.cs) * (int64_t)csz, y + i * PN, bias, nj, simd);
    }
}

pf_panel hr_gemm_panel_next_stream(const panel_ctx *ctx, int64_t next, int64_t steps) {
    const hr_gemm *g = ctx->g;
    pf_panel pf = {0};
    int64_t j1 = next * PN;
    /* One row group reads the panel once, in order: the hardware prefetcher
     * streams it best alone (measured at one row: 32 GF/s without these
     * prefetches, 20-27 with them, T0/T1/NTA alike). */
    if (next < 0 || j1 >= g->n || ctx->rows <= PR) return pf;
    size_t len;
    if (ctx->packed) {
        pf.p = (const char *)hr_gemm_panel_at(ctx->packed, g->k, next);
        len = hr_gemm_panel_bytes(g->k);
    } else if (g->b.cs == g->k) {
        pf.p = g->b.base + j1 * g->k * 2;
        len = (size_t)(g->n - j1 < PN ? g->n - j1 : PN) * (size_t)g->k * 2;
    } else {
        return pf; /* rows apart: too many streams to follow */
    }
    pf.end = pf.p + len;
    int64_t lines = (int64_t)(len + 63) / 64;
    int64_t window = PF_WINDOW * lines < steps ? PF_WINDOW * lines : steps;
    pf.wait = steps - window;
    pf.per_step = (lines + window - 1) / window;
    return pf;
}

/* Every row of C over weight rows [u * PN, u * PN + nj): each group of PR
 * rows over the unit's panel (packed into `scratch` first when B has no
 * panels), while unit `next`'s weights are prefetched. */
static TARGET_ void panel_unit(const panel_ctx *ctx, int64_t u, int64_t next, int nj, uint32_t *scratch,
                               int64_t r0, int64_t r1) {
    /* called with every row (row_chunk 0): the tiles below start at row 0 */
    (void)r0, (void)r1;
    const hr_gemm *g = ctx->g;
    int64_t j0 = u * PN;
    const uint32_t *panel = scratch;
    if (ctx->packed)
        panel = hr_gemm_panel_at(ctx->packed, g->k, u);
    else
        hr_gemm_pack_panel((const uint16_t *)g->b.base + j0 * g->b.cs, g->b.cs, nj, g->k, scratch);
    float bias[PN], y[HR_GEMM_AMX_ROWS * PN];
    if (g->bias) hr_load_f32(bias, g->bias + j0 * g->bias_s * (int64_t)hr_dtype_size(g->bias_dt), g->bias_dt, nj,
                             g->bias_s);
    bool simd = hr_k_simd();
    if (ctx->amx) {
        /* each block of rows prefetches its share of the next unit's panel */
        pf_panel next_pf = hr_gemm_panel_next_stream(ctx, next, 1);
        size_t len = (size_t)(next_pf.end - next_pf.p);
        int64_t blocks = (ctx->rows + HR_GEMM_AMX_ROWS - 1) / HR_GEMM_AMX_ROWS;
        for (int64_t r = 0, i = 0; r < ctx->rows; r += HR_GEMM_AMX_ROWS, i++) {
            int rows = ctx->rows - r < HR_GEMM_AMX_ROWS ? (int)(ctx->rows - r) : HR_GEMM_AMX_ROWS;
            size_t b0 = len * (size_t)i / (size_t)blocks, b1 = len * (size_t)(i + 1) / (size_t)blocks;
            amx_rows(ctx->amx, rows, g->k, ctx->x + r * ctx->ldx, ctx->ldx, panel, y,
                     next_pf.p ? next_pf.p + b0 : NULL, b1 - b0);
            store_rows(ctx, r, rows, j0, nj, y, g->bias ? bias : NULL, simd);
        }
        return;
    }
    pf_panel pf = hr_gemm_panel_next_stream(ctx, next, (ctx->rows + PR - 1) / PR * (g->k / 2 > 0 ? g->k / 2 : 1));
    for (int64_t r = 0; r < ctx->rows; r += PR) {
        const uint16_t *xr = ctx->x + r * ctx->ldx;
        int rows = ctx->rows - r < PR ? (int)(ctx->rows - r) : PR;
        tile_rows(rows, 0, g->k, xr, ctx->ldx, panel, y, false, &pf);
        store_rows(ctx, r, rows, j0, nj, y, g->bias ? bias : NULL, simd);
    }
}

TARGET_ void hr_gemm_panel_rows(hr_gemm_amx_fn amx, int rows, int64_t k, const uint16_t *x, int64_t ldx,
                                const uint32_t *panel, float *y) {
    if (amx) {
        amx_rows(amx, rows, k, x, ldx, panel, y, NULL, 0);
        return;
    }
    pf_panel none = {0};
    tile_rows(rows, 0, k, x, ldx, panel, y, false, &none);
}

size_t hr_gemm_panel_bytes(int64_t k) { return (size_t)((k + 1) / 2) * PN * 4; }

/* Task ith's items (its own segment forward, then the others' leftovers
 * from their backs), each run with the next item's unit prefetched: the
 * next one in the direction the task claims. */
static void panel_worker(void *arg, int ith, int nth) {
    panel_ctx *ctx = arg;
    const hr_gemm *g = ctx->g;
    int64_t ch = ctx->chunks;
    uint32_t *scratch = NULL;
    int seg = 0;
    for (int64_t i; (i = hr_claims_next(&ctx->claims, ith, nth, &seg)) >= 0;) {
        if (!ctx->packed && !scratch && !(scratch = hr_gemm_thread_scratch(hr_gemm_panel_bytes(g->k)))) {
            atomic_store(&ctx->failed, 1);
            return;
        }
        int64_t dir = seg == 0 ? 1 : -1, u = i / ch, c = i % ch, r0 = c * ctx->row_chunk;
        int64_t r1 = ch == 1 ? ctx->rows : r0 + ctx->row_chunk;
        /* the next item's unit, unless it is this one (its panel is here) */
        int64_t next = (i + dir) / ch == u ? -1 : u + dir;
        ctx->unit(ctx, u, next, g->n - u * PN < PN ? (int)(g->n - u * PN) : PN, scratch, r0,
                  r1 < ctx->rows ? r1 : ctx->rows);
    }
}

hr_status hr_gemm_panel_run(const hr_gemm *g, int64_t rows, const uint16_t *x, int64_t ldx) {
    panel_ctx ctx = {.g = g, .unit = panel_unit, .x = x, .ldx = ldx, .rows = rows, .packed = g->b_panels,
                     .amx = hr_gemm_amx_kernel()};
    return hr_gemm_panel_dispatch(&ctx);
}

hr_status hr_gemm_panel_dispatch(panel_ctx *ctx) {
    const hr_gemm *g = ctx->g;
    /* C's rows evenly spaced (a linear's output): each row's offset without
     * the batch walk, which every row of every unit would repeat */
    if (!hr_gemm_rows_even(g, true, ctx->row0 + ctx->rows, &ctx->ldc)) ctx->ldc = -1;
    ctx->units = (g->n + PN - 1) / PN;
    bool chunked = ctx->row_chunk > 0 && ctx->row_chunk < ctx->rows;
    ctx->chunks = chunked ? (ctx->rows + ctx->row_chunk - 1) / ctx->row_chunk : 1;
    int64_t items = ctx->units * ctx->chunks;
    atomic_init(&ctx->failed, 0);
    int64_t tasks = hr_parallel_threads_for(ctx->rows * g->n * g->k, HR_GRAIN_MATMUL);
    if (tasks > items) tasks = items;
    if (tasks > HR_CLAIMS_MAX) tasks = HR_CLAIMS_MAX;
    if (tasks < 1) tasks = 1;
    hr_claims_init(&ctx->claims, items, (int)tasks);
    hr_parallel_run(panel_worker, ctx, (int)tasks);
    if (atomic_load(&ctx->failed)) return hr_error(HR_ERR_OOM, "gemm: out of memory for weight panels");
    return HR_OK;
}
