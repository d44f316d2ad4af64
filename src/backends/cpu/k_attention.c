/* CPU scaled dot-product attention, flash style: queries in blocks of BQ,
 * keys in blocks of BK, an online (running max) softmax in f32, so no
 * [s, t] score matrix is ever materialized. Both products of a block,
 * S = Q K^T and O += P V, run on the GEMM micro-kernels (gemm.h) over
 * panels packed per block. The rows of a block are (query, head) pairs
 * of one GQA group, so each packed K/V block serves every head that reads
 * it (decode fills a block with the group's heads). Work is split over
 * (batch, kv head, row block).
 * Key blocks the mask hides from every row of a query block are skipped.
 * A query row that every key is masked from yields zeros (torch yields NaN
 * there). */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_attention.h"
#include "backends/cpu/simd_math.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"
#include "ops/op_impl.h"

#define MR HR_GEMM_F32_MR
#define NR HR_GEMM_F32_NR
#define BQ HR_ATTN_BQ
#define BK HR_ATTN_BK

/* ---- softmax helpers: AVX2 and portable ---- */

/* p[j] = exp(p[j] - m) in place; returns the sum. */
static float exp_sum_avx2(float *p, int n, float m) {
    __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = hr_exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), mv));
        _mm256_storeu_ps(p + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = hr_hsum8(acc);
    for (; j < n; j++) s += p[j] = expf(p[j] - m);
    return s;
}

/* The largest of p[0..n) (-inf for none), passing over NaN scores as the
 * scalar loop does: max_ps keeps its second operand, the running max,
 * when the score is NaN. */
static float max_avx2(const float *p, int n) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(_mm256_loadu_ps(p + j), mv);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float mx = _mm_cvtss_f32(h);
    for (; j < n; j++) mx = p[j] > mx ? p[j] : mx;
    return mx;
}

static float exp_sum_scalar(float *p, int n, float m) {
    float s = 0.0f;
    for (int j = 0; j < n; j++) s += p[j] = expf(p[j] - m);
    return s;
}

void hr_attn_mask_row(const attn_ctx *c, float *tmp, float *p, int64_t bi, int64_t h, int64_t qi, int64_t pos,
                      int64_t j0, int nk) {
    if (c->softcap > 0)
        for (int j = 0; j < nk; j++) p[j] = c->softcap * tanhf(p[j] / c->softcap);
    if (c->mask) {
        const char *mp = (const char *)hr_tensor_ptr(c->mask) +
                         (bi * c->mstr[0] + h * c->mstr[1] + qi * c->mstr[2] + j0 * c->mstr[3]) *
                             (int64_t)hr_dtype_size(c->mask->dtype);
        if (c->mask->dtype == HR_BOOL) {
            const uint8_t *m = (const uint8_t *)mp;
            int j = 0;
            /* A compiled step's mask shows whole blocks: eight keys at a
             * time, looked at one by one only where a byte is zero. */
            for (; c->mstr[3] == 1 && j + 8 <= nk; j += 8) {
                uint64_t w;
                memcpy(&w, m + j, sizeof w);
                if (!((w - 0x0101010101010101ull) & ~w & 0x8080808080808080ull)) continue; /* no zero byte */
                for (int e = j; e < j + 8; e++)
                    if (!m[e]) p[e] = -INFINITY;
            }
            for (; j < nk; j++)
                if (!m[j * c->mstr[3]]) p[j] = -INFINITY;
        } else {
            hr_load_f32(tmp, mp, c->mask->dtype, nk, c->mstr[3]);
            for (int j = 0; j < nk; j++) p[j] += tmp[j];
        }
    }
    if (c->causal)
        for (int j = 0; j < nk; j++)
            if (j0 + j > pos) p[j] = -INFINITY;
    if (c->window > 0)
        for (int j = 0; j < nk; j++)
            if (pos - (j0 + j) >= c->window) p[j] = -INFINITY;
}

/* One row of head (bi, hh) of t, width elements from row r, as f32. */
static void load_row(const attn_ctx *c, float *dst, const hr_tensor *t, int64_t bi, int64_t hh, int64_t r,
                     int64_t width) {
    hr_gemm_load_f32(dst, hr_attn_at(t, bi, hh, r), t->dtype, width, t->strides[3], c->avx2);
}

/* Converts rows [r0, r0+n) of head (bi, hh) of t into NR-wide panels:
 * across rows for K^T (transposed: panel element (feature, row), eight
 * rows at a time through register transposes), across features for V
 * (panel element (row, feature)). row holds 8 rows of width floats. */
static void pack_kv(const attn_ctx *c, const hr_tensor *t, int64_t bi, int64_t hh, int64_t r0, int n, int64_t width,
                    bool transposed, float *dst, float *row) {
    if (!transposed) {
        /* a V row's panel rows are its own runs of NR features, copied
         * whole; the last run's padded features are zero */
        for (int j = 0; j < n; j++) {
            load_row(c, row, t, bi, hh, r0 + j, width);
            for (int64_t e = 0; e < width; e += NR) {
                float *run = dst + (e / NR) * BK * NR + j * NR;
                int64_t len = width - e < NR ? width - e : NR;
                memcpy(run, row + e, sizeof(float) * (size_t)len);
                memset(run + len, 0, sizeof(float) * (size_t)(NR - len));
            }
        }
        return;
    }
    int npad = (n + NR - 1) / NR * NR, j = 0;
    if (c->avx2)
        for (; j + 8 <= n; j += 8) {
            for (int i = 0; i < 8; i++) load_row(c, row + i * width, t, bi, hh, r0 + j + i, width);
            hr_gemm_transpose8_avx2((const char *)row, width * 4, width,
                                    (uint32_t *)(dst + (j / NR) * width * NR + j % NR), NR);
        }
    for (; j < npad; j++) { /* the padded keys are zero */
        if (j < n)
            load_row(c, row, t, bi, hh, r0 + j, width);
        else
            memset(row, 0, sizeof(float) * (size_t)width);
        float *panel = dst + (j / NR) * width * NR + j % NR;
        for (int64_t e = 0; e < width; e++) panel[e * NR] = row[e];
    }
}

