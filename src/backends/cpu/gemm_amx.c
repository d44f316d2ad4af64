/* The panel route's AMX kernel: rows (1..32) of bf16 x against one K-pair
 * panel of 64 weight rows (gemm.h: [K/2][64] u32, the pair p of weight row
 * j at p * 64 + j), over K's first k32 elements (a multiple of 32).
 *
 * Sixteen pairs of sixteen weight rows of a panel are an AMX B tile as
 * they lie: 16 rows of 64 bytes, 256 bytes apart (one row of the panel is
 * 64 pairs). So the panels packed once at load serve the AVX-512 and the
 * AMX kernels alike, and nothing is packed per call: x's rows are A tiles
 * in place (16 rows of 32 bf16, ldx elements apart). C is 32 x 32 per
 * pass, two A tiles by two B tiles into four accumulators (the eight tile
 * registers); the panel's halves of 32 weight rows are two passes, the
 * second reading x again from L1/L2.
 *
 * Each sum runs over K in the same order whatever the row count, so a row
 * gets the same bits in a batch of 1 or of 500 (as on the AVX-512 path).
 *
 * This file is compiled twice: as is for the tile hardware, and included
 * by gemm_amx_emulated.c with HR_AMX_EMULATED set, against the tile
 * emulator (amx_emulator.h), which is how the kernel is checked on
 * machines without AMX. */
#include <string.h>

#include "backends/cpu/gemm.h"

#ifdef HR_AMX_EMULATED
#include "backends/cpu/amx_emulator.h"
#define TILE_CONFIG(cfg) hr_amx_emu_loadconfig(cfg)
#define TILE_RELEASE() hr_amx_emu_release()
#define TILE_ZERO(t) hr_amx_emu_zero(t)
#define TILE_LOAD(t, p, s) hr_amx_emu_load(t, p, s)
#define TILE_STORE(t, p, s) hr_amx_emu_store(t, p, s)
#define TILE_DP(c, a, b) hr_amx_emu_dpbf16ps(c, a, b)
#define KERNEL hr_gemm_amx_rows_emulated
#define TARGET_
#else
#include <immintrin.h>
#define TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define TILE_RELEASE() _tile_release()
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, p, s) _tile_loadd(t, p, s)
#define TILE_STORE(t, p, s) _tile_stored(t, p, s)
#define TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define KERNEL hr_gemm_amx_rows
#define TARGET_ __attribute__((target("amx-tile,amx-bf16")))
#endif

#define PN HR_GEMM_PANEL_N

/* LDTILECFG's 64-byte block, palette 1. */
typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles: C rows 0-15 x columns 0-15 / 16-31 in 0 / 1, rows 16-31 in 2 / 3;
 * A rows 0-15 in 4, rows 16-31 in 5; B columns 0-15 in 6, 16-31 in 7. */
static void config_for(tile_config *c, int rows) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
    int r0 = rows < 16 ? rows : 16, r1 = rows - r0;
    static const int lo[] = {0, 1, 4}, hi[] = {2, 3, 5};
    for (int i = 0; i < 3; i++) {
        c->rows[lo[i]] = (uint8_t)r0;
        c->colsb[lo[i]] = 64;
        if (r1) {
            c->rows[hi[i]] = (uint8_t)r1;
            c->colsb[hi[i]] = 64;
        }
    }
    for (int t = 6; t < 8; t++) {
        c->rows[t] = 16;
        c->colsb[t] = 64;
    }
}

/* y[r][0..64) = x row r . panel over K [0, k32), r < rows; y rows PN
 * floats apart. The lines [pf, pf + pf_len) (the next unit's panel, or
 * none) are prefetched across the K steps. The tile configuration is
 * loaded on entry and released on return: another library in the process
 * (oneDNN under torch) may configure the tiles between two calls. */
TARGET_ void KERNEL(int rows, int64_t k32, const uint16_t *x, int64_t ldx, const uint32_t *panel, float *y,
                    const char *pf, size_t pf_len) {
    tile_config cfg;
    config_for(&cfg, rows);
    TILE_CONFIG(&cfg);
    bool two = rows > 16;
    long sx = (long)ldx * 2;
    const char *x0 = (const char *)x, *x1 = x0 + 16 * sx;
    int64_t steps = k32 / 32, lines = (int64_t)(pf_len / 64), per = steps ? (lines + 2 * steps - 1) / (2 * steps) : 0;
    const char *pf_end = pf ? pf + pf_len : pf;
    for (int h = 0; h < 2; h++) {
        TILE_ZERO(0);
        TILE_ZERO(1);
        if (two) {
            TILE_ZERO(2);
            TILE_ZERO(3);
        }
        const uint32_t *b = panel + 32 * h;
        for (int64_t t = 0; t < steps; t++, b += 16 * PN) {
            TILE_LOAD(6, b, PN * 4);
            TILE_LOAD(7, b + 16, PN * 4);
            TILE_LOAD(4, x0 + 64 * t, sx);
            TILE_DP(0, 4, 6);
            TILE_DP(1, 4, 7);
            if (two) {
                TILE_LOAD(5, x1 + 64 * t, sx);
                TILE_DP(2, 5, 6);
                TILE_DP(3, 5, 7);
            }
            for (int64_t i = 0; i < per && pf < pf_end; i++, pf += 64) __builtin_prefetch(pf, 0, 2);
        }
        float *yh = y + 32 * h;
        TILE_STORE(0, yh, PN * 4);
        TILE_STORE(1, yh + 16, PN * 4);
        if (two) {
            TILE_STORE(2, yh + 16 * PN, PN * 4);
            TILE_STORE(3, yh + 16 * PN + 16, PN * 4);
        }
    }
    TILE_RELEASE();
    /* the tile intrinsics are asm statements without a memory clobber: y's
     * stores must not be assumed away by code inlined around this */
    __asm__ volatile("" ::: "memory");
}
