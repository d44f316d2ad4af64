/* Tier 2 of the compile cache: plans on disk (HUBRT_CACHE_DIR, default
 * ~/.cache/hubrt; HUBRT_CACHE=0 disables). Each entry carries a checksum
 * and is written atomically; a corrupt, truncated or stale entry is
 * ignored (and rebuilt by the caller), never trusted. */
#ifndef HR_GRAPH_DISK_CACHE_H
#define HR_GRAPH_DISK_CACHE_H

#include "graph/plan.h"
#include "hubrt/graph.h"

bool hr_disk_cache_enabled(void);
/* Fills buf with the cache folder; false when it cannot be determined. */
bool hr_disk_cache_dir(char *buf, size_t n);
hr_status hr_disk_cache_load(uint64_t key, const char *name, hr_jit_resolve_fn resolve, void *ctx,
                             bool fold_constants, const hr_tensor *const *inputs, int n_in, int n_out,
                             hr_plan **out);
/* Best effort: a plan that cannot be written (unnamed constants, I/O
 * error) is only logged. */
void hr_disk_cache_store(uint64_t key, const char *name, const hr_plan *plan, hr_jit_resolve_fn resolve,
                         void *ctx);
void hr_compile_stats_note_reject(void);

/* Exposed for tests: serialize to / parse from memory. */
hr_status hr_plan_serialize(const hr_plan *plan, uint64_t key, hr_jit_resolve_fn resolve, void *ctx,
                            unsigned char **data, size_t *len);
hr_status hr_plan_deserialize(const unsigned char *data, size_t len, uint64_t key, hr_jit_resolve_fn resolve,
                              void *ctx, bool fold_constants, const hr_tensor *const *inputs, int n_in, int n_out,
                              hr_plan **out);

#endif