/* 1 + the index of m[0..n)'s last nonzero byte, 0 when all are zero. A
 * compiled prefill's causal mask over a whole cache hides most of the
 * blocks a row block visits, so each of their rows is read to its start:
 * eight bytes at a time, the last nonzero one found from the word's
 * highest set bit (little-endian). */
static int last_set_byte(const uint8_t *m, int n) {
    int j = n;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; j >= 8; j -= 8) {
        uint64_t w;
        memcpy(&w, m + j - 8, sizeof w);
        if (w) return j - 8 + (63 - __builtin_clzll(w)) / 8 + 1;
    }
#endif
    for (; j > 0; j--)
        if (m[j - 1]) return j;
    return 0;
}

/* How many keys of [j0, j0+nk) the block's rows need: up to the last one
 * the mask shows any row (0: the block is skipped). Reading nq * nk mask
 * entries costs far less than packing K/V and the two products, and a
 * static-shape forward attends over a whole cache of which only the filled
 * slots (a prefix) are visible. */
int hr_attn_block_keys(const attn_ctx *c, int64_t bi, int64_t kvh, int64_t r0, int64_t nq, int64_t j0, int nk) {
    size_t esz = hr_dtype_size(c->mask->dtype);
    int n = 0;
    for (int64_t i = 0; i < nq && n < nk; i++) {
        int64_t r = r0 + i;
        const char *mp = (const char *)hr_tensor_ptr(c->mask) +
                         (bi * c->mstr[0] + (kvh * c->rep + r % c->rep) * c->mstr[1] + (r / c->rep) * c->mstr[2] +
                          j0 * c->mstr[3]) * (int64_t)esz;
        if (c->mask->dtype == HR_BOOL && c->mstr[3] == 1) {
            n += last_set_byte((const uint8_t *)mp + n, nk - n);
        } else if (c->mask->dtype == HR_BOOL) {
            for (int j = nk - 1; j >= n; j--)
                if (((const uint8_t *)mp)[j * c->mstr[3]]) {
                    n = j + 1;
                    break;
                }
        } else {
            float row[BK];
            hr_load_f32(row, mp, c->mask->dtype, nk, c->mstr[3]);
            for (int j = nk - 1; j >= n; j--)
                if (row[j] != -INFINITY) {
                    n = j + 1;
                    break;
                }
        }
    }
    return n;
}

/* One row of the online softmax: scores p[0..nk) become probabilities
 * against the updated running max; returns the factor that rescales the
 * row's earlier numerators (1 when the block adds nothing). */
float hr_attn_softmax_step(const attn_ctx *c, attn_scratch *s, float *p, int nk, int64_t i) {
    /* With a scalar max, the mask and this step were a fifth of a cached
     * Qwen3-shape AVX-512 decode call; the AVX2 max gave it what a
     * 16-wide step did (42 -> 36-39 us, the same bits). */
    float mx = -INFINITY;
    if (c->avx2)
        mx = max_avx2(p, nk);
    else
        for (int j = 0; j < nk; j++) mx = p[j] > mx ? p[j] : mx;
    if (mx == -INFINITY) { /* nothing to attend in this block */
        memset(p, 0, sizeof(float) * (size_t)nk);
        return 1.0f;
    }
    float m_new = mx > s->m[i] ? mx : s->m[i];
    float corr = expf(s->m[i] - m_new);
    float sum = (c->avx2 ? exp_sum_avx2 : exp_sum_scalar)(p, nk, m_new);
    s->l[i] = s->l[i] * corr + sum;
    s->m[i] = m_new;
    return corr;
}

/* Row r of a (batch, kv head) pair is query r / rep of q head
 * kvh * rep + r % rep: positions grow with r, so a block's key range
 * follows from its first and last rows. Units run pair by pair, each
 * pair's last row blocks first: threads claiming in turn stay on one
 * pair's K/V (in their L2) at a time, the largest (causal) blocks of a
 * pair go first, and the last pair's smallest even out the threads at the
 * end (bench_attention prefill 512, alternated: 1-4% faster than the
 * largest blocks of every pair first). */
