/* CPU scaled dot-product attention, flash style: queries in blocks of BQ,
 * keys in blocks of BK, an online (running max) softmax in f32, so no
 * [s, t] score matrix is ever materialized. Work is split over
 * (batch, head, query block). A query row that every key is masked from
 * yields zeros (torch yields NaN there). */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"
#include "ops/op_impl.h"

#define BQ 32
#define BK 64

typedef struct attn_ctx {
    const hr_tensor *q, *k, *v, *mask;
    hr_tensor *o;
    int64_t b, hq, hkv, s, t, d, dv;
    float scale, softcap;
    int64_t window;
    bool causal, avx2;
    int64_t mstr[4]; /* mask strides against [b, hq, s, t]; 0 where it broadcasts */
    int64_t qblocks, units;
    atomic_int failed;
} attn_ctx;

typedef struct attn_scratch {
    float *q;    /* [BQ][d], pre-scaled */
    float *o;    /* [BQ][dv] running numerators */
    float *k;    /* [BK][d] */
    float *v;    /* [BK][dv] */
    float *p;    /* [BK] scores, then probabilities, of one query row */
    float *mrow; /* [BK] additive mask row */
    float m[BQ], l[BQ]; /* running max and denominator per query row */
} attn_scratch;

static inline char *at4(const hr_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    return (char *)hr_tensor_ptr(t) +
           (i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2]) * (int64_t)hr_dtype_size(t->dtype);
}

/* ---- vector helpers: AVX2 and portable ---- */

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* out[j] = dot(q, k + j * d) for j < nk; four keys share each q load. */
static void scores_avx2(const float *q, const float *k, int64_t d, int nk, float *out) {
    int j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *k0 = k + j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t c = 0;
        for (; c + 8 <= d; c += 8) {
            __m256 qv = _mm256_loadu_ps(q + c);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + c), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + c), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + c), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + c), a3);
        }
        float s0 = hsum8(a0), s1 = hsum8(a1), s2 = hsum8(a2), s3 = hsum8(a3);
        for (; c < d; c++) {
            s0 += q[c] * k0[c];
            s1 += q[c] * k1[c];
            s2 += q[c] * k2[c];
            s3 += q[c] * k3[c];
        }
        out[j] = s0, out[j + 1] = s1, out[j + 2] = s2, out[j + 3] = s3;
    }
    for (; j < nk; j++) {
        const float *kj = k + j * d;
        __m256 a = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 8 <= d; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(kj + c), a);
        float s = hsum8(a);
        for (; c < d; c++) s += q[c] * kj[c];
        out[j] = s;
    }
}

static void scores_scalar(const float *q, const float *k, int64_t d, int nk, float *out) {
    for (int j = 0; j < nk; j++) {
        float s = 0.0f;
        for (int64_t c = 0; c < d; c++) s += q[c] * k[j * d + c];
        out[j] = s;
    }
}

/* exp on 8 lanes: 2^n * poly(r), |r| <= ln2/2, ~1 ulp; inputs below -87
 * (including -inf) give exactly 0. */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

/* p[j] = exp(p[j] - m) in place; returns the sum. */
static float exp_sum_avx2(float *p, int n, float m) {
    __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), mv));
        _mm256_storeu_ps(p + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = hsum8(acc);
    for (; j < n; j++) s += p[j] = expf(p[j] - m);
    return s;
}

static float exp_sum_scalar(float *p, int n, float m) {
    float s = 0.0f;
    for (int j = 0; j < n; j++) s += p[j] = expf(p[j] - m);
    return s;
}

/* o[c] = o[c] * corr + sum_j p[j] * v[j][c]: 32 columns of o stay in four
 * registers (four independent FMA chains) across all keys of the block. */
