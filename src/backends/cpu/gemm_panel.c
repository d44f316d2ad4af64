/* The panel route: many rows of bf16 A (prefill) against a K-contiguous
 * bf16 B (x @ W^T), on AVX-512 BF16.
 *
 * The skinny route (gemm_skinny.c) reads the weights in place in
 * dot-product form, which ends every (row, weight row, K block) with a
 * horizontal reduction: about three shuffles or adds per 32 vdpbf16ps at
 * K = 1024, most of what keeps it near 90% of peak. Here each block of PN
 * weight rows is transposed once per call, over all of K, into a K-pair
 * panel [K/2][PN] (16 x 16 u32 register transposes; it stays in L2), and
 * every row of A goes over it in outer-product form: a 6 x 64 tile
 * broadcasts one bf16 pair of a row against four panel vectors, with no
 * reduction, its sums in registers from the first K to the last. The
 * transposes cost about 0.25 shuffles per weight pair against rows / 16
 * vdpbf16ps, so they pay only with many rows (HR_GEMM_PANEL_MIN_ROWS). */
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/transpose_avx512.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE_ static inline __attribute__((always_inline)) TARGET_

/* Weight rows per panel (four zmm of sums per row of A), rows of A per
 * tile (6 x 4 accumulators + 4 panel vectors fit the 32 zmm registers). */
#define PN 64
#define PR 6
/* Tasks per pool thread, each of at least P_TASK_MIN_UNITS panels' worth
 * of weight rows, so that a slowed thread leaves work to the others. */
#define P_TASKS_PER_THREAD 4
#define P_TASK_MIN_UNITS 2

typedef struct panel_ctx {
    const hr_gemm *g;
    const uint16_t *x; /* row r of A at x + r * ldx */
    int64_t ldx, rows;
    int64_t units; /* of PN weight rows */
    atomic_int failed;
} panel_ctx;

/* A pair of bf16 at p as one u32 (unaligned). */
INLINE_ uint32_t pair_at(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One K pair (the lone last element when `lone`) of every row against the
 * panel's four vectors at b. */
INLINE_ void tile_step(__m512 acc[PR][4], int rows, const uint16_t *x, int64_t ldx, const uint32_t *b,
                       int64_t p, bool lone) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
    __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + 32), b3 = (__m512bh)_mm512_loadu_si512(b + 48);
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) {
        uint32_t v = lone ? x[r * ldx + 2 * p] : pair_at(x + r * ldx + 2 * p);
        __m512bh a = (__m512bh)_mm512_set1_epi32((int)v);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, b2);
        acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, b3);
    }
}

/* y[r][0..PN) = x row r . panel over k elements, r < rows (<= PR).
 * x rows ldx apart (bf16), panel [(k + 1) / 2][PN] u32, y [rows][PN] f32.
 * An odd k ends with a lone element, broadcast with a zero partner, so the
 * element after it (which may not exist) is never read. */
INLINE_ void tile(int rows, int64_t k, const uint16_t *x, int64_t ldx, const uint32_t *panel, float *y) {
    __m512 acc[PR][4];
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    int64_t kp = k / 2;
    for (int64_t p = 0; p < kp; p++) tile_step(acc, rows, x, ldx, panel + p * PN, p, false);
    if (k & 1) tile_step(acc, rows, x, ldx, panel + kp * PN, kp, true);
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(y + r * PN + 16 * j, acc[r][j]);
}

/* The weight lines the next panel packs, prefetched a few per row group
 * while this panel is in use: packing reads PN rows at once, too many
 * streams for the hardware prefetcher, and its loads would otherwise wait
 * on memory. Rows of `len` bytes, ld bytes apart. */
typedef struct pf_panel {
    const char *row;    /* row being prefetched; NULL when done */
    int64_t off, len, ld;
    int rows_left;      /* after this one */
    int per_group;      /* lines per row group */
} pf_panel;

INLINE_ void pf_lines(pf_panel *pf) {
    for (int i = 0; i < pf->per_group && pf->row; i++) {
        _mm_prefetch(pf->row + pf->off, _MM_HINT_T1);
        pf->off += 64;
        if (pf->off >= pf->len) {
            pf->off = 0;
            pf->row = pf->rows_left-- > 0 ? pf->row + pf->ld : NULL;
        }
    }
}

/* Weight rows [0, nj) (nj <= PN, ldw apart) x K [0, kc) into panel
 * [(kc + 1) / 2][PN] u32: the pair p of row j at p * PN + j. Rows past nj
 * and the partner of an odd last element are zero. */
