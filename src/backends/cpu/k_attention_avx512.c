/* AVX-512 BF16 paths of sdpa, for bf16 q/k/v with contiguous features and
 * d, dv multiples of 32 (k_attention.c chooses them).
 *
 * Prefill: both products on vdpbf16ps, which multiplies bf16 pairs exactly
 * and accumulates in f32. S = Q K^T broadcasts a query's feature pair
 * against a K block packed as [d/2][BK keys] pairs (K^T); the scale goes on
 * the f32 scores. The online softmax runs in f32 and rounds P to bf16 for
 * O += P V, as PyTorch's CPU flash attention does for reduced types, with
 * V packed as [BK/2][dv] key pairs. A unit is a chunk of up to
 * HR_ATTN_CHUNK query blocks of one (batch, kv head), run key block by key
 * block: each K/V block is packed once for every block of the chunk, and
 * the scratch is the chunk's running state and one packed block, bounded
 * whatever the number of keys.
 *
 * Decode: a few rows per (batch, kv head), so no packing: Q.K with
 * vdpbf16ps on rows read in place, sixteen keys' dot products reduced into
 * one vector of scores; P.V as f32 FMAs on V rows widened from bf16. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/k_attention.h"
#include "backends/cpu/simd_math.h"
#include "backends/cpu/transpose_avx512.h"
#include "core/iter.h"

#define TARGET_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE_ static inline __attribute__((always_inline)) TARGET_
#define BQ HR_ATTN_BQ
#define BK HR_ATTN_BK
#define TR 6 /* query rows per register tile: 6 x 64 scores or 6 x 64 outputs in 24 zmm */

/* exp on 16 lanes for x <= 0 (scores less their running max); x below -87
 * (and -inf, whose NaN the last step drops) gives 0. Degree 5 on
 * |r| <= ln2 / 2 is within 4e-6 relative, far inside the bf16 rounding of
 * the probabilities; no clamping, since x <= 0 and scalef takes any n. */
INLINE_ __m512 exp16(__m512 x) {
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 120);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* exp(v - m) on 16 lanes for v <= m, given ml = m log2(e): v log2(e) - ml
 * in one rounding, then 2^n 2^f with 2^f of the fraction |f| <= 1/2 by a
 * degree-4 polynomial fitted for relative error (within 3e-6, as exp16):
 * three operations fewer than exp16 of v - m, run on every score of a
 * prefill. Masked scores (-inf), and every score while the row's max is
 * still -inf (NaN), give 0. */
INLINE_ __m512 exp16_less(__m512 v, __m512 ml) {
    __m512 y = _mm512_fmsub_ps(v, _mm512_set1_ps(1.44269504088896341f), ml);
    __mmask16 keep = _mm512_cmp_ps_mask(y, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
    __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.009582852944731712f), f, _mm512_set1_ps(0.055906426161527634f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24024099111557007f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931241750717163f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* The first n lanes of a 16-lane chunk (none for n <= 0, all for n >= 16). */
INLINE_ __mmask16 lanes_left(int n) { return n >= 16 ? (__mmask16)0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0; }

/* The sums (or, with max, the maxima) of a[0..16) as the lanes of one
 * vector. */
INLINE_ __m512 reduce16(__m512 a[16], bool max) {
#define OP_(x, y) (max ? _mm512_max_ps(x, y) : _mm512_add_ps(x, y))
    __m512 x[8], y[4];
    for (int i = 0; i < 8; i++)
        x[i] = OP_(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    /* y[k], 128-bit lane L: lane L's partial results of a[4k..4k+3] */
    for (int k = 0; k < 4; k++)
        y[k] = OP_(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0x44), _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0xee));
    __m512 z01 = OP_(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xdd));
    __m512 z23 = OP_(_mm512_shuffle_f32x4(y[2], y[3], 0x88), _mm512_shuffle_f32x4(y[2], y[3], 0xdd));
    return OP_(_mm512_shuffle_f32x4(z01, z23, 0x88), _mm512_shuffle_f32x4(z01, z23, 0xdd));
#undef OP_
}

/* ---- prefill: packing ---- */

/* Keys [j0, j0+nk) of head (bi, kvh) into dst [d/2][BK] feature pairs
 * (K^T), zeros up to the next multiple of 16 (no reader goes further). */
TARGET_ static void pack_k(const attn_ctx *c, int64_t bi, int64_t kvh, int64_t j0, int nk, uint32_t *dst) {
    int64_t d2 = c->d / 2;
    for (int g = 0; g < nk; g += 16) {
        const uint16_t *rowp[16];
        for (int x = 0; x < 16; x++)
            rowp[x] = g + x < nk ? (const uint16_t *)hr_attn_at(c->k, bi, kvh, j0 + g + x) : NULL;
        for (int64_t h = 0; h < d2; h += 16) {
            __m512i r[16];
            for (int x = 0; x < 16; x++) r[x] = rowp[x] ? _mm512_loadu_si512(rowp[x] + 2 * h) : _mm512_setzero_si512();
            hr_transpose16_u32(r);
            for (int x = 0; x < 16; x++) _mm512_storeu_si512(dst + (h + x) * BK + g, r[x]);
        }
    }
}

