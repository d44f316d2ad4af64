/* The cpu device: host buffers (64-byte aligned; large ones their own
 * mappings on huge page boundaries) and eager kernels from the per-group
 * tables. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backends/cpu/plan_passes.h"
#include "backends/cpu/weights_anon.h"
#include "core/anon_map.h"
#include "core/mem_budget.h"
#include "core/error.h"
#include "device/device_impl.h"
#include "ops/op_impl.h"

#define HUGE_THRESHOLD (4u << 20)
#define HUGE_ALIGN (2u << 20)

static hr_cpu_kernel_fn g_kernels[HR_OP_COUNT];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_kernels(void) {
#define HR_X_(g) hr_cpu_register_##g(g_kernels);
    HR_OP_GROUPS(HR_X_)
#undef HR_X_
}

const hr_cpu_kernel_fn *hr_cpu_kernel_table(void) {
    pthread_once(&g_once, build_kernels);
    return g_kernels;
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static void cpu_buffer_free(hr_buffer *buf) {
    if (buf->nbytes >= HUGE_THRESHOLD)
        munmap(buf->data, round_up(buf->nbytes, HUGE_ALIGN));
    else
        free(buf->data);
    hr_mem_release(buf->nbytes);
    free(buf);
}

static hr_status cpu_buffer_alloc(hr_device *dev, size_t nbytes, hr_buffer **out) {
    HR_TRY(hr_mem_reserve(nbytes, "cpu: a buffer"));
    hr_buffer *buf = calloc(1, sizeof *buf);
    if (!buf) {
        hr_mem_release(nbytes);
        return hr_error(HR_ERR_OOM, "cpu: out of memory allocating a buffer header");
    }
    /* Large buffers are their own anonymous mappings, on huge page
     * boundaries (weights cast at load collapse into huge pages there):
     * new mappings read as zeros, so a zero-filled one (a KV cache) needs
     * no memset, and pages never written (the cache's unused capacity) are
     * never faulted in. */
    bool large = nbytes >= HUGE_THRESHOLD;
    void *p = large ? hr_anon_map_aligned(round_up(nbytes, HUGE_ALIGN), HUGE_ALIGN)
                    : aligned_alloc(64, nbytes ? round_up(nbytes, 64) : 64);
    if (!p) {
        free(buf);
        hr_mem_release(nbytes);
        return hr_error(HR_ERR_OOM, "cpu: out of memory allocating %zu bytes", nbytes);
    }
    /* No MADV_HUGEPAGE: these are mostly activations and KV caches, new
     * memory on every request, and on the VMs this runs on a huge page
     * the host has not backed yet costs more to fault in than the 4 KiB
     * pages it replaces (64 MiB first touched by a new process: 149 ms
     * with THP, 34 ms without; a prefill of 512 tokens on the Qwen3 shape
     * went from ~340 to ~365 tok/s without them); Qwen3-shaped decode
     * at batch 64 reads its KV cache as fast either way. Weights that
     * stream every token get huge pages at load (models/weights_anon.c). */
    atomic_init(&buf->refcount, 1);
    buf->device = dev;
    buf->data = p;
    buf->nbytes = nbytes;
    buf->zeroed = large;
    *out = buf;
    return HR_OK;
}

static hr_status cpu_copy_from_host(hr_device *dev, hr_buffer *dst, size_t off, const void *src,
                                    size_t n) {
    if (off > dst->nbytes || n > dst->nbytes - off)
        return hr_error(HR_ERR_INVALID_ARG, "cpu: copy of %zu bytes at %zu overruns a %zu-byte buffer", n,
                        off, dst->nbytes);
    memmove((char *)dst->data + off, src, n);
    return HR_OK;
}

static hr_status cpu_copy_to_host(hr_device *dev, const hr_buffer *src, size_t off, void *dst,
                                  size_t n) {
    if (off > src->nbytes || n > src->nbytes - off)
        return hr_error(HR_ERR_INVALID_ARG, "cpu: copy of %zu bytes at %zu overruns a %zu-byte buffer", n,
                        off, src->nbytes);
    memmove(dst, (const char *)src->data + off, n);
    return HR_OK;
}

static hr_status cpu_run_op(hr_device *dev, hr_op op, const void *attrs, const hr_tensor *const *in,
                            int n_in, hr_tensor *const *out, int n_out) {
    hr_cpu_kernel_fn k = hr_cpu_kernel_table()[op];
    if (!k) return hr_error(HR_ERR_UNSUPPORTED, "op '%s' has no cpu kernel", hr_op_name(op));
    return k(attrs, in, n_in, out, n_out);
}

static const hr_device_vtable cpu_vtable = {
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .copy_from_host = cpu_copy_from_host,
    .copy_to_host = cpu_copy_to_host,
    .run_op = cpu_run_op,
    .plan_passes = hr_cpu_plan_passes,
    .inplace_ok = hr_cpu_inplace_ok,
    .prepare_weights = hr_cpu_prepare_weights,
};

static hr_device g_cpu = {.vt = &cpu_vtable, .backend = "cpu", .index = 0, .host_visible = true};

static int cpu_count(void) { return 1; }

static hr_status cpu_open(int index, hr_device **out) {
    *out = &g_cpu;
    return HR_OK;
}

static const hr_device_backend cpu_backend = {.name = "cpu", .count = cpu_count, .open = cpu_open};
HR_BACKEND_REGISTER(cpu_backend, 101)
