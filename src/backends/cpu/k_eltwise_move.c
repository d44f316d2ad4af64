/* CPU kernels that move or convert data without arithmetic: copy, cast,
 * where, fill, arange; and the row conversion helpers of k_eltwise.h. */
#include <math.h>
#include <string.h>

#include "backends/cpu/k_eltwise.h"
#include "core/error.h"
#include "core/half.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

#include "backends/cpu/simd_math.h"
#define K_HAVE_AVX2 1
#else
#define K_HAVE_AVX2 0
#endif

bool hr_k_simd(void) { return K_HAVE_AVX2 && hr_cpu_isa_get() >= HR_ISA_AVX2; }

/* ---- row conversions ------------------------------------------------- */

#if K_HAVE_AVX2
static void load_bf16_avx2(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, hr_bf16x8_load(src + i));
    for (; i < n; i++) dst[i] = hr_bf16_to_f32(src[i]);
}

/* Round to nearest even with NaN kept quiet, bit for bit hr_f32_to_bf16. */
static void store_bf16_avx2(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) hr_bf16x8_store(dst + i, _mm256_loadu_ps(src + i));
    for (; i < n; i++) dst[i] = hr_f32_to_bf16(src[i]);
}

static void load_f16_avx2(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = hr_f16_to_f32(src[i]);
}

static void store_f16_avx2(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = hr_f32_to_f16(src[i]);
}
#endif

