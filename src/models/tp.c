/* Tensor parallelism of a decoder (tp.h). */
#include "models/tp.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "device/device_impl.h"
#include "hubrt/dist.h"
#include "ops/collective.h"

/* ---- the plan ----------------------------------------------------------- */

typedef struct plan_entry {
    char pattern[128];
    hr_tp_style style;
} plan_entry;

#define MAX_ENTRIES 64

typedef struct tp_plan {
    plan_entry e[MAX_ENTRIES]; /* the caller's first: the first match wins */
    int n;
} tp_plan;

/* transformers' base_model_tp_plan of Llama, Mistral, Qwen2, Qwen3,
 * Qwen3-MoE and Gemma 3 (their q/k norms replicated), with the causal
 * LM's lm_head; the vocab-split embedding is hubrt's, so that no rank
 * holds the whole table. */
static const plan_entry auto_plan[] = {
    {"embed_tokens", HR_TP_EMBEDDING_ROWWISE},
    {"layers.*.self_attn.q_proj", HR_TP_COLWISE},
    {"layers.*.self_attn.k_proj", HR_TP_COLWISE},
    {"layers.*.self_attn.v_proj", HR_TP_COLWISE},
    {"layers.*.self_attn.o_proj", HR_TP_ROWWISE},
    {"layers.*.mlp.gate_proj", HR_TP_COLWISE},
    {"layers.*.mlp.up_proj", HR_TP_COLWISE},
    {"layers.*.mlp.down_proj", HR_TP_ROWWISE},
    {"lm_head", HR_TP_COLWISE_GATHER_OUTPUT},
};

static const char *const planned_archs[] = {"LlamaForCausalLM",  "MistralForCausalLM",  "Qwen2ForCausalLM",
                                            "Qwen3ForCausalLM",  "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"};

static const struct {
    const char *name;
    hr_tp_style style;
} style_names[] = {
    {"colwise", HR_TP_COLWISE},
    {"rowwise", HR_TP_ROWWISE},
    /* the input of a rowwise layer here is always the split output of the
     * colwise layers before it */
    {"rowwise_split_input", HR_TP_ROWWISE},
    {"colwise_gather_output", HR_TP_COLWISE_GATHER_OUTPUT},
    {"embedding_rowwise", HR_TP_EMBEDDING_ROWWISE},
    {"replicated", HR_TP_REPLICATED},
    {"replicated_with_grad_allreduce", HR_TP_REPLICATED},
};

static const char *style_name(hr_tp_style s) {
    for (size_t i = 0; i < sizeof style_names / sizeof style_names[0]; i++)
        if (style_names[i].style == s) return style_names[i].name;
    return "?";
}

/* Whether module `name` matches `pattern`: dot-separated parts equal,
 * "*" standing for one part of digits (a layer index). */
static bool pattern_matches(const char *pattern, const char *name) {
    while (*pattern && *name) {
        if (pattern[0] == '*' && (pattern[1] == '.' || !pattern[1])) {
            if (*name < '0' || *name > '9') return false;
            while (*name >= '0' && *name <= '9') name++;
            pattern++;
            continue;
        }
        if (*pattern++ != *name++) return false;
    }
    return !*pattern && !*name;
}

static hr_status parse_plan(const hr_arch *a, const char *text, tp_plan *p) {
    p->n = 0;
    if (text && strcmp(text, "auto")) {
        cJSON *j = cJSON_Parse(text);
        if (!j || !cJSON_IsObject(j)) {
            cJSON_Delete(j);
            return hr_error(HR_ERR_INVALID_ARG, "tp_plan: not \"auto\" nor a JSON object of module pattern -> style");
        }
        for (const cJSON *it = j->child; it; it = it->next) {
            const char *v = cJSON_IsString(it) ? it->valuestring : NULL;
            hr_tp_style st = HR_TP_REPLICATED;
            bool known = false;
            for (size_t i = 0; v && i < sizeof style_names / sizeof style_names[0]; i++)
                if (!strcmp(v, style_names[i].name)) st = style_names[i].style, known = true;
            hr_status s = HR_OK;
            if (!known)
                s = hr_error(HR_ERR_INVALID_ARG, "tp_plan['%s']: style %s%s%s is not one hubrt splits %s by (colwise, "
                             "rowwise, rowwise_split_input, colwise_gather_output, embedding_rowwise, replicated)",
                             it->string, v ? "'" : "", v ? v : "(not a string)", v ? "'" : "", a->name);
            else if (p->n == MAX_ENTRIES || strlen(it->string) >= sizeof p->e[0].pattern)
                s = hr_error(HR_ERR_INVALID_ARG, "tp_plan: more than %d entries, or a pattern over %zu characters",
                             MAX_ENTRIES, sizeof p->e[0].pattern - 1);
            if (s != HR_OK) {
                cJSON_Delete(j);
                return s;
            }
            snprintf(p->e[p->n].pattern, sizeof p->e[0].pattern, "%s", it->string);
            p->e[p->n++].style = st;
        }
        cJSON_Delete(j);
    }
    for (size_t i = 0; i < sizeof auto_plan / sizeof auto_plan[0]; i++) p->e[p->n++] = auto_plan[i];
    return HR_OK;
}

