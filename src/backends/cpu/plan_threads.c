/* The threading plan: each node's thread count, decided once at build
 * from its work, as the CPU kernel would decide at each call (the same
 * work measure and grain through hr_parallel_threads_for). At replay the
 * count is set around the node (hr_parallel_plan_set), so a node planned
 * on one thread never touches the pool, whatever its kernel asks for.
 * The grains are the kernels' own (HR_GRAIN_*, core/threadpool.h); a work
 * measure here that drifts from its kernel's changes how many threads
 * run, never a result: kernels give the same bytes for any thread count. */
#include "backends/cpu/plan_passes.h"

#include <stdlib.h>
#include <string.h>

#include "backends/cpu/k_fused.h"
#include "core/threadpool.h"
#include "hubrt/runtime.h"


static int64_t numel(const hr_tensor *t) { return hr_shape_numel(t->ndim, t->shape); }

static const hr_tensor *t_at(const hr_plan *p, const hr_plan_node *n, int k) {
    return &p->tensors[n->first_tensor + k];
}

/* Threads for a substitution: linears by their multiply-adds, a chain by
 * its output. */
static int subst_threads(const hr_plan_subst *f) {
    if (!strcmp(f->kind, "chain")) return hr_parallel_threads_for(numel(f->out[0]), HR_GRAIN_ELTWISE);
    const hr_fused_linear *k = f->ctx;
    int64_t kdim = k->x->shape[k->x->ndim - 1], rows = kdim ? numel(k->x) / kdim : 0, work = 0;
    for (int j = 0; j < k->n; j++) work += k->w[j]->shape[0];
    return hr_parallel_threads_for(rows * work * kdim, HR_GRAIN_MATMUL);
}

/* The node's thread count, or 0 for an op not modelled here (its kernel
 * decides at each call). */
static int node_threads(const hr_plan *p, const hr_plan_node *n) {
    if (n->subst) return subst_threads(&p->subst[n->subst - 1]);
    const hr_tensor *in0 = n->n_in ? t_at(p, n, 0) : NULL, *out0 = t_at(p, n, n->n_in);
    switch (n->op) {
    case HR_OP_sum: case HR_OP_mean: case HR_OP_max: case HR_OP_min: case HR_OP_argmax:
    case HR_OP_softmax: case HR_OP_log_softmax: case HR_OP_cumsum:
        return hr_parallel_threads_for(numel(in0), HR_GRAIN_ELTWISE);
    case HR_OP_topk:
    case HR_OP_rms_norm: case HR_OP_layer_norm: case HR_OP_add_rms_norm: case HR_OP_rope:
        return hr_parallel_threads_for(numel(in0), HR_GRAIN_ROWS);
    case HR_OP_rope_cos_sin:
        return hr_parallel_threads_for(numel(out0) / 2, HR_GRAIN_COS_SIN);
    case HR_OP_index_copy:
        return hr_parallel_threads_for(numel(t_at(p, n, 2)), HR_GRAIN_ELTWISE);
    case HR_OP_linear_group: {
        /* as the fused kernel counts its work: every member's columns */
        const hr_attrs_linear_group *a = (const void *)n->attrs;
        int64_t kdim = in0->shape[in0->ndim - 1], cols = 0;
        for (int j = 0; j < a->n; j++) cols += t_at(p, n, 1 + (int)j)->shape[0];
        return hr_parallel_threads_for((kdim ? numel(in0) / kdim : 0) * cols * kdim, HR_GRAIN_MATMUL);
    }
    case HR_OP_linear: case HR_OP_matmul:
        return hr_parallel_threads_for(numel(out0) * in0->shape[in0->ndim - 1], HR_GRAIN_MATMUL);
    case HR_OP_sdpa: {
        /* b * hq * s queries, each over t + 1 keys of d + dv + 1 */
        const hr_tensor *k = t_at(p, n, 1), *v = t_at(p, n, 2);
        int64_t d = in0->shape[3], t = k->shape[2], dv = v->shape[3];
        return hr_parallel_threads_for((d ? numel(in0) / d : 0) * (t + 1) * (d + dv + 1), HR_GRAIN_MATMUL);
    }
    case HR_OP_fill: case HR_OP_arange:
    case HR_OP_experts: /* its GEMMs decide per expert, by that expert's rows */
        return 0;
    default: /* elementwise, casts, copies, gathers: by output elements */
        return hr_parallel_threads_for(numel(out0), HR_GRAIN_ELTWISE);
    }
}

/* On unless HUBRT_PLAN_THREADS=0, which is there to measure it. */
static bool threads_enabled(void) {
    const char *env = getenv("HUBRT_PLAN_THREADS");
    return !env || strcmp(env, "0");
}

int hr_cpu_plan_threads(hr_plan *p) {
    bool on = threads_enabled();
    int serial = 0;
    for (int i = 0; i < p->n_nodes; i++) {
        hr_plan_node *n = &p->nodes[i];
        n->threads = on && hr_plan_node_live(n) && !n->absorbed ? node_threads(p, n) : 0;
        serial += n->threads == 1;
    }
    return serial;
}
