/* linear_group on the CPU: decode-sized rows go to the fused kernel
 * (k_fused_linear.c: one thread-pool pass streams every weight once, the
 * epilogue applied before anything is stored); other rows, or
 * HUBRT_FUSE=0, run the members' linear kernels and then the epilogue's
 * own kernel. Both give each output the bits of the separate ops. */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/k_fused.h"
#include "core/error.h"
#include "device/device_impl.h"
#include "ops/op_impl.h"

#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})

typedef struct group_args {
    const hr_attrs_linear_group *a;
    const hr_tensor *x, *w[HR_FUSED_MAX_LINEARS], *b[HR_FUSED_MAX_LINEARS], *res;
} group_args;

static group_args group_of(const hr_attrs_linear_group *a, const hr_tensor *const *in, int n_in) {
    group_args g = {.a = a, .x = in[0]};
    for (int j = 0; j < a->n; j++) {
        g.w[j] = in[1 + j];
        g.b[j] = a->bias ? in[1 + a->n + j] : NULL;
    }
    if (a->epilogue == HR_LINEAR_RESIDUAL) g.res = in[n_in - 1];
    return g;
}

static hr_fused_epilogue fused_epilogue(int64_t e) {
    switch (e) {
    case HR_LINEAR_SILU_MUL: return HR_FUSED_GATED;
    case HR_LINEAR_GELU_TANH_MUL: return HR_FUSED_GATED_GELU;
    case HR_LINEAR_RESIDUAL: return HR_FUSED_RESIDUAL;
    default: return HR_FUSED_STORE;
    }
}

/* The fused kernel's description of the call, or false where it does not
 * apply (prefill-sized rows, strided rows, HUBRT_FUSE=0). */
static bool fused_fits(const group_args *g, hr_tensor *const *out, hr_fused_linear *f) {
    if (!hr_fused_linears_enabled()) return false;
    *f = (hr_fused_linear){.epi = fused_epilogue(g->a->epilogue), .n = (int)g->a->n, .x = g->x, .res = g->res};
    bool one_out = g->a->epilogue != HR_LINEAR_STORE;
    for (int j = 0; j < f->n; j++) {
        /* a gated epilogue writes act(gate) * up to out[0] alone: each
         * product is checked against that output's shape */
        if (!hr_fused_linear_fits(g->x, g->w[j], g->b[j], out[one_out ? 0 : j])) return false;
        f->w[j] = g->w[j];
        f->b[j] = g->b[j];
        f->out[j] = one_out && j > 0 ? NULL : out[j];
    }
    int64_t rows, rs;
    return !g->res || hr_fused_rows(g->res, &rows, &rs);
}

static hr_status run_linear(const group_args *g, int j, hr_tensor *out) {
    hr_tensor *o[1] = {out};
    const hr_cpu_kernel_fn k = hr_cpu_kernel_table()[HR_OP_linear];
    if (g->b[j]) return k(NULL, IN_(g->x, g->w[j], g->b[j]), 3, o, 1);
    return k(NULL, IN_(g->x, g->w[j]), 2, o, 1);
}

/* A contiguous host tensor shaped like `like`, in heap memory aligned as
 * the device's buffers are (glibc keeps reusing a freed block of the same
 * size, so a prefill's repeated calls do not fault in fresh pages each
 * time, as a new device buffer of that size would). */
static hr_status scratch_like(const hr_tensor *like, hr_tensor **out) {
    size_t n = (size_t)hr_shape_numel(like->ndim, like->shape) * hr_dtype_size(like->dtype);
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    if (!p) return hr_error(HR_ERR_OOM, "linear_group: out of memory for a %zu-byte product", n);
    hr_status s = hr_tensor_wrap_host(like->dtype, like->ndim, like->shape, NULL, p, n ? n : 1, free, p, out);
    if (s != HR_OK) free(p);
    return s;
}

/* The members one by one, then the epilogue's kernel over their stored
 * products: the separate ops, with the intermediates in scratch. */
static hr_status run_unfused(const group_args *g, hr_tensor *const *out) {
    const hr_cpu_kernel_fn *table = hr_cpu_kernel_table();
    if (g->a->epilogue == HR_LINEAR_STORE) {
        for (int j = 0; j < g->a->n; j++) HR_TRY(run_linear(g, j, out[j]));
        return HR_OK;
    }
    hr_tensor *tmp = NULL;
    HR_TRY(scratch_like(out[0], &tmp));
    hr_status s;
    if (g->a->epilogue == HR_LINEAR_RESIDUAL) {
        /* res may be out[0] itself: the product goes to scratch first */
        s = run_linear(g, 0, tmp);
        if (s == HR_OK) s = table[HR_OP_add](NULL, IN_(tmp, g->res), 2, out, 1);
    } else {
        /* the gate's product in the output, the up product beside it, and
         * the activation in place (elementwise kernels read each chunk
         * before they write it) */
        s = run_linear(g, 0, out[0]);
        if (s == HR_OK) s = run_linear(g, 1, tmp);
        if (s == HR_OK && g->a->epilogue == HR_LINEAR_SILU_MUL)
            s = table[HR_OP_silu_mul](NULL, IN_(out[0], tmp), 2, out, 1);
        else if (s == HR_OK) {
            hr_attrs_gelu ga = {.approximate = HR_GELU_TANH};
            s = table[HR_OP_gelu_mul](&ga, IN_(out[0], tmp), 2, out, 1);
        }
    }
    hr_tensor_free(tmp);
    return s;
}

static hr_status k_linear_group(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                                int n_out) {
    group_args g = group_of(attrs, in, n_in);
    hr_fused_linear f;
    if (fused_fits(&g, out, &f)) return hr_cpu_fused_linear(&f);
    return run_unfused(&g, out);
}

void hr_cpu_register_linear_group(hr_cpu_kernel_fn *table) { table[HR_OP_linear_group] = k_linear_group; }