void hr_k_load_f32(float *dst, const char *src, hr_dtype dt, int64_t n, int64_t stride, bool simd) {
    if (stride == 1 && dt == HR_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#if K_HAVE_AVX2
    if (simd && stride == 1 && dt == HR_BF16) return load_bf16_avx2(dst, (const uint16_t *)src, n);
    if (simd && stride == 1 && dt == HR_F16) return load_f16_avx2(dst, (const uint16_t *)src, n);
#endif
    hr_load_f32(dst, src, dt, n, stride);
}

void hr_k_store_f32(char *dst, hr_dtype dt, const float *src, int64_t n, int64_t stride, bool simd) {
    if (stride == 1 && dt == HR_F32) {
        memmove(dst, src, (size_t)n * sizeof(float));
        return;
    }
#if K_HAVE_AVX2
    if (simd && stride == 1 && dt == HR_BF16) return store_bf16_avx2((uint16_t *)dst, src, n);
    if (simd && stride == 1 && dt == HR_F16) return store_f16_avx2((uint16_t *)dst, src, n);
#endif
    hr_store_f32(dst, dt, src, n, stride);
}

void hr_k_round_f32(float *v, hr_dtype dt, int64_t n, bool simd) {
    if (dt == HR_F32) return;
    uint16_t tmp[256];
    for (int64_t i = 0; i < n; i += 256) {
        int64_t m = n - i < 256 ? n - i : 256;
        hr_k_store_f32((char *)tmp, dt, v + i, m, 1, simd);
        hr_k_load_f32(v + i, (const char *)tmp, dt, m, 1, simd);
    }
}

/* ---- copy ------------------------------------------------------------ */

#define COPY_LOOP(T)                                                                   \
    do {                                                                               \
        T *d = (T *)dst;                                                               \
        const T *s = (const T *)src;                                                   \
        for (int64_t i = 0; i < n; i++) d[i * sd] = s[i * ss];                         \
    } while (0)

void hr_k_copy_row(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n, size_t size) {
    if (sd == 1 && ss == 1) {
        memmove(dst, src, (size_t)n * size);
        return;
    }
    switch (size) {
    case 1: COPY_LOOP(uint8_t); break;
    case 2: COPY_LOOP(uint16_t); break;
    case 4: COPY_LOOP(uint32_t); break;
    case 8: COPY_LOOP(uint64_t); break;
    default:
        for (int64_t i = 0; i < n; i++) memcpy(dst + i * sd * (int64_t)size, src + i * ss * (int64_t)size, size);
    }
}

static void row_copy(void *ctx, char *const *p, const int64_t *s, int64_t n) {
    hr_k_copy_row(p[0], s[0], p[1], s[1], n, *(const size_t *)ctx);
}

/* Transposing copies (one side contiguous along the other's second-last
 * dim) go through TILE x TILE blocks so the strided side reuses each cache
 * line it touches instead of streaming one element per line. 8 keeps a
 * tile's lines within L1 associativity when power-of-two strides map
 * them all to one set (16 was 2x slower on a 1024 x 1024 transpose). */
#define TILE 8

typedef struct {
    const hr_iter *it;
    size_t size;
    int64_t outer, blocks; /* rows of the dims before the last two; row blocks per tile row */
} tile_ctx;

#define TILE_LOOP(T)                                                                        \
    for (int64_t i = i0; i < i1; i++)                                                       \
        for (int64_t j = j0; j < j1; j++)                                                   \
            ((T *)dp)[i * sd[mid] + j * sd[last]] = ((const T *)sp)[i * ss[mid] + j * ss[last]]

static void tile_body(void *vctx, int ith, int nth) {
    const tile_ctx *c = vctx;
    const hr_iter *it = c->it;
    int last = it->ndim - 1, mid = last - 1;
    const int64_t *sd = it->strides[0], *ss = it->strides[1];
    int64_t rows = it->shape[mid], cols = it->shape[last], isz = (int64_t)c->size, b, e;
    hr_split_range(c->outer * c->blocks, ith, nth, &b, &e);
    for (int64_t w = b; w < e; w++) {
        int64_t r = w / c->blocks, i0 = w % c->blocks * TILE, i1 = i0 + TILE < rows ? i0 + TILE : rows;
        int64_t od = 0, os = 0;
        for (int d = mid - 1; d >= 0; d--) {
            int64_t k = r % it->shape[d];
            r /= it->shape[d];
            od += k * sd[d];
            os += k * ss[d];
        }
        for (int64_t j0 = 0; j0 < cols; j0 += TILE) {
            int64_t j1 = j0 + TILE < cols ? j0 + TILE : cols;
            char *dp = it->base[0] + od * isz;
            const char *sp = it->base[1] + os * isz;
            switch (c->size) {
            case 1: TILE_LOOP(uint8_t); break;
            case 2: TILE_LOOP(uint16_t); break;
            case 4: TILE_LOOP(uint32_t); break;
            default: TILE_LOOP(uint64_t); break;
            }
        }
    }
}

static bool is_transposing(const hr_iter *it) {
    if (it->ndim < 2) return false;
    int last = it->ndim - 1;
    return (it->strides[1][last - 1] == 1 && it->strides[1][last] != 1) ||
           (it->strides[0][last - 1] == 1 && it->strides[0][last] != 1);
}

void hr_k_copy_strided(const hr_tensor *dst, const hr_tensor *src, bool parallel) {
    hr_iter it;
    hr_iter_init(&it, 2, (const hr_tensor *const[]){dst, src});
    size_t size = hr_dtype_size(dst->dtype);
    if (is_transposing(&it)) {
        int64_t rows = it.shape[it.ndim - 2];
        tile_ctx c = {&it, size, it.rows / rows, (rows + TILE - 1) / TILE};
        int nth = parallel ? hr_parallel_threads_for(it.rows * it.shape[it.ndim - 1], HR_GRAIN_ELTWISE) : 1;
        if (nth > 1)
            hr_parallel_run(tile_body, &c, nth);
        else
            tile_body(&c, 0, 1);
        return;
    }
    if (parallel)
        hr_iter_parallel(&it, row_copy, &size);
    else
        hr_iter_rows(&it, 0, it.rows, row_copy, &size);
}

static hr_status k_copy(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out) {
    hr_k_copy_strided(out[0], in[0], true);
    return HR_OK;
}

/* ---- cast ------------------------------------------------------------ */

/* The widest exact intermediate: f32 between the float storage types,
 * i64 from integers (exact, and i64 -> f32 rounds once as torch does), f64
 * from f64 (float -> int then truncates toward zero, as torch does). */
typedef enum { VIA_F32, VIA_I64, VIA_F64 } cast_via;

typedef struct {
    hr_dtype from, to;
    cast_via via;
    bool simd;
} cast_ctx;

static bool is_half_or_f32(hr_dtype dt) { return dt == HR_F32 || dt == HR_BF16 || dt == HR_F16; }

static void row_cast(void *vctx, char *const *p, const int64_t *s, int64_t n) {
    const cast_ctx *c = vctx;
    size_t si = hr_dtype_size(c->from), so = hr_dtype_size(c->to);
    union {
        float f[HR_ROW_CHUNK];
        double d[HR_ROW_CHUNK];
        int64_t i[HR_ROW_CHUNK];
    } buf;
    for (int64_t off = 0; off < n; off += HR_ROW_CHUNK) {
        int64_t m = n - off < HR_ROW_CHUNK ? n - off : HR_ROW_CHUNK;
        const char *src = p[1] + off * s[1] * (int64_t)si;
        char *dst = p[0] + off * s[0] * (int64_t)so;
        switch (c->via) {
        case VIA_F32:
            hr_k_load_f32(buf.f, src, c->from, m, s[1], c->simd);
            hr_k_store_f32(dst, c->to, buf.f, m, s[0], c->simd);
            break;
        case VIA_I64:
            hr_load_i64(buf.i, src, c->from, m, s[1]);
            hr_store_i64(dst, c->to, buf.i, m, s[0]);
            break;
        case VIA_F64:
            hr_load_f64(buf.d, src, c->from, m, s[1]);
            hr_store_f64(dst, c->to, buf.d, m, s[0]);
            break;
        }
    }
}

static hr_status k_cast(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out) {
    hr_dtype from = in[0]->dtype, to = out[0]->dtype;
    if (from == to) return k_copy(attrs, in, n_in, out, n_out);
    cast_ctx c = {from, to, VIA_F64, hr_k_simd()};
    if (is_half_or_f32(from) && is_half_or_f32(to))
        c.via = VIA_F32;
    else if (!hr_dtype_is_float(from))
        c.via = VIA_I64;
    hr_iter it;
    hr_iter_init(&it, 2, (const hr_tensor *const[]){out[0], in[0]});
    hr_iter_parallel(&it, row_cast, &c);
    return HR_OK;
}

/* ---- where ----------------------------------------------------------- */

typedef struct {
    hr_dtype cond, a, b, out;
    bool same; /* a and b already have the output dtype: move bytes */
} where_ctx;

#define WHERE_LOOP(T)                                                              \
    do {                                                                           \
        T *o = (T *)p[0];                                                          \
        const T *x = (const T *)p[2], *y = (const T *)p[3];                        \
        for (int64_t i = 0; i < n; i++) o[i * s[0]] = c[i * s[1]] ? x[i * s[2]] : y[i * s[3]]; \
    } while (0)

static void row_where(void *vctx, char *const *p, const int64_t *s, int64_t n) {
    const where_ctx *w = vctx;
    const uint8_t *c = (const uint8_t *)p[1];
    if (w->same) {
        switch (hr_dtype_size(w->out)) {
        case 1: WHERE_LOOP(uint8_t); return;
        case 2: WHERE_LOOP(uint16_t); return;
        case 4: WHERE_LOOP(uint32_t); return;
        default: WHERE_LOOP(uint64_t); return;
        }
    }
    /* A 0-dim operand of another dtype: convert both through f64, which
     * holds every value of every dtype but i64 beyond 2^53 exactly. */
    double x[HR_ROW_CHUNK], y[HR_ROW_CHUNK];
    size_t so = hr_dtype_size(w->out), sa = hr_dtype_size(w->a), sb = hr_dtype_size(w->b);
    for (int64_t off = 0; off < n; off += HR_ROW_CHUNK) {
        int64_t m = n - off < HR_ROW_CHUNK ? n - off : HR_ROW_CHUNK;
        hr_load_f64(x, p[2] + off * s[2] * (int64_t)sa, w->a, m, s[2]);
        hr_load_f64(y, p[3] + off * s[3] * (int64_t)sb, w->b, m, s[3]);
        for (int64_t i = 0; i < m; i++)
            if (!c[(off + i) * s[1]]) x[i] = y[i];
        hr_store_f64(p[0] + off * s[0] * (int64_t)so, w->out, x, m, s[0]);
    }
}

static hr_status k_where(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                         int n_out) {
    where_ctx w = {in[0]->dtype, in[1]->dtype, in[2]->dtype, out[0]->dtype, false};
    w.same = w.a == w.out && w.b == w.out;
    hr_iter it;
    hr_iter_init(&it, 4, (const hr_tensor *const[]){out[0], in[0], in[1], in[2]});
    hr_iter_parallel(&it, row_where, &w);
    return HR_OK;
}

/* ---- fill and arange ---------------------------------------------------- */

typedef struct {
    char value[8]; /* one element in the output dtype */
    size_t size;
} fill_ctx;

static void row_fill(void *vctx, char *const *p, const int64_t *s, int64_t n) {
    const fill_ctx *f = vctx;
    for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0] * (int64_t)f->size, f->value, f->size);
}

