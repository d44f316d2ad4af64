/* CPU kernels for the nn ops: rms_norm, add_rms_norm, layer_norm,
 * rope_cos_sin, rope.
 *
 * All compute in f32 and round where transformers rounds, so bf16 results
 * agree bit for bit where the arithmetic allows:
 *   - rms_norm (LlamaRMSNorm): x * rsqrt(mean(x^2) + eps) in f32, rounded
 *     to x's dtype, THEN times weight, rounded again. With weight_offset
 *     != 0 (Gemma, Qwen3-Next: x_f32 * (offset + weight_f32)) everything
 *     stays f32 and rounds once.
 *   - layer_norm: f32 throughout, rounded once (as F.layer_norm).
 *   - rope_cos_sin: freqs = f32(position) * inv_freq in f32, cos/sin of
 *     that f32 value (correctly rounded), times attention_scaling in f32.
 *   - rope: q * cos + rotate_half(q) * sin, each product and the sum
 *     rounded to the dtype torch computes them in (x's, when cos shares
 *     it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/k_eltwise.h"
#include "backends/cpu/k_nn_simd.h"
#include "core/error.h"
#include "core/half.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"
#include "ops/op_impl.h"

/* The last bits above depend on no multiply-add being fused: GCC keeps
 * them apart in ISO C mode, clang needs telling. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define CHUNK 256

typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

/* Rounds f32 values to dt's precision, keeping them in f32 (round to
 * nearest even, as torch's casts). */
static void round_to(hr_dtype dt, float *x, int64_t n) {
    int64_t i = 0;
    if (dt == HR_BF16) {
        for (; i + 8 <= n; i += 8) {
            v8u u;
            memcpy(&u, x + i, sizeof u);
            v8u r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
            v8u nan = (u & 0x7fffffffu) > 0x7f800000u;
            r = (nan & ((u | 0x00400000u) & 0xffff0000u)) | (~nan & r); /* as hr_f32_to_bf16 */
            memcpy(x + i, &r, sizeof r);
        }
        for (; i < n; i++) x[i] = hr_bf16_to_f32(hr_f32_to_bf16(x[i]));
    } else if (dt == HR_F16) {
        for (; i < n; i++) x[i] = hr_f16_to_f32(hr_f32_to_f16(x[i]));
    }
}

/* Walks rows (flat index over the first nd dims of a tensor's shape)
 * keeping the multi-index, so each step costs no division. Dims of size 1
 * are left out, so a run (walk_run) spans the innermost dim that has rows;
 * with by_stride the dims are walked in the order of their strides in t,
 * the smallest innermost (rows are independent, so any order gives the
 * same bytes): rope's q, a [b, n, s, d] view of [b, s, n, d], then walks
 * its heads in memory order under one cos/sin row. */
typedef struct {
    int nd;
    int dim[HR_MAX_DIMS]; /* the tensor dim of each walked dim */
    int64_t shape[HR_MAX_DIMS];
    int64_t idx[HR_MAX_DIMS];
} row_walk;

static void walk_init(row_walk *w, const hr_tensor *t, int nd, bool by_stride, int64_t r) {
    w->nd = 0;
    for (int i = 0; i < nd; i++) {
        if (t->shape[i] == 1) continue;
        int j = w->nd++;
        int64_t si = llabs(t->strides[i]);
        for (; by_stride && j > 0 && llabs(t->strides[w->dim[j - 1]]) < si; j--) w->dim[j] = w->dim[j - 1];
        w->dim[j] = i;
    }
    for (int i = 0; i < w->nd; i++) w->shape[i] = t->shape[w->dim[i]];
    for (int i = w->nd - 1; i >= 0; i--) {
        w->idx[i] = r % w->shape[i];
        r /= w->shape[i];
    }
}

static void walk_next(row_walk *w) {
    for (int i = w->nd - 1; i >= 0; i--) {
        if (++w->idx[i] < w->shape[i]) return;
        w->idx[i] = 0;
    }
}

