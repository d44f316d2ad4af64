/* Eager dispatch: validate, infer, allocate, run on the inputs' device, or
 * fall back to the CPU (with a one-time warning) when the device cannot. */
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>

#include "core/error.h"
#include "device/device_impl.h"
#include "ops/capture.h"
#include "ops/profile.h"
#include "ops/op_impl.h"

static const hr_infer_fn *g_infer;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static hr_infer_fn g_infer_table[HR_OP_COUNT];

static void build_tables(void) {
#define HR_X_(g) hr_infer_register_##g(g_infer_table);
    HR_OP_GROUPS(HR_X_)
#undef HR_X_
    g_infer = g_infer_table;
}

const hr_infer_fn *hr_infer_table(void) {
    pthread_once(&g_once, build_tables);
    return g_infer;
}

/* One warning per (backend, op) when an op falls back to the CPU. */
static atomic_bool g_fallback_warned[8][HR_OP_COUNT];

/* Prefixes "op 'name'" unless the message already starts with the name
 * (inference helpers name their op themselves). */
static hr_status op_context(hr_status s, const char *name) {
    const char *msg = hr_last_error();
    size_t n = strlen(name);
    if (strncmp(msg, name, n) || msg[n] != ':') return hr_error_context(s, "op '%s'", name);
    char rest[1024];
    snprintf(rest, sizeof rest, "%s", msg + n + 1);
    return hr_error(s, "op '%s':%s", name, rest);
}

/* Whether input i of op may be block-quantized: linear's weight, each
 * weight of a linear_group, embedding's table. */
static bool reads_blocks(hr_op op, const void *attrs, int i) {
    if (op == HR_OP_linear) return i == 1;
    if (op == HR_OP_embedding) return i == 0;
    if (op == HR_OP_linear_group) return attrs && i >= 1 && i <= ((const hr_attrs_linear_group *)attrs)->n;
    if (op == HR_OP_experts) return i == 3 || i == 4; /* gate_up and down, on the CPU kernel */
    return false;
}

static hr_status validate(hr_op op, const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor **outs,
                          int n_out) {
    if ((unsigned)op >= HR_OP_COUNT) return hr_error(HR_ERR_INVALID_ARG, "invalid op id %d", (int)op);
    if (n_in < hr_op_min_inputs(op) || n_in > hr_op_max_inputs(op))
        return hr_error(HR_ERR_INVALID_ARG, "op '%s' takes %d..%d inputs, got %d", hr_op_name(op),
                        hr_op_min_inputs(op), hr_op_max_inputs(op), n_in);
    /* attrs that give no output count are refused by the op's inference,
     * which names the attribute at fault */
    int want = hr_op_outputs_for(op, attrs);
    if (want >= 0 && n_out != want)
        return hr_error(HR_ERR_INVALID_ARG, "op '%s' has %d outputs, %d given", hr_op_name(op), want, n_out);
    if (!outs) return hr_error(HR_ERR_INVALID_ARG, "op '%s': outs is NULL", hr_op_name(op));
    for (int i = 0; i < n_in; i++)
        if (!in || !in[i]) return hr_error(HR_ERR_INVALID_ARG, "op '%s': input %d is NULL", hr_op_name(op), i);
    for (int i = 0; i < n_in; i++)
        if (hr_dtype_is_quantized(in[i]->dtype) && !reads_blocks(op, attrs, i))
            return hr_error(HR_ERR_DTYPE, "op '%s': input %d ('%s') is block-quantized (%s); only linear's weight, "
                            "embedding's table and experts' weights are read in blocks", hr_op_name(op), i, in[i]->name,
                            hr_dtype_name(in[i]->dtype));
    for (int i = 0; i < n_out; i++)
        if (outs[i] && hr_dtype_is_quantized(outs[i]->dtype))
            return hr_error(HR_ERR_DTYPE, "op '%s': output %d is block-quantized (%s); no op writes blocks",
                            hr_op_name(op), i, hr_dtype_name(outs[i]->dtype));
    return HR_OK;
}

/* The bytes [*b0, *b1) of a contiguous view in its buffer. */
static void contiguous_bytes(const hr_tensor *t, int64_t *b0, int64_t *b1) {
    *b0 = (int64_t)hr_dtype_nbytes(t->dtype, t->offset);
    *b1 = *b0 + (int64_t)hr_dtype_nbytes(t->dtype, hr_shape_numel(t->ndim, t->shape));
}

/* An output given by the caller must not write one place twice (a
 * broadcast dimension), nor share part of its memory with an input: the
 * kernels read and write in their own order, so the result would depend
 * on it. An output that is exactly an input's view (the same bytes and
 * shape; a cast between same-size dtypes too) runs in place (the eltwise
 * ops, index_copy into a cache); views too tangled to compare cheaply (not
 * both contiguous) are let through, as torch does. */