/* Values [j0, j0+nk) into dst [BK/2][dv][2]: each pair of keys interleaved
 * feature by feature (the second of an odd tail is zero). */
TARGET_ static void pack_v(const attn_ctx *c, int64_t bi, int64_t kvh, int64_t j0, int nk, uint16_t *dst) {
    uint16_t ilo[32], ihi[32];
    for (int m = 0; m < 16; m++) {
        ilo[2 * m] = (uint16_t)m, ilo[2 * m + 1] = (uint16_t)(32 + m);
        ihi[2 * m] = (uint16_t)(16 + m), ihi[2 * m + 1] = (uint16_t)(48 + m);
    }
    __m512i lo = _mm512_loadu_si512(ilo), hi = _mm512_loadu_si512(ihi);
    int64_t dv = c->dv;
    for (int jp = 0; jp < (nk + 1) / 2; jp++) {
        const uint16_t *a = (const uint16_t *)hr_attn_at(c->v, bi, kvh, j0 + 2 * jp);
        const uint16_t *b = 2 * jp + 1 < nk ? (const uint16_t *)hr_attn_at(c->v, bi, kvh, j0 + 2 * jp + 1) : NULL;
        uint16_t *out = dst + jp * dv * 2;
        for (int64_t f = 0; f < dv; f += 32) {
            __m512i va = _mm512_loadu_si512(a + f), vb = b ? _mm512_loadu_si512(b + f) : _mm512_setzero_si512();
            _mm512_storeu_si512(out + 2 * f, _mm512_permutex2var_epi16(va, lo, vb));
            _mm512_storeu_si512(out + 2 * f + 32, _mm512_permutex2var_epi16(va, hi, vb));
        }
    }
}

/* ---- prefill: the two products ---- */

/* st [TR][16 ng] = scale * q kp: q [TR][d/2] bf16 pairs, kp [d/2][BK] */
INLINE_ void tile_qk(int ng, int64_t d2, const uint32_t *q, const uint32_t *kp, float *st, float scale) {
    __m512 acc[TR][4];
#pragma GCC unroll 6
    for (int i = 0; i < TR; i++)
#pragma GCC unroll 4
        for (int z = 0; z < ng; z++) acc[i][z] = _mm512_setzero_ps();
    for (int64_t e = 0; e < d2; e++, kp += BK) {
        __m512bh k[4];
#pragma GCC unroll 4
        for (int z = 0; z < ng; z++) k[z] = (__m512bh)_mm512_loadu_si512(kp + 16 * z);
#pragma GCC unroll 6
        for (int i = 0; i < TR; i++) {
            __m512bh qi = (__m512bh)_mm512_set1_epi32((int)q[i * d2 + e]);
#pragma GCC unroll 4
            for (int z = 0; z < ng; z++) acc[i][z] = _mm512_dpbf16_ps(acc[i][z], qi, k[z]);
        }
    }
    __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 6
    for (int i = 0; i < TR; i++)
#pragma GCC unroll 4
        for (int z = 0; z < ng; z++) _mm512_storeu_ps(st + i * BK + 16 * z, _mm512_mul_ps(acc[i][z], sc));
}

/* The scores of the first nk keys of the block (those past them are left
 * as they were: the softmax reads nk). */
TARGET_ static void tile_qk_keys(int nk, int64_t d2, const uint32_t *q, const uint32_t *kp, float *st, float scale) {
    switch ((nk + 15) / 16) {
    case 1: tile_qk(1, d2, q, kp, st, scale); break;
    case 2: tile_qk(2, d2, q, kp, st, scale); break;
    case 3: tile_qk(3, d2, q, kp, st, scale); break;
    default: tile_qk(4, d2, q, kp, st, scale); break;
    }
}

/* o [TR][16 nz] (row stride dv) = corr o + p vp over np key pairs:
 * p [TR][BK/2] bf16 pairs, vp [np][dv][2] from the tile's first feature,
 * corr [TR] the online softmax's factors for the earlier numerators (no
 * separate pass over o, and no branch on whether the max moved). */
INLINE_ void tile_pv(int np, int nz, const uint32_t *p, const uint16_t *vp, int64_t dv, float *o, const float *corr) {
    __m512 acc[TR][4];
#pragma GCC unroll 6
    for (int i = 0; i < TR; i++) {
        __m512 f = _mm512_set1_ps(corr[i]);
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++) acc[i][z] = _mm512_mul_ps(_mm512_loadu_ps(o + i * dv + 16 * z), f);
    }
    for (int jp = 0; jp < np; jp++, vp += 2 * dv) {
        __m512bh v[4];
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++) v[z] = (__m512bh)_mm512_loadu_si512(vp + 32 * z);
#pragma GCC unroll 6
        for (int i = 0; i < TR; i++) {
            __m512bh pi = (__m512bh)_mm512_set1_epi32((int)p[i * (BK / 2) + jp]);
#pragma GCC unroll 4
            for (int z = 0; z < nz; z++) acc[i][z] = _mm512_dpbf16_ps(acc[i][z], pi, v[z]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < TR; i++)
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++) _mm512_storeu_ps(o + i * dv + 16 * z, acc[i][z]);
}

