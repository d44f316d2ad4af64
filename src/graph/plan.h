/* A compiled plan: the captured ops as a flat list of kernel calls over
 * prebuilt tensor structs whose buffers are bound once (constants, the
 * arena) or per call (inputs, outputs). */
#ifndef HR_GRAPH_PLAN_H
#define HR_GRAPH_PLAN_H

#include "backends/cpu/k_fused.h"
#include "graph/capture.h"

typedef struct hr_plan_value {
    hr_value_kind kind;
    int index;
    size_t nbytes;
    size_t arena_offset;  /* TEMP on host devices */
    hr_buffer *owned;     /* TEMP on other devices: a device buffer of its own */
    hr_buffer *constant;  /* CONST: retained */
    int64_t base_offset;  /* INPUT: element offset at capture */
    hr_dtype base_dtype;
    char name[HR_TENSOR_NAME_CAP];
    int64_t name_offset;  /* CONST: element offset of the named tensor at capture */
    hr_buffer bound;      /* what the plan's tensors point at */
} hr_plan_value;

typedef struct hr_plan_node {
    hr_op op;
    int n_in, n_out;
    int first_tensor;
    bool empty;  /* every output has no elements: the kernel is skipped */
    bool dead;   /* no live value depends on it (dead-code elimination) */
    bool folded; /* reads only weights: ran once at build, result kept */
    bool absorbed; /* an earlier fused node does its work */
    int fused;     /* 1 + index into plan->fused: runs that kernel instead of op */
    int threads;   /* planned thread count (graph/plan_threads.c); 0: the kernel's choice */
    size_t attrs_size;
    unsigned char attrs[HR_CAPTURE_ATTRS_MAX];
} hr_plan_node;

/* Whether the node's work happens at each call: not removed by DCE, not
 * folded at build, some output not empty. Absorbed nodes count: their
 * fused node does the work. */
static inline bool hr_plan_node_live(const hr_plan_node *n) { return !n->dead && !n->folded && !n->empty; }

/* A fused CPU node (graph/fuse.c): linears or an elementwise chain, and
 * every tensor it reads or writes, for liveness. */
typedef struct hr_plan_fused {
    bool is_chain;
    hr_fused_linear k;
    hr_fused_chain chain;
    int n_touched;
    const hr_tensor *touched[HR_FUSED_MAX_OPERANDS + 1 > 4 * HR_FUSED_MAX_LINEARS ? HR_FUSED_MAX_OPERANDS + 1
                                                                                   : 4 * HR_FUSED_MAX_LINEARS];
} hr_plan_fused;

typedef struct hr_plan {
    hr_device *device;
    int n_nodes;
    hr_plan_node *nodes;
    int n_tensors;
    hr_tensor *tensors;       /* node inputs then outputs; buf -> values[].bound */
    const hr_tensor **in_ptrs; /* per tensor, for kernel calls */
    int n_values;
    hr_plan_value *values;
    size_t arena_size;
    void *arena;
    int n_in, n_out;
    hr_tensor *outputs;       /* layout of each returned tensor (buf = value index) */
    int *output_value;
    uint64_t structure_hash;  /* ops, attrs and layouts: part of the disk key */
    int n_dead, n_folded;     /* what the passes removed */
    int n_absorbed;           /* nodes whose work a fused node does */
    int n_chains;             /* fused nodes that run elementwise chains */
    int n_inplace;            /* outputs given a dead input's arena slot */
    int n_serial;             /* nodes planned on one thread */
    int pool_threads;         /* the pool's size when the threads were planned */
    int n_fused, cap_fused;
    hr_plan_fused *fused;
    double build_ms;          /* passes and arena, capture excluded */
    bool portable;            /* every constant has a name: may go to disk */
} hr_plan;

/* Builds a plan from a finished capture and the function's outputs. */
hr_status hr_plan_build(const hr_capture *cap, hr_tensor *const *outputs, int n_in, int n_out,
                        bool fold_constants, hr_plan **out);
/* Replays the plan with new inputs (same layouts as at capture); each
 * outputs[i] receives a new tensor. recycle, NULL or HR_JIT_MAX_IO slots
 * kept by the caller across runs, holds the previous run's output buffers:
 * a run writes its outputs into those no tensor references any more (the
 * caller freed what it was given) and leaves this run's there. */
hr_status hr_plan_run(hr_plan *plan, const hr_tensor *const *inputs, hr_tensor **outputs, hr_buffer **recycle);
/* Output buffers replays have allocated in this process (for tests). */
long long hr_plan_output_allocs(void);
void hr_plan_free(hr_plan *plan);

/* The index of the value a plan tensor points at (its buf is the value's
 * `bound` header). */
int hr_plan_value_index(const hr_plan *plan, const hr_tensor *t);

/* Plans each running node's thread count (HUBRT_PLAN_THREADS=0: none). */
void hr_plan_assign_threads(hr_plan *plan);

/* Assigns arena offsets to TEMP values by liveness (exposed for tests). */
size_t hr_plan_assign_arena(hr_plan *plan);

#endif
