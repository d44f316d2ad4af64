/* Linear weights packed once into the panel layout the CPU linear kernels
 * read (gemm_panel.c), kept beside the weight in its buffer
 * (hr_packed_weight): by the model loader for every linear weight, and by
 * hr_linear_pack for any. */
#ifndef HR_BACKENDS_CPU_LINEAR_PACK_H
#define HR_BACKENDS_CPU_LINEAR_PACK_H

#include "core/tensor_impl.h"

/* Bytes w's packed copy takes (a multiple of 64), or 0 when w is not
 * packed: not a contiguous 2-D tensor in the CPU device's memory, or not
 * of a dtype the panel kernels in use read (hr_gemm_use_panels_for: bf16
 * from AVX2 on, f16 where AVX-512 BF16 is not in use). */
size_t hr_linear_pack_bytes(const hr_tensor *w);

/* Packs w into dst (hr_linear_pack_bytes(w) bytes, 64-byte aligned) and
 * attaches it to w's buffer in place of any earlier copy; release(ctx),
 * when not NULL, is called once the buffer lets go of it. chunk_done(arg,
 * src, n), when not NULL, is told of each range of w's bytes as packing is
 * done reading it (the model loader drops those file pages as it goes). */
hr_status hr_linear_pack_into(const hr_tensor *w, void *dst, void (*release)(void *), void *ctx,
                              void (*chunk_done)(void *arg, const void *src, size_t n), void *arg);

/* w's panels, when its buffer holds a packed copy of exactly w (same
 * offset, shape and row-major strides), else NULL. */
const uint32_t *hr_linear_panels(const hr_tensor *w);

#endif
