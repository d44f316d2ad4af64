/* CPU kernels for the image ops: conv2d, group_norm, upsample_nearest.
 *
 * conv2d is an implicit GEMM over the GEMM engine (gemm.h), channels last
 * inside: x and the weight are copied to [n, h, w, c] and [o, kh, kw, c]
 * (the weight is 1/pixels of the work), so a window's row of kw pixels is
 * one run of memory and the gathered rows (im2col) are a few memcpy each;
 * output pixels are the rows, the (ky, kx, channel) window is K, the
 * weight is read in place as linear's weight, and the row-major result is
 * transposed into y once. bf16 takes the linear kernels' f32
 * accumulation and rounds once, bias included, as torch's CPU convolution.
 * Windows are gathered a tile of pixels at a time (4 MB); the weight is
 * packed once for the panel kernels (not once per tile); a 1x1
 * stride-1 unpadded convolution reads the channels-last x in place.
 *
 * group_norm: mean and variance of each (sample, group) from f32 vector
 * sums of 1024-element blocks added in double, normalized in f32 and
 * rounded once to x's dtype (torch computes in f32 and rounds once; the
 * sums' order differs, within f32 rounding). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_eltwise.h"
#include "backends/cpu/linear_pack.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "ops/op_impl.h"

/* Gathered window bytes per tile: a few MB, within L2/L3 reach. */
#define IM2COL_TILE_BYTES (4 << 20)

static const hr_attrs_conv2d conv_default = {1, 1, 0, 0, 1, 1, 1};

typedef struct conv_ctx {
    const hr_attrs_conv2d *a;
    const hr_tensor *bias;
    int64_t h, w, c, cg, og, o, kh, kw, ho, wo, k; /* k = kh * kw * cg, the window in (ky, kx, channel) order */
    size_t es;                                     /* the element size of x, the weight and y */
    const char *x;                                 /* sample n of x, channels last: [h, w, c] */
    const char *wt;                                /* the weight channels last: [o, kh, kw, cg] */
    char *col;                                     /* the gathered windows of the tile: [np, k] */
    char *out;                                     /* sample n of y, channels last: [ho * wo, o] */
    const uint32_t *panels;                        /* the weight packed for the panel kernels, or NULL */
    int64_t g, p0, np;                             /* the group and pixels [p0, p0 + np) of the tile */
} conv_ctx;

/* Rows [p0, p0 + np) of the gathered windows: row p holds the window of
 * output pixel p in (ky, kx, channel) order, zeros where it leaves the
 * image. Channels last, a window row's kw pixels are one run of kw * cg
 * elements when dilation is 1 and the group is every channel. */
static void im2col_body(void *arg, int ith, int nth) {
    conv_ctx *c = arg;
    const hr_attrs_conv2d *a = c->a;
    size_t es = c->es;
    int64_t b, e;
    hr_split_range(c->np, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++) {
        int64_t p = c->p0 + r, oy = p / c->wo, ox = p % c->wo;
        char *dst = c->col + r * c->k * (int64_t)es;
        int64_t ix0 = ox * a->stride_w - a->pad_w;
        for (int64_t ky = 0; ky < c->kh; ky++, dst += c->kw * c->cg * (int64_t)es) {
            int64_t iy = oy * a->stride_h - a->pad_h + ky * a->dilation_h;
            if (iy < 0 || iy >= c->h) {
                memset(dst, 0, (size_t)(c->kw * c->cg) * es);
                continue;
            }
            const char *row = c->x + (iy * c->w * c->c + c->g * c->cg) * (int64_t)es;
            if (a->dilation_w == 1 && c->cg == c->c && ix0 >= 0 && ix0 + c->kw <= c->w) {
                memcpy(dst, row + ix0 * c->c * (int64_t)es, (size_t)(c->kw * c->c) * es);
                continue;
            }
            for (int64_t kx = 0; kx < c->kw; kx++) {
                int64_t ix = ix0 + kx * a->dilation_w;
                char *d = dst + kx * c->cg * (int64_t)es;
                if (ix < 0 || ix >= c->w)
                    memset(d, 0, (size_t)c->cg * es);
                else
                    memcpy(d, row + ix * c->c * (int64_t)es, (size_t)c->cg * es);
            }
        }
    }
}

/* out[p0 .. p0 + rows, group g's channels] = a @ w_g^T + bias: the
 * pixels are the rows, the window is K, the channels-last weight [og, k]
 * is read in place as linear's weight, y's tile stored row-major. */
