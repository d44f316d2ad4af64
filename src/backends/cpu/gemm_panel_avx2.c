/* The panel route on AVX2 + FMA (no AVX-512): bf16 A against the K-pair
 * panels of a weight packed at load, the same bytes the AVX-512 and AMX
 * kernels read (gemm.h's layout, made here too when the CPU has no
 * AVX-512: hr_gemm_pack_panel_avx2).
 *
 * AVX2 has no bf16 dot product, so the pairs are split instead: a panel
 * vector holds eight columns' (even, odd) bf16 pairs, and the even
 * elements are its u32 lanes shifted left by 16, the odd ones the lanes
 * shifted right by 16 and back: three shifts per sixteen f32 products,
 * where widening packed bf16 takes a lane-crossing shuffle per eight. A's
 * rows are widened to f32 once per call (in passes of X32_ROWS), so a tile
 * broadcasts x[r][2p] against the even vectors and x[r][2p + 1] against
 * the odd ones with plain loads.
 *
 * Tiles (16 ymm registers): six rows x 16 columns (12 accumulators, two
 * panel vectors, one broadcast), four per panel; two rows x 32; one row x
 * all 64, so a lone row reads each 256-byte panel row whole, in order, as
 * it streams from memory. From WIDE_MIN_ROWS rows, the panel is widened
 * to f32 once per K block and pass instead (wide_rows). Every output's
 * sum is the same chain whatever the tile: per K pair, even product then
 * odd product, fused multiply-adds in K order, the lone last element of an
 * odd K after them, so a row has the same bits in a batch of 1 or of 500,
 * and the fused linear node (hr_gemm_panel_rows_avx2) gives the route's
 * bits.
 *
 * f16 weights (with f16 activations) take panels of the same size, each
 * pair row's even halves before its odd ones (gemm.h), widened by F16C
 * eight at a time (pair_f32); the rest is the bf16 code. */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_panel.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"

#define PN HR_GEMM_PANEL_N
#define INLINE_ static inline __attribute__((always_inline))

/* Columns [col, col + 8) of a panel's pair row `row`, their even (odd:
 * odd) elements, as f32. bf16 pairs: the even element shifted up into its
 * lane's high half is its f32; the odd one is cleared of its partner by a
 * shift right and back, which needs no mask register (the six-row tile
 * uses all sixteen). f16 panels hold each pair row's 64 even halves, then
 * its 64 odd ones (gemm.h): eight of them are one F16C conversion. */
INLINE_ __m256 pair_f32(const uint32_t *row, int col, bool odd, bool f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + (odd ? PN : 0) + col)));
    __m256i raw = _mm256_loadu_si256((const __m256i *)(row + col));
    return _mm256_castsi256_ps(_mm256_slli_epi32(odd ? _mm256_srli_epi32(raw, 16) : raw, 16));
}

/* acc[r][v] += x[r] . panel columns [c0 + 8v, c0 + 8v + 8) of pair row
 * `row` (pair p), v < NV; `lone` takes the even element only. Converted
 * four panel vectors at a time, so the one-row tile keeps 8 accumulators,
 * 4 panel vectors and the broadcast in registers. */
INLINE_ void pair_step(int R, int NV, __m256 acc[6][8], const float *x, int64_t ldx, int64_t p, const uint32_t *row,
                       int c0, bool lone, bool f16) {
    for (int half = 0; half < 2; half++) {
        if (half && lone) break;
        for (int v0 = 0; v0 < NV; v0 += 4) {
            int nv = NV - v0 < 4 ? NV - v0 : 4;
            __m256 w[4];
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) w[v] = pair_f32(row, c0 + 8 * (v0 + v), half, f16);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                __m256 xv = _mm256_broadcast_ss(x + r * ldx + 2 * p + half);
#pragma GCC unroll 4
                for (int v = 0; v < nv; v++) acc[r][v0 + v] = _mm256_fmadd_ps(xv, w[v], acc[r][v0 + v]);
            }
        }
    }
}