/* The online softmax of a block's rows: scores st [BQ][BK] of the keys
 * nkt[i / TR] each row's tile reads become probabilities in bf16
 * p [BQ][BK] (zeros from the keys row i sees, vis[i], to the 16 multiple
 * past its tile's keys), against running maxima m updated 16 rows at a
 * time; l [BQ][16] (lane sums) and corr [BQ] get the factors for the
 * earlier numerators. Rows whose tile skips the block are left alone. The
 * rows' maxima come from one transposing reduction per 16 rows and their
 * factors from one exp, with no branch on the data: per row, a reduction,
 * an exp and a branch on whether the max moved cost a fifth of a causal
 * prefill. */
INLINE_ void block_softmax(int64_t nq, const int *nkt, const int *vis, const float *st, uint16_t *p, float *m,
                           float (*l)[16], float *corr) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t g = 0; g < nq; g += 16) {
        int n = nq - g < 16 ? (int)(nq - g) : 16;
        __m512 pm[16];
        for (int k = 0; k < 16; k++) {
            pm[k] = ninf;
            if (k >= n) continue;
            int64_t i = g + k;
            for (int z = 0; z < (nkt[i / TR] + 15) / 16; z++)
                pm[k] = _mm512_max_ps(pm[k], _mm512_mask_loadu_ps(ninf, lanes_left(vis[i] - 16 * z), st + i * BK + 16 * z));
        }
        __m512 mo = _mm512_loadu_ps(m + g), mn = _mm512_max_ps(mo, reduce16(pm, true));
        /* exp(-inf - -inf) is NaN, which exp16 zeroes: 1 for rows that saw nothing yet */
        __mmask16 none = _mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ);
        __m512 f = _mm512_mask_blend_ps(none, exp16(_mm512_sub_ps(mo, mn)), _mm512_set1_ps(1.0f));
        _mm512_mask_storeu_ps(m + g, lanes_left(n), mn);
        _mm512_storeu_ps(corr + g, f);
    }
    for (int64_t i = 0; i < nq; i++) {
        int nz = (nkt[i / TR] + 15) / 16;
        if (!nz) continue;
        __m512 ml = _mm512_set1_ps(m[i] * 1.44269504088896341f), sum = _mm512_setzero_ps();
        for (int z = 0; z < nz; z++) {
            __m512 v = _mm512_mask_loadu_ps(ninf, lanes_left(vis[i] - 16 * z), st + i * BK + 16 * z);
            __m512 e = exp16_less(v, ml);
            sum = _mm512_add_ps(sum, e);
            _mm256_storeu_si256((__m256i *)(p + i * BK + 16 * z), (__m256i)_mm512_cvtneps_pbh(e));
        }
        _mm512_storeu_ps(l[i], _mm512_fmadd_ps(_mm512_loadu_ps(l[i]), _mm512_set1_ps(corr[i]), sum));
    }
}

INLINE_ void scale_row(float *o, int64_t n, float f) {
    __m512 fv = _mm512_set1_ps(f);
    for (int64_t e = 0; e < n; e += 16) _mm512_storeu_ps(o + e, _mm512_mul_ps(_mm512_loadu_ps(o + e), fv));
}

typedef struct bf16_scratch {
    uint16_t *q;  /* [CHUNK * BQ][d] the chunk's query rows, zeros past a block's last to its tile multiple */
    float *o;     /* [CHUNK * BQ][dv] running numerators */
    float *m;     /* [CHUNK * BQ] running max */
    float *l;     /* [CHUNK * BQ][16] running denominator as lane sums */
    uint32_t *kp; /* [d/2][BK] the key block (K^T pairs) */
    uint16_t *vp; /* [BK/2][dv][2] its values */
    float *st;    /* [BQ][BK] scores */
    uint16_t *p;  /* [BQ][BK] probabilities */
    float *tmp;   /* [BK] a mask row */
} bf16_scratch;

#define CHUNK HR_ATTN_CHUNK
#define NPART 9

/* The scratch parts' byte sizes, in bf16_scratch's order; returns the
 * total, each part rounded up to a cache line. None grows with s or t. */
static size_t bf16_layout(const attn_ctx *c, size_t bytes[NPART]) {
    size_t rows = (size_t)CHUNK * BQ, d = (size_t)c->d, dv = (size_t)c->dv;
    size_t b[NPART] = {sizeof(uint16_t) * rows * d, sizeof(float) * rows * dv, sizeof(float) * rows,
                       sizeof(float) * rows * 16,   sizeof(uint16_t) * BK * d,  sizeof(uint16_t) * BK * dv,
                       sizeof(float) * BQ * BK,     sizeof(uint16_t) * BQ * BK, sizeof(float) * BK};
    size_t total = 0;
    for (int i = 0; i < NPART; i++) total += bytes[i] = (b[i] + 63) / 64 * 64;
    return total;
}

size_t hr_attn_bf16_scratch_bytes(const attn_ctx *c) {
    size_t bytes[NPART];
    return bf16_layout(c, bytes);
}

