/* CPU kernels for the arithmetic eltwise ops: binary (broadcasting),
 * unary, and the fused silu_mul / gelu_mul.
 *
 * Rows come from hr_iter (operand 0 = output). Floating dtypes compute in
 * f32: contiguous f32 rows are computed in place, every other row goes
 * through f32 scratch in chunks of HR_ROW_CHUNK (bf16/f16 rows convert
 * with AVX2). Integer dtypes compute in i64 with wrap-around, as torch.
 *
 * Transcendentals: the portable path (and HUBRT_CPU_ISA=scalar) calls libm;
 * the AVX2 path evaluates exp, sigmoid, silu, tanh and gelu through a vector
 * exp, checked against double references in tests/c/test_ops_eltwise.c
 * (a few f32 ulps; gelu-erf within 2e-7 + 4e-7 relative). With simd every
 * element, a row's tail included, takes the vector code, so results do not
 * depend on the thread split; the f32 arithmetic (hr_k_eltwise_f32) is
 * shared with fused chains (k_fused_chain.c), which reproduce the bytes.
 * silu_mul on contiguous bf16 rows takes 16 lanes with AVX-512 (avx512_bf16),
 * the AVX2 code's operations lane for lane, so the same bytes. */
#include <math.h>
#include <string.h>

#include "backends/cpu/exp_poly.h"
#include "backends/cpu/k_eltwise.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backends/cpu/simd_math.h"
#define K_AVX2 1
#else
#define K_AVX2 0
#endif

typedef struct {
    hr_ew_op op;
    int n_in;
    hr_dtype dt[3];  /* output, input 0, input 1 */
    bool int_math;   /* integer output: compute in i64 */
    bool all_f32;    /* every operand f32: contiguous rows need no scratch */
    bool simd;
    bool silu_avx512; /* silu_mul on bf16 with AVX-512 allowed: silu_mul_bf16_avx512 */
    float lo, hi;        /* clamp bounds (+-inf when absent); scale mul, add */
    int64_t ilo, ihi;    /* clamp bounds for integer dtypes */
} ew_ctx;

/* ---- scalar element functions (libm: accuracy first) ------------------ */

#define SQRT1_2F 0.70710678118654752f
#define SQRT2_PIF 0.79788456080286536f

static inline float nan_max(float a, float b) { return a != a ? a : b != b ? b : a > b ? a : b; }
static inline float nan_min(float a, float b) { return a != a ? a : b != b ? b : a < b ? a : b; }
static inline float silu1(float x) { return x / (1.0f + expf(-x)); }
static inline float gelu1(float x) { return 0.5f * x * (1.0f + erff(x * SQRT1_2F)); }
static inline float gelu_tanh1(float x) {
    return 0.5f * x * (1.0f + tanhf(SQRT2_PIF * (x + 0.044715f * x * x * x)));
}

/* ---- AVX2 building blocks ------------------------------------------------ */

#if K_AVX2
/* exp(x) for f32: Cody-Waite range reduction by ln 2 and a degree-6
 * polynomial; about 2 ulp on [-87, 88], overflow saturates to +inf and
 * underflow to 0. */
static inline __attribute__((always_inline)) __m256 exp8_in(__m256 xc) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(HR_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(HR_EXP_LN2_HI), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(HR_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(HR_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HR_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HR_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HR_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HR_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HR_EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n in two halves so n = 128 (x near the top) does not overflow the
     * exponent field before the multiply. */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i h1 = _mm256_srai_epi32(ni, 1), h2 = _mm256_sub_epi32(ni, h1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* The clamps and fix-ups around exp8_in are skipped when every lane is
 * inside the clamp bounds (no NaN), where they change nothing. */
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.72283935546875f), lo = _mm256_set1_ps(-87.33654022216797f);
    __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), _mm256_cmp_ps(x, hi, _CMP_LE_OQ));
    if (_mm256_movemask_ps(in) == 0xff) return exp8_in(x);
    __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ), under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 y = exp8_in(_mm256_min_ps(_mm256_max_ps(x, lo), hi));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
    y = _mm256_andnot_ps(under, y);
    /* NaN in, NaN out (the clamp above would have hidden it). */
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static inline __m256 sigmoid8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

static inline __m256 silu8(__m256 x) { return _mm256_mul_ps(x, sigmoid8(x)); }