/* A lone row reads its panel as one stream at a few FLOP per byte, so the
 * core's out-of-order window holds only a few lines of loads ahead of the
 * math; fetching the pair ROW_AHEAD rows on (1 KB) keeps more misses in
 * flight. Packed Qwen3 shapes, one row, calls with and without alternated
 * in one process, cold weights: 5-16% more GB/s at 2-6 pairs ahead on one
 * thread and two, 4 best; 8 and more gained less. Past the panel's end it
 * reads the next unit's or nothing (a prefetch never faults). */
#define ROW_AHEAD 4

/* The address is formed as an integer: past the last unit's panel it
 * points outside the allocation, which C pointer arithmetic may not. */
INLINE_ void pf_ahead(const uint32_t *panel, int64_t p) {
    uintptr_t b = (uintptr_t)panel + (uintptr_t)((p + ROW_AHEAD) * PN * 4);
    for (int l = 0; l < PN * 4; l += 64) _mm_prefetch((const char *)(b + (uintptr_t)l), _MM_HINT_T0);
}

/* y[r][c0 .. c0 + 8 NV) (+)= x row r . panel columns [c0, c0 + 8 NV) over
 * the K pairs [p0, p1), then K's lone last element when `lone`, r < R; with
 * `add` the sums start from y's (the K blocks before), else from zero. x
 * rows ldx apart (f32), y rows PN apart. */
INLINE_ void tile(int R, int NV, int64_t p0, int64_t p1, bool lone, const float *x, int64_t ldx,
                  const uint32_t *panel, int c0, float *y, bool add, pf_panel *pf, bool f16) {
    __m256 acc[6][8];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[r][v] = add ? _mm256_loadu_ps(y + r * PN + c0 + 8 * v) : _mm256_setzero_ps();
    for (int64_t p = p0; p < p1; p++) {
        pf_lines(pf);
        if (R == 1) pf_ahead(panel, p);
        pair_step(R, NV, acc, x, ldx, p, panel + p * PN, c0, false, f16);
    }
    if (lone) pair_step(R, NV, acc, x, ldx, p1, panel + p1 * PN, c0, true, f16);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(y + r * PN + c0 + 8 * v, acc[r][v]);
}

/* K pairs per block: six f32 rows of a block (6 KB) and a quarter panel's
 * block (8 KB) stay in L1 while the four quarters pass over them. */
#define KB 128

/* y[r][0..64) = x row r . panel over k for r < rows (1..6), in the tiles
 * for that row count (each a constant in its copy, so the loops unroll),
 * K block by block. */
INLINE_ void tile_rows_of(int rows, int64_t k, const float *x, int64_t ldx, const uint32_t *panel, float *y,
                          pf_panel *pf, bool f16) {
    int64_t kp = k / 2;
    for (int64_t p0 = 0; p0 < kp || (p0 == 0 && (k & 1)); p0 += KB) {
        int64_t p1 = kp - p0 < KB ? kp : p0 + KB;
        bool lone = p1 == kp && (k & 1), add = p0 > 0;
        switch (rows) {
        case 1: tile(1, 8, p0, p1, lone, x, ldx, panel, 0, y, add, pf, f16); continue;
        case 2:
            for (int c0 = 0; c0 < PN; c0 += 32) tile(2, 4, p0, p1, lone, x, ldx, panel, c0, y, add, pf, f16);
            continue;
        default: break;
        }
        for (int c0 = 0; c0 < PN; c0 += 16) switch (rows) {
            case 3: tile(3, 2, p0, p1, lone, x, ldx, panel, c0, y, add, pf, f16); break;
            case 4: tile(4, 2, p0, p1, lone, x, ldx, panel, c0, y, add, pf, f16); break;
            case 5: tile(5, 2, p0, p1, lone, x, ldx, panel, c0, y, add, pf, f16); break;
            default: tile(6, 2, p0, p1, lone, x, ldx, panel, c0, y, add, pf, f16); break;
            }
    }
}

/* tile_rows_of with the weights' type a constant in each copy. */
static void tile_rows(int rows, int64_t k, const float *x, int64_t ldx, const uint32_t *panel, float *y,
                      pf_panel *pf, bool f16) {
    if (f16)
        tile_rows_of(rows, k, x, ldx, panel, y, pf, true);
    else
        tile_rows_of(rows, k, x, ldx, panel, y, pf, false);
}

