/* CPU kernels for the image ops: conv2d, group_norm, upsample_nearest.
 *
 * conv2d is an implicit GEMM over the GEMM engine (gemm.h): output pixels
 * are rows, the (channel, ky, kx) window is K, the weight [o, K] is read in
 * place as linear's weight is, so bf16 takes the same f32-accumulating
 * kernels and rounds once, bias included, as torch's CPU convolution.
 * The windows are gathered (im2col) a tile of pixels at a time, so the
 * gathered copy stays a few MB whatever the image size; a 1x1 stride-1
 * unpadded convolution reads x in place.
 *
 * group_norm: mean and variance of each (sample, group) summed in double,
 * normalized in f32 and rounded once to x's dtype (torch computes in f32
 * and rounds once; the sums' order differs, within f32 rounding). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_eltwise.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "ops/op_impl.h"

/* Gathered window bytes per tile: a few MB, within L2/L3 reach. */
#define IM2COL_TILE_BYTES (4 << 20)

static const hr_attrs_conv2d conv_default = {1, 1, 0, 0, 1, 1, 1};

typedef struct conv_ctx {
    const hr_tensor *x, *w, *bias;
    hr_tensor *y;
    const hr_attrs_conv2d *a;
    int64_t cg, og, kh, kw, ho, wo, k; /* k = cg * kh * kw */
    size_t es;                         /* x's element size */
    /* the tile being gathered: sample n, group g, pixels [p0, p0 + np) */
    char *col;
    int64_t n, g, p0, np;
} conv_ctx;

/* Rows [p0, p0 + np) of the gathered windows: row p holds x's window of
 * output pixel p, in the weight's (channel, ky, kx) order, zeros where the
 * window leaves the image. */
static void im2col_body(void *arg, int ith, int nth) {
    conv_ctx *c = arg;
    const hr_tensor *x = c->x;
    const int64_t *xs = x->strides;
    const char *base = (const char *)hr_tensor_ptr(x) + (c->n * xs[0] + c->g * c->cg * xs[1]) * (int64_t)c->es;
    int64_t h = x->shape[2], w = x->shape[3], b, e;
    hr_split_range(c->np, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++) {
        int64_t p = c->p0 + r, oy = p / c->wo, ox = p % c->wo;
        char *dst = c->col + r * c->k * (int64_t)c->es;
        for (int64_t ci = 0; ci < c->cg; ci++)
            for (int64_t ky = 0; ky < c->kh; ky++, dst += c->kw * (int64_t)c->es) {
                int64_t iy = oy * c->a->stride_h - c->a->pad_h + ky * c->a->dilation_h;
                if (iy < 0 || iy >= h) {
                    memset(dst, 0, (size_t)c->kw * c->es);
                    continue;
                }
                const char *src = base + (ci * xs[1] + iy * xs[2]) * (int64_t)c->es;
                int64_t ix0 = ox * c->a->stride_w - c->a->pad_w, dw = c->a->dilation_w;
                if (dw == 1 && xs[3] == 1 && ix0 >= 0 && ix0 + c->kw <= w) { /* the whole run inside the row */
                    memcpy(dst, src + ix0 * (int64_t)c->es, (size_t)c->kw * c->es);
                    continue;
                }
                for (int64_t kx = 0; kx < c->kw; kx++) {
                    int64_t ix = ix0 + kx * dw;
                    if (ix < 0 || ix >= w)
                        memset(dst + kx * (int64_t)c->es, 0, c->es);
                    else
                        memcpy(dst + kx * (int64_t)c->es, src + ix * xs[3] * (int64_t)c->es, c->es);
                }
            }
    }
}

/* y[n, g's channels, pixels p0 .. p0 + rows) = a @ w_g^T + bias, a's row r
 * being pixel p0 + r at a.base + r * a.rs. */
