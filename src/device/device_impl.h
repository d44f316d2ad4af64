/* The device interface: a vtable whose members may be NULL, and the
 * registry of device backends. */
#ifndef HR_DEVICE_IMPL_H
#define HR_DEVICE_IMPL_H

#include "core/tensor_impl.h"

typedef struct hr_plan hr_plan;             /* a compiled plan (graph/plan.h) */
typedef struct hr_executable hr_executable; /* a device's compiled graph */

/* One weight of a model handed to its device at load (prepare_weights). */
typedef struct hr_weight_ref {
    hr_tensor **slot; /* the weight; the device may replace it by its own copy */
    bool linear;      /* read as linear's weight [out, in]: the device may repack it */
} hr_weight_ref;

/* The files a model's weights came from, as the device may release them. */
typedef struct hr_weight_source {
    void *ctx;
    /* Whether [p, p + n) lies in the files' map, dropping those pages from
     * this process (n 0: only asks). */
    bool (*drop_pages)(void *ctx, const void *p, size_t n);
    /* Drops the file pages of the tensor `name` as stored. */
    void (*drop_tensor)(void *ctx, const char *name);
    /* The bytes `name` takes in the files. */
    size_t (*stored_bytes)(void *ctx, const char *name);
} hr_weight_source;

typedef struct hr_device_vtable {
    hr_status (*buffer_alloc)(hr_device *dev, size_t nbytes, hr_buffer **out);
    void (*buffer_free)(hr_buffer *buf);
    hr_status (*copy_from_host)(hr_device *dev, hr_buffer *dst, size_t dst_off,
                                const void *src, size_t nbytes);
    hr_status (*copy_to_host)(hr_device *dev, const hr_buffer *src, size_t src_off,
                              void *dst, size_t nbytes);
    /* Whether run_op can serve this call; NULL means "every op with a kernel". */
    bool (*supports_op)(hr_device *dev, hr_op op, const void *attrs,
                        const hr_tensor *const *in, int n_in);
    /* Outputs are allocated (on this device) and shaped by the caller. */
    hr_status (*run_op)(hr_device *dev, hr_op op, const void *attrs,
                        const hr_tensor *const *in, int n_in, hr_tensor *const *out,
                        int n_out);
    /* Whole-graph compilation (NULL: hr_jit replays the plan op by op).
     * `g` is a plan built on this device; it outlives the
     * executable. A device with `compile` may skip its kernels while a
     * capture is active (hr_capture_active()): the capture only records,
     * and hr_jit runs the executable to produce the call's results.
     * HR_ERR_UNSUPPORTED means "replay the plan instead". `name` names
     * the function in dumps and messages. */
    hr_status (*compile)(hr_device *dev, const hr_plan *g, const char *name, hr_executable **out);
    /* Runs exe on the inputs (the layouts it was compiled for); each
     * out[i] receives a new tensor; constants the graph writes are
     * updated in place. */
    hr_status (*execute)(hr_device *dev, hr_executable *exe, const hr_tensor *const *in,
                         int n_in, hr_tensor **out, int n_out);
    void (*executable_free)(hr_device *dev, hr_executable *exe);
    /* The device's own passes over a plan built for it, after dead code
     * and folding and before memory planning: substitutions for runs of
     * nodes (hr_plan_substitute), each node's thread count (the CPU's
     * fusion and threading plan). NULL: none. */
    hr_status (*plan_passes)(hr_device *dev, hr_plan *plan);
    /* Whether the device's kernel for `op` may write an output over an
     * input of the same layout (each element read before its place is
     * written), so the plan may give the output that input's memory when
     * the input dies there. NULL: never. */
    bool (*inplace_ok)(hr_device *dev, hr_op op);
    /* Puts a model's weights, once loaded, where and how the device reads
     * them fastest (the CPU: anonymous huge pages, linear weights packed
     * into the panels its kernels read). NULL: they stay as they are. */
    hr_status (*prepare_weights)(hr_device *dev, hr_weight_ref *w, size_t n, const hr_weight_source *src);
    hr_status (*sync)(hr_device *dev);
} hr_device_vtable;

struct hr_device {
    const hr_device_vtable *vt;
    const char *backend; /* "cpu", "xla_cpu", "tpu" */
    int index;
    bool host_visible;   /* buffer data pointers are CPU addresses */
    void *impl;
};

typedef struct hr_device_backend {
    const char *name;
    /* Number of devices this backend can open (0 when unavailable). */
    int (*count)(void);
    /* Opens device `index`; called once per index, the result is cached. */
    hr_status (*open)(int index, hr_device **out);
} hr_device_backend;

/* A buffer of `nbytes` on dev, freed by the device when released. */
hr_status hr_device_buffer_alloc(hr_device *dev, size_t nbytes, hr_buffer **out);

/* Adds a backend. The built-in ones call it from constructors in
 * src/backends/ (HR_BACKEND_REGISTER), in the order of their priorities:
 * cpu first. */
hr_status hr_device_register_backend(const hr_device_backend *backend);

#define HR_BACKEND_REGISTER(backend, priority)                                           \
    __attribute__((constructor(priority))) static void hr_register_##backend(void) { \
        hr_device_register_backend(&backend);                                            \
    }

#endif
