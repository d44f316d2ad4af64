/* Compiled graphs on PJRT: a plan (the captured op list) lowered to one
 * StableHLO module, compiled once through the executable cache, and run
 * with one PJRT execution per call.
 *
 * Every plan value is a byte buffer. In the module a value is an SSA flat
 * array of the dtype its first access reads it as (its storage dtype; it
 * only goes through bytes when another access reads it as another dtype).
 * Arguments and results are declared in that dtype, not as bytes: XLA
 * lowers a bitcast between ui8[n, 2] and bf16[n] to shifts and ors that it
 * then fuses into every consumer (a matrix-vector product recomputed its
 * weights' bytes per output row, 30x slower than the eager ops). The PJRT
 * CPU client checks only an argument's byte size, so the same flat ui8
 * device arrays bind to typed parameters. Weights, inputs and
 * folded results are arguments bound to their existing device buffers;
 * a matrix-vector product's vector is materialized first (see
 * materialized());
 * temporaries start as zeros or as the op result that fills them; the
 * function returns the outputs' bytes, then the final bytes of every
 * argument the graph writes (a KV cache), each argument donated to its
 * result (tf.aliasing_output) so XLA updates the cache in place. */
#ifdef HUBRT_HAVE_PJRT
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/pjrt/pjrt_internal.h"
#include "backends/pjrt/shlo.h"
#include "core/error.h"
#include "core/hash.h"
#include "graph/plan.h"
#include "hubrt/graph.h"
#include "ops/op_impl.h"

struct hr_executable {
    const hr_plan *plan;
    PJRT_LoadedExecutable *exe; /* owned by the plugin's executable cache */
    int n_args, n_results;
    int *arg_value;    /* plan value of each argument */
    int *result_value; /* plan value of each result: outputs, then written arguments */
    char name[96];
};

/* What the lowering knows of each plan value. */
typedef struct {
    bool used, written, folded;
    hr_dtype dt;        /* storage dtype: of the first access (bool as ui8) */
    bool typed;         /* dt set, and nbytes a whole number of dt elements */
    int arg;    /* argument number, -1 when not an argument */
    int result; /* donated result number, -1 when none */
    hr_shlo_value cur; /* current contents (id < 0: zeros, never written) */
} value_state;

typedef struct {
    const hr_plan *plan;
    hr_executable *x;
    value_state *vs;
} graph_module;

static int value_of(const hr_plan *p, int tensor) { return hr_plan_value_index(p, &p->tensors[tensor]); }

/* Arguments are the values a live node touches that exist before the call:
 * constants, inputs, and results folded at build time. */
static bool is_argument(const hr_plan *p, const value_state *s, int v) {
    hr_value_kind k = p->values[v].kind;
    return s[v].used && (k == HR_VALUE_CONST || k == HR_VALUE_INPUT || s[v].folded);
}

/* Marks uses, numbers arguments and results; fills x->arg_value/result_value. */
static hr_status layout(const hr_plan *p, value_state *s, hr_executable *x) {
    for (int v = 0; v < p->n_values; v++) s[v] = (value_state){.arg = -1, .result = -1, .cur = {.id = -1}};
    for (int i = 0; i < p->n_nodes; i++) {
        const hr_plan_node *n = &p->nodes[i];
        for (int k = 0; n->folded && k < n->n_out; k++) s[value_of(p, n->first_tensor + n->n_in + k)].folded = true;
        if (!hr_plan_node_live(n)) continue;
        for (int k = 0; k < n->n_in + n->n_out; k++) {
            int v = value_of(p, n->first_tensor + k);
            hr_dtype dt = p->tensors[n->first_tensor + k].dtype == HR_BOOL ? HR_U8 : p->tensors[n->first_tensor + k].dtype;
            if (!s[v].used) {
                s[v].dt = dt;
                s[v].typed = p->values[v].nbytes % hr_dtype_size(dt) == 0;
            }
            s[v].used = true;
            if (k >= n->n_in) s[v].written = true;
        }
    }
    x->arg_value = malloc(sizeof(int) * (size_t)(p->n_values + 1));
    x->result_value = malloc(sizeof(int) * (size_t)(p->n_out + p->n_values + 1));
    if (!x->arg_value || !x->result_value) return hr_error(HR_ERR_OOM, "PJRT graph: out of memory");
    for (int i = 0; i < p->n_out; i++) {
        x->result_value[x->n_results++] = p->output_value[i];
        s[p->output_value[i]].used = true; /* declared even when no live node writes it */
    }
    for (int v = 0; v < p->n_values; v++) {
        if (!is_argument(p, s, v)) continue;
        s[v].arg = x->n_args;
        x->arg_value[x->n_args++] = v;
        if (s[v].written) {
            s[v].result = x->n_results;
            x->result_value[x->n_results++] = v;
        }
    }
    return HR_OK;
}