/* A query block's place in its unit: rows r0.. of the pair (row r is
 * query r / rep of q head kvh * rep + r % rep, as in the portable path),
 * its state at slot b of the scratch, and the keys [lo, hi) it reads. */
typedef struct bf16_block {
    int64_t r0, nq, ntile, lo, hi;
    uint16_t *q;
    float *o, *m, (*l)[16];
} bf16_block;

/* Loads block rb's query rows into slot b and resets its running state. */
static void bf16_block_start(const attn_ctx *c, bf16_scratch *s, int64_t bi, int64_t kvh, int64_t rb, int b,
                             bf16_block *blk) {
    int64_t rows = c->rep * c->s, d = c->d, dv = c->dv;
    blk->r0 = rb * BQ;
    blk->nq = rows - blk->r0 < BQ ? rows - blk->r0 : BQ;
    blk->ntile = (blk->nq + TR - 1) / TR;
    blk->q = s->q + (int64_t)b * BQ * d;
    blk->o = s->o + (int64_t)b * BQ * dv;
    blk->m = s->m + b * BQ;
    blk->l = (float(*)[16])(s->l + b * BQ * 16);
    for (int64_t i = 0; i < blk->ntile * TR; i++) {
        int64_t r = blk->r0 + i;
        if (i < blk->nq)
            memcpy(blk->q + i * d, hr_attn_at(c->q, bi, kvh * c->rep + r % c->rep, r / c->rep),
                   sizeof(uint16_t) * (size_t)d);
        else
            memset(blk->q + i * d, 0, sizeof(uint16_t) * (size_t)d);
        blk->m[i] = -INFINITY;
        memset(blk->l[i], 0, sizeof blk->l[i]);
    }
    memset(blk->o, 0, sizeof(float) * (size_t)(blk->ntile * TR * dv));
    /* Keys past the last row's position (causal) or before the first row's
     * window are never read. */
    int64_t pos_first = c->t - c->s + blk->r0 / c->rep, pos_last = c->t - c->s + (blk->r0 + blk->nq - 1) / c->rep;
    blk->lo = 0, blk->hi = c->t;
    if (c->causal && pos_last + 1 < blk->hi) blk->hi = pos_last + 1;
    if (c->window > 0 && pos_first - c->window + 1 > blk->lo) blk->lo = pos_first - c->window + 1;
}

/* A bool mask with unit key stride, and nothing else hiding keys: its
 * rows are read as bits (a compiled step's or prefill's mask). */
static bool mask_as_bits(const attn_ctx *c) {
    return c->mask && c->mask->dtype == HR_BOOL && c->mstr[3] == 1 && !c->causal && !(c->softcap > 0) &&
           c->window <= 0;
}

/* bits[i]: the keys [j0, j0+nk) the mask shows block row i, bit j for key
 * j0 + j (BK is 64: one load a row). */
INLINE_ void mask_bits(const attn_ctx *c, int64_t bi, int64_t kvh, const bf16_block *blk, int64_t j0, int nk,
                       uint64_t *bits) {
    __mmask64 lanes = nk >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << nk) - 1;
    for (int64_t i = 0; i < blk->nq; i++) {
        int64_t r = blk->r0 + i;
        const uint8_t *mp = (const uint8_t *)hr_tensor_ptr(c->mask) + bi * c->mstr[0] +
                            (kvh * c->rep + r % c->rep) * c->mstr[1] + (r / c->rep) * c->mstr[2] + j0;
        __m512i m = _mm512_maskz_loadu_epi8(lanes, mp);
        bits[i] = _cvtmask64_u64(_mm512_test_epi8_mask(m, m));
    }
}

/* The block's rows against the packed keys [j0, j0+nk): scores, masks,
 * the online softmax, and the numerators' update. */
