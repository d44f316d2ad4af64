/* The PJRT devices: buffers that stay on the device, explicit host<->device
 * copies, and eager ops, each emitted as one StableHLO module compiled once
 * per (op, attrs, shapes, dtypes, views) and cached. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/pjrt/pjrt.h"
#include "core/error.h"

#ifdef HUBRT_HAVE_PJRT
#include "backends/pjrt/pjrt_internal.h"
#include "backends/pjrt/shlo.h"
#include "ops/capture.h"
#include "ops/op_impl.h"

/* ---- buffers -------------------------------------------------------------- */

hr_status hr_pjrt_upload(hr_device *dev, const void *data, int64_t nbytes, PJRT_Buffer **out) {
    hr_pjrt_plugin *p = hr_pjrt_of(dev);
    PJRT_Client_BufferFromHostBuffer_Args a = {
        .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
        .client = p->client,
        .data = data,
        .type = PJRT_Buffer_Type_U8,
        .dims = &nbytes,
        .num_dims = 1,
        .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
        .device = hr_pjrt_device_of(dev)};
    HR_TRY(hr_pjrt_check(p, p->api->PJRT_Client_BufferFromHostBuffer(&a), "host to device copy"));
    hr_status s = hr_pjrt_event_await(p, a.done_with_host_buffer, "host to device copy");
    if (s != HR_OK) {
        hr_pjrt_buffer_destroy(p, a.buffer);
        return s;
    }
    *out = a.buffer;
    return HR_OK;
}

hr_status hr_pjrt_upload_i64(hr_device *dev, int64_t value, PJRT_Buffer **out) {
    hr_pjrt_plugin *p = hr_pjrt_of(dev);
    PJRT_Client_BufferFromHostBuffer_Args a = {
        .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
        .client = p->client,
        .data = &value,
        .type = PJRT_Buffer_Type_S64,
        .num_dims = 0,
        .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
        .device = hr_pjrt_device_of(dev)};
    HR_TRY(hr_pjrt_check(p, p->api->PJRT_Client_BufferFromHostBuffer(&a), "host to device copy"));
    HR_TRY(hr_pjrt_event_await(p, a.done_with_host_buffer, "host to device copy"));
    *out = a.buffer;
    return HR_OK;
}

/* buf->data is a slot holding the PJRT_Buffer*. Device arrays are
 * immutable, so every write replaces the array; the slot stays put, and
 * whoever copied buf->data (a compiled plan binding its buffers) still sees
 * the current array. */
static hr_pjrt_slot *slot_of(const hr_buffer *buf) { return buf->data; }

void hr_pjrt_buffer_set(hr_buffer *buf, PJRT_Buffer *pb) {
    hr_pjrt_slot *slot = slot_of(buf);
    hr_pjrt_buffer_destroy(hr_pjrt_of(buf->device), slot->pb);
    slot->pb = pb;
}

/* Buffers start empty: the first full write (an op output or an upload)
 * creates the device array, so nothing is zero-filled for nothing. */
hr_status hr_pjrt_buffer_get(hr_buffer *buf, PJRT_Buffer **out) {
    hr_pjrt_slot *slot = slot_of(buf);
    if (!slot->pb) {
        void *zeros = calloc(1, buf->nbytes ? buf->nbytes : 1);
        if (!zeros) return hr_error(HR_ERR_OOM, "out of memory zero-filling a %zu-byte buffer", buf->nbytes);
        hr_status s = hr_pjrt_upload(buf->device, zeros, (int64_t)buf->nbytes, &slot->pb);
        free(zeros);
        HR_TRY(s);
    }
    *out = slot->pb;
    return HR_OK;
}

static hr_status pjrt_buffer_alloc(hr_device *dev, size_t nbytes, hr_buffer **out) {
    hr_buffer *buf = calloc(1, sizeof *buf);
    hr_pjrt_slot *slot = calloc(1, sizeof *slot);
    if (!buf || !slot) {
        free(buf);
        free(slot);
        return hr_error(HR_ERR_OOM, "%s: out of memory allocating a buffer header", dev->backend);
    }
    atomic_init(&buf->refcount, 1);
    buf->device = dev;
    buf->data = slot;
    buf->nbytes = nbytes;
    *out = buf;
    return HR_OK;
}