static void attn_unit(const attn_ctx *c, attn_scratch *s, int64_t u) {
    int64_t pair = u / c->rblocks, rb = c->rblocks - 1 - u % c->rblocks, kvh = pair % c->hkv, bi = pair / c->hkv;
    int64_t rows = c->rep * c->s;
    int64_t r0 = rb * BQ, nq = rows - r0 < BQ ? rows - r0 : BQ, nqpad = (nq + MR - 1) / MR * MR;
    int64_t d = c->d, ldo = c->dvpad;
    /* locals, so the loops below do not reload them after every store
     * (a float store may alias the structs' fields) and vectorize */
    float scale = c->scale, *row = s->row, *ot = s->ot;
    for (int64_t i = 0; i < nqpad; i++) {
        if (i < nq) {
            int64_t r = r0 + i;
            load_row(c, row, c->q, bi, kvh * c->rep + r % c->rep, r / c->rep, d);
            for (int64_t e = 0; e < d; e++) row[e] *= scale;
        } else {
            memset(row, 0, sizeof(float) * (size_t)d);
        }
        float *panel = s->qp + (i / MR) * d * MR + i % MR;
        for (int64_t e = 0; e < d; e++) panel[e * MR] = row[e];
        s->m[i] = -INFINITY;
        s->l[i] = 0.0f;
    }
    memset(s->ot, 0, sizeof(float) * (size_t)(nqpad * ldo));
    /* Query i sits at position t - s + i: keys past the last row's
     * position (causal) or before the first row's window are skipped. */
    int64_t pos_first = c->t - c->s + r0 / c->rep, pos_last = c->t - c->s + (r0 + nq - 1) / c->rep;
    int64_t lo = 0, hi = c->t;
    if (c->causal && pos_last + 1 < hi) hi = pos_last + 1;
    if (c->window > 0 && pos_first - c->window + 1 > lo) lo = pos_first - c->window + 1;
    for (int64_t j0 = lo; j0 < hi; j0 += BK) {
        int nk = (int)(hi - j0 < BK ? hi - j0 : BK);
        if (c->mask && !(nk = hr_attn_block_keys(c, bi, kvh, r0, nq, j0, nk))) continue;
        int nkpad = (nk + NR - 1) / NR * NR;
        pack_kv(c, c->k, bi, kvh, j0, nk, d, true, s->kp, s->row);
        pack_kv(c, c->v, bi, kvh, j0, nk, c->dv, false, s->vp, s->row);
        for (int64_t ib = 0; ib < nqpad; ib += MR)
            for (int jb = 0; jb < nkpad; jb += NR)
                c->ukr(d, s->qp + ib * d, s->kp + jb * d, s->st + ib * BK + jb, BK, false);
        for (int64_t i = 0; i < nqpad; i++) {
            float *p = s->st + i * BK;
            float corr = 0.0f;
            if (i < nq) {
                int64_t r = r0 + i, qi = r / c->rep;
                hr_attn_mask_row(c, s->row, p, bi, kvh * c->rep + r % c->rep, qi, c->t - c->s + qi, j0, nk);
                corr = hr_attn_softmax_step(c, s, p, nk, i);
            } else {
                memset(p, 0, sizeof(float) * (size_t)nk);
            }
            if (corr != 1.0f)
                for (int64_t e = 0; e < ldo; e++) ot[i * ldo + e] *= corr;
            float *panel = s->pp + (i / MR) * BK * MR + i % MR;
            for (int j = 0; j < nk; j++) panel[j * MR] = p[j];
        }
        for (int64_t ib = 0; ib < nqpad; ib += MR)
            for (int64_t cb = 0; cb < ldo; cb += NR)
                c->ukr(nk, s->pp + ib * BK, s->vp + cb * BK, s->ot + ib * ldo + cb, ldo, true);
    }
    for (int64_t i = 0; i < nq; i++) {
        int64_t r = r0 + i;
        float den = hr_attn_den(c, kvh * c->rep + r % c->rep, s->m[i], s->l[i]);
        float inv = den > 0 ? 1.0f / den : 0.0f;
        float *oi = ot + i * ldo;
        for (int64_t e = 0, dv = c->dv; e < dv; e++) oi[e] *= inv;
        hr_store_f32(hr_attn_at(c->o, bi, kvh * c->rep + r % c->rep, r / c->rep), c->o->dtype, oi, c->dv,
                     c->o->strides[3]);
    }
}

/* ---- decode: a few query rows per (batch, kv head) ---- */

#define DEC_ROWS HR_ATTN_DEC_ROWS
#define DEC_SPLIT HR_ATTN_DEC_SPLIT

static float dot_f32(const float *a, const float *b, int64_t n, bool avx2) {
    int64_t i = 0;
    float sum = 0.0f;
    if (avx2) {
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
        sum = hr_hsum8(acc);
    }
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* y += a * x */
static void axpy_f32(float *y, float a, const float *x, int64_t n, bool avx2) {
    int64_t i = 0;
    if (avx2) {
        __m256 av = _mm256_set1_ps(a);
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] += a * x[i];
}

/* Eight elements of a K or V row (f32, bf16 or f16) as f32. */
static inline __attribute__((always_inline)) __m256 kv_load8(const char *p, hr_dtype dt) {
    switch (dt) {
    case HR_BF16: return hr_bf16x8_load(p);
    case HR_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    default: return _mm256_loadu_ps((const float *)p);
    }
}

/* Four sums of the lanes of a0..a3, in that order. */
static inline __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* ---- bf16 K/V in even/odd order ----
 * A 32-bit lane of bf16 data holds elements 2i (low half) and 2i+1 (high
 * half): shifted up, the lane is element 2i as f32; masked, element 2i+1.
 * So sixteen elements widen with one load and two ALU ops, where
 * vpmovzxwd needs a shuffle per eight. The query rows are
 * reordered once per unit to match, each 16 elements as their 8 even ones
 * then their 8 odd ones; the numerators accumulate in that order and are
 * put back once per unit (eo_restore). The sums are the same products
 * added in another order. */
static inline __m256 bf16_even8(__m256i x) { return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)); }
static inline __m256 bf16_odd8(__m256i x, __m256i hi) { return _mm256_castsi256_ps(_mm256_and_si256(x, hi)); }

/* x [n], n a multiple of 16: each 16 elements as their even ones then
 * their odd ones. */
static void eo_order(float *x, int64_t n) {
    for (int64_t g = 0; g < n; g += 16) {
        float t[16];
        for (int i = 0; i < 8; i++) t[i] = x[g + 2 * i], t[8 + i] = x[g + 2 * i + 1];
        memcpy(x + g, t, sizeof t);
    }
}

