/* Weights in the Hub's FP8 form (quantization_config "fp8" or
 * "compressed-tensors" float-quantized, config_quant.c): NAME [R, C]
 * F8_E4M3 codes and a scale per block of block[0] rows x block[1] columns
 * beside it (NAME's "weight" replaced by weight_scale_inv or weight_scale:
 * [ceil(R / b0), ceil(C / b1)], a scalar per tensor, [R, 1] per channel).
 * Loaded as FP8 blocks (an f32 scale and 32 codes, hr_dtype FP8) that the
 * CPU's linear reads (k_linear_fp8.c), where the columns divide into
 * blocks of 32 that share a scale; else dequantized into the model dtype.
 * A value is code x scale in f32, one product, as transformers'
 * Fp8Dequantize computes it. A tensor-parallel rank reads its slice of
 * the codes (rows or columns) and takes each element's scale by its place
 * in the whole weight. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dequant.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor_impl.h"
#include "core/threadpool.h"
#include "io/st_internal.h"
#include "models/model_impl.h"

/* NAME with its last "weight" replaced by `suffix` (q_proj.weight ->
 * q_proj.weight_scale_inv); `suffix` appended after a '.' otherwise. */
static void sibling(const char *name, const char *suffix, char *buf, size_t n) {
    size_t len = strlen(name);
    if (len >= 6 && !strcmp(name + len - 6, "weight")) snprintf(buf, n, "%.*s%s", (int)(len - 6), name, suffix);
    else snprintf(buf, n, "%s.%s", name, suffix);
}

bool hr_fp8_held(const hr_model *m, const char *name) {
    return m->cfg.quant.method == HR_QUANT_FP8 && hr_checkpoint_stored_dtype(m->ckpt, name) == HR_F8_E4M3;
}

/* The scale grid of a [rows, cols] weight: blocks of bn x bk, sr x sc of them. */
typedef struct grid {
    int64_t bn, bk, sr, sc;
} grid;

static grid grid_of(const hr_model *m, int64_t rows, int64_t cols) {
    const int64_t *b = m->cfg.quant.block;
    grid g = {.bn = b[0] ? b[0] : rows, .bk = b[1] ? b[1] : cols};
    if (g.bn < 1) g.bn = 1;
    if (g.bk < 1) g.bk = 1;
    g.sr = (rows + g.bn - 1) / g.bn;
    g.sc = (cols + g.bk - 1) / g.bk;
    return g;
}

/* A scale tensor holds the grid when its dims, leading 1s aside, are
 * [sr, sc] (sc of 1 may be left out: [R] per channel, [] or [1] per tensor). */
static bool grid_shape(const hr_tensor_info *info, grid g) {
    int64_t d[HR_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < info->ndim; i++)
        if (n || info->shape[i] != 1 || i >= info->ndim - 2) d[n++] = info->shape[i];
    if (n == 2) return d[0] == g.sr && d[1] == g.sc;
    if (n == 1) return g.sc == 1 && d[0] == g.sr;
    return n == 0 && g.sr == 1 && g.sc == 1;
}

static const char *activation_scale(const hr_model *m, const char *name, char *buf, size_t n) {
    static const char *const names[] = {"input_scale", "activation_scale"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        sibling(name, names[i], buf, n);
        if (hr_checkpoint_has(m->ckpt, buf)) return buf;
    }
    return NULL;
}