/* tanh as Cephes tanhf: an odd polynomial below |x| = 0.625, where
 * 1 - 2 / (exp(2|x|) + 1) would cancel, and that formula above. */
static inline __m256 tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 ax = _mm256_andnot_ps(sign, x), z = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    __m256 e = exp8(_mm256_add_ps(ax, ax));
    __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    big = _mm256_or_ps(big, _mm256_and_ps(sign, x));
    return _mm256_blendv_ps(small, big, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_GT_OQ));
}

/* gelu(x) = x/2 * erfc(-x/sqrt2). erfc(z), z >= 0, by the Chebyshev fit of
 * Numerical Recipes (erfcc: relative error below 1.2e-7 everywhere),
 * taken straight for x < 0 so the small tail keeps its relative accuracy
 * instead of cancelling in 1 + erf. */
static inline __m256 gelu8(__m256 x) {
    static const float c[10] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                                -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 z = _mm256_mul_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(SQRT1_2F));
    __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(z, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
    __m256 p = _mm256_set1_ps(c[0]);
    for (int k = 1; k < 10; k++) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c[k]));
    __m256 q = _mm256_mul_ps(t, exp8(_mm256_fnmadd_ps(z, z, p)));
    __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256 f = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0f), q), q, neg);
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), f);
}

/* 0.5 x (1 + tanh(u)) = x * sigmoid(2u): no cancellation for x < 0. */
static inline __m256 gelu_tanh8(__m256 x) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(2.0f * SQRT2_PIF), _mm256_fmadd_ps(x3, _mm256_set1_ps(0.044715f), x));
    return _mm256_mul_ps(x, sigmoid8(u));
}