/* eo_order undone: [e0..e7 o0..o7] -> [e0 o0 e1 o1 ..] per 16. */
static void eo_restore(float *x, int64_t n) {
    for (int64_t g = 0; g < n; g += 16) {
        __m256 ev = _mm256_loadu_ps(x + g), od = _mm256_loadu_ps(x + g + 8);
        __m256 lo = _mm256_unpacklo_ps(ev, od), hi = _mm256_unpackhi_ps(ev, od);
        _mm256_storeu_ps(x + g, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(x + g + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
}

/* st[r * BK + j] = q row r . key j, for j < nk and R (1 or 2) rows of q
 * (f32, d apart); key j at k + j * ldk bytes, d elements of dt, d a
 * multiple of 8 (eo: bf16 keys, q rows in eo order, d a multiple of 16).
 * Four keys at a time, read and widened in registers (each serves both
 * rows), the four sums reduced together; the rows of vb prefetched four
 * per four keys. */
static inline __attribute__((always_inline)) void qk_rows_avx2(int R, const float *q, int64_t d, const char *k,
                                                               int64_t ldk, hr_dtype dt, bool eo, int nk,
                                                               float *st, const rows_pf *vb) {
    size_t esz = hr_dtype_size(dt);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int j = 0; j < nk; j += 4) {
        hr_attn_rows_pf_lines(vb, j, 4, 0, vb->lines);
        const char *kr[4];
        for (int i = 0; i < 4; i++) kr[i] = k + (int64_t)(j + i < nk ? j + i : j) * ldk;
        __m256 acc[2][4];
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 4; i++) acc[r][i] = _mm256_setzero_ps();
        for (int64_t e = 0; e < d; e += eo ? 16 : 8) {
            __m256 qv[2], qo[2];
            for (int r = 0; r < R; r++) {
                qv[r] = _mm256_loadu_ps(q + r * d + e);
                if (eo) qo[r] = _mm256_loadu_ps(q + r * d + e + 8);
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                if (eo) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(kr[i] + 2 * e));
                    __m256 ke = bf16_even8(x), ko = bf16_odd8(x, hi);
                    for (int r = 0; r < R; r++)
                        acc[r][i] = _mm256_fmadd_ps(qo[r], ko, _mm256_fmadd_ps(qv[r], ke, acc[r][i]));
                    continue;
                }
                __m256 kv = kv_load8(kr[i] + e * (int64_t)esz, dt);
                for (int r = 0; r < R; r++) acc[r][i] = _mm256_fmadd_ps(qv[r], kv, acc[r][i]);
            }
        }
        for (int r = 0; r < R; r++) {
            float sum[4];
            _mm_storeu_ps(sum, hsum4x8(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
            for (int i = 0; i < 4 && j + i < nk; i++) st[r * BK + j + i] = sum[i];
        }
    }
}

/* o[r][e] += sum over keys j < nk of p[r * BK + j] * v_j[e], for R (1 or
 * 2) rows, 32 features at a time held in registers across the keys (one
 * load and store of o per block, not per key); value j at v + j * ldv
 * bytes, dv elements of dt, dv a multiple of 32 (eo: bf16 values, o in eo
 * order). A key whose probability is zero in every row (masked) is
 * skipped, so its values are not read. The rows of kb are prefetched a
 * share of their lines per pass over the keys, one row per key. */
static inline __attribute__((always_inline)) void pv_rows_avx2(int R, float *o, int64_t dv, const char *v,
                                                               int64_t ldv, hr_dtype dt, bool eo, int nk,
                                                               const float *p, const rows_pf *kb) {
    size_t esz = hr_dtype_size(dt);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    int share = (kb->lines * 32 + (int)dv - 1) / (int)dv; /* lines per pass */
    for (int64_t e = 0; e < dv; e += 32) {
        int l0 = (int)(e / 32) * share;
        __m256 acc[2][4];
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 4; i++) acc[r][i] = _mm256_loadu_ps(o + r * dv + e + 8 * i);
        for (int j = 0; j < nk; j++) {
            hr_attn_rows_pf_lines(kb, j, 1, l0, l0 + share);
            if (p[j] == 0.0f && (R == 1 || p[BK + j] == 0.0f)) continue;
            const char *vr = v + j * ldv + e * (int64_t)esz;
            __m256 vv[4];
            if (eo) {
                __m256i x0 = _mm256_loadu_si256((const __m256i *)vr);
                __m256i x1 = _mm256_loadu_si256((const __m256i *)(vr + 32));
                vv[0] = bf16_even8(x0), vv[1] = bf16_odd8(x0, hi), vv[2] = bf16_even8(x1), vv[3] = bf16_odd8(x1, hi);
            } else {
                for (int i = 0; i < 4; i++) vv[i] = kv_load8(vr + 8 * i * (int64_t)esz, dt);
            }
            __m256 pr[2];
            for (int r = 0; r < R; r++) pr[r] = _mm256_set1_ps(p[r * BK + j]);
            for (int i = 0; i < 4; i++)
                for (int r = 0; r < R; r++) acc[r][i] = _mm256_fmadd_ps(pr[r], vv[i], acc[r][i]);
        }
        hr_attn_rows_pf_lines(kb, nk, kb->n - nk, l0, l0 + share); /* a next block longer than this one */
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 4; i++) _mm256_storeu_ps(o + r * dv + e + 8 * i, acc[r][i]);
    }
}

/* Whether a decode unit's K and V rows take the kernels above: AVX2, rows
 * feature-contiguous, head dims in whole vectors. */
static bool kv_direct_avx2(const attn_ctx *c) {
    return c->avx2 && c->k->strides[3] == 1 && c->v->strides[3] == 1 && c->d % 8 == 0 && c->dv % 32 == 0;
}

static void decode_range(const attn_ctx *c, int64_t sp, int64_t *lo, int64_t *hi);

rows_pf hr_attn_kv_rows(const hr_tensor *t, int64_t bi, int64_t kvh, int64_t j0, int n, int64_t width) {
    int64_t esz = (int64_t)hr_dtype_size(t->dtype);
    return (rows_pf){n > 0 ? hr_attn_at(t, bi, kvh, j0) : NULL, t->strides[2] * esz, n,
                     (int)((width * esz + 63) / 64)};
}

int hr_attn_visible_block(const attn_ctx *c, int64_t bi, int64_t kvh, int64_t *j0, int64_t hi) {
    for (; *j0 < hi; *j0 += BK) {
        int nk = (int)(hi - *j0 < BK ? hi - *j0 : BK);
        if (!c->mask) return nk;
        if ((nk = hr_attn_block_keys(c, bi, kvh, 0, c->rep * c->s, *j0, nk))) return nk;
    }
    return 0;
}

rows_pf hr_attn_next_unit_keys(const attn_ctx *c, const attn_scratch *s) {
    if (s->next < 0) return (rows_pf){0};
    int64_t kvh = (s->next / c->nsplit) % c->hkv, bi = s->next / (c->nsplit * c->hkv), lo, hi;
    decode_range(c, s->next % c->nsplit, &lo, &hi);
    int n = hr_attn_visible_block(c, bi, kvh, &lo, hi);
    return hr_attn_kv_rows(c->k, bi, kvh, lo, n, c->d);
}