/* Address of the current row's first element in t. */
static char *walk_ptr(const row_walk *w, const hr_tensor *t) {
    int64_t off = 0;
    for (int i = 0; i < w->nd; i++) off += w->idx[i] * t->strides[w->dim[i]];
    return (char *)hr_tensor_ptr(t) + off * (int64_t)hr_dtype_size(t->dtype);
}

/* Rows left in the current run, at most e - r: the rest of the innermost
 * walked dim, whose rows lie a fixed stride apart in every tensor. */
static int64_t walk_run(const row_walk *w, int64_t r, int64_t e) {
    if (w->nd == 0) return e - r;
    int64_t left = w->shape[w->nd - 1] - w->idx[w->nd - 1];
    return left < e - r ? left : e - r;
}

/* Steps over k >= 1 rows of the current run. */
static void walk_skip(row_walk *w, int64_t k) {
    if (w->nd == 0) return;
    w->idx[w->nd - 1] += k - 1;
    walk_next(w);
}

/* Bytes between consecutive rows of a run in t. */
static int64_t walk_stride(const row_walk *w, const hr_tensor *t) {
    return w->nd ? t->strides[w->dim[w->nd - 1]] * (int64_t)hr_dtype_size(t->dtype) : 0;
}

/* The AVX2 rows of k_nn_simd.c take f32, bf16 and f16 operands with
 * contiguous last dims. */
static bool simd_rows(bool simd, hr_dtype dt, const hr_tensor *const *ts, int n) {
    if (!HR_NN_SIMD || !simd || (dt != HR_F32 && dt != HR_BF16 && dt != HR_F16)) return false;
    for (int i = 0; i < n; i++)
        if (ts[i]->dtype != dt || ts[i]->strides[ts[i]->ndim - 1] != 1) return false;
    return true;
}

static inline v8f v8_load(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* y = (x - mean) * rstd */
static void normalize(float *y, const float *x, float mean, float rstd, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = (v8_load(x + i) - mean) * rstd;
        memcpy(y + i, &v, sizeof v);
    }
    for (; i < n; i++) y[i] = (x[i] - mean) * rstd;
}

/* y = y * (w + offset), then + b when b */
static void affine(float *y, const float *w, float offset, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = v8_load(y + i) * (v8_load(w + i) + offset);
        if (b) v += v8_load(b + i);
        memcpy(y + i, &v, sizeof v);
    }
    for (; i < n; i++) y[i] = y[i] * (w[i] + offset) + (b ? b[i] : 0.0f);
}

/* ---- rms_norm, layer_norm -------------------------------------------------- */

typedef struct {
    const hr_tensor *x, *w, *b, *y;
    hr_op op;
    float eps, offset;
    int64_t rows, h;
    bool simd; /* vector row conversions allowed (HUBRT_CPU_ISA) */
    bool fast; /* rms_norm through hr_nn_rms_rows */
    bool avx512; /* fast: hr_nn_avx512() */
    float *wf; /* fast: the weight plus its offset in f32 [h], or NULL */
} norm_ctx;

static float sum_sq(const float *x, int64_t n, float shift) {
    v8f a0 = {0}, a1 = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v8f u = v8_load(x + i) - shift, v = v8_load(x + i + 8) - shift;
        a0 += u * u;
        a1 += v * v;
    }
    a0 += a1;
    float s = ((a0[0] + a0[4]) + (a0[1] + a0[5])) + ((a0[2] + a0[6]) + (a0[3] + a0[7]));
    for (; i < n; i++) s += (x[i] - shift) * (x[i] - shift);
    return s;
}

static float sum_plain(const float *x, int64_t n) {
    v8f a = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) a += v8_load(x + i);
    float s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    for (; i < n; i++) s += x[i];
    return s;
}

/* n values of a 1-d tensor from element k0, as f32 in dst. */
static void load_vec(bool simd, float *dst, const hr_tensor *t, int64_t k0, int64_t n) {
    hr_k_load_f32(dst, (const char *)hr_tensor_ptr(t) + k0 * t->strides[0] * (int64_t)hr_dtype_size(t->dtype),
                  t->dtype, n, t->strides[0], simd);
}

