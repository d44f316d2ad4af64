/* A forward's activations by name: each block asks for the tensor it
 * writes ("q", "attn", ...) with its shape, and gets the one it had at the
 * last call when the shape and dtype are the same, so a decode step
 * allocates nothing; a new shape replaces that slot. Names make errors
 * and a debugger show which activation is at fault ("act.q"). */
#ifndef HR_MODELS_SCRATCH_H
#define HR_MODELS_SCRATCH_H

#include "core/tensor_impl.h"

#define HR_SCRATCH_SLOTS 64

typedef struct hr_scratch {
    int n;
    struct {
        char name[24];
        hr_tensor *t;
    } slot[HR_SCRATCH_SLOTS];
} hr_scratch;

/* The activation `name`: [ndim] shape, dtype dt, on dev. The tensor stays
 * the scratch's; it lives until the slot is reshaped or the scratch freed. */
hr_status hr_scratch_get(hr_scratch *sc, hr_device *dev, const char *name, hr_dtype dt, int ndim,
                         const int64_t *shape, hr_tensor **out);
void hr_scratch_free(hr_scratch *sc);

#endif
