/* A model's weights by their Hugging Face names: the embedding, final norm
 * and head, and each layer's by its architecture's weight table; loaded
 * onto the model's device, then handed to the device to prepare. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "device/device_impl.h"
#include "io/st_internal.h"
#include "models/model_impl.h"
#include "models/tp.h"

int64_t hr_model_dim(const hr_model *m, hr_dim d, int64_t il) {
    const hr_model_config *c = &m->cfg;
    if (m->arch->dim) {
        int64_t v = m->arch->dim(m, d, il, NULL, 0);
        if (v >= 0) return v;
    }
    int k = il >= 0 ? hr_model_layer_kind(m, il) : HR_LAYER_FULL;
    switch (d) {
    case HR_DIM_HIDDEN: return c->hidden_size;
    case HR_DIM_Q: return c->n_heads * c->kind_head_dim[k];
    case HR_DIM_KV: return c->kind_kv_heads[k] * c->kind_head_dim[k];
    case HR_DIM_HEAD: return c->kind_head_dim[k];
    case HR_DIM_INTER: return c->intermediate_size;
    case HR_DIM_VOCAB: return c->vocab_size;
    case HR_DIM_EXPERTS: return c->n_experts;
    case HR_DIM_MOE_INTER: return c->moe_intermediate_size;
    case HR_DIM_MOE_INTER2: return 2 * c->moe_intermediate_size;
    case HR_DIM_HEADS: return c->n_heads;
    case HR_DIM_ONE: return 1;
    default: return 0;
    }
}

/* A weight's number of dims: 3 for stacked experts, 1 for [n, NONE]. */
static int dims_rank(const hr_dim dims[3]) { return dims[2] ? 3 : dims[1] ? 2 : 1; }

/* Where a weight comes from: its name, its expected dims, and for a
 * stacked experts weight held per expert, the layer prefix and the names
 * of its parts (spec NULL otherwise). */
typedef struct weight_ref {
    const char *name;
    const hr_dim *dims;
    const hr_weight_spec *spec;
    const char *layer_prefix;
    int64_t il; /* its layer, or -1 */
    bool blocks_ok; /* read by linear or embedding alone: may stay block-quantized */
} weight_ref;

/* Whether r is a stacked experts weight that the checkpoint holds in
 * parts stacked by expert (spec->parts: a GGUF file's) rather than whole. */
static bool held_in_parts(const hr_model *m, const weight_ref *r) {
    if (!r->spec || !r->spec->parts[0] || hr_checkpoint_has(m->ckpt, r->name)) return false;
    char name[256];
    snprintf(name, sizeof name, "%s%s", r->layer_prefix, r->spec->parts[0]);
    return hr_checkpoint_has(m->ckpt, name);
}

/* Whether r is a stacked experts weight that the checkpoint holds per
 * expert or in stacked parts (the stacked name absent). */
static bool held_per_expert(const hr_model *m, const weight_ref *r) {
    return r->spec && (r->spec->per_expert[0] || r->spec->parts[0]) && !hr_checkpoint_has(m->ckpt, r->name);
}

static int n_parts(const hr_weight_spec *w) { return w->per_expert[1] || w->parts[1] ? 2 : 1; }

/* The name of part p (of expert e, when held per expert). */
static void part_name(const hr_model *m, const weight_ref *r, int p, int64_t e, char *buf, size_t n) {
    int used = snprintf(buf, n, "%s", r->layer_prefix);
    if (used < 0 || (size_t)used >= n) return;
    if (held_in_parts(m, r)) snprintf(buf + used, n - (size_t)used, "%s", r->spec->parts[p]);
    else if (r->spec->per_expert[p]) snprintf(buf + used, n - (size_t)used, r->spec->per_expert[p], (long long)e);
    else snprintf(buf + used, n - (size_t)used, "%s", r->spec->parts[p] ? r->spec->parts[p] : "?");
}

/* Whether the model keeps weights in blocks: on the CPU, whose kernels
 * read them, unless asked to dequantize. */
static bool cpu_blocks(const hr_model *m) { return !m->dequantize && m->dev == hr_device_cpu(); }

/* Whether stacked experts weight r may stay in blocks: [experts, rows,
 * cols] as the experts op reads it, on the CPU, whose built-in kernel
 * reads blocks (k_moe.c; a hub kernel takes floats). */
static bool experts_blocks(const hr_model *m, const weight_ref *r) {
    return r->spec && dims_rank(r->dims) == 3 && r->dims[0] == HR_DIM_EXPERTS &&
           r->spec->stored == HR_STORED_AS_IS && !m->experts_impl && cpu_blocks(m);
}

/* The block type every part of stacked experts weight r is stored in,
 * when they may stay in it; HR_DTYPE_COUNT otherwise. */