/* Scores of the unit's rows against keys [j0, j0 + nk), into s->st; the
 * block's V rows prefetched meanwhile. */
static void decode_scores(const attn_ctx *c, attn_scratch *s, const float *q, int64_t rows, int64_t bi, int64_t kvh,
                          int64_t j0, int nk, bool eo) {
    int64_t d = c->d, ldk = c->k->strides[2] * (int64_t)hr_dtype_size(c->k->dtype);
    const char *k0 = hr_attn_at(c->k, bi, kvh, j0);
    const rows_pf vb = hr_attn_kv_rows(c->v, bi, kvh, j0, nk, c->dv), none = {0};
    for (int64_t r = 0; r < rows; r += 2) {
        const rows_pf *b = r ? &none : &vb;
        hr_dtype dt = c->k->dtype;
        /* constant R and eo in each call: the always-inline kernel is
         * specialized four ways (accumulators sized by R, no dtype switch
         * in the eo loop), which one call with variables would not be */
        if (eo && rows - r >= 2)
            qk_rows_avx2(2, q + r * d, d, k0, ldk, HR_BF16, true, nk, s->st + r * BK, b);
        else if (eo)
            qk_rows_avx2(1, q + r * d, d, k0, ldk, HR_BF16, true, nk, s->st + r * BK, b);
        else if (rows - r >= 2)
            qk_rows_avx2(2, q + r * d, d, k0, ldk, dt, false, nk, s->st + r * BK, b);
        else
            qk_rows_avx2(1, q + r * d, d, k0, ldk, dt, false, nk, s->st + r * BK, b);
    }
}

/* The block's values weighted by s->st, added to the numerators o; the
 * rows of kb (the next block's keys) prefetched meanwhile. */
static void decode_values(const attn_ctx *c, const attn_scratch *s, float *o, int64_t rows, int64_t bi,
                          int64_t kvh, int64_t j0, int nk, bool eo, const rows_pf *kb) {
    int64_t dv = c->dv, ldv = c->v->strides[2] * (int64_t)hr_dtype_size(c->v->dtype);
    const char *v0 = hr_attn_at(c->v, bi, kvh, j0);
    const rows_pf none = {0};
    for (int64_t r = 0; r < rows; r += 2) {
        const rows_pf *b = r ? &none : kb;
        hr_dtype dt = c->v->dtype;
        /* four constant-argument calls, as in decode_scores */
        if (eo && rows - r >= 2)
            pv_rows_avx2(2, o + r * dv, dv, v0, ldv, HR_BF16, true, nk, s->st + r * BK, b);
        else if (eo)
            pv_rows_avx2(1, o + r * dv, dv, v0, ldv, HR_BF16, true, nk, s->st + r * BK, b);
        else if (rows - r >= 2)
            pv_rows_avx2(2, o + r * dv, dv, v0, ldv, dt, false, nk, s->st + r * BK, b);
        else
            pv_rows_avx2(1, o + r * dv, dv, v0, ldv, dt, false, nk, s->st + r * BK, b);
    }
}

/* The next decode unit's K and V rows, key by key, for prefetching. */
typedef struct attn_pf {
    const attn_ctx *c;
    int64_t bi, kvh;        /* the unit's (batch, kv head) */
    int64_t j, lo, hi;      /* the next key; the unit's key range */
    int64_t shown, next_blk; /* end of the keys of j's block the unit reads; start of the next block */
    const char *k, *v;      /* key j's rows */
    int64_t ldk, ldv;       /* bytes from one key's row to the next */
    int64_t kbytes, vbytes;
} attn_pf;

/* The next unit's K/V rows are fetched into L2 while this one computes, a
 * few keys per step (the portable decode path, which K/V rows not in place
 * for AVX2 take; the direct AVX2 and the AVX-512 BF16 paths prefetch one
 * step ahead instead, rows_pf in k_attention.h): in a model step K/V come
 * from memory (the layer's weights streamed through the cache since the
 * last step), and one unit's misses at a time left the bandwidth mostly
 * idle (batch-64 decode, 17 -> 24 GB/s of K/V). The prefetches cost a third more time when K/V
 * are in cache already (one call repeated, which no model step does).
 * Keys the unit will skip as masked (the empty slots of a static cache)
 * are skipped here too. */
static inline __attribute__((always_inline)) void attn_pf_step(attn_pf *pf, int64_t keys) {
    while (keys > 0 && pf->j < pf->hi) {
        if (pf->j == pf->next_blk) { /* a block starts: the keys of it the unit reads */
            int nk = (int)(pf->hi - pf->j < HR_ATTN_BK ? pf->hi - pf->j : HR_ATTN_BK);
            pf->next_blk = pf->j + nk;
            pf->shown = pf->j + (pf->c->mask ? hr_attn_block_keys(pf->c, pf->bi, pf->kvh, 0, pf->c->rep * pf->c->s,
                                                                  pf->j, nk)
                                             : nk);
        }
        if (pf->j >= pf->shown) { /* to the next block */
            pf->k += (pf->next_blk - pf->j) * pf->ldk;
            pf->v += (pf->next_blk - pf->j) * pf->ldv;
            pf->j = pf->next_blk;
            continue;
        }
        int64_t n = pf->shown - pf->j < keys ? pf->shown - pf->j : keys;
        hr_attn_pf_rows(pf->k, pf->kbytes, pf->ldk, n);
        hr_attn_pf_rows(pf->v, pf->vbytes, pf->ldv, n);
        pf->j += n, pf->k += n * pf->ldk, pf->v += n * pf->ldv, keys -= n;
    }
}

/* The K/V rows of decode unit s->next (none when it is -1); by value, so
 * that the cursor can live in registers. */