/* The widened form, for many rows: each K block of the panel is widened to
 * f32 once per pass, per quarter of 16 columns ([pair][even, odd][16]),
 * and every group of six rows goes over it with plain loads, where the
 * bf16 tiles split each panel vector again for every group (three shifts
 * beside its twelve FMAs). A's rows come in groups of six interleaved
 * ([K][6]), so a tile's broadcasts walk one stream. Same products, same
 * chain per output: the bits of the bf16 tiles. */
#define WQ (PN / 4) /* columns per quarter */

/* acc[r] += x[r] * (w0, w1), the 16 weights of one K element, r < R. */
INLINE_ void wide_fma(int R, __m256 acc[6][2], const float *x, __m256 w0, __m256 w1) {
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        __m256 xv = _mm256_broadcast_ss(x + r);
        acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
    }
}

/* acc[r] += x[r] * the 16 widened weights at w, r < R. */
INLINE_ void wide_step(int R, __m256 acc[6][2], const float *x, const float *w) {
    wide_fma(R, acc, x, _mm256_load_ps(w), _mm256_load_ps(w + 8));
}

/* One element of a quarter's K pair (`odd` or even; the lone last
 * element of an odd K is an even one): its 16 columns (pair row `row`,
 * columns [col, col + 16)) converted from the panel by pair_f32, stored
 * widened at w for the groups after, and multiplied into the first
 * group's sums. */
INLINE_ void widen_half(int R, __m256 acc[6][2], const float *x, const uint32_t *row, int col, bool odd, float *w,
                        bool f16) {
    __m256 w0 = pair_f32(row, col, odd, f16), w1 = pair_f32(row, col + 8, odd, f16);
    _mm256_store_ps(w, w0);
    _mm256_store_ps(w + 8, w1);
    wide_fma(R, acc, x, w0, w1);
}

/* A quarter's K pair, even elements then odd ones, stored widened at w
 * (evens, then odds WQ on; x: the pair's two elements of each row,
 * interleaved). For bf16, the odd element is the u32 with its low half
 * cleared, taken as raw ^ (even >> 16): one shift and an XOR where
 * pair_f32's shift pair takes two shifts (the same bits), and with no mask
 * register, which left GCC spilling sums. */
INLINE_ void widen_pair(int R, __m256 acc[6][2], const float *x, const uint32_t *row, int col, float *w, bool f16) {
    if (f16) {
        widen_half(R, acc, x, row, col, false, w, true);
        widen_half(R, acc, x + R, row, col, true, w + WQ, true);
        return;
    }
    __m256i e0 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(row + col)), 16);
    __m256i e1 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(row + col + 8)), 16);
    _mm256_store_si256((__m256i *)w, e0);
    _mm256_store_si256((__m256i *)(w + 8), e1);
    wide_fma(R, acc, x, _mm256_castsi256_ps(e0), _mm256_castsi256_ps(e1));
    __m256i o0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + col)), _mm256_srli_epi32(e0, 16));
    __m256i o1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + col + 8)), _mm256_srli_epi32(e1, 16));
    _mm256_store_si256((__m256i *)(w + WQ), o0);
    _mm256_store_si256((__m256i *)(w + WQ + 8), o1);
    wide_fma(R, acc, x + R, _mm256_castsi256_ps(o0), _mm256_castsi256_ps(o1));
}

/* acc (R rows x 16 columns) over the widened quarter w's pairs [0, np),
 * then its pair np's even element when `lone`; x: the group's R rows
 * interleaved ([K][R]) from the block's first pair; y rows PN apart. The
 * first group (`panel` not NULL: the block's first pair row, quarter at
 * column q0) widens the quarter into w as it goes, from the registers its
 * own products use: a separate widening pass stored every vector before
 * any tile read it, apart from the FMAs (5-7% of a 64-row linear, perf),
 * where here the conversions and stores fill slots beside them. The
 * widening group still takes ~1.4x a plain group's time (perf; fewer
 * shifts did not change it). Qwen3 shapes, packed, cold, alternated with
 * the separate pass: 16 rows on 2 threads 7-10% more GF/s, 64 rows within
 * this machine's noise (best of 9: 73-80 against 75-80 GF/s, one thread). */
