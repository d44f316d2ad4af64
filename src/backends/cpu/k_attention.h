/* Shared state of the CPU sdpa kernel (k_attention.c) and its AVX-512
 * BF16 paths (k_attention_avx512.c): the call's context, the per-worker
 * scratch of the portable paths, and the masking and softmax helpers both
 * use. */
#ifndef HR_BACKENDS_CPU_K_ATTENTION_H
#define HR_BACKENDS_CPU_K_ATTENTION_H

#include <math.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/cpu/gemm.h"
#include "core/tensor_impl.h"
#include "hubrt/ops.h"

#define HR_ATTN_BQ 48 /* query rows per block, a multiple of HR_GEMM_F32_MR and of 6 */
#define HR_ATTN_BK 64 /* keys per block, a multiple of HR_GEMM_F32_NR and of 16 */
#define HR_ATTN_DEC_ROWS 8    /* rep * s up to this takes the direct (decode) path */
#define HR_ATTN_DEC_SPLIT 256 /* least keys per decode split (a multiple of BK), splits counted from key 0 */
#define HR_ATTN_DEC_MAX_SPLITS 64 /* decode splits per (batch, kv head) at most, bounding c->parts */
#define HR_ATTN_CHUNK 16 /* bf16 prefill: most row blocks per unit, whose running state the scratch holds */

typedef struct attn_ctx {
    const hr_tensor *q, *k, *v, *mask;
    hr_tensor *o;
    int64_t b, hq, hkv, s, t, d, dv;
    int64_t rep; /* q heads per kv head */
    int64_t dvpad; /* dv rounded up to HR_GEMM_F32_NR */
    float scale, softcap;
    int64_t window;
    bool causal, avx2;
    bool bf16;       /* bf16 q/k/v on AVX-512 BF16: the k_attention_avx512.c paths */
    hr_gemm_ukr_fn ukr;
    int64_t mstr[4]; /* mask strides against [b, hq, s, t]; 0 where it broadcasts */
    int64_t rblocks, units; /* row blocks of HR_ATTN_BQ over rep * s rows */
    int64_t chunks;  /* bf16 prefill: chunks of up to HR_ATTN_CHUNK row blocks per (batch, kv head) */
    bool decode;     /* few rows: the direct path, its keys in splits */
    int64_t dsplit;  /* keys per split: HR_ATTN_DEC_SPLIT times kv heads per thread, more past
                      * HR_ATTN_DEC_MAX_SPLITS of them */
    int64_t nsplit;  /* key splits per (batch, kv head) in the direct path */
    float *parts;    /* [units][rep * s][2 + dv]: max, denominator, numerators; NULL when nsplit is 1 */
    float *sinks;    /* [hq] each head's sink logit (attr sinks), or NULL */
    int nth;         /* threads the call runs on */
    atomic_llong next; /* next unit to claim */
    atomic_int failed;
} attn_ctx;

/* Decode uses qp as [rows][d] query rows, kp as one key row [d] (bf16:
 * [16][d] of them), vp as one value row, st and ot as [rows][..]. */
typedef struct attn_scratch {
    float *qp;   /* [BQ/MR][d][MR] pre-scaled query panels */
    float *kp;   /* [BK/NR][d][NR] key panels (K^T) */
    float *vp;   /* [dvpad/NR][BK][NR] value panels */
    float *pp;   /* [BQ/MR][BK][MR] probability panels */
    float *st;   /* [BQ][BK] scores, then probabilities */
    float *ot;   /* [BQ][dvpad] running numerators */
    float *row;  /* [8 * max(d, dv, BK)] converted rows, or a mask row */
    float m[HR_ATTN_BQ], l[HR_ATTN_BQ]; /* running max and denominator per query row */
    int64_t next; /* decode: the unit this worker runs next (prefetched ahead: its K/V, or its first K block), or -1 */
} attn_scratch;

/* The softmax denominator of q head h, whose visible scores have max m
 * and sum l of exp(score - m): with a sink, its exp(sink - m) too (a key
 * of its own that holds no value; no visible key, m = -inf: infinite, so
 * the row is 0, as transformers' softmax gives the sink all of it). */
static inline float hr_attn_den(const attn_ctx *c, int64_t h, float m, float l) {
    return c->sinks ? l + expf(c->sinks[h] - m) : l;
}

static inline char *hr_attn_at(const hr_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    return (char *)hr_tensor_ptr(t) +
           (i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2]) * (int64_t)hr_dtype_size(t->dtype);
}

/* Fills c for the call (q, k, v[, mask] -> o): shapes, attributes, the
 * path, its units and threads; allocates nothing. */
void hr_attn_plan(attn_ctx *c, const hr_attrs_sdpa *a, const hr_tensor *const *in, int n_in, hr_tensor *o);
/* Bytes of scratch each worker of the planned call allocates, and of the
 * decode splits' partial results (c->parts) the call allocates. */
