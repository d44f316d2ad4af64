/* What the eager and the compiled forward share (forward.c). */
#ifndef HR_MODELS_FORWARD_INTERNAL_H
#define HR_MODELS_FORWARD_INTERNAL_H

#include "models/blocks.h"

/* Whether some layer is of this kind. */
bool hr_model_has_kind(const hr_model *m, hr_layer_kind kind);
/* The rope frequencies of each kind that do not depend on the length. */
hr_status hr_model_rope_init(hr_model *m);
/* cos/sin of every kind the model has, for positions [b, s] (host pos and
 * the same as a tensor) into f's activations; tables[2k], tables[2k + 1]
 * (and f->cos[k], f->sin[k]) point at them, NULL for absent kinds. */
hr_status hr_model_rope_all(hr_fwd *f, const int64_t *pos, const hr_tensor *positions, hr_tensor **tables);
/* Embedding, the architecture's layers and the head over f. */
hr_status hr_model_forward_core(hr_fwd *f, const hr_tensor *ids, bool last_only, bool f32_logits,
                                hr_tensor **logits);

#endif
