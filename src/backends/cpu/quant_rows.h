/* Block-quantized weights (hr_dtype's HR_QTYPE_LIST, ggml's formats) as
 * the CPU's integer kernels read them. Every format unpacks into one form:
 * each element an unsigned byte u, each run of HR_QSUB elements a scale s
 * and a constant c, the element's value s * u + c (Q4_0's nibble q is u,
 * s = d, c = -8 d; Q4_1's c = m; Q6_K's u = q + 32 with its int8 scale in
 * s, ...). Activations are quantized per 32 elements to int8 (scale
 * amax / 127, rounded to nearest even), as llama.cpp's q8 blocks are, so a
 * row's dot product is sums of u x q over HR_QSUB elements (exact in
 * int32), each times s and the activation's scale, plus c times the
 * activation's sum over the run. */
#ifndef HR_BACKENDS_CPU_QUANT_ROWS_H
#define HR_BACKENDS_CPU_QUANT_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "hubrt/base.h"

#define HR_QSUB 16 /* elements per scale of the unpacked form */
#define HR_QX_BLOCK 32 /* activation elements per int8 scale */

/* `n` weight rows of k elements (k a multiple of dt's block), `row_bytes`
 * apart at src, unpacked into u [n][k], s and c [n][k / HR_QSUB]. */
void hr_quant_unpack_rows(hr_dtype dt, const uint8_t *src, size_t row_bytes, int64_t k, int n, uint8_t *u, float *s,
                          float *c);

/* Activations: q [k] int8, per HR_QSUB run the scale (xd) and the scaled
 * sum xd * sum(q) (xs). */
typedef struct hr_qx {
    const int8_t *q;
    const float *xd, *xs;
} hr_qx;

/* Row x [k] (f32, bf16 or f16; k a multiple of HR_QX_BLOCK) into q, xd and
 * xs [k / HR_QSUB]. */
void hr_quant_x_row(const void *x, hr_dtype dt, int64_t k, int8_t *q, float *xd, float *xs);

/* out[j] = dot(weight row j, x) for nw unpacked rows (u, s, c as
 * hr_quant_unpack_rows lays them out, k apart). */
typedef void (*hr_qdot_fn)(int64_t k, int nw, const uint8_t *u, const float *s, const float *c, hr_qx x,
                           float *out);
void hr_qdot_scalar(int64_t k, int nw, const uint8_t *u, const float *s, const float *c, hr_qx x, float *out);
void hr_qdot_avx512(int64_t k, int nw, const uint8_t *u, const float *s, const float *c, hr_qx x, float *out);
/* The ISA's kernel: AVX-512 VNNI where the CPU and HUBRT_CPU_ISA allow. */
hr_qdot_fn hr_qdot_pick(void);

/* A decode row: out[j] = dot(weight row j, x) for nw rows of dt's blocks
 * (w_rs bytes apart), straight from the blocks without unpacking them to
 * memory; xsb [k / 32] holds x's block sums (xs of the block's two runs
 * added). For the 32-element types and Q4_K, Q5_K, Q6_K (hr_qgemv_has) on
 * AVX-512 VNNI. Same
 * sums as hr_qdot_* up to the order of the float additions. */
bool hr_qgemv_has(hr_dtype dt);
bool hr_qgemv_avx512_has(hr_dtype dt);
/* Whether hr_quant_tile_avx512 unpacks dt (the 32-element types, Q4_K,
 * Q5_K) and the CPU and ISA setting allow it. */
bool hr_quant_tile_has(hr_dtype dt);
bool hr_quant_tile_avx512_has(hr_dtype dt);
void hr_qgemv_avx512(hr_dtype dt, const uint8_t *w, size_t w_rs, int64_t k, int nw, hr_qx x, const float *xsb,
                     float *out);

/* Many rows: out[r * ors + j] = dot(weight row j, x row r) for nw <= 16
 * weight rows (u [nw][k]) and m x rows (q [m][k]), both interleaved
 * (hr_quant_interleave), with the weights' run scales s [nw][runs], their
 * constants transposed ct [runs][16], and x's xd and xs [m][runs]. */
void hr_qgemm_avx512(int64_t k, int nw, const uint8_t *u, const float *s, const float *ct, int m,
                     const int8_t *q, const float *xd, const float *xs, float *out, int64_t ors);
/* Row p [k] (bytes) into the layout of hr_qgemm_avx512: runs of HR_QSUB in
 * groups of 16; within a group of n runs, four steps of n x 4 bytes, lane
 * l of step t holding elements 4t .. 4t + 3 of the group's run l. */
void hr_quant_interleave(const uint8_t *p, int64_t k, uint8_t *out);
/* nt weight rows of a 32-element type, Q4_K or Q5_K
 * (hr_quant_tile_avx512_has; w_rs bytes apart) straight into the
 * interleaved layout ui [nt][k], their scales s
 * [nt][runs] and constants ct [runs][ct_stride] (column j: row j), as
 * hr_quant_unpack_rows then hr_quant_interleave would give them. */
void hr_quant_tile_avx512(hr_dtype dt, const uint8_t *w, size_t w_rs, int64_t k, int nt, uint8_t *ui, float *s,
                          float *ct, int ct_stride);

#endif
