/* Weights copied at load from the checkpoint's file map into one anonymous
 * mapping with transparent huge pages. THP serves anonymous memory only
 * (here in "madvise" mode), never file pages, and the hardware prefetchers
 * stop at page boundaries: decode streams every weight once per token, and
 * 2 MiB pages read faster than 4 KiB ones. Linear weights go there packed
 * for the CPU linear kernels (linear_pack.h) instead of as they are: the
 * tensor stays a view of the file, whose pages nothing reads again. Each
 * chunk's file pages are dropped once copied or packed, so peak memory
 * stays at the weights plus a chunk. Weights the loader made itself (cast
 * to another dtype, dequantized) are collapsed into huge pages where they
 * lie. HUBRT_WEIGHTS=mmap keeps the zero-copy views of the files;
 * HUBRT_PACK_WEIGHTS=0 copies linear weights as they are. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backends/cpu/linear_pack.h"
#include "core/anon_map.h"
#include "core/error.h"
#include "io/st_internal.h"
#include "models/weights_anon.h"

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
    free(a);
}

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* A weight handle and the bytes of its packed copy when it is packed for
 * linear (linear_pack.h) instead of copied; 0 when copied. */
typedef struct weight_slot {
    hr_tensor **t;
    size_t packed;
} weight_slot;

/* The model's weight handles that view a checkpoint file (in_files) or
 * that the loader owns (!in_files), into slots (NULL: only count them),
 * with the bytes their copies take. Linear weights (the layers' 2-D ones,
 * lm_head, and the embedding when lm_head is tied to it) are packed when
 * `pack_linear` and the CPU has the kernels; a tied lm_head is the
 * embedding's alias and is redone afterwards. */
static size_t weight_slots(hr_model *m, bool in_files, bool pack_linear, weight_slot *slots, size_t *bytes) {
    size_t n = 0;
    *bytes = 0;
#define SLOT_(t, linear)                                                                          \
    if ((t) && hr_tensor_is_contiguous(t) && hr_tensor_nbytes(t) > 0 &&                          \
        hr_checkpoint_drop_pages(m->ckpt, hr_tensor_ptr(t), 0) == in_files) {                     \
        size_t packed = pack_linear && (linear) ? hr_linear_pack_bytes(t) : 0;                    \
        if (slots) slots[n] = (weight_slot){&(t), packed};                                        \
        n++;                                                                                      \
        *bytes += align_up(packed ? packed : hr_tensor_nbytes(t), ANON_ALIGN);                   \
    }
    SLOT_(m->embed, m->cfg.tie_word_embeddings)
    SLOT_(m->final_norm, false)
    if (!m->cfg.tie_word_embeddings) SLOT_(m->lm_head, true)
    for (int64_t i = 0; i < m->cfg.n_layers; i++) {
        hr_layer_weights *lw = &m->layers[i];
#define FIELD_(f) SLOT_(lw->f, lw->f->ndim == 2)
        HR_LAYER_WEIGHT_FIELDS(FIELD_)
#undef FIELD_
    }
#undef SLOT_
    return n;
}

/* *slot's bytes into dst, file pages dropped chunk by chunk, then *slot
 * replaced by a tensor over dst. */
static hr_status move_weight(hr_model *m, anon_map *a, char *dst, hr_tensor **slot) {
    hr_tensor *t = *slot;
    const char *src = hr_tensor_ptr(t);
    size_t n = hr_tensor_nbytes(t);
    for (size_t off = 0; off < n; off += ANON_CHUNK) {
        size_t c = n - off < ANON_CHUNK ? n - off : ANON_CHUNK;
        memcpy(dst + off, src + off, c);
        hr_checkpoint_drop_pages(m->ckpt, src + off, c);
    }
    hr_tensor *moved = NULL;
    HR_TRY(hr_tensor_wrap_host(t->dtype, t->ndim, t->shape, NULL, dst, n, anon_release, a, &moved));
    atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
    hr_tensor_set_name(moved, hr_tensor_name(t));
    hr_tensor_free(t);
    *slot = moved;
    return HR_OK;
}