static hr_status k_fill(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out) {
    const hr_attrs_fill *a = attrs;
    fill_ctx f = {.size = hr_dtype_size(out[0]->dtype)};
    double v = a->value;
    hr_store_f64(f.value, out[0]->dtype, &v, 1, 1);
    hr_iter it;
    hr_iter_init(&it, 1, (const hr_tensor *const[]){out[0]});
    hr_iter_parallel(&it, row_fill, &f);
    return HR_OK;
}

/* Values start + i * step in f64 (torch's accumulate type for arange),
 * then converted to the output dtype. */
static hr_status k_arange(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                          int n_out) {
    const hr_attrs_arange *a = attrs;
    const hr_tensor *o = out[0];
    int64_t n = o->shape[0], st = o->strides[0];
    size_t size = hr_dtype_size(o->dtype);
    char *base = hr_tensor_ptr(o);
    double buf[HR_ROW_CHUNK];
    for (int64_t off = 0; off < n; off += HR_ROW_CHUNK) {
        int64_t m = n - off < HR_ROW_CHUNK ? n - off : HR_ROW_CHUNK;
        for (int64_t i = 0; i < m; i++) buf[i] = a->start + (double)(off + i) * a->step;
        hr_store_f64(base + off * st * (int64_t)size, o->dtype, buf, m, st);
    }
    return HR_OK;
}

void hr_cpu_register_eltwise_move(hr_cpu_kernel_fn *table) {
    table[HR_OP_copy] = k_copy;
    table[HR_OP_cast] = k_cast;
    table[HR_OP_where] = k_where;
    table[HR_OP_fill] = k_fill;
    table[HR_OP_arange] = k_arange;
}