/* The type a value is declared as (argument, result, zeros). */
static hr_dtype decl_dtype(const value_state *s) { return s->typed ? s->dt : HR_U8; }

static int64_t decl_numel(const hr_plan *p, const value_state *s, int v) {
    return (int64_t)(p->values[v].nbytes / hr_dtype_size(decl_dtype(&s[v])));
}

/* The value's contents as a flat array of dt's storage dtype. */
static hr_shlo_value contents(hr_shlo_builder *b, const hr_plan *p, value_state *s, int v, hr_dtype dt) {
    if (s[v].cur.id < 0) {
        int64_t n = decl_numel(p, s, v);
        s[v].cur = hr_shlo_splat(b, decl_dtype(&s[v]), 0, 1, &n);
    }
    s[v].cur = hr_shlo_flat_as(b, s[v].cur, dt);
    return s[v].cur;
}

static hr_shlo_value offset_of(hr_shlo_builder *b, const hr_tensor *t) {
    hr_shlo_value none = {.id = -1};
    return t->offset ? hr_shlo_const_i64(b, t->offset) : none;
}

/* v computed into memory before its consumer runs. XLA's CPU fusion pulls
 * the producers of a matrix-vector product's vector into the product,
 * which then recomputes them for every row of the matrix: the lm_head of
 * a 0.6B decode step re-added the whole residual stream (every layer's
 * output) 151936 times. optimization_barrier does not stop that fusion
 * (XLA drops it first); a reduction is never fused into its consumer, so
 * v passes through max(v, v) over a stacked pair. */
static hr_shlo_value materialized(hr_shlo_builder *b, hr_shlo_value v) {
    int64_t shape[HR_MAX_DIMS] = {1}, two[HR_MAX_DIMS] = {2};
    for (int i = 0; i < v.ndim; i++) shape[i + 1] = two[i + 1] = v.shape[i];
    hr_shlo_value one = hr_shlo_reshape(b, v, v.ndim + 1, shape);
    hr_shlo_value pair[2] = {one, one};
    bool dims[HR_MAX_DIMS] = {true};
    hr_shlo_value init = hr_shlo_const(b, v.dt, -INFINITY);
    return hr_shlo_reduce(b, hr_shlo_concat(b, pair, 2, 0, v.dt, v.ndim + 1, two), init, "maximum", dims);
}

/* Whether input k of node n is the vector of a matrix-vector product (a
 * linear's, or the shared x of a linear_group's). */
static bool gemv_vector(const hr_plan_node *n, const hr_tensor *const *ts, int k) {
    return (n->op == HR_OP_linear || n->op == HR_OP_linear_group) && k == 0 && ts[0]->ndim <= HR_MAX_DIMS - 1 &&
           hr_shape_numel(ts[0]->ndim, ts[0]->shape) == ts[0]->shape[ts[0]->ndim - 1];
}

