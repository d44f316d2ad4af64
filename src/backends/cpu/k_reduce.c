/* CPU kernels for the reduce ops: sum, mean, max, min, argmax, softmax,
 * log_softmax and cumsum over one dim (topk: k_reduce_topk.c).
 *
 * Every op sees the input (and outputs) with the reduced dim taken out:
 * an hr_iter walks the remaining positions in coalesced rows, and for each
 * position the kernel reads n elements `sd` apart. Two layouts:
 *   - vector mode: each position's n elements in chunks (the usual case,
 *     the reduced dim innermost: softmax over the vocabulary);
 *   - column mode: when neighbouring positions are adjacent in memory and
 *     the reduced dim is not, whole rows of positions at once (sum over
 *     dim 0 of [n, m]) so every load is contiguous.
 *
 * Floats (f32/bf16/f16) compute in f32, vectorized; f64 in double and
 * integers in int64 (sums wrap like torch), scalar. cumsum accumulates
 * f32 in double as torch's CPU kernel does, bf16/f16 in f32. NaN: max,
 * min and argmax propagate it as torch does (argmax gives the first NaN);
 * a softmax row holding NaN is all NaN. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/exp_poly.h"
#include "backends/cpu/k_eltwise.h"
#include "backends/cpu/k_reduce.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "ops/op_impl.h"

#define CHUNK 256 /* elements or positions per scratch buffer */

/* Row conversions through f32, vectorized for stride-1 rows; `c` is the
 * kernel's context in every function that uses them. */
#define LOAD_F32(dst, src, dt, n, stride) hr_k_load_f32(dst, src, dt, n, stride, c->simd)
#define STORE_F32(dst, dt, src, n, stride) hr_k_store_f32(dst, dt, src, n, stride, c->simd)
/* The n values at src as f32: src itself when it already is a contiguous
 * f32 row, else converted into buf. */
#define VIEW_F32(buf, src, dt, n, stride) \
    ((dt) == HR_F32 && (stride) == 1 ? (const float *)(src) : (LOAD_F32(buf, src, dt, n, stride), (const float *)(buf)))

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f v8_load(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void v8_store(float *p, v8f v) { memcpy(p, &v, sizeof v); }
static inline v8f v8_set1(float x) { return (v8f){0} + x; }
static inline v8f v8_sel(v8i m, v8f a, v8f b) { return (v8f)((m & (v8i)a) | (~m & (v8i)b)); }
static inline float v8_hsum(v8f v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* exp for x <= 0 (softmax arguments), Cephes' expf polynomial: ~1 ulp.
 * Underflows to 0 below -87.3; NaN stays NaN. */
static inline v8f v8_exp_neg(v8f x) {
    v8f n = x * HR_EXP_LOG2E;
    n = (n + 12582912.0f) - 12582912.0f; /* round to nearest (1.5 * 2^23) */
    v8f r = x - n * HR_EXP_LN2_HI;
    r = r - n * HR_EXP_LN2_LO;
    v8f p = v8_set1(HR_EXP_P0);
    p = p * r + HR_EXP_P1;
    p = p * r + HR_EXP_P2;
    p = p * r + HR_EXP_P3;
    p = p * r + HR_EXP_P4;
    p = p * r + HR_EXP_P5;
    v8f y = p * r * r + r + 1.0f;
    v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    y = v8_sel(x < -87.33654f, v8_set1(0.0f), y * (v8f)e);
    return v8_sel(x != x, x, y);
}

/* ---- f32 chunk helpers -------------------------------------------------- */

/* Sum with 32 partial sums: far less rounding error than one accumulator. */
static float sum_f32(const float *x, int64_t n) {
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 += v8_load(x + i);
        a1 += v8_load(x + i + 8);
        a2 += v8_load(x + i + 16);
        a3 += v8_load(x + i + 24);
    }
    for (; i + 8 <= n; i += 8) a0 += v8_load(x + i);
    float s = v8_hsum((a0 + a1) + (a2 + a3));
    for (; i < n; i++) s += x[i];
    return s;
}

/* Max (or min) of x[0..n), NaN when any element is NaN. */
static float extreme_f32(const float *x, int64_t n, bool is_max) {
    v8f acc = v8_set1(is_max ? -INFINITY : INFINITY);
    v8i nan = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = v8_load(x + i);
        acc = v8_sel(is_max ? v > acc : v < acc, v, acc);
        nan |= v != v;
    }
    float m = acc[0];
    bool any_nan = nan[0] != 0;
    for (int l = 1; l < 8; l++) {
        m = is_max ? fmaxf(m, acc[l]) : fminf(m, acc[l]);
        any_nan |= nan[l] != 0;
    }
    for (; i < n; i++) {
        any_nan |= x[i] != x[i];
        if (is_max ? x[i] > m : x[i] < m) m = x[i];
    }
    return any_nan ? NAN : m;
}