INLINE_ void tile_wide(int R, int64_t np, bool lone, const float *x, float *w, float *y, bool add,
                       const uint32_t *panel, int q0, bool f16) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 2; v++) acc[r][v] = add ? _mm256_loadu_ps(y + r * PN + 8 * v) : _mm256_setzero_ps();
    if (panel) {
        for (int64_t p = 0; p < np; p++) widen_pair(R, acc, x + 2 * p * R, panel + p * PN, q0, w + p * 2 * WQ, f16);
        if (lone) widen_half(R, acc, x + 2 * np * R, panel + np * PN, q0, false, w + np * 2 * WQ, f16);
    } else {
        for (int64_t p = 0; p < np; p++) {
            wide_step(R, acc, x + 2 * p * R, w + p * 2 * WQ);
            wide_step(R, acc, x + (2 * p + 1) * R, w + p * 2 * WQ + WQ);
        }
        if (lone) wide_step(R, acc, x + 2 * np * R, w + np * 2 * WQ);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 2; v++) _mm256_storeu_ps(y + r * PN + 8 * v, acc[r][v]);
}

/* Each form of the tile its own function: inlined together into one, GCC
 * allocated the copies' registers jointly and spilled sums in the hot loop
 * for some mixes of copies (half the speed). The call costs nothing
 * beside a tile's K block of FMAs. */
typedef void (*wide_tile_fn)(int64_t np, bool lone, const float *x, float *w, float *y, bool add);
typedef void (*widen_tile_fn)(int64_t np, bool lone, const float *x, const uint32_t *panel, int q0, float *w,
                              float *y, bool add);
#define NOINLINE_ static __attribute__((noinline))
#define WIDE_TILE(R)                                                                                            \
    NOINLINE_ void tile_wide_##R(int64_t np, bool lone, const float *x, float *w, float *y, bool add) {       \
        tile_wide(R, np, lone, x, w, y, add, NULL, 0, false);                                                  \
    }
WIDE_TILE(1)
WIDE_TILE(2)
WIDE_TILE(3)
WIDE_TILE(4)
WIDE_TILE(5)
WIDE_TILE(6)
static const wide_tile_fn wide_tiles[7] = {NULL, tile_wide_1, tile_wide_2, tile_wide_3, tile_wide_4, tile_wide_5,
                                           tile_wide_6};

/* The widening first group: six rows (the widened form runs from
 * WIDE_MIN_ROWS rows), per weight type. */
NOINLINE_ void tile_widen_bf16(int64_t np, bool lone, const float *x, const uint32_t *panel, int q0, float *w,
                               float *y, bool add) {
    tile_wide(6, np, lone, x, w, y, add, panel, q0, false);
}
NOINLINE_ void tile_widen_f16(int64_t np, bool lone, const float *x, const uint32_t *panel, int q0, float *w,
                              float *y, bool add) {
    tile_wide(6, np, lone, x, w, y, add, panel, q0, true);
}

/* Rows of C per widened pass: their 64 sums stay on the stack (24 KB). */
#define WIDE_ROWS 96
/* Rows from which the widened form pays: its passes share each widening
 * (three shifts and two stores per panel vector) among rows / 6 groups.
 * One thread, Qwen3 shapes, calls of both forms alternated in one process
 * (cold weights), widened against the bf16 tiles: 8-10 rows 6-11% slower,
 * 12-14 rows -13% to +10% by shape, 16 rows 3-10% faster, 20 rows 8-10%,
 * 32 rows 6-18%, 48 rows 16%. (Before its prefetches left the tiles'
 * loop, the widened form broke even only from 30-48 rows.) */
#define WIDE_MIN_ROWS 16
_Static_assert(WIDE_MIN_ROWS >= 6, "the widened form's first group widens with six rows");

static bool wide_form(int64_t rows) { return rows >= WIDE_MIN_ROWS; }

/* y[r][0..64) = x row r . panel over k for r < rows (<= WIDE_ROWS), K block
 * by block, each widened once; x: A's rows in groups of six, each group
 * interleaved ([K][6], the last [K][rows % 6]), so a tile's broadcasts
 * walk one contiguous stream. */
