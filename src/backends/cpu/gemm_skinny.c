/* The skinny bf16 route: five rows of A or more (batched decode, prefill)
 * against a K-contiguous bf16 B (x @ W^T), with no packing of the weights.
 * The tiled GEMM transposes every weight into panels on each call, which at
 * these row counts costs about as much as the math; here each block of four
 * weight rows is read in place (dot-product form, vdpbf16ps over K), stays
 * in L1 while every row of x passes over it, and is loaded from memory once.
 * Horizontal reductions happen once per (row, weight row, K block). */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* Weight rows per micro-tile (J), x rows per micro-tile (R): R * J
 * accumulators plus J weight vectors fit the 32 zmm registers. */
#define SK_J 4
#define SK_R 6
/* Most K per block: four weight rows of it (16 KiB) stay in L1 between
 * row groups. K splits into equal blocks of whole vectors of 32. */
#define SK_KC_MAX 2048
/* Output columns per store pass: y [SK_MB][SK_CHUNK] f32 on the stack. */
#define SK_CHUNK 32
/* x rows per block: 96 rows of one K block (192 KiB) stay in L2 while the
 * weights pass over them. A multiple of SK_R. */
#define SK_MB 96
/* Tasks per pool thread, each of at least SK_TASK_MIN_BLOCKS blocks of
 * SK_J weight rows (a task's first block has nothing prefetched). */
#define SK_TASKS_PER_THREAD 4
#define SK_TASK_MIN_BLOCKS 8

/* Four accumulators of one x row -> their four sums, in order. */
static inline __attribute__((always_inline)) TARGET_ __m128 reduce4(__m512 a0, __m512 a1, __m512 a2,
                                                                     __m512 a3) {
    /* pairwise interleave-and-add halves the vectors twice within each
     * 128-bit lane, leaving [s0 s1 s2 s3] partials in every lane */
    __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))));
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), hi);
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* One vector of K (32 bf16; the first `m` of them when masked) for every
 * (x row, weight row) pair of the tile. */
static inline __attribute__((always_inline)) TARGET_ void tile_step(__m512 acc[SK_R][SK_J], int rows,
                                                                     const uint16_t *x, int64_t ldx,
                                                                     const uint16_t *const *w, const uint16_t *pf,
                                                                     int64_t ldw, int64_t p, bool masked,
                                                                     __mmask32 m) {
    __m512bh wv[SK_J];
#pragma GCC unroll 4
    for (int j = 0; j < SK_J; j++) {
        wv[j] = masked ? (__m512bh)_mm512_maskz_loadu_epi16(m, w[j] + p) : (__m512bh)_mm512_loadu_si512(w[j] + p);
        if (pf) _mm_prefetch((const char *)(pf + j * ldw + p), _MM_HINT_T0);
    }
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) {
        __m512bh xv = masked ? (__m512bh)_mm512_maskz_loadu_epi16(m, x + r * ldx + p)
                             : (__m512bh)_mm512_loadu_si512(x + r * ldx + p);
#pragma GCC unroll 4
        for (int j = 0; j < SK_J; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, wv[j]);
    }
}

/* y[r][0..4) (+)= dot(x row r, w[j]) over kc, for r < rows (<= SK_R).
 * x [rows][ldx] bf16, w: 4 rows [kc] bf16, y [rows][ldy] f32. pf, when
 * set, is the next weight block, rows ldw apart: its lines are prefetched
 * as this one is read, so the stream from memory overlaps the math. */
static inline __attribute__((always_inline)) TARGET_ void tile(int rows, int64_t kc, const uint16_t *x,
                                                                int64_t ldx, const uint16_t *const *w,
                                                                const uint16_t *pf, int64_t ldw, float *y,
                                                                int64_t ldy, bool accumulate) {
    __m512 acc[SK_R][SK_J];
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < SK_J; j++) acc[r][j] = _mm512_setzero_ps();
    int64_t full = kc & ~(int64_t)31;
    for (int64_t p = 0; p < full; p += 32) tile_step(acc, rows, x, ldx, w, pf, ldw, p, false, 0);
    if (full < kc) tile_step(acc, rows, x, ldx, w, pf, ldw, full, true, (__mmask32)((1u << (kc - full)) - 1u));
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) {
        __m128 s = reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        if (accumulate) s = _mm_add_ps(s, _mm_loadu_ps(y + r * ldy));
        _mm_storeu_ps(y + r * ldy, s);
    }
}

