/* The fused linear node: one thread-pool pass computes every linear that
 * reads the same few rows x (q/k/v, gate/up), through the same GEMV
 * micro-kernels and blocking as gemv_core.c so each column is bit-for-bit
 * what the unfused linear gives. Epilogues round the products to the
 * output dtype first, as the unfused ops would have stored them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/k_eltwise.h"
#include "backends/cpu/k_fused.h"
#include "backends/cpu/linear_pack.h"
#include "core/claims.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"

#define CHUNK 64 /* output columns per work unit: one panel of a packed weight */
_Static_assert(CHUNK == HR_GEMM_PANEL_N, "a chunk of a packed weight is one panel");

bool hr_fused_rows(const hr_tensor *t, int64_t *rows, int64_t *row_stride) {
    if (t->ndim < 1 || (t->shape[t->ndim - 1] > 1 && t->strides[t->ndim - 1] != 1)) return false;
    int64_t r = 1, rs = t->shape[t->ndim - 1], expect = -1;
    for (int d = t->ndim - 2; d >= 0; d--) {
        if (t->shape[d] == 1) continue;
        if (expect < 0) {
            rs = t->strides[d];
        } else if (t->strides[d] != expect) {
            return false;
        }
        expect = t->strides[d] * t->shape[d];
        r *= t->shape[d];
    }
    *rows = r;
    *row_stride = rs;
    return true;
}

bool hr_fused_linears_enabled(void) {
    const char *env = getenv("HUBRT_FUSE");
    return !env || strcmp(env, "0");
}

bool hr_fused_linear_fits(const hr_tensor *x, const hr_tensor *w, const hr_tensor *b, const hr_tensor *out) {
    int64_t rows, rs, orows, ors;
    if (x->dtype != HR_F32 && x->dtype != HR_BF16 && x->dtype != HR_F16) return false;
    if (w->dtype != x->dtype || out->dtype != x->dtype || w->ndim != 2 || out->ndim != x->ndim) return false;
    int64_t k = x->shape[x->ndim - 1];
    if (k < 1 || w->shape[1] != k || (k > 1 && w->strides[1] != 1) || out->shape[out->ndim - 1] != w->shape[0])
        return false;
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0] || (b->dtype != HR_F32 && b->dtype != HR_BF16 && b->dtype != HR_F16)))
        return false;
    if (!hr_fused_rows(x, &rows, &rs) || !hr_fused_rows(out, &orows, &ors)) return false;
    for (int d = 0; d + 1 < x->ndim; d++)
        if (x->shape[d] != out->shape[d]) return false;
    /* Only rows the unfused linear sends to the GEMV route, or, for a
     * packed weight, to the panel route's tiles (as this node reads it):
     * bf16 rows from HR_GEMM_SKINNY_MIN_ROWS on may take the skinny GEMM,
     * which sums in another order. */
    int64_t max_rows = x->dtype == HR_BF16 ? HR_GEMM_SKINNY_MIN_ROWS - 1 : HR_GEMV_ROUTE_ROWS;
    return rows >= 1 && rows <= max_rows && ors >= w->shape[0];
}

typedef struct fl_ctx {
    const hr_fused_linear *f;
    hr_gemv_fn fn;
    const char *x; /* [rows][k], f32 or (avx512) bf16 */
    size_t xsz;
    int rows;
    int group; /* x rows per kernel call (hr_gemv_group_rows), as the GEMV route */
    int64_t k;
    int64_t out_rs[HR_FUSED_MAX_LINEARS], res_rs;
    int64_t first_unit[HR_FUSED_MAX_LINEARS + 1]; /* units of CHUNK columns, per linear */
    bool simd;
    hr_gemm_amx_fn amx; /* the panel route's AMX kernel, or NULL */
    bool panels;        /* x and weights read through their panels, as the linear op would (bf16; f16
                         * where the AVX2 kernel, which alone has f16 panels, runs the route) */
    hr_claims claims;   /* the units */
} fl_ctx;