/* The weight [h] plus offset in f32, once per call for the rows of
 * k_nn_simd.c (affine() adds them the same way); the caller frees *out. */
static hr_status weight_f32(bool simd, const hr_tensor *w, float offset, int64_t h, float **out) {
    float *wf = malloc(sizeof(float) * (size_t)h);
    if (!wf) return hr_error(HR_ERR_OOM, "out of memory for a weight of %lld", (long long)h);
    load_vec(simd, wf, w, 0, h);
    for (int64_t i = 0; i < h; i++) wf[i] += offset;
    *out = wf;
    return HR_OK;
}

/* One row of h values: x at px, y at py (strides of their last dims). */
static void norm_row(const norm_ctx *c, const char *px, char *py) {
    const hr_tensor *x = c->x;
    float buf[CHUNK], wb[CHUNK], bb[CHUNK];
    int64_t h = c->h, sx = x->strides[x->ndim - 1], sy = c->y->strides[c->y->ndim - 1];
    int64_t xsz = (int64_t)hr_dtype_size(x->dtype), ysz = (int64_t)hr_dtype_size(c->y->dtype);
    bool rms = c->op == HR_OP_rms_norm;
    float mean = 0, acc = 0;
    if (!rms) {
        for (int64_t k0 = 0; k0 < h; k0 += CHUNK) {
            int64_t n = h - k0 < CHUNK ? h - k0 : CHUNK;
            hr_k_load_f32(buf, px + k0 * sx * xsz, x->dtype, n, sx, c->simd);
            acc += sum_plain(buf, n);
        }
        mean = acc / (float)h;
        acc = 0;
    }
    for (int64_t k0 = 0; k0 < h; k0 += CHUNK) {
        int64_t n = h - k0 < CHUNK ? h - k0 : CHUNK;
        hr_k_load_f32(buf, px + k0 * sx * xsz, x->dtype, n, sx, c->simd);
        acc += sum_sq(buf, n, mean);
    }
    float rstd = 1.0f / sqrtf(acc / (float)h + c->eps);
    for (int64_t k0 = 0; k0 < h; k0 += CHUNK) {
        int64_t n = h - k0 < CHUNK ? h - k0 : CHUNK;
        hr_k_load_f32(buf, px + k0 * sx * xsz, x->dtype, n, sx, c->simd);
        normalize(buf, buf, mean, rstd, n);
        if (c->w) {
            load_vec(c->simd, wb, c->w, k0, n);
            if (c->b) load_vec(c->simd, bb, c->b, k0, n);
            /* LlamaRMSNorm: back to x's dtype, then times the weight */
            if (rms && c->offset == 0) round_to(x->dtype, buf, n);
            affine(buf, wb, c->offset, c->b ? bb : NULL, n);
        }
        hr_k_store_f32(py + k0 * sy * ysz, c->y->dtype, buf, n, sy, c->simd);
    }
}

static void norm_body(void *arg, int ith, int nth) {
    const norm_ctx *c = arg;
    int64_t b, e;
    hr_split_range(c->rows, ith, nth, &b, &e);
    if (b >= e) return;
    row_walk w;
    walk_init(&w, c->x, c->x->ndim - 1, false, b);
#if HR_NN_SIMD
    if (c->fast) {
        for (int64_t r = b, k; r < e; r += k, walk_skip(&w, k)) {
            k = walk_run(&w, r, e);
            hr_nn_rms_rows(c->x->dtype, c->avx512, k, c->h, CHUNK, walk_ptr(&w, c->x), walk_stride(&w, c->x),
                           walk_ptr(&w, c->y), walk_stride(&w, c->y), c->wf, c->wf && c->offset == 0, c->eps);
        }
        return;
    }
#endif
    for (int64_t r = b; r < e; r++, walk_next(&w)) norm_row(c, walk_ptr(&w, c->x), walk_ptr(&w, c->y));
}

