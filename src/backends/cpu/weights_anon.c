/* The CPU device's prepare_weights (weights_anon.h).
 * Weights copied at load from the checkpoint's file map into one anonymous
 * mapping with transparent huge pages. THP serves anonymous memory only
 * (here in "madvise" mode), never file pages, and the hardware prefetchers
 * stop at page boundaries: decode streams every weight once per token, and
 * 2 MiB pages read faster than 4 KiB ones. Linear weights go there packed
 * for the CPU linear kernels (linear_pack.h) instead of as they are: the
 * tensor stays a view of the file, whose pages nothing reads again. Each
 * chunk's file pages are dropped once copied or packed, so peak memory
 * stays at the weights plus a chunk. Weights the loader made itself (cast
 * to another dtype, dequantized) stay where they lie, collapsed into huge
 * pages, and linear ones among them get a packed copy beside them when
 * that fits in the bytes the cast saved (pack_owned). HUBRT_WEIGHTS=mmap
 * keeps the zero-copy views of the files; HUBRT_PACK_WEIGHTS=0 copies
 * linear weights as they are. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backends/cpu/linear_pack.h"
#include "backends/cpu/weights_anon.h"
#include "core/anon_map.h"
#include "core/mem_budget.h"
#include "core/error.h"

#define ANON_ALIGN ((size_t)64)
/* Bytes copied between two drops of file pages: what peak memory exceeds
 * the weights by. */
#define ANON_CHUNK ((size_t)2 << 20)
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older headers lack it */
#endif

typedef struct anon_map {
    atomic_int refs; /* one per tensor over it, one for the copy in progress */
    void *addr;
    size_t len;
} anon_map;

static void anon_release(void *ctx) {
    anon_map *a = ctx;
    if (atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) != 1) return;
    munmap(a->addr, a->len);
    hr_mem_release(a->len);
    free(a);
}

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* A mapping of `bytes` rounded up to whole huge pages, its one reference
 * the caller's, counted against the allocation ceiling. */
static hr_status anon_map_new(size_t bytes, const char *what, anon_map **out) {
    size_t len = align_up(bytes, HR_HUGE_PAGE);
    HR_TRY(hr_mem_reserve(len, what));
    anon_map *a = malloc(sizeof *a);
    void *addr = a ? hr_anon_map_huge(len) : NULL;
    if (!addr) {
        free(a);
        hr_mem_release(len);
        return hr_error(HR_ERR_OOM, "%s: cannot map %zu bytes of anonymous memory", what, len);
    }
    atomic_init(&a->refs, 1);
    a->addr = addr;
    a->len = len;
    *out = a;
    return HR_OK;
}

/* A weight handle and the bytes of its packed copy when it is packed for
 * linear (linear_pack.h) instead of copied; 0 when copied. */
typedef struct weight_slot {
    hr_tensor **t;
    size_t packed;
} weight_slot;

/* The weights that view the files (in_files) or that the loader owns
 * (!in_files), into slots (NULL: only count them), with the bytes their
 * copies take. Linear weights are packed when `pack_linear` and the CPU
 * has the kernels. */
static size_t weight_slots(const hr_weight_ref *w, size_t n_w, const hr_weight_source *src, bool in_files,
                           bool pack_linear, weight_slot *slots, size_t *bytes) {
    size_t n = 0;
    *bytes = 0;
    for (size_t i = 0; i < n_w; i++) {
        hr_tensor *t = *w[i].slot;
        if (!t || !hr_tensor_is_contiguous(t) || hr_tensor_nbytes(t) == 0 ||
            src->drop_pages(src->ctx, hr_tensor_ptr(t), 0) != in_files)
            continue;
        size_t packed = pack_linear && w[i].linear ? hr_linear_pack_bytes(t) : 0;
        if (slots) slots[n] = (weight_slot){w[i].slot, packed};
        n++;
        *bytes += align_up(packed ? packed : hr_tensor_nbytes(t), ANON_ALIGN);
    }
    return n;
}

/* *slot's bytes into dst, file pages dropped chunk by chunk, then *slot
 * replaced by a tensor over dst. */
static hr_status move_weight(const hr_weight_source *src_files, anon_map *a, char *dst, hr_tensor **slot) {
    hr_tensor *t = *slot;
    const char *src = hr_tensor_ptr(t);
    size_t n = hr_tensor_nbytes(t);
    for (size_t off = 0; off < n; off += ANON_CHUNK) {
        size_t c = n - off < ANON_CHUNK ? n - off : ANON_CHUNK;
        memcpy(dst + off, src + off, c);
        src_files->drop_pages(src_files->ctx, src + off, c);
    }
    hr_tensor *moved = NULL;
    HR_TRY(hr_tensor_wrap_host(t->dtype, t->ndim, t->shape, NULL, dst, n, anon_release, a, &moved));
    atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
    hr_tensor_set_name(moved, hr_tensor_name(t));
    hr_tensor_free(t);
    *slot = moved;
    return HR_OK;
}