/* Every x row group over one weight block; only the first group
 * prefetches (the later ones find the block in L1). */
static TARGET_ void block_rows(int rows, int64_t kc, const uint16_t *x, int64_t ldx, const uint16_t *const *w,
                               const uint16_t *pf, int64_t ldw, float *y, int64_t ldy, bool accumulate) {
    for (int r = 0; r < rows; r += SK_R, pf = NULL) {
        const uint16_t *xr = x + r * ldx;
        float *yr = y + r * ldy;
        switch (rows - r) {
        case 1: tile(1, kc, xr, ldx, w, pf, ldw, yr, ldy, accumulate); break;
        case 2: tile(2, kc, xr, ldx, w, pf, ldw, yr, ldy, accumulate); break;
        case 3: tile(3, kc, xr, ldx, w, pf, ldw, yr, ldy, accumulate); break;
        case 4: tile(4, kc, xr, ldx, w, pf, ldw, yr, ldy, accumulate); break;
        case 5: tile(5, kc, xr, ldx, w, pf, ldw, yr, ldy, accumulate); break;
        default: tile(SK_R, kc, xr, ldx, w, pf, ldw, yr, ldy, accumulate); break;
        }
    }
}

typedef struct skinny_ctx {
    const hr_gemm *g;
    const uint16_t *x; /* [rows][ldx] bf16 */
    int64_t ldx;
    int64_t rows;
    int64_t blocks; /* of SK_J weight rows */
} skinny_ctx;

/* Rows [r0, r0 + mb) of C over this thread's weight rows [j_begin, j_end). */
static void skinny_rows(const skinny_ctx *ctx, int64_t r0, int mb, int64_t j_begin, int64_t j_end) {
    const hr_gemm *g = ctx->g;
    float y[SK_MB][SK_CHUNK], bias[SK_CHUNK];
    int64_t row_off_c[SK_MB]; /* element offset of each C row */
    for (int r = 0; r < mb; r++) {
        int64_t oa, ob, oc;
        hr_gemm_batch_offsets(g, (r0 + r) / g->m, &oa, &ob, &oc);
        row_off_c[r] = oc + ((r0 + r) % g->m) * g->c.rs;
    }
    const uint16_t *wbase = (const uint16_t *)g->b.base, *x = ctx->x + r0 * ctx->ldx;
    int64_t ldw = g->b.cs, nkb = (g->k + SK_KC_MAX - 1) / SK_KC_MAX;
    int64_t kb = ((g->k + nkb - 1) / nkb + 31) & ~(int64_t)31;
    size_t csz = hr_dtype_size(g->c.dt);
    for (int64_t j0 = j_begin; j0 < j_end; j0 += SK_CHUNK) {
        int64_t jend = j0 + SK_CHUNK < j_end ? j0 + SK_CHUNK : j_end;
        for (int64_t j = j0; j < jend; j += SK_J) {
            /* past the end, a block repeats its last row; those sums land
             * in y columns past jend and are never stored */
            const uint16_t *w[SK_J];
            for (int i = 0; i < SK_J; i++) w[i] = wbase + (j + i < j_end ? j + i : j_end - 1) * ldw;
            for (int64_t k0 = 0; k0 < g->k; k0 += kb) {
                int64_t kc = g->k - k0 < kb ? g->k - k0 : kb;
                /* the weight block read next: these rows' next K block, else
                 * the next rows' first (when whole and this thread's) */
                const uint16_t *pf = k0 + kb < g->k             ? w[0] + k0 + kb
                                     : j + 2 * SK_J <= j_end ? w[0] + SK_J * ldw
                                                             : NULL;
                const uint16_t *wk[SK_J];
                for (int i = 0; i < SK_J; i++) wk[i] = w[i] + k0;
                block_rows(mb, kc, x + k0, ctx->ldx, wk, pf, ldw, &y[0][j - j0], SK_CHUNK, k0 > 0);
            }
        }
        int64_t nc = jend - j0;
        if (g->bias) hr_load_f32(bias, g->bias + j0 * g->bias_s * (int64_t)hr_dtype_size(g->bias_dt),
                                 g->bias_dt, nc, g->bias_s);
        for (int r = 0; r < mb; r++) {
            if (g->bias)
                for (int64_t c = 0; c < nc; c++) y[r][c] += bias[c];
            hr_store_f32(g->c.base + (row_off_c[r] + j0 * g->c.cs) * (int64_t)csz, g->c.dt, y[r], nc, g->c.cs);
        }
    }
}

