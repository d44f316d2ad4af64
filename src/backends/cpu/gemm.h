/* The CPU GEMM engine behind matmul and linear: C = A @ B (+ bias) over
 * broadcast batch dims, any dtype (f32/bf16/f16) and any strides, f32
 * accumulation. Large problems are tiled and packed for register-blocked
 * micro-kernels; a few rows against a K-contiguous B (decode: x @ W^T) go
 * to a GEMV that streams B once. */
#ifndef HR_BACKENDS_CPU_GEMM_H
#define HR_BACKENDS_CPU_GEMM_H

#include <stdbool.h>

#include "backends/cpu/k_eltwise.h"
#include "backends/cpu/simd_math.h"
#include "core/tensor_impl.h"

/* A 2-d operand: element (i, j) sits at base + (i * rs + j * cs) elements. */
typedef struct hr_gemm_mat {
    char *base;
    hr_dtype dt;
    int64_t rs, cs;
} hr_gemm_mat;

typedef struct hr_gemm {
    int64_t m, n, k;
    /* Batch dims of C; A and B broadcast with stride 0. */
    int nb;
    int64_t bshape[HR_MAX_DIMS];
    int64_t bstride_a[HR_MAX_DIMS], bstride_b[HR_MAX_DIMS], bstride_c[HR_MAX_DIMS];
    hr_gemm_mat a; /* [m, k] */
    hr_gemm_mat b; /* [k, n] */
    hr_gemm_mat c; /* [m, n] */
    const char *bias; /* [n] in bias_dt, stride bias_s; NULL for none */
    hr_dtype bias_dt;
    int64_t bias_s;
    /* B (linear's bf16 weight, shared by every batch) in K-pair panels made
     * at load (linear_pack.c), or NULL: then B is read at `b` alone. */
    const uint32_t *b_panels;
} hr_gemm;

hr_status hr_gemm_run(const hr_gemm *g);

/* Element offsets of batch `bi` in A, B and C, and the number of batches. */
void hr_gemm_batch_offsets(const hr_gemm *g, int64_t bi, int64_t *oa, int64_t *ob, int64_t *oc);
int64_t hr_gemm_batch_count(const hr_gemm *g);
/* Element offset of row r, counted across batches, of A (c false) or C. */
int64_t hr_gemm_row_offset(const hr_gemm *g, bool c, int64_t r);
/* Whether rows [0, rows) of A (c false) or C, counted across batches, lie
 * one stride (*ld) apart, as a linear's [batch, seq, k] rows do: then a
 * row's offset is r * *ld, without the batch walk. */
bool hr_gemm_rows_even(const hr_gemm *g, bool c, int64_t rows, int64_t *ld);

/* This thread's scratch block of at least `bytes`, 64-byte aligned, kept
 * across calls (contents not); NULL when out of memory. */
void *hr_gemm_thread_scratch(size_t bytes);

/* Rows the GEMV route takes: kernels run a few rows at a time over the same
 * weight rows, which stay in cache between the passes, so the weights still
 * stream from memory once; beyond this, packing for the GEMM pays. */
#define HR_GEMV_ROUTE_ROWS 16
/* The GEMV route (gemv_core.c): rows <= HR_GEMV_ROUTE_ROWS, B K-contiguous. */
hr_status hr_gemv_run(const hr_gemm *g, int rows);

/* The skinny bf16 route (gemm_skinny.c): HR_GEMM_SKINNY_MIN_ROWS rows or
 * more of bf16 A against a K-contiguous bf16 B (linear's weight) shared by
 * every batch, on AVX-512 BF16, reading B in place with no packing. */
#define HR_GEMM_SKINNY_MIN_ROWS 5
bool hr_gemm_skinny_fits(const hr_gemm *g, int64_t rows);
hr_status hr_gemm_skinny_run(const hr_gemm *g, int64_t rows);

/* The panel route (gemm_panel.c): the skinny route's operands, A's rows
 * in place at x, ldx elements apart, in outer-product form over K-pair
 * panels of HR_GEMM_PANEL_N weight rows [K/2][64] u32 (the pair p of row j
 * at p * 64 + j): g->b_panels when the weight was packed at load (any row
 * count), else packed per call, which pays from HR_GEMM_PANEL_MIN_ROWS
 * rows. Measured against the skinny route (Qwen3 shapes, one thread,
 * interleaved): 1% faster at 256 rows, 4-6% from 384, even at 192, 2%
 * slower at 128. */
#define HR_GEMM_PANEL_N 64
#define HR_GEMM_PANEL_MIN_ROWS 256
hr_status hr_gemm_panel_run(const hr_gemm *g, int64_t rows, const uint16_t *x, int64_t ldx);
/* Bytes of one panel over k: the packed weight is ceil(n / 64) of them. */
size_t hr_gemm_panel_bytes(int64_t k);
/* Panel u (weight rows [64u, 64u + 64)) of a packed weight over k. */
static inline const uint32_t *hr_gemm_panel_at(const uint32_t *panels, int64_t k, int64_t u) {
    return panels + u * ((k + 1) / 2) * HR_GEMM_PANEL_N;
}
/* Weight rows [0, nj) (nj <= 64, ldw elements apart) x K [0, kc) into one
 * panel; rows past nj and the partner of an odd last element are zero.
 * AVX-512 only; hr_gemm_pack_panel_avx2 makes the same bytes on AVX2. */