static void wide_rows(int64_t rows, int64_t k, const float *x, const uint32_t *panel, float *y, pf_panel *pf,
                      bool f16) {
    _Alignas(32) float wide[(KB + 1) * 2 * WQ];
    widen_tile_fn widen = f16 ? tile_widen_f16 : tile_widen_bf16;
    int64_t kp = k / 2;
    for (int64_t p0 = 0; p0 < kp || (p0 == 0 && (k & 1)); p0 += KB) {
        int64_t p1 = kp - p0 < KB ? kp : p0 + KB, np = p1 - p0;
        bool lone = p1 == kp && (k & 1), add = p0 > 0;
        for (int q = 0; q < 4; q++) {
            /* the first group widens the quarter's block for the rest */
            pf_lines(pf);
            widen(np, lone, x + 2 * p0 * 6, panel + p0 * PN, q * WQ, wide, y + q * WQ, add);
            for (int64_t r = 6; r < rows; r += 6) {
                int64_t R = rows - r < 6 ? rows - r : 6;
                pf_lines(pf);
                wide_tiles[R](np, lone, x + r * k + 2 * p0 * R, wide, y + r * PN + q * WQ, add);
            }
        }
    }
}

void hr_gemm_panel_rows_avx2(int rows, int64_t k, const float *x, int64_t ldx, const uint32_t *panel, float *y,
                             bool f16) {
    pf_panel none = {0};
    tile_rows(rows, k, x, ldx, panel, y, &none, f16);
}

/* K steps of the bf16 tiles over a unit's panel for `rows` rows: the
 * prefetch of the next unit spreads over them. */
static int64_t unit_steps(int64_t rows, int64_t k) {
    int64_t groups = (rows + 5) / 6, per_group = rows == 1 ? 1 : rows == 2 ? 2 : 4;
    return groups * per_group * (k / 2 > 0 ? k / 2 : 1);
}

/* Tile calls of the widened form for `rows` rows (one group of six over
 * one quarter's K block each). */
static int64_t wide_calls(int64_t rows, int64_t k) {
    int64_t blocks = (k / 2 + KB - 1) / KB;
    return (rows + 5) / 6 * 4 * (blocks > 0 ? blocks : 1);
}

/* The widened form's prefetch of the next unit: a few lines before each
 * tile call, none inside the tiles' loop, where the prefetches and their
 * test slowed the FMAs more than they saved (Qwen3-0.6B shape, 2 threads,
 * alternated runs: batch-64 decode 80-85 -> 98-103 tok/s, prefill of 512
 * 107-109 -> 115-127). At 16 rows and K = 1024 that is 48 calls and 43
 * lines before each, a burst the bf16 tiles' per-K-step prefetch avoids,
 * and still faster than them (WIDE_MIN_ROWS). With several passes the
 * lines are fetched from the first on; spreading them over the last pass
 * only, so that they do not wait in L2 under the earlier passes' x rows,
 * measured no better (prefill of 512, three alternated runs: 115-142
 * tok/s as here, 119-135 so). */
static pf_panel wide_prefetch(const panel_ctx *ctx, int64_t next, int64_t rows) {
    return hr_gemm_panel_next_stream(ctx, next, wide_calls(rows, ctx->g->k));
}

/* C's rows [r, r + rows) of the unit from their sums y (rows PN apart). */
static void store_rows(const panel_ctx *ctx, int64_t r, int64_t rows, int64_t j0, int nj, float *y, const float *bias,
                       bool simd) {
    const hr_gemm *g = ctx->g;
    size_t csz = hr_dtype_size(g->c.dt);
    for (int64_t i = 0; i < rows; i++) {
        float *yi = y + i * PN;
        if (bias)
            for (int c = 0; c < nj; c++) yi[c] += bias[c];
        int64_t ri = ctx->row0 + r + i, row = ctx->ldc >= 0 ? ri * ctx->ldc : hr_gemm_row_offset(g, true, ri);
        hr_k_store_f32(g->c.base + (row + j0 * g->c.cs) * (int64_t)csz, g->c.dt, yi, nj, g->c.cs, simd);
    }
}

