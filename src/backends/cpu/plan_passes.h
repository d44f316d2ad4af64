/* The CPU device's work on a compiled plan (the device vtable's
 * plan_passes and inplace_ok): fusion of decode linears and of
 * elementwise chains into substitutions, and the threading plan. */
#ifndef HR_BACKENDS_CPU_PLAN_PASSES_H
#define HR_BACKENDS_CPU_PLAN_PASSES_H

#include "device/device_impl.h"
#include "graph/plan.h"

/* Linears reading the same rows (q/k/v, gate/up) become one substitution;
 * a silu_mul of a gate/up pair and a residual add after a linear go into
 * its epilogue when the intermediate is dead after them. */
hr_status hr_cpu_plan_fuse(hr_plan *p);
/* Runs of consecutive elementwise nodes (the eltwise ops and casts on
 * float dtypes) whose intermediates nothing else reads become one chain;
 * the other operands may broadcast and have any strides. */
hr_status hr_cpu_plan_fuse_chains(hr_plan *p);
/* Each running node's thread count (HUBRT_PLAN_THREADS=0: none); returns
 * how many run on one thread. */
int hr_cpu_plan_threads(hr_plan *p);

hr_status hr_cpu_plan_passes(hr_device *dev, hr_plan *p);
bool hr_cpu_inplace_ok(hr_device *dev, hr_op op);

#endif
