/* CPU kernels for the reduce ops: sum, mean, max, min, argmax, softmax,
 * log_softmax, cumsum and topk over one dim.
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
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "ops/op_impl.h"

#define CHUNK 256 /* elements or positions per scratch buffer */

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
    v8f n = x * 1.44269504088896341f;
    n = (n + 12582912.0f) - 12582912.0f; /* round to nearest (1.5 * 2^23) */
    v8f r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v8f p = v8_set1(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
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

/* x[i] = exp(x[i] - m[i or 0]); m_step 0 broadcasts one max. The tail goes
 * through the vector code too, so a value does not depend on where a
 * thread's range or a chunk happened to start. */
static void exp_shift(float *x, const float *m, int64_t m_step, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f mv = m_step ? v8_load(m + i) : v8_set1(m[0]);
        v8_store(x + i, v8_exp_neg(v8_load(x + i) - mv));
    }
    if (i == n) return;
    float t[8] = {0}, tm[8] = {0};
    for (int64_t j = i; j < n; j++) {
        t[j - i] = x[j];
        tm[j - i] = m[m_step * j];
    }
    v8_store(t, v8_exp_neg(v8_load(t) - v8_load(tm)));
    for (int64_t j = i; j < n; j++) x[j] = t[j - i];
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
    int nth = hr_parallel_threads_for(work, 32768);
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

/* One position of a float reduction: n elements sd_in apart at p. */
static float reduce_vector_f32(const reduce_ctx *c, const char *p, int64_t *idx) {
    float buf[CHUNK], acc = 0;
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt);
    *idx = 0;
    for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {
        int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;
        hr_load_f32(buf, p + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in);
        if (c->op == HR_OP_sum || c->op == HR_OP_mean) {
            acc += sum_f32(buf, cnt);
            continue;
        }
        bool is_min = c->op == HR_OP_min;
        float m = extreme_f32(buf, cnt, !is_min);
        if (k0 == 0 || (is_min ? m < acc : m > acc) || (m != m && acc == acc)) {
            acc = m;
            if (c->op == HR_OP_argmax) *idx = k0 + first_index_f32(buf, cnt, m);
        }
    }
    return acc;
}

