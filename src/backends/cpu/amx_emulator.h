/* A software model of the AMX tile unit (palette 1: eight tiles of up to
 * 16 rows x 64 bytes), for running the AMX kernels on CPUs without it:
 * tests check the kernels' tile shapes, strides and data layout here, and
 * on an AMX machine the same kernel source runs on the tiles themselves
 * (gemm_amx.c is compiled once for each).
 *
 * Each thread has its own tile state, as on the hardware. What the
 * hardware faults on (a tile used unconfigured, a shape mismatch in
 * tdpbf16ps, a bad configuration) stops the process with a message naming
 * the instruction: it can only be a kernel bug, and it must not pass as a
 * wrong number. Arithmetic follows TDPBF16PS's definition in the Intel SDM:
 * per row and output column, two f32 partial sums (even and odd element
 * of each pair) fused-multiply-added over the pairs with input denormals
 * read as zero and results flushed to zero, round to nearest even; their
 * sum then added to the accumulator. */
#ifndef HR_BACKENDS_CPU_AMX_EMULATOR_H
#define HR_BACKENDS_CPU_AMX_EMULATOR_H

#include <stdint.h>

/* cfg: the 64-byte LDTILECFG block (palette byte 0, colsb u16 at 16 + 2t,
 * rows u8 at 48 + t). */
void hr_amx_emu_loadconfig(const void *cfg);
void hr_amx_emu_release(void);
void hr_amx_emu_zero(int t);
/* Rows of tile t from base, `stride` bytes apart (colsb bytes each). */
void hr_amx_emu_load(int t, const void *base, int64_t stride);
void hr_amx_emu_store(int t, void *base, int64_t stride);
/* C (tile c, f32) += A (tile a, bf16 pairs) . B (tile b, bf16 pairs). */
void hr_amx_emu_dpbf16ps(int c, int a, int b);

#endif