static attn_pf attn_pf_init(const attn_ctx *c, const attn_scratch *s) {
    attn_pf pf = {.c = c};
    if (s->next < 0) return pf;
    pf.kvh = (s->next / c->nsplit) % c->hkv;
    pf.bi = s->next / (c->nsplit * c->hkv);
    decode_range(c, s->next % c->nsplit, &pf.lo, &pf.hi);
    pf.j = pf.next_blk = pf.lo;
    if (pf.hi <= pf.lo) return pf;
    int64_t ek = (int64_t)hr_dtype_size(c->k->dtype), ev = (int64_t)hr_dtype_size(c->v->dtype);
    pf.k = hr_attn_at(c->k, pf.bi, pf.kvh, pf.lo);
    pf.v = hr_attn_at(c->v, pf.bi, pf.kvh, pf.lo);
    pf.ldk = c->k->strides[2] * ek;
    pf.ldv = c->v->strides[2] * ev;
    pf.kbytes = ((c->d - 1) * c->k->strides[3] + 1) * ek;
    pf.vbytes = ((c->dv - 1) * c->v->strides[3] + 1) * ev;
    return pf;
}

/* Unit (batch, kv head, split): every query row of the pair against the
 * split's keys, one key row at a time straight from K and V. With a few
 * rows, packing K/V into GEMM panels costs more than the products it
 * feeds; each converted key or value row serves all rows here. Splits let
 * both threads share one head's keys; each leaves its running max,
 * denominator and unnormalized numerators per row in c->parts. */