void hr_gemm_pack_panel(const uint16_t *w, int64_t ldw, int nj, int64_t kc, uint32_t *panel);
void hr_gemm_pack_panel_avx2(const uint16_t *w, int64_t ldw, int nj, int64_t kc, uint32_t *panel);
/* An f16 weight's panel (the AVX2 kernel's only): each pair row's 64 even
 * halves, then its 64 odd ones, so that eight columns' evens (odds) are
 * one F16C conversion; made from the pair layout in place. */
void hr_gemm_panel_split_f16(uint32_t *panel, int64_t kc);
/* Element (j, i) of a packed weight over k: row j's element i, from its
 * pair (bf16) or its half row (f16). */
static inline uint16_t hr_gemm_panel_elem(const uint32_t *panels, int64_t k, int64_t j, int64_t i, bool f16) {
    const uint32_t *row = hr_gemm_panel_at(panels, k, j / HR_GEMM_PANEL_N) + i / 2 * HR_GEMM_PANEL_N;
    if (f16) return ((const uint16_t *)row)[(i & 1) * HR_GEMM_PANEL_N + j % HR_GEMM_PANEL_N];
    return (uint16_t)(row[j % HR_GEMM_PANEL_N] >> (16 * (i & 1)));
}

/* The panel route on AVX2 + FMA (gemm_panel_avx2.c): bf16 A against the
 * packed panels g->b_panels (or f16 A against f16 panels), A's rows
 * widened to f32 once per call, in passes of up to 512 rows. */
hr_status hr_gemm_panel_run_avx2(const hr_gemm *g, int64_t rows);
/* Its tile for the fused linear node: y[r][0..64) = x row r . panel over
 * k for r < rows (1..6), x f32 rows ldx apart, the panel of bf16 (f16
 * when `f16`) pairs; the route's bits. */
void hr_gemm_panel_rows_avx2(int rows, int64_t k, const float *x, int64_t ldx, const uint32_t *panel, float *y,
                             bool f16);
/* Whether linear weights are packed into panels and read through them:
 * the ISA setting allows AVX2 (the build baseline) or more. */
bool hr_gemm_use_panels(void);
/* Whether weights of dtype dt are: bf16 ones for every panel kernel, f16
 * ones for the AVX2 kernel only (F16C; AVX-512 BF16 and AMX multiply bf16
 * only), so where AVX-512 BF16 is not in use. */
bool hr_gemm_use_panels_for(hr_dtype dt);
/* y[r][0..64) = x row r . panel over k, for r < rows (1..6), rows of x
 * ldx apart: the route's tile, on the AMX kernel `amx` when not NULL
 * (hr_gemm_amx_kernel), for the fused linear node to give the same bits.
 * AVX-512 BF16 only. */
typedef void (*hr_gemm_amx_fn)(int rows, int64_t k32, const uint16_t *x, int64_t ldx, const uint32_t *panel,
                               float *y, const char *pf, size_t pf_len);
void hr_gemm_panel_rows(hr_gemm_amx_fn amx, int rows, int64_t k, const uint16_t *x, int64_t ldx,
                        const uint32_t *panel, float *y);
/* The panel route's AMX kernel (gemm_amx.c): y[r][0..64) = x row r .
 * panel over K [0, k32) for r < rows (1..HR_GEMM_AMX_ROWS), k32 a multiple
 * of 32, y rows 64 floats apart; [pf, pf + pf_len) prefetched meanwhile
 * (pf may be NULL). K's last k % 32 elements are the caller's (AVX-512). */
#define HR_GEMM_AMX_ROWS 32
void hr_gemm_amx_rows(int rows, int64_t k32, const uint16_t *x, int64_t ldx, const uint32_t *panel, float *y,
                      const char *pf, size_t pf_len);
/* The same kernel on the tile emulator (gemm_amx_emulated.c). */
void hr_gemm_amx_rows_emulated(int rows, int64_t k32, const uint16_t *x, int64_t ldx, const uint32_t *panel,
                               float *y, const char *pf, size_t pf_len);
/* The AMX kernel the panel route runs: the tiles' when the ISA setting is
 * amx, the emulator's when amx is emulated (HUBRT_AMX_EMULATE=1), else
 * NULL (the AVX-512 tile). Read once per call (the getter locks). */
hr_gemm_amx_fn hr_gemm_amx_kernel(void);

/* A's `rows` rows (across batches) as bf16 rows *ldx apart: in place when
 * they are K-contiguous and evenly spaced, else copied into the calling
 * thread's scratch. NULL (error set) when out of memory. */
const uint16_t *hr_gemm_bf16_rows(const hr_gemm *g, int64_t rows, int64_t *ldx);