static void accum_avx2(float *o, float corr, const float *p, const float *v, int64_t dv, int nk) {
    __m256 cv = _mm256_set1_ps(corr);
    int64_t c = 0;
    for (; c + 32 <= dv; c += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + c), cv), a1 = _mm256_mul_ps(_mm256_loadu_ps(o + c + 8), cv);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(o + c + 16), cv), a3 = _mm256_mul_ps(_mm256_loadu_ps(o + c + 24), cv);
        for (int j = 0; j < nk; j++) {
            __m256 pj = _mm256_set1_ps(p[j]);
            const float *vj = v + j * dv + c;
            a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), a0);
            a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), a3);
        }
        _mm256_storeu_ps(o + c, a0);
        _mm256_storeu_ps(o + c + 8, a1);
        _mm256_storeu_ps(o + c + 16, a2);
        _mm256_storeu_ps(o + c + 24, a3);
    }
    for (; c + 8 <= dv; c += 8) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(o + c), cv);
        for (int j = 0; j < nk; j++) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * dv + c), acc);
        _mm256_storeu_ps(o + c, acc);
    }
    for (; c < dv; c++) {
        float acc = o[c] * corr;
        for (int j = 0; j < nk; j++) acc += p[j] * v[j * dv + c];
        o[c] = acc;
    }
}

static void accum_scalar(float *o, float corr, const float *p, const float *v, int64_t dv, int nk) {
    for (int64_t c = 0; c < dv; c++) {
        float acc = o[c] * corr;
        for (int j = 0; j < nk; j++) acc += p[j] * v[j * dv + c];
        o[c] = acc;
    }
}

/* ---- one (batch, head, query block) ---- */

/* Masks scores p[0..nk) of query row i (absolute index qi, position pos)
 * against keys j0.. : softcap, user mask, causal, window. */
static void mask_row(const attn_ctx *c, attn_scratch *s, int64_t bi, int64_t h, int64_t qi, int64_t pos,
                     int64_t j0, int nk) {
    float *p = s->p;
    if (c->softcap > 0)
        for (int j = 0; j < nk; j++) p[j] = c->softcap * tanhf(p[j] / c->softcap);
    if (c->mask) {
        const char *mp = (const char *)hr_tensor_ptr(c->mask) +
                         (bi * c->mstr[0] + h * c->mstr[1] + qi * c->mstr[2] + j0 * c->mstr[3]) *
                             (int64_t)hr_dtype_size(c->mask->dtype);
        if (c->mask->dtype == HR_BOOL) {
            for (int j = 0; j < nk; j++)
                if (!((const uint8_t *)mp)[j * c->mstr[3]]) p[j] = -INFINITY;
        } else {
            hr_load_f32(s->mrow, mp, c->mask->dtype, nk, c->mstr[3]);
            for (int j = 0; j < nk; j++) p[j] += s->mrow[j];
        }
    }
    if (c->causal)
        for (int j = 0; j < nk; j++)
            if (j0 + j > pos) p[j] = -INFINITY;
    if (c->window > 0)
        for (int j = 0; j < nk; j++)
            if (pos - (j0 + j) >= c->window) p[j] = -INFINITY;
}

static void attn_unit(const attn_ctx *c, attn_scratch *s, int64_t u) {
    int64_t qb = u % c->qblocks, h = (u / c->qblocks) % c->hq, bi = u / (c->qblocks * c->hq);
    int64_t kvh = h / (c->hq / c->hkv);
    int64_t i0 = qb * BQ, nq = c->s - i0 < BQ ? c->s - i0 : BQ;
    int64_t d = c->d, dv = c->dv;
    for (int64_t i = 0; i < nq; i++) {
        float *qi = s->q + i * d;
        hr_load_f32(qi, at4(c->q, bi, h, i0 + i), c->q->dtype, d, c->q->strides[3]);
        for (int64_t e = 0; e < d; e++) qi[e] *= c->scale;
        for (int64_t e = 0; e < dv; e++) s->o[i * dv + e] = 0.0f;
        s->m[i] = -INFINITY;
        s->l[i] = 0.0f;
    }
    /* Query i sits at position t - s + i: keys past the last query's
     * position (causal) or before the first query's window are skipped. */
    int64_t pos0 = c->t - c->s + i0, lo = 0, hi = c->t;
    if (c->causal && pos0 + nq < hi) hi = pos0 + nq;
    if (c->window > 0 && pos0 - c->window + 1 > lo) lo = pos0 - c->window + 1;
    for (int64_t j0 = lo; j0 < hi; j0 += BK) {
        int nk = (int)(hi - j0 < BK ? hi - j0 : BK);
        for (int j = 0; j < nk; j++) {
            hr_load_f32(s->k + j * d, at4(c->k, bi, kvh, j0 + j), c->k->dtype, d, c->k->strides[3]);
            hr_load_f32(s->v + j * dv, at4(c->v, bi, kvh, j0 + j), c->v->dtype, dv, c->v->strides[3]);
        }
        for (int64_t i = 0; i < nq; i++) {
            (c->avx2 ? scores_avx2 : scores_scalar)(s->q + i * d, s->k, d, nk, s->p);
            mask_row(c, s, bi, h, i0 + i, pos0 + i, j0, nk);
            float mx = -INFINITY;
            for (int j = 0; j < nk; j++) mx = s->p[j] > mx ? s->p[j] : mx;
            if (mx == -INFINITY) continue; /* nothing to attend in this block */
            float m_new = mx > s->m[i] ? mx : s->m[i];
            float corr = expf(s->m[i] - m_new);
            float sum = (c->avx2 ? exp_sum_avx2 : exp_sum_scalar)(s->p, nk, m_new);
            s->l[i] = s->l[i] * corr + sum;
            s->m[i] = m_new;
            (c->avx2 ? accum_avx2 : accum_scalar)(s->o + i * dv, corr, s->p, s->v, dv, nk);
        }
    }
    for (int64_t i = 0; i < nq; i++) {
        float inv = s->l[i] > 0 ? 1.0f / s->l[i] : 0.0f;
        float *oi = s->o + i * dv;
        for (int64_t e = 0; e < dv; e++) oi[e] *= inv;
        hr_store_f32(at4(c->o, bi, h, i0 + i), c->o->dtype, oi, dv, c->o->strides[3]);
    }
}