static hr_status conv_gemm(conv_ctx *c, hr_gemm_mat a, int64_t rows) {
    const hr_tensor *w = c->w, *y = c->y;
    hr_gemm g = {0};
    g.m = rows;
    g.n = c->og;
    g.k = c->k;
    g.a = a;
    g.b = (hr_gemm_mat){.base = (char *)hr_tensor_ptr(w) + c->g * c->og * w->strides[0] * (int64_t)hr_dtype_size(w->dtype),
                        .dt = w->dtype, .rs = 1, .cs = w->strides[0]};
    /* pixel p of channel o sits at (p / wo) * s2 + (p % wo) * s3: one stride
     * when the rows of y's image are s2 = wo * s3 apart (checked by the caller) */
    g.c = (hr_gemm_mat){.base = (char *)hr_tensor_ptr(y) +
                                (c->n * y->strides[0] + c->g * c->og * y->strides[1] + c->p0 * y->strides[3]) *
                                    (int64_t)hr_dtype_size(y->dtype),
                        .dt = y->dtype, .rs = y->strides[3], .cs = y->strides[1]};
    if (c->bias) {
        g.bias = (const char *)hr_tensor_ptr(c->bias) +
                 c->g * c->og * c->bias->strides[0] * (int64_t)hr_dtype_size(c->bias->dtype);
        g.bias_dt = c->bias->dtype;
        g.bias_s = c->bias->strides[0];
    }
    return hr_gemm_run(&g);
}

/* Whether the weight's (channel, ky, kx) elements are one stride-1 run per
 * output channel, as the GEMM reads them. */
static bool weight_rows_dense(const hr_tensor *w) {
    return w->strides[3] == 1 && w->strides[2] == w->shape[3] && w->strides[1] == w->shape[2] * w->shape[3];
}

static hr_status conv_run(conv_ctx *c) {
    const hr_tensor *x = c->x;
    int64_t np = c->ho * c->wo;
    const hr_attrs_conv2d *a = c->a;
    bool direct = c->kh == 1 && c->kw == 1 && a->stride_h == 1 && a->stride_w == 1 && a->pad_h == 0 &&
                  a->pad_w == 0 && x->strides[2] == x->shape[3] * x->strides[3];
    int64_t tile = direct ? np : IM2COL_TILE_BYTES / (c->k * (int64_t)c->es);
    if (tile < 16) tile = 16;
    if (tile > np) tile = np;
    if (!direct) {
        c->col = malloc((size_t)(tile * c->k) * c->es);
        if (!c->col) return hr_error(HR_ERR_OOM, "conv2d: %lld bytes for the gathered windows",
                                     (long long)(tile * c->k * (int64_t)c->es));
    }
    hr_status s = HR_OK;
    for (c->n = 0; s == HR_OK && c->n < x->shape[0]; c->n++)
        for (c->g = 0; s == HR_OK && c->g < a->groups; c->g++)
            for (c->p0 = 0; s == HR_OK && c->p0 < np; c->p0 += tile) {
                c->np = np - c->p0 < tile ? np - c->p0 : tile;
                hr_gemm_mat m;
                if (direct) { /* x[n, group channels] is [cg, pixels]: row p, column ci at p * s3 + ci * s1 */
                    m = (hr_gemm_mat){.base = (char *)hr_tensor_ptr(x) +
                                              (c->n * x->strides[0] + c->g * c->cg * x->strides[1]) * (int64_t)c->es,
                                      .dt = x->dtype, .rs = x->strides[3], .cs = x->strides[1]};
                } else {
                    hr_parallel_run(im2col_body, c, hr_parallel_threads_for(c->np * c->k, HR_GRAIN_ELTWISE));
                    m = (hr_gemm_mat){.base = c->col, .dt = x->dtype, .rs = c->k, .cs = 1};
                }
                s = conv_gemm(c, m, c->np);
            }
    free(c->col);
    c->col = NULL;
    return s;
}

static hr_status k_conv2d(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                          int n_out) {
    const hr_tensor *w = in[1];
    hr_tensor *y = out[0];
    conv_ctx c = {.x = in[0], .w = w, .bias = n_in > 2 ? in[2] : NULL, .a = attrs ? attrs : &conv_default};
    c.cg = w->shape[1];
    c.og = w->shape[0] / c.a->groups;
    c.kh = w->shape[2];
    c.kw = w->shape[3];
    c.ho = y->shape[2];
    c.wo = y->shape[3];
    c.k = c.cg * c.kh * c.kw;
    c.es = hr_dtype_size(c.x->dtype);
    if (hr_tensor_numel(y) == 0) return HR_OK;
    if (c.k == 0) return hr_error(HR_ERR_SHAPE, "conv2d: empty kernel window");
    /* Operands the GEMM cannot read in place go through dense copies. */
    hr_tensor *wd = NULL, *yd = NULL;
    hr_status s = HR_OK;
    if (!weight_rows_dense(w)) {
        hr_tensor_meta m;
        hr_meta_of(w, &m);
        s = hr_tensor_empty_meta(hr_tensor_device(w), &m, &wd);
        if (s == HR_OK) hr_k_copy_strided(wd, w, true);
        c.w = wd;
    }
    if (s == HR_OK && y->strides[2] != c.wo * y->strides[3]) {
        hr_tensor_meta m;
        hr_meta_of(y, &m);
        s = hr_tensor_empty_meta(hr_tensor_device(y), &m, &yd);
        c.y = yd;
    } else {
        c.y = y;
    }
    if (s == HR_OK) s = conv_run(&c);
    if (s == HR_OK && yd) hr_k_copy_strided(y, yd, true);
    hr_tensor_free(wd);
    hr_tensor_free(yd);
    return s;
}

