/* The GEMM driver: batch/tile decomposition over the thread pool and
 * packing of strided operands of any float dtype into micro-kernel panels;
 * a few rows against a K-contiguous B go to the GEMV route (gemv_core.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_eltwise.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"

/* Tile sizes: MC is a multiple of every MR, NC_MAX of every NR, KC even
 * (bf16 pairs). An A panel (MC x KC) stays in L2 next to the B panel. */
#define MC 96
#define NC_MAX 256
#define KC 256

typedef struct family {
    hr_gemm_ukr_fn ukr;
    int mr, nr;
    bool pairs; /* bf16 pair panels */
    bool avx2;  /* vector conversions while packing */
} family;

static family family_for(const hr_gemm *g) {
    if (g->a.dt == HR_BF16 && g->b.dt == HR_BF16 && hr_gemm_use_avx512_bf16())
        return (family){hr_gemm_ukr_bf16_avx512, HR_GEMM_BF16_MR, HR_GEMM_BF16_NR, true, true};
    if (hr_cpu_isa_get() >= HR_ISA_AVX2)
        return (family){hr_gemm_ukr_f32_avx2, HR_GEMM_F32_MR, HR_GEMM_F32_NR, false, true};
    return (family){hr_gemm_ukr_f32_scalar, HR_GEMM_F32_MR, HR_GEMM_F32_NR, false, false};
}

void hr_gemm_batch_offsets(const hr_gemm *g, int64_t bi, int64_t *oa, int64_t *ob, int64_t *oc) {
    *oa = *ob = *oc = 0;
    for (int d = g->nb - 1; d >= 0; d--) {
        int64_t i = bi % g->bshape[d];
        bi /= g->bshape[d];
        *oa += i * g->bstride_a[d];
        *ob += i * g->bstride_b[d];
        *oc += i * g->bstride_c[d];
    }
}

int64_t hr_gemm_row_offset(const hr_gemm *g, bool c, int64_t r) {
    int64_t oa, ob, oc;
    hr_gemm_batch_offsets(g, r / g->m, &oa, &ob, &oc);
    return c ? oc + (r % g->m) * g->c.rs : oa + (r % g->m) * g->a.rs;
}

bool hr_gemm_rows_even(const hr_gemm *g, bool c, int64_t rows, int64_t *ld) {
    int64_t step = rows > 1 ? hr_gemm_row_offset(g, c, 1) : 0;
    for (int64_t r = 2; r < rows; r++)
        if (hr_gemm_row_offset(g, c, r) != r * step) return false;
    *ld = step;
    return true;
}

int64_t hr_gemm_batch_count(const hr_gemm *g) {
    int64_t n = 1;
    for (int d = 0; d < g->nb; d++) n *= g->bshape[d];
    return n;
}

/* Operands are f32, bf16 or f16 (inference checks). */
static inline int64_t fsize(hr_dtype dt) { return dt == HR_F32 ? 4 : 2; }

static inline const char *elem(const hr_gemm_mat *x, int64_t off, int64_t i, int64_t j) {
    return x->base + (off + i * x->rs + j * x->cs) * fsize(x->dt);
}

static inline uint32_t load_u32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t elem_u16(const hr_gemm_mat *x, int64_t off, int64_t i, int64_t j) {
    uint16_t v;
    memcpy(&v, elem(x, off, i, j), 2);
    return v;
}

/* ---- packing ---- */


/* A rows [i0, i0+mc) x k [k0, k0+kc) into panels [mc/mr][kc][mr] f32;
 * rows past m are zero. rowbuf holds kc floats. */
static void pack_a_f32(const hr_gemm *g, const family *f, int64_t off, int64_t i0, int64_t mc, int64_t k0,
                       int64_t kc, float *ap, float *rowbuf) {
    int mr = f->mr;
    int64_t mpad = (mc + mr - 1) / mr * mr;
    for (int64_t i = 0; i < mpad; i++) {
        float *panel = ap + (i / mr) * kc * mr + i % mr;
        if (i < mc && i0 + i < g->m) {
            hr_gemm_load_f32(rowbuf, elem(&g->a, off, i0 + i, k0), g->a.dt, kc, g->a.cs, f->avx2);
            for (int64_t p = 0; p < kc; p++) panel[p * mr] = rowbuf[p];
        } else {
            for (int64_t p = 0; p < kc; p++) panel[p * mr] = 0.0f;
        }
    }
}