static hr_dtype parts_blocks(hr_model *m, const weight_ref *r, int64_t e0) {
    if (!experts_blocks(m, r)) return HR_DTYPE_COUNT;
    char name[256];
    hr_dtype dt = HR_DTYPE_COUNT;
    for (int p = 0; p < n_parts(r->spec); p++) {
        part_name(m, r, p, e0, name, sizeof name);
        hr_dtype st = hr_checkpoint_stored_dtype(m->ckpt, name);
        if (!hr_dtype_is_quantized(st) || (p > 0 && st != dt)) return HR_DTYPE_COUNT;
        dt = st;
    }
    return dt;
}

/* src's rows into dst's (the same shape and block type, rows whole and
 * contiguous): the copy op writes no blocks. */
static void copy_block_rows(const hr_tensor *src, hr_tensor *dst) {
    int nd = hr_tensor_ndim(src);
    const int64_t *sh = hr_tensor_shape(src);
    int64_t n_rows = 1;
    for (int d = 0; d + 1 < nd; d++) n_rows *= sh[d];
    size_t row = hr_dtype_nbytes(src->dtype, sh[nd - 1]);
    for (int64_t i = 0; i < n_rows; i++) {
        int64_t so = 0, dof = 0, rem = i;
        for (int d = nd - 2; d >= 0; d--) {
            so += rem % sh[d] * src->strides[d];
            dof += rem % sh[d] * dst->strides[d];
            rem /= sh[d];
        }
        memcpy((char *)hr_tensor_ptr(dst) + hr_dtype_nbytes(dst->dtype, dof),
               (const char *)hr_tensor_ptr(src) + hr_dtype_nbytes(src->dtype, so), row);
    }
}

/* A stacked experts weight from its parts, per expert or stacked by
 * expert: experts [e0, e0 + n_e) (all of them, or a rank's) as [n_e,
 * rows, cols] in the model dtype on the host, each part
 * cast (an FP8 one dequantized) and copied into its rows and its file
 * pages dropped, so memory holds
 * the stacked copy and one part at a time, never a second full copy. */
static hr_status load_stacked(hr_model *m, const weight_ref *r, int64_t e0, int64_t n_e, hr_tensor **out) {
    int np = n_parts(r->spec);
    int64_t shape[3] = {n_e, hr_model_dim(m, r->dims[1], r->il), hr_model_dim(m, r->dims[2], r->il)};
    int64_t rows = shape[1] / np;
    bool whole_parts = held_in_parts(m, r);
    hr_device *host = NULL;
    HR_TRY(hr_device_get("cpu", &host));
    hr_tensor *t = NULL;
    /* parts kept in their blocks (a GGUF file's *_exps) stack as blocks */
    hr_dtype blocks = parts_blocks(m, r, e0), dt = blocks != HR_DTYPE_COUNT ? blocks : m->dtype;
    HR_TRY(hr_tensor_empty(host, dt, 3, shape, &t));
    hr_status s = HR_OK;
    char name[256];
    for (int64_t e = 0; s == HR_OK && e < (whole_parts ? 1 : shape[0]); e++)
        for (int p = 0; s == HR_OK && p < np; p++) {
            part_name(m, r, p, e0 + e, name, sizeof name);
            hr_tensor *src = NULL, *expert = NULL, *dst = NULL;
            /* an FP8 expert (the Hub's Qwen3-MoE FP8 releases) dequantized as it comes */
            s = !whole_parts && hr_fp8_held(m, name) ? hr_fp8_load(m, name, rows, shape[2], false, &src)
                                                      : hr_checkpoint_tensor_as(m->ckpt, name, dt, &src);
            /* a stacked part fills rows [p rows, (p + 1) rows) of every expert */
            if (s == HR_OK) s = whole_parts ? hr_tensor_alias(t, &expert) : hr_tensor_select(t, 0, e, &expert);
            if (s == HR_OK) s = hr_tensor_narrow(expert, whole_parts ? 1 : 0, p * rows, rows, &dst);
            if (s == HR_OK && blocks != HR_DTYPE_COUNT) {
                copy_block_rows(src, dst);
            } else if (s == HR_OK) {
                hr_tensor *o[1] = {dst};
                s = hr_op_run(HR_OP_copy, NULL, (const hr_tensor *const[]){src}, 1, o, 1);
            }
            hr_tensor_free(dst);
            hr_tensor_free(expert);
            hr_tensor_free(src);
            hr_checkpoint_drop_tensor(m->ckpt, name);
            if (s != HR_OK) s = hr_error_context(s, "stacking '%s' into '%s'", name, r->name);
        }
    if (s != HR_OK) {
        hr_tensor_free(t);
        return s;
    }
    hr_tensor_set_name(t, r->name);
    *out = t;
    return HR_OK;
}

/* A stacked experts weight held in MXFP4 blocks (weights_mxfp4.c). */
static bool held_mxfp4(const hr_model *m, const weight_ref *r) {
    return r->spec && dims_rank(r->dims) == 3 && hr_mxfp4_held(m, r->name);
}