static hr_tp_style style_of(const tp_plan *p, const char *module) {
    for (int i = 0; i < p->n; i++)
        if (pattern_matches(p->e[i].pattern, module)) return p->e[i].style;
    return HR_TP_REPLICATED;
}

/* The module a weight belongs to, as tp_plan names it: the name after the
 * decoder's prefix without ".weight" / ".bias"; the head "lm_head". */
static void module_of(const hr_model *m, const char *name, char *buf, size_t n) {
    size_t pl = strlen(m->prefix);
    const char *rest = strncmp(name, m->prefix, pl) ? name : name + pl;
    const char *head = strstr(name, "lm_head.");
    if (rest == name && head) rest = head;
    snprintf(buf, n, "%s", rest);
    char *dot = strrchr(buf, '.');
    if (dot && (!strcmp(dot, ".weight") || !strcmp(dot, ".bias"))) *dot = '\0';
}

/* The style of `module` of layer il ("layers.<il>.<module>"). */
static hr_tp_style layer_style(const tp_plan *p, int64_t il, const char *module) {
    char name[160];
    snprintf(name, sizeof name, "layers.%lld.%s", (long long)il, module);
    return style_of(p, name);
}

/* One group of a layer (attention, MLP): the first module colwise and the
 * last rowwise with the rest colwise, or all replicated, in every layer. */
static hr_status group_split(const hr_model *m, const tp_plan *p, const char *const *mods, int n, bool *split) {
    hr_tp_style first = layer_style(p, 0, mods[0]);
    *split = first != HR_TP_REPLICATED;
    for (int64_t il = 0; il < m->cfg.n_layers; il++)
        for (int i = 0; i < n; i++) {
            hr_tp_style want = !*split ? HR_TP_REPLICATED : i == n - 1 ? HR_TP_ROWWISE : HR_TP_COLWISE;
            hr_tp_style got = layer_style(p, il, mods[i]);
            if (got != want)
                return hr_error(HR_ERR_INVALID_ARG, "tp_plan: layers.%lld.%s is '%s' where layers.0.%s is '%s': "
                                "hubrt splits %s with the first %d colwise and %s rowwise, or replicates all of them, "
                                "in every layer", (long long)il, mods[i], style_name(got), mods[0], style_name(first),
                                mods[0], n - 1, mods[n - 1]);
        }
    return HR_OK;
}

/* ---- setup ---------------------------------------------------------------- */