static void avx2_unit(const panel_ctx *ctx, int64_t u, int64_t next, int nj, uint32_t *scratch, int64_t r0,
                      int64_t r1) {
    (void)scratch;
    const hr_gemm *g = ctx->g;
    int64_t j0 = u * PN;
    const uint32_t *panel = hr_gemm_panel_at(ctx->packed, g->k, u);
    float bias[PN];
    if (g->bias) hr_load_f32(bias, g->bias + j0 * g->bias_s * (int64_t)hr_dtype_size(g->bias_dt), g->bias_dt, nj,
                             g->bias_s);
    bool simd = hr_k_simd(), f16 = g->b.dt == HR_F16;
    const float *b = g->bias ? bias : NULL;
    if (wide_form(ctx->rows)) { /* x32 is grouped for all of them; r0 starts a group */
        float y[WIDE_ROWS * PN];
        /* passes of whole groups: x's groups start at multiples of six rows */
        int64_t n = r1 - r0, passes = (n + WIDE_ROWS - 1) / WIDE_ROWS;
        int64_t per = ((n + passes - 1) / passes + 5) / 6 * 6;
        pf_panel pf = wide_prefetch(ctx, next, n);
        for (int64_t r = r0; r < r1; r += per) {
            int64_t rows = r1 - r < per ? r1 - r : per;
            wide_rows(rows, g->k, ctx->x32 + r * g->k, panel, y, &pf, f16);
            store_rows(ctx, r, rows, j0, nj, y, b, simd);
        }
        return;
    }
    float y[6 * PN];
    pf_panel pf = hr_gemm_panel_next_stream(ctx, next, unit_steps(r1 - r0, g->k));
    for (int64_t r = r0; r < r1; r += 6) {
        int rows = r1 - r < 6 ? (int)(r1 - r) : 6;
        tile_rows(rows, g->k, ctx->x32 + r * ctx->ldx, ctx->ldx, panel, y, &pf, f16);
        store_rows(ctx, r, rows, j0, nj, y, b, simd);
    }
}

/* Rows per work item when a linear has too few units to share evenly:
 * with N = 192 (SmolLM2's k/v_proj, three units) two threads split 2:1.
 * Chunks of whole groups of six, each widening the panel again, so no
 * fewer than CHUNK_MIN_ROWS rows; enough chunks for about ITEMS_PER_TASK
 * items per thread. The same sums, whatever the chunks. SmolLM2 shapes,
 * packed, 2 threads, alternated with whole units, best of 9: k/v_proj at
 * 512 rows 93-109 -> 126-130 GF/s, at 64 rows 56-90 -> 72-95. */
#define CHUNK_MIN_ROWS 32
#define ITEMS_PER_TASK 8

static int64_t row_chunk(int64_t rows, int64_t n, int64_t k) {
    int tasks = hr_parallel_threads_for(rows * n * k, HR_GRAIN_MATMUL); /* as hr_gemm_panel_dispatch counts */
    int64_t units = (n + PN - 1) / PN, want = (int64_t)tasks * ITEMS_PER_TASK;
    if (tasks < 2 || !wide_form(rows) || units >= want) return 0;
    int64_t chunks = (want + units - 1) / units, most = rows / CHUNK_MIN_ROWS;
    if (chunks > most) chunks = most;
    if (chunks <= 1) return 0;
    return ((rows + chunks - 1) / chunks + 5) / 6 * 6;
}

/* Rows of A widened per pass: the f32 copy of x stays bounded (16 MiB at
 * K = 8192) at any prompt length; each pass streams the weights again,
 * which at 512 rows costs a few percent of the pass's math. */
#define X32_ROWS 512

/* A's rows [r0, r0 + n) as f32 into x32: row-major (ldx = k), or in
 * groups of six interleaved for the widened form; split over the pool by
 * groups. */
typedef struct {
    const hr_gemm *g;
    float *x32;
    int64_t r0, n;
    bool grouped;
} widen_job;

/* Elements of a row widened per step of the interleave: six rows' runs
 * (6 KB) stay in L1 while they are woven. */