/* Each thread takes a range of weight rows and runs every block of SK_MB x
 * rows over it: the x block stays in L2 while the weights pass. */
static void skinny_worker(void *arg, int ith, int nth) {
    skinny_ctx *ctx = arg;
    int64_t begin, end;
    hr_split_range(ctx->blocks, ith, nth, &begin, &end);
    int64_t j_end = end * SK_J < ctx->g->n ? end * SK_J : ctx->g->n;
    for (int64_t r0 = 0; r0 < ctx->rows && begin < end; r0 += SK_MB)
        skinny_rows(ctx, r0, ctx->rows - r0 < SK_MB ? (int)(ctx->rows - r0) : SK_MB, begin * SK_J, j_end);
}

bool hr_gemm_skinny_fits(const hr_gemm *g, int64_t rows) {
    return rows >= HR_GEMM_SKINNY_MIN_ROWS && g->k > 0 &&
           g->a.dt == HR_BF16 && g->b.dt == HR_BF16 && g->b.rs == 1 && hr_gemm_use_avx512_bf16();
}

/* Whether A's rows, across batches, are K-contiguous and one stride
 * (*ld) apart, so x is read in place: linear's [batch, seq, k] input, and
 * decode's [batch, 1, k]. */
static bool rows_evenly_spaced(const hr_gemm *g, int64_t rows, int64_t *ld) {
    if (g->a.cs != 1) return false;
    int64_t oa, ob, oc, step = 0;
    for (int64_t r = 0; r < rows; r++) {
        hr_gemm_batch_offsets(g, r / g->m, &oa, &ob, &oc);
        int64_t off = oa + (r % g->m) * g->a.rs; /* row 0 sits at 0 */
        if (r == 1) step = off;
        if (off != r * step) return false;
    }
    *ld = step;
    return true;
}

hr_status hr_gemm_skinny_run(const hr_gemm *g, int64_t rows) {
    skinny_ctx ctx = {.g = g, .rows = rows, .blocks = (g->n + SK_J - 1) / SK_J};
    if (rows_evenly_spaced(g, rows, &ctx.ldx)) {
        ctx.x = (const uint16_t *)g->a.base;
    } else {
        /* the caller's scratch: its pool threads only read x */
        uint16_t *x = hr_gemm_thread_scratch((size_t)rows * (size_t)g->k * 2);
        if (!x)
            return hr_error(HR_ERR_OOM, "gemm: out of memory for %lld x %lld activations", (long long)rows,
                            (long long)g->k);
        for (int64_t r = 0; r < rows; r++) {
            int64_t oa, ob, oc;
            hr_gemm_batch_offsets(g, r / g->m, &oa, &ob, &oc);
            const uint16_t *src = (const uint16_t *)g->a.base + oa + (r % g->m) * g->a.rs;
            uint16_t *dst = x + (size_t)r * (size_t)g->k;
            if (g->a.cs == 1)
                memcpy(dst, src, (size_t)g->k * 2);
            else
                for (int64_t p = 0; p < g->k; p++) dst[p] = src[p * g->a.cs];
        }
        ctx.x = x;
        ctx.ldx = g->k;
    }
    /* Several tasks per thread, each a run of weight rows: a thread that
     * is descheduled (other processes share the cores) or slowed leaves
     * its later tasks to the others instead of holding up the region. */
    int64_t tasks = hr_parallel_threads_for((int64_t)rows * g->n * g->k, 1 << 16);
    if (tasks > 1) tasks *= SK_TASKS_PER_THREAD;
    if (tasks > ctx.blocks / SK_TASK_MIN_BLOCKS) tasks = ctx.blocks / SK_TASK_MIN_BLOCKS;
    hr_parallel_run(skinny_worker, &ctx, tasks > 1 ? (int)tasks : 1);
    return HR_OK;
}