static void attn_decode_unit(const attn_ctx *c, attn_scratch *s, int64_t u) {
    int64_t sp = u % c->nsplit, kvh = (u / c->nsplit) % c->hkv, bi = u / (c->nsplit * c->hkv);
    int64_t rows = c->rep * c->s, d = c->d, dv = c->dv;
    float *q = s->qp, *o = s->ot, *kr = s->kp, *vr = s->vp; /* [rows][d], [rows][dv], [d], [dv] */
    bool direct = kv_direct_avx2(c);
    bool eo = direct && c->k->dtype == HR_BF16 && c->v->dtype == HR_BF16 && d % 16 == 0;
    for (int64_t r = 0; r < rows; r++) {
        load_row(c, q + r * d, c->q, bi, kvh * c->rep + r % c->rep, r / c->rep, d);
        for (int64_t e = 0; e < d; e++) q[r * d + e] *= c->scale;
        if (eo) eo_order(q + r * d, d);
    }
    int64_t j0, hi;
    hr_attn_decode_start(c, s, sp, o, &j0, &hi);
    attn_pf pf = direct ? (attn_pf){0} : attn_pf_init(c, s); /* the direct path prefetches by block */
    for (int nk = hr_attn_visible_block(c, bi, kvh, &j0, hi); nk;) {
        if (direct) {
            decode_scores(c, s, q, rows, bi, kvh, j0, nk, eo);
        } else {
            for (int j = 0; j < nk; j++) {
                attn_pf_step(&pf, 1);
                load_row(c, kr, c->k, bi, kvh, j0 + j, d);
                for (int64_t r = 0; r < rows; r++) s->st[r * BK + j] = dot_f32(q + r * d, kr, d, c->avx2);
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float *p = s->st + r * BK;
            int64_t qi = r / c->rep;
            hr_attn_mask_row(c, s->row, p, bi, kvh * c->rep + r % c->rep, qi, c->t - c->s + qi, j0, nk);
            float corr = hr_attn_softmax_step(c, s, p, nk, r);
            if (corr != 1.0f)
                for (int64_t e = 0; e < dv; e++) o[r * dv + e] *= corr;
        }
        int64_t jn = j0 + BK;
        int nkn = hr_attn_visible_block(c, bi, kvh, &jn, hi);
        if (direct) {
            rows_pf kb = nkn ? hr_attn_kv_rows(c->k, bi, kvh, jn, nkn, d) : hr_attn_next_unit_keys(c, s);
            decode_values(c, s, o, rows, bi, kvh, j0, nk, eo, &kb);
        } else {
            for (int j = 0; j < nk; j++) {
                load_row(c, vr, c->v, bi, kvh, j0 + j, dv);
                for (int64_t r = 0; r < rows; r++)
                    if (s->st[r * BK + j] != 0.0f) axpy_f32(o + r * dv, s->st[r * BK + j], vr, dv, c->avx2);
            }
        }
        j0 = jn, nk = nkn;
    }
    if (eo)
        for (int64_t r = 0; r < rows; r++) eo_restore(o + r * dv, dv);
    hr_attn_decode_finish(c, s, u, o);
}

/* The keys [lo, hi) of split sp; rows span positions t - s .. t - 1. */
static void decode_range(const attn_ctx *c, int64_t sp, int64_t *lo, int64_t *hi) {
    *lo = sp * c->dsplit;
    *hi = (sp + 1) * c->dsplit < c->t ? (sp + 1) * c->dsplit : c->t;
    if (c->window > 0 && c->t - c->s - c->window + 1 > *lo) *lo = c->t - c->s - c->window + 1;
}

void hr_attn_decode_start(const attn_ctx *c, attn_scratch *s, int64_t sp, float *o, int64_t *lo, int64_t *hi) {
    int64_t rows = c->rep * c->s;
    for (int64_t r = 0; r < rows; r++) {
        s->m[r] = -INFINITY;
        s->l[r] = 0.0f;
    }
    memset(o, 0, sizeof(float) * (size_t)(rows * c->dv));
    decode_range(c, sp, lo, hi);
}

void hr_attn_decode_finish(const attn_ctx *c, const attn_scratch *s, int64_t u, float *o) {
    int64_t rows = c->rep * c->s, dv = c->dv;
    if (!c->parts) { /* one split: u is the (batch, kv head) pair */
        int64_t kvh = u % c->hkv, bi = u / c->hkv;
        for (int64_t r = 0; r < rows; r++) {
            float den = hr_attn_den(c, kvh * c->rep + r % c->rep, s->m[r], s->l[r]);
            float inv = den > 0 ? 1.0f / den : 0.0f, *oi = o + r * dv;
            for (int64_t e = 0; e < dv; e++) oi[e] *= inv;
            hr_store_f32(hr_attn_at(c->o, bi, kvh * c->rep + r % c->rep, r / c->rep), c->o->dtype, oi, dv,
                         c->o->strides[3]);
        }
        return;
    }
    float *part = c->parts + u * rows * (2 + dv);
    for (int64_t r = 0; r < rows; r++, part += 2 + dv) {
        part[0] = s->m[r];
        part[1] = s->l[r];
        memcpy(part + 2, o + r * dv, sizeof(float) * (size_t)dv);
    }
}

/* Merges the splits of each row (rescaled to their common max) into o. */
static void attn_decode_combine(const attn_ctx *c) {
    int64_t rows = c->rep * c->s, dv = c->dv, stride = rows * (2 + dv);
    for (int64_t pair = 0; pair < c->b * c->hkv; pair++) {
        int64_t bi = pair / c->hkv, kvh = pair % c->hkv;
        float *first = c->parts + pair * c->nsplit * stride;
        for (int64_t r = 0; r < rows; r++) {
            float *acc = first + r * (2 + dv), mx = -INFINITY;
            for (int64_t sp = 0; sp < c->nsplit; sp++) mx = fmaxf(mx, first[sp * stride + r * (2 + dv)]);
            float w0 = mx == -INFINITY ? 0.0f : expf(acc[0] - mx), den = acc[1] * w0;
            for (int64_t e = 0; e < dv; e++) acc[2 + e] *= w0;
            for (int64_t sp = 1; sp < c->nsplit && mx != -INFINITY; sp++) {
                const float *part = first + sp * stride + r * (2 + dv);
                if (part[1] == 0.0f) continue;
                float w = expf(part[0] - mx);
                den += part[1] * w;
                for (int64_t e = 0; e < dv; e++) acc[2 + e] += w * part[2 + e];
            }
            den = hr_attn_den(c, kvh * c->rep + r % c->rep, mx, den);
            float inv = den > 0 ? 1.0f / den : 0.0f;
            for (int64_t e = 0; e < dv; e++) acc[2 + e] *= inv;
            hr_store_f32(hr_attn_at(c->o, bi, kvh * c->rep + r % c->rep, r / c->rep), c->o->dtype, acc + 2, dv,
                         c->o->strides[3]);
        }
    }
}

/* Units are claimed one at a time rather than split in fixed shares: a
 * worker the OS deschedules (the cores are shared) or one holding the
 * long causal rows leaves its units to the others. */
/* Lays the portable and decode paths' scratch out at mem (NULL: only
 * counts) and returns its size in floats. Decode holds DEC_ROWS query rows
 * and one key row (sixteen bf16 ones): a small scratch, which malloc
 * serves without mapping fresh pages at every call. */
static size_t attn_layout(const attn_ctx *c, float *mem, attn_scratch *s) {
    int64_t nrow = c->d > c->dv ? c->d : c->dv;
    nrow = 8 * (nrow > BK ? nrow : BK);
    int64_t nq = c->decode ? DEC_ROWS : BQ, nkr = c->decode ? 8 : BK, nvr = c->decode ? 1 : BK;
    s->qp = mem;
    s->kp = s->qp + nq * c->d;
    s->vp = s->kp + nkr * c->d;
    s->pp = s->vp + c->dvpad * nvr;
    s->st = s->pp + (c->decode ? 0 : BQ * BK);
    s->ot = s->st + nq * BK;
    s->row = s->ot + nq * c->dvpad;
    return (size_t)(s->row + nrow - s->qp);
}

size_t hr_attn_parts_bytes(const attn_ctx *c) {
    return c->decode && c->nsplit > 1 ? sizeof(float) * (size_t)(c->units * c->rep * c->s * (2 + c->dv)) : 0;
}

size_t hr_attn_scratch_bytes(const attn_ctx *c) {
    if (c->bf16 && !c->decode) return hr_attn_bf16_scratch_bytes(c);
    attn_scratch s;
    return sizeof(float) * attn_layout(c, NULL, &s);
}

/* Units are claimed one at a time rather than split in fixed shares: a
 * worker the OS deschedules (the cores are shared) or one holding the
 * long causal rows leaves its units to the others. */
static void attn_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    attn_ctx *c = arg;
    int64_t u = atomic_fetch_add(&c->next, 1);
    if (u >= c->units) return; /* all taken before this worker started */
    attn_scratch s = {0};
    float *mem = malloc(sizeof(float) * attn_layout(c, NULL, &s));
    if (!mem) {
        atomic_store(&c->failed, 1);
        return;
    }
    attn_layout(c, mem, &s);
    if (!c->decode) {
        for (; u < c->units; u = atomic_fetch_add(&c->next, 1)) attn_unit(c, &s, u);
    } else {
        /* Each decode unit is claimed one ahead, so that its K/V can be
         * prefetched while the one before runs. */
        while (u < c->units) {
            int64_t nxt = atomic_fetch_add(&c->next, 1);
            s.next = nxt < c->units ? nxt : -1;
            (c->bf16 ? hr_attn_bf16_decode_unit : attn_decode_unit)(c, &s, u);
            u = nxt;
        }
    }
    free(mem);
}