static hr_weight_stored stored_of(const weight_ref *r) { return r->spec ? r->spec->stored : HR_STORED_AS_IS; }

/* The dims a weight has in the checkpoint: the model's, with the last two
 * swapped for a transposed layout. */
static void stored_dims(const weight_ref *r, hr_dim out[3]) {
    memcpy(out, r->dims, 3 * sizeof *out);
    hr_weight_stored st = stored_of(r);
    if (st == HR_STORED_TRANSPOSED || st == HR_STORED_TRANSPOSED_INTERLEAVED) {
        out[1] = r->dims[2];
        out[2] = r->dims[1];
    }
}

/* src (the checkpoint's layout) into dst [.., rows, cols] as the model
 * reads it (hr_weight_stored), through views and one copy per part. */
static hr_status rearrange(const hr_tensor *src, hr_weight_stored st, hr_tensor *dst) {
    int nd = hr_tensor_ndim(dst);
    const int64_t *sh = hr_tensor_shape(src);
    hr_tensor *a = NULL, *b = NULL, *c = NULL, *part = NULL;
    hr_status s = HR_OK;
    if (st == HR_STORED_TRANSPOSED) {
        s = hr_tensor_transpose(src, nd - 2, nd - 1, &a);
        if (s == HR_OK) s = hr_op_run(HR_OP_copy, NULL, (const hr_tensor *const[]){a}, 1, &dst, 1);
        hr_tensor_free(a);
        return s;
    }
    /* interleaved: element 2j of the rows is the gate's row j, 2j + 1 the up's */
    int64_t shape[HR_MAX_DIMS + 1];
    memcpy(shape, sh, (size_t)nd * sizeof *shape);
    shape[nd - 1] /= 2;
    shape[nd] = 2;
    int64_t half = shape[nd - 1];
    s = hr_tensor_view(src, nd + 1, shape, &a);
    for (int p = 0; s == HR_OK && p < 2; p++) {
        s = hr_tensor_select(a, nd, p, &b);
        if (s == HR_OK && st == HR_STORED_TRANSPOSED_INTERLEAVED) {
            s = hr_tensor_transpose(b, nd - 2, nd - 1, &c);
            hr_tensor_free(b);
            b = c;
            c = NULL;
        }
        int rows_dim = st == HR_STORED_TRANSPOSED_INTERLEAVED ? nd - 2 : nd - 1;
        if (s == HR_OK) s = hr_tensor_narrow(dst, rows_dim, p * half, half, &part);
        if (s == HR_OK) s = hr_op_run(HR_OP_copy, NULL, (const hr_tensor *const[]){b}, 1, &part, 1);
        hr_tensor_free(b);
        hr_tensor_free(part);
        b = part = NULL;
    }
    hr_tensor_free(a);
    return s;
}

/* A weight the checkpoint lays out otherwise (hr_weight_stored), read in
 * the model dtype and rearranged into a host tensor of the model's shape;
 * its file pages dropped. */
static hr_status load_rearranged(hr_model *m, const weight_ref *r, hr_tensor **out) {
    int nd = dims_rank(r->dims);
    int64_t shape[3];
    for (int i = 0; i < nd; i++) shape[i] = hr_model_dim(m, r->dims[i], r->il);
    hr_device *host = NULL;
    hr_tensor *src = NULL, *t = NULL;
    HR_TRY(hr_device_get("cpu", &host));
    HR_TRY(hr_checkpoint_tensor_as(m->ckpt, r->name, m->dtype, &src));
    hr_status s = hr_tensor_empty(host, m->dtype, nd, shape, &t);
    if (s == HR_OK) s = rearrange(src, stored_of(r), t);
    hr_tensor_free(src);
    hr_checkpoint_drop_tensor(m->ckpt, r->name);
    if (s != HR_OK) {
        hr_tensor_free(t);
        return hr_error_context(s, "rearranging '%s'", r->name);
    }
    hr_tensor_set_name(t, r->name);
    *out = t;
    return HR_OK;
}

/* The dtype weight r is loaded in: its block type when the checkpoint
 * stores it block-quantized (a GGUF file's), it is a matrix that linear
 * or embedding alone reads or a stacked experts weight that the built-in
 * experts kernel reads (experts_blocks), and the model runs on the CPU
 * (whose kernels read blocks; k_linear_quant.c) without `dequantize`; the
 * model dtype otherwise. */
static hr_dtype load_dtype(const hr_model *m, const weight_ref *r) {
    hr_dtype stored = hr_checkpoint_stored_dtype(m->ckpt, r->name);
    bool blocks = r->blocks_ok && cpu_blocks(m) && dims_rank(r->dims) == 2;
    if ((blocks || experts_blocks(m, r)) && hr_dtype_is_quantized(stored)) return stored;
    /* asked to quantize: a float matrix whose rows divide into blocks */
    bool values = stored == HR_F32 || stored == HR_BF16 || stored == HR_F16;
    if (blocks && m->quantize != HR_DTYPE_COUNT && values &&
        hr_model_dim(m, r->dims[1], r->il) % hr_dtype_block(m->quantize) == 0)
        return m->quantize;
    return m->dtype;
}