static hr_status k_norm(hr_op op, const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *out) {
    const hr_attrs_norm *a = attrs;
    norm_ctx c = {.x = in[0], .w = n_in > 1 ? in[1] : NULL, .b = n_in > 2 ? in[2] : NULL, .y = out, .op = op};
    c.eps = a ? (float)a->eps : 0.0f;
    c.offset = a ? (float)a->weight_offset : 0.0f;
    c.h = in[0]->shape[in[0]->ndim - 1];
    c.rows = c.h ? hr_tensor_numel(in[0]) / c.h : 0;
    c.simd = hr_k_simd();
    if (c.rows == 0) return HR_OK;
    c.fast = op == HR_OP_rms_norm && simd_rows(c.simd, c.x->dtype, (const hr_tensor *[]){c.x, out}, 2);
    c.avx512 = c.fast && hr_nn_avx512();
    if (c.fast && c.w) HR_TRY(weight_f32(c.simd, c.w, c.offset, c.h, &c.wf));
    hr_parallel_run(norm_body, &c, hr_parallel_threads_for(c.rows * c.h, HR_GRAIN_ROWS));
    free(c.wf);
    return HR_OK;
}

static hr_status k_rms_norm(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                            int n_out) {
    return k_norm(HR_OP_rms_norm, attrs, in, n_in, out[0]);
}

static hr_status k_layer_norm(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                              int n_out) {
    return k_norm(HR_OP_layer_norm, attrs, in, n_in, out[0]);
}

/* ---- add_rms_norm ---------------------------------------------------------- */

/* One row is two passes over data that stays in L1: the sum is rounded
 * and stored while its squares accumulate, then read back, normalized and
 * scaled. Bit for bit the unfused add + rms_norm, except the AVX-512 row,
 * which sums the squares in another order. */
typedef struct {
    const hr_tensor *x, *r, *w; /* x, residual [..., h]; weight [h] or NULL */
    const hr_tensor *y, *s;     /* normed, sum [..., h]; may alias x or r */
    float eps, offset;
    int64_t rows, h;
    bool simd;   /* vector row conversions allowed (HUBRT_CPU_ISA) */
    bool avx512; /* every row contiguous bf16 and the AVX-512 path allowed */
    bool fast;   /* k_nn_simd.c's rows (simd_rows of x, r, s, y) */
    bool fast512; /* fast: hr_nn_avx512() */
    float *wf;   /* fast: the weight plus its offset in f32 [h], or NULL */
} add_norm_ctx;

/* a = round(a + b) in place; returns the sum of the rounded squares. */
static float add_round_sum_sq(hr_dtype dt, float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = v8_load(a + i) + v8_load(b + i);
        memcpy(a + i, &v, sizeof v);
    }
    for (; i < n; i++) a[i] += b[i];
    round_to(dt, a, n);
    return sum_sq(a, n, 0.0f);
}

/* Pass 2 of one row (shared by every path): y = rms_norm(s) * w with s
 * already rounded, chunk by chunk through f32. */
static void add_norm_scale(const add_norm_ctx *c, const char *ps, char *py, float rstd) {
    const hr_tensor *s = c->s, *y = c->y;
    float buf[CHUNK], wb[CHUNK];
    int64_t ss = s->strides[s->ndim - 1], sy = y->strides[y->ndim - 1];
    int64_t esz = (int64_t)hr_dtype_size(s->dtype);
    for (int64_t k0 = 0; k0 < c->h; k0 += CHUNK) {
        int64_t n = c->h - k0 < CHUNK ? c->h - k0 : CHUNK;
        hr_k_load_f32(buf, ps + k0 * ss * esz, s->dtype, n, ss, c->simd);
        normalize(buf, buf, 0.0f, rstd, n);
        if (c->w) {
            load_vec(c->simd, wb, c->w, k0, n);
            if (c->offset == 0) round_to(y->dtype, buf, n); /* LlamaRMSNorm, as k_norm */
            affine(buf, wb, c->offset, NULL, n);
        }
        hr_k_store_f32(py + k0 * sy * esz, y->dtype, buf, n, sy, c->simd);
    }
}

