/* A diffusers component folder: config.json, weights, checked parameters. */
#include "models/component.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/path.h"
#include "core/tensor_impl.h"
#include "hubrt/ops.h"

/* The weight file of `variant` in dir, as diffusers and transformers name
 * them: <stem>[.variant].safetensors, or the index <stem>.safetensors.index
 * [.variant].json, for the stems diffusion_pytorch_model and model. */
static hr_status find_weights(const char *dir, const char *variant, char *out, size_t n) {
    static const char *const stems[] = {"diffusion_pytorch_model", "model"};
    char v[64] = "";
    if (variant && *variant) {
        if (strlen(variant) > 32 || strchr(variant, '/'))
            return hr_error(HR_ERR_INVALID_ARG, "variant '%s' is not a weight-file variant name", variant);
        snprintf(v, sizeof v, ".%s", variant);
    }
    for (size_t i = 0; i < sizeof stems / sizeof stems[0]; i++) {
        snprintf(out, n, "%s/%s%s.safetensors", dir, stems[i], v);
        if (hr_path_is_file(out)) return HR_OK;
        snprintf(out, n, "%s/%s.safetensors.index%s.json", dir, stems[i], v);
        if (hr_path_is_file(out)) return HR_OK;
    }
    return hr_error(HR_ERR_NOT_FOUND, "%s: no weights (diffusion_pytorch_model%s.safetensors, model%s.safetensors "
                    "or their .index%s.json)", dir, v, v, v);
}

hr_status hr_component_open(hr_component *c, const char *dir, const char *const *classes,
                            const hr_component_options *opts) {
    memset(c, 0, sizeof *c);
    static const hr_component_options none = {0};
    if (!opts) opts = &none;
    if (!dir) return hr_error(HR_ERR_INVALID_ARG, "component: NULL folder");
    if (strlen(dir) >= sizeof c->dir - 64) return hr_error(HR_ERR_INVALID_ARG, "%s: path too long", dir);
    hr_dtype dtype = HR_DTYPE_COUNT;
    if (opts->dtype && strcmp(opts->dtype, "auto") != 0) HR_TRY(hr_dtype_parse(opts->dtype, &dtype));
    HR_TRY(hr_device_get(opts->device ? opts->device : "cpu", &c->dev));
    const char *variant = opts->variant;
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!hr_path_is_file(path)) return hr_error(HR_ERR_NOT_FOUND, "%s: missing (the component's config)", path);
    HR_TRY(hr_json_doc_load(path, &c->config));
    const char *cls = NULL;
    hr_status s = hr_json_get_str(hr_json_doc_root(c->config), "_class_name", NULL, &cls);
    if (s == HR_OK && cls && classes) {
        bool known = false;
        for (int i = 0; classes[i] && !known; i++) known = strcmp(cls, classes[i]) == 0;
        if (!known) s = hr_error(HR_ERR_UNSUPPORTED, "%s: _class_name '%s' is not %s", path, cls, classes[0]);
    }
    if (s == HR_OK) s = find_weights(dir, variant, path, sizeof path);
    if (s == HR_OK) s = hr_checkpoint_open(path, &c->ck);
    if (s == HR_OK && dtype == HR_DTYPE_COUNT) {
        dtype = HR_F32;
        for (size_t i = 0; i < hr_checkpoint_count(c->ck); i++) {
            hr_dtype d = hr_checkpoint_stored_dtype(c->ck, hr_checkpoint_name(c->ck, i));
            if (d == HR_F32 || d == HR_BF16 || d == HR_F16) {
                dtype = d;
                break;
            }
        }
    }
    c->dtype = dtype;
    if (s != HR_OK) hr_component_close(c);
    return s;
}

void hr_component_close(hr_component *c) {
    for (size_t i = 0; i < c->n_owned; i++) hr_tensor_free(c->owned[i]);
    free(c->owned);
    hr_checkpoint_close(c->ck);
    hr_json_doc_free(c->config);
    memset(c, 0, sizeof *c);
}