static void pjrt_buffer_free(hr_buffer *buf) {
    hr_pjrt_buffer_destroy(hr_pjrt_of(buf->device), slot_of(buf)->pb);
    free(buf->data);
    free(buf);
}

static hr_status download(hr_device *dev, PJRT_Buffer *pb, void *dst, size_t n) {
    hr_pjrt_plugin *p = hr_pjrt_of(dev);
    PJRT_Buffer_ToHostBuffer_Args a = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE, .src = pb,
                                       .dst = dst, .dst_size = n};
    HR_TRY(hr_pjrt_check(p, p->api->PJRT_Buffer_ToHostBuffer(&a), "device to host copy"));
    return hr_pjrt_event_await(p, a.event, "device to host copy");
}

static hr_status check_range(hr_device *dev, const hr_buffer *b, size_t off, size_t n) {
    if (off > b->nbytes || n > b->nbytes - off)
        return hr_error(HR_ERR_INVALID_ARG, "%s: copy of %zu bytes at %zu overruns a %zu-byte buffer", dev->backend,
                        n, off, b->nbytes);
    return HR_OK;
}

static hr_status pjrt_copy_to_host(hr_device *dev, const hr_buffer *src, size_t off, void *dst, size_t n) {
    HR_TRY(check_range(dev, src, off, n));
    if (n == 0) return HR_OK;
    PJRT_Buffer *pb = slot_of(src)->pb;
    if (!pb) {
        memset(dst, 0, n);
        return HR_OK;
    }
    if (off == 0 && n == src->nbytes) return download(dev, pb, dst, n);
    char *tmp = malloc(src->nbytes);
    if (!tmp) return hr_error(HR_ERR_OOM, "%s: out of memory (%zu bytes)", dev->backend, src->nbytes);
    hr_status s = download(dev, pb, tmp, src->nbytes);
    if (s == HR_OK) memcpy(dst, tmp + off, n);
    free(tmp);
    return s;
}

/* Device arrays are immutable: a partial write goes through the host
 * (correct, not fast; ops write partial views on device instead). */
static hr_status pjrt_copy_from_host(hr_device *dev, hr_buffer *dst, size_t off, const void *src, size_t n) {
    HR_TRY(check_range(dev, dst, off, n));
    PJRT_Buffer *pb;
    if (off == 0 && n == dst->nbytes) {
        HR_TRY(hr_pjrt_upload(dev, src, (int64_t)n, &pb));
        hr_pjrt_buffer_set(dst, pb);
        return HR_OK;
    }
    if (n == 0) return HR_OK;
    char *tmp = malloc(dst->nbytes);
    if (!tmp) return hr_error(HR_ERR_OOM, "%s: out of memory (%zu bytes)", dev->backend, dst->nbytes);
    hr_status s = pjrt_copy_to_host(dev, dst, 0, tmp, dst->nbytes);
    if (s == HR_OK) {
        memcpy(tmp + off, src, n);
        s = hr_pjrt_upload(dev, tmp, (int64_t)dst->nbytes, &pb);
    }
    free(tmp);
    if (s == HR_OK) hr_pjrt_buffer_set(dst, pb);
    return s;
}

/* ---- eager ops -------------------------------------------------------------- */

typedef struct {
    hr_op op;
    const void *attrs;
    int n_in, n_out;
    hr_shlo_view in[HR_MAX_OP_INPUTS], out[HR_MAX_OP_OUTPUTS];
    hr_tensor_meta meta[HR_MAX_OP_OUTPUTS];
    bool donate[HR_MAX_OP_OUTPUTS]; /* the output's old buffer is updated in place */
    int replicas; /* of the module (hr_pjrt_run_replicated); 0: one */
} op_module;