/* ---- group_norm -------------------------------------------------------------- */

typedef struct gn_ctx {
    const hr_tensor *x, *w, *b;
    hr_tensor *y;
    int64_t groups, cg, hw; /* hw: elements per channel */
    double eps;
    bool simd;
    float *bufs; /* one group's f32 copy per task */
} gn_ctx;

/* One channel's elements of sample n as f32, any strides over the trailing
 * dims (walked through a contiguous index). */
static void channel_load(const hr_tensor *t, int64_t n, int64_t ch, int64_t hw, float *dst, bool simd) {
    const char *base = (const char *)hr_tensor_ptr(t) +
                       (n * t->strides[0] + ch * t->strides[1]) * (int64_t)hr_dtype_size(t->dtype);
    int nd = t->ndim;
    int64_t expect = 1; /* the trailing dims are dense when each stride is the product of the later sizes */
    bool dense = true;
    for (int d = nd - 1; d >= 2 && dense; d--) {
        dense = t->strides[d] == expect || t->shape[d] == 1;
        expect *= t->shape[d];
    }
    if (dense) {
        hr_k_load_f32(dst, base, t->dtype, hw, 1, simd);
        return;
    }
    for (int64_t i = 0; i < hw; i++) {
        int64_t rem = i, off = 0;
        for (int d = nd - 1; d >= 2; d--) {
            off += (rem % t->shape[d]) * t->strides[d];
            rem /= t->shape[d];
        }
        hr_k_load_f32(dst + i, base + off * (int64_t)hr_dtype_size(t->dtype), t->dtype, 1, 1, false);
    }
}

static float param_at(const hr_tensor *t, int64_t i, float none) {
    if (!t) return none;
    float v;
    hr_k_load_f32(&v, (const char *)hr_tensor_ptr(t) + i * t->strides[0] * (int64_t)hr_dtype_size(t->dtype),
                  t->dtype, 1, 1, false);
    return v;
}

static void gn_body(void *arg, int ith, int nth) {
    gn_ctx *c = arg;
    int64_t units = c->x->shape[0] * c->groups, b, e;
    hr_split_range(units, ith, nth, &b, &e);
    float *buf = c->bufs + (int64_t)ith * c->cg * c->hw;
    const hr_tensor *y = c->y;
    for (int64_t u = b; u < e; u++) {
        int64_t n = u / c->groups, g = u % c->groups;
        double sum = 0, sq = 0;
        for (int64_t ci = 0; ci < c->cg; ci++) {
            float *row = buf + ci * c->hw;
            channel_load(c->x, n, g * c->cg + ci, c->hw, row, c->simd);
            for (int64_t i = 0; i < c->hw; i++) sum += row[i];
        }
        int64_t cnt = c->cg * c->hw;
        double mean = sum / (double)cnt;
        for (int64_t i = 0; i < cnt; i++) {
            double d = buf[i] - mean;
            sq += d * d;
        }
        float rstd = (float)(1.0 / sqrt(sq / (double)cnt + c->eps)), m = (float)mean;
        for (int64_t ci = 0; ci < c->cg; ci++) {
            int64_t ch = g * c->cg + ci;
            float wv = param_at(c->w, ch, 1.0f), bv = param_at(c->b, ch, 0.0f);
            /* torch folds the affine into one scale and shift per channel */
            float scale = rstd * wv, shift = bv - m * scale;
            float *row = buf + ci * c->hw;
            for (int64_t i = 0; i < c->hw; i++) row[i] = row[i] * scale + shift;
            char *dst = (char *)hr_tensor_ptr(y) + (n * y->strides[0] + ch * y->strides[1]) * (int64_t)hr_dtype_size(y->dtype);
            hr_k_store_f32(dst, y->dtype, row, c->hw, 1, c->simd); /* y is dense: k_group_norm sees to it */
        }
    }
}