/* Weight r quantized into dt from its stored values (a view of the file,
 * whose pages go once read): memory holds the blocks and one tensor's
 * pages at a time. */
static hr_status load_quantized(hr_model *m, const weight_ref *r, hr_dtype dt, hr_tensor **out) {
    hr_tensor *src = NULL;
    HR_TRY(hr_checkpoint_tensor_as(m->ckpt, r->name, hr_checkpoint_stored_dtype(m->ckpt, r->name), &src));
    hr_status s = hr_tensor_quantize(src, dt, out);
    hr_tensor_free(src);
    hr_checkpoint_drop_tensor(m->ckpt, r->name);
    if (s != HR_OK) return hr_error_context(s, "quantizing '%s' into %s", r->name, hr_dtype_name(dt));
    hr_tensor_set_name(*out, r->name);
    return HR_OK;
}

/* This rank's slice of weight r (tp.h), read alone (hr_checkpoint_rows):
 * a view of the file's bytes for rows of dim 0 (a colwise slice), a copy
 * of one segment per row for columns (rowwise); cast when the model's
 * dtype is another. */
static hr_status load_slice(hr_model *m, const weight_ref *r, int axis, int64_t first, int64_t len, hr_tensor **out) {
    hr_tensor *part = NULL, *t = NULL;
    HR_TRY(hr_checkpoint_rows(m->ckpt, r->name, axis, first, len, &part));
    if (hr_tensor_dtype(part) == m->dtype) {
        *out = part;
        return HR_OK;
    }
    hr_status s = hr_tensor_empty(hr_device_cpu(), m->dtype, part->ndim, part->shape, &t);
    if (s == HR_OK) s = hr_copy_(t, part);
    hr_tensor_free(part);
    if (s != HR_OK) {
        hr_tensor_free(t);
        return hr_error_context(s, "casting rows %lld..%lld of dim %d of '%s' to %s", (long long)first,
                                (long long)(first + len), axis, r->name, hr_dtype_name(m->dtype));
    }
    hr_tensor_set_name(t, r->name);
    *out = t;
    return HR_OK;
}

/* Loads weight `name` (checked by hr_model_check_weights) in the model
 * dtype onto the model's device into *out: a zero-copy view of the mapping
 * when the file's dtype matches, cast once otherwise; a stacked experts
 * weight held per expert is stacked, one stored otherwise rearranged; a
 * block-quantized one kept in its blocks (load_dtype). */
static hr_status load_weight(hr_model *m, const weight_ref *r, hr_tensor **out) {
    const char *name = r->name;
    hr_tensor *t = NULL;
    int axis;
    int64_t first, len;
    hr_tp_slice(m, name, r->dims, r->il, &axis, &first, &len);
    bool fp8 = hr_fp8_held(m, name);
    bool fp8_blocks = r->blocks_ok && cpu_blocks(m);
    if (fp8 && axis >= 0)
        return hr_fp8_load_part(m, name, hr_model_dim(m, r->dims[0], r->il), hr_model_dim(m, r->dims[1], r->il), axis,
                                first, len, fp8_blocks, out);
    /* a rank's experts of a weight held per expert: those experts' tensors alone */
    if (axis == 0 && held_per_expert(m, r) && !held_in_parts(m, r)) return load_stacked(m, r, first, len, out);
    if (axis >= 0) return load_slice(m, r, axis, first, len, out);
    if (fp8 || held_mxfp4(m, r) || held_per_expert(m, r) || stored_of(r) != HR_STORED_AS_IS) {
        /* kept in FP8 blocks where linear or embedding alone reads it on the CPU */
        if (fp8)
            HR_TRY(hr_fp8_load(m, name, hr_model_dim(m, r->dims[0], r->il), hr_model_dim(m, r->dims[1], r->il),
                               fp8_blocks, &t));
        else if (held_mxfp4(m, r))
            HR_TRY(hr_mxfp4_load(m, name, hr_model_dim(m, r->dims[0], r->il), hr_model_dim(m, r->dims[1], r->il),
                                 hr_model_dim(m, r->dims[2], r->il), stored_of(r) == HR_STORED_TRANSPOSED_INTERLEAVED,
                                 &t));
        else
            HR_TRY(held_per_expert(m, r) ? load_stacked(m, r, 0, hr_model_dim(m, r->dims[0], r->il), &t)
                                         : load_rearranged(m, r, &t));
        if (hr_tensor_device(t) == m->dev) {
            *out = t;
            return HR_OK;
        }
        hr_tensor *n = NULL;
        hr_status s = hr_tensor_to(t, m->dev, &n);
        hr_tensor_free(t);
        if (s != HR_OK) return hr_error_context(s, "moving '%s' to %s", name, hr_device_name(m->dev));
        hr_tensor_set_name(n, name);
        *out = n;
        return HR_OK;
    }
    hr_dtype dt = load_dtype(m, r);
    if (hr_dtype_is_quantized(dt) && !hr_dtype_is_quantized(hr_checkpoint_stored_dtype(m->ckpt, name)))
        return load_quantized(m, r, dt, out);
    /* cast (GGUF: dequantized) once at load to the model dtype */
    HR_TRY(hr_checkpoint_tensor_as(m->ckpt, name, dt, &t));
    /* A copy made: nothing reads the stored bytes again (a reader that did
     * would fault them back in), so their pages go now; kept, an f32
     * checkpoint run in bf16 held both, 1.5x its bytes. */
    bool view = hr_checkpoint_drop_pages(m->ckpt, hr_tensor_ptr(t), 0);
    if (!view) hr_checkpoint_drop_tensor(m->ckpt, name);
    if (hr_tensor_device(t) != m->dev) {
        hr_tensor *n = NULL;
        hr_status s = hr_tensor_to(t, m->dev, &n);
        hr_tensor_free(t);
        if (s != HR_OK) return hr_error_context(s, "moving '%s' to %s", name, hr_device_name(m->dev));
        /* The device holds its own copy (PJRT copies during the call): a
         * view's file pages go as a copy's did; kept, the host held every
         * weight twice. */
        if (view) hr_checkpoint_drop_tensor(m->ckpt, name);
        hr_tensor_set_name(n, name);
        t = n;
    }
    *out = t;
    return HR_OK;
}