hr_status hr_fp8_check(const hr_model *m, const char *name, int64_t rows, int64_t cols) {
    const hr_quant_config *q = &m->cfg.quant;
    char sn[320], a[160], b[160];
    sibling(name, q->scale_suffix, sn, sizeof sn);
    hr_tensor_info info;
    if (!hr_checkpoint_has(m->ckpt, sn))
        return hr_error(HR_ERR_NOT_FOUND, "checkpoint: FP8 weight '%s' has no scale tensor '%s' (quantization_config "
                        "%s)", name, sn, q->label);
    HR_TRY(hr_checkpoint_info(m->ckpt, sn, &info));
    grid g = grid_of(m, rows, cols);
    if (!hr_dtype_is_float(info.dtype) || info.dtype == HR_F64 || !grid_shape(&info, g))
        return hr_error(HR_ERR_SHAPE, "checkpoint: FP8 scale tensor '%s' is %s %s, expected f32, bf16 or f16 %s: "
                        "blocks of %lld x %lld of the %lld x %lld weight (quantization_config %s)", sn,
                        hr_shape_str(info.ndim, info.shape, a, sizeof a), hr_dtype_name(info.dtype),
                        hr_shape_str(2, (int64_t[]){g.sr, g.sc}, b, sizeof b), (long long)g.bn, (long long)g.bk,
                        (long long)rows, (long long)cols, q->label);
    if (!q->static_act) return HR_OK;
    const char *an = activation_scale(m, name, sn, sizeof sn);
    if (!an)
        return hr_error(HR_ERR_NOT_FOUND, "checkpoint: FP8 weight '%s' has no input_scale (static activations, "
                        "quantization_config %s)", name, q->label);
    HR_TRY(hr_checkpoint_info(m->ckpt, an, &info));
    int64_t numel = 1;
    for (int i = 0; i < info.ndim; i++) numel *= info.shape[i];
    if (numel != 1 || !hr_dtype_is_float(info.dtype))
        return hr_error(HR_ERR_SHAPE, "checkpoint: FP8 activation scale '%s' is %s %s, expected one float", an,
                        hr_shape_str(info.ndim, info.shape, a, sizeof a), hr_dtype_name(info.dtype));
    return HR_OK;
}

/* A tensor of scales as f32, each in [0, 1e36]: the kernels multiply a
 * scale by 256 (fp8_dot.h), which stays finite. */
static hr_status read_scales(const hr_model *m, const char *name, hr_tensor **out) {
    HR_TRY(hr_checkpoint_tensor_as(m->ckpt, name, HR_F32, out));
    const float *s = hr_tensor_ptr(*out);
    int64_t n = hr_tensor_numel(*out);
    for (int64_t i = 0; i < n; i++)
        if (!(s[i] >= 0.0f && s[i] <= 1e36f)) {
            hr_tensor_free(*out);
            *out = NULL;
            return hr_error(HR_ERR_FORMAT, "checkpoint: FP8 scale tensor '%s' holds %g at element %lld; scales must "
                            "be in [0, 1e36]", name, (double)s[i], (long long)i);
        }
    return HR_OK;
}

typedef struct fp8_job {
    const uint8_t *codes; /* [rows][cols]: the part held, at (r0, c0) of the weight */
    const float *scales;
    int64_t rows, cols, r0, c0;
    grid g;
    bool blocks;
    hr_dtype dt;
    char *out;
    float *rowbuf; /* [nth][cols] f32, dequantizing */
    int64_t bad_row; /* the first row holding a NaN code, or rows */
} fp8_job;

static void fp8_rows(void *arg, int ith, int nth) {
    fp8_job *j = arg;
    int64_t b, e;
    hr_split_range(j->rows, ith, nth, &b, &e);
    size_t ob = j->blocks ? hr_dtype_nbytes(HR_FP8, j->cols) : (size_t)j->cols * hr_dtype_size(j->dt);
    float *v = j->rowbuf + (size_t)ith * (size_t)j->cols;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *c = j->codes + (size_t)r * (size_t)j->cols;
        const float *s = j->scales + ((r + j->r0) / j->g.bn) * j->g.sc;
        uint8_t *o = (uint8_t *)j->out + (size_t)r * ob;
        bool nan = false;
        for (int64_t i = 0; i < j->cols; i++) nan |= (c[i] & 0x7f) == 0x7f;
        if (nan) {
            /* the SIMD kernels read codes as halves, where NaN has no code */
            int64_t seen = __atomic_load_n(&j->bad_row, __ATOMIC_RELAXED);
            while (r < seen && !__atomic_compare_exchange_n(&j->bad_row, &seen, r, false, __ATOMIC_RELAXED,
                                                            __ATOMIC_RELAXED)) {
            }
            continue;
        }
        if (j->blocks) {
            for (int64_t k = 0; k < j->cols; k += 32, o += 36) {
                memcpy(o, &s[(k + j->c0) / j->g.bk], 4);
                memcpy(o + 4, c + k, 32);
            }
            continue;
        }
        for (int64_t i = 0; i < j->cols; i++) v[i] = hr_e4m3_to_f32(c[i]) * s[(i + j->c0) / j->g.bk];
        hr_encode_row(j->dt, v, o, j->cols);
    }
}

