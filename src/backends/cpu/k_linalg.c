/* CPU kernels for the linalg ops: matmul and linear map their tensors onto
 * one batched GEMM description (gemm.h); no operand is copied or
 * transposed, whatever its strides. */
#include "backends/cpu/gemm.h"
#include "backends/cpu/k_fused.h"
#include "backends/cpu/k_linear_quant.h"
#include "backends/cpu/linear_pack.h"
#include "core/error.h"
#include "ops/op_impl.h"

/* Sets batch dim d of operand `which` from tensor t's dims aligned to the
 * right of C's batch dims (stride 0 where t broadcasts). */
static void batch_strides(int nb, const hr_tensor *t, int t_batch, int64_t *out) {
    for (int d = 0; d < nb; d++) {
        int i = d - (nb - t_batch);
        out[d] = i >= 0 && t->shape[i] != 1 ? t->strides[i] : 0;
    }
}

/* Folds trailing batch dims into M where B is shared and A and C rows
 * continue evenly across them: [b, s, k] @ W^T becomes one tall GEMM. */
static void fold_batch(hr_gemm *g) {
    int n = 0;
    for (int d = 0; d < g->nb; d++) {
        if (g->bshape[d] == 1) continue;
        g->bshape[n] = g->bshape[d];
        g->bstride_a[n] = g->bstride_a[d];
        g->bstride_b[n] = g->bstride_b[d];
        g->bstride_c[n] = g->bstride_c[d];
        n++;
    }
    g->nb = n;
    while (g->nb > 0) {
        int d = g->nb - 1;
        int64_t sa = g->bstride_a[d], sc = g->bstride_c[d];
        if (g->bstride_b[d] != 0) break;
        if (g->m == 1) {
            g->a.rs = sa;
            g->c.rs = sc;
        } else if (sa != g->m * g->a.rs || sc != g->m * g->c.rs) {
            break;
        }
        g->m *= g->bshape[d];
        g->nb--;
    }
}

static hr_gemm_mat mat_of(const hr_tensor *t, int64_t rs, int64_t cs) {
    return (hr_gemm_mat){.base = hr_tensor_ptr(t), .dt = t->dtype, .rs = rs, .cs = cs};
}

/* a [..., m, k] or [k]; b [..., k, n] or [k]; out per torch.matmul. */
static hr_status k_matmul(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                          int n_out) {
    const hr_tensor *a = in[0], *b = in[1];
    hr_tensor *c = out[0];
    bool a2 = a->ndim >= 2, b2 = b->ndim >= 2;
    hr_gemm g = {0};
    g.k = a->shape[a->ndim - 1];
    g.m = a2 ? a->shape[a->ndim - 2] : 1;
    g.n = b2 ? b->shape[b->ndim - 1] : 1;
    g.nb = c->ndim - a2 - b2;
    for (int d = 0; d < g.nb; d++) g.bshape[d] = c->shape[d];
    batch_strides(g.nb, a, a2 ? a->ndim - 2 : 0, g.bstride_a);
    batch_strides(g.nb, b, b2 ? b->ndim - 2 : 0, g.bstride_b);
    for (int d = 0; d < g.nb; d++) g.bstride_c[d] = g.bshape[d] != 1 ? c->strides[d] : 0;
    g.a = mat_of(a, a2 ? a->strides[a->ndim - 2] : 0, a->strides[a->ndim - 1]);
    g.b = b2 ? mat_of(b, b->strides[b->ndim - 2], b->strides[b->ndim - 1]) : mat_of(b, b->strides[0], 0);
    g.c = mat_of(c, a2 ? c->strides[g.nb] : 0, b2 ? c->strides[c->ndim - 1] : 0);
    fold_batch(&g);
    return hr_gemm_run(&g);
}

/* x [..., in], weight [out, in] (HF layout, read as B = weight^T),
 * bias [out] -> [..., out] */
static hr_status k_linear(const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                          int n_out) {
    const hr_tensor *x = in[0], *w = in[1], *bias = n_in > 2 ? in[2] : NULL;
    hr_tensor *c = out[0];
    if (hr_dtype_is_quantized(w->dtype)) return hr_cpu_linear_quant(x, w, bias, c);
    bool x2 = x->ndim >= 2;
    hr_gemm g = {0};
    g.k = w->shape[1];
    g.n = w->shape[0];
    g.m = x2 ? x->shape[x->ndim - 2] : 1;
    g.nb = x2 ? x->ndim - 2 : 0;
    for (int d = 0; d < g.nb; d++) {
        g.bshape[d] = x->shape[d];
        g.bstride_a[d] = x->strides[d];
        g.bstride_c[d] = c->strides[d];
    }
    g.a = mat_of(x, x2 ? x->strides[x->ndim - 2] : 0, x->strides[x->ndim - 1]);
    g.b = mat_of(w, w->strides[1], w->strides[0]);
    g.b_panels = hr_linear_panels(w);
    g.c = mat_of(c, x2 ? c->strides[c->ndim - 2] : 0, c->strides[c->ndim - 1]);
    if (bias) {
        g.bias = hr_tensor_ptr(bias);
        g.bias_dt = bias->dtype;
        g.bias_s = bias->strides[0];
    }
    fold_batch(&g);
    return hr_gemm_run(&g);
}

void hr_cpu_register_linalg(hr_cpu_kernel_fn *table) {
    table[HR_OP_matmul] = k_matmul;
    table[HR_OP_linear] = k_linear;
    hr_cpu_register_linear_group(table);
}
