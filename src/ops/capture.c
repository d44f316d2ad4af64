/* Graph capture: a thread-local recorder that dispatch feeds. */
#include "ops/capture.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/grow.h"

static _Thread_local hr_capture *tl_cap;
static _Thread_local int tl_depth;

bool hr_capture_active(void) { return tl_cap != NULL; }
bool hr_capture_recording(void) { return tl_cap != NULL && tl_depth == 0; }
void hr_capture_enter_op(void) { tl_depth++; }
void hr_capture_leave_op(void) { tl_depth--; }

static void fail(hr_capture *cap, hr_status code, const char *fmt, ...) HR_PRINTF(3, 4);

static void fail(hr_capture *cap, hr_status code, const char *fmt, ...) {
    if (cap->failure != HR_OK) return; /* keep the first reason */
    cap->failure = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cap->failure_msg, sizeof cap->failure_msg, fmt, ap);
    va_end(ap);
}

#define GROW(cap_, arr, n, capn)                                                  \
    do {                                                                          \
        void *grown_ = hr_grow((arr), (n), &(capn), sizeof *(arr), 64);          \
        if (!grown_) {                                                            \
            fail((cap_), HR_ERR_OOM, "out of memory while capturing");            \
            return -1;                                                            \
        }                                                                         \
        (arr) = grown_;                                                           \
    } while (0)

static bool host_written(const hr_capture *cap, uint64_t seq) {
    for (int i = 0; i < cap->n_host_written; i++)
        if (cap->host_written[i] == seq) return true;
    return false;
}

static int find_value(const hr_capture *cap, uint64_t seq) {
    for (int i = cap->n_values - 1; i >= 0; i--)
        if (cap->values[i].seq == seq) return i;
    return -1;
}

static int add_value(hr_capture *cap, const hr_tensor *t) {
    int v = find_value(cap, t->buf->seq);
    if (v >= 0) return v;
    GROW(cap, cap->values, cap->n_values, cap->cap_values);
    hr_cap_value *val = &cap->values[cap->n_values];
    memset(val, 0, sizeof *val);
    val->seq = t->buf->seq;
    val->nbytes = t->buf->nbytes;
    val->buf = t->buf;
    if (t->buf->seq <= cap->start_seq) {
        val->kind = HR_VALUE_CONST;
        hr_buffer_retain(t->buf);
        /* Views inherit their base tensor's name; the planner resolves it. */
        memcpy(val->name, t->name, sizeof val->name);
        val->base_dtype = t->dtype;
    } else {
        val->kind = HR_VALUE_TEMP;
    }
    return cap->n_values++;
}

hr_status hr_capture_begin(hr_capture *cap, const hr_tensor *const *inputs, int n_in) {
    memset(cap, 0, sizeof *cap);
    if (tl_cap) return hr_error(HR_ERR_INVALID_ARG, "capture: already capturing on this thread");
    cap->start_seq = hr_buffer_next_seq();
    for (int i = 0; i < n_in; i++) {
        if (!cap->device) cap->device = inputs[i]->buf->device;
        if (find_value(cap, inputs[i]->buf->seq) >= 0) {
            hr_capture_free(cap);
            return hr_error(HR_ERR_INVALID_ARG,
                            "capture: inputs %d and an earlier input share storage; pass separate tensors", i);
        }
        int v = add_value(cap, inputs[i]);
        if (v < 0) {
            hr_capture_free(cap);
            return hr_error(HR_ERR_OOM, "capture: out of memory");
        }
        if (cap->values[v].kind == HR_VALUE_CONST) hr_buffer_release(cap->values[v].buf);
        cap->values[v].kind = HR_VALUE_INPUT;
        cap->values[v].index = i;
        cap->values[v].base_offset = inputs[i]->offset;
        cap->values[v].base_dtype = inputs[i]->dtype;
        cap->values[v].buf = inputs[i]->buf;
    }
    tl_cap = cap;
    tl_depth = 0;
    hr_host_write_hook = hr_capture_note_host_write;
    return HR_OK;
}

static int add_tensor(hr_capture *cap, const hr_tensor *t) {
    GROW(cap, cap->tensors, cap->n_tensors, cap->cap_tensors);
    int v = add_value(cap, t);
    if (v < 0) return -1;
    hr_cap_tensor *ct = &cap->tensors[cap->n_tensors];
    ct->dtype = t->dtype;
    ct->ndim = t->ndim;
    memcpy(ct->shape, t->shape, sizeof ct->shape);
    memcpy(ct->strides, t->strides, sizeof ct->strides);
    ct->offset = t->offset;
    ct->value = v;
    return cap->n_tensors++;
}

