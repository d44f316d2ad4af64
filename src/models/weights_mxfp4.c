/* Experts weights in the Hub's MXFP4 form (gpt-oss releases,
 * quantization_config.quant_method "mxfp4"): NAME_blocks [E, R, C / 32, 16]
 * bytes of e2m1 codes, two per byte (element 2i the low nibble, 2i + 1 the
 * high), and NAME_scales [E, R, C / 32] e8m0 exponents, for a matrix of
 * rows R and columns C that is the experts op's own layout ([E, 2I, H]
 * with gate and up rows interleaved, [E, H, I]). Dequantized at load into
 * the model dtype as transformers' convert_moe_packed_tensors does
 * (e2m1 value times 2^(scale - 127): exact in f32 and bf16), the gate/up
 * rows put in the op's order (gate rows, then up rows). */
#include <stdio.h>
#include <string.h>

#include "core/dequant.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor_impl.h"
#include "core/threadpool.h"
#include "io/st_internal.h"
#include "models/model_impl.h"

static void part(const char *name, const char *suffix, char *buf, size_t n) { snprintf(buf, n, "%s_%s", name, suffix); }

bool hr_mxfp4_held(const hr_model *m, const char *name) {
    char b[300], s[300];
    part(name, "blocks", b, sizeof b);
    part(name, "scales", s, sizeof s);
    return !hr_checkpoint_has(m->ckpt, name) && hr_checkpoint_has(m->ckpt, b) && hr_checkpoint_has(m->ckpt, s);
}

static hr_status check_part(const hr_model *m, const char *name, int nd, const int64_t *want) {
    hr_tensor_info info;
    HR_TRY(hr_checkpoint_info(m->ckpt, name, &info));
    bool ok = info.dtype == HR_U8 && info.ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = info.shape[i] == want[i];
    if (ok) return HR_OK;
    char a[160], b[160];
    return hr_error(HR_ERR_SHAPE, "checkpoint: MXFP4 tensor '%s' is %s %s, expected u8 %s", name,
                    hr_shape_str(info.ndim, info.shape, a, sizeof a), hr_dtype_name(info.dtype),
                    hr_shape_str(nd, want, b, sizeof b));
}

hr_status hr_mxfp4_check(const hr_model *m, const char *name, int64_t experts, int64_t rows, int64_t cols) {
    if (cols % 32)
        return hr_error(HR_ERR_SHAPE, "checkpoint: MXFP4 weight '%s' has %lld columns, not a multiple of 32", name,
                        (long long)cols);
    char b[300], s[300];
    part(name, "blocks", b, sizeof b);
    part(name, "scales", s, sizeof s);
    HR_TRY(check_part(m, b, 4, (int64_t[]){experts, rows, cols / 32, 16}));
    return check_part(m, s, 3, (int64_t[]){experts, rows, cols / 32});
}

typedef struct mx_job {
    const uint8_t *blocks, *scales;
    int64_t rows, cols; /* per expert */
    int64_t total;      /* experts x rows */
    bool interleaved;
    hr_dtype dt;
    char *out;
} mx_job;

static void mx_rows(void *arg, int ith, int nth) {
    const mx_job *j = arg;
    int64_t b, e, groups = j->cols / 32, half = j->rows / 2;
    hr_split_range(j->total, ith, nth, &b, &e);
    size_t es = hr_dtype_size(j->dt);
    for (int64_t t = b; t < e; t++) {
        int64_t ex = t / j->rows, r = t % j->rows;
        /* interleaved rows: 2i is gate row i, 2i + 1 up row i */
        int64_t to = j->interleaved ? (r % 2 ? half + r / 2 : r / 2) : r;
        char *o = j->out + (size_t)((ex * j->rows + to) * j->cols) * es;
        const uint8_t *q = j->blocks + (size_t)t * (size_t)groups * 16, *sc = j->scales + (size_t)t * (size_t)groups;
        for (int64_t g = 0; g < groups; g++) {
            float d = hr_e8m0_half(sc[g]), v[32];
            for (int i = 0; i < 16; i++) {
                v[2 * i] = d * (float)hr_mxfp4_levels[q[16 * g + i] & 0xF];
                v[2 * i + 1] = d * (float)hr_mxfp4_levels[q[16 * g + i] >> 4];
            }
            for (int i = 0; i < 32; i++) {
                size_t at = (size_t)(32 * g + i) * es;
                if (j->dt == HR_F32) memcpy(o + at, &v[i], 4);
                else {
                    uint16_t h = j->dt == HR_BF16 ? hr_f32_to_bf16(v[i]) : hr_f32_to_f16(v[i]);
                    memcpy(o + at, &h, 2);
                }
            }
        }
    }
}

hr_status hr_mxfp4_load(hr_model *m, const char *name, int64_t experts, int64_t rows, int64_t cols, bool interleaved,
                        hr_tensor **out) {
    *out = NULL;
    char bn[300], sn[300];
    part(name, "blocks", bn, sizeof bn);
    part(name, "scales", sn, sizeof sn);
    if (interleaved && rows % 2)
        return hr_error(HR_ERR_SHAPE, "checkpoint: MXFP4 weight '%s' has %lld rows; gate and up need an even count",
                        name, (long long)rows);
    hr_tensor *blocks = NULL, *scales = NULL, *t = NULL;
    hr_status s = hr_checkpoint_tensor(m->ckpt, bn, &blocks);
    if (s == HR_OK) s = hr_checkpoint_tensor(m->ckpt, sn, &scales);
    if (s == HR_OK) s = hr_tensor_empty(hr_device_cpu(), m->dtype, 3, (int64_t[]){experts, rows, cols}, &t);
    if (s == HR_OK && experts * rows * cols > 0) {
        mx_job j = {.blocks = hr_tensor_ptr(blocks), .scales = hr_tensor_ptr(scales), .rows = rows, .cols = cols,
                    .total = experts * rows, .interleaved = interleaved, .dt = m->dtype, .out = hr_tensor_ptr(t)};
        hr_parallel_run(mx_rows, &j, hr_parallel_threads_for(experts * rows * cols, HR_GRAIN_ELTWISE));
    }
    hr_tensor_free(blocks);
    hr_tensor_free(scales);
    hr_checkpoint_drop_tensor(m->ckpt, bn);
    hr_checkpoint_drop_tensor(m->ckpt, sn);
    if (s != HR_OK) {
        hr_tensor_free(t);
        return hr_error_context(s, "dequantizing MXFP4 '%s'", name);
    }
    hr_tensor_set_name(t, name);
    *out = t;
    return HR_OK;
}
