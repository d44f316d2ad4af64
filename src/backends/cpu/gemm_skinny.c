/* The skinny bf16 route: five rows of A or more (batched decode, prefill)
 * against a K-contiguous bf16 B (x @ W^T), with no packing of the weights.
 * The tiled GEMM transposes every weight into panels on each call, which at
 * these row counts costs about as much as the math; here each block of four
 * weight rows is read in place (dot-product form, vdpbf16ps over K), stays
 * in L1 while every row of x passes over it, and is loaded from memory once
 * per pass of up to SK_MB x rows; the blocks a task reads next are
 * prefetched while it computes. Horizontal reductions happen once per
 * (row, weight row, K block). From HR_GEMM_PANEL_MIN_ROWS rows, with the
 * rows of x in place, the panel route (gemm_panel.c) takes over. */
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
/* Most x rows per pass (a multiple of SK_R), and the L2 bytes they may
 * take: the rows of one K block stay in L2 while the weights pass. */
#define SK_MB 192
#define SK_X_L2 (384 * 1024)
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

/* Weight lines a task reads soon, prefetched a few per tile step so the
 * misses spread over a block's math instead of queueing up at its start:
 * a burst fills the core's miss buffers and stalls the loads of x behind
 * it (measured: batch-64 linears 79-84% of peak -> 89-93% with cold
 * weights). Rows of `len` bytes, `ld` bytes apart; rows that follow each
 * other in memory (ld == len) are one row. */
typedef struct pf_stream {
    const char *p;       /* next line to prefetch; NULL when done */
    const char *row_end; /* end of the row p is in */
    int64_t len, ld;
    int64_t rows;        /* rows after the current one */
    int per_step;        /* lines per tile step */
} pf_stream;

/* The two streams: block i + PF_L1_AHEAD to L1, block i + PF_L2_AHEAD to
 * L2. The L2 stream takes no L1 miss buffers, so it can run far enough
 * ahead to cover DRAM latency at the rates of 16-row batches (those went
 * from 53% to 80% of peak); the L1 stream then finds its lines in L2. NTA
 * for L1 measured a little faster than T0 (the lines are read once). */
#define PF_L1_AHEAD 1
#define PF_L2_AHEAD 2
enum { PF_L1, PF_L2 };

static inline __attribute__((always_inline)) void pf_advance(pf_stream *s) {
    s->p += 64;
    if (s->p < s->row_end) return;
    if (s->rows > 0) {
        s->rows--;
        s->p = s->row_end - s->len + s->ld;
        s->row_end = s->p + s->len;
    } else {
        s->p = NULL;
    }
}

static inline __attribute__((always_inline)) void pf_step(pf_stream *pf) {
    for (int i = 0; i < pf[PF_L1].per_step && pf[PF_L1].p; i++) {
        _mm_prefetch(pf[PF_L1].p, _MM_HINT_NTA);
        pf_advance(&pf[PF_L1]);
    }
    for (int i = 0; i < pf[PF_L2].per_step && pf[PF_L2].p; i++) {
        _mm_prefetch(pf[PF_L2].p, _MM_HINT_T2);
        pf_advance(&pf[PF_L2]);
    }
}

/* One vector of K (32 bf16; the first `m` of them when masked) for every
 * (x row, weight row) pair of the tile. */
static inline __attribute__((always_inline)) TARGET_ void tile_step(__m512 acc[SK_R][SK_J], int rows,
                                                                     const uint16_t *x, int64_t ldx,
                                                                     const uint16_t *const *w, pf_stream *pf,
                                                                     int64_t p, bool masked, __mmask32 m) {
    __m512bh wv[SK_J];
#pragma GCC unroll 4
    for (int j = 0; j < SK_J; j++)
        wv[j] = masked ? (__m512bh)_mm512_maskz_loadu_epi16(m, w[j] + p) : (__m512bh)_mm512_loadu_si512(w[j] + p);
    pf_step(pf);
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) {
        __m512bh xv = masked ? (__m512bh)_mm512_maskz_loadu_epi16(m, x + r * ldx + p)
                             : (__m512bh)_mm512_loadu_si512(x + r * ldx + p);
#pragma GCC unroll 4
        for (int j = 0; j < SK_J; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, wv[j]);
    }
}