static hr_status conv_gemm(conv_ctx *c, hr_gemm_mat a, int64_t rows, hr_dtype dt) {
    hr_gemm g = {0};
    g.m = rows;
    g.n = c->og;
    g.k = c->k;
    g.a = a;
    g.b = (hr_gemm_mat){.base = (char *)c->wt + c->g * c->og * c->k * (int64_t)c->es, .dt = dt, .rs = 1, .cs = c->k};
    g.b_panels = c->panels; /* one group only */
    g.c = (hr_gemm_mat){.base = c->out + (c->p0 * c->o + c->g * c->og) * (int64_t)c->es, .dt = dt, .rs = c->o, .cs = 1};
    if (c->bias) {
        g.bias = (const char *)hr_tensor_ptr(c->bias) +
                 c->g * c->og * c->bias->strides[0] * (int64_t)hr_dtype_size(c->bias->dtype);
        g.bias_dt = c->bias->dtype;
        g.bias_s = c->bias->strides[0];
    }
    return hr_gemm_run(&g);
}

/* Few output channels (conv_out's 3): the GEMM the other way round, the
 * weight's og rows against the tile's windows as the K-contiguous side
 * (the route for few rows, which streams the windows once), into f32; the
 * bias is added in f32 and each value rounded once into out. */
#define FEW_CHANNELS 16

static hr_status conv_gemm_few(conv_ctx *c, int64_t rows, hr_dtype dt, float *acc) {
    hr_gemm g = {0};
    g.m = c->og;
    g.n = rows;
    g.k = c->k;
    g.a = (hr_gemm_mat){.base = (char *)c->wt + c->g * c->og * c->k * (int64_t)c->es, .dt = dt, .rs = c->k, .cs = 1};
    g.b = (hr_gemm_mat){.base = c->col, .dt = dt, .rs = 1, .cs = c->k};
    g.c = (hr_gemm_mat){.base = (char *)acc, .dt = HR_F32, .rs = rows, .cs = 1};
    HR_TRY(hr_gemm_run(&g));
    bool simd = hr_k_simd();
    for (int64_t o = 0; o < c->og; o++) {
        float *row = acc + o * rows, b = 0;
        int64_t ch = c->g * c->og + o;
        if (c->bias)
            hr_k_load_f32(&b, (const char *)hr_tensor_ptr(c->bias) + ch * c->bias->strides[0] *
                                  (int64_t)hr_dtype_size(c->bias->dtype), c->bias->dtype, 1, 1, false);
        for (int64_t p = 0; p < rows; p++) row[p] += b;
        hr_k_store_f32(c->out + (c->p0 * c->o + ch) * (int64_t)c->es, dt, row, rows, c->o, simd);
    }
    return HR_OK;
}

/* A new contiguous tensor holding t's values with its dims in `perm` order. */
static hr_status permuted_copy(const hr_tensor *t, const int *perm, hr_tensor **out) {
    hr_tensor *v = NULL;
    HR_TRY(hr_tensor_permute(t, t->ndim, perm, &v));
    hr_tensor_meta m;
    hr_meta_of(v, &m);
    hr_status s = hr_tensor_empty_meta(hr_tensor_device(t), &m, out);
    if (s == HR_OK) hr_k_copy_strided(*out, v, true);
    hr_tensor_free(v);
    return s;
}

/* One sample: channels-last x, windows gathered a tile at a time, a GEMM
 * per tile and group into channels-last out. */
static hr_status conv_sample(conv_ctx *c, hr_dtype dt, bool direct, int64_t tile, float *acc) {
    int64_t np = c->ho * c->wo;
    hr_status s = HR_OK;
    for (c->g = 0; s == HR_OK && c->g < c->a->groups; c->g++)
        for (c->p0 = 0; s == HR_OK && c->p0 < np; c->p0 += tile) {
            c->np = np - c->p0 < tile ? np - c->p0 : tile;
            hr_gemm_mat m;
            if (acc) { /* few output channels */
                hr_parallel_run(im2col_body, c, hr_parallel_threads_for(c->np * c->k, HR_GRAIN_ELTWISE));
                s = conv_gemm_few(c, c->np, dt, acc);
                continue;
            }
            if (direct) { /* 1x1, stride 1, unpadded: x's pixel rows are the windows */
                m = (hr_gemm_mat){.base = (char *)c->x + (c->p0 * c->c + c->g * c->cg) * (int64_t)c->es, .dt = dt,
                                  .rs = c->c, .cs = 1};
            } else {
                hr_parallel_run(im2col_body, c, hr_parallel_threads_for(c->np * c->k, HR_GRAIN_ELTWISE));
                m = (hr_gemm_mat){.base = c->col, .dt = dt, .rs = c->k, .cs = 1};
            }
            s = conv_gemm(c, m, c->np, dt);
        }
    return s;
}