static void drop_chunk(void *ckpt, const void *src, size_t n) { hr_checkpoint_drop_pages(ckpt, src, n); }

/* t packed into dst beside its file view, whose pages are dropped chunk by
 * chunk: linear reads the panels, nothing reads the file again. */
static hr_status pack_weight(hr_model *m, anon_map *a, char *dst, const hr_tensor *t) {
    HR_TRY(hr_linear_pack_into(t, dst, anon_release, a, drop_chunk, m->ckpt));
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

/* The device writes its buffers through 4 KiB pages (cpu_device.c says
 * why), so a weight the loader cast or dequantized sits in small pages:
 * each whole huge page of it is collapsed in place, a huge page at a time
 * (MADV_COLLAPSE, Linux 6.1+; elsewhere the weight stays as it is). */
static hr_status collapse_owned(hr_model *m) {
    size_t bytes;
    size_t n = weight_slots(m, false, false, NULL, &bytes);
    weight_slot *slots = n ? malloc(n * sizeof *slots) : NULL;
    if (n && !slots) return hr_error(HR_ERR_OOM, "weights: out of memory listing %zu weights", n);
    weight_slots(m, false, false, slots, &bytes);
    for (size_t i = 0; i < n; i++) {
        size_t p = (size_t)hr_tensor_ptr(*slots[i].t), end = p + hr_tensor_nbytes(*slots[i].t);
        size_t lo = align_up(p, HR_HUGE_PAGE), hi = end / HR_HUGE_PAGE * HR_HUGE_PAGE;
        if (hi <= lo) continue;
        madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
        madvise((void *)lo, hi - lo, MADV_COLLAPSE);
    }
    free(slots);
    return HR_OK;
}

hr_status hr_model_weights_to_anon(hr_model *m) {
    bool copy, pack;
    HR_TRY(weights_mode_copy(&copy));
    HR_TRY(pack_mode(&pack));
    if (!copy || m->dev != hr_device_cpu()) return HR_OK;
    HR_TRY(collapse_owned(m));
    size_t bytes;
    size_t n = weight_slots(m, true, pack, NULL, &bytes);
    if (!n) return HR_OK;
    weight_slot *slots = malloc(n * sizeof *slots);
    const char **src = malloc(n * sizeof *src);
    size_t *src_n = malloc(n * sizeof *src_n);
    anon_map *a = malloc(sizeof *a);
    size_t len = align_up(bytes, HR_HUGE_PAGE);
    void *addr = slots && src && src_n && a ? hr_anon_map_huge(len) : NULL;
    if (!addr) {
        free(slots);
        free(src);
        free(src_n);
        free(a);
        return hr_error(HR_ERR_OOM, "weights: cannot map %zu bytes of anonymous memory", len);
    }
    atomic_init(&a->refs, 1);
    a->addr = addr;
    a->len = len;
    weight_slots(m, true, pack, slots, &bytes);
    hr_status s = HR_OK;
    char *dst = addr;
    for (size_t i = 0; i < n && s == HR_OK; i++) {
        src[i] = hr_tensor_ptr(*slots[i].t);
        src_n[i] = hr_tensor_nbytes(*slots[i].t);
        s = slots[i].packed ? pack_weight(m, a, dst, *slots[i].t) : move_weight(m, a, dst, slots[i].t);
        dst += align_up(slots[i].packed ? slots[i].packed : src_n[i], ANON_ALIGN);
    }
    /* Reading a page maps its cached neighbours too (fault-around), so the
     * drops during the copy leave some pages mapped: once more, now that
     * nothing reads them. */
    for (size_t i = 0; i < n && s == HR_OK; i++) hr_checkpoint_drop_pages(m->ckpt, src[i], src_n[i]);
    if (s == HR_OK && m->cfg.tie_word_embeddings) {
        hr_tensor_free(m->lm_head);
        m->lm_head = NULL;
        s = hr_tensor_alias(m->embed, &m->lm_head);
    }
    anon_release(a);
    free(slots);
    free(src);
    free(src_n);
    return s == HR_OK ? HR_OK : hr_error_context(s, "copying weights to anonymous memory");
}