TARGET_ static void bf16_block_step(const attn_ctx *c, bf16_scratch *s, int64_t bi, int64_t kvh,
                                    const bf16_block *blk, int64_t j0, int nk) {
    _Static_assert(BK == 64, "mask_bits reads a block's mask row as one 64-bit word");
    int64_t d2 = c->d / 2, dv = c->dv, ntile = blk->ntile;
    uint64_t bits[BQ];
    bool as_bits = mask_as_bits(c);
    if (as_bits) mask_bits(c, bi, kvh, blk, j0, nk, bits);
    /* Keys of the block visible to each tile's last row (causal), or up to
     * the last one the mask shows any of its rows; none for tiles wholly
     * above the diagonal, which skip the block. */
    int nkt[BQ / TR];
    for (int64_t ti = 0; ti < ntile; ti++) {
        int64_t i1 = ti * TR + TR < blk->nq ? ti * TR + TR : blk->nq;
        int64_t last = blk->r0 + i1 - 1, pos = c->t - c->s + last / c->rep;
        nkt[ti] = c->causal && pos - j0 + 1 < nk ? (int)(pos - j0 + 1 > 0 ? pos - j0 + 1 : 0) : nk;
        if (as_bits) {
            uint64_t any = 0;
            for (int64_t i = ti * TR; i < i1; i++) any |= bits[i];
            nkt[ti] = any ? 64 - __builtin_clzll(any) : 0;
        }
        if (nkt[ti] > 0)
            tile_qk_keys(nkt[ti], d2, (const uint32_t *)blk->q + ti * TR * d2, s->kp, s->st + ti * TR * BK, c->scale);
    }
    /* Keys each row sees: causal alone, on diagonal blocks, and a mask row
     * that shows a prefix of the block are a lane limit; a mask row with
     * holes sets them to -inf; other masks go through the generic row
     * masking. */
    int vis[BQ];
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < blk->nq; i++) {
        int nkr = vis[i] = nkt[i / TR];
        if (!nkr) continue;
        int64_t r = blk->r0 + i, qi = r / c->rep, pos = c->t - c->s + qi;
        if (as_bits) {
            uint64_t b = bits[i];
            vis[i] = b ? 64 - __builtin_clzll(b) : 0;
            if (b & (b + 1)) /* not a prefix */
                for (int z = 0; 16 * z < vis[i]; z++)
                    _mm512_mask_storeu_ps(s->st + i * BK + 16 * z, (__mmask16)~(b >> 16 * z), ninf);
        } else if (c->softcap > 0 || c->mask || (c->window > 0 && pos - j0 >= c->window))
            hr_attn_mask_row(c, s->tmp, s->st + i * BK, bi, kvh * c->rep + r % c->rep, qi, pos, j0, nkr);
        else if (c->causal && j0 + nkr - 1 > pos)
            vis[i] = (int)(pos - j0 + 1 > 0 ? pos - j0 + 1 : 0);
    }
    float corr[BQ];
    block_softmax(blk->nq, nkt, vis, s->st, s->p, blk->m, blk->l, corr);
    for (int64_t i = blk->nq; i < ntile * TR; i++) {
        memset(s->p + i * BK, 0, sizeof(uint16_t) * BK);
        corr[i] = 1.0f;
    }
    for (int64_t ti = 0; ti < ntile; ti++) {
        if (!nkt[ti]) continue;
        const uint32_t *p = (const uint32_t *)s->p + ti * TR * (BK / 2);
        float *o = blk->o + ti * TR * dv;
        int np = (nkt[ti] + 1) / 2;
        int64_t f = 0;
        for (; f + 64 <= dv; f += 64) tile_pv(np, 4, p, s->vp + 2 * f, dv, o + f, corr + ti * TR);
        if (f < dv) tile_pv(np, 2, p, s->vp + 2 * f, dv, o + f, corr + ti * TR);
    }
}

TARGET_ static void bf16_block_finish(const attn_ctx *c, int64_t bi, int64_t kvh, const bf16_block *blk) {
    for (int64_t i = 0; i < blk->nq; i++) {
        int64_t r = blk->r0 + i;
        float *oi = blk->o + i * c->dv;
        float l = hr_attn_den(c, kvh * c->rep + r % c->rep, blk->m[i],
                              _mm512_reduce_add_ps(_mm512_loadu_ps(blk->l[i])));
        scale_row(oi, c->dv, l > 0 ? 1.0f / l : 0.0f);
        char *dst = hr_attn_at(c->o, bi, kvh * c->rep + r % c->rep, r / c->rep);
        if (c->o->dtype == HR_BF16 && c->o->strides[3] == 1)
            hr_bf16_row_store_avx512((uint16_t *)dst, oi, NULL, c->dv);
        else
            hr_store_f32(dst, c->o->dtype, oi, c->dv, c->o->strides[3]);
    }
}

/* Unit u: a chunk of up to CHUNK row blocks of one (batch, kv head) pair,
 * the last chunks of every pair first: causal rows grow in work with their
 * position, and claiming the largest units first leaves the smallest ones
 * to even out the threads at the end. Key blocks run in the outer loop,
 * each packed once for all the chunk's blocks that read it, so the scratch
 * holds one key block and the chunk's running state, whatever t is. */
