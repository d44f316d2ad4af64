/* CPU fusion passes over a built plan (host devices only): the captured
 * node list stays as it is (it is what the disk cache stores and the
 * structure hash covers); fusion marks nodes and adds fused kernels, so a
 * plan loaded from disk is fused again by the same pass. */
#ifndef HR_GRAPH_FUSE_H
#define HR_GRAPH_FUSE_H

#include "graph/plan.h"

/* Linears reading the same rows (q/k/v, gate/up) become one node; a
 * silu_mul of a gate/up pair and a residual add after a linear go into
 * its epilogue when the intermediate is dead after them. */
hr_status hr_plan_fuse(hr_plan *p);

/* Runs of consecutive elementwise nodes (the eltwise ops and casts on
 * float dtypes) whose intermediates nothing else reads become one chain
 * node; the other operands may broadcast and have any strides. */
hr_status hr_plan_fuse_chains(hr_plan *p);

#endif