/* Index of the first element equal to m (the first NaN when m is NaN). */
static int64_t first_index_f32(const float *x, int64_t n, float m) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] == m || (m != m && x[i] != x[i])) return i;
    return 0;
}

static void add_into(float *acc, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) v8_store(acc + i, v8_load(acc + i) + v8_load(x + i));
    for (; i < n; i++) acc[i] += x[i];
}

/* acc = max(acc, x) (or min) elementwise, NaN sticking. */
static void extreme_into(float *acc, const float *x, int64_t n, bool is_max) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f a = v8_load(acc + i), v = v8_load(x + i);
        v8_store(acc + i, v8_sel((is_max ? v > a : v < a) | (v != v), v, a));
    }
    for (; i < n; i++)
        if ((is_max ? x[i] > acc[i] : x[i] < acc[i]) || x[i] != x[i]) acc[i] = x[i];
}

/* dst[i] = exp(x[i] - m[i or 0]); m_step 0 broadcasts one max; dst may be
 * x. The tail goes through the vector code too, so a value does not
 * depend on where a thread's range or a chunk happened to start. */
static void exp_shift_to(float *dst, const float *x, const float *m, int64_t m_step, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f mv = m_step ? v8_load(m + i) : v8_set1(m[0]);
        v8_store(dst + i, v8_exp_neg(v8_load(x + i) - mv));
    }
    if (i == n) return;
    float t[8] = {0}, tm[8] = {0};
    for (int64_t j = i; j < n; j++) {
        t[j - i] = x[j];
        tm[j - i] = m[m_step * j];
    }
    v8_store(t, v8_exp_neg(v8_load(t) - v8_load(tm)));
    for (int64_t j = i; j < n; j++) dst[j] = t[j - i];
}

static void scale_f32(float *x, float f, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) v8_store(x + i, v8_load(x + i) * f);
    for (; i < n; i++) x[i] *= f;
}

/* ---- driver: the reduced dim taken out, rows spread over threads -------- */

typedef struct reduce_ctx reduce_ctx;

/* Handles cnt (<= CHUNK) adjacent positions: inputs at `in`, si elements
 * apart, outputs at `out`, so apart. */
typedef void (*chunk_fn)(const reduce_ctx *c, const char *in, int64_t si, char *out, int64_t so, int64_t cnt);

struct reduce_ctx {
    hr_op op;
    chunk_fn chunk;
    int64_t n;         /* length of the reduced dim */
    int64_t sd_in;     /* input stride along it (elements) */
    int64_t sd_out;    /* output stride along it (softmax, cumsum) */
    hr_dtype in_dt, out_dt;
    bool simd; /* vector row conversions allowed (HUBRT_CPU_ISA) */
};

typedef struct {
    const hr_iter *it;
    hr_row_fn fn;
    void *ctx;
} par_ctx;

static void par_body(void *arg, int ith, int nth) {
    const par_ctx *p = arg;
    const hr_iter *it = p->it;
    int last = it->ndim - 1;
    int64_t cols = it->shape[last], b, e;
    if (it->rows >= nth || cols == 1) {
        hr_split_range(it->rows, ith, nth, &b, &e);
        hr_iter_rows(it, b, e, p->fn, p->ctx);
        return;
    }
    /* Few rows: split each row's positions instead. */
    hr_split_range(cols, ith, nth, &b, &e);
    if (b >= e) return;
    hr_iter sub = *it;
    sub.shape[last] = e - b;
    for (int k = 0; k < it->n_ops; k++) sub.base[k] += b * it->strides[k][last] * (int64_t)it->itemsize[k];
    hr_iter_rows(&sub, 0, sub.rows, p->fn, p->ctx);
}