static char *build_op_module(void *ctx) {
    op_module *m = ctx;
    hr_shlo_builder b;
    hr_shlo_init(&b);
    if (m->replicas > 1) b.num_replicas = m->replicas;
    hr_shlo_value in[HR_MAX_OP_INPUTS], out[HR_MAX_OP_OUTPUTS], res[HR_MAX_OP_OUTPUTS];
    for (int i = 0; i < m->n_in; i++) in[i] = hr_shlo_view_load(&b, &m->in[i]);
    hr_status s = hr_shlo_lowering_get(m->op)->lower(&b, m->attrs, in, m->n_in, m->meta, out, m->n_out);
    if (s != HR_OK) hr_shlo_fail(&b, s, "%s", hr_last_error());
    for (int i = 0; i < m->n_out && b.status == HR_OK; i++)
        res[i] = hr_shlo_view_store(&b, &m->out[i], out[i], m->donate[i] ? i : -1);
    char name[64];
    snprintf(name, sizeof name, "hubrt_%s", hr_op_name(m->op));
    char *text = b.status == HR_OK ? hr_shlo_finish(&b, name, res, m->n_out) : NULL;
    hr_shlo_free(&b);
    return text;
}

typedef struct {
    int64_t v[512];
    size_t n;
} key_buf;

static void key_put(key_buf *k, int64_t x) {
    if (k->n < sizeof k->v / sizeof k->v[0]) k->v[k->n++] = x;
}

static void key_view(key_buf *k, const hr_shlo_view *v) {
    key_put(k, v->dt);
    key_put(k, v->ndim);
    for (int i = 0; i < v->ndim; i++) key_put(k, v->shape[i]), key_put(k, v->strides[i]);
    key_put(k, v->contiguous);
    key_put(k, v->has_offset);
    key_put(k, v->buf_bytes);
}

/* Attribute values by field, so padding bytes never split cache entries. */
static void key_attrs(key_buf *k, hr_op op, const void *attrs) {
    int n;
    const hr_attr_field *f = hr_op_attr_fields(op, &n);
    key_put(k, attrs != NULL);
    for (int i = 0; attrs && i < n; i++) {
        const char *p = (const char *)attrs + f[i].offset;
        int64_t x = 0;
        switch (f[i].type) {
        case HR_ATTR_I64: memcpy(&x, p, sizeof x); break;
        case HR_ATTR_F64: memcpy(&x, p, sizeof x); break;
        case HR_ATTR_BOOL: x = *(const bool *)p; break;
        case HR_ATTR_INTS: {
            const hr_ints *ints = (const hr_ints *)p;
            key_put(k, ints->n);
            for (int64_t j = 0; j < ints->n && j < HR_MAX_DIMS; j++) key_put(k, ints->v[j]);
            continue;
        }
        }
        key_put(k, x);
    }
}

/* A partially written output's old buffer is donated (written in place by
 * XLA) unless the module also reads it through another argument. */
static bool donatable(const hr_buffer *buf, const hr_tensor *const *in, int n_in, hr_tensor *const *out, int n_out) {
    int uses = 0;
    for (int i = 0; i < n_in; i++) uses += in[i]->buf == buf;
    for (int i = 0; i < n_out; i++) uses += out[i]->buf == buf;
    return uses == 1;
}

static bool pjrt_supports_op(hr_device *dev, hr_op op, const void *attrs, const hr_tensor *const *in, int n_in) {
    const hr_shlo_lowering *l = hr_shlo_lowering_get(op);
    return l && l->lower && (!l->check || l->check(attrs, in, n_in));
}