/* Pass 1 of one row through f32 chunks, any dtype and strides. */
static float add_norm_sum_row(const add_norm_ctx *c, const char *px, const char *pr, char *ps) {
    float a[CHUNK], b[CHUNK], acc = 0;
    hr_dtype dt = c->x->dtype;
    int64_t esz = (int64_t)hr_dtype_size(dt);
    int64_t sx = c->x->strides[c->x->ndim - 1], sr = c->r->strides[c->r->ndim - 1];
    int64_t ss = c->s->strides[c->s->ndim - 1];
    for (int64_t k0 = 0; k0 < c->h; k0 += CHUNK) {
        int64_t n = c->h - k0 < CHUNK ? c->h - k0 : CHUNK;
        hr_k_load_f32(a, px + k0 * sx * esz, dt, n, sx, c->simd);
        hr_k_load_f32(b, pr + k0 * sr * esz, dt, n, sr, c->simd);
        acc += add_round_sum_sq(dt, a, b, n);
        hr_k_store_f32(ps + k0 * ss * esz, dt, a, n, ss, c->simd);
    }
    return acc;
}

#if defined(__x86_64__)
#define ADD_NORM_AVX512 1

/* Pass 1 of a contiguous bf16 row, 16 lanes at a time: the sum rounded to
 * bf16 (nearest even, NaNs kept quiet, as round_to) and its squares. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static float
add_norm_sum_row_bf16_avx512(const uint16_t *x, const uint16_t *r, uint16_t *s, int64_t h) {
    __m512 acc = _mm512_setzero_ps();
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x00400000);
    for (int64_t i = 0; i < h; i += 16) {
        __mmask16 m = h - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (h - i)) - 1);
        __m512i xi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + i)), 16);
        __m512i ri = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r + i)), 16);
        __m512i u = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(xi), _mm512_castsi512_ps(ri)));
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        rounded = _mm512_mask_or_epi32(rounded, nan, u, quiet);
        __m512i hi = _mm512_srli_epi32(rounded, 16);
        _mm256_mask_storeu_epi16(s + i, m, _mm512_cvtepi32_epi16(hi));
        __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
        acc = _mm512_add_ps(acc, _mm512_maskz_mul_ps(m, v, v));
    }
    return _mm512_reduce_add_ps(acc);
}
#endif

static void add_norm_body(void *arg, int ith, int nth) {
    const add_norm_ctx *c = arg;
    int64_t b, e;
    hr_split_range(c->rows, ith, nth, &b, &e);
    if (b >= e) return;
    row_walk w;
    walk_init(&w, c->x, c->x->ndim - 1, false, b);
    for (int64_t i = b; i < e; i++, walk_next(&w)) {
        const char *px = walk_ptr(&w, c->x), *pr = walk_ptr(&w, c->r);
        char *ps = walk_ptr(&w, c->s);
        float acc;
#ifdef ADD_NORM_AVX512
        if (c->avx512)
            acc = add_norm_sum_row_bf16_avx512((const uint16_t *)px, (const uint16_t *)pr, (uint16_t *)ps, c->h);
        else
#endif
#if HR_NN_SIMD
        if (c->fast)
            acc = hr_nn_add_sum_sq_row(c->x->dtype, c->h, CHUNK, px, pr, ps);
        else
#endif
            acc = add_norm_sum_row(c, px, pr, ps);
        float rstd = 1.0f / sqrtf(acc / (float)c->h + c->eps);
#if HR_NN_SIMD
        if (c->fast) {
            hr_nn_rms_scale_row(c->x->dtype, c->fast512, c->h, ps, walk_ptr(&w, c->y), c->wf, c->wf && c->offset == 0,
                                rstd);
            continue;
        }
#endif
        add_norm_scale(c, ps, walk_ptr(&w, c->y), rstd);
    }
}

static bool last_dim_unit(const hr_tensor *t) { return t->strides[t->ndim - 1] == 1; }

static hr_status k_add_rms_norm(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                                int n_out) {
    const hr_attrs_norm *a = attrs;
    add_norm_ctx c = {.x = in[0], .r = in[1], .w = n_in > 2 ? in[2] : NULL, .y = out[0], .s = out[1]};
    c.eps = a ? (float)a->eps : 0.0f;
    c.offset = a ? (float)a->weight_offset : 0.0f;
    c.h = c.x->shape[c.x->ndim - 1];
    c.rows = c.h ? hr_tensor_numel(c.x) / c.h : 0;
    c.simd = hr_k_simd();
#ifdef ADD_NORM_AVX512
    c.avx512 = c.x->dtype == HR_BF16 && hr_cpu_isa_get() >= HR_ISA_AVX512 && last_dim_unit(c.x) &&
               last_dim_unit(c.r) && last_dim_unit(c.s);
#endif
    if (c.rows == 0) return HR_OK;
    c.fast = simd_rows(c.simd, c.x->dtype, (const hr_tensor *[]){c.x, c.r, c.s, c.y}, 4);
    c.fast512 = c.fast && hr_nn_avx512();
    if (c.fast && c.w) HR_TRY(weight_f32(c.simd, c.w, c.offset, c.h, &c.wf));
    hr_parallel_run(add_norm_body, &c, hr_parallel_threads_for(c.rows * c.h, HR_GRAIN_ROWS));
    free(c.wf);
    return HR_OK;
}

/* ---- rope_cos_sin ---------------------------------------------------------- */

