/* The panel route's AMX kernel (gemm_amx.c) on the tile emulator, and on
 * the tiles themselves where the CPU has them: rows 1..32 of x (ldx apart)
 * against panels packed as the loader packs them, for K blocks of 32, is
 * the exact sum (small integers: exact in any order) and, with
 * full-mantissa values, within f32 rounding of the double sum; y rows past
 * `rows` are left alone. The emulator's own rules: load/store shapes and
 * strides, denormal inputs read as zero, tdpbf16ps's pair layout against
 * a hand-computed tile, and a shape mismatch stops the process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/cpu/amx_emulator.h"
#include "backends/cpu/gemm.h"
#include "core/half.h"
#include "hubrt.h"

static uint32_t next(uint32_t *seed) { return *seed = *seed * 1664525u + 1013904223u; }

static float value(uint32_t *seed, bool wide) {
    return wide ? (float)((int32_t)next(seed) >> 8) / 8388608.0f : (float)((int)(next(seed) >> 24) % 7 - 3);
}

/* Weight rows [0, nj) (k elements each) as one panel, written here from
 * gemm.h's description of the layout rather than by the library's packer
 * (AVX-512 only): the pair p of row j is u32 p * 64 + j, low half the even
 * element; rows past nj and an odd K's last partner are zero. */
static uint32_t *pack_panel(const uint16_t *w, int nj, int64_t k) {
    uint32_t *panel = aligned_alloc(64, hr_gemm_panel_bytes(k) + 64);
    memset(panel, 0, hr_gemm_panel_bytes(k) + 64);
    for (int j = 0; j < nj; j++)
        for (int64_t p = 0; p < (k + 1) / 2; p++) {
            uint32_t lo = w[j * k + 2 * p], hi = 2 * p + 1 < k ? w[j * k + 2 * p + 1] : 0;
            panel[p * HR_GEMM_PANEL_N + j] = lo | hi << 16;
        }
    return panel;
}

static void config(int t, int rows, int colsb, uint8_t cfg[64]) {
    cfg[0] = 1;
    memcpy(cfg + 16 + 2 * t, &(uint16_t){(uint16_t)colsb}, 2);
    cfg[48 + t] = (uint8_t)rows;
}

/* C[m][n] += sum over pairs of A[m] pair k . B[k] pair n, from tiles
 * loaded with strides; a denormal input counts as zero. */
static void test_emulator_dp_layout(void **state) {
    (void)state;
    uint8_t cfg[64] = {0};
    config(0, 3, 8, cfg);  /* C: 3 x 2 f32 */
    config(1, 3, 12, cfg); /* A: 3 x 3 pairs */
    config(2, 3, 8, cfg);  /* B: 3 pairs x 2 columns */
    hr_amx_emu_loadconfig(cfg);
    uint16_t a[3][8], b[3][4]; /* rows wider than the tiles: strides */
    float av[3][6], bv[3][4];
    uint32_t seed = 5;
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < 8; e++) {
            float v = value(&seed, false);
            a[m][e] = hr_f32_to_bf16(v);
            if (e < 6) av[m][e] = v;
        }
    for (int k = 0; k < 3; k++)
        for (int e = 0; e < 4; e++) {
            bv[k][e] = value(&seed, false);
            b[k][e] = hr_f32_to_bf16(bv[k][e]);
        }
    a[1][3] = 0x0001; /* a denormal bf16: read as zero */
    av[1][3] = 0.0f;
    float c[3][5];
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 5; n++) c[m][n] = (float)(10 * m + n);
    hr_amx_emu_load(0, c, sizeof c[0]);
    hr_amx_emu_load(1, a, sizeof a[0]);
    hr_amx_emu_load(2, b, sizeof b[0]);
    hr_amx_emu_dpbf16ps(0, 1, 2);
    float out[3][5];
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 5; n++) out[m][n] = -1.0f;
    hr_amx_emu_store(0, out, sizeof out[0]);
    for (int m = 0; m < 3; m++) {
        for (int n = 0; n < 2; n++) {
            float want = c[m][n];
            for (int k = 0; k < 3; k++) want += av[m][2 * k] * bv[k][2 * n] + av[m][2 * k + 1] * bv[k][2 * n + 1];
            assert_float_equal(out[m][n], want, 0.0f);
        }
        for (int n = 2; n < 5; n++) assert_float_equal(out[m][n], -1.0f, 0.0f); /* past colsb */
    }
    hr_amx_emu_zero(0);
    hr_amx_emu_store(0, out, sizeof out[0]);
    assert_float_equal(out[2][1], 0.0f, 0.0f);
    hr_amx_emu_release();
}