static hr_status pjrt_run_op(hr_device *dev, hr_op op, const void *attrs, const hr_tensor *const *in, int n_in,
                             hr_tensor *const *out, int n_out) {
    /* Under capture the graph is compiled whole and run once afterwards
     * (device_impl.h): compiling and running each op now would be wasted. */
    if (hr_capture_active()) return HR_OK;
    hr_pjrt_plugin *p = hr_pjrt_of(dev);
    op_module m = {.op = op, .attrs = attrs, .n_in = n_in, .n_out = n_out};
    key_buf key = {.n = 0};
    key_put(&key, op);
    key_attrs(&key, op, attrs);
    key_put(&key, n_in);
    for (int i = 0; i < n_in; i++) {
        hr_shlo_view_of(in[i], &m.in[i]);
        key_view(&key, &m.in[i]);
    }
    key_put(&key, n_out);
    for (int i = 0; i < n_out; i++) {
        hr_shlo_view_of(out[i], &m.out[i]);
        hr_meta_of(out[i], &m.meta[i]);
        key_view(&key, &m.out[i]);
        m.donate[i] = donatable(out[i]->buf, in, n_in, out, n_out);
        key_put(&key, m.donate[i]);
    }
    if (key.n == sizeof key.v / sizeof key.v[0])
        return hr_error(HR_ERR_UNSUPPORTED, "%s: too many inputs to key the executable cache", dev->backend);

    PJRT_LoadedExecutable *exe;
    HR_TRY(hr_pjrt_exec_get(p, key.v, key.n, hr_op_name(op), build_op_module, &m, 1, NULL, &exe));

    /* Arguments in the order the module declared them: each input's bytes
     * and offset, then each partially written output's old bytes and offset. */
    PJRT_Buffer *args[2 * (HR_MAX_OP_INPUTS + HR_MAX_OP_OUTPUTS)];
    PJRT_Buffer *temps[HR_MAX_OP_INPUTS + HR_MAX_OP_OUTPUTS];
    size_t n_args = 0, n_temps = 0;
    hr_status s = HR_OK;
    for (int i = 0; i < n_in + n_out && s == HR_OK; i++) {
        const hr_tensor *t = i < n_in ? in[i] : out[i - n_in];
        if (i >= n_in && hr_shlo_view_is_full(&m.out[i - n_in])) continue;
        s = hr_pjrt_buffer_get(t->buf, &args[n_args]);
        if (s == HR_OK) n_args++;
        if (s == HR_OK && t->offset) {
            s = hr_pjrt_upload_i64(dev, t->offset, &temps[n_temps]);
            if (s == HR_OK) args[n_args++] = temps[n_temps++];
        }
    }
    PJRT_Buffer *results[HR_MAX_OP_OUTPUTS] = {0};
    if (s == HR_OK) {
        PJRT_Buffer *const *arg_list = args;
        PJRT_Buffer **out_list = results;
        char what[96];
        snprintf(what, sizeof what, "op '%s'", hr_op_name(op));
        s = hr_pjrt_execute(p, exe, hr_pjrt_device_of(dev), &arg_list, 1, n_args, &out_list, what);
    }
    for (size_t i = 0; i < n_temps; i++) hr_pjrt_buffer_destroy(p, temps[i]);
    for (int i = 0; i < n_out; i++) {
        if (s == HR_OK)
            hr_pjrt_buffer_set(out[i]->buf, results[i]);
        else
            hr_pjrt_buffer_destroy(p, results[i]);
    }
    return s;
}

static hr_status pjrt_sync(hr_device *dev) { return hr_pjrt_sync(hr_pjrt_of(dev)); }

static const hr_device_vtable pjrt_vtable = {
    .buffer_alloc = pjrt_buffer_alloc,
    .buffer_free = pjrt_buffer_free,
    .copy_from_host = pjrt_copy_from_host,
    .copy_to_host = pjrt_copy_to_host,
    .supports_op = pjrt_supports_op,
    .run_op = pjrt_run_op,
    .compile = hr_pjrt_compile,
    .execute = hr_pjrt_execute_graph,
    .executable_free = hr_pjrt_executable_free,
    .sync = pjrt_sync,
};

/* ---- collectives ------------------------------------------------------------ */

typedef struct {
    hr_shlo_view view;
    int n;
} all_reduce_module;