size_t hr_attn_scratch_bytes(const attn_ctx *c);
size_t hr_attn_parts_bytes(const attn_ctx *c);
size_t hr_attn_bf16_scratch_bytes(const attn_ctx *c);

/* How many keys of [j0, j0+nk) rows [r0, r0+nq) need: up to the last one
 * the mask shows any of them (0: none). */
int hr_attn_block_keys(const attn_ctx *c, int64_t bi, int64_t kvh, int64_t r0, int64_t nq, int64_t j0, int nk);

/* Prefetches n rows of len bytes, ld apart: adjacent rows (the cache's
 * layout) as one range, one compare per line rather than a loop per row. */
static inline __attribute__((always_inline)) void hr_attn_pf_rows(const char *p, int64_t len, int64_t ld, int64_t n) {
    if (ld == len) {
        for (const char *end = p + n * len; p < end; p += 64) _mm_prefetch(p, _MM_HINT_T1);
        return;
    }
    for (; n > 0; n--, p += ld)
        for (int64_t e = 0; e < len; e += 64) _mm_prefetch(p + e, _MM_HINT_T1);
}

/* Prefetching in a decode unit (the direct AVX2 one and the AVX-512 BF16
 * one), one step ahead of what is read: while a block's scores read its K
 * rows, the same block's V rows are fetched, and while the value pass reads them, the K rows of the next
 * block the mask shows any of (past the unit's last, the first such block
 * of the worker's next unit), each at the rate the rows ahead are read,
 * into L2. In a model step K/V come from memory (the layer's weights
 * streamed through the cache since the step before). The whole next unit
 * prefetched during the scores only (attn_pf, which the portable decode
 * path still uses) issued two lines per line read there: its prefetch
 * instructions took an eighth of the score pass's samples (perf, K/V in
 * L3), and the value pass still waited on its first V loads
 * (bench_attention, cold b=1 t=540 case). */
typedef struct rows_pf {
    const char *p; /* row 0; NULL: nothing to prefetch */
    int64_t ld;    /* bytes from one row to the next */
    int n;         /* rows */
    int lines;     /* 64-byte lines per row */
} rows_pf;

/* Lines [l0, l1) of rows [j, j + n) of b (the rows there are). */
static inline __attribute__((always_inline)) void hr_attn_rows_pf_lines(const rows_pf *b, int j, int n, int l0, int l1) {
    if (!b->p) return;
    if (l1 > b->lines) l1 = b->lines;
    for (int end = j + n < b->n ? j + n : b->n; j < end; j++)
        for (int l = l0; l < l1; l++) _mm_prefetch(b->p + j * b->ld + 64 * (int64_t)l, _MM_HINT_T1);
}

/* Rows [j0, j0 + n) of head (bi, kvh) of t as prefetch rows, width
 * elements each. */
rows_pf hr_attn_kv_rows(const hr_tensor *t, int64_t bi, int64_t kvh, int64_t j0, int n, int64_t width);
/* The first block at or after *j0 (blocks BK apart, below hi) that the
 * mask shows any key of to the unit's rows: *j0 moves to it, and the
 * count of its keys up to the last one shown is returned (0: none left). */
int hr_attn_visible_block(const attn_ctx *c, int64_t bi, int64_t kvh, int64_t *j0, int64_t hi);
/* The K rows of the first block the worker's next unit (s->next) reads. */
rows_pf hr_attn_next_unit_keys(const attn_ctx *c, const attn_scratch *s);

/* Masks scores p[0..nk) of query qi (position pos) of head h against keys
 * j0..: softcap, user mask, causal, window. tmp holds nk floats. */
void hr_attn_mask_row(const attn_ctx *c, float *tmp, float *p, int64_t bi, int64_t h, int64_t qi, int64_t pos,
                      int64_t j0, int nk);
/* Online softmax step of row i: scores become probabilities; returns the
 * factor for the row's earlier numerators. */
float hr_attn_softmax_step(const attn_ctx *c, attn_scratch *s, float *p, int nk, int64_t i);
/* Starts a decode unit of split sp: running max and denominator reset,
 * numerators o [rows][dv] zeroed, and its key range [lo, hi). */
void hr_attn_decode_start(const attn_ctx *c, attn_scratch *s, int64_t sp, float *o, int64_t *lo, int64_t *hi);
/* Ends decode unit u: its rows' numerators o [rows][dv] go to c->parts,
 * or, with one split, normalized straight to the output. */
void hr_attn_decode_finish(const attn_ctx *c, const attn_scratch *s, int64_t u, float *o);

/* bf16 prefill worker (units claimed from c->next) and decode unit. */
void hr_attn_bf16_worker(void *arg, int ith, int nth);
void hr_attn_bf16_decode_unit(const attn_ctx *c, attn_scratch *s, int64_t u);

/* The batch-invariant path (k_attention_exact.c); false when out of
 * memory. */
bool hr_attn_exact(const attn_ctx *c, int64_t from);

#endif