static inline __m256 nan_max8(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
static inline __m256 nan_min8(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

/* Runs VEXPR over whole vectors of 8 and SEXPR over the tail; `va`, `vb`
 * and `x`, `y` name the current operands. */
#define EW_LOOP(VEXPR, SEXPR)                                                   \
    do {                                                                        \
        int64_t i = 0;                                                          \
        if (simd)                                                               \
            for (; i + 8 <= n; i += 8) {                                        \
                __m256 va = _mm256_loadu_ps(a + i);                             \
                __m256 vb = b ? _mm256_loadu_ps(b + i) : va;                    \
                (void)vb;                                                       \
                _mm256_storeu_ps(o + i, (VEXPR));                               \
            }                                                                   \
        for (; i < n; i++) {                                                    \
            float x = a[i], y = b ? b[i] : x;                                   \
            (void)y;                                                            \
            o[i] = (SEXPR);                                                     \
        }                                                                       \
    } while (0)
#else
#define EW_LOOP(VEXPR, SEXPR)                                                   \
    do {                                                                        \
        for (int64_t i = 0; i < n; i++) {                                       \
            float x = a[i], y = b ? b[i] : x;                                   \
            (void)y;                                                            \
            o[i] = (SEXPR);                                                     \
        }                                                                       \
    } while (0)
#endif

static void eltwise_span(hr_ew_op op, float p0, float p1, float *o, const float *a, const float *b, int64_t n,
                         bool simd) {
#if K_AVX2
    const __m256 zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    const __m256 vlo = _mm256_set1_ps(p0), vhi = _mm256_set1_ps(p1);
    (void)zero, (void)sign, (void)vlo, (void)vhi;
#else
    (void)simd;
#endif
    const float lo = p0, hi = p1;
    switch (op) {
    case HR_EW_ADD: EW_LOOP(_mm256_add_ps(va, vb), x + y); break;
    case HR_EW_SUB: EW_LOOP(_mm256_sub_ps(va, vb), x - y); break;
    case HR_EW_MUL: EW_LOOP(_mm256_mul_ps(va, vb), x * y); break;
    case HR_EW_DIV: EW_LOOP(_mm256_div_ps(va, vb), x / y); break;
    case HR_EW_MAX: EW_LOOP(nan_max8(vb, va), nan_max(x, y)); break;
    case HR_EW_MIN: EW_LOOP(nan_min8(vb, va), nan_min(x, y)); break;
    case HR_EW_SILU_MUL: EW_LOOP(_mm256_mul_ps(silu8(va), vb), silu1(x) * y); break;
    case HR_EW_NEG: EW_LOOP(_mm256_xor_ps(va, sign), -x); break;
    case HR_EW_ABS: EW_LOOP(_mm256_andnot_ps(sign, va), fabsf(x)); break;
    case HR_EW_RELU: EW_LOOP(_mm256_max_ps(zero, va), x > 0.0f || x != x ? x : 0.0f); break;
    case HR_EW_SQRT: EW_LOOP(_mm256_sqrt_ps(va), sqrtf(x)); break;
    case HR_EW_RSQRT: EW_LOOP(_mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(va)), 1.0f / sqrtf(x)); break;
    case HR_EW_SIGMOID: EW_LOOP(sigmoid8(va), 1.0f / (1.0f + expf(-x))); break;
    case HR_EW_SILU: EW_LOOP(silu8(va), silu1(x)); break;
    case HR_EW_SCALE: EW_LOOP(_mm256_fmadd_ps(va, vlo, vhi), fmaf(x, lo, hi)); break;
    case HR_EW_CLAMP: EW_LOOP(_mm256_min_ps(vhi, _mm256_max_ps(vlo, va)), x != x ? x : fminf(fmaxf(x, lo), hi)); break;
    case HR_EW_EXP: EW_LOOP(exp8(va), expf(x)); break;
    case HR_EW_TANH: EW_LOOP(tanh8(va), tanhf(x)); break;
    case HR_EW_GELU: EW_LOOP(gelu8(va), gelu1(x)); break;
    case HR_EW_GELU_TANH: EW_LOOP(gelu_tanh8(va), gelu_tanh1(x)); break;
    case HR_EW_GELU_MUL: EW_LOOP(_mm256_mul_ps(gelu8(va), vb), gelu1(x) * y); break;
    case HR_EW_GELU_TANH_MUL: EW_LOOP(_mm256_mul_ps(gelu_tanh8(va), vb), gelu_tanh1(x) * y); break;
    /* libm only: rare in models */
    case HR_EW_POW: for (int64_t i = 0; i < n; i++) o[i] = powf(a[i], b[i]); break;
    case HR_EW_LOG: for (int64_t i = 0; i < n; i++) o[i] = logf(a[i]); break;
    }
}

/* With simd, every element goes through the vector code, a last partial
 * vector through a padded copy (the vector code works lane by lane, so the
 * padding changes no lane): an element's result then does not depend on
 * where a call starts or ends, so it is the same for any thread split or
 * row chunking, and fused chains (k_fused_chain.c) reproduce it by calling
 * this on any range. The scalar code runs only without simd. */
void hr_k_eltwise_f32(hr_ew_op op, float p0, float p1, float *o, const float *a, const float *b, int64_t n,
                      bool simd) {
    int64_t whole = simd && K_AVX2 ? n & ~(int64_t)7 : n, rest = n - whole;
    eltwise_span(op, p0, p1, o, a, b, whole, simd);
    if (!rest) return;
    float pa[8] = {0}, pb[8] = {0};
    memcpy(pa, a + whole, sizeof(float) * (size_t)rest);
    if (b) memcpy(pb, b + whole, sizeof(float) * (size_t)rest);
    eltwise_span(op, p0, p1, pa, pa, b ? pb : NULL, 8, simd);
    memcpy(o + whole, pa, sizeof(float) * (size_t)rest);
}

#if K_AVX2
/* ---- silu_mul on bf16 rows with AVX-512 ------------------------------------
 * The model's MLP activation, 16 lanes at a time with the conversions in
 * registers: twice the AVX2 path's rate on Zen 4 (bench_smallops), where
 * converting in registers at 8 lanes gained nothing over the f32 chunks.
 * The same lane by lane arithmetic as hr_k_eltwise_f32, so the same bytes. */

static inline void silu_mul8_bf16(uint16_t *o, const uint16_t *a, const uint16_t *b) {
    hr_bf16x8_store(o, _mm256_mul_ps(silu8(hr_bf16x8_load(a)), hr_bf16x8_load(b)));
}

/* Elements [i, n) 8 at a time, a partial last vector through a padded copy. */
static void silu_mul_span_bf16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t i, int64_t n) {
    for (; i + 8 <= n; i += 8) silu_mul8_bf16(o + i, a + i, b + i);
    if (i == n) return;
    uint16_t pa[8] = {0}, pb[8] = {0}, po[8];
    memcpy(pa, a + i, sizeof(uint16_t) * (size_t)(n - i));
    memcpy(pb, b + i, sizeof(uint16_t) * (size_t)(n - i));
    silu_mul8_bf16(po, pa, pb);
    memcpy(o + i, po, sizeof(uint16_t) * (size_t)(n - i));
}

