/* Tensor parallelism of a decoder (tp.c): transformers' tp_plan styles
 * resolved against a model's weights, the slice of each weight this rank
 * loads, and the config seen from one rank.
 *
 * A split attention holds this rank's query heads and their kv heads
 * (kv heads split when kv % tp == 0, the one a rank's query heads read
 * when tp % kv == 0) and sums o_proj's partial rows over the ranks; a
 * split MLP holds part of intermediate_size and sums down_proj's; a
 * vocab-split embedding looks up its rows and sums, and a vocab-split
 * head gathers the logits. What no plan entry names is replicated (norms,
 * routers and experts: MoE experts are outside tp_plan, as in
 * transformers) unless ep_size splits them: each rank then holds its
 * experts, runs the tokens routed to them (the others' slots add nothing)
 * and the outputs are summed. */
#ifndef HR_MODELS_TP_H
#define HR_MODELS_TP_H

#include "models/model_impl.h"

typedef enum hr_tp_style {
    HR_TP_REPLICATED = 0,
    HR_TP_COLWISE,               /* output rows split; "colwise" */
    HR_TP_ROWWISE,               /* input columns split, partial sums reduced; "rowwise", "rowwise_split_input" */
    HR_TP_COLWISE_GATHER_OUTPUT, /* output rows split, outputs gathered (the head) */
    HR_TP_EMBEDDING_ROWWISE,     /* the table's rows (vocab) split, lookups reduced */
} hr_tp_style;


/* Resolves `plan` (NULL or "auto": the architecture's; else a JSON
 * object of module pattern -> style laid over it) for tp_size ranks and
 * the experts' split over ep_size (tp_size's group, or alone),
 * joins the process group, checks the shapes divide, and turns m->cfg
 * into this rank's view (heads, kv heads, intermediate_size). After the
 * weights were checked against the full config, before they load. */
hr_status hr_tp_setup(hr_model *m, int64_t tp_size, int64_t ep_size, const char *plan);
/* The part of weight `name` (dims as its table gives them, layer il) this
 * rank loads: rows [first, first + len) of dim *axis, or *axis -1 for
 * all of it. */
void hr_tp_slice(const hr_model *m, const char *name, const hr_dim *dims, int64_t il, int *axis, int64_t *first,
                 int64_t *len);

#endif