/* B k [k0, k0+kc) x cols [j0, j0+nc) into panels [nc/nr][kc][nr] f32,
 * reading along whichever of B's dims is contiguous. buf holds 8 * KC
 * floats. */
static void pack_b_f32(const hr_gemm *g, const family *f, int64_t off, int64_t k0, int64_t kc, int64_t j0,
                       int64_t nc, float *bp, float *buf) {
    int nr = f->nr;
    int64_t npad = (nc + nr - 1) / nr * nr;
    if (g->b.rs == 1 && g->b.cs != 1) {
        for (int64_t j = 0; j < npad;) {
            float *panel = bp + (j / nr) * kc * nr + j % nr;
            if (f->avx2 && j + 8 <= nc && (j % nr) + 8 <= nr) {
                /* eight columns (weight rows) at once, transposed in registers */
                for (int i = 0; i < 8; i++)
                    hr_gemm_load_f32(buf + i * kc, elem(&g->b, off, k0, j0 + j + i), g->b.dt, kc, 1, f->avx2);
                hr_gemm_transpose8_avx2((const char *)buf, kc * 4, kc, (uint32_t *)panel, nr);
                j += 8;
                continue;
            }
            if (j < nc) {
                hr_gemm_load_f32(buf, elem(&g->b, off, k0, j0 + j), g->b.dt, kc, 1, f->avx2);
                for (int64_t p = 0; p < kc; p++) panel[p * nr] = buf[p];
            } else {
                for (int64_t p = 0; p < kc; p++) panel[p * nr] = 0.0f;
            }
            j++;
        }
        return;
    }
    for (int64_t jb = 0; jb < npad; jb += nr) {
        int64_t w = nc - jb < nr ? nc - jb : nr;
        float *panel = bp + (jb / nr) * kc * nr;
        for (int64_t p = 0; p < kc; p++) {
            hr_gemm_load_f32(panel + p * nr, elem(&g->b, off, k0 + p, j0 + jb), g->b.dt, w, g->b.cs, f->avx2);
            for (int64_t j = w; j < nr; j++) panel[p * nr + j] = 0.0f;
        }
    }
}

/* bf16 pair panels: A [mc/mr][kc/2][mr] u32, B [nc/nr][kc/2][nr][2] u16;
 * an odd kc is padded with a zero k. A K-contiguous row gives each pair
 * in one 4-byte load. */
static void pack_a_pairs(const hr_gemm *g, int64_t off, int64_t i0, int64_t mc, int64_t k0, int64_t kc, int mr,
                         uint32_t *ap) {
    int64_t mpad = (mc + mr - 1) / mr * mr, kp = (kc + 1) / 2, full = kc / 2;
    for (int64_t i = 0; i < mpad; i++) {
        uint32_t *panel = ap + (i / mr) * kp * mr + i % mr;
        if (i >= mc) {
            for (int64_t p = 0; p < kp; p++) panel[p * mr] = 0;
            continue;
        }
        int64_t p = 0;
        if (g->a.cs == 1) {
            const char *row = elem(&g->a, off, i0 + i, k0);
            for (; p < full; p++) panel[p * mr] = load_u32(row + 4 * p);
        }
        for (; p < kp; p++) {
            uint32_t lo = elem_u16(&g->a, off, i0 + i, k0 + 2 * p);
            uint32_t hi = 2 * p + 1 < kc ? elem_u16(&g->a, off, i0 + i, k0 + 2 * p + 1) : 0;
            panel[p * mr] = lo | hi << 16;
        }
    }
}