/* exp8's core on 16 lanes, for x already clamped: the same operations lane
 * for lane, but for 2^n, one vscalefps where exp8 multiplies by 2^(n/2)
 * twice: n is an integer in [-126, 128] and p in [0.7, 1.5], so the first
 * multiply is exact and the second rounds once (to inf or a subnormal at
 * the ends), as vscalefps does. Checked over every bf16 input by
 * test_ops_eltwise.py. */
static inline HR_T512 __attribute__((always_inline)) __m512 exp16_in(__m512 xc) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(HR_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(HR_EXP_LN2_HI), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(HR_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(HR_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HR_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HR_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HR_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HR_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HR_EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* The clamps and fix-ups of exp8 around exp16_in, skipped when every lane
 * is inside the clamp bounds (no NaN), where they change nothing. */
static inline HR_T512 __attribute__((always_inline)) __m512 exp16(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.72283935546875f), lo = _mm512_set1_ps(-87.33654022216797f);
    __mmask16 in = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(x, hi, _CMP_LE_OQ);
    if (in == 0xffff) return exp16_in(x);
    __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    __m512 y = exp16_in(_mm512_min_ps(_mm512_max_ps(x, lo), hi));
    y = _mm512_mask_mov_ps(y, over, _mm512_set1_ps(INFINITY));
    y = _mm512_maskz_mov_ps((__mmask16)~under, y);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

/* silu_mul of a bf16 row 16 at a time; a block whose result is subnormal
 * (vcvtneps2bf16 would flush it) and the last partial block take the
 * 8-lane code. */
static HR_T512 void silu_mul_bf16_avx512(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = hr_bf16x16_load(a + i);
        __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(x, sig), hr_bf16x16_load(b + i));
        if (hr_subnormal16(v)) silu_mul_span_bf16(o, a, b, i, i + 16);
        else _mm256_storeu_si256((__m256i *)(o + i), hr_bf16x16_pack(v));
    }
    silu_mul_span_bf16(o, a, b, i, n);
}
#endif

/* Integer math wraps around like torch's (unsigned arithmetic avoids the
 * signed-overflow UB). Only the ops inference lets through for ints. */
static void compute_i64(const ew_ctx *c, int64_t *o, const int64_t *a, const int64_t *b, int64_t n) {
    switch (c->op) {
    case HR_EW_ADD: for (int64_t i = 0; i < n; i++) o[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]); break;
    case HR_EW_SUB: for (int64_t i = 0; i < n; i++) o[i] = (int64_t)((uint64_t)a[i] - (uint64_t)b[i]); break;
    case HR_EW_MUL: for (int64_t i = 0; i < n; i++) o[i] = (int64_t)((uint64_t)a[i] * (uint64_t)b[i]); break;
    case HR_EW_MAX: for (int64_t i = 0; i < n; i++) o[i] = a[i] > b[i] ? a[i] : b[i]; break;
    case HR_EW_MIN: for (int64_t i = 0; i < n; i++) o[i] = a[i] < b[i] ? a[i] : b[i]; break;
    case HR_EW_NEG: for (int64_t i = 0; i < n; i++) o[i] = (int64_t)(0u - (uint64_t)a[i]); break;
    case HR_EW_ABS: for (int64_t i = 0; i < n; i++) o[i] = a[i] < 0 ? (int64_t)(0u - (uint64_t)a[i]) : a[i]; break;
    case HR_EW_RELU: for (int64_t i = 0; i < n; i++) o[i] = a[i] > 0 ? a[i] : 0; break;
    case HR_EW_CLAMP:
        for (int64_t i = 0; i < n; i++) {
            int64_t v = a[i] < c->ilo ? c->ilo : a[i];
            o[i] = v > c->ihi ? c->ihi : v;
        }
        break;
    default: break;
    }
}

/* ---- rows ------------------------------------------------------------------ */

