/* Strided N-d iteration for kernels: operands broadcast to one shape,
 * dims coalesced where every operand is contiguous across them, and the
 * innermost dim handed to a row function. */
#ifndef HR_CORE_ITER_H
#define HR_CORE_ITER_H

#include "core/tensor_impl.h"

#define HR_ITER_MAX_OPS 4

typedef struct hr_iter {
    int ndim;                                   /* after coalescing, >= 1 */
    int64_t shape[HR_MAX_DIMS];
    int n_ops;
    char *base[HR_ITER_MAX_OPS];                /* element [0..0] of each operand */
    int64_t strides[HR_ITER_MAX_OPS][HR_MAX_DIMS]; /* in elements; 0 = broadcast */
    size_t itemsize[HR_ITER_MAX_OPS];
    int64_t rows;                               /* product of all but the last dim */
} hr_iter;

/* Operand 0 is usually the output and defines the shape; the others must
 * broadcast to it (checked by inference beforehand). */
void hr_iter_init(hr_iter *it, int n_ops, const hr_tensor *const *ops);

/* Row function: ptrs[i] points at the row start of operand i, whose
 * elements are strides[i] elements apart; the row has n elements. */
typedef void (*hr_row_fn)(void *ctx, char *const *ptrs, const int64_t *strides, int64_t n);

/* Runs fn over rows [begin, end). */
void hr_iter_rows(const hr_iter *it, int64_t begin, int64_t end, hr_row_fn fn, void *ctx);

/* Runs fn over all rows on the thread pool when the work is large enough. */
void hr_iter_parallel(const hr_iter *it, hr_row_fn fn, void *ctx);

/* Converting row loads and stores through f32 (bf16/f16/f32/f64/ints). */
void hr_load_f32(float *dst, const void *src, hr_dtype dt, int64_t n, int64_t stride);
void hr_store_f32(void *dst, hr_dtype dt, const float *src, int64_t n, int64_t stride);
/* Same through f64 and int64 (exact for integer dtypes). */
void hr_load_f64(double *dst, const void *src, hr_dtype dt, int64_t n, int64_t stride);
void hr_store_f64(void *dst, hr_dtype dt, const double *src, int64_t n, int64_t stride);
void hr_load_i64(int64_t *dst, const void *src, hr_dtype dt, int64_t n, int64_t stride);
void hr_store_i64(void *dst, hr_dtype dt, const int64_t *src, int64_t n, int64_t stride);

/* Elements per scratch chunk for row kernels that convert through f32. */
#define HR_ROW_CHUNK 1024

#endif
