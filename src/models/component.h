/* A diffusers pipeline component's folder (vae/, transformer/,
 * text_encoder/ ...) as the Hub stores it: its config.json and its
 * weights (diffusion_pytorch_model[.variant].safetensors, or the sharded
 * form with its index; transformers' model[.variant].safetensors for the
 * text encoders), and the parameters a component takes from them, each
 * checked against the shape the config implies. */
#ifndef HR_MODELS_COMPONENT_H
#define HR_MODELS_COMPONENT_H

#include "hubrt/image_models.h"
#include "hubrt/io.h"

typedef struct hr_component {
    char dir[1024];
    hr_json_doc *config;
    hr_checkpoint *ck;
    hr_device *dev;
    hr_dtype dtype;
    hr_tensor **owned; /* every parameter loaded, freed with the component */
    size_t n_owned, cap_owned;
} hr_component;

/* Opens `dir`: its config.json (whose _class_name, when present, must be
 * one of `classes`, a NULL-terminated list) and the weight file of
 * opts->variant, for opts->device in opts->dtype (NULL or "auto": the
 * stored dtype of the first floating tensor); opts may be NULL. On
 * failure c is left closed (hr_component_close on it is a no-op). */
hr_status hr_component_open(hr_component *c, const char *dir, const char *const *classes,
                            const hr_component_options *opts);
void hr_component_close(hr_component *c);
/* A transformers config's architectures[0], when given, must be one of
 * `archs` (NULL-terminated); `what` names the family in the error. */
hr_status hr_component_check_arch(const hr_component *c, const char *const *archs, const char *what);

/* Parameter `name` converted to the component's dtype on its device, its
 * shape checked against [ndim] shape (an error names the file and the
 * tensor). The component owns it. */
hr_status hr_component_param(hr_component *c, const char *name, int ndim, const int64_t *shape, hr_tensor **out);
/* The same for "<prefix>.weight" and, when `bias`, "<prefix>.bias" [shape[0]]. */
hr_status hr_component_wb(hr_component *c, const char *prefix, int ndim, const int64_t *shape, bool bias,
                          hr_tensor **w, hr_tensor **b);

/* An input of the component's forward: t in dtype dt (HR_DTYPE_COUNT:
 * its own) on the component's device, a new tensor. */
hr_status hr_component_input(const hr_component *c, const hr_tensor *t, hr_dtype dt, hr_tensor **out);

/* A forward's error flow: RUN jumps to `done` on failure (with `s` set);
 * KEEP records a temporary in `tp`; T does both for a call making y. */
#define RUN(expr) \
    do { \
        if ((s = (expr)) != HR_OK) goto done; \
    } while (0)
#define KEEP(t) RUN(hr_temp_add(&tp, (t)))
#define T(y, call) \
    do { \
        RUN(call); \
        KEEP(y); \
    } while (0)

/* The temporaries of one forward block, freed in one call. */
#define HR_TEMPS_CAP 64
typedef struct hr_temps {
    hr_tensor *t[HR_TEMPS_CAP];
    int n;
} hr_temps;
/* Records t (NULL is ignored); when full, frees t and fails. */
hr_status hr_temp_add(hr_temps *tp, hr_tensor *t);
void hr_temps_free(hr_temps *tp);

#endif