static TARGET_ void pack_panel(const uint16_t *w, int64_t ldw, int nj, int64_t kc, uint32_t *panel) {
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
static TARGET_ void store_rows(const hr_gemm *g, int64_t r, int rows, int64_t j0, int nj, float *y,
                               const float *bias, bool simd) {
    size_t csz = hr_dtype_size(g->c.dt);
    for (int i = 0; i < rows; i++) {
        int64_t oa, ob, oc;
        hr_gemm_batch_offsets(g, (r + i) / g->m, &oa, &ob, &oc);
        char *dst = g->c.base + (oc + ((r + i) % g->m) * g->c.rs + j0 * g->c.cs) * (int64_t)csz;
        hr_gemm_store_row(g, dst, y + i * PN, bias, nj, simd);
    }
}

/* Every row of C over weight rows [j0, j0 + nj): the panel packed once,
 * then each group of PR rows over all of it. The next unit's weights are
 * prefetched meanwhile, a few lines per group. */
static TARGET_ void panel_unit(const panel_ctx *ctx, int64_t j0, int nj, uint32_t *panel) {
    const hr_gemm *g = ctx->g;
    pack_panel((const uint16_t *)g->b.base + j0 * g->b.cs, g->b.cs, nj, g->k, panel);
    float bias[PN], y[PR * PN];
    if (g->bias) hr_load_f32(bias, g->bias + j0 * g->bias_s * (int64_t)hr_dtype_size(g->bias_dt), g->bias_dt, nj,
                             g->bias_s);
    int64_t groups = (ctx->rows + PR - 1) / PR, next = g->n - (j0 + PN) < PN ? g->n - (j0 + PN) : PN;
    pf_panel pf = {0};
    if (next > 0) {
        pf.row = g->b.base + (j0 + PN) * g->b.cs * 2;
        pf.len = g->k * 2;
        pf.ld = g->b.cs * 2;
        pf.rows_left = (int)next - 1;
        pf.per_group = (int)((next * ((pf.len + 63) / 64) + groups - 1) / groups);
    }
    bool simd = hr_k_simd();
    for (int64_t r = 0; r < ctx->rows; r += PR) {
        const uint16_t *xr = ctx->x + r * ctx->ldx;
        int rows = ctx->rows - r < PR ? (int)(ctx->rows - r) : PR;
        pf_lines(&pf);
        switch (rows) {
        case 1: tile(1, g->k, xr, ctx->ldx, panel, y); break;
        case 2: tile(2, g->k, xr, ctx->ldx, panel, y); break;
        case 3: tile(3, g->k, xr, ctx->ldx, panel, y); break;
        case 4: tile(4, g->k, xr, ctx->ldx, panel, y); break;
        case 5: tile(5, g->k, xr, ctx->ldx, panel, y); break;
        default: tile(PR, g->k, xr, ctx->ldx, panel, y); break;
        }
        store_rows(g, r, rows, j0, nj, y, g->bias ? bias : NULL, simd);
    }
}

static size_t panel_bytes(int64_t k) { return (size_t)((k + 1) / 2) * PN * 4; }

static void panel_worker(void *arg, int ith, int nth) {
    panel_ctx *ctx = arg;
    const hr_gemm *g = ctx->g;
    int64_t begin, end;
    hr_split_range(ctx->units, ith, nth, &begin, &end);
    if (begin >= end) return;
    uint32_t *panel = hr_gemm_thread_scratch(panel_bytes(g->k));
    if (!panel) {
        atomic_store(&ctx->failed, 1);
        return;
    }
    for (int64_t u = begin; u < end; u++) {
        int64_t j0 = u * PN;
        panel_unit(ctx, j0, g->n - j0 < PN ? (int)(g->n - j0) : PN, panel);
    }
}

hr_status hr_gemm_panel_run(const hr_gemm *g, int64_t rows, const uint16_t *x, int64_t ldx) {
    panel_ctx ctx = {.g = g, .x = x, .ldx = ldx, .rows = rows, .units = (g->n + PN - 1) / PN};
    atomic_init(&ctx.failed, 0);
    int64_t tasks = hr_parallel_threads_for(rows * g->n * g->k, HR_GRAIN_MATMUL);
    if (tasks > 1) tasks *= P_TASKS_PER_THREAD;
    if (tasks > ctx.units / P_TASK_MIN_UNITS) tasks = ctx.units / P_TASK_MIN_UNITS;
    hr_parallel_run(panel_worker, &ctx, tasks > 1 ? (int)tasks : 1);
    if (atomic_load(&ctx.failed)) return hr_error(HR_ERR_OOM, "gemm: out of memory for weight panels");
    return HR_OK;
}
