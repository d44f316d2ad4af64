/* CPU kernel for topk: values and i64 indices, sorted, ties in torch's
 * order.
 *
 * torch's CPU topk (TopKImpl.h) fills (value, index) pairs and runs
 * std::partial_sort when k * 64 <= n, else std::nth_element on the k-th
 * then std::sort of the first k - 1, comparing values only. Ties land where
 * libstdc++'s algorithms leave them, so they are ported step for step
 * below: the same comparisons in the same order give torch's tie order.
 * Values become int64 keys ordered like torch's comparator: NaN above
 * everything (and equal to NaN), -0 equal to +0. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/k_eltwise.h"
#include "backends/cpu/k_reduce.h"
#include "core/error.h"
#include "core/threadpool.h"

#define CHUNK 256 /* values per conversion buffer */

typedef int32_t v8i __attribute__((vector_size(32)));

static bool is_float(hr_dtype dt) { return dt == HR_F32 || dt == HR_BF16 || dt == HR_F16; }

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

static void tk_sort_heap(tk_elem *first, tk_elem *last, tk_cmp c) {
    while (last - first > 1) {
        last--;
        tk_pop_heap(first, last, last, c);
    }
}

static void tk_partial_sort(tk_elem *first, tk_elem *middle, tk_elem *last, tk_cmp c) {
    tk_heap_select(first, middle, last, c);
    tk_sort_heap(first, middle, c);
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

/* The same order from f32 bits, 8 at a time: negatives get their magnitude
 * bits flipped, -0 becomes 0, NaN the largest key. Fills q[0..n) with the
 * keys and indices base + i. */
static v8i tk_keys_v8(v8i u) {
    v8i mag = u & 0x7fffffff, nan = mag > 0x7f800000;
    v8i v = (u ^ ((u >> 31) & 0x7fffffff)) & ~(mag == 0);
    return (v & ~nan) | (nan & 0x7fffffff);
}

static void tk_fill_f32(tk_elem *q, const float *x, int64_t n, int64_t base) {
    for (int64_t i = 0; i < n; i += 8) {
        v8i u = {0};
        if (i + 8 <= n)
            memcpy(&u, x + i, sizeof u);
        else
            memcpy(&u, x + i, sizeof(float) * (size_t)(n - i));
        v8i k = tk_keys_v8(u);
        for (int64_t j = 0; j < 8 && i + j < n; j++) {
            q[i + j].key = k[j] == INT32_MAX ? INT64_MAX : k[j];
            q[i + j].idx = base + i + j;
        }
    }
}

typedef struct {
    const hr_tensor *x, *vals, *idx;
    int d;
    int64_t k, rows;
    bool largest, simd;
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

/* q[0..cnt) = (key, index) of the cnt values from index j0 of a row at px. */
static void tk_fill(const topk_ctx *c, tk_elem *q, const char *px, int64_t sd, int64_t j0, int64_t cnt) {
    const hr_tensor *x = c->x;
    const char *pj = px + j0 * sd * (int64_t)hr_dtype_size(x->dtype);
    float vf[CHUNK];
    double vd[CHUNK];
    int64_t vi[CHUNK];
    if (is_float(x->dtype)) {
        hr_k_load_f32(vf, pj, x->dtype, cnt, sd, c->simd);
        tk_fill_f32(q, vf, cnt, j0);
        return;
    }
    if (x->dtype == HR_F64) {
        hr_load_f64(vd, pj, x->dtype, cnt, sd);
        for (int64_t j = 0; j < cnt; j++) vi[j] = tk_key_f64(vd[j]);
    } else {
        hr_load_i64(vi, pj, x->dtype, cnt, sd);
    }
    for (int64_t j = 0; j < cnt; j++) {
        q[j].key = vi[j];
        q[j].idx = j0 + j;
    }
}

/* std::partial_sort's heap select without storing the rest of the row:
 * elements past the heap are only compared with its top and, when they
 * win, sifted in, exactly as __heap_select does; where the popped top
 * lands in the row never reaches the result. */
static void tk_partial_sort_row(const topk_ctx *c, tk_elem *q, const char *px, int64_t sd, int64_t n, tk_cmp cmp) {
    tk_elem buf[CHUNK];
    for (int64_t j0 = 0; j0 < c->k; j0 += CHUNK) tk_fill(c, q + j0, px, sd, j0, c->k - j0 < CHUNK ? c->k - j0 : CHUNK);
    tk_make_heap(q, q + c->k, cmp);
    for (int64_t j0 = c->k; j0 < n; j0 += CHUNK) {
        int64_t cnt = n - j0 < CHUNK ? n - j0 : CHUNK;
        tk_fill(c, buf, px, sd, j0, cnt);
        for (int64_t j = 0; j < cnt; j++)
            if (tk_before(cmp, &buf[j], q)) tk_adjust_heap(q, 0, c->k, buf[j], cmp);
    }
    tk_sort_heap(q, q + c->k, cmp);
}

static void topk_body(void *arg, int ith, int nth) {
    topk_ctx *c = arg;
    const hr_tensor *x = c->x;
    int64_t n = x->ndim ? x->shape[c->d] : 1, sd = x->ndim ? x->strides[c->d] : 0;
    int64_t svd = c->vals->ndim ? c->vals->strides[c->d] : 0, sid = c->idx->ndim ? c->idx->strides[c->d] : 0;
    int64_t b, e;
    hr_split_range(c->rows, ith, nth, &b, &e);
    if (b >= e) return;
    bool partial = c->k * 64 <= n;
    size_t isz = hr_dtype_size(x->dtype);
    tk_elem *q = malloc(sizeof(tk_elem) * (size_t)(partial ? c->k : n));
    if (!q) {
        atomic_store(&c->oom, true);
        return;
    }
    tk_cmp cmp = {c->largest};
    for (int64_t r = b; r < e; r++) {
        const char *px = (const char *)hr_tensor_ptr(x) + topk_offset(x, c->d, r) * (int64_t)isz;
        char *pv = (char *)hr_tensor_ptr(c->vals) + topk_offset(c->vals, c->d, r) * (int64_t)isz;
        int64_t *pi = (int64_t *)hr_tensor_ptr(c->idx) + topk_offset(c->idx, c->d, r);
        if (partial) {
            tk_partial_sort_row(c, q, px, sd, n, cmp);
        } else {
            for (int64_t j0 = 0; j0 < n; j0 += CHUNK) tk_fill(c, q + j0, px, sd, j0, n - j0 < CHUNK ? n - j0 : CHUNK);
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
    topk_ctx c = {.x = x, .vals = out[0], .idx = out[1], .k = a->k, .largest = a->largest, .simd = hr_k_simd()};
    atomic_init(&c.oom, false);
    if (x->ndim) c.d = (int)(a->dim < 0 ? a->dim + x->ndim : a->dim);
    int64_t n = x->ndim ? x->shape[c.d] : 1;
    c.rows = n ? hr_tensor_numel(x) / n : 0;
    if (!x->ndim) c.k = 1; /* torch: a 0-dim x is its own top-k, whatever k */
    if (c.k == 0 || c.rows == 0) return HR_OK;
    hr_parallel_run(topk_body, &c, hr_parallel_threads_for(c.rows * n, HR_GRAIN_ROWS));
    if (atomic_load(&c.oom)) return hr_error(HR_ERR_OOM, "out of memory for %lld sort slots", (long long)n);
    return HR_OK;
}

void hr_cpu_register_reduce_topk(hr_cpu_kernel_fn *table) { table[HR_OP_topk] = k_topk; }
