/* The panel route's shared parts (gemm_panel.c): the work sharing over
 * units of HR_GEMM_PANEL_N weight rows and the prefetch of the next unit,
 * used by its AVX-512 (and AMX) unit and by the AVX2 one
 * (gemm_panel_avx2.c), each compiled for its own ISA. */
#ifndef HR_BACKENDS_CPU_GEMM_PANEL_H
#define HR_BACKENDS_CPU_GEMM_PANEL_H

#include <stdatomic.h>
#include <xmmintrin.h>

#include "backends/cpu/gemm.h"
#include "core/claims.h"

/* Work sharing: the units in one segment per task (core/claims.h), each
 * task reading its own forward. Qwen3 decode, 2 threads, alternated with
 * four claimed tasks per thread: batch 64 median 285 tok/s (280-301)
 * against 280 (226-290), batch 16 223-245 against 201-225. Against one
 * segment per pair of tasks, the second task claiming from its back
 * (weights read backward a unit at a time), bench_gemv's one-row Qwen3
 * shapes, alternated sample by sample with a plain read in the fast
 * memory mode (~60 GB/s): q_proj 83-85% -> 87-88% of the read, gate/up
 * 85% -> 88-89%, down 87-90% -> 91-92%; at 16 and 64 rows the same. */

typedef struct panel_ctx panel_ctx;
/* Rows [r0, r1) of C over weight rows [u * PN, u * PN + nj), unit `next`'s
 * weights prefetched meanwhile (-1: none); scratch: a panel's bytes when B
 * has none. */
typedef void (*hr_panel_unit_fn)(const panel_ctx *ctx, int64_t u, int64_t next, int nj, uint32_t *scratch,
                                 int64_t r0, int64_t r1);

struct panel_ctx {
    const hr_gemm *g;
    hr_panel_unit_fn unit;
    const uint16_t *x; /* row r of A at x + r * ldx (bf16) */
    const float *x32;  /* or, for the AVX2 unit, at x32 + r * ldx (f32) */
    int64_t row0;      /* the AVX2 unit: x32's row r is row row0 + r of A and C */
    int64_t ldx, rows;
    int64_t units;          /* of PN weight rows */
    int64_t row_chunk;      /* rows per work item, a multiple of 6 (set by the caller; 0: all rows) */
    int64_t chunks;         /* work items per unit (filled in) */
    const uint32_t *packed; /* B's panels made at load, or NULL: pack per call */
    hr_gemm_amx_fn amx;     /* the AMX kernel, or NULL: the AVX-512 tile */
    int64_t ldc;            /* C's rows, across batches, this many elements apart; -1: not evenly */
    hr_claims claims;       /* the work items */
    atomic_int failed;
};

/* Steps per prefetched line: the prefetches run over the unit's last
 * PF_WINDOW x lines steps, not from its start (AVX2's widened form, whose
 * steps are its few tile calls, spreads over all of them), so that with
 * many rows the x rows streaming through L2 meanwhile do not evict them
 * before use (Qwen3 shapes, one thread, cold weights: even at 64 rows,
 * within 1% at 512). */
#define PF_WINDOW 2

/* The lines of the panel used next, prefetched a few per step of this
 * one (a K step; for AVX2's widened form a tile call over one K block), so
 * the misses spread over its math: a burst would fill the core's miss
 * buffers and stall the loads behind it. Packed: one contiguous
 * panel; packing per call: the next PN weight rows, too many streams for
 * the hardware prefetcher, one contiguous range when the rows are back to
 * back (a linear's weight). Four registers, so that the tile keeps its row
 * addresses in general ones. */
typedef struct pf_panel {
    const char *p, *end; /* next line, end of the range (p == end: done) */
    int64_t wait;        /* steps before the first line */
    int64_t per_step;    /* lines per step */
} pf_panel;

static inline void pf_lines(pf_panel *pf) {
    if (pf->wait > 0) {
        pf->wait--;
        return;
    }
    for (int64_t i = 0; i < pf->per_step && pf->p < pf->end; i++, pf->p += 64) _mm_prefetch(pf->p, _MM_HINT_T1);
}

/* What unit `next` reads, as a prefetch stream over `steps` steps
 * (nothing when `next` is past the end or one row group reads the panel:
 * the hardware prefetcher streams it best alone). */
pf_panel hr_gemm_panel_next_stream(const panel_ctx *ctx, int64_t next, int64_t steps);

/* Runs ctx->unit over every unit, split across the pool (ctx's g, unit,
 * x or x32, row0, ldx, rows, packed, amx and row_chunk set; the rest is
 * filled in). The work items are (unit, chunk of row_chunk rows), a unit's
 * chunks consecutive. */
hr_status hr_gemm_panel_dispatch(panel_ctx *ctx);

#endif