static void bf16_unit(const attn_ctx *c, bf16_scratch *s, int64_t u) {
    int64_t pairs = c->b * c->hkv, ch = c->chunks - 1 - u / pairs, pair = u % pairs;
    int64_t bi = pair / c->hkv, kvh = pair % c->hkv;
    int64_t per = (c->rblocks + c->chunks - 1) / c->chunks;
    int64_t rb0 = ch * per, rb1 = rb0 + per < c->rblocks ? rb0 + per : c->rblocks;
    int nb = (int)(rb1 - rb0);
    bf16_block blk[CHUNK];
    int64_t lo = c->t, hi = 0;
    for (int b = 0; b < nb; b++) {
        bf16_block_start(c, s, bi, kvh, rb0 + b, b, &blk[b]);
        if (blk[b].lo < lo) lo = blk[b].lo;
        if (blk[b].hi > hi) hi = blk[b].hi;
    }
    /* Blocks start at multiples of BK, the same for every query block; the
     * keys of a block before a query block's lo are masked by its window. */
    for (int64_t j0 = lo / BK * BK; j0 < hi; j0 += BK) {
        int nkb[CHUNK], nmax = 0;
        for (int b = 0; b < nb; b++) {
            nkb[b] = j0 < blk[b].hi && j0 + BK > blk[b].lo ? (int)(blk[b].hi - j0 < BK ? blk[b].hi - j0 : BK) : 0;
            if (c->mask && nkb[b]) nkb[b] = hr_attn_block_keys(c, bi, kvh, blk[b].r0, blk[b].nq, j0, nkb[b]);
            if (nkb[b] > nmax) nmax = nkb[b];
        }
        if (!nmax) continue;
        pack_k(c, bi, kvh, j0, nmax, s->kp);
        pack_v(c, bi, kvh, j0, nmax, s->vp);
        /* The next block's K/V rows are fetched into L2 while this one
         * computes, a share before each query block: packing reads sixteen
         * rows at once across their features, which the hardware
         * prefetcher does not follow. */
        int64_t jn = j0 + BK, nn = hi - jn < BK ? hi - jn : BK;
        for (int b = 0; b < nb; b++) {
            if (nn > 0) {
                int64_t a0 = nn * b / nb, a1 = nn * (b + 1) / nb;
                hr_attn_pf_rows(hr_attn_at(c->k, bi, kvh, jn + a0), 2 * c->d, 2 * c->k->strides[2], a1 - a0);
                hr_attn_pf_rows(hr_attn_at(c->v, bi, kvh, jn + a0), 2 * c->dv, 2 * c->v->strides[2], a1 - a0);
            }
            if (nkb[b]) bf16_block_step(c, s, bi, kvh, &blk[b], j0, nkb[b]);
        }
    }
    for (int b = 0; b < nb; b++) bf16_block_finish(c, bi, kvh, &blk[b]);
}

void hr_attn_bf16_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    attn_ctx *c = arg;
    int64_t u = atomic_fetch_add(&c->next, 1);
    if (u >= c->units) return; /* all taken before this worker started */
    size_t bytes[NPART];
    char *mem = aligned_alloc(64, bf16_layout(c, bytes));
    if (!mem) {
        atomic_store(&c->failed, 1);
        return;
    }
    void *part[NPART];
    char *at = mem;
    for (int i = 0; i < NPART; i++) {
        part[i] = at;
        at += bytes[i];
    }
    bf16_scratch s = {.q = part[0], .o = part[1], .m = part[2], .l = part[3], .kp = part[4],
                      .vp = part[5], .st = part[6], .p = part[7], .tmp = part[8]};
    for (; u < c->units; u = atomic_fetch_add(&c->next, 1)) bf16_unit(c, &s, u);
    free(mem);
}

/* ---- decode ---- */

/* st[0..16) = scale * q . k[x] for sixteen key rows [d], ldk apart, d a
 * multiple of 32. The same sixteen keys' rows of vb (from row j; the
 * block's V rows) are prefetched, a few at a time between the keys, not
 * in a burst whose misses would hold up these loads (k_attention.h,
 * rows_pf). */
INLINE_ void dec_qk16_loop(const uint16_t *q, const uint16_t *k, int64_t ldk, int64_t d, float scale, float *st,
                           const rows_pf *vb, int j) {
    __m512 acc[16];
    int64_t steps = d / 32, per = (16 + steps - 1) / steps;
#pragma GCC unroll 16
    for (int x = 0; x < 16; x++) acc[x] = _mm512_setzero_ps();
    for (int64_t e = 0, i = 0; e < d; e += 32, i++) {
        if (i * per < 16) hr_attn_rows_pf_lines(vb, j + (int)(i * per), (int)per, 0, vb->lines);
        __m512bh qv = (__m512bh)_mm512_loadu_si512(q + e);
        const uint16_t *kx = k + e;
#pragma GCC unroll 16
        for (int x = 0; x < 16; x++, kx += ldk) acc[x] = _mm512_dpbf16_ps(acc[x], qv, (__m512bh)_mm512_loadu_si512(kx));
    }
    _mm512_storeu_ps(st, _mm512_mul_ps(reduce16(acc, false), _mm512_set1_ps(scale)));
}

/* dec_qk16_loop with d = 32 * nc (a constant): the query's nc vectors stay
 * in registers and each key row is read whole in turn through one pointer.
 * Looping over d outside the keys, the compiler kept sixteen row addresses
 * live and spilled them, and K vectors with them, to the stack (a quarter
 * of a batch-64 decode unit's time). Each accumulator sums its key's
 * products in the same order as there: the same bits. */
INLINE_ void dec_qk16_nc(int nc, const uint16_t *q, const uint16_t *k, int64_t ldk, float scale, float *st,
                         const rows_pf *vb, int j) {
    __m512 acc[16];
    __m512bh qv[8];
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) qv[c] = (__m512bh)_mm512_loadu_si512(q + 32 * c);
#pragma GCC unroll 16
    for (int x = 0; x < 16; x++, k += ldk) {
        if (x % 4 == 0) hr_attn_rows_pf_lines(vb, j + x, 4, 0, vb->lines);
        acc[x] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) acc[x] = _mm512_dpbf16_ps(acc[x], qv[c], (__m512bh)_mm512_loadu_si512(k + 32 * c));
    }
    _mm512_storeu_ps(st, _mm512_mul_ps(reduce16(acc, false), _mm512_set1_ps(scale)));
}