/* y[r][0..4) (+)= dot(x row r, w[j]) over kc, for r < rows (<= SK_R).
 * x [rows][ldx] bf16, w: 4 rows [kc] bf16, y [rows][ldy] f32. */
static inline __attribute__((always_inline)) TARGET_ void tile(int rows, int64_t kc, const uint16_t *x,
                                                                int64_t ldx, const uint16_t *const *w,
                                                                pf_stream *pf, float *y, int64_t ldy,
                                                                bool accumulate) {
    __m512 acc[SK_R][SK_J];
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < SK_J; j++) acc[r][j] = _mm512_setzero_ps();
    int64_t full = kc & ~(int64_t)31;
    for (int64_t p = 0; p < full; p += 32) tile_step(acc, rows, x, ldx, w, pf, p, false, 0);
    if (full < kc) tile_step(acc, rows, x, ldx, w, pf, full, true, (__mmask32)((1u << (kc - full)) - 1u));
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) {
        __m128 s = reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        if (accumulate) s = _mm_add_ps(s, _mm_loadu_ps(y + r * ldy));
        _mm_storeu_ps(y + r * ldy, s);
    }
}

/* Every x row group over one weight block. */
static TARGET_ void block_rows(int rows, int64_t kc, const uint16_t *x, int64_t ldx, const uint16_t *const *w,
                               pf_stream *pf, float *y, int64_t ldy, bool accumulate) {
    for (int r = 0; r < rows; r += SK_R) {
        const uint16_t *xr = x + r * ldx;
        float *yr = y + r * ldy;
        switch (rows - r) {
        case 1: tile(1, kc, xr, ldx, w, pf, yr, ldy, accumulate); break;
        case 2: tile(2, kc, xr, ldx, w, pf, yr, ldy, accumulate); break;
        case 3: tile(3, kc, xr, ldx, w, pf, yr, ldy, accumulate); break;
        case 4: tile(4, kc, xr, ldx, w, pf, yr, ldy, accumulate); break;
        case 5: tile(5, kc, xr, ldx, w, pf, yr, ldy, accumulate); break;
        default: tile(SK_R, kc, xr, ldx, w, pf, yr, ldy, accumulate); break;
        }
    }
}

typedef struct skinny_ctx {
    const hr_gemm *g;
    const uint16_t *x; /* [rows][ldx] bf16 */
    int64_t ldx;
    int64_t rows;
    int64_t blocks; /* of SK_J weight rows */
    int64_t kb;     /* K per block: equal blocks, whole vectors of 32 */
    int mb;         /* x rows per pass over the weights */
} skinny_ctx;

/* The weight blocks one task reads, in order: by chunk of SK_CHUNK weight
 * rows, then K block, then SK_J rows. With several K blocks, the x rows of
 * one K block stay in L2 while every weight block of the chunk passes. */
typedef struct block_seq {
    int64_t j_begin, j_end, k, kb, nkb;
} block_seq;

/* Block i of the sequence: its first weight row *j, K range [*k0, *k0 +
 * *kc), and weight rows *nj (SK_J but at the end). False past the end. */
static bool block_at(const block_seq *s, int64_t i, int64_t *j, int64_t *k0, int64_t *kc, int64_t *nj) {
    int64_t per_chunk = SK_CHUNK / SK_J * s->nkb, c = i / per_chunk, r = i % per_chunk;
    int64_t c0 = s->j_begin + c * SK_CHUNK;
    if (c0 >= s->j_end) return false;
    int64_t width = s->j_end - c0 < SK_CHUNK ? s->j_end - c0 : SK_CHUNK, quads = (width + SK_J - 1) / SK_J;
    if (r >= quads * s->nkb) return false;
    *j = c0 + r % quads * SK_J;
    *k0 = r / quads * s->kb;
    *kc = s->k - *k0 < s->kb ? s->k - *k0 : s->kb;
    *nj = s->j_end - *j < SK_J ? s->j_end - *j : SK_J;
    return true;
}

/* A stream over block i's weight lines, per_step lines per tile step for
 * `steps` steps (NULL p when there is no block i). */
