/* The AMX tile unit in software (see amx_emulator.h). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/amx_emulator.h"

#define TILES 8
#define MAX_ROWS 16
#define MAX_COLSB 64

typedef struct tile_state {
    bool configured;
    uint8_t rows[TILES];
    uint16_t colsb[TILES];
    uint8_t data[TILES][MAX_ROWS][MAX_COLSB];
} tile_state;

static _Thread_local tile_state t_tiles;

/* What the hardware raises an exception for: a kernel bug, never input. */
static _Noreturn void fault(const char *insn, int t, const char *why) {
    fprintf(stderr, "hubrt: emulated AMX fault: %s tmm%d: %s\n", insn, t, why);
    abort();
}

static void check_tile(const char *insn, int t) {
    if (t < 0 || t >= TILES) fault(insn, t, "no such tile");
    if (!t_tiles.configured) fault(insn, t, "tiles not configured (no ldtilecfg)");
    if (!t_tiles.rows[t] || !t_tiles.colsb[t]) fault(insn, t, "tile not configured");
}

void hr_amx_emu_loadconfig(const void *cfg) {
    const uint8_t *c = cfg;
    if (c[0] == 0) { /* palette 0: the init state */
        hr_amx_emu_release();
        return;
    }
    if (c[0] != 1) fault("ldtilecfg", -1, "palette is not 1");
    for (int i = 2; i < 16; i++)
        if (c[i]) fault("ldtilecfg", -1, "reserved bytes are not zero");
    tile_state s = {.configured = true};
    for (int t = 0; t < TILES; t++) {
        uint16_t colsb;
        memcpy(&colsb, c + 16 + 2 * t, 2);
        uint8_t rows = c[48 + t];
        if (rows > MAX_ROWS || colsb > MAX_COLSB || (rows == 0) != (colsb == 0))
            fault("ldtilecfg", t, "rows or bytes per row out of range");
        s.rows[t] = rows;
        s.colsb[t] = colsb;
    }
    for (int t = TILES; t < 16; t++) {
        uint16_t colsb;
        memcpy(&colsb, c + 16 + 2 * t, 2);
        if (colsb || c[48 + t]) fault("ldtilecfg", t, "palette 1 has eight tiles");
    }
    t_tiles = s; /* loading a configuration zeroes every tile */
}

void hr_amx_emu_release(void) { memset(&t_tiles, 0, sizeof t_tiles); }

void hr_amx_emu_zero(int t) {
    check_tile("tilezero", t);
    memset(t_tiles.data[t], 0, sizeof t_tiles.data[t]);
}

void hr_amx_emu_load(int t, const void *base, int64_t stride) {
    check_tile("tileloadd", t);
    memset(t_tiles.data[t], 0, sizeof t_tiles.data[t]);
    for (int r = 0; r < t_tiles.rows[t]; r++)
        memcpy(t_tiles.data[t][r], (const char *)base + r * stride, t_tiles.colsb[t]);
}

void hr_amx_emu_store(int t, void *base, int64_t stride) {
    check_tile("tilestored", t);
    for (int r = 0; r < t_tiles.rows[t]; r++) memcpy((char *)base + r * stride, t_tiles.data[t][r], t_tiles.colsb[t]);
}

/* A bf16 as f32, denormals read as zero. */
static float bf16_daz(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t)h << 16;
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float ftz(float f) { return fpclassify(f) == FP_SUBNORMAL ? copysignf(0.0f, f) : f; }

void hr_amx_emu_dpbf16ps(int c, int a, int b) {
    check_tile("tdpbf16ps", c);
    check_tile("tdpbf16ps", a);
    check_tile("tdpbf16ps", b);
    if (c == a || c == b || a == b) fault("tdpbf16ps", c, "operands must be three different tiles");
    const tile_state *s = &t_tiles;
    if (s->rows[c] != s->rows[a]) fault("tdpbf16ps", a, "A's rows differ from C's");
    if (s->colsb[c] != s->colsb[b]) fault("tdpbf16ps", b, "B's bytes per row differ from C's");
    if (s->colsb[a] / 4 != s->rows[b] || s->colsb[a] % 4) fault("tdpbf16ps", b, "A's pairs per row differ from B's rows");
    int pairs = s->colsb[a] / 4, cols = s->colsb[c] / 4;
    for (int m = 0; m < s->rows[c]; m++) {
        for (int n = 0; n < cols; n++) {
            float even = 0.0f, odd = 0.0f;
            for (int k = 0; k < pairs; k++) {
                const uint8_t *ap = t_tiles.data[a][m] + 4 * k, *bp = t_tiles.data[b][k] + 4 * n;
                even = ftz(fmaf(bf16_daz(ap), bf16_daz(bp), even));
                odd = ftz(fmaf(bf16_daz(ap + 2), bf16_daz(bp + 2), odd));
            }
            float acc;
            memcpy(&acc, t_tiles.data[c][m] + 4 * n, 4);
            acc = ftz(ftz(acc) + ftz(even + odd));
            memcpy(t_tiles.data[c][m] + 4 * n, &acc, 4);
        }
    }
}