/* Two query rows against eight key rows (d = 32 * nc, nc <= 4): each K
 * vector read serves both rows, where dec_qk16 reads the block once per
 * row. The sixteen accumulators (row 0's eight keys, then row 1's) go
 * through the same reduce16 as dec_qk16's, whose tree is the same for
 * every accumulator, and each sums its products in the same order: the
 * same bits. st0[0..8) and st1[0..8) get the scores; the rows of vb from
 * j on are prefetched four per four keys, as dec_qk16_nc does. */
INLINE_ void dec_qk8x2_nc(int nc, const uint16_t *q0, const uint16_t *q1, const uint16_t *k, int64_t ldk, float scale,
                          float *st0, float *st1, const rows_pf *vb, int j) {
    __m512 acc[16];
    __m512bh qa[4], qb[4];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        qa[c] = (__m512bh)_mm512_loadu_si512(q0 + 32 * c);
        qb[c] = (__m512bh)_mm512_loadu_si512(q1 + 32 * c);
    }
#pragma GCC unroll 8
    for (int x = 0; x < 8; x++, k += ldk) {
        if (x % 4 == 0) hr_attn_rows_pf_lines(vb, j + x, 4, 0, vb->lines);
        acc[x] = acc[8 + x] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            __m512bh kv = (__m512bh)_mm512_loadu_si512(k + 32 * c);
            acc[x] = _mm512_dpbf16_ps(acc[x], qa[c], kv);
            acc[8 + x] = _mm512_dpbf16_ps(acc[8 + x], qb[c], kv);
        }
    }
    __m512 r = _mm512_mul_ps(reduce16(acc, false), _mm512_set1_ps(scale));
    _mm256_storeu_ps(st0, _mm512_castps512_ps256(r));
    _mm256_storeu_ps(st1, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1)));
}

/* Scores of query rows q0 and q1 against sixteen key rows of d = 128, as
 * two dec_qk16 calls would give them. Only there: bench_attention's cold
 * cases, alternated with one row at a time, gave the Qwen3 shape (d 128,
 * two rows per kv head) 84-86 -> 79-81 us per call, and the SmolLM2 one (d
 * 64, three rows) 20-21 -> 21-22, each accumulator's two products then too
 * few for the reduction after them. */
INLINE_ void dec_qk16x2(const uint16_t *q0, const uint16_t *q1, const uint16_t *k, int64_t ldk, float scale,
                        float *st0, float *st1, const rows_pf *vb, int j) {
    dec_qk8x2_nc(4, q0, q1, k, ldk, scale, st0, st1, vb, j);
    dec_qk8x2_nc(4, q0, q1, k + 8 * ldk, ldk, scale, st0 + 8, st1 + 8, vb, j + 8);
}

INLINE_ void dec_qk16(const uint16_t *q, const uint16_t *k, int64_t ldk, int64_t d, float scale, float *st,
                      const rows_pf *vb, int j) {
    switch (d) {
    case 64: dec_qk16_nc(2, q, k, ldk, scale, st, vb, j); break;
    case 128: dec_qk16_nc(4, q, k, ldk, scale, st, vb, j); break;
    case 256: dec_qk16_nc(8, q, k, ldk, scale, st, vb, j); break;
    default: dec_qk16_loop(q, k, ldk, d, scale, st, vb, j); break;
    }
}

INLINE_ __m512 widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* o [rows][dv] += p [rows][BK] vr over nk value rows [dv], 16 nz features
 * at a time with the rows' accumulators in registers (rows and nz
 * constants): the widest nz that fits reads each V row in one pass. The
 * rows of kb (the next block's keys) are prefetched a share of their
 * lines per pass, one row per key, as pv_rows_avx2 does. */
INLINE_ void dec_pv(int rows, int nz, int nk, const float *p, const uint16_t *const *vr, int64_t dv, float *o,
                    const rows_pf *kb) {
    int share = (int)((kb->lines * 16 * nz + dv - 1) / dv); /* lines per pass */
    for (int64_t f = 0; f < dv; f += 16 * nz) {
        int l0 = (int)(f / (16 * nz)) * share;
        __m512 acc[HR_ATTN_DEC_ROWS][8];
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++)
#pragma GCC unroll 8
            for (int z = 0; z < nz; z++) acc[r][z] = _mm512_loadu_ps(o + r * dv + f + 16 * z);
        for (int j = 0; j < nk; j++) {
            hr_attn_rows_pf_lines(kb, j, 1, l0, l0 + share);
            __m512 v[8];
#pragma GCC unroll 8
            for (int z = 0; z < nz; z++) v[z] = widen16(vr[j] + f + 16 * z);
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {
                __m512 pr = _mm512_set1_ps(p[r * BK + j]);
#pragma GCC unroll 8
                for (int z = 0; z < nz; z++) acc[r][z] = _mm512_fmadd_ps(pr, v[z], acc[r][z]);
            }
        }
        hr_attn_rows_pf_lines(kb, nk, kb->n - nk, l0, l0 + share); /* a next block longer than this one */
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++)
#pragma GCC unroll 8
            for (int z = 0; z < nz; z++) _mm512_storeu_ps(o + r * dv + f + 16 * z, acc[r][z]);
    }
}