static void pack_b_pairs(const hr_gemm *g, int64_t off, int64_t k0, int64_t kc, int64_t j0, int64_t nc, int nr,
                         uint16_t *bp) {
    int64_t npad = (nc + nr - 1) / nr * nr, kp = (kc + 1) / 2, full = kc / 2;
    for (int64_t j = 0; j < npad;) {
        uint16_t *panel = bp + (j / nr) * kp * nr * 2 + (j % nr) * 2;
        if (g->b.rs == 1 && j + 8 <= nc && (j % nr) + 8 <= nr) {
            /* linear's weight: eight output columns are eight contiguous
             * rows; their pairs are transposed in registers */
            hr_gemm_transpose8_avx2(elem(&g->b, off, k0, j0 + j), g->b.cs * 2, full, (uint32_t *)panel, nr);
            for (int i = 0; full < kp && i < 8; i++) { /* odd kc: the last k pairs with a zero */
                panel[full * nr * 2 + i * 2] = elem_u16(&g->b, off, k0 + kc - 1, j0 + j + i);
                panel[full * nr * 2 + i * 2 + 1] = 0;
            }
            j += 8;
            continue;
        }
        if (g->b.cs == 1 && j % nr == 0) {
            /* row-major B [k, n]: interleave two K rows of one panel */
            int64_t w = nc - j < nr ? (nc - j > 0 ? nc - j : 0) : nr;
            for (int64_t p = 0; p < kp; p++) {
                const uint16_t *r0 = (const uint16_t *)elem(&g->b, off, k0 + 2 * p, j0 + j);
                const uint16_t *r1 = 2 * p + 1 < kc ? r0 + g->b.rs : NULL;
                uint16_t *dst = panel + p * nr * 2;
                for (int64_t i = 0; i < w; i++) {
                    dst[2 * i] = r0[i];
                    dst[2 * i + 1] = r1 ? r1[i] : 0;
                }
                for (int64_t i = w; i < nr; i++) dst[2 * i] = dst[2 * i + 1] = 0;
            }
            j += nr;
            continue;
        }
        if (j >= nc) {
            for (int64_t p = 0; p < kp; p++) panel[p * nr * 2] = panel[p * nr * 2 + 1] = 0;
        } else {
            for (int64_t p = 0; p < kp; p++) {
                panel[p * nr * 2] = elem_u16(&g->b, off, k0 + 2 * p, j0 + j);
                panel[p * nr * 2 + 1] = 2 * p + 1 < kc ? elem_u16(&g->b, off, k0 + 2 * p + 1, j0 + j) : 0;
            }
        }
        j++;
    }
}

/* ---- tiled GEMM ---- */

typedef struct gemm_ctx {
    const hr_gemm *g;
    family f;
    int64_t nc, mt, nt, units;
    atomic_int failed;
} gemm_ctx;

typedef struct scratch {
    void *ap;        /* packed A panels of one (M tile, K block) */
    void *bp;        /* packed B panels of one N tile, all K blocks of KC * NC_MAX slots */
    float *ctile;    /* [MC][NC_MAX] f32 accumulators */
    float *rowbuf;   /* [8 * KC]: rows being converted (8 * KC >= NC_MAX) */
    float *biasbuf;  /* [NC_MAX] */
} scratch;

/* Per-thread scratch kept across calls: fresh multi-megabyte buffers per
 * call would pay page faults every time. Grows to the largest size asked;
 * a pthread key frees it when a pool thread exits. The first 64 bytes hold
 * the usable size. */
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;

static void scratch_key_init(void) { pthread_key_create(&g_scratch_key, free); }

void *hr_gemm_thread_scratch(size_t bytes) {
    pthread_once(&g_scratch_once, scratch_key_init);
    char *block = pthread_getspecific(g_scratch_key);
    if (!block || *(size_t *)block < bytes) {
        free(block);
        block = aligned_alloc(64, (bytes + 127) / 64 * 64);
        if (block) *(size_t *)block = bytes;
        pthread_setspecific(g_scratch_key, block);
        if (!block) return NULL;
    }
    return block + 64;
}