/* Whether an output may be written over input j exactly: not for the
 * inputs of ops whose every output element reads whole rows or columns of
 * them (it would read its own results), except linear_group's residual,
 * which it reads element for element. */
static bool may_run_in_place(hr_op op, const void *attrs, int j, int n_in) {
    if (op == HR_OP_linear_group)
        return ((const hr_attrs_linear_group *)attrs)->epilogue == HR_LINEAR_RESIDUAL && j == n_in - 1;
    return op != HR_OP_matmul && op != HR_OP_linear && op != HR_OP_sdpa;
}

static hr_status check_overlap(hr_op op, const void *attrs, const char *name, const hr_tensor *const *in, int n_in,
                               const hr_tensor *o, int i) {
    if (hr_shape_numel(o->ndim, o->shape) == 0) return HR_OK;
    for (int d = 0; d < o->ndim; d++)
        if (o->shape[d] > 1 && o->strides[d] == 0)
            return hr_error(HR_ERR_INVALID_ARG,
                            "op '%s': output %d is broadcast along dim %d (stride 0), so several results "
                            "would be written to one place; give a tensor with its own storage",
                            name, i, d);
    if (!hr_tensor_is_contiguous(o)) return HR_OK;
    int64_t a0, a1, b0, b1;
    contiguous_bytes(o, &a0, &a1);
    for (int j = 0; j < n_in; j++) {
        const hr_tensor *t = in[j];
        if (t->buf != o->buf || hr_shape_numel(t->ndim, t->shape) == 0 || !hr_tensor_is_contiguous(t)) continue;
        contiguous_bytes(t, &b0, &b1);
        bool same = a0 == b0 && a1 == b1 && t->ndim == o->ndim &&
                    !memcmp(t->shape, o->shape, sizeof(int64_t) * (size_t)o->ndim) &&
                    may_run_in_place(op, attrs, j, n_in);
        if (!same && a0 < b1 && b0 < a1)
            return hr_error(HR_ERR_INVALID_ARG,
                            "op '%s': output %d overlaps input %d in part (bytes [%lld, %lld) and [%lld, %lld) "
                            "of one buffer); write to separate storage, or to exactly the input's view to "
                            "run in place",
                            name, i, j, (long long)a0, (long long)a1, (long long)b0, (long long)b1);
    }
    return HR_OK;
}

static hr_status run_fallback(hr_device *dev, hr_op op, const void *attrs,
                              const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                              int n_out) {
    hr_device *cpu = hr_device_cpu();
    int bi = 0;
    const char *const *names = hr_device_backends();
    while (names[bi] && strcmp(names[bi], dev->backend)) bi++;
    if (bi < 8 && !atomic_exchange(&g_fallback_warned[bi][op], true))
        hr_log(HR_LOG_WARN, "op '%s' is not supported on device '%s'; running it on the cpu "
               "(this warning is shown once)", hr_op_name(op), dev->backend);
    hr_tensor *hin[HR_MAX_OP_INPUTS] = {0}, *hout[HR_MAX_OP_OUTPUTS] = {0};
    hr_status s = HR_OK;
    for (int i = 0; i < n_in && s == HR_OK; i++) s = hr_tensor_to(in[i], cpu, &hin[i]);
    for (int i = 0; i < n_out && s == HR_OK; i++) s = hr_tensor_to(out[i], cpu, &hout[i]);
    if (s == HR_OK) s = cpu->vt->run_op(cpu, op, attrs, (const hr_tensor *const *)hin, n_in, hout, n_out);
    for (int i = 0; i < n_out && s == HR_OK; i++) {
        if (hr_tensor_is_contiguous(out[i])) {
            size_t n = hr_tensor_nbytes(hout[i]);
            s = dev->vt->copy_from_host(dev, out[i]->buf, hr_dtype_nbytes(out[i]->dtype, out[i]->offset),
                                        hout[i]->buf->data, n);
        } else if (op == HR_OP_copy) {
            s = hr_error(HR_ERR_UNSUPPORTED, "device '%s' cannot write a strided view", dev->backend);
        } else {
            /* A strided destination (a KV-cache slice): stage the result on
             * the device, then let the device's copy write the view. */
            hr_tensor *staged = NULL, *o[1] = {out[i]};
            s = hr_tensor_to(hout[i], dev, &staged);
            if (s == HR_OK) s = hr_op_run_on(dev, HR_OP_copy, NULL, (const hr_tensor *const *)&staged, 1, o, 1);
            hr_tensor_free(staged);
        }
    }
    for (int i = 0; i < n_in; i++) hr_tensor_free(hin[i]);
    for (int i = 0; i < n_out; i++) hr_tensor_free(hout[i]);
    return s;
}