static char *build_all_reduce(void *ctx) {
    all_reduce_module *m = ctx;
    hr_shlo_builder b;
    hr_shlo_init(&b);
    b.num_replicas = m->n;
    hr_shlo_value x = hr_shlo_view_load(&b, &m->view);
    hr_shlo_value r = hr_shlo_named(hr_shlo_new_id(&b), x.dt, x.ndim, x.shape);
    char t[256];
    hr_shlo_text(&b, "    %%v%d = \"stablehlo.all_reduce\"(%%v%d) ({\n", r.id, x.id);
    hr_shlo_region(&b, x.dt, "add");
    hr_shlo_text(&b, "    }) {replica_groups = dense<[[");
    for (int i = 0; i < m->n; i++) hr_shlo_text(&b, i ? ", %d" : "%d", i);
    hr_shlo_text(&b, "]]> : tensor<1x%dxi64>} : (%s) -> %s\n", m->n, hr_shlo_vtype(t, sizeof t, &x),
                 hr_shlo_vtype(t, sizeof t, &r));
    hr_shlo_value res = hr_shlo_view_store(&b, &m->view, r, -1);
    char *text = hr_shlo_finish(&b, "hubrt_all_reduce", &res, 1);
    hr_shlo_free(&b);
    return text;
}

static int device_id(hr_pjrt_plugin *p, PJRT_Device *d) {
    PJRT_Device_GetDescription_Args g = {.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE, .device = d};
    if (hr_pjrt_check(p, p->api->PJRT_Device_GetDescription(&g), "PJRT_Device_GetDescription") != HR_OK) return -1;
    PJRT_DeviceDescription_Id_Args ia = {.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE,
                                         .device_description = g.device_description};
    if (hr_pjrt_check(p, p->api->PJRT_DeviceDescription_Id(&ia), "PJRT_DeviceDescription_Id") != HR_OK) return -1;
    return ia.id;
}

hr_status hr_pjrt_all_reduce_sum(hr_tensor *const *ts, int n) {
    if (!ts || n < 1 || n > HR_PJRT_MAX_DEVICES)
        return hr_error(HR_ERR_INVALID_ARG, "all_reduce: need 1..%d tensors, got %d", HR_PJRT_MAX_DEVICES, n);
    hr_device *dev0 = ts[0]->buf->device;
    if (dev0->vt != &pjrt_vtable)
        return hr_error(HR_ERR_INVALID_ARG, "all_reduce: tensor 0 is on %s, not a PJRT device", dev0->backend);
    hr_pjrt_plugin *p = hr_pjrt_of(dev0);
    all_reduce_module m = {.n = n};
    hr_shlo_view_of(ts[0], &m.view);
    if (!hr_shlo_view_is_full(&m.view))
        return hr_error(HR_ERR_UNSUPPORTED, "all_reduce: tensors must be contiguous and own their buffer");
    key_buf key = {.n = 0};
    key_put(&key, -1); /* not an op */
    key_put(&key, n);
    int ids[HR_PJRT_MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        hr_device *d = ts[i]->buf->device;
        hr_shlo_view v;
        hr_shlo_view_of(ts[i], &v);
        if (d->vt != &pjrt_vtable || hr_pjrt_of(d) != p)
            return hr_error(HR_ERR_INVALID_ARG, "all_reduce: tensor %d is on %s:%d, not %s", i, d->backend, d->index,
                            dev0->backend);
        if (memcmp(&v, &m.view, sizeof v))
            return hr_error(HR_ERR_SHAPE, "all_reduce: tensor %d differs from tensor 0 in shape, dtype or layout", i);
        for (int j = 0; j < i; j++)
            if (ts[j]->buf->device == d)
                return hr_error(HR_ERR_INVALID_ARG, "all_reduce: tensors %d and %d are both on %s:%d", j, i,
                                d->backend, d->index);
        ids[i] = device_id(p, hr_pjrt_device_of(d));
        key_put(&key, ids[i]);
    }
    key_view(&key, &m.view);
    PJRT_LoadedExecutable *exe;
    HR_TRY(hr_pjrt_exec_get(p, key.v, key.n, "all_reduce", build_all_reduce, &m, n, ids, &exe));
    PJRT_Buffer *args[HR_PJRT_MAX_DEVICES], *results[HR_PJRT_MAX_DEVICES] = {0};
    PJRT_Buffer *const *arg_lists[HR_PJRT_MAX_DEVICES];
    PJRT_Buffer **out_lists[HR_PJRT_MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        HR_TRY(hr_pjrt_buffer_get(ts[i]->buf, &args[i]));
        arg_lists[i] = &args[i];
        out_lists[i] = &results[i];
    }
    HR_TRY(hr_pjrt_execute(p, exe, NULL, arg_lists, (size_t)n, 1, out_lists, "all_reduce"));
    for (int i = 0; i < n; i++) hr_pjrt_buffer_set(ts[i]->buf, results[i]);
    return HR_OK;
}

