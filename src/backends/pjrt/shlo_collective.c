/* StableHLO lowerings of the collectives (ops.h): all_reduce, all_gather
 * and broadcast as cross-replica ops of a module run by the builder's
 * num_replicas replicas, with the CPU kernels' semantics: all_reduce
 * gathers every replica's part as f32 and adds the parts in replica order
 * (then the bias), so every replica gets the same bits; all_gather joins
 * equal parts in replica order; broadcast is the root's part of a gather.
 * A module of one replica is a group of one.
 *
 * An eager op on a PJRT device is a module of one replica: in a process
 * that joined a group of several (MPI), the check refuses it and the op
 * falls back to the CPU kernel, whose exchange is the group's; the
 * replicated modules are built by hr_pjrt_run_replicated (one process,
 * several devices). */
#include <stdio.h>

#include "backends/pjrt/shlo.h"
#include "core/error.h"
#include "ops/collective.h"

static bool group_of_one(const void *attrs, const hr_tensor *const *in, int n_in) {
    const hr_collectives *g = hr_collectives_current();
    return !g || g->size == 1;
}

/* Every replica's v joined along a new leading dim, in replica order:
 * [n, v's shape]. */
static hr_shlo_value gather_parts(hr_shlo_builder *b, hr_shlo_value v) {
    int n = b->num_replicas;
    int64_t one[HR_MAX_DIMS + 1] = {1}, all[HR_MAX_DIMS + 1] = {n};
    for (int i = 0; i < v.ndim; i++) one[i + 1] = all[i + 1] = v.shape[i];
    hr_shlo_value x = hr_shlo_reshape(b, v, v.ndim + 1, one);
    hr_shlo_value r = hr_shlo_named(hr_shlo_new_id(b), v.dt, v.ndim + 1, all);
    char t1[256], t2[256];
    hr_shlo_text(b, "    %%v%d = \"stablehlo.all_gather\"(%%v%d) {all_gather_dim = 0 : i64, replica_groups = dense<[[",
                 r.id, x.id);
    for (int i = 0; i < n; i++) hr_shlo_text(b, i ? ", %d" : "%d", i);
    hr_shlo_text(b, "]]> : tensor<1x%dxi64>} : (%s) -> %s\n", n, hr_shlo_vtype(t1, sizeof t1, &x),
                 hr_shlo_vtype(t2, sizeof t2, &r));
    return r;
}

/* Part i of a gather [n, ...] as v's shape. */
static hr_shlo_value part(hr_shlo_builder *b, hr_shlo_value all, int i) {
    int64_t start[HR_MAX_DIMS + 1] = {i}, limit[HR_MAX_DIMS + 1] = {i + 1};
    for (int d = 1; d < all.ndim; d++) start[d] = 0, limit[d] = all.shape[d];
    hr_shlo_value s = hr_shlo_slice(b, all, start, limit, NULL);
    return hr_shlo_reshape(b, s, all.ndim - 1, all.shape + 1);
}

static hr_status lower_all_reduce(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                  const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    hr_shlo_value sum = hr_shlo_convert(b, in[0], HR_F32);
    if (b->num_replicas > 1) {
        hr_shlo_value all = gather_parts(b, sum);
        sum = part(b, all, 0);
        for (int i = 1; i < b->num_replicas; i++) sum = hr_shlo_binary(b, "add", sum, part(b, all, i));
    }
    if (n_in == 2) {
        hr_shlo_value bias = hr_shlo_bcast(b, hr_shlo_convert(b, in[1], HR_F32), sum.ndim, sum.shape);
        sum = hr_shlo_binary(b, "add", sum, bias);
    }
    out[0] = hr_shlo_convert(b, sum, m->dtype);
    return b->status;
}

static hr_status lower_all_gather(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                  const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_all_gather *a = attrs;
    hr_shlo_value x = in[0];
    int n = b->num_replicas, dim = (int)(a->dim < 0 ? a->dim + x.ndim : a->dim);
    if (x.shape[dim] * n != a->total)
        return hr_shlo_fail(b, HR_ERR_UNSUPPORTED, "all_gather: %d replicas of %lld along dim %d are not the total "
                            "%lld (a module's replicas hold equal parts)", n, (long long)x.shape[dim], dim,
                            (long long)a->total);
    if (n == 1) {
        out[0] = x;
        return b->status;
    }
    hr_shlo_value all = gather_parts(b, x), parts[64];
    if (n > 64) return hr_shlo_fail(b, HR_ERR_UNSUPPORTED, "all_gather: %d replicas (at most 64)", n);
    for (int i = 0; i < n; i++) parts[i] = part(b, all, i);
    out[0] = hr_shlo_concat(b, parts, n, dim, m->dtype, m->ndim, m->shape);
    return b->status;
}

static hr_status lower_broadcast(hr_shlo_builder *b, const void *attrs, const hr_shlo_value *in, int n_in,
                                 const hr_tensor_meta *m, hr_shlo_value *out, int n_out) {
    const hr_attrs_broadcast *a = attrs;
    if (a->root >= b->num_replicas)
        return hr_shlo_fail(b, HR_ERR_INVALID_ARG, "broadcast: root %lld is not a replica of %d", (long long)a->root,
                            b->num_replicas);
    out[0] = b->num_replicas == 1 ? in[0] : part(b, gather_parts(b, in[0]), (int)a->root);
    return b->status;
}

void hr_shlo_register_collective(hr_shlo_lowering *t) {
    t[HR_OP_all_reduce] = (hr_shlo_lowering){lower_all_reduce, group_of_one};
    t[HR_OP_all_gather] = (hr_shlo_lowering){lower_all_gather, group_of_one};
    t[HR_OP_broadcast] = (hr_shlo_lowering){lower_broadcast, group_of_one};
}