/* `cnt` adjacent positions at p at once, one row of them per step. */
static void reduce_columns_f32(const reduce_ctx *c, const char *p, int64_t cnt, float *acc, int64_t *idx) {
    float buf[CHUNK];
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt);
    hr_load_f32(acc, p, c->in_dt, cnt, 1);
    for (int64_t j = 0; j < cnt; j++) idx[j] = 0;
    for (int64_t k = 1; k < c->n; k++) {
        hr_load_f32(buf, p + k * c->sd_in * isz, c->in_dt, cnt, 1);
        if (c->op == HR_OP_sum || c->op == HR_OP_mean) {
            add_into(acc, buf, cnt);
        } else if (c->op != HR_OP_argmax) {
            extreme_into(acc, buf, cnt, c->op == HR_OP_max);
        } else {
            for (int64_t j = 0; j < cnt; j++)
                if (buf[j] > acc[j] || (buf[j] != buf[j] && acc[j] == acc[j])) {
                    acc[j] = buf[j];
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
        hr_store_f32(out, c->out_dt, acc, cnt, so);
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
    exp_shift(x, m, step, cnt);
    for (int64_t i = 0; i < cnt; i++) x[i] *= f[step * i];
}

static float softmax_factor(bool is_log, float sum) { return is_log ? logf(sum) : 1.0f / sum; }

/* One position: three passes over the n values (max, sum, write). */
static void softmax_vector(const reduce_ctx *c, const char *in, char *out) {
    float buf[CHUNK], m = 0, s = 0;
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt), osz = (int64_t)hr_dtype_size(c->out_dt);
    for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {
        int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;
        hr_load_f32(buf, in + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in);
        float cm = extreme_f32(buf, cnt, true);
        if (k0 == 0 || cm > m || cm != cm) m = cm;
    }
    for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {
        int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;
        hr_load_f32(buf, in + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in);
        exp_shift(buf, &m, 0, cnt);
        s += sum_f32(buf, cnt);
    }
    bool is_log = c->op == HR_OP_log_softmax;
    float f = softmax_factor(is_log, s);
    for (int64_t k0 = 0; k0 < c->n; k0 += CHUNK) {
        int64_t cnt = c->n - k0 < CHUNK ? c->n - k0 : CHUNK;
        hr_load_f32(buf, in + k0 * c->sd_in * isz, c->in_dt, cnt, c->sd_in);
        softmax_finish(is_log, buf, &m, &f, 0, cnt);
        hr_store_f32(out + k0 * c->sd_out * osz, c->out_dt, buf, cnt, c->sd_out);
    }
}

/* cnt adjacent positions (input contiguous across them), same passes. */
static void softmax_columns(const reduce_ctx *c, const char *in, char *out, int64_t so, int64_t cnt) {
    float buf[CHUNK], m[CHUNK], s[CHUNK];
    int64_t isz = (int64_t)hr_dtype_size(c->in_dt), osz = (int64_t)hr_dtype_size(c->out_dt);
    hr_load_f32(m, in, c->in_dt, cnt, 1);
    for (int64_t k = 1; k < c->n; k++) {
        hr_load_f32(buf, in + k * c->sd_in * isz, c->in_dt, cnt, 1);
        extreme_into(m, buf, cnt, true);
    }
    memset(s, 0, sizeof(float) * (size_t)cnt);
    for (int64_t k = 0; k < c->n; k++) {
        hr_load_f32(buf, in + k * c->sd_in * isz, c->in_dt, cnt, 1);
        exp_shift(buf, m, 1, cnt);
        add_into(s, buf, cnt);
    }
    bool is_log = c->op == HR_OP_log_softmax;
    for (int64_t j = 0; j < cnt; j++) s[j] = softmax_factor(is_log, s[j]);
    for (int64_t k = 0; k < c->n; k++) {
        hr_load_f32(buf, in + k * c->sd_in * isz, c->in_dt, cnt, 1);
        softmax_finish(is_log, buf, m, s, 1, cnt);
        hr_store_f32(out + k * c->sd_out * osz, c->out_dt, buf, cnt, so);
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
CUMSUM_(cumsum_f32, float, hr_load_f32, hr_store_f32, ADD_F32_)
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

/* ---- topk ------------------------------------------------------------------ */

/* torch's CPU topk (TopKImpl.h) fills (value, index) pairs and runs
 * std::partial_sort when k * 64 <= n, else std::nth_element on the k-th
 * then std::sort of the first k - 1, comparing values only. Ties land where
 * libstdc++'s algorithms leave them, so they are ported step for step
 * below: the same comparisons in the same order give torch's tie order.
 * Values become int64 keys ordered like torch's comparator: NaN above
 * everything (and equal to NaN), -0 equal to +0. */
typedef struct {
    int64_t key, idx;
} tk_elem;

typedef struct {
    bool largest;
} tk_cmp;

static inline bool tk_before(tk_cmp c, const tk_elem *a, const tk_elem *b) {
    return c.largest ? a->key > b->key : a->key < b->key;
}

static inline void tk_swap(tk_elem *a, tk_elem *b) {
    tk_elem t = *a;
    *a = *b;
    *b = t;
}

static void tk_push_heap(tk_elem *first, int64_t hole, int64_t top, tk_elem value, tk_cmp c) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && tk_before(c, &first[parent], &value)) {
        first[hole] = first[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    first[hole] = value;
}

static void tk_adjust_heap(tk_elem *first, int64_t hole, int64_t len, tk_elem value, tk_cmp c) {
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (tk_before(c, &first[child], &first[child - 1])) child--;
        first[hole] = first[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        first[hole] = first[child - 1];
        hole = child - 1;
    }
    tk_push_heap(first, hole, top, value, c);
}

static void tk_pop_heap(tk_elem *first, tk_elem *last, tk_elem *result, tk_cmp c) {
    tk_elem value = *result;
    *result = *first;
    tk_adjust_heap(first, 0, last - first, value, c);
}

static void tk_make_heap(tk_elem *first, tk_elem *last, tk_cmp c) {
    int64_t len = last - first;
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        tk_adjust_heap(first, parent, len, first[parent], c);
        if (parent == 0) return;
    }
}

static void tk_heap_select(tk_elem *first, tk_elem *middle, tk_elem *last, tk_cmp c) {
    tk_make_heap(first, middle, c);
    for (tk_elem *i = middle; i < last; i++)
        if (tk_before(c, i, first)) tk_pop_heap(first, middle, i, c);
}

static void tk_partial_sort(tk_elem *first, tk_elem *middle, tk_elem *last, tk_cmp c) {
    tk_heap_select(first, middle, last, c);
    while (middle - first > 1) {
        middle--;
        tk_pop_heap(first, middle, middle, c);
    }
}

static void tk_move_median_to_first(tk_elem *result, tk_elem *a, tk_elem *b, tk_elem *cc, tk_cmp c) {
    if (tk_before(c, a, b)) {
        if (tk_before(c, b, cc))
            tk_swap(result, b);
        else if (tk_before(c, a, cc))
            tk_swap(result, cc);
        else
            tk_swap(result, a);
    } else if (tk_before(c, a, cc)) {
        tk_swap(result, a);
    } else if (tk_before(c, b, cc)) {
        tk_swap(result, cc);
    } else {
        tk_swap(result, b);
    }
}

static tk_elem *tk_unguarded_partition(tk_elem *first, tk_elem *last, tk_elem *pivot, tk_cmp c) {
    for (;;) {
        while (tk_before(c, first, pivot)) first++;
        last--;
        while (tk_before(c, pivot, last)) last--;
        if (!(first < last)) return first;
        tk_swap(first, last);
        first++;
    }
}

static tk_elem *tk_partition_pivot(tk_elem *first, tk_elem *last, tk_cmp c) {
    tk_elem *mid = first + (last - first) / 2;
    tk_move_median_to_first(first, first + 1, mid, last - 1, c);
    return tk_unguarded_partition(first + 1, last, first, c);
}

static void tk_unguarded_linear_insert(tk_elem *last, tk_cmp c) {
    tk_elem val = *last;
    tk_elem *next = last - 1;
    while (tk_before(c, &val, next)) {
        *last = *next;
        last = next;
        next--;
    }
    *last = val;
}

static void tk_insertion_sort(tk_elem *first, tk_elem *last, tk_cmp c) {
    if (first == last) return;
    for (tk_elem *i = first + 1; i != last; i++) {
        if (tk_before(c, i, first)) {
            tk_elem val = *i;
            memmove(first + 1, first, sizeof(tk_elem) * (size_t)(i - first));
            *first = val;
        } else {
            tk_unguarded_linear_insert(i, c);
        }
    }
}

static int64_t tk_lg(int64_t n) { return 63 - __builtin_clzll((unsigned long long)n); }

enum { TK_THRESHOLD = 16 };

static void tk_introsort_loop(tk_elem *first, tk_elem *last, int64_t depth, tk_cmp c) {
    while (last - first > TK_THRESHOLD) {
        if (depth == 0) {
            tk_partial_sort(first, last, last, c);
            return;
        }
        depth--;
        tk_elem *cut = tk_partition_pivot(first, last, c);
        tk_introsort_loop(cut, last, depth, c);
        last = cut;
    }
}

static void tk_sort(tk_elem *first, tk_elem *last, tk_cmp c) {
    if (first == last) return;
    tk_introsort_loop(first, last, tk_lg(last - first) * 2, c);
    if (last - first > TK_THRESHOLD) {
        tk_insertion_sort(first, first + TK_THRESHOLD, c);
        for (tk_elem *i = first + TK_THRESHOLD; i != last; i++) tk_unguarded_linear_insert(i, c);
    } else {
        tk_insertion_sort(first, last, c);
    }
}

static void tk_nth_element(tk_elem *first, tk_elem *nth, tk_elem *last, tk_cmp c) {
    if (first == last || nth == last) return;
    int64_t depth = tk_lg(last - first) * 2;
    while (last - first > 3) {
        if (depth == 0) {
            tk_heap_select(first, nth + 1, last, c);
            tk_swap(first, nth);
            return;
        }
        depth--;
        tk_elem *cut = tk_partition_pivot(first, last, c);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    tk_insertion_sort(first, last, c);
}

static int64_t tk_key_f64(double v) {
    if (v != v) return INT64_MAX;
    if (v == 0) return 0;
    int64_t b;
    memcpy(&b, &v, sizeof b);
    return b >= 0 ? b : b ^ INT64_MAX;
}

typedef struct {
    const hr_tensor *x, *vals, *idx;
    int d;
    int64_t k, rows;
    bool largest;
    atomic_bool oom;
} topk_ctx;

/* Element offset of position r (over all dims but d) in t. */
static int64_t topk_offset(const hr_tensor *t, int d, int64_t r) {
    int64_t off = 0;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (i == d) continue;
        off += (r % t->shape[i]) * t->strides[i];
        r /= t->shape[i];
    }
    return off;
}

static void topk_body(void *arg, int ith, int nth) {
    topk_ctx *c = arg;
    const hr_tensor *x = c->x;
    int64_t n = x->ndim ? x->shape[c->d] : 1, sd = x->ndim ? x->strides[c->d] : 0;
    int64_t svd = c->vals->ndim ? c->vals->strides[c->d] : 0, sid = c->idx->ndim ? c->idx->strides[c->d] : 0;
    int64_t b, e;
    hr_split_range(c->rows, ith, nth, &b, &e);
    if (b >= e) return;
    bool flt = x->dtype == HR_F64 || is_float(x->dtype);
    size_t isz = hr_dtype_size(x->dtype);
    tk_elem *q = malloc(sizeof(tk_elem) * (size_t)n);
    if (!q) {
        atomic_store(&c->oom, true);
        return;
    }
    tk_cmp cmp = {c->largest};
    for (int64_t r = b; r < e; r++) {
        const char *px = (const char *)hr_tensor_ptr(x) + topk_offset(x, c->d, r) * (int64_t)isz;
        char *pv = (char *)hr_tensor_ptr(c->vals) + topk_offset(c->vals, c->d, r) * (int64_t)isz;
        int64_t *pi = (int64_t *)hr_tensor_ptr(c->idx) + topk_offset(c->idx, c->d, r);
        for (int64_t j = 0; j < n; j++) {
            const char *pj = px + j * sd * (int64_t)isz;
            if (flt) {
                double v;
                hr_load_f64(&v, pj, x->dtype, 1, 1);
                q[j].key = tk_key_f64(v);
            } else {
                hr_load_i64(&q[j].key, pj, x->dtype, 1, 1);
            }
            q[j].idx = j;
        }
        if (c->k * 64 <= n) {
            tk_partial_sort(q, q + c->k, q + n, cmp);
        } else {
            tk_nth_element(q, q + c->k - 1, q + n, cmp);
            tk_sort(q, q + c->k - 1, cmp);
        }
        for (int64_t j = 0; j < c->k; j++) {
            memcpy(pv + j * svd * (int64_t)isz, px + q[j].idx * sd * (int64_t)isz, isz);
            pi[j * sid] = q[j].idx;
        }
    }
    free(q);
}

static hr_status k_topk(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out) {
    const hr_attrs_topk *a = attrs;
    const hr_tensor *x = in[0];
    topk_ctx c = {.x = x, .vals = out[0], .idx = out[1], .k = a->k, .largest = a->largest};
    atomic_init(&c.oom, false);
    if (x->ndim) c.d = (int)(a->dim < 0 ? a->dim + x->ndim : a->dim);
    int64_t n = x->ndim ? x->shape[c.d] : 1;
    c.rows = n ? hr_tensor_numel(x) / n : 0;
    if (a->k == 0 || c.rows == 0) return HR_OK;
    hr_parallel_run(topk_body, &c, hr_parallel_threads_for(c.rows * n, 16384));
    if (atomic_load(&c.oom)) return hr_error(HR_ERR_OOM, "out of memory for %lld sort slots", (long long)n);
    return HR_OK;
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
    table[HR_OP_topk] = k_topk;
}