/* Runs fn over the positions; the work counts the n elements of each. */
static void run_rows(const hr_iter *it, int64_t n, hr_row_fn fn, void *ctx) {
    int64_t work = it->rows * it->shape[it->ndim - 1] * (n > 1 ? n : 1);
    int nth = hr_parallel_threads_for(work, HR_GRAIN_ELTWISE);
    par_ctx p = {it, fn, ctx};
    if (nth <= 1)
        hr_iter_rows(it, 0, it->rows, fn, ctx);
    else
        hr_parallel_run(par_body, &p, nth);
}

/* Row function of every op: p[0] the output positions, p[1] the input's. */
static void row_chunks(void *vctx, char *const *p, const int64_t *st, int64_t L) {
    const reduce_ctx *c = vctx;
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt), osz = (int64_t)hr_dtype_size(c->out_dt);
    for (int64_t j0 = 0; j0 < L; j0 += CHUNK)
        c->chunk(c, p[1] + j0 * st[1] * isz, st[1], p[0] + j0 * st[0] * osz, st[0],
                 L - j0 < CHUNK ? L - j0 : CHUNK);
}

static void drop_dim(const hr_tensor *t, int d, hr_tensor *v) {
    memcpy(v, t, sizeof *v);
    if (t->ndim == 0) return;
    for (int i = d; i < t->ndim - 1; i++) {
        v->shape[i] = t->shape[i + 1];
        v->strides[i] = t->strides[i + 1];
    }
    v->ndim = t->ndim - 1;
}

/* Iterator over [out, x] with dim taken out of both (out keeps the dim
 * when out_has_dim: keepdim, softmax, cumsum). */
static void setup(hr_op op, const hr_tensor *x, int64_t dim, const hr_tensor *out, bool out_has_dim,
                  reduce_ctx *c, hr_iter *it) {
    int d = 0;
    if (x->ndim) d = (int)(dim < 0 ? dim + x->ndim : dim); /* range checked by inference */
    hr_tensor views[2];
    memset(c, 0, sizeof *c);
    c->op = op;
    c->n = x->ndim ? x->shape[d] : 1;
    c->in_dt = x->dtype;
    c->out_dt = out->dtype;
    c->sd_in = x->ndim ? x->strides[d] : 0;
    c->sd_out = out_has_dim && out->ndim ? out->strides[d] : 0;
    c->simd = hr_k_simd();
    if (out_has_dim)
        drop_dim(out, d, &views[0]);
    else
        memcpy(&views[0], out, sizeof views[0]);
    drop_dim(x, d, &views[1]);
    const hr_tensor *ops[2] = {&views[0], &views[1]};
    hr_iter_init(it, 2, ops);
}

static hr_status run_op(hr_op op, const hr_tensor *x, int64_t dim, const hr_tensor *out, bool out_has_dim,
                        chunk_fn chunk) {
    reduce_ctx c;
    hr_iter it;
    setup(op, x, dim, out, out_has_dim, &c, &it);
    c.chunk = chunk;
    run_rows(&it, c.n, row_chunks, &c);
    return HR_OK;
}

static bool is_float(hr_dtype dt) { return dt == HR_F32 || dt == HR_BF16 || dt == HR_F16; }

/* ---- sum, mean, max, min, argmax ----------------------------------------- */

/* One position of a float reduction: n elements sd_in apart at p. Chunk
 * sums (f32, 32 lanes) add up in double, so a long row keeps the accuracy
 * of torch's cascade sum. */
static float reduce_vector_f32(const reduce_ctx *c, const char *p, int64_t *idx) {
    float buf[CHUNK], acc = 0;
    double total = 0;
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt);
    *idx = 0;
    for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {
        int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;
        const float *x = VIEW_F32(buf, p + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in);
        if (c->op == HR_OP_sum || c->op == HR_OP_mean) {
            total += sum_f32(x, cnt);
            acc = (float)total;
            continue;
        }
        bool is_min = c->op == HR_OP_min;
        float m = extreme_f32(x, cnt, !is_min);
        if (k0 == 0 || (is_min ? m < acc : m > acc) || (m != m && acc == acc)) {
            acc = m;
            if (c->op == HR_OP_argmax) *idx = k0 + first_index_f32(x, cnt, m);
        }
    }
    return acc;
}

