/* Named activations reused across forward calls (scratch.h). */
#include "models/scratch.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

static bool fits(const hr_tensor *t, hr_device *dev, hr_dtype dt, int ndim, const int64_t *shape) {
    return t->dtype == dt && t->ndim == ndim && t->buf->device == dev &&
           !memcmp(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

hr_status hr_scratch_get(hr_scratch *sc, hr_device *dev, const char *name, hr_dtype dt, int ndim,
                         const int64_t *shape, hr_tensor **out) {
    int i = 0;
    while (i < sc->n && strcmp(sc->slot[i].name, name)) i++;
    if (i == sc->n) {
        if (sc->n == HR_SCRATCH_SLOTS) return hr_error(HR_ERR_INTERNAL, "scratch: more than %d activations", HR_SCRATCH_SLOTS);
        snprintf(sc->slot[i].name, sizeof sc->slot[i].name, "%s", name);
        sc->slot[i].t = NULL;
        sc->n++;
    }
    hr_tensor **t = &sc->slot[i].t;
    if (!*t || !fits(*t, dev, dt, ndim, shape)) {
        hr_tensor_free(*t);
        *t = NULL;
        hr_status s = hr_tensor_empty(dev, dt, ndim, shape, t);
        if (s != HR_OK) return hr_error_context(s, "activation '%s'", name);
        char label[32];
        snprintf(label, sizeof label, "act.%s", name);
        hr_tensor_set_name(*t, label);
    }
    *out = *t;
    return HR_OK;
}

void hr_scratch_free(hr_scratch *sc) {
    for (int i = 0; i < sc->n; i++) hr_tensor_free(sc->slot[i].t);
    sc->n = 0;
}
