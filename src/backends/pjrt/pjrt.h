/* The PJRT device backends ("xla_cpu", "tpu"): what the rest of hubrt and
 * the tools may call. Builds without the PJRT header too, in which case
 * every backend reports "built without PJRT headers". */
#ifndef HR_PJRT_PJRT_H
#define HR_PJRT_PJRT_H

#include "device/device_impl.h"

/* What `hubrt info` prints about a PJRT backend. */
typedef struct hr_pjrt_info {
    char path[512];     /* the plugin library loaded */
    char platform[64];  /* "cpu", "tpu" */
    char version[128];  /* platform version string */
    int api_major, api_minor; /* the plugin's PJRT C API version */
    int num_devices;
} hr_pjrt_info;

/* Loads the backend's plugin (once) and describes it; HR_ERR_NOT_FOUND with
 * the paths searched when there is none. */
HR_API hr_status hr_pjrt_backend_info(const char *backend, hr_pjrt_info *out);

/* Executable cache counters of one backend, all devices together: misses
 * of the memory tier, of which disk_hits were loaded from the disk tier
 * and the rest compiled (in compile_seconds). graph_misses: the misses
 * that were whole compiled graphs (one module per captured function and
 * signature). graph_runs: executions of compiled graphs; in_place: the
 * arguments those executions updated (a KV cache) whose new array came
 * back at the old array's address, i.e. written in place. */
typedef struct hr_pjrt_cache_stats {
    int64_t requests, hits, misses;
    double compile_seconds;
    int64_t disk_hits;
    int64_t graph_misses, graph_runs, in_place;
} hr_pjrt_cache_stats;

HR_API hr_status hr_pjrt_cache_stats_get(const char *backend, hr_pjrt_cache_stats *out);

/* Sums the tensors (one per device of the same backend, same shape and
 * dtype) with a cross-replica all_reduce; each receives the sum in place. */
HR_API hr_status hr_pjrt_all_reduce_sum(hr_tensor *const *ts, int n);

/* Runs one-output `op` as one StableHLO module of n replicas, replica r on
 * the device of its inputs ins[r n_in .. r n_in + n_in) (each replica's
 * own device of one PJRT backend; the same shapes and dtypes): the
 * collectives (all_reduce, all_gather, broadcast) run inside the module,
 * across the replicas. outs[r] receives replica r's output, on its
 * device. One process driving several devices; how one process per chip
 * (TPU) would run them is docs/distributed.md's. */
HR_API hr_status hr_pjrt_run_replicated(hr_op op, const void *attrs, const hr_tensor *const *ins, int n_in, int n,
                                        hr_tensor **outs);

#endif
