/* hubrt compile path (public API): capture a function's ops once per input
 * signature, plan its memory, and replay it as a flat list of kernel calls.
 *
 * Semantics follow tinygrad's JIT: the first call with a new signature runs
 * the function eagerly while recording every op; later calls with the same
 * signature replay the recording with the new inputs, skipping dispatch,
 * inference and allocation. Tensors that existed before the call (weights,
 * a KV cache) are constants bound by pointer and may be updated in place;
 * tensors made during the call live in one arena planned by liveness. A
 * function that reads tensor values on the host or builds tensors from host
 * data during the call cannot be replayed; capture fails loudly. */
#ifndef HUBRT_GRAPH_H
#define HUBRT_GRAPH_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HR_JIT_MAX_IO 16

typedef struct hr_jit hr_jit;

/* The function to compile: reads `inputs`, stores new tensors in outputs. */
typedef hr_status (*hr_jit_fn)(void *ctx, const hr_tensor *const *inputs, int n_in,
                               hr_tensor **outputs, int n_out);

/* Maps a constant's tensor name to the live tensor, so a plan read from the
 * disk cache can bind weights and caches of a new process. NULL: plans of
 * this function stay in memory only. */
typedef const hr_tensor *(*hr_jit_resolve_fn)(void *ctx, const char *name);

typedef struct hr_jit_options {
    const char *name;           /* names the function in stats, warnings, files */
    hr_jit_fn fn;
    void *ctx;
    hr_jit_resolve_fn resolve;  /* optional */
    void *resolve_ctx;
    /* Identifies the constants (e.g. a hash of the model's config and
     * tensor names) so disk entries of another model never match. */
    uint64_t fingerprint;
    /* Constants that no op of the function writes are never changed by
     * the caller either (weights): ops reading only them run once at
     * compile time and their results are kept. */
    bool fold_constants;
} hr_jit_options;

HR_API hr_status hr_jit_create(const hr_jit_options *opts, hr_jit **out);
HR_API void hr_jit_free(hr_jit *jit);
/* Runs the function, compiled for this input signature (shapes, dtypes,
 * strides, device). Each outputs[i] receives a new tensor. */
HR_API hr_status hr_jit_call(hr_jit *jit, const hr_tensor *const *inputs, int n_in,
                             hr_tensor **outputs, int n_out);
/* Plans this jit holds in memory. */
HR_API int hr_jit_num_plans(const hr_jit *jit);

/* Process-wide compile-cache statistics. */
typedef struct hr_compile_stats {
    int64_t requests;   /* hr_jit_call calls */
    int64_t hits;       /* served by a plan in memory */
    int64_t disk_hits;  /* plans loaded from the disk cache */
    int64_t compiles;   /* plans built (captured) in this process */
    int64_t disk_rejects; /* disk entries ignored as corrupt, truncated or stale */
    double compile_ms;  /* time spent capturing and planning */
} hr_compile_stats;

HR_API void hr_compile_stats_get(hr_compile_stats *out);
HR_API void hr_compile_stats_reset(void);

#ifdef __cplusplus
}
#endif
#endif
