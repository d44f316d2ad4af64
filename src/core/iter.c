/* Strided iteration and converting row loads/stores. */
#include "core/iter.h"

#include <string.h>

#include "core/half.h"
#include "core/threadpool.h"

void hr_iter_init(hr_iter *it, int n_ops, const hr_tensor *const *ops) {
    const hr_tensor *ref = ops[0];
    int nd = ref->ndim;
    memset(it, 0, sizeof *it);
    it->n_ops = n_ops;
    int64_t shape[HR_MAX_DIMS + 1];
    int64_t st[HR_ITER_MAX_OPS][HR_MAX_DIMS + 1];
    for (int d = 0; d < nd; d++) shape[d] = ref->shape[d];
    for (int k = 0; k < n_ops; k++) {
        const hr_tensor *t = ops[k];
        it->base[k] = hr_tensor_ptr(t);
        it->itemsize[k] = hr_dtype_size(t->dtype);
        int lead = nd - t->ndim;
        for (int d = 0; d < nd; d++) {
            int sd = d - lead;
            st[k][d] = (sd < 0 || t->shape[sd] == 1) ? 0 : t->strides[sd];
        }
    }
    if (nd == 0) { /* a scalar is one row of one element */
        shape[0] = 1;
        for (int k = 0; k < n_ops; k++) st[k][0] = 0;
        nd = 1;
    }
    /* Drop size-1 dims, then merge dim d into d+1 when every operand steps
     * over d exactly as far as a whole d+1 row. */
    int m = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1 && nd > 1) continue;
        if (m > 0) {
            bool merge = true;
            for (int k = 0; k < n_ops && merge; k++)
                merge = st[k][m - 1] == st[k][d] * shape[d];
            if (merge) {
                shape[m - 1] *= shape[d];
                for (int k = 0; k < n_ops; k++) st[k][m - 1] = st[k][d];
                continue;
            }
        }
        shape[m] = shape[d];
        for (int k = 0; k < n_ops; k++) st[k][m] = st[k][d];
        m++;
    }
    if (m == 0) {
        shape[0] = 1;
        for (int k = 0; k < n_ops; k++) st[k][0] = 0;
        m = 1;
    }
    it->ndim = m;
    it->rows = 1;
    for (int d = 0; d < m; d++) {
        it->shape[d] = shape[d];
        if (d < m - 1) it->rows *= shape[d];
        for (int k = 0; k < n_ops; k++) it->strides[k][d] = st[k][d];
    }
}

void hr_iter_rows(const hr_iter *it, int64_t begin, int64_t end, hr_row_fn fn, void *ctx) {
    int last = it->ndim - 1;
    int64_t idx[HR_MAX_DIMS] = {0};
    int64_t r = begin;
    for (int d = last - 1; d >= 0; d--) {
        idx[d] = r % it->shape[d];
        r /= it->shape[d];
    }
    char *ptrs[HR_ITER_MAX_OPS];
    int64_t inner[HR_ITER_MAX_OPS];
    for (int k = 0; k < it->n_ops; k++) inner[k] = it->strides[k][last];
    for (int64_t row = begin; row < end; row++) {
        for (int k = 0; k < it->n_ops; k++) {
            int64_t off = 0;
            for (int d = 0; d < last; d++) off += idx[d] * it->strides[k][d];
            ptrs[k] = it->base[k] + off * (int64_t)it->itemsize[k];
        }
        fn(ctx, ptrs, inner, it->shape[last]);
        for (int d = last - 1; d >= 0; d--) {
            if (++idx[d] < it->shape[d]) break;
            idx[d] = 0;
        }
    }
}

typedef struct {
    const hr_iter *it;
    hr_row_fn fn;
    void *ctx;
    int64_t rows, cols;
} par_ctx;

static void par_body(void *arg, int ith, int nth) {
    par_ctx *p = arg;
    if (p->rows >= nth || p->cols == 1) {
        int64_t b, e;
        hr_split_range(p->rows, ith, nth, &b, &e);
        hr_iter_rows(p->it, b, e, p->fn, p->ctx);
        return;
    }
    /* Few long rows: split each row's columns instead. */
    const hr_iter *it = p->it;
    int last = it->ndim - 1;
    int64_t b, e;
    hr_split_range(p->cols, ith, nth, &b, &e);
    if (b >= e) return;
    hr_iter sub = *it;
    sub.shape[last] = e - b;
    for (int k = 0; k < it->n_ops; k++) sub.base[k] += b * it->strides[k][last] * (int64_t)it->itemsize[k];
    hr_iter_rows(&sub, 0, sub.rows, p->fn, p->ctx);
}