static void row_int(const ew_ctx *c, char *const *p, const int64_t *s, int64_t n) {
    int64_t a[HR_ROW_CHUNK], b[HR_ROW_CHUNK];
    size_t sz[3] = {hr_dtype_size(c->dt[0]), hr_dtype_size(c->dt[1]), hr_dtype_size(c->dt[2])};
    for (int64_t off = 0; off < n; off += HR_ROW_CHUNK) {
        int64_t m = n - off < HR_ROW_CHUNK ? n - off : HR_ROW_CHUNK;
        hr_load_i64(a, p[1] + off * s[1] * (int64_t)sz[1], c->dt[1], m, s[1]);
        if (c->n_in == 2) hr_load_i64(b, p[2] + off * s[2] * (int64_t)sz[2], c->dt[2], m, s[2]);
        compute_i64(c, a, a, b, m);
        hr_store_i64(p[0] + off * s[0] * (int64_t)sz[0], c->dt[0], a, m, s[0]);
    }
}

static void row_ew(void *vctx, char *const *p, const int64_t *s, int64_t n) {
    const ew_ctx *c = vctx;
    if (c->int_math) return row_int(c, p, s, n);
    bool two = c->n_in == 2;
#if K_AVX2
    if (c->silu_avx512 && s[0] == 1 && s[1] == 1 && s[2] == 1) {
        silu_mul_bf16_avx512((uint16_t *)p[0], (const uint16_t *)p[1], (const uint16_t *)p[2], n);
        return;
    }
#endif
    if (c->all_f32 && s[0] == 1 && s[1] == 1 && (!two || s[2] == 1)) {
        hr_k_eltwise_f32(c->op, c->lo, c->hi, (float *)p[0], (const float *)p[1], two ? (const float *)p[2] : NULL,
                         n, c->simd);
        return;
    }
    float a[HR_ROW_CHUNK], b[HR_ROW_CHUNK];
    size_t sz[3] = {hr_dtype_size(c->dt[0]), hr_dtype_size(c->dt[1]), two ? hr_dtype_size(c->dt[2]) : 0};
    for (int64_t off = 0; off < n; off += HR_ROW_CHUNK) {
        int64_t m = n - off < HR_ROW_CHUNK ? n - off : HR_ROW_CHUNK;
        hr_k_load_f32(a, p[1] + off * s[1] * (int64_t)sz[1], c->dt[1], m, s[1], c->simd);
        if (two) hr_k_load_f32(b, p[2] + off * s[2] * (int64_t)sz[2], c->dt[2], m, s[2], c->simd);
        hr_k_eltwise_f32(c->op, c->lo, c->hi, a, a, two ? b : NULL, m, c->simd);
        hr_k_store_f32(p[0] + off * s[0] * (int64_t)sz[0], c->dt[0], a, m, s[0], c->simd);
    }
}

static hr_status run_ew(ew_ctx *c, const hr_tensor *const *in, hr_tensor *const *out) {
    const hr_tensor *ops[3] = {out[0], in[0], c->n_in == 2 ? in[1] : NULL};
    c->dt[0] = out[0]->dtype;
    c->all_f32 = c->dt[0] == HR_F32;
    for (int k = 1; k <= c->n_in; k++) {
        c->dt[k] = ops[k]->dtype;
        c->all_f32 &= c->dt[k] == HR_F32;
    }
    c->int_math = !hr_dtype_is_float(c->dt[0]);
    c->simd = hr_k_simd() && K_AVX2;
    c->silu_avx512 = c->simd && c->op == HR_EW_SILU_MUL && c->dt[0] == HR_BF16 && c->dt[1] == HR_BF16 &&
                     c->dt[2] == HR_BF16 && hr_cpu_isa_get() >= HR_ISA_AVX512 && hr_cpu_features_get()->avx512_bf16;
    hr_iter it;
    hr_iter_init(&it, 1 + c->n_in, ops);
    hr_iter_parallel(&it, row_ew, c);
    return HR_OK;
}

/* ---- kernels ----------------------------------------------------------------- */

#define K_SIMPLE(name, OP, N)                                                                    \
    static hr_status k_##name(const void *attrs, const hr_tensor *const *in, int n_in,           \
                              hr_tensor *const *out, int n_out) {                                \
        ew_ctx c = {.op = OP, .n_in = N};                                                        \
        return run_ew(&c, in, out);                                                              \
    }
