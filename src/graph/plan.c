/* Plans: build from a capture, plan the arena by liveness, replay. */
#include "graph/plan.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/grow.h"
#include "core/hash.h"
#include "core/threadpool.h"
#include "device/device_impl.h"
#include "hubrt/graph.h"
#include "hubrt/runtime.h"
#include "ops/profile.h"

#define ARENA_ALIGN 64

int hr_plan_value_index(const hr_plan *p, const hr_tensor *t) {
    return (int)((const hr_plan_value *)((const char *)t->buf - offsetof(hr_plan_value, bound)) - p->values);
}

static uint64_t structure_hash(const hr_plan *p) {
    uint64_t h = HR_FNV_OFFSET;
    for (int i = 0; i < p->n_nodes; i++) {
        const hr_plan_node *n = &p->nodes[i];
        int head[3] = {(int)n->op, n->n_in, n->n_out};
        h = hr_fnv1a(h, head, sizeof head);
        h = hr_fnv1a(h, n->attrs, n->attrs_size);
    }
    for (int i = 0; i < p->n_tensors; i++) {
        const hr_tensor *t = &p->tensors[i];
        int64_t meta[2 + 2 * HR_MAX_DIMS + 1] = {t->dtype, t->ndim};
        memcpy(meta + 2, t->shape, sizeof t->shape);
        memcpy(meta + 2 + HR_MAX_DIMS, t->strides, sizeof t->strides);
        meta[2 + 2 * HR_MAX_DIMS] = t->offset;
        h = hr_fnv1a(h, meta, sizeof meta);
        int v = hr_plan_value_index(p, t);
        h = hr_fnv1a(h, &v, sizeof v);
    }
    for (int i = 0; i < p->n_values; i++) {
        const hr_plan_value *v = &p->values[i];
        /* An input's buffer size is the caller's business, not the plan's. */
        int64_t meta[3] = {v->kind, v->index, v->kind == HR_VALUE_INPUT ? 0 : (int64_t)v->nbytes};
        h = hr_fnv1a(h, meta, sizeof meta);
        h = hr_fnv1a(h, v->name, strlen(v->name));
    }
    return h;
}

/* t is a row-major tensor over all of its value's bytes, from byte 0. */
static bool covers_value(const hr_plan *p, const hr_tensor *t, int v) {
    return t->offset == 0 && hr_tensor_is_contiguous(t) &&
           hr_dtype_nbytes(t->dtype, hr_shape_numel(t->ndim, t->shape)) == p->values[v].nbytes;
}

static bool arena_value(const hr_plan *p, int v) {
    return p->values[v].kind == HR_VALUE_TEMP && !p->values[v].owned;
}

static bool slot_taken(const int *taken, int slot) {
    for (int k = 0; k < HR_MAX_OP_OUTPUTS; k++)
        if (taken[k] == slot) return true;
    return false;
}

static int slot_of(const int *alias, int v) {
    while (alias[v] >= 0) v = alias[v];
    return v;
}

/* On unless HUBRT_INPLACE=0, which is there to measure what it saves. */
static bool inplace_enabled(void) {
    const char *env = getenv("HUBRT_INPLACE");
    return !env || strcmp(env, "0");
}

/* The tensors node n reads and writes when an output of it may take an
 * input's slot (its device says its kernel, or its substitution, reads
 * each element before writing that element's place); false otherwise. */
static bool inplace_io(const hr_plan *p, const hr_plan_node *n, const hr_tensor **ins, int *n_in,
                       const hr_tensor **outs, int *n_out) {
    if (!hr_plan_node_live(n) || n->absorbed) return false;
    if (n->subst) {
        const hr_plan_subst *f = &p->subst[n->subst - 1];
        if (!f->inplace_ok) return false;
        *n_in = f->n_in;
        memcpy(ins, f->in, sizeof *ins * (size_t)f->n_in);
        *n_out = f->n_out;
        memcpy(outs, f->out, sizeof *outs * (size_t)f->n_out);
        return true;
    }
    if (!p->device->vt->inplace_ok || !p->device->vt->inplace_ok(p->device, n->op)) return false;
    *n_in = n->n_in;
    *n_out = n->n_out;
    for (int k = 0; k < n->n_in; k++) ins[k] = &p->tensors[n->first_tensor + k];
    for (int k = 0; k < n->n_out; k++) outs[k] = &p->tensors[n->first_tensor + n->n_in + k];
    return true;
}