hr_status hr_pjrt_run_replicated(hr_op op, const void *attrs, const hr_tensor *const *ins, int n_in, int n,
                                 hr_tensor **outs) {
    if (!ins || !outs || n < 1 || n > HR_PJRT_MAX_DEVICES || n_in < 1 || n_in > HR_MAX_OP_INPUTS ||
        (unsigned)op >= HR_OP_COUNT || hr_op_num_outputs(op) != 1)
        return hr_error(HR_ERR_INVALID_ARG, "run_replicated: op %d, %d inputs, %d replicas (1..%d), one output",
                        (int)op, n_in, n, HR_PJRT_MAX_DEVICES);
    const hr_shlo_lowering *l = hr_shlo_lowering_get(op);
    if (!l || !l->lower) return hr_error(HR_ERR_UNSUPPORTED, "run_replicated: op '%s' is not lowered", hr_op_name(op));
    hr_device *dev0 = ins[0]->buf->device;
    if (dev0->vt != &pjrt_vtable)
        return hr_error(HR_ERR_INVALID_ARG, "run_replicated: input 0 is on %s, not a PJRT device", dev0->backend);
    hr_pjrt_plugin *p = hr_pjrt_of(dev0);
    op_module m = {.op = op, .attrs = attrs, .n_in = n_in, .n_out = 1, .replicas = n};
    HR_TRY(hr_infer_table()[op](attrs, ins, n_in, m.meta, 1));
    key_buf key = {.n = 0};
    key_put(&key, -3); /* a replicated op */
    key_put(&key, op);
    key_attrs(&key, op, attrs);
    key_put(&key, n_in);
    key_put(&key, n);
    int ids[HR_PJRT_MAX_DEVICES];
    for (int r = 0; r < n; r++) {
        hr_device *d = ins[r * n_in]->buf->device;
        for (int i = 0; i < n_in; i++) {
            const hr_tensor *t = ins[r * n_in + i];
            hr_shlo_view v;
            hr_shlo_view_of(t, &v);
            if (t->buf->device != d || d->vt != &pjrt_vtable || hr_pjrt_of(d) != p)
                return hr_error(HR_ERR_INVALID_ARG, "run_replicated: replica %d's input %d is not on %s:%d", r, i,
                                d->backend, d->index);
            if (!hr_shlo_view_is_full(&v))
                return hr_error(HR_ERR_UNSUPPORTED, "run_replicated: input %d of replica %d must be contiguous and "
                                "own its buffer", i, r);
            if (r == 0) m.in[i] = v;
            else if (memcmp(&v, &m.in[i], sizeof v))
                return hr_error(HR_ERR_SHAPE, "run_replicated: replica %d's input %d differs from replica 0's in "
                                "shape or dtype", r, i);
        }
        for (int j = 0; j < r; j++)
            if (ins[j * n_in]->buf->device == d)
                return hr_error(HR_ERR_INVALID_ARG, "run_replicated: replicas %d and %d are both on %s:%d", j, r,
                                d->backend, d->index);
        ids[r] = device_id(p, hr_pjrt_device_of(d));
        key_put(&key, ids[r]);
    }
    for (int i = 0; i < n_in; i++) key_view(&key, &m.in[i]);
    for (int r = 0; r < n; r++) outs[r] = NULL;
    hr_status s = HR_OK;
    for (int r = 0; r < n && s == HR_OK; r++) s = hr_tensor_empty_meta(ins[r * n_in]->buf->device, &m.meta[0], &outs[r]);
    if (s == HR_OK) hr_shlo_view_of(outs[0], &m.out[0]);
    PJRT_LoadedExecutable *exe = NULL;
    char what[64];
    snprintf(what, sizeof what, "%s x%d", hr_op_name(op), n);
    if (s == HR_OK) s = hr_pjrt_exec_get(p, key.v, key.n, what, build_op_module, &m, n, ids, &exe);
    PJRT_Buffer *args[HR_PJRT_MAX_DEVICES][HR_MAX_OP_INPUTS], *results[HR_PJRT_MAX_DEVICES] = {0};
    PJRT_Buffer *const *arg_lists[HR_PJRT_MAX_DEVICES];
    PJRT_Buffer **out_lists[HR_PJRT_MAX_DEVICES];
    for (int r = 0; r < n && s == HR_OK; r++) {
        for (int i = 0; i < n_in && s == HR_OK; i++) s = hr_pjrt_buffer_get(ins[r * n_in + i]->buf, &args[r][i]);
        arg_lists[r] = args[r];
        out_lists[r] = &results[r];
    }
    if (s == HR_OK) s = hr_pjrt_execute(p, exe, NULL, arg_lists, (size_t)n, (size_t)n_in, out_lists, what);
    for (int r = 0; r < n; r++) {
        if (s == HR_OK) {
            hr_pjrt_buffer_set(outs[r]->buf, results[r]);
        } else {
            if (results[r]) hr_pjrt_buffer_destroy(p, results[r]);
            hr_tensor_free(outs[r]);
            outs[r] = NULL;
        }
    }
    return s;
}

