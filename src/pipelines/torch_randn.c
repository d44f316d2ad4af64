/* torch.randn on the CPU, bit for bit: the latents diffusers draws with
 * generator=torch.Generator("cpu").manual_seed(s).
 *
 * What torch does for a contiguous f32 tensor of 16 or more elements
 * (normal_fill_AVX2, aten's DistributionTemplates):
 *   - at::mt19937, the reference MT19937 seeded with the low 32 bits of
 *     the seed, draws one 32-bit word per element; each becomes the
 *     uniform (word & 0xffffff) * 2^-24 in [0, 1), all of them first;
 *   - every 16 values are turned in place into normals by Box-Muller over
 *     the pairs (j, j + 8): radius sqrt(-2 log(1 - u_j)), angle
 *     2 pi u_{j+8}, cos to j and sin to j + 8;
 *   - a size that is not a multiple of 16 draws 16 more uniforms over the
 *     last 16 places and transforms them again.
 * log and sincos are not libm's but the Cephes polynomials of
 * avx_mathfun.h, as torch's compiler emitted them: every multiply that
 * feeds an add contracted into a fused multiply-add. fmaf() below stands
 * exactly where those are, so the bits do not depend on this machine's
 * ISA or compiler (contraction is off for this file). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/dequant.h"
#include "hubrt/diffusion.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define MT_N 624
#define MT_M 397

typedef struct mt19937 {
    uint32_t s[MT_N];
    int i;
} mt19937;

static void mt_seed(mt19937 *g, uint64_t seed) {
    g->s[0] = (uint32_t)seed;
    for (int i = 1; i < MT_N; i++) g->s[i] = 1812433253u * (g->s[i - 1] ^ (g->s[i - 1] >> 30)) + (uint32_t)i;
    g->i = MT_N;
}

static void mt_twist(mt19937 *g) {
    for (int i = 0; i < MT_N; i++) {
        uint32_t y = (g->s[i] & 0x80000000u) | (g->s[(i + 1) % MT_N] & 0x7fffffffu);
        g->s[i] = g->s[(i + MT_M) % MT_N] ^ (y >> 1) ^ (y & 1u ? 0x9908b0dfu : 0u);
    }
    g->i = 0;
}

static uint32_t mt_next(mt19937 *g) {
    if (g->i == MT_N) mt_twist(g);
    uint32_t y = g->s[g->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

static float uniform(mt19937 *g) { return (float)(mt_next(g) & 0xffffffu) * (1.0f / 16777216.0f); }

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Cephes logf for x in (0, 1]: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
 * log(1 + (m - 1)) by a degree-9 polynomial, e ln 2 in two parts. */
static float cephes_log(float x) {
    x = x > 0x1p-126f ? x : 0x1p-126f;
    uint32_t u = bits_of(x);
    float e = (float)((int32_t)(u >> 23) - 0x7f) + 1.0f;
    x = float_of((u & ~0x7f800000u) | bits_of(0.5f)); /* the mantissa in [0.5, 1) */
    float keep = 0.0f;
    if (x < 0.707106781186547524f) {
        keep = x; /* below sqrt(1/2): take 2m - 1 and one less in e */
        e = e - 1.0f;
    }
    x = (x - 1.0f) + keep;
    float z = x * x;
    float y = 7.0376836292e-2f;
    y = fmaf(y, x, -1.1514610310e-1f);
    y = fmaf(y, x, 1.1676998740e-1f);
    y = fmaf(y, x, -1.2420140846e-1f);
    y = fmaf(y, x, 1.4249322787e-1f);
    y = fmaf(y, x, -1.6668057665e-1f);
    y = fmaf(y, x, 2.0000714765e-1f);
    y = fmaf(y, x, -2.4999993993e-1f);
    y = fmaf(y, x, 3.3333331174e-1f);
    y = y * x;
    y = fmaf(y, z, e * -2.12194440e-4f);
    y = fmaf(z, -0.5f, y);
    return fmaf(e, 0.693359375f, x + y);
}

/* Cephes sincosf: the angle reduced by multiples of pi/4 (pi/4 in three
 * parts), then the sine or cosine polynomial per octant. */