static void drop_chunk(void *arg, const void *p, size_t n) {
    const hr_weight_source *src = arg;
    src->drop_pages(src->ctx, p, n);
}

/* t packed into dst beside its bytes: a file view's pages are dropped
 * chunk by chunk (linear reads the panels, nothing reads the file again),
 * a weight the loader made stays as it is. */
static hr_status pack_weight(const hr_weight_source *src, anon_map *a, char *dst, const hr_tensor *t) {
    HR_TRY(hr_linear_pack_into(t, dst, anon_release, a, drop_chunk, (void *)src));
    atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
    return HR_OK;
}

static hr_status weights_mode_copy(bool *copy) {
    const char *e = getenv("HUBRT_WEIGHTS");
    *copy = !e || !*e || !strcmp(e, "copy");
    if (*copy || !strcmp(e, "mmap")) return HR_OK;
    return hr_error(HR_ERR_INVALID_ARG, "HUBRT_WEIGHTS=%s: expected 'copy' or 'mmap'", e);
}

static hr_status pack_mode(bool *pack) {
    const char *e = getenv("HUBRT_PACK_WEIGHTS");
    *pack = !e || !*e || !strcmp(e, "1");
    if (*pack || !strcmp(e, "0")) return HR_OK;
    return hr_error(HR_ERR_INVALID_ARG, "HUBRT_PACK_WEIGHTS=%s: expected '1' or '0'", e);
}

/* The weights the loader made itself (cast, dequantized), with the bytes
 * of the packed copies of linear ones when `pack` (*n of them; free()). */
static hr_status owned_slots(const hr_weight_ref *w, size_t n_w, const hr_weight_source *src, bool pack,
                             weight_slot **slots, size_t *n) {
    size_t bytes;
    *n = weight_slots(w, n_w, src, false, pack, NULL, &bytes);
    *slots = *n ? malloc(*n * sizeof **slots) : NULL;
    if (*n && !*slots) return hr_error(HR_ERR_OOM, "weights: out of memory listing %zu weights", *n);
    weight_slots(w, n_w, src, false, pack, *slots, &bytes);
    return HR_OK;
}

/* Whether an owned weight's packed copy fits in what making it saved: its
 * bytes in the checkpoint are at least twice its own (an f32 checkpoint
 * run in bf16), so the weight and the copy (its bytes again, and the
 * padding of its last panel) stay within the checkpoint's size. Weights
 * cast from f16 or dequantized from GGUF blocks kept or grew their size,
 * and are read as they are. The weight itself stays for its other readers
 * (embedding rows, another ISA setting, a device copy). */
static bool owned_pack_fits(const hr_weight_source *src, const hr_tensor *t) {
    return src->stored_bytes(src->ctx, hr_tensor_name(t)) >= 2 * hr_tensor_nbytes(t);
}

/* Packed copies of the owned linear weights that owned_pack_fits, in one
 * anonymous huge-page mapping: the cast checkpoint's linears then take
 * the panel route as a bf16 checkpoint's do (Qwen3-0.6B shape from f32,
 * run in bf16: see docs/architecture.md). */
static hr_status pack_owned(const hr_weight_ref *w, size_t n_w, const hr_weight_source *src) {
    weight_slot *slots;
    size_t n, bytes = 0;
    HR_TRY(owned_slots(w, n_w, src, true, &slots, &n));
    size_t count = 0, over = 0;
    for (size_t i = 0; i < n; i++) {
        if (slots[i].packed && !owned_pack_fits(src, *slots[i].t)) slots[i].packed = 0, over++;
        count += slots[i].packed > 0;
        bytes += align_up(slots[i].packed, ANON_ALIGN);
    }
    if (over) HR_LOG_DEBUG("weights: %zu cast or dequantized linear weights read as they are: a packed copy "
                           "would outgrow their bytes in the checkpoint", over);
    if (!bytes) {
        free(slots);
        return HR_OK;
    }
    anon_map *a = NULL;
    hr_status ms = anon_map_new(bytes, "weights: packed copy", &a);
    if (ms != HR_OK) {
        free(slots);
        return ms;
    }
    hr_status s = HR_OK;
    char *dst = a->addr;
    for (size_t i = 0; i < n && s == HR_OK; i++) {
        if (!slots[i].packed) continue;
        s = pack_weight(src, a, dst, *slots[i].t);
        dst += align_up(slots[i].packed, ANON_ALIGN);
    }
    anon_release(a);
    free(slots);
    if (s == HR_OK) HR_LOG_DEBUG("weights: packed %zu cast or dequantized linear weights (%zu bytes)", count, bytes);
    return s;
}