typedef struct {
    const hr_tensor *pos, *cos, *sin;
    const float *inv; /* [half] */
    float scale;
    int64_t half, npos;
    bool simd;
} cos_sin_ctx;

static void cos_sin_body(void *arg, int ith, int nth) {
    const cos_sin_ctx *c = arg;
    const hr_tensor *pos = c->pos, *outs[2] = {c->cos, c->sin};
    float tab[2][CHUNK];
    int64_t b, e, osz = (int64_t)hr_dtype_size(c->cos->dtype);
    hr_split_range(c->npos, ith, nth, &b, &e);
    if (b >= e) return;
    row_walk w;
    walk_init(&w, pos, pos->ndim, false, b);
    for (int64_t r = b; r < e; r++, walk_next(&w)) {
        int64_t p;
        hr_load_i64(&p, walk_ptr(&w, pos), pos->dtype, 1, 1);
        float fp = (float)p; /* transformers: position_ids.float() * inv_freq, in f32 */
        for (int64_t i0 = 0; i0 < c->half; i0 += CHUNK) {
            int64_t n = c->half - i0 < CHUNK ? c->half - i0 : CHUNK;
            for (int64_t i = 0; i < n; i++) {
                double sv, cv;
                sincos((double)(fp * c->inv[i0 + i]), &sv, &cv);
                tab[0][i] = (float)cv * c->scale;
                tab[1][i] = (float)sv * c->scale;
            }
            for (int k = 0; k < 2; k++) {
                int64_t so = outs[k]->strides[outs[k]->ndim - 1];
                char *po = walk_ptr(&w, outs[k]);
                hr_k_store_f32(po + i0 * so * osz, outs[k]->dtype, tab[k], n, so, c->simd);
                hr_k_store_f32(po + (i0 + c->half) * so * osz, outs[k]->dtype, tab[k], n, so, c->simd);
            }
        }
    }
}

static hr_status k_rope_cos_sin(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                                int n_out) {
    const hr_attrs_rope_cos_sin *a = attrs;
    const hr_tensor *inv = in[1];
    cos_sin_ctx c = {.pos = in[0], .cos = out[0], .sin = out[1], .half = inv->shape[0], .simd = hr_k_simd()};
    c.scale = a && a->attention_scaling != 0 ? (float)a->attention_scaling : 1.0f;
    c.npos = hr_tensor_numel(in[0]);
    float *buf = malloc(sizeof(float) * (size_t)c.half);
    if (!buf) return hr_error(HR_ERR_OOM, "out of memory for %lld frequencies", (long long)c.half);
    hr_load_f32(buf, hr_tensor_ptr(inv), inv->dtype, c.half, inv->strides[0]);
    c.inv = buf;
    hr_parallel_run(cos_sin_body, &c, hr_parallel_threads_for(c.npos * c.half, HR_GRAIN_COS_SIN));
    free(buf);
    return HR_OK;
}