static void cephes_sincos(float a, float *s, float *c) {
    uint32_t sign_sin = bits_of(a) & 0x80000000u;
    float x = float_of(bits_of(a) & 0x7fffffffu);
    int32_t j = (int32_t)(x * 1.27323954473516f); /* truncation, as cvttps */
    j = (j + 1) & ~1;
    float y = (float)j;
    sign_sin ^= (uint32_t)(j & 4) << 29;
    uint32_t sign_cos = (uint32_t)(~(j - 2) & 4) << 29;
    bool sine_poly_is_sin = (j & 2) == 0;
    x = fmaf(y, -0.78515625f, x);
    x = fmaf(y, -2.4187564849853515625e-4f, x);
    x = fmaf(y, -3.77489497744594108e-8f, x);
    float z = x * x;
    float pc = fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f);
    pc = fmaf(pc, z, 4.166664568298827e-2f);
    pc = pc * z;
    pc = fmaf(pc, z, -(z * 0.5f));
    pc = pc + 1.0f;
    float ps = fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f);
    ps = fmaf(ps, z, -1.6666654611e-1f);
    ps = ps * z;
    ps = fmaf(ps, x, x);
    float sv = sine_poly_is_sin ? ps : pc, cv = sine_poly_is_sin ? pc : ps;
    *s = float_of(bits_of(sv) ^ sign_sin);
    *c = float_of(bits_of(cv) ^ sign_cos);
}

static void box_muller16(float *d) {
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    for (int j = 0; j < 8; j++) {
        float radius = sqrtf(-2.0f * cephes_log(1.0f - d[j]));
        float s, c;
        cephes_sincos(two_pi * d[j + 8], &s, &c);
        d[j] = fmaf(radius * c, 1.0f, 0.0f); /* torch's fmadd with std 1 and mean 0: -0 becomes +0 */
        d[j + 8] = fmaf(radius * s, 1.0f, 0.0f);
    }
}

hr_status hr_torch_randn(uint64_t seed, int64_t n, float *out) {
    if (n < 16)
        return hr_error(HR_ERR_UNSUPPORTED, "randn: %lld values (torch draws fewer than 16 another way, which "
                        "hubrt does not reproduce)", (long long)n);
    mt19937 *g = malloc(sizeof *g);
    if (!g) return hr_error(HR_ERR_OOM, "randn: generator state");
    mt_seed(g, seed);
    for (int64_t i = 0; i < n; i++) out[i] = uniform(g);
    for (int64_t i = 0; i + 16 <= n; i += 16) box_muller16(out + i);
    if (n % 16) {
        float *tail = out + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = uniform(g);
        box_muller16(tail);
    }
    free(g);
    return HR_OK;
}

/* ---- bf16 and f16 ---------------------------------------------------------------- */

/* torch draws a 16-bit float tensor through f32 values: the f32 stream's
 * blocks for the whole 16-value blocks (uniforms drawn for those places
 * only), then, when n is not a multiple of 16, one more block from the next
 * 16 uniforms over the last 16 places; each value rounded to the type. The
 * body is the f32 stream's; the tail is not (the f32 stream drew uniforms
 * for every place before its tail). */
hr_status hr_torch_randn_as(uint64_t seed, int64_t n, hr_dtype dt, void *out) {
    if (dt == HR_F32) return hr_torch_randn(seed, n, out);
    if (dt != HR_BF16 && dt != HR_F16)
        return hr_error(HR_ERR_DTYPE, "randn: %s (torch's stream is reproduced for f32, bf16 and f16)", hr_dtype_name(dt));
    if (n < 16)
        return hr_error(HR_ERR_UNSUPPORTED, "randn: %lld values (torch draws fewer than 16 another way, which "
                        "hubrt does not reproduce)", (long long)n);
    mt19937 *g = malloc(sizeof *g);
    float *v = malloc((size_t)n * sizeof *v);
    if (!g || !v) {
        free(g);
        free(v);
        return hr_error(HR_ERR_OOM, "randn: %lld values", (long long)n);
    }
    mt_seed(g, seed);
    int64_t body = n / 16 * 16;
    for (int64_t i = 0; i < body; i++) v[i] = uniform(g);
    for (int64_t i = 0; i < body; i += 16) box_muller16(v + i);
    if (n % 16) {
        float tail[16];
        for (int i = 0; i < 16; i++) tail[i] = uniform(g);
        box_muller16(tail);
        memcpy(v + n - 16, tail, sizeof tail);
    }
    hr_encode_row(dt, v, out, n);
    free(g);
    free(v);
    return HR_OK;
}