/* The text decoder's names start with "model." in a causal LM, and with
 * "language_model.model." (Hub files, transformers 5's save) or
 * "model.language_model." (transformers 5 in memory) in a multimodal
 * checkpoint, whose other towers are left alone. */
static hr_status find_prefix(hr_model *m) {
    static const char *const prefixes[] = {"model.", "language_model.model.", "model.language_model."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
        if (!hr_checkpoint_has(m->ckpt, name)) continue;
        snprintf(m->prefix, sizeof m->prefix, "%s", prefixes[i]);
        return HR_OK;
    }
    return hr_error(HR_ERR_NOT_FOUND, "checkpoint: missing tensor 'model.embed_tokens.weight' (nor under "
                    "'language_model.model.' or 'model.language_model.')");
}

/* The head's name beside the decoder's: "lm_head.weight" for "model." and
 * "model.language_model.", "language_model.lm_head.weight" for Hub files. */
static const char *head_name(const hr_model *m) {
    const char *name = "lm_head.weight";
    if (!strcmp(m->prefix, "language_model.model.") && !hr_checkpoint_has(m->ckpt, name))
        name = "language_model.lm_head.weight";
    return name;
}

typedef hr_status (*weight_visit)(hr_model *m, const weight_ref *r, hr_tensor **slot);

/* Every weight the config asks for, in loading order, with its expected
 * dims and its slot (the layers' slots once m->layer_w is allocated): the
 * one list that the check and the load both walk. The head tied to the
 * embedding is its alias, not a weight of its own. */
static hr_status walk_weights(hr_model *m, weight_visit visit) {
    const hr_model_config *c = &m->cfg;
    const hr_arch *a = m->arch;
    char name[256], layer[192];
    static const hr_dim embed[3] = {HR_DIM_VOCAB, HR_DIM_HIDDEN}, norm[3] = {HR_DIM_HIDDEN};
    snprintf(name, sizeof name, "%sembed_tokens.weight", m->prefix);
    HR_TRY(visit(m, &(weight_ref){.name = name, .dims = embed, .il = -1, .blocks_ok = true}, &m->embed));
    snprintf(name, sizeof name, "%snorm.weight", m->prefix);
    HR_TRY(visit(m, &(weight_ref){.name = name, .dims = norm, .il = -1}, &m->final_norm));
    if (!c->tie_word_embeddings)
        HR_TRY(visit(m, &(weight_ref){.name = head_name(m), .dims = embed, .il = -1, .blocks_ok = true}, &m->lm_head));
    for (int j = 0; j < a->n_model_weights; j++) {
        const hr_weight_spec *w = &a->model_weights[j];
        if (w->when && !w->when(m, -1)) continue;
        snprintf(name, sizeof name, "%s%s", m->prefix, w->hf);
        HR_TRY(visit(m, &(weight_ref){name, w->shape, NULL, NULL, -1, w->role == HR_WEIGHT_LINEAR},
                     m->model_w ? &m->model_w[j] : NULL));
    }
    for (int64_t il = 0; il < c->n_layers; il++)
        for (int j = 0; j < a->n_layer_weights; j++) {
            const hr_weight_spec *w = &a->layer_weights[j];
            if (w->when && !w->when(m, il)) continue;
            snprintf(layer, sizeof layer, "%slayers.%lld.", m->prefix, (long long)il);
            snprintf(name, sizeof name, "%s%s", layer, w->hf);
            HR_TRY(visit(m, &(weight_ref){name, w->shape, w, layer, il, w->role == HR_WEIGHT_LINEAR},
                         m->layer_w ? &m->layer_w[il * a->n_layer_weights + j] : NULL));
        }
    return HR_OK;
}