static void attn_worker(void *arg, int ith, int nth) {
    attn_ctx *c = arg;
    int64_t begin, end;
    hr_split_range(c->units, ith, nth, &begin, &end);
    if (begin >= end) return;
    size_t n = (size_t)(BQ * c->d + BQ * c->dv + BK * c->d + BK * c->dv + 2 * BK);
    float *mem = malloc((n ? n : 1) * sizeof(float));
    if (!mem) {
        atomic_store(&c->failed, 1);
        return;
    }
    attn_scratch s = {.q = mem};
    s.o = s.q + BQ * c->d;
    s.k = s.o + BQ * c->dv;
    s.v = s.k + BK * c->d;
    s.p = s.v + BK * c->dv;
    s.mrow = s.p + BK;
    for (int64_t u = begin; u < end; u++) attn_unit(c, &s, u);
    free(mem);
}

/* q [b, hq, s, d], k [b, hkv, t, d], v [b, hkv, t, dv], mask -> o [b, hq, s, dv] */
static hr_status k_sdpa(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out) {
    static const hr_attrs_sdpa defaults = {0};
    const hr_attrs_sdpa *a = attrs ? attrs : &defaults;
    attn_ctx c = {.q = in[0], .k = in[1], .v = in[2], .mask = n_in > 3 ? in[3] : NULL, .o = out[0]};
    c.b = c.q->shape[0];
    c.hq = c.q->shape[1];
    c.s = c.q->shape[2];
    c.d = c.q->shape[3];
    c.hkv = c.k->shape[1];
    c.t = c.k->shape[2];
    c.dv = c.v->shape[3];
    c.scale = a->scale != 0 ? (float)a->scale : 1.0f / sqrtf((float)(c.d ? c.d : 1));
    c.softcap = (float)a->softcap;
    c.window = a->window;
    c.causal = a->is_causal;
    c.avx2 = hr_cpu_isa_get() >= HR_ISA_AVX2;
    if (c.mask)
        for (int i = 0; i < 4; i++) {
            int mi = c.mask->ndim - 4 + i;
            c.mstr[i] = mi >= 0 && c.mask->shape[mi] != 1 ? c.mask->strides[mi] : 0;
        }
    c.qblocks = (c.s + BQ - 1) / BQ;
    c.units = c.b * c.hq * c.qblocks;
    atomic_init(&c.failed, 0);
    int nth = hr_parallel_threads_for(c.b * c.hq * c.s * (c.t + 1) * (c.d + c.dv + 1), 1 << 16);
    if (nth > c.units) nth = (int)c.units;
    hr_parallel_run(attn_worker, &c, nth);
    if (atomic_load(&c.failed)) return hr_error(HR_ERR_OOM, "sdpa: out of memory for attention scratch");
    return HR_OK;
}

void hr_cpu_register_attention(hr_cpu_kernel_fn *table) { table[HR_OP_sdpa] = k_sdpa; }