static hr_status k_group_norm(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                              int n_out) {
    const hr_attrs_group_norm *a = attrs;
    hr_tensor *y = out[0];
    gn_ctx c = {.x = in[0], .w = n_in > 1 ? in[1] : NULL, .b = n_in > 2 ? in[2] : NULL, .groups = a->groups,
                .eps = a->eps, .simd = hr_k_simd()};
    c.cg = c.x->shape[1] / c.groups;
    int64_t nc = c.x->shape[0] * c.x->shape[1];
    c.hw = nc ? hr_tensor_numel(c.x) / nc : 0;
    if (hr_tensor_numel(y) == 0) return HR_OK;
    hr_tensor *yd = NULL;
    if (!hr_tensor_is_contiguous(y)) {
        hr_tensor_meta m;
        hr_meta_of(y, &m);
        HR_TRY(hr_tensor_empty_meta(hr_tensor_device(y), &m, &yd));
    }
    c.y = yd ? yd : y;
    int64_t units = c.x->shape[0] * c.groups;
    int nth = hr_parallel_threads_for(units * c.cg * c.hw, HR_GRAIN_ROWS);
    if (nth > units) nth = (int)units;
    c.bufs = malloc((size_t)nth * (size_t)(c.cg * c.hw) * sizeof(float));
    if (!c.bufs) {
        hr_tensor_free(yd);
        return hr_error(HR_ERR_OOM, "group_norm: %lld bytes for %d groups' f32 copies",
                        (long long)(nth * c.cg * c.hw * 4), nth);
    }
    hr_parallel_run(gn_body, &c, nth);
    free(c.bufs);
    if (yd) hr_k_copy_strided(y, yd, true);
    hr_tensor_free(yd);
    return HR_OK;
}

/* ---- upsample_nearest ----------------------------------------------------------- */

typedef struct up_ctx {
    const hr_tensor *x;
    hr_tensor *y;
    int64_t s;
} up_ctx;

/* Output rows (n, c, oy) split over threads; each copies input row oy / s
 * with every element repeated s times. */
static void up_body(void *arg, int ith, int nth) {
    up_ctx *c = arg;
    const hr_tensor *x = c->x, *y = c->y;
    size_t es = hr_dtype_size(x->dtype);
    int64_t ho = y->shape[2], wo = y->shape[3], rows = y->shape[0] * y->shape[1] * ho, b, e;
    hr_split_range(rows, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++) {
        int64_t oy = r % ho, nc = r / ho, ch = nc % y->shape[1], n = nc / y->shape[1];
        const char *src = (const char *)hr_tensor_ptr(x) +
                          (n * x->strides[0] + ch * x->strides[1] + (oy / c->s) * x->strides[2]) * (int64_t)es;
        char *dst = (char *)hr_tensor_ptr(y) + (n * y->strides[0] + ch * y->strides[1] + oy * y->strides[2]) * (int64_t)es;
        for (int64_t ox = 0; ox < wo; ox++)
            memcpy(dst + ox * y->strides[3] * (int64_t)es, src + (ox / c->s) * x->strides[3] * (int64_t)es, es);
    }
}

static hr_status k_upsample_nearest(const void *attrs, const hr_tensor *const *in, int n_in,
                                    hr_tensor *const *out, int n_out) {
    const hr_attrs_upsample *a = attrs;
    up_ctx c = {.x = in[0], .y = out[0], .s = a->scale};
    int64_t n = hr_tensor_numel(c.y);
    if (n == 0) return HR_OK;
    hr_parallel_run(up_body, &c, hr_parallel_threads_for(n, HR_GRAIN_ELTWISE));
    return HR_OK;
}

void hr_cpu_register_image(hr_cpu_kernel_fn *table) {
    table[HR_OP_conv2d] = k_conv2d;
    table[HR_OP_group_norm] = k_group_norm;
    table[HR_OP_upsample_nearest] = k_upsample_nearest;
}