static bool ck_drop_pages(void *ctx, const void *p, size_t n) { return hr_checkpoint_drop_pages(ctx, p, n); }
static void ck_drop_tensor(void *ctx, const char *name) { hr_checkpoint_drop_tensor(ctx, name); }
static size_t ck_stored_bytes(void *ctx, const char *name) { return hr_checkpoint_stored_bytes(ctx, name); }

/* Every weight, for the device to prepare: linear ones marked (the
 * embedding when the head reads it). The head tied to the embedding is
 * its alias, left out and made again afterwards. */
static hr_status prepare_on_device(hr_model *m) {
    const hr_device_vtable *vt = m->dev->vt;
    if (!vt->prepare_weights) return HR_OK;
    const hr_arch *a = m->arch;
    size_t n_layer = (size_t)(m->cfg.n_layers * a->n_layer_weights), n = 0;
    hr_weight_ref *w = malloc(sizeof *w * (n_layer + 3 + (size_t)a->n_model_weights));
    if (!w) return hr_error(HR_ERR_OOM, "weights: out of memory");
    bool tied = m->cfg.tie_word_embeddings;
    w[n++] = (hr_weight_ref){&m->embed, tied};
    w[n++] = (hr_weight_ref){&m->final_norm, false};
    if (!tied) w[n++] = (hr_weight_ref){&m->lm_head, true};
    for (int j = 0; j < a->n_model_weights; j++)
        w[n++] = (hr_weight_ref){&m->model_w[j], a->model_weights[j].role == HR_WEIGHT_LINEAR};
    for (size_t i = 0; i < n_layer; i++)
        w[n++] = (hr_weight_ref){&m->layer_w[i], a->layer_weights[i % (size_t)a->n_layer_weights].role ==
                                                     HR_WEIGHT_LINEAR};
    hr_weight_source src = {.ctx = m->ckpt, .drop_pages = ck_drop_pages, .drop_tensor = ck_drop_tensor,
                            .stored_bytes = ck_stored_bytes};
    hr_status s = vt->prepare_weights(m->dev, w, n, &src);
    free(w);
    if (s != HR_OK) return hr_error_context(s, "preparing the weights for %s", hr_device_name(m->dev));
    if (!tied) return HR_OK;
    hr_tensor_free(m->lm_head);
    m->lm_head = NULL;
    return hr_tensor_alias(m->embed, &m->lm_head);
}

/* ---- the config checked against the checkpoint, before any weight loads ---- */

/* The config fields a dimension comes from, with their values. */
static void dim_fields(const hr_model *m, hr_dim d, int64_t il, char *buf, size_t n) {
    const hr_model_config *c = &m->cfg;
    if (m->arch->dim && m->arch->dim(m, d, il, buf, n) >= 0) return;
    int k = il >= 0 ? hr_model_layer_kind(m, il) : HR_LAYER_FULL;
    /* a kind's own geometry names the kind */
    bool own = c->kind_head_dim[k] != c->head_dim || c->kind_kv_heads[k] != c->n_kv_heads;
    const char *hd = own ? "the full layers' head_dim" : "head_dim", *kv = own ? "their num_key_value_heads" : "num_key_value_heads";
    switch (d) {
    case HR_DIM_HIDDEN: snprintf(buf, n, "hidden_size (%lld)", (long long)c->hidden_size); break;
    case HR_DIM_Q:
        snprintf(buf, n, "num_attention_heads x %s (%lld x %lld)", hd, (long long)c->n_heads,
                 (long long)c->kind_head_dim[k]);
        break;
    case HR_DIM_KV:
        snprintf(buf, n, "%s x %s (%lld x %lld)", kv, hd, (long long)c->kind_kv_heads[k],
                 (long long)c->kind_head_dim[k]);
        break;
    case HR_DIM_HEAD: snprintf(buf, n, "%s (%lld)", hd, (long long)c->kind_head_dim[k]); break;
    case HR_DIM_INTER: snprintf(buf, n, "intermediate_size (%lld)", (long long)c->intermediate_size); break;
    case HR_DIM_VOCAB: snprintf(buf, n, "vocab_size (%lld)", (long long)c->vocab_size); break;
    case HR_DIM_EXPERTS: snprintf(buf, n, "num_experts (%lld)", (long long)c->n_experts); break;
    case HR_DIM_MOE_INTER:
        snprintf(buf, n, "%s (%lld)", c->moe_inter_field ? c->moe_inter_field : "moe_intermediate_size",
                 (long long)c->moe_intermediate_size);
        break;
    case HR_DIM_MOE_INTER2:
        snprintf(buf, n, "2 x %s (%lld)", c->moe_inter_field ? c->moe_inter_field : "moe_intermediate_size",
                 (long long)(2 * c->moe_intermediate_size));
        break;
    case HR_DIM_HEADS: snprintf(buf, n, "num_attention_heads (%lld)", (long long)c->n_heads); break;
    case HR_DIM_ONE: snprintf(buf, n, "a scalar (1)"); break;
    default: snprintf(buf, n, "?"); break;
    }
}