static hr_status resolve(hr_model *m, int tp, const tp_plan *p) {
    hr_model_config *c = &m->cfg;
    hr_tp *t = &m->tp;
    static const char *const attn[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
    static const char *const mlp[] = {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    HR_TRY(group_split(m, p, attn, 4, &t->attn));
    HR_TRY(group_split(m, p, mlp, 3, &t->mlp));
    hr_tp_style es = style_of(p, "embed_tokens"), hs = style_of(p, "lm_head");
    if (es != HR_TP_REPLICATED && es != HR_TP_EMBEDDING_ROWWISE)
        return hr_error(HR_ERR_INVALID_ARG, "tp_plan: embed_tokens is '%s'; it is embedding_rowwise or replicated",
                        style_name(es));
    if (hs != HR_TP_REPLICATED && hs != HR_TP_COLWISE_GATHER_OUTPUT)
        return hr_error(HR_ERR_INVALID_ARG, "tp_plan: lm_head is '%s'; it is colwise_gather_output or replicated",
                        style_name(hs));
    t->embed = es == HR_TP_EMBEDDING_ROWWISE;
    t->head = hs == HR_TP_COLWISE_GATHER_OUTPUT;
    if (c->tie_word_embeddings && t->embed != t->head)
        return hr_error(HR_ERR_INVALID_ARG, "tp_plan: the head is tied to the embedding (tie_word_embeddings), so "
                        "embed_tokens ('%s') and lm_head ('%s') are split alike or replicated alike", style_name(es),
                        style_name(hs));
    t->full_heads = c->n_heads;
    t->full_kv = c->n_kv_heads;
    t->full_inter = c->intermediate_size;
    for (int k = 0; k < HR_LAYER_KINDS; k++)
        if (c->kind_kv_heads[k] != c->n_kv_heads || c->kind_head_dim[k] != c->head_dim)
            return hr_error(HR_ERR_UNSUPPORTED, "tensor parallelism: layers of another head_dim or kv head count "
                            "than the config's are not split yet");
    int64_t hq = c->n_heads, kv = c->n_kv_heads, kv_local = kv;
    if (t->attn) {
        if (hq % tp)
            return hr_error(HR_ERR_INVALID_ARG, "tp_size %d does not divide num_attention_heads %lld; replicate the "
                            "attention in tp_plan (\"layers.*.self_attn.*_proj\": \"replicated\") or pick another "
                            "tp_size", tp, (long long)hq);
        if (kv % tp == 0) {
            kv_local = kv / tp;
            t->kv0 = t->rank * kv_local;
        } else if (tp % kv == 0) {
            kv_local = 1; /* the kv head this rank's query heads read, held by tp / kv ranks */
            t->kv0 = t->rank / (tp / kv);
        } else {
            return hr_error(HR_ERR_INVALID_ARG, "num_key_value_heads %lld and tp_size %d: kv heads are split when "
                            "tp_size divides them and replicated when they divide tp_size; replicate the attention "
                            "in tp_plan (\"layers.*.self_attn.q_proj\" ... \"o_proj\": \"replicated\") to run this",
                            (long long)kv, tp);
        }
        t->heads0 = t->rank * (hq / tp);
        c->n_heads = hq / tp;
        c->n_kv_heads = kv_local;
        for (int k = 0; k < HR_LAYER_KINDS; k++) c->kind_kv_heads[k] = kv_local;
    }
    if (t->mlp) {
        int64_t first, len;
        hr_split_part(c->intermediate_size, tp, t->rank, &first, &len);
        if (len < 1)
            return hr_error(HR_ERR_INVALID_ARG, "tp_size %d is more than intermediate_size %lld", tp,
                            (long long)c->intermediate_size);
        c->intermediate_size = len;
    }
    if (t->embed || t->head) hr_split_part(c->vocab_size, tp, t->rank, &t->vocab0, &t->vocab_n);
    if ((t->embed || t->head) && t->vocab_n < 1)
        return hr_error(HR_ERR_INVALID_ARG, "tp_size %d is more than vocab_size %lld", tp, (long long)c->vocab_size);
    return HR_OK;
}

/* The architectures whose experts split (their experts weights stored as
 * the experts op reads them, [E, ...]). */
static const char *const ep_archs[] = {"Qwen3MoeForCausalLM"};

static hr_status setup_ep(hr_model *m, int64_t ep) {
    hr_tp *t = &m->tp;
    bool known = false;
    for (size_t i = 0; i < sizeof ep_archs / sizeof ep_archs[0]; i++) known |= !strcmp(m->arch->name, ep_archs[i]);
    if (!m->cfg.n_experts)
        return hr_error(HR_ERR_INVALID_ARG, "ep_size %lld: %s has no experts to split", (long long)ep, m->arch->name);
    if (!known)
        return hr_error(HR_ERR_UNSUPPORTED, "expert parallelism: %s's experts are not split yet (Qwen3-MoE's are)",
                        m->arch->name);
    if (m->cfg.n_experts < ep)
        return hr_error(HR_ERR_INVALID_ARG, "ep_size %lld is more than num_experts %lld", (long long)ep,
                        (long long)m->cfg.n_experts);
    t->ep = true;
    hr_split_part(m->cfg.n_experts, ep, t->rank, &t->experts0, &t->experts_n);
    return HR_OK;
}

hr_status hr_tp_setup(hr_model *m, int64_t tp_size, int64_t ep_size, const char *plan) {
    m->tp = (hr_tp){.size = 1};
    if (tp_size == 0) tp_size = 1;
    if (ep_size == 0) ep_size = 1;
    if (tp_size < 0 || tp_size > 4096) return hr_error(HR_ERR_INVALID_ARG, "tp_size %lld is not 1..4096", (long long)tp_size);
    if (ep_size < 0 || ep_size > 4096) return hr_error(HR_ERR_INVALID_ARG, "ep_size %lld is not 1..4096", (long long)ep_size);
    if (tp_size > 1 && ep_size > 1 && ep_size != tp_size)
        return hr_error(HR_ERR_INVALID_ARG, "ep_size %lld and tp_size %lld: the experts split over the tensor-parallel "
                        "group (ep_size 1 or %lld)", (long long)ep_size, (long long)tp_size, (long long)tp_size);
    if (tp_size == 1 && ep_size == 1) return HR_OK;
    int64_t group = tp_size > 1 ? tp_size : ep_size;
    bool planned = false;
    for (size_t i = 0; i < sizeof planned_archs / sizeof planned_archs[0]; i++)
        planned |= !strcmp(m->arch->name, planned_archs[i]);
    if (!planned)
        return hr_error(HR_ERR_UNSUPPORTED, "tensor parallelism: %s has no tp_plan in hubrt yet (Llama, Mistral, "
                        "Qwen2, Qwen3, Qwen3-MoE and Gemma 3 have)", m->arch->name);
    if (m->dev != hr_device_cpu())
        return hr_error(HR_ERR_UNSUPPORTED, "tensor parallelism runs on the cpu device; on %s the collectives are "
                        "not lowered yet", hr_device_name(m->dev));
    if (m->cfg.from_gguf || m->quantize != HR_DTYPE_COUNT)
        return hr_error(HR_ERR_UNSUPPORTED, "tensor parallelism splits float safetensors checkpoints; GGUF files "
                        "and quantize are not split yet");
    HR_TRY(hr_dist_init());
    const char *which = tp_size > 1 ? "tp_size" : "ep_size";
    if (hr_dist_size() != group)
        return hr_error(HR_ERR_INVALID_ARG, "%s %lld, but the process group has %d process%s: start one "
                        "process per rank (hubrt launch -n %lld -- ..., or mpirun -n %lld ...)", which,
                        (long long)group, hr_dist_size(), hr_dist_size() == 1 ? "" : "es", (long long)group,
                        (long long)group);
    tp_plan p;
    HR_TRY(parse_plan(m->arch, plan, &p));
    m->tp = (hr_tp){.size = (int)group, .rank = hr_dist_rank()};
    /* ep alone: every layer replicated but the experts */
    hr_status s = tp_size > 1 ? resolve(m, (int)tp_size, &p) : HR_OK;
    if (s == HR_OK && ep_size > 1) s = setup_ep(m, ep_size);
    if (s != HR_OK) m->tp = (hr_tp){.size = 1};
    return s;
}

/* ---- slices ----------------------------------------------------------------- */

/* The rows of dim `d` this rank holds in a split group. */
static bool part_of(const hr_model *m, hr_dim d, int64_t il, int64_t *first, int64_t *len) {
    const hr_tp *t = &m->tp;
    int64_t hd = m->cfg.kind_head_dim[il >= 0 ? hr_model_layer_kind(m, il) : HR_LAYER_FULL];
    switch (d) {
    case HR_DIM_Q: *first = t->heads0 * hd, *len = m->cfg.n_heads * hd; return t->attn;
    case HR_DIM_HEADS: *first = t->heads0, *len = m->cfg.n_heads; return t->attn;
    case HR_DIM_KV: *first = t->kv0 * hd, *len = m->cfg.n_kv_heads * hd; return t->attn;
    case HR_DIM_INTER: hr_split_part(t->full_inter, t->size, t->rank, first, len); return t->mlp;
    case HR_DIM_VOCAB: *first = t->vocab0, *len = t->vocab_n; return t->embed || t->head;
    default: return false;
    }
}

void hr_tp_slice(const hr_model *m, const char *name, const hr_dim *dims, int64_t il, int *axis, int64_t *first,
                 int64_t *len) {
    *axis = -1;
    if (m->tp.size <= 1) return;
    char module[160];
    module_of(m, name, module, sizeof module);
    /* the plan as resolved: the groups' flags stand for their modules */
    bool vocab = dims[0] == HR_DIM_VOCAB && !dims[2];
    if (vocab) {
        bool head = !strcmp(module, "lm_head") || (m->cfg.tie_word_embeddings && !strcmp(module, "embed_tokens"));
        if ((head ? m->tp.head : m->tp.embed) && part_of(m, HR_DIM_VOCAB, il, first, len)) *axis = 0;
        return;
    }
    if (il >= 0 && dims[0] == HR_DIM_EXPERTS && m->tp.ep && strstr(module, ".experts")) {
        /* this rank's experts (the router, [E, hidden], stays whole) */
        *first = m->tp.experts0, *len = m->tp.experts_n, *axis = 0;
        return;
    }
    if (il < 0 || dims[2]) return; /* outside the layers, or stacked experts: replicated */
    bool attn = !strncmp(module, "self_attn.", 10) || strstr(module, ".self_attn.");
    bool mlp = strstr(module, ".mlp.") && !strstr(module, ".experts") && !strstr(module, "mlp.gate.");
    if (!attn && !mlp) return;
    /* colwise: the output rows (dims[0]); rowwise: the input columns
     * (dims[1]) of a matrix, the bias whole */
    bool rowwise = strstr(module, "o_proj") || strstr(module, "down_proj");
    if (rowwise) {
        if (dims[1] && part_of(m, dims[1], il, first, len)) *axis = 1;
        return;
    }
    if (part_of(m, dims[0], il, first, len)) *axis = 0;
}