static pf_stream block_stream(const hr_gemm *g, const block_seq *s, int64_t i, int64_t steps) {
    pf_stream pf = {0};
    int64_t j, k0, kc, nj;
    if (!block_at(s, i, &j, &k0, &kc, &nj)) return pf;
    int64_t ldw = g->b.cs;
    bool joined = kc == g->k && ldw == g->k; /* whole rows back to back */
    pf.p = g->b.base + (j * ldw + k0) * 2;
    pf.len = joined ? nj * kc * 2 : kc * 2;
    pf.ld = ldw * 2;
    pf.rows = joined ? 0 : nj - 1;
    pf.row_end = pf.p + pf.len;
    int64_t lines = (nj * kc * 2 + 63) / 64;
    pf.per_step = (int)((lines + steps - 1) / steps);
    return pf;
}

/* Rows [r0, r0 + mb) of C over this task's weight rows [j_begin, j_end). */
static TARGET_ void skinny_rows(const skinny_ctx *ctx, int64_t r0, int mb, int64_t j_begin, int64_t j_end) {
    const hr_gemm *g = ctx->g;
    float y[SK_MB][SK_CHUNK], bias[SK_CHUNK];
    int64_t row_off_c[SK_MB]; /* element offset of each C row */
    for (int r = 0; r < mb; r++) {
        int64_t oa, ob, oc;
        hr_gemm_batch_offsets(g, (r0 + r) / g->m, &oa, &ob, &oc);
        row_off_c[r] = oc + ((r0 + r) % g->m) * g->c.rs;
    }
    const uint16_t *wbase = (const uint16_t *)g->b.base, *x = ctx->x + r0 * ctx->ldx;
    int64_t ldw = g->b.cs, groups = (mb + SK_R - 1) / SK_R;
    block_seq seq = {j_begin, j_end, g->k, ctx->kb, (g->k + ctx->kb - 1) / ctx->kb};
    size_t csz = hr_dtype_size(g->c.dt);
    bool simd = hr_k_simd();
    int64_t i = 0; /* index of the block in the sequence */
    for (int64_t j0 = j_begin; j0 < j_end; j0 += SK_CHUNK) {
        int64_t jend = j0 + SK_CHUNK < j_end ? j0 + SK_CHUNK : j_end;
        for (int64_t k0 = 0; k0 < g->k; k0 += ctx->kb) {
            int64_t kc = g->k - k0 < ctx->kb ? g->k - k0 : ctx->kb, steps = groups * ((kc + 31) / 32);
            for (int64_t j = j0; j < jend; j += SK_J, i++) {
                /* past the end, a block repeats its last row; those sums land
                 * in y columns past jend and are never stored */
                const uint16_t *w[SK_J];
                for (int q = 0; q < SK_J; q++) w[q] = wbase + (j + q < j_end ? j + q : j_end - 1) * ldw + k0;
                pf_stream pf[2];
                pf[PF_L1] = block_stream(g, &seq, i + PF_L1_AHEAD, steps);
                pf[PF_L2] = block_stream(g, &seq, i + PF_L2_AHEAD, steps);
                block_rows(mb, kc, x + k0, ctx->ldx, w, pf, &y[0][j - j0], SK_CHUNK, k0 > 0);
            }
        }
        int64_t nc = jend - j0;
        if (g->bias) hr_load_f32(bias, g->bias + j0 * g->bias_s * (int64_t)hr_dtype_size(g->bias_dt),
                                 g->bias_dt, nc, g->bias_s);
        for (int r = 0; r < mb; r++)
            hr_gemm_store_row(g, g->c.base + (row_off_c[r] + j0 * g->c.cs) * (int64_t)csz, y[r],
                              g->bias ? bias : NULL, nc, simd);
    }
}

/* Each task takes a range of weight rows and runs every pass of ctx->mb x
 * rows over it: the pass's x rows stay in L2 while the weights stream. */