static const char *config_source(const hr_model *m) { return m->cfg.from_gguf ? "the GGUF metadata" : "config.json"; }

/* A tensor's presence, shape and dtype as the config states them ([ndim]
 * dims, dim div_dim divided by div: one of a stacked weight's parts), from
 * the checkpoint's index alone: a refusal names the tensor and
 * the config fields, and nothing sized by the config has been allocated. */
static hr_status check_tensor(hr_model *m, const char *name, int64_t il, int ndim, const hr_dim *dims, int div_dim,
                              int64_t div, bool fp8_ok) {
    hr_tensor_info info;
    hr_status s = hr_checkpoint_info(m->ckpt, name, &info);
    if (s == HR_ERR_NOT_FOUND) return hr_error(HR_ERR_NOT_FOUND, "checkpoint: missing tensor '%s'", name);
    HR_TRY(s);
    int64_t want[3];
    for (int i = 0; i < ndim; i++) want[i] = hr_model_dim(m, dims[i], il);
    want[div_dim] /= div;
    bool same = info.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = info.shape[i] == want[i];
    if (same && fp8_ok && hr_fp8_held(m, name)) return hr_fp8_check(m, name, want[0], want[1]);
    if (same && !hr_dtype_is_float(info.dtype))
        return hr_error(HR_ERR_DTYPE, "checkpoint: tensor '%s' is %s, not a floating dtype%s", name,
                        hr_dtype_name(info.dtype),
                        info.dtype != HR_F8_E4M3                 ? ""
                        : m->cfg.quant.method != HR_QUANT_FP8 ? " (FP8 weights need an fp8 or compressed-tensors "
                                                                "quantization_config)"
                                                              : " (FP8 is read for matrices held whole)");
    if (same) return HR_OK;
    char fields[384] = "", f[128], a[160], b[160];
    for (int i = 0; i < ndim; i++) {
        if (info.ndim == ndim && info.shape[i] == want[i]) continue;
        dim_fields(m, dims[i], il, f, sizeof f);
        size_t used = strlen(fields);
        snprintf(fields + used, sizeof fields - used, "%s%s%s", used ? " and " : "", f,
                 i == div_dim && div > 1 ? " / 2" : "");
    }
    return hr_error(HR_ERR_SHAPE, "%s: the checkpoint's tensor '%s' is %s, not the %s computed from %s",
                    config_source(m), name, hr_shape_str(info.ndim, info.shape, a, sizeof a),
                    hr_shape_str(ndim, want, b, sizeof b), fields);
}

/* A weight, or each part of a stacked experts weight the checkpoint holds
 * per expert or in stacked parts. */
static hr_status check_weight(hr_model *m, const weight_ref *r, hr_tensor **slot) {
    (void)slot;
    if (held_mxfp4(m, r))
        return hr_mxfp4_check(m, r->name, hr_model_dim(m, r->dims[0], r->il), hr_model_dim(m, r->dims[1], r->il),
                              hr_model_dim(m, r->dims[2], r->il));
    if (!held_per_expert(m, r)) {
        hr_dim dims[3];
        stored_dims(r, dims);
        return check_tensor(m, r->name, r->il, dims_rank(dims), dims, 0, 1,
                            dims_rank(dims) == 2 && stored_of(r) == HR_STORED_AS_IS);
    }
    char name[256];
    int np = n_parts(r->spec);
    if (held_in_parts(m, r)) {
        for (int p = 0; p < np; p++) {
            part_name(m, r, p, 0, name, sizeof name);
            if (!hr_checkpoint_has(m->ckpt, name))
                return hr_error(HR_ERR_NOT_FOUND, "checkpoint: missing tensor '%s' (nor the stacked '%s')", name,
                                r->name);
            HR_TRY(check_tensor(m, name, r->il, 3, r->dims, 1, np, false)); /* [experts, rows / np, cols] */
        }
        return HR_OK;
    }
    for (int64_t e = 0; e < hr_model_dim(m, r->dims[0], r->il); e++)
        for (int p = 0; p < np; p++) {
            part_name(m, r, p, e, name, sizeof name);
            if (!hr_checkpoint_has(m->ckpt, name))
                return hr_error(HR_ERR_NOT_FOUND, "checkpoint: missing tensor '%s' (nor the stacked '%s')", name,
                                r->name);
            HR_TRY(check_tensor(m, name, r->il, 2, r->dims + 1, 0, np, true));
        }
    return HR_OK;
}