static void lower_node(hr_shlo_builder *b, const hr_plan *p, value_state *s, int i) {
    const hr_plan_node *n = &p->nodes[i];
    const hr_tensor *const *ts = &p->in_ptrs[n->first_tensor];
    const hr_shlo_lowering *l = hr_shlo_lowering_get(n->op);
    const void *attrs = n->attrs_size ? n->attrs : NULL;
    if (!l || !l->lower || (l->check && !l->check(attrs, ts, n->n_in))) {
        hr_shlo_fail(b, HR_ERR_UNSUPPORTED, "op %d '%s' does not lower to StableHLO with these inputs", i,
                     hr_op_name(n->op));
        return;
    }
    hr_shlo_value in[HR_MAX_OP_INPUTS], out[HR_MAX_OP_OUTPUTS];
    hr_tensor_meta meta[HR_MAX_OP_OUTPUTS];
    for (int k = 0; k < n->n_in; k++) {
        hr_shlo_view view;
        hr_shlo_view_of(ts[k], &view);
        int v = value_of(p, n->first_tensor + k);
        in[k] = hr_shlo_view_get(b, &view, contents(b, p, s, v, ts[k]->dtype), offset_of(b, ts[k]));
        if (s[v].arg < 0 && gemv_vector(n, ts, k)) in[k] = materialized(b, in[k]);
    }
    for (int k = 0; k < n->n_out; k++) hr_meta_of(ts[n->n_in + k], &meta[k]);
    hr_status st = l->lower(b, attrs, in, n->n_in, meta, out, n->n_out);
    if (st != HR_OK) {
        hr_shlo_fail(b, st, "op %d '%s': %s", i, hr_op_name(n->op), hr_last_error());
        return;
    }
    for (int k = 0; k < n->n_out && b->status == HR_OK; k++) {
        const hr_tensor *t = ts[n->n_in + k];
        int v = value_of(p, n->first_tensor + n->n_in + k);
        hr_shlo_view view;
        hr_shlo_view_of(t, &view);
        hr_shlo_value none = {.id = -1};
        hr_shlo_value flat = hr_shlo_view_is_full(&view) ? none : contents(b, p, s, v, t->dtype);
        s[v].cur = hr_shlo_view_put(b, &view, flat, offset_of(b, t), out[k]);
    }
}

static char *build_graph(void *ctx) {
    graph_module *g = ctx;
    const hr_plan *p = g->plan;
    value_state *s = g->vs;
    hr_shlo_builder b;
    hr_shlo_init(&b);
    for (int a = 0; a < g->x->n_args; a++) {
        int v = g->x->arg_value[a];
        int64_t n = decl_numel(p, s, v);
        hr_dtype dt = decl_dtype(&s[v]);
        s[v].cur = s[v].result >= 0 ? hr_shlo_arg_donated(&b, dt, 1, &n, s[v].result) : hr_shlo_arg(&b, dt, 1, &n);
    }
    for (int i = 0; i < p->n_nodes && b.status == HR_OK; i++)
        if (hr_plan_node_live(&p->nodes[i])) lower_node(&b, p, s, i);
    hr_shlo_value *res = calloc((size_t)g->x->n_results + 1, sizeof *res);
    if (!res) hr_shlo_fail(&b, HR_ERR_OOM, "PJRT graph: out of memory");
    for (int r = 0; r < g->x->n_results && b.status == HR_OK; r++) {
        int v = g->x->result_value[r];
        res[r] = hr_shlo_bits_as(&b, contents(&b, p, s, v, decl_dtype(&s[v])), decl_dtype(&s[v]));
    }
    char *text = b.status == HR_OK ? hr_shlo_finish(&b, "hubrt_graph", res, g->x->n_results) : NULL;
    free(res);
    hr_shlo_free(&b);
    return text;
}

static char *copy_text(void *ctx) { return strdup(ctx); }

void hr_pjrt_executable_free(hr_device *dev, hr_executable *x) {
    if (!x) return;
    free(x->arg_value);
    free(x->result_value);
    free(x);
}

