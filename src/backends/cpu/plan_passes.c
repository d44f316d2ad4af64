/* The CPU device's plan passes, in order: linear fusion, elementwise
 * chains, then the thread counts of whatever runs. */
#include "backends/cpu/plan_passes.h"

#include <stdlib.h>
#include <string.h>

#include "backends/cpu/k_fused.h"
#include "core/error.h"

/* Elementwise chains are on unless HUBRT_FUSE_CHAINS=0. The chain gives
 * the unfused plan's bytes and measured faster wherever it applies (see
 * docs/architecture.md, Compile); a model whose step has no such run gets
 * the same plan either way. */
static bool chains_enabled(void) {
    const char *env = getenv("HUBRT_FUSE_CHAINS");
    return !env || strcmp(env, "0");
}

hr_status hr_cpu_plan_passes(hr_device *dev, hr_plan *p) {
    if (hr_fused_linears_enabled()) HR_TRY(hr_cpu_plan_fuse(p));
    if (chains_enabled()) HR_TRY(hr_cpu_plan_fuse_chains(p));
    int serial = hr_cpu_plan_threads(p);
    hr_log(HR_LOG_DEBUG, "cpu plan: %d linear groups, %d chains, %d nodes on one thread",
           hr_plan_count_subst(p, "fused_linear"), hr_plan_count_subst(p, "chain"), serial);
    return HR_OK;
}

/* Ops whose kernels may write their output over an input of the same
 * layout: output element i depends only on input elements i (the
 * eltwise kernels load a chunk before they store it at the same indices,
 * and casts do so between same-size dtypes), or on the input's own row
 * read whole before any of it is written (the norm kernels sum the row
 * first, then normalize it chunk by chunk; add_rms_norm documents its
 * outputs may alias its inputs). Copy is left out: its same-dtype rows
 * are memcpy, undefined on overlap; rope and softmax read other indices. */
bool hr_cpu_inplace_ok(hr_device *dev, hr_op op) {
    switch (op) {
    case HR_OP_add: case HR_OP_sub: case HR_OP_mul: case HR_OP_div: case HR_OP_pow:
    case HR_OP_maximum: case HR_OP_minimum: case HR_OP_neg: case HR_OP_exp: case HR_OP_log:
    case HR_OP_sqrt: case HR_OP_rsqrt: case HR_OP_abs: case HR_OP_relu: case HR_OP_sigmoid:
    case HR_OP_tanh: case HR_OP_silu: case HR_OP_gelu: case HR_OP_clamp: case HR_OP_scale:
    case HR_OP_where: case HR_OP_silu_mul: case HR_OP_gelu_mul: case HR_OP_cast:
    case HR_OP_rms_norm: case HR_OP_layer_norm: case HR_OP_add_rms_norm:
        return true;
    default:
        return false;
    }
}