static void skinny_worker(void *arg, int ith, int nth) {
    skinny_ctx *ctx = arg;
    int64_t begin, end;
    hr_split_range(ctx->blocks, ith, nth, &begin, &end);
    int64_t j_end = end * SK_J < ctx->g->n ? end * SK_J : ctx->g->n;
    for (int64_t r0 = 0; r0 < ctx->rows && begin < end; r0 += ctx->mb)
        skinny_rows(ctx, r0, ctx->rows - r0 < ctx->mb ? (int)(ctx->rows - r0) : ctx->mb, begin * SK_J, j_end);
}

bool hr_gemm_skinny_fits(const hr_gemm *g, int64_t rows) {
    return rows >= HR_GEMM_SKINNY_MIN_ROWS && g->k > 0 &&
           g->a.dt == HR_BF16 && g->b.dt == HR_BF16 && g->b.rs == 1 && hr_gemm_use_avx512_bf16();
}

/* Whether A's rows, across batches, are K-contiguous and one stride
 * (*ld) apart, so x is read in place: linear's [batch, seq, k] input, and
 * decode's [batch, 1, k]. */
static bool rows_evenly_spaced(const hr_gemm *g, int64_t rows, int64_t *ld) {
    return g->a.cs == 1 && hr_gemm_rows_even(g, false, rows, ld);
}

const uint16_t *hr_gemm_bf16_rows(const hr_gemm *g, int64_t rows, int64_t *ldx) {
    if (rows_evenly_spaced(g, rows, ldx)) return (const uint16_t *)g->a.base;
    /* the caller's scratch: its pool threads only read x */
    uint16_t *x = hr_gemm_thread_scratch((size_t)rows * (size_t)g->k * 2);
    if (!x) {
        hr_error(HR_ERR_OOM, "gemm: out of memory for %lld x %lld activations", (long long)rows, (long long)g->k);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *src = (const uint16_t *)g->a.base + hr_gemm_row_offset(g, false, r);
        uint16_t *dst = x + (size_t)r * (size_t)g->k;
        if (g->a.cs == 1)
            memcpy(dst, src, (size_t)g->k * 2);
        else
            for (int64_t p = 0; p < g->k; p++) dst[p] = src[p * g->a.cs];
    }
    *ldx = g->k;
    return x;
}

hr_status hr_gemm_skinny_run(const hr_gemm *g, int64_t rows) {
    skinny_ctx ctx = {.g = g, .rows = rows, .blocks = (g->n + SK_J - 1) / SK_J};
    int64_t nkb = (g->k + SK_KC_MAX - 1) / SK_KC_MAX;
    ctx.kb = ((g->k + nkb - 1) / nkb + 31) & ~(int64_t)31;
    /* x passes of equal size, each as many rows as fit the L2 budget */
    int64_t mb_max = SK_X_L2 / (ctx.kb * 2) / SK_R * SK_R;
    if (mb_max > SK_MB) mb_max = SK_MB;
    if (mb_max < SK_R) mb_max = SK_R;
    int64_t passes = (rows + mb_max - 1) / mb_max;
    ctx.mb = (int)(((rows + passes - 1) / passes + SK_R - 1) / SK_R * SK_R);
    if (ctx.mb > mb_max) ctx.mb = (int)mb_max;
    if (rows >= HR_GEMM_PANEL_MIN_ROWS && rows_evenly_spaced(g, rows, &ctx.ldx))
        return hr_gemm_panel_run(g, rows, (const uint16_t *)g->a.base, ctx.ldx);
    if (!(ctx.x = hr_gemm_bf16_rows(g, rows, &ctx.ldx))) return HR_ERR_OOM;
    /* Several tasks per thread, each a run of weight rows: a thread that
     * is descheduled (other processes share the cores) or slowed leaves
     * its later tasks to the others instead of holding up the region. */
    int64_t tasks = hr_parallel_threads_for((int64_t)rows * g->n * g->k, HR_GRAIN_MATMUL);
    if (tasks > 1) tasks *= SK_TASKS_PER_THREAD;
    if (tasks > ctx.blocks / SK_TASK_MIN_BLOCKS) tasks = ctx.blocks / SK_TASK_MIN_BLOCKS;
    hr_parallel_run(skinny_worker, &ctx, tasks > 1 ? (int)tasks : 1);
    return HR_OK;
}