/* `cnt` adjacent positions at p at once, one row of them per step. */
static void reduce_columns_f32(const reduce_ctx *c, const char *p, int64_t cnt, float *acc, int64_t *idx) {
    float buf[CHUNK];
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt);
    LOAD_F32(acc, p, c->in_dt, cnt, 1);
    for (int64_t j = 0; j < cnt; j++) idx[j] = 0;
    for (int64_t k = 1; k < c->n; k++) {
        const float *x = VIEW_F32(buf, p + k * c->sd_in * isz, c->in_dt, cnt, 1);
        if (c->op == HR_OP_sum || c->op == HR_OP_mean) {
            add_into(acc, x, cnt);
        } else if (c->op != HR_OP_argmax) {
            extreme_into(acc, x, cnt, c->op == HR_OP_max);
        } else {
            for (int64_t j = 0; j < cnt; j++)
                if (x[j] > acc[j] || (x[j] != x[j] && acc[j] == acc[j])) {
                    acc[j] = x[j];
                    idx[j] = k;
                }
        }
    }
}

/* Exact reductions of one position: f64 in double, integers in int64. */
#define EXACT_REDUCE_(name, T, LOAD, ADD, ISNAN)                                              \
    static void name(const reduce_ctx *c, const char *p, T *acc_out, int64_t *idx_out) {      \
        T buf[CHUNK], acc = 0;                                                                \
        int64_t idx = 0, isz = (int64_t)hr_dtype_size(c->in_dt);                              \
        bool is_min = c->op == HR_OP_min;                                                     \
        for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {                                        \
            int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;                              \
            LOAD(buf, p + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in);                      \
            for (int64_t i = 0; i < cnt; i++) {                                               \
                T v = buf[i];                                                                 \
                if (c->op == HR_OP_sum) {                                                     \
                    acc = ADD(acc, v);                                                        \
                } else if (k0 + i == 0 || (is_min ? v < acc : v > acc) ||                     \
                           (ISNAN(v) && !ISNAN(acc))) {                                       \
                    acc = v;                                                                  \
                    idx = k0 + i;                                                             \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        *acc_out = acc;                                                                       \
        *idx_out = idx;                                                                       \
    }
#define ADD_F64_(a, b) ((a) + (b))
#define ADD_I64_(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define NO_NAN_(v) false
EXACT_REDUCE_(reduce_vector_f64, double, hr_load_f64, ADD_F64_, isnan)
EXACT_REDUCE_(reduce_vector_i64, int64_t, hr_load_i64, ADD_I64_, NO_NAN_)

static void reduce_chunk(const reduce_ctx *c, const char *in, int64_t si, char *out, int64_t so, int64_t cnt) {
    float acc[CHUNK];
    double accd[CHUNK];
    int64_t acci[CHUNK], idx[CHUNK];
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt);
    bool flt = is_float(c->in_dt);
    if (flt && si == 1 && c->sd_in != 1 && c->n > 1) {
        reduce_columns_f32(c, in, cnt, acc, idx);
    } else {
        for (int64_t j = 0; j < cnt; j++) {
            const char *pj = in + j * si * isz;
            if (flt)
                acc[j] = reduce_vector_f32(c, pj, &idx[j]);
            else if (c->in_dt == HR_F64)
                reduce_vector_f64(c, pj, &accd[j], &idx[j]);
            else
                reduce_vector_i64(c, pj, &acci[j], &idx[j]);
        }
    }
    if (c->op == HR_OP_argmax) {
        hr_store_i64(out, HR_I64, idx, cnt, so);
    } else if (flt) {
        if (c->op == HR_OP_mean) /* torch: f32 sum, then divide */
            for (int64_t j = 0; j < cnt; j++) acc[j] /= (float)c->n;
        STORE_F32(out, c->out_dt, acc, cnt, so);
    } else if (c->in_dt == HR_F64) {
        hr_store_f64(out, c->out_dt, accd, cnt, so);
    } else {
        hr_store_i64(out, c->out_dt, acci, cnt, so);
    }
}

/* An empty reduced dim reaches here only for sum (0) and mean (NaN): the
 * loops above then run zero times and store 0 or 0/0. */
static hr_status k_reduce(hr_op op, const void *attrs, const hr_tensor *const *in, hr_tensor *const *out) {
    const hr_attrs_reduce *a = attrs;
    return run_op(op, in[0], a->dim, out[0], a->keepdim, reduce_chunk);
}

#define REDUCE_KERNEL_(name)                                                                     \
    static hr_status k_##name(const void *attrs, const hr_tensor *const *in, int n_in,          \
                              hr_tensor *const *out, int n_out) {                               \
        return k_reduce(HR_OP_##name, attrs, in, out);                                           \
    }
REDUCE_KERNEL_(sum)
REDUCE_KERNEL_(mean)
REDUCE_KERNEL_(max)
REDUCE_KERNEL_(min)
REDUCE_KERNEL_(argmax)

/* ---- softmax, log_softmax ------------------------------------------------ */

/* y = exp(x - m) * f with f = 1/sum, or (x - m) - f with f = log(sum), for
 * cnt values; m and f are per value (step 1) or shared (step 0). */
static void softmax_finish(bool is_log, float *x, const float *m, const float *f, int64_t step, int64_t cnt) {
    if (is_log) {
        for (int64_t i = 0; i < cnt; i++) x[i] = (x[i] - m[step * i]) - f[step * i];
        return;
    }
    exp_shift_to(x, x, m, step, cnt);
    if (!step) {
        scale_f32(x, f[0], cnt);
        return;
    }
    for (int64_t i = 0; i < cnt; i++) x[i] *= f[i];
}

static float softmax_factor(bool is_log, float sum) { return is_log ? logf(sum) : 1.0f / sum; }

/* One position: three passes over the n values (max, sum, write). */
static void softmax_vector(const reduce_ctx *c, const char *in, char *out) {
    float buf[CHUNK], m = 0;
    double s = 0; /* chunk sums add up in double, as in reduce_vector_f32 */
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt), osz = (int64_t)hr_dtype_size(c->out_dt);
    bool is_log = c->op == HR_OP_log_softmax;
    /* softmax into a contiguous f32 row keeps exp(x - m) there for the last
     * pass to scale, instead of computing it twice */
    bool keep = !is_log && c->out_dt == HR_F32 && c->sd_out == 1;
    for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {
        int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;
        float cm = extreme_f32(VIEW_F32(buf, in + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in), cnt, true);
        if (k0 == 0 || cm > m || cm != cm) m = cm;
    }
    for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {
        int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;
        float *dst = keep ? (float *)out + k0 : buf;
        exp_shift_to(dst, VIEW_F32(buf, in + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in), &m, 0, cnt);
        s += sum_f32(dst, cnt);
    }
    float f = softmax_factor(is_log, (float)s);
    for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {
        int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;
        if (keep) {
            scale_f32((float *)out + k0, f, cnt);
            continue;
        }
        LOAD_F32(buf, in + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in);
        softmax_finish(is_log, buf, &m, &f, 0, cnt);
        STORE_F32(out + k0 * c->sd_out * osz, c->out_dt, buf, cnt, c->sd_out);
    }
}

/* cnt adjacent positions (input contiguous across them), same passes. */
static void softmax_columns(const reduce_ctx *c, const char *in, char *out, int64_t so, int64_t cnt) {
    float buf[CHUNK], m[CHUNK], s[CHUNK];
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt), osz = (int64_t)hr_dtype_size(c->out_dt);
    LOAD_F32(m, in, c->in_dt, cnt, 1);
    for (int64_t k = 1; k < c->n; k++)
        extreme_into(m, VIEW_F32(buf, in + k * c->sd_in * isz, c->in_dt, cnt, 1), cnt, true);
    memset(s, 0, sizeof(float) * (size_t)cnt);
    for (int64_t k = 0; k < c->n; k++) {
        exp_shift_to(buf, VIEW_F32(buf, in + k * c->sd_in * isz, c->in_dt, cnt, 1), m, 1, cnt);
        add_into(s, buf, cnt);
    }
    bool is_log = c->op == HR_OP_log_softmax;
    for (int64_t j = 0; j < cnt; j++) s[j] = softmax_factor(is_log, s[j]);
    for (int64_t k = 0; k < c->n; k++) {
        LOAD_F32(buf, in + k * c->sd_in * isz, c->in_dt, cnt, 1);
        softmax_finish(is_log, buf, m, s, 1, cnt);
        STORE_F32(out + k * c->sd_out * osz, c->out_dt, buf, cnt, so);
    }
}