/* How many layers the checkpoint holds, by the first always-present
 * weight of the table, up to the config's count. */
static int64_t layers_held(const hr_model *m) {
    const hr_weight_spec *w = m->arch->layer_weights;
    int64_t il = 0;
    for (char name[256]; il < m->cfg.n_layers; il++) {
        snprintf(name, sizeof name, "%slayers.%lld.%s", m->prefix, (long long)il, w->hf);
        if (!hr_checkpoint_has(m->ckpt, name)) break;
    }
    return il;
}

hr_status hr_model_check_weights(hr_model *m) {
    HR_TRY(find_prefix(m));
    const hr_model_config *c = &m->cfg;
    /* a short layer count is named as such, not as the first layer tensor it misses */
    int64_t held = layers_held(m);
    if (held < c->n_layers)
        return hr_error(HR_ERR_SHAPE, "%s: num_hidden_layers is %lld, but the checkpoint holds %lld layers (no tensor "
                        "'%slayers.%lld.%s')", config_source(m), (long long)c->n_layers, (long long)held, m->prefix,
                        (long long)held, m->arch->layer_weights[0].hf);
    return walk_weights(m, check_weight);
}

/* weight_visit noting the dtype each weight is stored in. */
static hr_status note_type(hr_model *m, const weight_ref *r, hr_tensor **slot) {
    (void)r;
    if (slot && *slot) m->weight_types |= 1u << hr_tensor_dtype(*slot);
    return HR_OK;
}

const char *hr_model_weight_types(const hr_model *m) { return m->weight_types_str; }

/* m->weight_types_str: the dtypes the weights are stored in, in dtype
 * order ("f32,q4_1,q8_0"). */
static void describe_types(hr_model *m) {
    m->weight_types = 0;
    walk_weights(m, note_type);
    size_t at = 0;
    m->weight_types_str[0] = '\0';
    for (int d = 0; d < HR_DTYPE_COUNT; d++)
        if (m->weight_types & (1u << d) && at < sizeof m->weight_types_str)
            at += (size_t)snprintf(m->weight_types_str + at, sizeof m->weight_types_str - at, "%s%s", at ? "," : "",
                                   hr_dtype_name((hr_dtype)d));
}

hr_status hr_model_load_weights(hr_model *m) {
    const hr_model_config *c = &m->cfg;
    size_t n = (size_t)(c->n_layers * m->arch->n_layer_weights);
    m->layer_w = calloc(n ? n : 1, sizeof *m->layer_w);
    m->model_w = calloc((size_t)m->arch->n_model_weights + 1, sizeof *m->model_w);
    if (!m->layer_w || !m->model_w) return hr_error(HR_ERR_OOM, "model layers");
    HR_TRY(walk_weights(m, load_weight));
    if (c->tie_word_embeddings) HR_TRY(hr_tensor_alias(m->embed, &m->lm_head));
    /* Weights on a device that is not host memory went to it as they
     * loaded (load_weight drops their pages then); pages mapped back
     * around later reads go now. */
    if (!m->dev->host_visible) hr_checkpoint_drop_all(m->ckpt);
    HR_TRY(prepare_on_device(m));
    describe_types(m);
    return HR_OK;
}

void hr_model_free_weights(hr_model *m) {
    if (m->layer_w)
        for (int64_t i = 0; i < m->cfg.n_layers * m->arch->n_layer_weights; i++) hr_tensor_free(m->layer_w[i]);
    free(m->layer_w);
    m->layer_w = NULL;
    if (m->model_w)
        for (int j = 0; j < m->arch->n_model_weights; j++) hr_tensor_free(m->model_w[j]);
    free(m->model_w);
    m->model_w = NULL;
    hr_tensor_free(m->embed);
    hr_tensor_free(m->final_norm);
    hr_tensor_free(m->lm_head);
    m->embed = m->final_norm = m->lm_head = NULL;
}

static const hr_tensor *named(const hr_tensor *t, const char *name) {
    return t && !strcmp(hr_tensor_name(t), name) ? t : NULL;
}

const hr_tensor *hr_model_find_weight(const hr_model *m, const char *name) {
    const hr_tensor *t = named(m->embed, name);
    if (!t) t = named(m->final_norm, name);
    if (!t) t = named(m->lm_head, name);
    int64_t n = m->layer_w ? m->cfg.n_layers * m->arch->n_layer_weights : 0;
    for (int64_t i = 0; !t && i < n; i++) t = named(m->layer_w[i], name);
    for (int j = 0; !t && m->model_w && j < m->arch->n_model_weights; j++) t = named(m->model_w[j], name);
    return t;
}