/* In place where safe: an output written first by node i takes the slot
 * of an input that is dead after i, when the op allows it and both cover
 * whole values of one layout. alias[v] is the value whose slot v shares;
 * the slot's liveness grows to v's. Returns the number of outputs placed. */
static int assign_in_place(const hr_plan *p, int *first, int *last, int *alias) {
    int placed = 0;
    for (int i = 0; i < p->n_nodes; i++) {
        const hr_tensor *ins[HR_MAX_OP_INPUTS > HR_PLAN_SUBST_MAX_IN ? HR_MAX_OP_INPUTS : HR_PLAN_SUBST_MAX_IN];
        const hr_tensor *outs[HR_MAX_OP_OUTPUTS];
        int n_in, n_out, taken[HR_MAX_OP_OUTPUTS];
        for (int k = 0; k < HR_MAX_OP_OUTPUTS; k++) taken[k] = -1;
        if (!inplace_io(p, &p->nodes[i], ins, &n_in, outs, &n_out)) continue;
        for (int k = 0; k < n_out; k++) {
            const hr_tensor *o = outs[k];
            int vo = hr_plan_value_index(p, o);
            if (!arena_value(p, vo) || first[vo] != i || alias[vo] >= 0 || !covers_value(p, o, vo)) continue;
            bool read_here = false;
            for (int j = 0; j < n_in; j++) read_here |= hr_plan_value_index(p, ins[j]) == vo;
            for (int j = 0; j < n_in && !read_here; j++) {
                const hr_tensor *t = ins[j];
                int vi = hr_plan_value_index(p, t), slot = slot_of(alias, vi);
                if (!arena_value(p, vi) || slot_taken(taken, slot) || last[slot] != i ||
                    hr_dtype_size(t->dtype) != hr_dtype_size(o->dtype) || t->ndim != o->ndim ||
                    memcmp(t->shape, o->shape, sizeof(int64_t) * (size_t)o->ndim) || !covers_value(p, t, vi) ||
                    p->values[vi].nbytes != p->values[vo].nbytes)
                    continue;
                alias[vo] = slot;
                taken[k] = slot;
                last[slot] = last[vo];
                first[vo] = -1;
                placed++;
                break;
            }
        }
    }
    return placed;
}