/* n sums of one row of C (+ bias when not NULL) stored at dst in C's dtype
 * and column stride: the skinny and panel routes' epilogue, inline since
 * it runs once per row piece; contiguous bf16 rows take the AVX-512 store
 * (the callers run on AVX-512 BF16 only). y may be modified. */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) void
hr_gemm_store_row(const hr_gemm *g, char *dst, float *y, const float *bias, int64_t n, bool simd) {
    if (g->c.dt == HR_BF16 && g->c.cs == 1) {
        hr_bf16_row_store_avx512((uint16_t *)dst, y, bias, n);
        return;
    }
    if (bias)
        for (int64_t c = 0; c < n; c++) y[c] += bias[c];
    hr_k_store_f32(dst, g->c.dt, y, n, g->c.cs, simd);
}

/* ---- micro-kernels (gemm_kernels.c, gemm_avx512.c) ---- */

/* Register-blocked C tile [mr, nr] (+)= A panel @ B panel, in f32.
 * f32 panels: ap [kc][mr], bp [kc][nr]. bf16-pair panels: kc counts pairs,
 * ap [kc][mr] u32 (two consecutive k of a row), bp [kc][nr][2] bf16. */
typedef void (*hr_gemm_ukr_fn)(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                               bool accumulate);

#define HR_GEMM_F32_MR 6
#define HR_GEMM_F32_NR 16
#define HR_GEMM_BF16_MR 12
#define HR_GEMM_BF16_NR 32

void hr_gemm_ukr_f32_scalar(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                            bool accumulate);
void hr_gemm_ukr_f32_avx2(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                          bool accumulate);
void hr_gemm_ukr_bf16_avx512(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                             bool accumulate);

/* GEMV block: y[r * ldy + j] = dot(x[r], w[j]) for r < rows (<= 4),
 * j < nw (any count; a call over a whole chunk of columns runs fastest);
 * w row j starts at w + j * ldw elements of wdt. x rows are contiguous
 * [rows][k]: f32 for the scalar/avx2 versions, bf16 for avx512 (which takes
 * wdt == bf16 only). A column's value depends on neither nw nor j, so any
 * split of the columns gives the same bits. */
#define HR_GEMV_MAX_ROWS 4
/* x bytes one kernel call may keep in L1 beside the weight stream. */
#define HR_GEMV_X_L1 12288
/* x rows per kernel call (4, 2 or 1) for rows of k elements of xsz bytes:
 * a call reads all its x rows once per weight row, so they must stay in
 * L1; more rows take several calls over the same chunk of weights, which
 * is in L2 by the second. */
static inline int hr_gemv_group_rows(int64_t k, size_t xsz) {
    int g = HR_GEMV_MAX_ROWS;
    while (g > 1 && (int64_t)g * k * (int64_t)xsz > HR_GEMV_X_L1) g /= 2;
    return g;
}
typedef void (*hr_gemv_fn)(int64_t k, int rows, const void *x, const void *w, hr_dtype wdt, int64_t ldw,
                           int nw, float *y, int64_t ldy);

void hr_gemv_scalar(int64_t k, int rows, const void *x, const void *w, hr_dtype wdt, int64_t ldw, int nw,
                    float *y, int64_t ldy);
void hr_gemv_avx2(int64_t k, int rows, const void *x, const void *w, hr_dtype wdt, int64_t ldw, int nw,
                  float *y, int64_t ldy);
void hr_gemv_bf16_avx512(int64_t k, int rows, const void *x, const void *w, hr_dtype wdt, int64_t ldw,
                         int nw, float *y, int64_t ldy);

/* The GEMV kernel for x of dtype xdt against weights of wdt, with *xsz the
 * element size of the x rows it reads (2: bf16 for the AVX-512 kernel,
 * 4: f32). Every user of the kernels picks through this, so the GEMV route
 * and the fused linear node give the same bits. */
hr_gemv_fn hr_gemv_kernel_for(hr_dtype xdt, hr_dtype wdt, size_t *xsz);
/* One row of x (k elements of dt, cs apart) as that kernel reads it. */
void hr_gemv_load_x(char *dst, const char *src, hr_dtype dt, int64_t k, int64_t cs, size_t xsz);

/* dst[0..n) = n contiguous elements of src (f32, bf16 or f16) as f32. */
void hr_gemm_row_f32_avx2(float *dst, const void *src, hr_dtype dt, int64_t n);
/* dst[0..n) = n elements of src, stride apart, as f32: through
 * hr_gemm_row_f32_avx2 when avx2 and contiguous, else hr_load_f32. */
void hr_gemm_load_f32(float *dst, const void *src, hr_dtype dt, int64_t n, int64_t stride, bool avx2);

/* dst[p * ldd + i] = 32-bit element p of row i (i < 8, p < n); row i
 * starts at src + i * lds bytes. */
void hr_gemm_transpose8_avx2(const char *src, int64_t lds, int64_t n, uint32_t *dst, int64_t ldd);

/* Whether the AVX-512 BF16 kernels may run (ISA setting and CPUID). */
bool hr_gemm_use_avx512_bf16(void);

#endif