void hr_iter_parallel(const hr_iter *it, hr_row_fn fn, void *ctx) {
    int64_t cols = it->shape[it->ndim - 1];
    int64_t total = it->rows * cols;
    int nth = hr_parallel_threads_for(total, HR_GRAIN_ELTWISE);
    if (nth <= 1) {
        hr_iter_rows(it, 0, it->rows, fn, ctx);
        return;
    }
    par_ctx p = {it, fn, ctx, it->rows, cols};
    hr_parallel_run(par_body, &p, nth);
}

#define LOAD_LOOP(T, EXPR)                                                  \
    do {                                                                    \
        const T *s = src;                                                   \
        if (stride == 1)                                                    \
            for (int64_t i = 0; i < n; i++) dst[i] = EXPR(s[i]);            \
        else                                                                \
            for (int64_t i = 0; i < n; i++) dst[i] = EXPR(s[i * stride]);   \
    } while (0)

/* One switch for every load: DST is the row type, each dtype converts
 * through its own scalar rule (bf16/f16 through f32; float to integer
 * truncates toward zero, as torch's casts do). */
#define LOAD_CASES(DST)                                                     \
    switch (dt) {                                                           \
    case HR_F32: LOAD_LOOP(float, (DST)); break;                            \
    case HR_BF16: LOAD_LOOP(uint16_t, (DST)hr_bf16_to_f32); break;          \
    case HR_F16: LOAD_LOOP(uint16_t, (DST)hr_f16_to_f32); break;            \
    case HR_F64: LOAD_LOOP(double, (DST)); break;                           \
    case HR_I64: LOAD_LOOP(int64_t, (DST)); break;                          \
    case HR_I32: LOAD_LOOP(int32_t, (DST)); break;                          \
    case HR_I16: LOAD_LOOP(int16_t, (DST)); break;                          \
    case HR_I8: LOAD_LOOP(int8_t, (DST)); break;                            \
    case HR_U8: LOAD_LOOP(uint8_t, (DST)); break;                           \
    case HR_BOOL: LOAD_LOOP(uint8_t, (DST)(bool)); break;                   \
    case HR_F8_E4M3: LOAD_LOOP(uint8_t, (DST)hr_e4m3_to_f32); break;        \
    default: break;                                                         \
    }

void hr_load_f32(float *dst, const void *src, hr_dtype dt, int64_t n, int64_t stride) { LOAD_CASES(float) }
void hr_load_f64(double *dst, const void *src, hr_dtype dt, int64_t n, int64_t stride) { LOAD_CASES(double) }
void hr_load_i64(int64_t *dst, const void *src, hr_dtype dt, int64_t n, int64_t stride) { LOAD_CASES(int64_t) }

#define STORE_LOOP(T, EXPR)                                                 \
    do {                                                                    \
        T *d = dst;                                                         \
        if (stride == 1)                                                    \
            for (int64_t i = 0; i < n; i++) d[i] = EXPR(src[i]);            \
        else                                                                \
            for (int64_t i = 0; i < n; i++) d[i * stride] = EXPR(src[i]);   \
    } while (0)
#define TO_BF16_(x) hr_f32_to_bf16((float)(x))
#define TO_F16_(x) hr_f32_to_f16((float)(x))

#define STORE_CASES                                                         \
    switch (dt) {                                                           \
    case HR_F32: STORE_LOOP(float, (float)); break;                         \
    case HR_BF16: STORE_LOOP(uint16_t, TO_BF16_); break;                    \
    case HR_F16: STORE_LOOP(uint16_t, TO_F16_); break;                      \
    case HR_F64: STORE_LOOP(double, (double)); break;                       \
    case HR_I64: STORE_LOOP(int64_t, (int64_t)); break;                     \
    case HR_I32: STORE_LOOP(int32_t, (int32_t)); break;                     \
    case HR_I16: STORE_LOOP(int16_t, (int16_t)); break;                     \
    case HR_I8: STORE_LOOP(int8_t, (int8_t)); break;                        \
    case HR_U8: STORE_LOOP(uint8_t, (uint8_t)); break;                      \
    case HR_BOOL: STORE_LOOP(uint8_t, (uint8_t)(bool)); break;              \
    default: break;                                                         \
    }

void hr_store_f32(void *dst, hr_dtype dt, const float *src, int64_t n, int64_t stride) { STORE_CASES }
void hr_store_f64(void *dst, hr_dtype dt, const double *src, int64_t n, int64_t stride) { STORE_CASES }
void hr_store_i64(void *dst, hr_dtype dt, const int64_t *src, int64_t n, int64_t stride) { STORE_CASES }