size_t hr_plan_assign_arena(hr_plan *plan) {
    int nv = plan->n_values;
    int *first = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
    int *last = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
    int *order = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
    int *alias = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
    if (!first || !last || !order || !alias) {
        free(first), free(last), free(order), free(alias);
        return (size_t)-1;
    }
    for (int v = 0; v < nv; v++) alias[v] = -1;
    for (int v = 0; v < nv; v++) first[v] = -1, last[v] = -1;
    for (int i = 0; i < plan->n_nodes; i++) {
        const hr_plan_node *n = &plan->nodes[i];
        if (n->dead || n->folded || n->absorbed) continue;
        const hr_plan_subst *f = n->subst ? &plan->subst[n->subst - 1] : NULL;
        int touched = f ? f->n_in + f->n_out : n->n_in + n->n_out;
        for (int k = 0; k < touched; k++) {
            const hr_tensor *t = !f ? &plan->tensors[n->first_tensor + k] : k < f->n_in ? f->in[k] : f->out[k - f->n_in];
            int v = hr_plan_value_index(plan, t);
            if (first[v] < 0) first[v] = i;
            last[v] = i;
        }
    }
    plan->n_inplace = inplace_enabled() ? assign_in_place(plan, first, last, alias) : 0;
    /* Largest first; each value goes at the lowest offset that does not
     * overlap a placed value alive at the same time. */
    int m = 0;
    for (int v = 0; v < nv; v++)
        if (arena_value(plan, v) && first[v] >= 0) order[m++] = v;
    for (int i = 1; i < m; i++)
        for (int j = i; j > 0 && plan->values[order[j]].nbytes > plan->values[order[j - 1]].nbytes; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    size_t total = 0;
    for (int i = 0; i < m; i++) {
        hr_plan_value *a = &plan->values[order[i]];
        size_t size = (a->nbytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        size_t off = 0;
        bool moved = true;
        while (moved) {
            moved = false;
            for (int j = 0; j < i; j++) {
                int b = order[j];
                const hr_plan_value *pb = &plan->values[b];
                bool alive = first[b] <= last[order[i]] && first[order[i]] <= last[b];
                size_t bsize = (pb->nbytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
                if (alive && off < pb->arena_offset + bsize && pb->arena_offset < off + size) {
                    off = pb->arena_offset + bsize;
                    moved = true;
                }
            }
        }
        a->arena_offset = off;
        if (off + size > total) total = off + size;
    }
    for (int v = 0; v < nv; v++)
        if (alias[v] >= 0) plan->values[v].arena_offset = plan->values[slot_of(alias, v)].arena_offset;
    free(first), free(last), free(order), free(alias);
    return total;
}

/* Dead-code elimination. Walking backwards, a node lives when it writes a
 * value that is returned, persistent (constants and inputs are state the
 * caller sees) or read by a later live node. Writes never kill a value:
 * several nodes may fill slices of one buffer. */
static hr_status eliminate_dead_nodes(hr_plan *p) {
    bool *live = calloc((size_t)(p->n_values ? p->n_values : 1), sizeof *live);
    if (!live) return hr_error(HR_ERR_OOM, "plan: out of memory");
    for (int v = 0; v < p->n_values; v++) live[v] = p->values[v].kind != HR_VALUE_TEMP;
    for (int i = p->n_nodes - 1; i >= 0; i--) {
        hr_plan_node *n = &p->nodes[i];
        bool needed = false;
        for (int k = 0; k < n->n_out && !needed; k++) needed = live[hr_plan_value_index(p, &p->tensors[n->first_tensor + n->n_in + k])];
        n->dead = !needed;
        p->n_dead += n->dead;
        if (needed)
            for (int k = 0; k < n->n_in; k++) live[hr_plan_value_index(p, &p->tensors[n->first_tensor + k])] = true;
    }
    free(live);
    return HR_OK;
}

/* Folding of weight-only subgraphs: a node whose inputs are all constants
 * that no node writes (weights), or results of such nodes, and whose
 * outputs are temporaries written by nothing else, runs once here; its
 * results are kept as constants of the plan. */
static hr_status fold_weight_only_nodes(hr_plan *p) {
    int nv = p->n_values;
    int *writers = calloc((size_t)(nv ? nv : 1), sizeof *writers);
    bool *frozen = calloc((size_t)(nv ? nv : 1), sizeof *frozen);
    hr_status s = writers && frozen ? HR_OK : hr_error(HR_ERR_OOM, "plan: out of memory");
    for (int i = 0; i < p->n_nodes && s == HR_OK; i++) {
        const hr_plan_node *n = &p->nodes[i];
        if (n->dead) continue;
        for (int k = 0; k < n->n_out; k++) writers[hr_plan_value_index(p, &p->tensors[n->first_tensor + n->n_in + k])]++;
    }
    for (int v = 0; v < nv && s == HR_OK; v++) frozen[v] = p->values[v].kind == HR_VALUE_CONST && writers[v] == 0;
    for (int i = 0; i < p->n_nodes && s == HR_OK; i++) {
        hr_plan_node *n = &p->nodes[i];
        if (n->dead || n->empty || n->n_in == 0) continue;
        bool foldable = true;
        for (int k = 0; k < n->n_in && foldable; k++) foldable = frozen[hr_plan_value_index(p, &p->tensors[n->first_tensor + k])];
        for (int k = 0; k < n->n_out && foldable; k++) {
            int v = hr_plan_value_index(p, &p->tensors[n->first_tensor + n->n_in + k]);
            foldable = p->values[v].kind == HR_VALUE_TEMP && writers[v] == 1;
        }
        if (!foldable) continue;
        for (int k = 0; k < n->n_out && s == HR_OK; k++) {
            hr_plan_value *pv = &p->values[hr_plan_value_index(p, &p->tensors[n->first_tensor + n->n_in + k])];
            s = hr_device_buffer_alloc(p->device, pv->nbytes, &pv->owned);
            if (s == HR_OK) pv->bound.data = pv->owned->data;
        }
        if (s == HR_OK)
            s = p->device->vt->run_op(p->device, n->op, n->attrs_size ? n->attrs : NULL, &p->in_ptrs[n->first_tensor],
                                      n->n_in, (hr_tensor *const *)&p->in_ptrs[n->first_tensor + n->n_in], n->n_out);
        if (s != HR_OK) break;
        n->folded = true;
        p->n_folded++;
        for (int k = 0; k < n->n_out; k++) frozen[hr_plan_value_index(p, &p->tensors[n->first_tensor + n->n_in + k])] = true;
    }
    free(writers);
    free(frozen);
    return s;
}

hr_status hr_plan_substitute(hr_plan *p, int head, const hr_plan_subst *sub, const int *absorbed, int n_absorbed) {
    hr_plan_subst *grown = hr_grow(p->subst, p->n_subst, &p->cap_subst, sizeof *grown, 64);
    if (!grown) {
        free(sub->ctx);
        return hr_error(HR_ERR_OOM, "plan: out of memory substituting nodes");
    }
    p->subst = grown;
    p->subst[p->n_subst++] = *sub;
    p->nodes[head].subst = p->n_subst;
    for (int k = 0; k < n_absorbed; k++) p->nodes[absorbed[k]].absorbed = true;
    p->n_absorbed += n_absorbed;
    return HR_OK;
}

int hr_plan_count_subst(const hr_plan *p, const char *kind) {
    int n = 0;
    for (int i = 0; i < p->n_subst; i++) n += !strcmp(p->subst[i].kind, kind);
    return n;
}

hr_status hr_plan_build(const hr_capture *cap, hr_tensor *const *outputs, int n_in, int n_out,
                        bool fold_constants, hr_plan **out) {
    *out = NULL;
    hr_plan *p = calloc(1, sizeof *p);
    if (!p) return hr_error(HR_ERR_OOM, "plan: out of memory");
    p->device = cap->device ? cap->device : hr_device_cpu();
    p->n_in = n_in;
    p->n_out = n_out;
    p->n_nodes = cap->n_nodes;
    p->n_tensors = cap->n_tensors;
    p->n_values = cap->n_values;
    p->nodes = calloc((size_t)(p->n_nodes ? p->n_nodes : 1), sizeof *p->nodes);
    p->tensors = calloc((size_t)(p->n_tensors ? p->n_tensors : 1), sizeof *p->tensors);
    p->in_ptrs = calloc((size_t)(p->n_tensors ? p->n_tensors : 1), sizeof *p->in_ptrs);
    p->values = calloc((size_t)(p->n_values ? p->n_values : 1), sizeof *p->values);
    p->outputs = calloc((size_t)(n_out ? n_out : 1), sizeof *p->outputs);
    p->output_value = calloc((size_t)(n_out ? n_out : 1), sizeof *p->output_value);
    if (!p->nodes || !p->tensors || !p->in_ptrs || !p->values || !p->outputs || !p->output_value) {
        hr_plan_free(p);
        return hr_error(HR_ERR_OOM, "plan: out of memory");
    }
    for (int v = 0; v < cap->n_values; v++) {
        const hr_cap_value *cv = &cap->values[v];
        hr_plan_value *pv = &p->values[v];
        pv->kind = cv->kind;
        pv->index = cv->index;
        pv->nbytes = cv->nbytes;
        pv->base_offset = cv->base_offset;
        pv->base_dtype = cv->base_dtype;
        memcpy(pv->name, cv->name, sizeof pv->name);
        atomic_init(&pv->bound.refcount, 1);
        pv->bound.device = p->device;
        pv->bound.nbytes = cv->nbytes;
        if (cv->kind == HR_VALUE_CONST) {
            pv->constant = hr_buffer_retain(cv->buf);
            pv->bound.data = cv->buf->data;
            pv->bound.device = cv->buf->device;
            pv->bound.origin = cv->buf; /* its packed copy, if any (linear_pack.h) */
        }
    }
    for (int i = 0; i < cap->n_tensors; i++) {
        const hr_cap_tensor *ct = &cap->tensors[i];
        hr_tensor *t = &p->tensors[i];
        t->dtype = ct->dtype;
        t->ndim = ct->ndim;
        memcpy(t->shape, ct->shape, sizeof t->shape);
        memcpy(t->strides, ct->strides, sizeof t->strides);
        t->offset = ct->offset;
        t->buf = &p->values[ct->value].bound;
        p->in_ptrs[i] = t;
    }
    for (int i = 0; i < cap->n_nodes; i++) {
        const hr_cap_node *cn = &cap->nodes[i];
        hr_plan_node *pn = &p->nodes[i];
        pn->op = cn->op;
        pn->n_in = cn->n_in;
        pn->n_out = cn->n_out;
        pn->first_tensor = cn->first_tensor;
        pn->attrs_size = cn->attrs_size;
        memcpy(pn->attrs, cn->attrs, cn->attrs_size);
        pn->empty = true;
        for (int k = 0; k < pn->n_out; k++)
            if (hr_shape_numel(p->tensors[pn->first_tensor + pn->n_in + k].ndim,
                               p->tensors[pn->first_tensor + pn->n_in + k].shape) > 0)
                pn->empty = false;
    }
    for (int i = 0; i < n_out; i++) {
        hr_tensor *o = &p->outputs[i];
        *o = *outputs[i];
        o->buf = NULL;
        o->name[0] = '\0';
        int v = 0;
        while (v < cap->n_values && cap->values[v].seq != outputs[i]->buf->seq) v++;
        p->output_value[i] = v;
    }
    double t0 = hr_profile_now();
    hr_status s = eliminate_dead_nodes(p);
    if (s == HR_OK && fold_constants) s = fold_weight_only_nodes(p);
    p->pool_threads = hr_num_threads();
    /* the device's own passes (the CPU's fusion and threading plan) */
    if (s == HR_OK && p->device->vt->plan_passes) s = p->device->vt->plan_passes(p->device, p);
    if (s == HR_OK && p->device->host_visible) {
        p->arena_size = hr_plan_assign_arena(p);
        if (p->arena_size == (size_t)-1) s = hr_error(HR_ERR_OOM, "plan: out of memory planning the arena");
        else if (p->arena_size && !(p->arena = aligned_alloc(ARENA_ALIGN, p->arena_size)))
            s = hr_error(HR_ERR_OOM, "plan: cannot allocate a %zu-byte arena", p->arena_size);
        for (int v = 0; v < p->n_values && s == HR_OK; v++)
            if (p->values[v].kind == HR_VALUE_TEMP && !p->values[v].owned)
                p->values[v].bound.data = (char *)p->arena + p->values[v].arena_offset;
    } else if (s == HR_OK) {
        for (int v = 0; v < p->n_values && s == HR_OK; v++) {
            hr_plan_value *pv = &p->values[v];
            if (pv->kind != HR_VALUE_TEMP || pv->owned) continue;
            s = hr_device_buffer_alloc(p->device, pv->nbytes, &pv->owned);
            if (s == HR_OK) pv->bound.data = pv->owned->data;
        }
    }
    if (s != HR_OK) {
        hr_plan_free(p);
        return s;
    }
    p->structure_hash = structure_hash(p);
    p->build_ms = (hr_profile_now() - t0) * 1e3;
    hr_log(HR_LOG_DEBUG,
           "plan: %d nodes, %d dead, %d folded, %d absorbed by %d substitutions, %d in place, arena %zu bytes, "
           "built in %.1f ms",
           p->n_nodes, p->n_dead, p->n_folded, p->n_absorbed, p->n_subst, p->n_inplace, p->arena_size, p->build_ms);
    *out = p;
    return HR_OK;
}

/* Output buffers allocated by replays, process-wide (for tests). */
static atomic_llong g_output_allocs;

long long hr_plan_output_allocs(void) { return atomic_load_explicit(&g_output_allocs, memory_order_relaxed); }

/* Takes from `recycle` (the buffers of the caller's previous run) those
 * only recycle still holds, each for an output of its device and size;
 * releases the rest. A buffer the caller's tensors still reference is
 * left to them: a run never writes an output it handed out and that is
 * still in use. Reusing one saves what a fresh buffer costs on every
 * call: a large one is a new mapping, its pages faulted in and zeroed by
 * the kernel (decode logits [64, 1, 151936] f32 are 39 MB), and the old
 * one unmapped. */
static void take_recycled(const hr_plan *p, hr_buffer **recycle, hr_buffer **outbufs) {
    for (int i = 0; i < p->n_out; i++) {
        size_t nbytes = p->values[p->output_value[i]].nbytes;
        for (int r = 0; r < HR_JIT_MAX_IO && !outbufs[i]; r++) {
            hr_buffer *b = recycle[r];
            if (b && b->device == p->device && b->nbytes == nbytes &&
                atomic_load_explicit(&b->refcount, memory_order_acquire) == 1) {
                outbufs[i] = b;
                recycle[r] = NULL;
            }
        }
        if (outbufs[i]) {
            /* written by the kernels below: no longer fresh zeros, and a
             * packed copy made from its old values is stale */
            outbufs[i]->zeroed = false;
            hr_buffer_drop_packed(outbufs[i]);
        }
    }
    for (int r = 0; r < HR_JIT_MAX_IO; r++) {
        hr_buffer_release(recycle[r]);
        recycle[r] = NULL;
    }
}

hr_status hr_plan_run(hr_plan *p, const hr_tensor *const *inputs, hr_tensor **outputs, hr_buffer **recycle) {
    for (int v = 0; v < p->n_values; v++) {
        hr_plan_value *pv = &p->values[v];
        if (pv->kind != HR_VALUE_INPUT) continue;
        const hr_tensor *in = inputs[pv->index];
        if (p->device->host_visible) {
            pv->bound.data = (char *)in->buf->data + hr_dtype_nbytes(pv->base_dtype, in->offset) -
                             hr_dtype_nbytes(pv->base_dtype, pv->base_offset);
        } else if (in->offset != pv->base_offset) {
            return hr_error(HR_ERR_UNSUPPORTED, "compiled call: input %d has another storage offset than at "
                            "capture; pass a contiguous copy", pv->index);
        } else {
            pv->bound.data = in->buf->data;
        }
    }
    hr_buffer *outbufs[HR_JIT_MAX_IO] = {0};
    if (recycle) take_recycled(p, recycle, outbufs);
    hr_status s = HR_OK;
    for (int i = 0; i < p->n_out && s == HR_OK; i++) {
        hr_plan_value *pv = &p->values[p->output_value[i]];
        if (!outbufs[i]) {
            s = hr_device_buffer_alloc(p->device, pv->nbytes, &outbufs[i]);
            if (s != HR_OK) break;
            atomic_fetch_add_explicit(&g_output_allocs, 1, memory_order_relaxed);
        }
        outbufs[i]->seq = hr_buffer_next_seq();
        pv->bound.data = outbufs[i]->data;
    }
    bool profile = hr_profile_enabled();
    for (int i = 0; i < p->n_nodes && s == HR_OK; i++) {
        const hr_plan_node *n = &p->nodes[i];
        if (!hr_plan_node_live(n) || n->absorbed) continue;
        const hr_tensor *const *ins = &p->in_ptrs[n->first_tensor];
        hr_tensor *const *outs = (hr_tensor *const *)&p->in_ptrs[n->first_tensor + n->n_in];
        double t0 = profile ? hr_profile_now() : 0;
        /* a node planned on the whole pool takes a pool grown since */
        hr_parallel_plan_set(n->threads < p->pool_threads ? n->threads : 0);
        if (n->subst)
            s = p->subst[n->subst - 1].run(p->subst[n->subst - 1].ctx);
        else
            s = p->device->vt->run_op(p->device, n->op, n->attrs_size ? n->attrs : NULL, ins, n->n_in, outs,
                                      n->n_out);
        if (profile) hr_profile_add(n->op, hr_profile_now() - t0);
        if (s != HR_OK) s = hr_error_context(s, "compiled call: op %d '%s'", i, hr_op_name(n->op));
    }
    hr_parallel_plan_set(0);
    for (int i = 0; i < p->n_out; i++) {
        if (s == HR_OK) {
            const hr_tensor *o = &p->outputs[i];
            s = hr_tensor_over_buffer(outbufs[i], o->dtype, o->ndim, o->shape, o->offset, &outputs[i]);
            if (s == HR_OK) memcpy(outputs[i]->strides, o->strides, sizeof o->strides);
        }
        if (recycle && s == HR_OK) recycle[i] = hr_buffer_retain(outbufs[i]);
        if (outbufs[i]) hr_buffer_release(outbufs[i]);
    }
    if (s != HR_OK)
        for (int i = 0; i < p->n_out; i++) {
            hr_tensor_free(outputs[i]);
            outputs[i] = NULL;
        }
    return s;
}

void hr_plan_free(hr_plan *p) {
    if (!p) return;
    for (int v = 0; v < p->n_values; v++) {
        if (p->values[v].constant) hr_buffer_release(p->values[v].constant);
        if (p->values[v].owned) hr_buffer_release(p->values[v].owned);
    }
    free(p->arena);
    for (int i = 0; i < p->n_subst; i++) free(p->subst[i].ctx);
    free(p->subst);
    free(p->nodes);
    free(p->tensors);
    free(p->in_ptrs);
    free(p->values);
    free(p->outputs);
    free(p->output_value);
    free(p);
}