/* ---- rope ------------------------------------------------------------------ */

typedef struct {
    const hr_tensor *x, *y;
    hr_tensor cs[2]; /* cos, sin as views expanded to x's rank */
    hr_dtype mid;    /* dtype of torch's intermediate products and sum */
    int64_t rows, d, half;
    bool simd;
    bool fast;   /* the rotary part through hr_nn_rope_rows */
    bool avx512; /* fast: hr_nn_avx512() */
} rope_ctx;

/* n values of row `row` of t from element i, as f32. */
static void load_at(const rope_ctx *c, float *dst, const hr_tensor *t, const char *row, int64_t i, int64_t n) {
    int64_t s = t->strides[t->ndim - 1];
    hr_k_load_f32(dst, row + i * s * (int64_t)hr_dtype_size(t->dtype), t->dtype, n, s, c->simd);
}

/* y1 = x1 * c1 - x2 * s1 into x1, y2 = x2 * c2 + x1 * s2 into x2; the
 * products and sums rounded to `mid` as torch's ops round them. */
static void rope_math(hr_dtype mid, float *x1, float *x2, float *c1, float *c2, float *s1, float *s2, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f a = v8_load(x1 + i), b = v8_load(x2 + i);
        v8f p[4] = {a * v8_load(c1 + i), -b * v8_load(s1 + i), b * v8_load(c2 + i), a * v8_load(s2 + i)};
        memcpy(c1 + i, &p[0], sizeof p[0]);
        memcpy(s1 + i, &p[1], sizeof p[1]);
        memcpy(c2 + i, &p[2], sizeof p[2]);
        memcpy(s2 + i, &p[3], sizeof p[3]);
    }
    for (; i < n; i++) {
        float a = x1[i], b = x2[i];
        c1[i] *= a;
        s1[i] *= -b;
        c2[i] *= b;
        s2[i] *= a;
    }
    round_to(mid, c1, n);
    round_to(mid, s1, n);
    round_to(mid, c2, n);
    round_to(mid, s2, n);
    for (i = 0; i + 8 <= n; i += 8) {
        v8f a = v8_load(c1 + i) + v8_load(s1 + i), b = v8_load(c2 + i) + v8_load(s2 + i);
        memcpy(x1 + i, &a, sizeof a);
        memcpy(x2 + i, &b, sizeof b);
    }
    for (; i < n; i++) {
        x1[i] = c1[i] + s1[i];
        x2[i] = c2[i] + s2[i];
    }
}

/* Partial rotary: the features past the rotary dim pass through (as
 * values: a signaling NaN comes out quiet, as from the rotary math). */
static void pass_through(const rope_ctx *c, const char *px, char *py) {
    float buf[CHUNK];
    int64_t sy = c->y->strides[c->y->ndim - 1], ysz = (int64_t)hr_dtype_size(c->y->dtype);
    for (int64_t i0 = 2 * c->half; i0 < c->d; i0 += CHUNK) {
        int64_t n = c->d - i0 < CHUNK ? c->d - i0 : CHUNK;
        load_at(c, buf, c->x, px, i0, n);
        hr_k_store_f32(py + i0 * sy * ysz, c->y->dtype, buf, n, sy, c->simd);
    }
}