/* y[r][0..nc) = x[r] . w[j] rows c0.., for every row r. */
static void fl_product(const fl_ctx *c, int j, int64_t c0, int64_t nc, float (*y)[CHUNK]) {
    const hr_tensor *w = c->f->w[j];
    size_t wsz = hr_dtype_size(w->dtype);
    int64_t ldw = w->strides[0];
    const char *wp = (const char *)hr_tensor_ptr(w) + c0 * ldw * (int64_t)wsz;
    const uint32_t *panels = c->panels && w->dtype == c->f->x->dtype ? hr_linear_panels(w) : NULL;
    /* as the linear op reads a packed weight: one panel per chunk */
    if (panels && c->xsz == 2)
        hr_gemm_panel_rows(c->amx, c->rows, c->k, (const uint16_t *)c->x, c->k,
                           hr_gemm_panel_at(panels, c->k, c0 / HR_GEMM_PANEL_N), &y[0][0]);
    else if (panels) /* the AVX2 tile takes up to six rows (f16: up to 16 come here) */
        for (int r = 0; r < c->rows; r += 6) {
            const float *xr = (const float *)c->x + (size_t)r * (size_t)c->k;
            hr_gemm_panel_rows_avx2(c->rows - r < 6 ? c->rows - r : 6, c->k, xr, c->k,
                                    hr_gemm_panel_at(panels, c->k, c0 / HR_GEMM_PANEL_N), &y[r][0], w->dtype == HR_F16);
        }
    else
        for (int r = 0; r < c->rows; r += c->group)
            c->fn(c->k, c->rows - r < c->group ? c->rows - r : c->group, c->x + (size_t)r * (size_t)c->k * c->xsz,
                  wp, w->dtype, ldw, (int)nc, y[r], CHUNK);
    const hr_tensor *b = c->f->b[j];
    if (!b) return;
    float bias[CHUNK];
    hr_load_f32(bias, (const char *)hr_tensor_ptr(b) + c0 * b->strides[0] * (int64_t)hr_dtype_size(b->dtype),
                b->dtype, nc, b->strides[0]);
    for (int r = 0; r < c->rows; r++)
        for (int64_t i = 0; i < nc; i++) y[r][i] += bias[i];
}

/* Unit u (CHUNK columns of one linear, or of gate and up) into the outputs. */
static void fl_unit(const fl_ctx *c, int64_t u) {
    const hr_fused_linear *f = c->f;
    float y[2][HR_GEMV_ROUTE_ROWS][CHUNK], res[CHUNK];
    int j = 0;
    while (u >= c->first_unit[j + 1]) j++;
    int64_t c0 = (u - c->first_unit[j]) * CHUNK, n = f->w[j]->shape[0];
    int64_t nc = n - c0 < CHUNK ? n - c0 : CHUNK;
    bool gated = f->epi == HR_FUSED_GATED || f->epi == HR_FUSED_GATED_GELU;
    fl_product(c, j, c0, nc, y[0]);
    if (gated) fl_product(c, 1, c0, nc, y[1]);
    hr_tensor *o = f->out[j];
    size_t osz = hr_dtype_size(o->dtype);
    for (int r = 0; r < c->rows; r++) {
        float *yr = y[0][r];
        if (gated) {
            hr_k_round_f32(yr, o->dtype, nc, c->simd);
            hr_k_round_f32(y[1][r], o->dtype, nc, c->simd);
            /* silu_mul's / gelu_mul's own arithmetic, as the unfused op computes it */
            hr_k_eltwise_f32(f->epi == HR_FUSED_GATED ? HR_EW_SILU_MUL : HR_EW_GELU_TANH_MUL, 0, 0, yr, yr, y[1][r],
                             nc, c->simd);
        } else if (f->epi == HR_FUSED_RESIDUAL) {
            hr_k_round_f32(yr, o->dtype, nc, c->simd);
            hr_load_f32(res, (const char *)hr_tensor_ptr(f->res) + (r * c->res_rs + c0) * (int64_t)osz,
                        f->res->dtype, nc, 1);
            for (int64_t i = 0; i < nc; i++) yr[i] += res[i];
        }
        hr_k_store_f32((char *)hr_tensor_ptr(o) + (r * c->out_rs[j] + c0) * (int64_t)osz, o->dtype, yr, nc, 1,
                       c->simd);
    }
}