/* The device writes its buffers through 4 KiB pages (cpu_device.c says
 * why), so a weight the loader cast or dequantized sits in small pages:
 * each whole huge page of it is collapsed in place, a huge page at a time
 * (MADV_COLLAPSE, Linux 6.1+; elsewhere the weight stays as it is). A
 * weight with a packed copy is left alone: linear reads the copy. */
static hr_status collapse_owned(const hr_weight_ref *w, size_t n_w, const hr_weight_source *src) {
    weight_slot *slots;
    size_t n;
    HR_TRY(owned_slots(w, n_w, src, false, &slots, &n));
    for (size_t i = 0; i < n; i++) {
        if (hr_linear_panels(*slots[i].t)) continue;
        size_t p = (size_t)hr_tensor_ptr(*slots[i].t), end = p + hr_tensor_nbytes(*slots[i].t);
        size_t lo = align_up(p, HR_HUGE_PAGE), hi = end / HR_HUGE_PAGE * HR_HUGE_PAGE;
        if (hi <= lo) continue;
        madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
        madvise((void *)lo, hi - lo, MADV_COLLAPSE);
    }
    free(slots);
    return HR_OK;
}

/* The file pages of the owned weights' stored bytes, which the cast read
 * (and dropped) but reading their neighbours may have mapped again
 * (fault-around): nothing reads them now. */
static hr_status drop_owned_sources(const hr_weight_ref *w, size_t n_w, const hr_weight_source *src) {
    weight_slot *slots;
    size_t n;
    HR_TRY(owned_slots(w, n_w, src, false, &slots, &n));
    for (size_t i = 0; i < n; i++) src->drop_tensor(src->ctx, hr_tensor_name(*slots[i].t));
    free(slots);
    return HR_OK;
}

/* The weights that view the checkpoint's files, copied or packed into one
 * anonymous huge-page mapping. */
static hr_status file_weights_to_anon(const hr_weight_ref *w, size_t n_w, const hr_weight_source *files, bool pack) {
    size_t bytes;
    size_t n = weight_slots(w, n_w, files, true, pack, NULL, &bytes);
    if (!n) return HR_OK;
    weight_slot *slots = malloc(n * sizeof *slots);
    const char **src = malloc(n * sizeof *src);
    size_t *src_n = malloc(n * sizeof *src_n);
    anon_map *a = NULL;
    hr_status ms = slots && src && src_n ? anon_map_new(bytes, "weights: anonymous copy", &a)
                                         : hr_error(HR_ERR_OOM, "weights: out of memory");
    if (ms != HR_OK) {
        free(slots);
        free(src);
        free(src_n);
        return ms;
    }
    weight_slots(w, n_w, files, true, pack, slots, &bytes);
    hr_status s = HR_OK;
    char *dst = a->addr;
    for (size_t i = 0; i < n && s == HR_OK; i++) {
        src[i] = hr_tensor_ptr(*slots[i].t);
        src_n[i] = hr_tensor_nbytes(*slots[i].t);
        s = slots[i].packed ? pack_weight(files, a, dst, *slots[i].t) : move_weight(files, a, dst, slots[i].t);
        dst += align_up(slots[i].packed ? slots[i].packed : src_n[i], ANON_ALIGN);
    }
    /* Reading a page maps its cached neighbours too (fault-around), so the
     * drops during the copy leave some pages mapped: once more, now that
     * nothing reads them. */
    for (size_t i = 0; i < n && s == HR_OK; i++) files->drop_pages(files->ctx, src[i], src_n[i]);
    anon_release(a);
    free(slots);
    free(src);
    free(src_n);
    return s == HR_OK ? HR_OK : hr_error_context(s, "copying weights to anonymous memory");
}

hr_status hr_cpu_prepare_weights(hr_device *dev, hr_weight_ref *w, size_t n, const hr_weight_source *src) {
    bool copy, pack;
    HR_TRY(weights_mode_copy(&copy));
    HR_TRY(pack_mode(&pack));
    if (!copy) return HR_OK;
    if (pack) HR_TRY(pack_owned(w, n, src));
    HR_TRY(collapse_owned(w, n, src));
    HR_TRY(file_weights_to_anon(w, n, src, pack));
    return drop_owned_sources(w, n, src);
}