static void rope_body(void *arg, int ith, int nth) {
    const rope_ctx *c = arg;
    const hr_tensor *x = c->x, *y = c->y;
    float x1[CHUNK], x2[CHUNK], c1[CHUNK], c2[CHUNK], s1[CHUNK], s2[CHUNK];
    int64_t b, e, sy = y->strides[y->ndim - 1], ysz = (int64_t)hr_dtype_size(y->dtype);
    hr_split_range(c->rows, ith, nth, &b, &e);
    if (b >= e) return;
    row_walk w;
    walk_init(&w, x, x->ndim - 1, true, b);
#if HR_NN_SIMD
    if (c->fast) {
        for (int64_t r = b, k; r < e; r += k, walk_skip(&w, k)) {
            k = walk_run(&w, r, e);
            const char *px = walk_ptr(&w, x);
            char *py = walk_ptr(&w, y);
            int64_t xs = walk_stride(&w, x), ys = walk_stride(&w, y);
            hr_nn_rope_rows(x->dtype, c->avx512, k, c->half, px, xs, walk_ptr(&w, &c->cs[0]),
                            walk_stride(&w, &c->cs[0]), walk_ptr(&w, &c->cs[1]), walk_stride(&w, &c->cs[1]), py, ys);
            for (int64_t j = 0; j < k && 2 * c->half < c->d; j++)
                pass_through(c, px + j * xs, py + j * ys);
        }
        return;
    }
#endif
    for (int64_t r = b; r < e; r++, walk_next(&w)) {
        const char *px = walk_ptr(&w, x), *pc = walk_ptr(&w, &c->cs[0]), *ps = walk_ptr(&w, &c->cs[1]);
        char *py = walk_ptr(&w, y);
        for (int64_t i0 = 0; i0 < c->half; i0 += CHUNK) {
            int64_t n = c->half - i0 < CHUNK ? c->half - i0 : CHUNK;
            load_at(c, x1, x, px, i0, n);
            load_at(c, x2, x, px, i0 + c->half, n);
            load_at(c, c1, &c->cs[0], pc, i0, n);
            load_at(c, c2, &c->cs[0], pc, i0 + c->half, n);
            load_at(c, s1, &c->cs[1], ps, i0, n);
            load_at(c, s2, &c->cs[1], ps, i0 + c->half, n);
            rope_math(c->mid, x1, x2, c1, c2, s1, s2, n);
            hr_k_store_f32(py + i0 * sy * ysz, y->dtype, x1, n, sy, c->simd);
            hr_k_store_f32(py + (i0 + c->half) * sy * ysz, y->dtype, x2, n, sy, c->simd);
        }
        pass_through(c, px, py);
    }
}

/* cos/sin as views of x's rank: leading dims added, size-1 dims stride 0. */
static void expand_to(const hr_tensor *t, const hr_tensor *x, hr_tensor *v) {
    memcpy(v, t, sizeof *v);
    int lead = x->ndim - t->ndim;
    v->ndim = x->ndim;
    for (int i = x->ndim - 1; i >= 0; i--) {
        int j = i - lead;
        bool bcast = j < 0 || t->shape[j] == 1;
        v->shape[i] = i == x->ndim - 1 ? t->shape[j] : x->shape[i];
        v->strides[i] = bcast && i != x->ndim - 1 ? 0 : t->strides[j];
    }
}

static hr_status k_rope(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out) {
    const hr_tensor *x = in[0];
    rope_ctx c = {.x = x, .y = out[0], .simd = hr_k_simd()};
    expand_to(in[1], x, &c.cs[0]);
    expand_to(in[2], x, &c.cs[1]);
    c.mid = in[1]->dtype == x->dtype ? x->dtype : HR_F32;
    c.d = x->shape[x->ndim - 1];
    c.half = in[1]->shape[in[1]->ndim - 1] / 2;
    c.rows = c.d ? hr_tensor_numel(x) / c.d : 0;
    if (c.rows == 0) return HR_OK;
    c.fast = simd_rows(c.simd, x->dtype, (const hr_tensor *[]){x, out[0], &c.cs[0], &c.cs[1]}, 4);
    c.avx512 = c.fast && hr_nn_avx512();
    hr_parallel_run(rope_body, &c, hr_parallel_threads_for(c.rows * c.d, HR_GRAIN_ROWS));
    return HR_OK;
}

void hr_cpu_register_nn(hr_cpu_kernel_fn *table) {
    table[HR_OP_rms_norm] = k_rms_norm;
    table[HR_OP_add_rms_norm] = k_add_rms_norm;
    table[HR_OP_layer_norm] = k_layer_norm;
    table[HR_OP_rope_cos_sin] = k_rope_cos_sin;
    table[HR_OP_rope] = k_rope;
}