/* The units shared as the panel route shares its own (core/claims.h):
 * each task runs its segment forward, then the others' leftovers, so a
 * task the OS deschedules leaves its rest to the other (fixed halves made
 * the other wait). Qwen3 b1, where the two cores keep pace, measured the
 * same either way. */
static void fl_worker(void *arg, int ith, int nth) {
    fl_ctx *c = arg;
    int seg = 0;
    for (int64_t u; (u = hr_claims_next(&c->claims, ith, nth, &seg)) >= 0;) fl_unit(c, u);
}

hr_status hr_cpu_fused_linear(const hr_fused_linear *f) {
    fl_ctx c = {.f = f, .k = f->x->shape[f->x->ndim - 1], .simd = hr_cpu_isa_get() >= HR_ISA_AVX2,
                .amx = hr_gemm_amx_kernel(), .panels = hr_gemm_use_panels_for(f->x->dtype)};
    int64_t rows, xrs, orows;
    if (!hr_fused_rows(f->x, &rows, &xrs))
        return hr_error(HR_ERR_INVALID_ARG, "fused linear: input rows are not evenly strided");
    c.rows = (int)rows;
    int n_out = f->epi == HR_FUSED_STORE ? f->n : 1;
    for (int j = 0; j < n_out; j++)
        if (!hr_fused_rows(f->out[j], &orows, &c.out_rs[j]))
            return hr_error(HR_ERR_INVALID_ARG, "fused linear: output %d rows are not evenly strided", j);
    if (f->res && !hr_fused_rows(f->res, &orows, &c.res_rs))
        return hr_error(HR_ERR_INVALID_ARG, "fused linear: residual rows are not evenly strided");
    /* GATED* walk the columns of w[0] and take w[1]'s alongside. */
    int n_walk = f->epi == HR_FUSED_STORE ? f->n : 1;
    int64_t work = 0;
    for (int j = 0; j < n_walk; j++) c.first_unit[j + 1] = c.first_unit[j] + (f->w[j]->shape[0] + CHUNK - 1) / CHUNK;
    for (int j = n_walk; j < f->n; j++) c.first_unit[j + 1] = c.first_unit[j];
    for (int j = 0; j < f->n; j++) work += f->w[j]->shape[0];
    c.fn = hr_gemv_kernel_for(f->x->dtype, f->w[0]->dtype, &c.xsz);
    c.group = hr_gemv_group_rows(c.k, c.xsz);
    char *x = malloc((size_t)c.rows * (size_t)c.k * c.xsz + 64);
    if (!x) return hr_error(HR_ERR_OOM, "fused linear: out of memory for %d x %lld activations", c.rows,
                            (long long)c.k);
    size_t esz = hr_dtype_size(f->x->dtype);
    for (int r = 0; r < c.rows; r++)
        hr_gemv_load_x(x + (size_t)r * (size_t)c.k * c.xsz,
                       (const char *)hr_tensor_ptr(f->x) + r * xrs * (int64_t)esz, f->x->dtype, c.k, 1, c.xsz);
    c.x = x;
    int64_t units = c.first_unit[f->n];
    int nth = hr_parallel_threads_for(rows * work * c.k, HR_GRAIN_MATMUL);
    if (nth > units) nth = (int)units;
    if (nth > HR_CLAIMS_MAX) nth = HR_CLAIMS_MAX;
    if (nth < 1) nth = 1;
    hr_claims_init(&c.claims, units, nth);
    hr_parallel_run(fl_worker, &c, nth);
    free(x);
    return HR_OK;
}
