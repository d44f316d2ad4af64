/* Linear weights (bf16; f16 for the AVX2 kernel) packed once into K-pair
 * panels (gemm.h's panel layout): the panel route then serves every row
 * count from the same bytes, with no transposes per call, and the panels
 * stream from memory contiguously.
 * The packed copy lives beside the weight in its buffer; the weight's own
 * bytes stay as they were for every other reader (embedding rows, a
 * device copy, another ISA). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backends/cpu/gemm.h"
#include "backends/cpu/linear_pack.h"
#include "core/anon_map.h"
#include "core/mem_budget.h"
#include "core/error.h"
#include "core/iter.h"
#include "core/threadpool.h"
#include "hubrt/ops.h"

/* Panels packed between two chunk_done calls: 1024 weight rows (2 MiB at
 * K = 1024), what the loader's peak memory exceeds the weights by. */
#define CHUNK_UNITS 16

static bool packable(const hr_tensor *w) {
    return w && w->ndim == 2 && w->shape[0] > 0 && w->shape[1] > 0 && w->strides[1] == 1 &&
           w->strides[0] == w->shape[1] && w->buf->device == hr_device_cpu() && hr_gemm_use_panels_for(w->dtype);
}

size_t hr_linear_pack_bytes(const hr_tensor *w) {
    if (!packable(w)) return 0;
    return (size_t)((w->shape[0] + HR_GEMM_PANEL_N - 1) / HR_GEMM_PANEL_N) * hr_gemm_panel_bytes(w->shape[1]);
}

typedef struct pack_ctx {
    const uint16_t *w;
    int64_t n, k, u0, units;
    uint32_t *dst;
    bool avx512, f16;
} pack_ctx;

static void pack_worker(void *arg, int ith, int nth) {
    const pack_ctx *c = arg;
    int64_t b, e;
    hr_split_range(c->units, ith, nth, &b, &e);
    for (int64_t u = c->u0 + b; u < c->u0 + e; u++) {
        int64_t j0 = u * HR_GEMM_PANEL_N;
        int nj = c->n - j0 < HR_GEMM_PANEL_N ? (int)(c->n - j0) : HR_GEMM_PANEL_N;
        uint32_t *panel = (uint32_t *)hr_gemm_panel_at(c->dst, c->k, u);
        if (c->avx512)
            hr_gemm_pack_panel(c->w + j0 * c->k, c->k, nj, c->k, panel);
        else
            hr_gemm_pack_panel_avx2(c->w + j0 * c->k, c->k, nj, c->k, panel);
        if (c->f16) hr_gemm_panel_split_f16(panel, c->k);
    }
}

hr_status hr_linear_pack_into(const hr_tensor *w, void *dst, void (*release)(void *), void *ctx,
                              void (*chunk_done)(void *arg, const void *src, size_t n), void *arg) {
    if (!hr_linear_pack_bytes(w))
        return hr_error(HR_ERR_UNSUPPORTED, "linear pack: weight '%s' is not a contiguous 2-D bf16 tensor on "
                        "a CPU (and ISA setting) with AVX2 or more, nor an f16 one where AVX-512 BF16 is not in use",
                        hr_tensor_name(w));
    hr_packed_weight *p = calloc(1, sizeof *p);
    if (!p) return hr_error(HR_ERR_OOM, "linear pack: out of memory");
    pack_ctx c = {.w = hr_tensor_ptr(w), .n = w->shape[0], .k = w->shape[1], .dst = dst,
                  .avx512 = hr_gemm_use_avx512_bf16(), .f16 = w->dtype == HR_F16};
    int64_t units = (c.n + HR_GEMM_PANEL_N - 1) / HR_GEMM_PANEL_N;
    size_t row_bytes = (size_t)c.k * 2;
    for (c.u0 = 0; c.u0 < units; c.u0 += CHUNK_UNITS) {
        c.units = units - c.u0 < CHUNK_UNITS ? units - c.u0 : CHUNK_UNITS;
        int nth = hr_parallel_threads_for(c.units, 1);
        hr_parallel_run(pack_worker, &c, nth);
        if (chunk_done) {
            int64_t r0 = c.u0 * HR_GEMM_PANEL_N, r1 = (c.u0 + c.units) * HR_GEMM_PANEL_N;
            if (r1 > c.n) r1 = c.n;
            chunk_done(arg, (const char *)c.w + (size_t)r0 * row_bytes, (size_t)(r1 - r0) * row_bytes);
        }
    }
    *p = (hr_packed_weight){.offset = w->offset, .n = c.n, .k = c.k, .dt = w->dtype, .data = dst,
                            .release = release, .release_ctx = ctx};
    hr_buffer_drop_packed(w->buf);
    atomic_store_explicit(&w->buf->packed, p, memory_order_release);
    return HR_OK;
}

const uint32_t *hr_linear_panels(const hr_tensor *w) {
    const hr_buffer *b = w->buf->origin ? w->buf->origin : w->buf;
    const hr_packed_weight *p = atomic_load_explicit(&b->packed, memory_order_acquire);
    if (!p || p->offset != w->offset || w->dtype != p->dt || w->ndim != 2 || w->shape[0] != p->n ||
        w->shape[1] != p->k || w->strides[0] != p->k || w->strides[1] != 1)
        return NULL;
    return p->data;
}

/* ---- hr_linear_pack: one mapping per weight ---- */

typedef struct own_map {
    void *addr;
    size_t len;
} own_map;

static void own_release(void *ctx) {
    own_map *m = ctx;
    munmap(m->addr, m->len);
    hr_mem_release(m->len);
    free(m);
}

hr_status hr_linear_pack(hr_tensor *weight, bool *packed) {
    if (!weight || !packed) return hr_error(HR_ERR_INVALID_ARG, "hr_linear_pack: weight or packed is NULL");
    *packed = false;
    size_t bytes = hr_linear_pack_bytes(weight);
    if (!bytes) return HR_OK;
    /* whole huge pages when there is one to fill: the panels stream on every call */
    bool huge = bytes >= HR_HUGE_PAGE;
    size_t align = huge ? HR_HUGE_PAGE : 4096, len = (bytes + align - 1) / align * align;
    HR_TRY(hr_mem_reserve(len, "hr_linear_pack"));
    own_map *m = malloc(sizeof *m);
    void *addr = !m ? NULL : huge ? hr_anon_map_huge(len) : hr_anon_map_aligned(len, align);
    if (!addr) {
        free(m);
        hr_mem_release(len);
        return hr_error(HR_ERR_OOM, "hr_linear_pack: cannot map %zu bytes for weight '%s'", len,
                        hr_tensor_name(weight));
    }
    *m = (own_map){addr, len};
    hr_status s = hr_linear_pack_into(weight, addr, own_release, m, NULL, NULL);
    if (s != HR_OK) {
        own_release(m);
        return s;
    }
    *packed = true;
    return HR_OK;
}