static hr_status k_conv2d(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                          int n_out) {
    const hr_tensor *x = in[0], *w = in[1];
    hr_tensor *y = out[0];
    conv_ctx c = {.a = attrs ? attrs : &conv_default, .bias = n_in > 2 ? in[2] : NULL};
    const hr_attrs_conv2d *a = c.a;
    hr_dtype dt = x->dtype;
    c.h = x->shape[2], c.w = x->shape[3], c.c = x->shape[1];
    c.cg = w->shape[1], c.o = w->shape[0], c.og = c.o / a->groups;
    c.kh = w->shape[2], c.kw = w->shape[3], c.ho = y->shape[2], c.wo = y->shape[3];
    c.k = c.kh * c.kw * c.cg;
    c.es = hr_dtype_size(dt);
    if (hr_tensor_numel(y) == 0) return HR_OK;
    if (w->dtype != dt) return hr_error(HR_ERR_DTYPE, "conv2d: weight %s differs from x %s", hr_dtype_name(w->dtype),
                                        hr_dtype_name(dt));
    int64_t np = c.ho * c.wo;
    bool few = c.og <= FEW_CHANNELS;
    bool direct = !few && c.kh == 1 && c.kw == 1 && a->stride_h == 1 && a->stride_w == 1 && a->pad_h == 0 &&
                  a->pad_w == 0;
    int64_t tile = direct ? np : IM2COL_TILE_BYTES / (c.k * (int64_t)c.es);
    if (tile < 16) tile = 16;
    if (tile > np) tile = np;
    hr_tensor *xt = NULL, *wt = NULL, *w2 = NULL, *ot = NULL, *yn = NULL, *ov = NULL, *op = NULL;
    void *packed = NULL; /* owned by wt's buffer once attached */
    hr_status s = permuted_copy(x, (const int[]){0, 2, 3, 1}, &xt); /* [n, h, w, c] */
    if (s == HR_OK) s = permuted_copy(w, (const int[]){0, 2, 3, 1}, &wt); /* [o, kh, kw, cg] */
    if (s == HR_OK) s = hr_tensor_empty_meta(hr_tensor_device(y),
                                             &(hr_tensor_meta){.dtype = dt, .ndim = 2, .shape = {np, c.o}}, &ot);
    float *acc = NULL;
    if (s == HR_OK && few && !(acc = malloc((size_t)(tile * c.og) * sizeof *acc)))
        s = hr_error(HR_ERR_OOM, "conv2d: %lld bytes of f32 sums", (long long)(tile * c.og * 4));
    if (s == HR_OK && !direct && !(c.col = malloc((size_t)(tile * c.k) * c.es)))
        s = hr_error(HR_ERR_OOM, "conv2d: %lld bytes for the gathered windows", (long long)(tile * c.k * (int64_t)c.es));
    if (s == HR_OK && a->groups == 1 && !few) { /* packed once, not once per tile of pixels */
        s = hr_tensor_view(wt, 2, (int64_t[]){c.o, c.k}, &w2);
        size_t bytes = s == HR_OK ? hr_linear_pack_bytes(w2) : 0;
        if (bytes && (packed = aligned_alloc(64, bytes))) {
            s = hr_linear_pack_into(w2, packed, free, packed, NULL, NULL);
            if (s == HR_OK) c.panels = hr_linear_panels(w2);
            else free(packed); /* the buffer took no ownership */
        }
    }
    if (s == HR_OK) {
        c.wt = hr_tensor_ptr(wt);
        c.out = hr_tensor_ptr(ot);
        s = hr_tensor_view(ot, 3, (int64_t[]){c.ho, c.wo, c.o}, &ov);
    }
    if (s == HR_OK) s = hr_tensor_permute(ov, 3, (const int[]){2, 0, 1}, &op); /* out as [o, ho, wo] */
    for (int64_t n = 0; s == HR_OK && n < x->shape[0]; n++) {
        c.x = (const char *)hr_tensor_ptr(xt) + n * c.h * c.w * c.c * (int64_t)c.es;
        s = conv_sample(&c, dt, direct, tile, acc);
        if (s == HR_OK) s = hr_tensor_select(y, 0, n, &yn);
        if (s == HR_OK) hr_k_copy_strided(yn, op, true); /* channels last -> y's layout */
        hr_tensor_free(yn);
        yn = NULL;
    }
    free(c.col);
    free(acc);
    hr_tensor_free(xt);
    hr_tensor_free(wt);
    hr_tensor_free(ot);
    hr_tensor_free(w2);
    hr_tensor_free(ov);
    hr_tensor_free(op);
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

typedef float gn_v8f __attribute__((vector_size(32)));

/* sum of p[0 .. n) (or of (p[i] - m)^2 when sq): f32 vector lanes over
 * blocks of 1024, the blocks summed in double, so the error stays that of
 * a 1024-element f32 sum whatever n is. */
static double block_sums(const float *p, int64_t n, bool sq, float m) {
    double total = 0;
    for (int64_t b0 = 0; b0 < n; b0 += 1024) {
        int64_t b1 = b0 + 1024 < n ? b0 + 1024 : n, i = b0;
        gn_v8f acc[4] = {{0}}, mv = {m, m, m, m, m, m, m, m};
        for (; i + 32 <= b1; i += 32)
            for (int k = 0; k < 4; k++) {
                gn_v8f v;
                memcpy(&v, p + i + 8 * k, sizeof v);
                if (sq) {
                    v = v - mv;
                    v = v * v;
                }
                acc[k] += v;
            }
        gn_v8f a = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        float part = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (; i < b1; i++) part += sq ? (p[i] - m) * (p[i] - m) : p[i];
        total += part;
    }
    return total;
}

static void gn_body(void *arg, int ith, int nth) {
    gn_ctx *c = arg;
    int64_t units = c->x->shape[0] * c->groups, b, e;
    hr_split_range(units, ith, nth, &b, &e);
    float *buf = c->bufs + (int64_t)ith * c->cg * c->hw;
    const hr_tensor *y = c->y;
    for (int64_t u = b; u < e; u++) {
        int64_t n = u / c->groups, g = u % c->groups;
        for (int64_t ci = 0; ci < c->cg; ci++) channel_load(c->x, n, g * c->cg + ci, c->hw, buf + ci * c->hw, c->simd);
        int64_t cnt = c->cg * c->hw;
        double mean = block_sums(buf, cnt, false, 0) / (double)cnt;
        float m = (float)mean; /* the deviations from the f32 mean, as torch's two-pass variance */
        double var = block_sums(buf, cnt, true, m) / (double)cnt;
        float rstd = (float)(1.0 / sqrt(var + c->eps));
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

/* Input rows (n, c, iy) split over threads; each writes its output row
 * oy = iy * s with every element repeated s times, then the s - 1 rows
 * below it as copies of that one. */
static void up_body(void *arg, int ith, int nth) {
    up_ctx *c = arg;
    const hr_tensor *x = c->x, *y = c->y;
    size_t es = hr_dtype_size(x->dtype);
    int64_t hi = x->shape[2], wo = y->shape[3], rows = x->shape[0] * x->shape[1] * hi, b, e;
    bool dense = x->strides[3] == 1 && y->strides[3] == 1;
    hr_split_range(rows, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++) {
        int64_t iy = r % hi, nc = r / hi, ch = nc % x->shape[1], n = nc / x->shape[1];
        const char *src = (const char *)hr_tensor_ptr(x) + (n * x->strides[0] + ch * x->strides[1] + iy * x->strides[2]) * (int64_t)es;
        char *dst = (char *)hr_tensor_ptr(y) +
                    (n * y->strides[0] + ch * y->strides[1] + iy * c->s * y->strides[2]) * (int64_t)es;
        if (dense && es == 2 && c->s == 2) { /* the VAE's case */
            const uint16_t *s16 = (const uint16_t *)src;
            uint32_t *d32 = (uint32_t *)dst; /* each pair of output pixels is one input pixel twice */
            for (int64_t ix = 0; ix < wo / 2; ix++) {
                uint32_t v = s16[ix];
                d32[ix] = v | v << 16;
            }
        } else if (dense && es == 2) {
            const uint16_t *s16 = (const uint16_t *)src;
            uint16_t *d16 = (uint16_t *)dst;
            for (int64_t ox = 0; ox < wo; ox++) d16[ox] = s16[ox / c->s];
        } else if (dense && es == 4) {
            const uint32_t *s32 = (const uint32_t *)src;
            uint32_t *d32 = (uint32_t *)dst;
            for (int64_t ox = 0; ox < wo; ox++) d32[ox] = s32[ox / c->s];
        } else {
            for (int64_t ox = 0; ox < wo; ox++)
                memcpy(dst + ox * y->strides[3] * (int64_t)es, src + (ox / c->s) * x->strides[3] * (int64_t)es, es);
        }
        for (int64_t k = 1; k < c->s; k++) {
            char *rowk = dst + k * y->strides[2] * (int64_t)es;
            if (dense)
                memcpy(rowk, dst, (size_t)wo * es);
            else
                for (int64_t ox = 0; ox < wo; ox++)
                    memcpy(rowk + ox * y->strides[3] * (int64_t)es, dst + ox * y->strides[3] * (int64_t)es, es);
        }
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
