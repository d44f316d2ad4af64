/* gemm_amx.c's kernel against the tile emulator (amx_emulator.h): the
 * route HUBRT_AMX_EMULATE=1 selects on CPUs without AMX, so that tests
 * run the AMX kernel's tiling everywhere. One source, two builds, so the
 * emulated kernel cannot drift from the one the hardware runs. */
#define HR_AMX_EMULATED 1
#include "gemm_amx.c"