K_SIMPLE(add, HR_EW_ADD, 2)
K_SIMPLE(sub, HR_EW_SUB, 2)
K_SIMPLE(mul, HR_EW_MUL, 2)
K_SIMPLE(div, HR_EW_DIV, 2)
K_SIMPLE(pow, HR_EW_POW, 2)
K_SIMPLE(maximum, HR_EW_MAX, 2)
K_SIMPLE(minimum, HR_EW_MIN, 2)
K_SIMPLE(silu_mul, HR_EW_SILU_MUL, 2)
K_SIMPLE(neg, HR_EW_NEG, 1)
K_SIMPLE(exp, HR_EW_EXP, 1)
K_SIMPLE(log, HR_EW_LOG, 1)
K_SIMPLE(sqrt, HR_EW_SQRT, 1)
K_SIMPLE(rsqrt, HR_EW_RSQRT, 1)
K_SIMPLE(abs, HR_EW_ABS, 1)
K_SIMPLE(relu, HR_EW_RELU, 1)
K_SIMPLE(sigmoid, HR_EW_SIGMOID, 1)
K_SIMPLE(tanh, HR_EW_TANH, 1)
K_SIMPLE(silu, HR_EW_SILU, 1)

static hr_status k_gelu(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out) {
    const hr_attrs_gelu *a = attrs;
    ew_ctx c = {.op = a->approximate == HR_GELU_TANH ? HR_EW_GELU_TANH : HR_EW_GELU, .n_in = 1};
    return run_ew(&c, in, out);
}

static hr_status k_gelu_mul(const void *attrs, const hr_tensor *const *in, int n_in,
                            hr_tensor *const *out, int n_out) {
    const hr_attrs_gelu *a = attrs;
    ew_ctx c = {.op = a->approximate == HR_GELU_TANH ? HR_EW_GELU_TANH_MUL : HR_EW_GELU_MUL, .n_in = 2};
    return run_ew(&c, in, out);
}

static hr_status k_scale(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                         int n_out) {
    const hr_attrs_scale *a = attrs;
    ew_ctx c = {.op = HR_EW_SCALE, .n_in = 1, .lo = (float)a->mul, .hi = (float)a->add};
    return run_ew(&c, in, out);
}

/* Integer bounds truncate toward zero, as torch converts a float scalar
 * to an integer tensor's dtype; bounds beyond int64 saturate. */
static int64_t bound_i64(double v, bool has, int64_t none) {
    if (!has) return none;
    if (v >= 9.2e18) return INT64_MAX;
    if (v <= -9.2e18) return INT64_MIN;
    return (int64_t)v;
}

static hr_status k_clamp(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                         int n_out) {
    const hr_attrs_clamp *a = attrs;
    ew_ctx c = {.op = HR_EW_CLAMP, .n_in = 1};
    c.lo = a->has_min ? (float)a->min : -INFINITY;
    c.hi = a->has_max ? (float)a->max : INFINITY;
    c.ilo = bound_i64(a->min, a->has_min, INT64_MIN);
    c.ihi = bound_i64(a->max, a->has_max, INT64_MAX);
    return run_ew(&c, in, out);
}

void hr_cpu_register_eltwise(hr_cpu_kernel_fn *table) {
    table[HR_OP_add] = k_add;
    table[HR_OP_sub] = k_sub;
    table[HR_OP_mul] = k_mul;
    table[HR_OP_div] = k_div;
    table[HR_OP_pow] = k_pow;
    table[HR_OP_maximum] = k_maximum;
    table[HR_OP_minimum] = k_minimum;
    table[HR_OP_silu_mul] = k_silu_mul;
    table[HR_OP_gelu_mul] = k_gelu_mul;
    table[HR_OP_neg] = k_neg;
    table[HR_OP_exp] = k_exp;
    table[HR_OP_log] = k_log;
    table[HR_OP_sqrt] = k_sqrt;
    table[HR_OP_rsqrt] = k_rsqrt;
    table[HR_OP_abs] = k_abs;
    table[HR_OP_relu] = k_relu;
    table[HR_OP_sigmoid] = k_sigmoid;
    table[HR_OP_tanh] = k_tanh;
    table[HR_OP_silu] = k_silu;
    table[HR_OP_gelu] = k_gelu;
    table[HR_OP_clamp] = k_clamp;
    table[HR_OP_scale] = k_scale;
    hr_cpu_register_eltwise_move(table);
}
