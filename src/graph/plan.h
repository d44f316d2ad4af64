/* A compiled plan: the captured ops as a flat list of kernel calls over
 * prebuilt tensor structs whose buffers are bound once (constants, the
 * arena) or per call (inputs, outputs). */
#ifndef HR_GRAPH_PLAN_H
#define HR_GRAPH_PLAN_H

#include "ops/capture.h"

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
    bool absorbed; /* an earlier node's substitution does its work */
    int subst;     /* 1 + index into plan->subst: runs that instead of op */
    int threads;   /* the thread count its device planned; 0: the kernel's choice */
    size_t attrs_size;
    unsigned char attrs[HR_CAPTURE_ATTRS_MAX];
} hr_plan_node;

/* Whether the node's work happens at each call: not removed by DCE, not
 * folded at build, some output not empty. Absorbed nodes count: their
 * substitution does the work. */
static inline bool hr_plan_node_live(const hr_plan_node *n) { return !n->dead && !n->folded && !n->empty; }

#define HR_PLAN_SUBST_MAX_IN 12
#define HR_PLAN_SUBST_MAX_OUT HR_MAX_OP_OUTPUTS

/* A device's replacement for a run of nodes, added by its plan_passes
 * (the CPU backend's fused linears and elementwise chains): the node it
 * is attached to runs run(ctx) instead of its op, the nodes it absorbed
 * run nothing. in and out are every plan tensor it reads and writes, for
 * liveness and in-place planning. */
typedef struct hr_plan_subst {
    const char *kind;             /* for logs and tests: "fused_linear", "chain" */
    hr_status (*run)(void *ctx);
    void *ctx;                    /* malloc'd by the device, freed with the plan */
    int n_in, n_out;
    const hr_tensor *in[HR_PLAN_SUBST_MAX_IN];
    const hr_tensor *out[HR_PLAN_SUBST_MAX_OUT];
    bool inplace_ok;              /* may write an output over a dead input of the same layout */
} hr_plan_subst;

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
    int n_absorbed;           /* nodes whose work a substitution does */
    int n_inplace;            /* outputs given a dead input's arena slot */
    int pool_threads;         /* the pool's size when the threads were planned */
    int n_subst, cap_subst;
    hr_plan_subst *subst;
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

/* Attaches `sub` to node `head` and marks the `n_absorbed` nodes listed
 * in `absorbed` as done by it; the plan takes sub->ctx. */
hr_status hr_plan_substitute(hr_plan *plan, int head, const hr_plan_subst *sub, const int *absorbed, int n_absorbed);
/* The substitutions of this kind (tests, logs). */
int hr_plan_count_subst(const hr_plan *plan, const char *kind);

/* Assigns arena offsets to TEMP values by liveness (exposed for tests). */
size_t hr_plan_assign_arena(hr_plan *plan);

#endif