hr_status hr_pjrt_compile(hr_device *dev, const hr_plan *graph, const char *name, hr_executable **out) {
    const hr_plan *p = graph;
    hr_pjrt_plugin *plug = hr_pjrt_of(dev);
    *out = NULL;
    hr_executable *x = calloc(1, sizeof *x);
    value_state *vs = calloc((size_t)p->n_values + 1, sizeof *vs);
    hr_status s = x && vs ? HR_OK : hr_error(HR_ERR_OOM, "PJRT graph: out of memory");
    if (s == HR_OK) {
        x->plan = p;
        snprintf(x->name, sizeof x->name, "%s", name ? name : "graph");
        s = layout(p, vs, x);
    }
    char *text = NULL;
    if (s == HR_OK) {
        graph_module g = {.plan = p, .x = x, .vs = vs};
        text = build_graph(&g);
        if (!text) s = hr_error_context(hr_last_error()[0] ? HR_ERR_UNSUPPORTED : HR_ERR_INTERNAL,
                                        "%s: lowering '%s' to one StableHLO module", dev->backend, x->name);
    }
    if (s == HR_OK) {
        /* The module text is the key: the graph's ops, attrs, layouts and
         * argument sizes are all in it. */
        size_t len = strlen(text);
        int64_t key[4] = {HR_PJRT_GRAPH_KEY, (int64_t)hr_fnv1a(HR_FNV_OFFSET, text, len), (int64_t)len,
                          (int64_t)hr_fnv1a(0x9e3779b97f4a7c15ull, text, len)};
        s = hr_pjrt_exec_get(plug, key, 4, x->name, copy_text, text, 1, NULL, &x->exe);
    }
    free(text);
    free(vs);
    if (s != HR_OK) {
        hr_pjrt_executable_free(dev, x);
        return s;
    }
    *out = x;
    return HR_OK;
}

/* The device buffer bound to argument value v for this call. */
static hr_status arg_buffer(hr_device *dev, const hr_executable *x, int v, const hr_tensor *const *in, int n_in,
                            hr_buffer **out) {
    const hr_plan_value *pv = &x->plan->values[v];
    hr_buffer *buf = pv->kind == HR_VALUE_CONST ? pv->constant : pv->owned;
    if (pv->kind == HR_VALUE_INPUT) {
        if (pv->index >= n_in)
            return hr_error(HR_ERR_INVALID_ARG, "compiled '%s': input %d missing (%d given)", x->name, pv->index, n_in);
        const hr_tensor *t = in[pv->index];
        buf = t->buf;
        if (buf->device != dev)
            return hr_error(HR_ERR_INVALID_ARG, "compiled '%s': input %d is on %s:%d, the graph on %s:%d", x->name,
                            pv->index, buf->device->backend, buf->device->index, dev->backend, dev->index);
        if (t->offset != pv->base_offset || buf->nbytes != pv->nbytes)
            return hr_error(HR_ERR_UNSUPPORTED, "compiled '%s': input %d sits in its buffer unlike at capture "
                            "(offset %lld of %zu bytes, was %lld of %zu); pass a contiguous copy",
                            x->name, pv->index, (long long)t->offset, buf->nbytes, (long long)pv->base_offset,
                            pv->nbytes);
    }
    if (!buf) return hr_error(HR_ERR_INTERNAL, "compiled '%s': value %d has no buffer", x->name, v);
    *out = buf;
    return HR_OK;
}

/* The array's device address, 0 when the plugin does not say. */
static uintptr_t address_of(const hr_pjrt_plugin *p, PJRT_Buffer *b) {
    PJRT_Buffer_UnsafePointer_Args a = {.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE, .buffer = b};
    PJRT_Error *e = b ? p->api->PJRT_Buffer_UnsafePointer(&a) : NULL;
    if (!e) return b ? a.buffer_pointer : 0;
    PJRT_Error_Destroy_Args d = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = e};
    p->api->PJRT_Error_Destroy(&d);
    return 0;
}