/* nkb: K blocks of B to hold at once. */
static bool scratch_get(scratch *s, int64_t nkb_) {
    size_t nkb = (size_t)(nkb_ > 0 ? nkb_ : 1);
    size_t n_ap = MC * KC, n_bp = nkb * KC * NC_MAX, n_c = (size_t)MC * NC_MAX, n_row = 8 * KC;
    float *mem = hr_gemm_thread_scratch((n_ap + n_bp + n_c + n_row + NC_MAX) * sizeof(float));
    if (!mem) return false;
    s->ap = mem;
    s->bp = mem + n_ap;
    s->ctile = mem + n_ap + n_bp;
    s->rowbuf = s->ctile + n_c;
    s->biasbuf = s->rowbuf + n_row;
    return true;
}

/* Writes the finished tile: bias added, converted to C's dtype and strides. */
static void store_tile(const hr_gemm *g, int64_t offc, int64_t i0, int64_t mc, int64_t j0, int64_t nc,
                       const scratch *s, int64_t ldc) {
    if (g->bias) hr_load_f32(s->biasbuf, g->bias + j0 * g->bias_s * (int64_t)hr_dtype_size(g->bias_dt),
                             g->bias_dt, nc, g->bias_s);
    bool simd = hr_k_simd();
    for (int64_t i = 0; i < mc; i++) {
        float *row = s->ctile + i * ldc;
        if (g->bias)
            for (int64_t j = 0; j < nc; j++) row[j] += s->biasbuf[j];
        hr_k_store_f32((char *)elem(&g->c, offc, i0 + i, j0), g->c.dt, row, nc, g->c.cs, simd);
    }
}

/* Packs K block [k0, k0+KC) of B's column panel [j0, j0+nc) into slot. */
static void pack_b_block(const hr_gemm *g, const family *f, const scratch *s, int64_t ob, int64_t k0, int64_t j0,
                         int64_t nc, int64_t slot_index) {
    int64_t kc = g->k - k0 < KC ? g->k - k0 : KC;
    float *slot = (float *)s->bp + slot_index * KC * NC_MAX;
    if (f->pairs)
        pack_b_pairs(g, ob, k0, kc, j0, nc, f->nr, (uint16_t *)slot);
    else
        pack_b_f32(g, f, ob, k0, kc, j0, nc, slot, s->rowbuf);
}

static void gemm_unit(gemm_ctx *ctx, scratch *s, int64_t u, int64_t *packed_b) {
    const hr_gemm *g = ctx->g;
    const family *f = &ctx->f;
    int64_t mi = u % ctx->mt, ni = (u / ctx->mt) % ctx->nt, bi = u / (ctx->mt * ctx->nt);
    int64_t i0 = mi * MC, j0 = ni * ctx->nc;
    int64_t mc = g->m - i0 < MC ? g->m - i0 : MC, nc = g->n - j0 < ctx->nc ? g->n - j0 : ctx->nc;
    int64_t oa, ob, oc;
    hr_gemm_batch_offsets(g, bi, &oa, &ob, &oc);
    int64_t ldc = ctx->nc;
    if (g->k == 0) memset(s->ctile, 0, sizeof(float) * MC * NC_MAX);
    /* With several M tiles, B's column panel is packed whole (all K blocks)
     * once for the tiles of (bi, ni) this thread runs in a row (units go
     * M-fastest). With one M tile there is no reuse, and one K block at a
     * time stays in L2 instead. */
    bool whole = ctx->mt > 1;
    int64_t bkey = bi * ctx->nt + ni;
    if (whole && *packed_b != bkey) {
        for (int64_t k0 = 0; k0 < g->k; k0 += KC) pack_b_block(g, f, s, ob, k0, j0, nc, k0 / KC);
        *packed_b = bkey;
    }
    for (int64_t k0 = 0; k0 < g->k; k0 += KC) {
        int64_t kc = g->k - k0 < KC ? g->k - k0 : KC;
        int64_t kdepth = f->pairs ? (kc + 1) / 2 : kc;
        if (!whole) pack_b_block(g, f, s, ob, k0, j0, nc, 0);
        const char *bslot = (const char *)((float *)s->bp + (whole ? k0 / KC : 0) * KC * NC_MAX);
        if (f->pairs)
            pack_a_pairs(g, oa, i0, mc, k0, kc, f->mr, s->ap);
        else
            pack_a_f32(g, f, oa, i0, mc, k0, kc, s->ap, s->rowbuf);
        const size_t esz = 4; /* one f32, or one u32 bf16 pair, per panel (k, row) */
        for (int64_t jb = 0; jb < nc; jb += f->nr) {
            const char *bpan = bslot + (size_t)(jb / f->nr) * kdepth * f->nr * esz;
            for (int64_t ib = 0; ib < mc; ib += f->mr) {
                const char *apan = (const char *)s->ap + (size_t)(ib / f->mr) * kdepth * f->mr * esz;
                f->ukr(kdepth, apan, bpan, s->ctile + ib * ldc + jb, ldc, k0 > 0);
            }
        }
    }
    store_tile(g, oc, i0, mc, j0, nc, s, ldc);
}