/* The static activation scale, read to check it: the CPU does not apply it. */
static hr_status check_activation_scale(const hr_model *m, const char *name) {
    char an[320];
    if (!m->cfg.quant.static_act || !activation_scale(m, name, an, sizeof an)) return HR_OK;
    hr_tensor *t = NULL;
    HR_TRY(read_scales(m, an, &t));
    bool zero = *(const float *)hr_tensor_ptr(t) == 0.0f;
    hr_tensor_free(t);
    if (zero) return hr_error(HR_ERR_FORMAT, "checkpoint: FP8 activation scale '%s' is 0", an);
    return HR_OK;
}

hr_status hr_fp8_load(hr_model *m, const char *name, int64_t rows, int64_t cols, bool blocks, hr_tensor **out) {
    return hr_fp8_load_part(m, name, rows, cols, -1, 0, 0, blocks, out);
}

hr_status hr_fp8_load_part(hr_model *m, const char *name, int64_t rows, int64_t cols, int axis, int64_t first,
                           int64_t len, bool blocks, hr_tensor **out) {
    *out = NULL;
    char sn[320];
    sibling(name, m->cfg.quant.scale_suffix, sn, sizeof sn);
    if (axis >= 0) {
        /* a rank's dims are its own: the scales' grid is the whole weight's */
        hr_tensor_info info;
        HR_TRY(hr_checkpoint_info(m->ckpt, name, &info));
        if (info.ndim != 2) return hr_error(HR_ERR_SHAPE, "checkpoint: FP8 weight '%s' is not a matrix", name);
        rows = info.shape[0];
        cols = info.shape[1];
    }
    grid g = grid_of(m, rows, cols);
    fp8_job j = {.rows = axis == 0 ? len : rows, .cols = axis == 1 ? len : cols, .r0 = axis == 0 ? first : 0,
                 .c0 = axis == 1 ? first : 0, .g = g, .dt = m->dtype};
    j.bad_row = j.rows;
    /* a block of 32 columns takes one scale */
    j.blocks = blocks && j.cols % 32 == 0 && j.c0 % 32 == 0 && g.bk % 32 == 0;
    hr_tensor *codes = NULL, *scales = NULL, *t = NULL;
    int nth = hr_parallel_threads_for(j.rows * j.cols, HR_GRAIN_ELTWISE);
    hr_status s = check_activation_scale(m, name);
    if (s == HR_OK)
        s = axis < 0 ? hr_checkpoint_tensor_as(m->ckpt, name, HR_F8_E4M3, &codes)
                     : hr_checkpoint_rows(m->ckpt, name, axis, first, len, &codes);
    if (s == HR_OK) s = read_scales(m, sn, &scales);
    if (s == HR_OK)
        s = hr_tensor_empty(hr_device_cpu(), j.blocks ? HR_FP8 : m->dtype, 2, (int64_t[]){j.rows, j.cols}, &t);
    if (s == HR_OK && !j.blocks && !(j.rowbuf = malloc(sizeof(float) * (size_t)(j.cols ? j.cols : 1) * (size_t)nth)))
        s = hr_error(HR_ERR_OOM, "out of memory");
    if (s == HR_OK && j.rows * j.cols > 0) {
        j.codes = hr_tensor_ptr(codes);
        j.scales = hr_tensor_ptr(scales);
        j.out = hr_tensor_ptr(t);
        hr_parallel_run(fp8_rows, &j, nth);
        if (j.bad_row < j.rows)
            s = hr_error(HR_ERR_FORMAT, "checkpoint: FP8 weight '%s' holds a NaN code (0x7f or 0xff) in row %lld", name,
                         (long long)(j.bad_row + j.r0));
    }
    free(j.rowbuf);
    hr_tensor_free(codes);
    hr_tensor_free(scales);
    hr_checkpoint_drop_tensor(m->ckpt, name);
    hr_checkpoint_drop_tensor(m->ckpt, sn);
    if (s != HR_OK) {
        hr_tensor_free(t);
        return hr_error_context(s, "loading FP8 '%s'", name);
    }
    hr_tensor_set_name(t, name);
    *out = t;
    return HR_OK;
}