static hr_status op_run_on(hr_device *dev, hr_op op, const void *attrs, const hr_tensor *const *in, int n_in,
                           hr_tensor **outs, int n_out, double *kernel_s) {
    HR_TRY(validate(op, attrs, in, n_in, outs, n_out));
    const char *name = hr_op_name(op);
    for (int i = 0; i < n_in; i++) {
        hr_device *d = in[i]->buf->device;
        if (!dev) dev = d;
        if (d != dev)
            return hr_error(HR_ERR_INVALID_ARG, "op '%s': input %d is on %s:%d but the op runs on %s:%d",
                            name, i, d->backend, d->index, dev->backend, dev->index);
    }
    if (!dev) dev = hr_device_cpu();
    hr_infer_fn infer = hr_infer_table()[op];
    if (!infer) return hr_error(HR_ERR_UNSUPPORTED, "op '%s' has no shape inference", name);
    hr_tensor_meta meta[HR_MAX_OP_OUTPUTS];
    memset(meta, 0, sizeof meta);
    hr_status s = infer(attrs, in, n_in, meta, n_out);
    if (s != HR_OK) return op_context(s, name);

    bool allocated[HR_MAX_OP_OUTPUTS] = {0};
    for (int i = 0; i < n_out && s == HR_OK; i++) {
        if (outs[i]) {
            hr_tensor *o = outs[i];
            bool same = o->dtype == meta[i].dtype && o->ndim == meta[i].ndim;
            for (int d = 0; same && d < o->ndim; d++) same = o->shape[d] == meta[i].shape[d];
            if (!same) {
                char a[160], b[160];
                s = hr_error(HR_ERR_SHAPE, "op '%s': output %d is %s %s but the result is %s %s", name, i,
                             hr_shape_str(o->ndim, o->shape, a, sizeof a), hr_dtype_name(o->dtype),
                             hr_shape_str(meta[i].ndim, meta[i].shape, b, sizeof b),
                             hr_dtype_name(meta[i].dtype));
            } else if (o->buf->device != dev) {
                s = hr_error(HR_ERR_INVALID_ARG, "op '%s': output %d is on %s, not %s", name, i,
                             o->buf->device->backend, dev->backend);
            } else if ((s = check_overlap(op, attrs, name, in, n_in, o, i)) == HR_OK) {
                hr_buffer_drop_packed(o->buf); /* a packed copy would go stale */
            }
        } else {
            s = hr_tensor_empty_meta(dev, &meta[i], &outs[i]);
            allocated[i] = s == HR_OK;
        }
    }
    if (s == HR_OK) {
        bool any = false;
        for (int i = 0; i < n_out; i++) any |= hr_shape_numel(meta[i].ndim, meta[i].shape) > 0;
        if (any) {
            bool supported = dev->vt->run_op &&
                             (!dev->vt->supports_op || dev->vt->supports_op(dev, op, attrs, in, n_in));
            /* Ops that kernels run internally are not part of a capture. */
            hr_capture_enter_op();
            double t0 = kernel_s ? hr_profile_now() : 0;
            if (supported)
                s = dev->vt->run_op(dev, op, attrs, in, n_in, outs, n_out);
            else
                s = run_fallback(dev, op, attrs, in, n_in, outs, n_out);
            if (kernel_s) {
                *kernel_s = hr_profile_now() - t0;
                hr_profile_add(op, *kernel_s);
            }
            hr_capture_leave_op();
            if (s != HR_OK) s = op_context(s, name);
        }
        if (s == HR_OK) hr_capture_record(op, attrs, in, n_in, outs, n_out);
    }
    if (s != HR_OK)
        for (int i = 0; i < n_out; i++)
            if (allocated[i]) {
                hr_tensor_free(outs[i]);
                outs[i] = NULL;
            }
    return s;
}

hr_status hr_op_run_on(hr_device *dev, hr_op op, const void *attrs, const hr_tensor *const *in,
                       int n_in, hr_tensor **outs, int n_out) {
    if (!hr_profile_enabled()) return op_run_on(dev, op, attrs, in, n_in, outs, n_out, NULL);
    double kernel_s = 0, t0 = hr_profile_now();
    hr_status s = op_run_on(dev, op, attrs, in, n_in, outs, n_out, &kernel_s);
    hr_profile_add_dispatch(hr_profile_now() - t0 - kernel_s);
    return s;
}

hr_status hr_op_run(hr_op op, const void *attrs, const hr_tensor *const *in, int n_in,
                    hr_tensor **outs, int n_out) {
    return hr_op_run_on(NULL, op, attrs, in, n_in, outs, n_out);
}