static void gemm_worker(void *arg, int ith, int nth) {
    gemm_ctx *ctx = arg;
    int64_t begin, end;
    hr_split_range(ctx->units, ith, nth, &begin, &end);
    if (begin >= end) return;
    scratch s;
    if (!scratch_get(&s, ctx->mt > 1 ? (ctx->g->k + KC - 1) / KC : 1)) {
        atomic_store(&ctx->failed, 1);
        return;
    }
    int64_t packed_b = -1;
    for (int64_t u = begin; u < end; u++) gemm_unit(ctx, &s, u, &packed_b);
}

static hr_status gemm_tiled(const hr_gemm *g) {
    gemm_ctx ctx = {.g = g, .f = family_for(g)};
    int64_t nbatch = hr_gemm_batch_count(g);
    int nthreads = hr_num_threads();
    ctx.mt = (g->m + MC - 1) / MC;
    /* Narrower N tiles when there are too few tiles to feed every thread. */
    ctx.nc = NC_MAX;
    while (ctx.nc > ctx.f.nr && nbatch * ctx.mt * ((g->n + ctx.nc - 1) / ctx.nc) < 2 * nthreads &&
           ctx.nc / 2 >= ctx.f.nr)
        ctx.nc /= 2;
    ctx.nt = (g->n + ctx.nc - 1) / ctx.nc;
    ctx.units = nbatch * ctx.mt * ctx.nt;
    double flops = 2.0 * (double)nbatch * (double)g->m * (double)g->n * (double)(g->k + 1);
    int nth = flops < 1e5 ? 1 : (int)(ctx.units < nthreads ? ctx.units : nthreads);
    atomic_init(&ctx.failed, 0);
    hr_parallel_run(gemm_worker, &ctx, nth);
    if (atomic_load(&ctx.failed)) return hr_error(HR_ERR_OOM, "gemm: out of memory for packing buffers");
    return HR_OK;
}

hr_status hr_gemm_run(const hr_gemm *g) {
    if (g->m <= 0 || g->n <= 0) return HR_OK;
    int64_t rows = hr_gemm_batch_count(g) * g->m;
    bool shared_b = true;
    for (int d = 0; d < g->nb; d++) shared_b &= g->bstride_b[d] == 0 || g->bshape[d] == 1;
    /* f16 panels are read by the AVX2 kernel only: where AVX-512 BF16 is in
     * use (an ISA setting raised after packing), the weight itself is */
    if (shared_b && g->b_panels && g->k > 0 && g->a.dt == g->b.dt && hr_gemm_use_panels_for(g->b.dt)) {
        if (!hr_gemm_use_avx512_bf16()) return hr_gemm_panel_run_avx2(g, rows); /* bf16 or f16 */
        int64_t ldx;
        const uint16_t *x = hr_gemm_bf16_rows(g, rows, &ldx);
        return x ? hr_gemm_panel_run(g, rows, x, ldx) : HR_ERR_OOM;
    }
    if (shared_b && hr_gemm_skinny_fits(g, rows)) return hr_gemm_skinny_run(g, rows);
    if (rows <= HR_GEMV_ROUTE_ROWS && g->k > 0 && shared_b && (g->b.rs == 1 || g->k == 1))
        return hr_gemv_run(g, (int)rows);
    return gemm_tiled(g);
}