void hr_attn_plan(attn_ctx *c, const hr_attrs_sdpa *a, const hr_tensor *const *in, int n_in, hr_tensor *o) {
    *c = (attn_ctx){.q = in[0], .k = in[1], .v = in[2], .mask = n_in - a->sinks > 3 ? in[3] : NULL, .o = o};
    c->b = c->q->shape[0];
    c->hq = c->q->shape[1];
    c->s = c->q->shape[2];
    c->d = c->q->shape[3];
    c->hkv = c->k->shape[1];
    c->t = c->k->shape[2];
    c->dv = c->v->shape[3];
    c->scale = a->scale != 0 ? (float)a->scale : 1.0f / sqrtf((float)(c->d ? c->d : 1));
    c->softcap = (float)a->softcap;
    c->window = a->window;
    c->causal = a->is_causal;
    c->dvpad = (c->dv + NR - 1) / NR * NR;
    c->avx2 = hr_cpu_isa_get() >= HR_ISA_AVX2;
    c->ukr = c->avx2 ? hr_gemm_ukr_f32_avx2 : hr_gemm_ukr_f32_scalar;
    if (c->mask)
        for (int i = 0; i < 4; i++) {
            int mi = c->mask->ndim - 4 + i;
            c->mstr[i] = mi >= 0 && c->mask->shape[mi] != 1 ? c->mask->strides[mi] : 0;
        }
    c->rep = c->hq / c->hkv;
    c->rblocks = (c->rep * c->s + BQ - 1) / BQ;
    c->units = c->b * c->hkv * c->rblocks;
    c->decode = c->rep * c->s <= DEC_ROWS && c->t > 0;
    /* vdpbf16ps on rows read in place: whole 32-element chunks of features */
    c->bf16 = c->q->dtype == HR_BF16 && c->k->dtype == HR_BF16 && c->v->dtype == HR_BF16 && c->d % 32 == 0 &&
              c->dv % 32 == 0 && c->q->strides[3] == 1 && c->k->strides[3] == 1 && c->v->strides[3] == 1 &&
              hr_gemm_use_avx512_bf16();
    c->nth = hr_parallel_threads_for(c->b * c->hq * c->s * (c->t + 1) * (c->d + c->dv + 1), HR_GRAIN_MATMUL);
    if (c->decode) {
        /* Key splits give the threads units to share where kv heads are
         * few (one kv head at batch 1 would be one unit), but each is a
         * fresh start of the K/V streams and a partial result to merge
         * after the call: DEC_SPLIT keys times the kv heads per thread of
         * the pool (1 to 8), so a model with kv heads to spare reads each
         * head whole up to that length. From the pool and the heads only,
         * not b or t, so that the batch size, or a compiled step's
         * capacity-wide K, leaves each row's splits and bits as they are.
         * bench_attention's cold Qwen3 shape (8 kv heads, 2 threads: 1024
         * keys against 256), alternated sample by sample: t = 540 69 ->
         * 60 us per call in the fast memory mode, 75.5 -> 73.5 in the
         * slow one; t = 1024 126 -> 111 and 140 -> 136; cached, t = 640,
         * 38-39 -> 35.5. Past HR_ATTN_DEC_MAX_SPLITS splits, longer ones
         * (whole key blocks), so that the partial results stay a bounded
         * share of K/V; a long context leaves the threads enough splits
         * to share. */
        int64_t per = c->hkv / hr_num_threads();
        c->dsplit = DEC_SPLIT * (per < 1 ? 1 : per > 8 ? 8 : per);
        if ((c->t + c->dsplit - 1) / c->dsplit > HR_ATTN_DEC_MAX_SPLITS)
            c->dsplit = ((c->t + HR_ATTN_DEC_MAX_SPLITS - 1) / HR_ATTN_DEC_MAX_SPLITS + BK - 1) / BK * BK;
        c->nsplit = (c->t + c->dsplit - 1) / c->dsplit;
        c->units = c->b * c->hkv * c->nsplit;
    } else if (c->bf16) {
        /* Chunks of row blocks share one packing of each K/V block; enough
         * of them per thread that claiming them as they come evens out the
         * causal imbalance between early and late rows, and at most
         * HR_ATTN_CHUNK blocks each, which bounds the scratch. */
        int64_t pairs = c->b * c->hkv, want = (8 * (int64_t)c->nth + pairs - 1) / pairs;
        int64_t least = (c->rblocks + HR_ATTN_CHUNK - 1) / HR_ATTN_CHUNK;
        c->chunks = want > least ? want : least;
        if (c->chunks > c->rblocks) c->chunks = c->rblocks;
        c->units = pairs * c->chunks;
    }
    if (c->nth > c->units) c->nth = (int)c->units;
}

/* q [b, hq, s, d], k [b, hkv, t, d], v [b, hkv, t, dv], mask -> o [b, hq, s, dv] */
static hr_status k_sdpa(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out) {
    static const hr_attrs_sdpa defaults = {0};
    attn_ctx c;
    const hr_attrs_sdpa *a = attrs ? attrs : &defaults;
    hr_attn_plan(&c, a, in, n_in, out[0]);
    float *sinks = NULL;
    if (a->sinks) {
        const hr_tensor *z = in[n_in - 1];
        sinks = malloc(sizeof(float) * (size_t)(c.hq + 1));
        if (!sinks) return hr_error(HR_ERR_OOM, "sdpa: out of memory for %lld sinks", (long long)c.hq);
        hr_load_f32(sinks, hr_tensor_ptr(z), z->dtype, c.hq, z->strides[0]);
        c.sinks = sinks;
    }
    if (a->exact) {
        bool ok = hr_attn_exact(&c, a->exact_from);
        free(sinks);
        return ok ? HR_OK : hr_error(HR_ERR_OOM, "sdpa: out of memory for attention scratch");
    }
    if (hr_attn_parts_bytes(&c)) {
        c.parts = malloc(hr_attn_parts_bytes(&c));
        if (!c.parts) {
            free(sinks);
            return hr_error(HR_ERR_OOM, "sdpa: out of memory for %lld key splits", (long long)c.units);
        }
    }
    atomic_init(&c.failed, 0);
    atomic_init(&c.next, 0);
    hr_parallel_run(c.bf16 && !c.decode ? hr_attn_bf16_worker : attn_worker, &c, c.nth);
    if (c.parts && !atomic_load(&c.failed)) attn_decode_combine(&c);
    free(c.parts);
    free(sinks);
    if (atomic_load(&c.failed)) return hr_error(HR_ERR_OOM, "sdpa: out of memory for attention scratch");
    return HR_OK;
}

void hr_cpu_register_attention(hr_cpu_kernel_fn *table) { table[HR_OP_sdpa] = k_sdpa; }