/* ---- backends ------------------------------------------------------------------ */

static int count_of(const char *backend) {
    hr_pjrt_plugin *p;
    return hr_pjrt_plugin_get(backend, &p) == HR_OK ? p->num_devices : 0;
}

static hr_status open_of(const char *backend, int index, hr_device **out) {
    hr_pjrt_plugin *p;
    HR_TRY(hr_pjrt_plugin_get(backend, &p));
    if (index < 0 || index >= p->num_devices)
        return hr_error(HR_ERR_NOT_FOUND, "%s:%d does not exist (%d devices)", backend, index, p->num_devices);
    hr_device *d = &p->hr_devices[index];
    *d = (hr_device){.vt = &pjrt_vtable, .backend = p->backend, .index = index, .host_visible = false, .impl = p};
    *out = d;
    return HR_OK;
}

#else /* built without the PJRT header */

static int count_of(const char *backend) { return 0; }

static hr_status open_of(const char *backend, int index, hr_device **out) {
    return hr_error(HR_ERR_UNSUPPORTED, "device '%s': hubrt was built without PJRT headers (install xla-cpu-pjrt "
                    "in .venv and rebuild, or pass -DHUBRT_PJRT_INCLUDE_DIR)", backend);
}

hr_status hr_pjrt_backend_info(const char *backend, hr_pjrt_info *out) { return open_of(backend, 0, NULL); }
hr_status hr_pjrt_cache_stats_get(const char *backend, hr_pjrt_cache_stats *out) {
    return open_of(backend, 0, NULL);
}
hr_status hr_pjrt_all_reduce_sum(hr_tensor *const *ts, int n) { return open_of("xla_cpu", 0, NULL); }
hr_status hr_pjrt_run_replicated(hr_op op, const void *attrs, const hr_tensor *const *ins, int n_in, int n,
                                 hr_tensor **outs) {
    return open_of("xla_cpu", 0, NULL);
}
#endif

static int xla_cpu_count(void) { return count_of("xla_cpu"); }
static hr_status xla_cpu_open(int index, hr_device **out) { return open_of("xla_cpu", index, out); }
static int tpu_count(void) { return count_of("tpu"); }
static hr_status tpu_open(int index, hr_device **out) { return open_of("tpu", index, out); }

static const hr_device_backend xla_cpu_backend = {.name = "xla_cpu", .count = xla_cpu_count, .open = xla_cpu_open};
static const hr_device_backend tpu_backend = {.name = "tpu", .count = tpu_count, .open = tpu_open};
HR_BACKEND_REGISTER(xla_cpu_backend, 102)
HR_BACKEND_REGISTER(tpu_backend, 103)