/* Runs fn in a child process: it must die by abort (the emulated fault). */
static void expect_fault(void (*fn)(void)) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fn();
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

static void dp_shape_mismatch(void) {
    uint8_t cfg[64] = {0};
    config(0, 2, 64, cfg);
    config(1, 3, 64, cfg); /* A has 3 rows, C 2 */
    config(2, 16, 64, cfg);
    hr_amx_emu_loadconfig(cfg);
    hr_amx_emu_dpbf16ps(0, 1, 2);
}

static void load_unconfigured(void) {
    uint8_t row[64] = {0};
    hr_amx_emu_release();
    hr_amx_emu_load(3, row, 64);
}

static void test_emulator_faults(void **state) {
    (void)state;
    expect_fault(dp_shape_mismatch);
    expect_fault(load_unconfigured);
}

/* Runs the kernel over rows x k against a panel of nj weight rows and
 * checks every y value and the sentinel rows past `rows`. */
static void check_kernel(hr_gemm_amx_fn kernel, int rows, int64_t k, int nj, bool wide) {
    int64_t ldx = k + 40; /* x rows apart, wider than K */
    uint32_t seed = (uint32_t)(rows * 1000 + k + nj + wide);
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(rows * ldx)), *w = malloc(sizeof(uint16_t) * (size_t)(nj * k));
    float *xv = malloc(sizeof(float) * (size_t)(rows * k)), *wv = malloc(sizeof(float) * (size_t)(nj * k));
    for (int r = 0; r < rows; r++)
        for (int64_t p = 0; p < ldx; p++) {
            float v = p < k ? value(&seed, wide) : NAN; /* past K: never read */
            x[r * ldx + p] = hr_f32_to_bf16(v);
            if (p < k) xv[r * k + p] = hr_bf16_to_f32(x[r * ldx + p]);
        }
    for (int64_t i = 0; i < nj * k; i++) {
        w[i] = hr_f32_to_bf16(value(&seed, wide));
        wv[i] = hr_bf16_to_f32(w[i]);
    }
    uint32_t *panel = pack_panel(w, nj, k);
    float *y = malloc(sizeof(float) * HR_GEMM_AMX_ROWS * HR_GEMM_PANEL_N);
    for (int i = 0; i < HR_GEMM_AMX_ROWS * HR_GEMM_PANEL_N; i++) y[i] = 12345.0f;
    kernel(rows, k, x, ldx, panel, y, (const char *)w, (size_t)(nj * k * 2));
    int bad = 0;
    for (int r = 0; r < HR_GEMM_AMX_ROWS; r++)
        for (int j = 0; j < HR_GEMM_PANEL_N; j++) {
            float got = y[r * HR_GEMM_PANEL_N + j];
            if (r >= rows) {
                bad += got != 12345.0f;
                continue;
            }
            double s = 0, mag = 0;
            for (int64_t p = 0; j < nj && p < k; p++) {
                s += (double)xv[r * k + p] * wv[j * k + p];
                mag += fabs((double)xv[r * k + p] * wv[j * k + p]);
            }
            /* f32 sums of k products: k / 16 ulps of the magnitudes' sum */
            double tol = wide ? mag * 6e-8 * (double)(k / 16 + 2) : 0.0;
            bad += !(fabs(got - s) <= tol);
        }
    if (bad) print_error("amx kernel rows %d k %lld nj %d wide %d: %d wrong\n", rows, (long long)k, nj, wide, bad);
    assert_int_equal(bad, 0);
    free(x), free(w), free(xv), free(wv), free(panel), free(y);
}

/* Rows around the two A tiles (16 each), K from none to 128 tile steps,
 * a full panel and one of 37 weight rows. */
static void check_shapes(hr_gemm_amx_fn kernel) {
    static const int rows[] = {1, 2, 6, 15, 16, 17, 31, 32};
    static const int64_t ks[] = {0, 32, 64, 96, 1024, 4096};
    for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
            check_kernel(kernel, rows[ri], ks[ki], ri % 2 ? 64 : 37, false);
            check_kernel(kernel, rows[ri], ks[ki], 64, true);
        }
}

static void test_kernel_emulated(void **state) {
    (void)state;
    check_shapes(hr_gemm_amx_rows_emulated);
}

/* On a CPU with AMX, the tiles themselves. */
static void test_kernel_hardware(void **state) {
    (void)state;
    const hr_cpu_features *f = hr_cpu_features_get();
    if (!(f->amx_bf16 && f->amx_usable)) skip();
    check_shapes(hr_gemm_amx_rows);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_emulator_dp_layout),
        cmocka_unit_test(test_emulator_faults),
        cmocka_unit_test(test_kernel_emulated),
        cmocka_unit_test(test_kernel_hardware),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