/* Up to 16 accumulators: 8 vectors of features for 2 rows, 4 for 4, 2 for 8. */
#define DEC_NZ(rows) ((rows) <= 2 ? 8 : (rows) <= 4 ? 4 : 2)
#define DEC_PV(rows)                                                                                              \
    (dv % (16 * DEC_NZ(rows)) == 0 ? dec_pv(rows, DEC_NZ(rows), nk, p, vr, dv, o, kb) \
                                   : dec_pv(rows, 2, nk, p, vr, dv, o, kb))

TARGET_ static void dec_pv_rows(int rows, int nk, const float *p, const uint16_t *const *vr, int64_t dv, float *o,
                                const rows_pf *kb) {
    switch (rows) {
    case 1: DEC_PV(1); break;
    case 2: DEC_PV(2); break;
    case 3: DEC_PV(3); break;
    case 4: DEC_PV(4); break;
    case 5: DEC_PV(5); break;
    case 6: DEC_PV(6); break;
    case 7: DEC_PV(7); break;
    default: DEC_PV(8); break;
    }
}

/* As attn_decode_unit (k_attention.c): unit (batch, kv head, split), rows
 * and keys read in place. */
TARGET_ void hr_attn_bf16_decode_unit(const attn_ctx *c, attn_scratch *s, int64_t u) {
    int64_t sp = u % c->nsplit, kvh = (u / c->nsplit) % c->hkv, bi = u / (c->nsplit * c->hkv);
    int64_t rows = c->rep * c->s, d = c->d, dv = c->dv;
    const uint16_t *q[HR_ATTN_DEC_ROWS], *vr[BK];
    uint16_t *ktail = (uint16_t *)s->kp; /* [16][d]: the last keys of a block short of 16, zero-padded */
    int64_t ldk = c->k->strides[2];
    float *o = s->ot; /* [rows][dv] */
    for (int64_t r = 0; r < rows; r++)
        q[r] = (const uint16_t *)hr_attn_at(c->q, bi, kvh * c->rep + r % c->rep, r / c->rep);
    int64_t j0, hi;
    hr_attn_decode_start(c, s, sp, o, &j0, &hi);
    const rows_pf none = {0};
    for (int nk = hr_attn_visible_block(c, bi, kvh, &j0, hi); nk;) {
        const uint16_t *k0 = (const uint16_t *)hr_attn_at(c->k, bi, kvh, j0);
        const uint16_t *v0 = (const uint16_t *)hr_attn_at(c->v, bi, kvh, j0);
        int nfull = nk / 16 * 16;
        if (nfull < nk) {
            for (int j = nfull; j < nk; j++)
                memcpy(ktail + (j - nfull) * d, k0 + j * ldk, sizeof(uint16_t) * (size_t)d);
            memset(ktail + (nk - nfull) * d, 0, sizeof(uint16_t) * (size_t)((16 - nk + nfull) * d));
        }
        for (int j = 0; j < nk; j++) vr[j] = v0 + j * c->v->strides[2];
        /* the block's V rows fetched while the first row's scores read its K */
        const rows_pf vb = hr_attn_kv_rows(c->v, bi, kvh, j0, nk, dv);
        /* rows in pairs where that pays (d = 128), the odd one alone */
        int64_t r2 = 0;
        for (; d == 128 && r2 + 2 <= rows; r2 += 2)
            for (int g = 0; g < nk; g += 16)
                dec_qk16x2(q[r2], q[r2 + 1], g < nfull ? k0 + g * ldk : ktail, g < nfull ? ldk : d, c->scale,
                           s->st + r2 * BK + g, s->st + (r2 + 1) * BK + g, r2 ? &none : &vb, g);
        for (; r2 < rows; r2++)
            for (int g = 0; g < nk; g += 16)
                dec_qk16(q[r2], g < nfull ? k0 + g * ldk : ktail, g < nfull ? ldk : d, d, c->scale,
                         s->st + r2 * BK + g, r2 ? &none : &vb, g);
        for (int64_t r = 0; r < rows; r++) {
            float *p = s->st + r * BK;
            int64_t qi = r / c->rep;
            hr_attn_mask_row(c, s->row, p, bi, kvh * c->rep + r % c->rep, qi, c->t - c->s + qi, j0, nk);
            float corr = hr_attn_softmax_step(c, s, p, nk, r);
            if (corr != 1.0f) scale_row(o + r * dv, dv, corr);
        }
        /* the next block's K rows (or the worker's next unit's) fetched during the value pass */
        int64_t jn = j0 + BK;
        int nkn = hr_attn_visible_block(c, bi, kvh, &jn, hi);
        rows_pf kb = nkn ? hr_attn_kv_rows(c->k, bi, kvh, jn, nkn, d) : hr_attn_next_unit_keys(c, s);
        dec_pv_rows((int)rows, nk, s->st, vr, dv, o, &kb);
        j0 = jn, nk = nkn;
    }
    hr_attn_decode_finish(c, s, u, o);
}