hr_status hr_pjrt_execute_graph(hr_device *dev, hr_executable *x, const hr_tensor *const *in, int n_in,
                                hr_tensor **outs, int n_out) {
    hr_pjrt_plugin *plug = hr_pjrt_of(dev);
    const hr_plan *p = x->plan;
    if (n_out != p->n_out)
        return hr_error(HR_ERR_INVALID_ARG, "compiled '%s': %d outputs asked, %d compiled", x->name, n_out, p->n_out);
    for (int i = 0; i < n_out; i++) outs[i] = NULL;
    PJRT_Buffer **args = calloc((size_t)x->n_args + 1, sizeof *args);
    PJRT_Buffer **results = calloc((size_t)x->n_results + 1, sizeof *results);
    hr_buffer **arg_bufs = calloc((size_t)x->n_args + 1, sizeof *arg_bufs);
    uintptr_t *old_address = calloc((size_t)x->n_results + 1, sizeof *old_address);
    hr_buffer *out_bufs[HR_JIT_MAX_IO] = {0};
    hr_status s = args && results && arg_bufs && old_address ? HR_OK : hr_error(HR_ERR_OOM, "compiled '%s': out of memory", x->name);
    for (int a = 0; a < x->n_args && s == HR_OK; a++) {
        s = arg_buffer(dev, x, x->arg_value[a], in, n_in, &arg_bufs[a]);
        if (s == HR_OK) s = hr_pjrt_buffer_get(arg_bufs[a], &args[a]);
        for (int r = n_out; s == HR_OK && r < x->n_results; r++)
            if (x->result_value[r] == x->arg_value[a]) old_address[r] = address_of(plug, args[a]);
    }
    if (s == HR_OK) {
        PJRT_Buffer *const *arg_list = args;
        PJRT_Buffer **out_list = results;
        char what[128];
        snprintf(what, sizeof what, "compiled graph '%s'", x->name);
        s = hr_pjrt_execute(plug, x->exe, hr_pjrt_device_of(dev), &arg_list, 1, (size_t)x->n_args, &out_list, what);
    }
    /* Outputs: a new buffer each, holding the result's device array. */
    for (int i = 0; i < n_out && s == HR_OK; i++) {
        const hr_plan_value *pv = &p->values[x->result_value[i]];
        s = hr_device_buffer_alloc(dev, pv->nbytes, &out_bufs[i]);
        if (s != HR_OK) break;
        out_bufs[i]->seq = hr_buffer_next_seq();
        hr_pjrt_buffer_set(out_bufs[i], results[i]);
        results[i] = NULL;
        const hr_tensor *o = &p->outputs[i];
        s = hr_tensor_over_buffer(out_bufs[i], o->dtype, o->ndim, o->shape, o->offset, &outs[i]);
        if (s == HR_OK) memcpy(outs[i]->strides, o->strides, sizeof o->strides);
    }
    /* Written arguments take their new arrays (the old ones were donated). */
    int in_place = 0;
    for (int r = n_out; r < x->n_results && s == HR_OK; r++) {
        in_place += old_address[r] && address_of(plug, results[r]) == old_address[r];
        for (int a = 0; a < x->n_args; a++)
            if (x->arg_value[a] == x->result_value[r]) hr_pjrt_buffer_set(arg_bufs[a], results[r]);
        results[r] = NULL;
    }
    for (int r = 0; results && r < x->n_results; r++) hr_pjrt_buffer_destroy(plug, results[r]);
    for (int i = 0; i < n_out; i++)
        if (out_bufs[i]) hr_buffer_release(out_bufs[i]);
    if (s != HR_OK)
        for (int i = 0; i < n_out; i++) {
            hr_tensor_free(outs[i]);
            outs[i] = NULL;
        }
    if (s == HR_OK) {
        pthread_mutex_lock(&plug->lock);
        plug->stats.graph_runs++;
        plug->stats.in_place += in_place;
        pthread_mutex_unlock(&plug->lock);
    }
    free(args);
    free(results);
    free(arg_bufs);
    free(old_address);
    return s;
}
#endif