hr_status hr_component_check_arch(const hr_component *c, const char *const *archs, const char *what) {
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive((const cJSON *)hr_json_doc_root(c->config).node,
                                                         "architectures");
    const cJSON *first = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    if (!first) return HR_OK;
    for (int i = 0; cJSON_IsString(first) && archs[i]; i++)
        if (!strcmp(first->valuestring, archs[i])) return HR_OK;
    return hr_error(HR_ERR_UNSUPPORTED, "%s/config.json: architectures[0] '%s' is not %s", c->dir,
                    cJSON_IsString(first) ? first->valuestring : "?", what);
}

static hr_status own(hr_component *c, hr_tensor *t) {
    if (c->n_owned == c->cap_owned) {
        size_t cap = c->cap_owned ? 2 * c->cap_owned : 64;
        hr_tensor **grown = realloc(c->owned, cap * sizeof *grown);
        if (!grown) {
            hr_tensor_free(t);
            return hr_error(HR_ERR_OOM, "%s: the parameter list", c->dir);
        }
        c->owned = grown;
        c->cap_owned = cap;
    }
    c->owned[c->n_owned++] = t;
    return HR_OK;
}

hr_status hr_component_param(hr_component *c, const char *name, int ndim, const int64_t *shape, hr_tensor **out) {
    *out = NULL;
    if (!hr_checkpoint_has(c->ck, name))
        return hr_error(HR_ERR_NOT_FOUND, "%s: tensor '%s' is missing from the weights", c->dir, name);
    hr_tensor_info info;
    HR_TRY(hr_checkpoint_info(c->ck, name, &info));
    bool same = info.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = info.shape[i] == shape[i];
    if (!same) {
        char got[160], want[160];
        return hr_error(HR_ERR_SHAPE, "%s: tensor '%s' has shape %s, the config implies %s", c->dir, name,
                        hr_shape_str(info.ndim, info.shape, got, sizeof got), hr_shape_str(ndim, shape, want, sizeof want));
    }
    hr_tensor *t = NULL;
    HR_TRY(hr_checkpoint_tensor_as(c->ck, name, c->dtype, &t));
    if (c->dev != hr_device_cpu()) {
        hr_tensor *d = NULL;
        hr_status s = hr_tensor_to(t, c->dev, &d);
        hr_tensor_free(t);
        HR_TRY(s);
        t = d;
    }
    hr_tensor_set_name(t, name);
    HR_TRY(own(c, t));
    *out = t;
    return HR_OK;
}

hr_status hr_component_wb(hr_component *c, const char *prefix, int ndim, const int64_t *shape, bool bias,
                          hr_tensor **w, hr_tensor **b) {
    char name[256];
    snprintf(name, sizeof name, "%s.weight", prefix);
    HR_TRY(hr_component_param(c, name, ndim, shape, w));
    if (!bias) return HR_OK;
    snprintf(name, sizeof name, "%s.bias", prefix);
    return hr_component_param(c, name, 1, shape, b);
}

hr_status hr_component_input(const hr_component *c, const hr_tensor *t, hr_dtype dt, hr_tensor **out) {
    *out = NULL;
    hr_tensor *cast = NULL;
    if (dt == HR_DTYPE_COUNT) dt = hr_tensor_dtype(t);
    HR_TRY(hr_cast(t, dt, &cast));
    if (hr_tensor_device(cast) == c->dev) {
        *out = cast;
        return HR_OK;
    }
    hr_status s = hr_tensor_to(cast, c->dev, out);
    hr_tensor_free(cast);
    return s;
}

hr_status hr_temp_add(hr_temps *tp, hr_tensor *t) {
    if (!t) return HR_OK;
    if (tp->n == HR_TEMPS_CAP) {
        hr_tensor_free(t);
        return hr_error(HR_ERR_INTERNAL, "a forward block holds more than %d temporaries", HR_TEMPS_CAP);
    }
    tp->t[tp->n++] = t;
    return HR_OK;
}

void hr_temps_free(hr_temps *tp) {
    for (int i = 0; i < tp->n; i++) hr_tensor_free(tp->t[i]);
    tp->n = 0;
}