static int record(hr_capture *cap, hr_op op, const void *attrs, const hr_tensor *const *in, int n_in,
                  hr_tensor *const *out, int n_out) {
    if (cap->failure != HR_OK) return -1;
    for (int i = 0; i < n_in; i++) {
        if (in[i]->buf->device != cap->device && cap->device)
            fail(cap, HR_ERR_UNSUPPORTED, "op '%s' reads a tensor on another device", hr_op_name(op));
        if (in[i]->buf->seq > cap->start_seq && host_written(cap, in[i]->buf->seq))
            fail(cap, HR_ERR_UNSUPPORTED,
                 "op '%s' input %d was made from host data during the call; pass it as an input "
                 "of the compiled function instead",
                 hr_op_name(op), i);
    }
    if (!cap->device) cap->device = n_out ? out[0]->buf->device : NULL;
    size_t asize = hr_op_attrs_size(op);
    if (asize > HR_CAPTURE_ATTRS_MAX)
        fail(cap, HR_ERR_INTERNAL, "op '%s' attrs are larger than the capture buffer", hr_op_name(op));
    if (cap->failure != HR_OK) return -1;
    GROW(cap, cap->nodes, cap->n_nodes, cap->cap_nodes);
    hr_cap_node *n = &cap->nodes[cap->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->n_in = n_in;
    n->n_out = n_out;
    n->first_tensor = cap->n_tensors;
    n->attrs_size = asize;
    if (asize && attrs) memcpy(n->attrs, attrs, asize);
    for (int i = 0; i < n_in; i++)
        if (add_tensor(cap, in[i]) < 0) return -1;
    for (int i = 0; i < n_out; i++)
        if (add_tensor(cap, out[i]) < 0) return -1;
    cap->n_nodes++;
    return 0;
}

void hr_capture_record(hr_op op, const void *attrs, const hr_tensor *const *in, int n_in,
                       hr_tensor *const *out, int n_out) {
    if (!hr_capture_recording()) return;
    record(tl_cap, op, attrs, in, n_in, out, n_out);
}

static int note(hr_capture *cap, uint64_t seq) {
    GROW(cap, cap->host_written, cap->n_host_written, cap->cap_host_written);
    cap->host_written[cap->n_host_written++] = seq;
    return 0;
}

void hr_capture_note_host_write(const hr_buffer *buf) {
    if (!tl_cap || tl_depth > 0 || buf->seq <= tl_cap->start_seq) return;
    note(tl_cap, buf->seq);
}

hr_status hr_capture_check_host_read(const hr_tensor *t) {
    hr_capture *cap = tl_cap;
    if (!cap || tl_depth > 0) return HR_OK;
    int v = find_value(cap, t->buf->seq);
    bool made_here = t->buf->seq > cap->start_seq;
    bool input = v >= 0 && cap->values[v].kind == HR_VALUE_INPUT;
    if (!made_here && !input) return HR_OK;
    const char *msg = "the compiled function reads tensor values on the host during the call; "
                      "compute with ops instead (capture cannot replay host decisions)";
    fail(cap, HR_ERR_UNSUPPORTED, "%s", msg);
    return hr_error(HR_ERR_UNSUPPORTED, "%s", msg);
}

hr_status hr_capture_end(hr_capture *cap, hr_tensor *const *outputs, int n_out) {
    tl_cap = NULL;
    hr_host_write_hook = NULL;
    for (int i = 0; i < n_out && cap->failure == HR_OK; i++) {
        int v = find_value(cap, outputs[i]->buf->seq);
        if (v < 0 || cap->values[v].kind != HR_VALUE_TEMP)
            fail(cap, HR_ERR_UNSUPPORTED,
                 "output %d of the compiled function is not a tensor made by its ops (an input, a "
                 "constant, or host data); return a copy",
                 i);
        else if (cap->values[v].kind == HR_VALUE_TEMP) {
            cap->values[v].kind = HR_VALUE_OUTPUT;
            cap->values[v].index = i;
        }
    }
    if (cap->failure != HR_OK) return hr_error(cap->failure, "capture failed: %s", cap->failure_msg);
    return HR_OK;
}

void hr_capture_free(hr_capture *cap) {
    if (tl_cap == cap) tl_cap = NULL, hr_host_write_hook = NULL;
    for (int i = 0; i < cap->n_values; i++)
        if (cap->values[i].kind == HR_VALUE_CONST) hr_buffer_release(cap->values[i].buf);
    free(cap->nodes);
    free(cap->tensors);
    free(cap->values);
    free(cap->host_written);
    memset(cap, 0, sizeof *cap);
}