#define XC 256

static void widen_row(const hr_gemm *g, int64_t r, int64_t i0, int64_t len, float *dst) {
    hr_gemm_load_f32(dst, g->a.base + (hr_gemm_row_offset(g, false, r) + i0 * g->a.cs) * 2, g->a.dt, len, g->a.cs,
                     true);
}

static void widen_task(void *arg, int ith, int nth) {
    const widen_job *j = arg;
    int64_t k = j->g->k, b, e;
    hr_split_range((j->n + 5) / 6, ith, nth, &b, &e);
    for (int64_t r6 = 6 * b; r6 < 6 * e && r6 < j->n; r6 += 6) {
        int64_t R = j->n - r6 < 6 ? j->n - r6 : 6;
        if (!j->grouped) {
            for (int64_t r = 0; r < R; r++) widen_row(j->g, j->r0 + r6 + r, 0, k, j->x32 + (r6 + r) * k);
            continue;
        }
        float run[6][XC], *grp = j->x32 + r6 * k;
        for (int64_t i0 = 0; i0 < k; i0 += XC) {
            int64_t len = k - i0 < XC ? k - i0 : XC;
            for (int64_t r = 0; r < R; r++) widen_row(j->g, j->r0 + r6 + r, i0, len, run[r]);
            for (int64_t i = 0; i < len; i++)
                for (int64_t r = 0; r < R; r++) grp[(i0 + i) * R + r] = run[r][i];
        }
    }
}

hr_status hr_gemm_panel_run_avx2(const hr_gemm *g, int64_t rows) {
    int64_t chunk = rows < X32_ROWS ? rows : X32_ROWS, k = g->k;
    /* A's rows widened into the caller's scratch (the unit reads packed
     * panels only, so no task asks for its own) */
    float *x32 = hr_gemm_thread_scratch((size_t)chunk * (size_t)k * 4);
    if (!x32)
        return hr_error(HR_ERR_OOM, "gemm: out of memory for %lld x %lld activations", (long long)chunk,
                        (long long)k);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        widen_job job = {.g = g, .x32 = x32, .r0 = r0, .n = n, .grouped = wide_form(n)};
        int tasks = hr_parallel_threads_for(n * k, HR_GRAIN_ELTWISE);
        if (tasks > (n + 5) / 6) tasks = (int)((n + 5) / 6);
        hr_parallel_run(widen_task, &job, tasks);
        panel_ctx ctx = {.g = g, .unit = avx2_unit, .x32 = x32, .ldx = k, .row0 = r0, .rows = n,
                         .packed = g->b_panels, .row_chunk = row_chunk(n, g->n, k)};
        hr_status st = hr_gemm_panel_dispatch(&ctx);
        if (st != HR_OK) return st;
    }
    return HR_OK;
}

void hr_gemm_pack_panel_avx2(const uint16_t *w, int64_t ldw, int nj, int64_t kc, uint32_t *panel) {
    int64_t full = kc / 2, kp = (kc + 1) / 2;
    memset(panel, 0, (size_t)kp * PN * 4);
    int g = 0;
    /* eight weight rows at a time: 8 x 8 u32 register transposes */
    for (; g + 8 <= nj; g += 8) hr_gemm_transpose8_avx2((const char *)(w + g * ldw), ldw * 2, full, panel + g, PN);
    for (int j = g; j < nj; j++)
        for (int64_t p = 0; p < full; p++) memcpy(panel + p * PN + j, w + j * ldw + 2 * p, 4);
    if (kc & 1)
        for (int j = 0; j < nj; j++) panel[full * PN + j] = w[j * ldw + kc - 1]; /* zero partner */
}

void hr_gemm_panel_split_f16(uint32_t *panel, int64_t kc) {
    for (int64_t p = 0; p < (kc + 1) / 2; p++) {
        uint32_t pairs[PN], *row = panel + p * PN;
        memcpy(pairs, row, sizeof pairs);
        uint16_t *h = (uint16_t *)row;
        for (int j = 0; j < PN; j++) h[j] = (uint16_t)pairs[j], h[PN + j] = (uint16_t)(pairs[j] >> 16);
    }
}