static void softmax_chunk(const reduce_ctx *c, const char *in, int64_t si, char *out, int64_t so, int64_t cnt) {
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt), osz = (int64_t)hr_dtype_size(c->out_dt);
    if (si == 1 && c->sd_in != 1 && c->n > 1)
        softmax_columns(c, in, out, so, cnt);
    else
        for (int64_t j = 0; j < cnt; j++) softmax_vector(c, in + j * si * isz, out + j * so * osz);
}

static hr_status k_softmax_op(hr_op op, const void *attrs, const hr_tensor *const *in, hr_tensor *const *out) {
    return run_op(op, in[0], ((const hr_attrs_dim *)attrs)->dim, out[0], true, softmax_chunk);
}

static hr_status k_softmax(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                           int n_out) {
    return k_softmax_op(HR_OP_softmax, attrs, in, out);
}

static hr_status k_log_softmax(const void *attrs, const hr_tensor *const *in, int n_in,
                               hr_tensor *const *out, int n_out) {
    return k_softmax_op(HR_OP_log_softmax, attrs, in, out);
}

/* ---- cumsum ---------------------------------------------------------------- */

/* Running sums in T over one position (vector mode) or cnt adjacent
 * positions (column mode), loaded and stored through LOAD/STORE. */
#define CUMSUM_(name, T, LOAD, STORE, ADD)                                                     \
    static void name(const reduce_ctx *c, const char *in, int64_t si, char *out, int64_t so,   \
                     int64_t cnt) {                                                            \
        T acc[CHUNK], buf[CHUNK];                                                              \
        int64_t isz = (int64_t)hr_dtype_size(c->in_dt), osz = (int64_t)hr_dtype_size(c->out_dt); \
        if (si == 1 && c->sd_in != 1) {                                                        \
            for (int64_t j = 0; j < cnt; j++) acc[j] = 0;                                      \
            for (int64_t k = 0; k < c->n; k++) {                                               \
                LOAD(buf, in + k * c->sd_in * isz, c->in_dt, cnt, 1);                          \
                for (int64_t j = 0; j < cnt; j++) acc[j] = ADD(acc[j], buf[j]);                \
                STORE(out + k * c->sd_out * osz, c->out_dt, acc, cnt, so);                     \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        for (int64_t j = 0; j < cnt; j++) {                                                    \
            T run = 0;                                                                         \
            const char *pin = in + j * si * isz;                                               \
            char *pout = out + j * so * osz;                                                   \
            for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {                                     \
                int64_t m = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;                             \
                LOAD(buf, pin + k0 * c->sd_in * isz, c->in_dt, m, c->sd_in);                   \
                for (int64_t i = 0; i < m; i++) buf[i] = run = ADD(run, buf[i]);               \
                STORE(pout + k0 * c->sd_out * osz, c->out_dt, buf, m, c->sd_out);              \
            }                                                                                  \
        }                                                                                      \
    }
#define ADD_F32_(a, b) ((a) + (b))
CUMSUM_(cumsum_f32, float, LOAD_F32, STORE_F32, ADD_F32_)
CUMSUM_(cumsum_f64, double, hr_load_f64, hr_store_f64, ADD_F64_)
CUMSUM_(cumsum_i64, int64_t, hr_load_i64, hr_store_i64, ADD_I64_)

static void cumsum_chunk(const reduce_ctx *c, const char *in, int64_t si, char *out, int64_t so, int64_t cnt) {
    if (c->in_dt == HR_BF16 || c->in_dt == HR_F16)
        cumsum_f32(c, in, si, out, so, cnt);
    else if (is_float(c->in_dt) || c->in_dt == HR_F64)
        cumsum_f64(c, in, si, out, so, cnt);
    else
        cumsum_i64(c, in, si, out, so, cnt);
}

static hr_status k_cumsum(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                          int n_out) {
    return run_op(HR_OP_cumsum, in[0], ((const hr_attrs_dim *)attrs)->dim, out[0], true, cumsum_chunk);
}

void hr_cpu_register_reduce(hr_cpu_kernel_fn *table) {
    table[HR_OP_sum] = k_sum;
    table[HR_OP_mean] = k_mean;
    table[HR_OP_max] = k_max;
    table[HR_OP_min] = k_min;
    table[HR_OP_argmax] = k_argmax;
    table[HR_OP_softmax] = k_softmax;
    table[HR_OP_log_softmax] = k_log_softmax;
    table[HR_OP_cumsum] = k_cumsum;
    hr_cpu_register_reduce_topk(table);
}
