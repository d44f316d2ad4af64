/* Internal model machinery: the typed config, the architecture interface,
 * weight tables and the model struct. An architecture (llama.c, qwen3.c,
 * gemma3.c, ...) is one file: its config fields, its layer weight table
 * and its forward, written with the blocks of blocks.h. */
#ifndef HR_MODELS_MODEL_IMPL_H
#define HR_MODELS_MODEL_IMPL_H

#include "core/tensor_impl.h"
#include "hubrt/graph.h"
#include "hubrt/io.h"
#include "hubrt/model.h"
#include "models/scratch.h"

/* What a layer's attention sees: every earlier token, or the last
 * `sliding_window` of them (itself included), over a ring-buffer cache. */
typedef enum hr_layer_kind { HR_LAYER_FULL = 0, HR_LAYER_SLIDING = 1, HR_LAYER_KINDS = 2 } hr_layer_kind;

/* config.json's quantization_config: how the checkpoint stores quantized
 * weights (config_quant.c). */
typedef enum hr_quant_method { HR_QUANT_NONE, HR_QUANT_MXFP4, HR_QUANT_FP8 } hr_quant_method;
typedef struct hr_quant_config {
    hr_quant_method method;
    /* FP8 ("fp8", or "compressed-tensors" float-quantized): each weight's
     * F8_E4M3 codes times the scale of their block of block[0] rows x
     * block[1] columns (0: the whole dim; per tensor 0 x 0, per channel
     * 1 x 0), stored as NAME's `scale_suffix` in place of "weight" */
    int64_t block[2];
    const char *scale_suffix; /* "weight_scale_inv" (fp8) or "weight_scale" (compressed-tensors) */
    const char *label;        /* "fp8" or "compressed-tensors", for messages */
    /* activations' scales stored (activation_scheme "static" / input
     * activations not dynamic): checked at load; the CPU keeps activations
     * in f32, so they are not applied (transformers' dequantized run) */
    bool static_act;
} hr_quant_config;

/* The config.json fields every decoder-only architecture has; an
 * architecture's own fields live in its arch_cfg. */
typedef struct hr_model_config {
    char arch[64];
    int64_t vocab_size, hidden_size, intermediate_size;
    int64_t n_layers, n_heads, n_kv_heads, head_dim;
    /* each layer kind's head_dim and kv heads: head_dim and n_kv_heads,
     * unless the architecture gives a kind its own (Gemma 4's global layers) */
    int64_t kind_head_dim[HR_LAYER_KINDS], kind_kv_heads[HR_LAYER_KINDS];
    /* [n_layers]: the earlier layer whose keys and values layer il reads
     * instead of its own (Gemma 4's shared KV layers), or -1; NULL: none.
     * Owned. */
    int64_t *kv_source;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings;
    char hidden_act[32];              /* hidden_act, or hidden_activation (Gemma) */
    hr_rope_config rope[HR_LAYER_KINDS];
    double *rope_short, *rope_long;   /* owned; longrope factors [rotary_dim/2] (full layers) */
    int64_t sliding_window;           /* keys a sliding layer sees; 0: no sliding layers */
    /* mixture of experts (0 where the architecture has none) */
    int64_t n_experts, n_experts_per_tok, moe_intermediate_size;
    const char *moe_inter_field;      /* the config.json field it came from (errors name it); NULL: moe_intermediate_size */
    uint8_t *layer_kind;              /* [n_layers] hr_layer_kind; owned */
    hr_dtype dtype;                   /* dtype / torch_dtype, f32 when absent */
    bool from_gguf;                   /* built from a GGUF file's metadata */
    hr_quant_config quant;            /* quantization_config */
    /* generation_config.json, with config.json's eos/pad/bos ids merged */
    hr_generation_config gen;
} hr_model_config;

/* ---- weight tables ---------------------------------------------------- */

/* A size of a weight, by what the config says. */
typedef enum hr_dim {
    HR_DIM_NONE = 0, /* a vector's missing second dim */
    HR_DIM_HIDDEN,   /* hidden_size */
    HR_DIM_Q,        /* num_attention_heads * head_dim */
    HR_DIM_KV,       /* num_key_value_heads * head_dim */
    HR_DIM_HEAD,     /* head_dim */
    HR_DIM_INTER,    /* intermediate_size */
    HR_DIM_VOCAB,    /* vocab_size */
    HR_DIM_EXPERTS,  /* the experts of a MoE layer */
    HR_DIM_MOE_INTER,  /* moe_intermediate_size */
    HR_DIM_MOE_INTER2, /* 2 x moe_intermediate_size: gate and up stacked */
    HR_DIM_HEADS,      /* num_attention_heads */
    HR_DIM_ONE,        /* 1: a scalar held as a [1] tensor */
    /* sizes an architecture defines from its own fields (hr_arch.dim) */
    HR_DIM_ARCH0, HR_DIM_ARCH1, HR_DIM_ARCH2,
} hr_dim;

typedef enum hr_weight_role {
    HR_WEIGHT_OTHER = 0, /* norms, biases */
    HR_WEIGHT_LINEAR,    /* read as linear's [out, in] weight: the device may repack it */
} hr_weight_role;

/* How llama.cpp's converter stored the rows of a GGUF tensor: permuted per
 * head for its interleaved rope ("llama" files' q and k). */
typedef enum hr_gguf_rows { HR_GGUF_ROWS = 0, HR_GGUF_ROWS_PERM_HEADS, HR_GGUF_ROWS_PERM_KV_HEADS } hr_gguf_rows;

/* How the checkpoint lays a weight out when not as the model reads it:
 * gpt-oss's experts, stored as transformers holds them, rearranged once at
 * load into the experts op's layout. */
typedef enum hr_weight_stored {
    HR_STORED_AS_IS = 0,
    HR_STORED_TRANSPOSED,             /* [E, cols, rows]: the last two dims swapped */
    HR_STORED_TRANSPOSED_INTERLEAVED, /* [E, cols, rows], gate and up rows interleaved (gate even, up odd) */
    HR_STORED_INTERLEAVED,            /* [E, rows], gate and up interleaved along the rows */
} hr_weight_stored;

typedef struct hr_model hr_model;

/* One weight of every layer: the Hugging Face name after the layer
 * prefix ("model.layers.<i>."), llama.cpp's after "blk.<i>.", its shape,
 * and when it is there. Loading, the device's weight preparation, the
 * GGUF name mapping and the compile cache's name lookup all walk the
 * table. */
typedef struct hr_weight_spec {
    const char *hf;
    const char *gguf;                 /* NULL: no GGUF name */
    hr_dim shape[3];                  /* [rows, cols], [n, NONE] or [experts, rows, cols] */
    hr_weight_role role;
    hr_gguf_rows gguf_rows;
    /* Whether the weight is there for layer il of this config (NULL:
     * always). A weight that is there is required: its absence is an
     * error naming it. */
    bool (*when)(const hr_model *m, int64_t il);
    /* A stacked experts weight [experts, rows, cols] that the checkpoint
     * may hold per expert instead (transformers' save): these names after
     * the layer prefix, "%lld" the expert, each [rows / n, cols], stacked
     * along the rows in this order (gate, then up). NULL: never split. */
    const char *per_expert[2];
    /* ... or as stacked parts [experts, rows / n, cols] by these names
     * (what a GGUF file's ffn_{gate,up}_exps become: gguf_parts), stacked
     * along the rows in this order. */
    const char *parts[2];
    const char *gguf_parts[2];
    hr_weight_stored stored;
} hr_weight_spec;

/* ---- the architecture interface --------------------------------------- */

typedef struct hr_fwd hr_fwd;
struct hr_gguf;
struct cJSON;

typedef struct hr_arch {
    const char *name;          /* config.json "architectures" entry */
    const char *alias;         /* a second class name read the same way, or NULL */
    /* Class defaults for keys a config.json may leave out (a JSON object,
     * or NULL): transformers fills them from the config class. */
    const char *defaults_json;
    size_t cfg_size;           /* bytes of the architecture's own config (arch_cfg) */
    /* Reads the architecture's own fields (root: the text config) into
     * arch_cfg and sets the layer kinds, sliding window and rope of the
     * common config; errors name the field. */
    hr_status (*configure)(hr_json_obj root, hr_model_config *cfg, void *arch_cfg);
    const hr_weight_spec *layer_weights;
    int n_layer_weights;
    /* The token embedding into f->x (NULL: the plain lookup). */
    hr_status (*embed)(hr_fwd *f, const hr_tensor *ids);
    /* The layers over f->x, ending with f->h holding the final norm of the
     * residual stream (the blocks fuse that norm into the last add). */
    hr_status (*forward)(hr_fwd *f);
    /* Logits from the final-normed rows h into out (NULL: lm_head alone). */
    hr_status (*head)(hr_fwd *f, const hr_tensor *h, hr_tensor *out);
    /* llama.cpp's general.architecture of GGUF files of this model, or NULL,
     * and the config.json fields its metadata gives beyond the common ones
     * (models/gguf_config.c). */
    const char *gguf_arch;
    hr_status (*gguf_config)(const struct hr_gguf *g, struct cJSON *config);
    /* Weights outside the layers beyond the embedding, final norm and head
     * (Gemma 4's per-layer embeddings): names after the decoder's prefix,
     * `when` called with il -1; loaded into m->model_w in table order. */
    const hr_weight_spec *model_weights;
    int n_model_weights;
    /* A size from the architecture's own fields: the HR_DIM_ARCH* dims, or a
     * common dim it sizes differently for layer il (-1: outside the
     * layers); -1 leaves the common size. With field non-NULL, writes the
     * config fields it comes from there. NULL: only common sizes. */
    int64_t (*dim)(const hr_model *m, hr_dim d, int64_t il, char *field, size_t n);
} hr_arch;

/* Every architecture, in registry.c. */
const hr_arch *hr_arch_find(const char *name);
const hr_arch *hr_arch_at(int i);

/* ---- the model ---------------------------------------------------------- */

/* This rank's share of a tensor-parallel model (models/tp.h). */
typedef struct hr_tp {
    int size, rank;          /* 1, 0: not split */
    bool attn, mlp;          /* split as the plan says */
    bool embed, head;        /* vocab-split */
    int64_t heads0, kv0;     /* this rank's first query head and first kv head */
    int64_t full_heads, full_kv, full_inter; /* the config's, before hr_tp_setup localized it */
    int64_t vocab0, vocab_n; /* this rank's vocab rows (embed or head split) */
    bool ep;                 /* experts split (expert parallelism) */
    int64_t experts0, experts_n; /* this rank's experts */
} hr_tp;

struct hr_model {
    const hr_arch *arch;
    hr_model_config cfg;
    void *arch_cfg;             /* the architecture's own config (arch->cfg_size bytes) */
    hr_dtype dtype;
    bool dequantize;            /* block-quantized weights cast to dtype at load (hr_model_options) */
    hr_dtype quantize;          /* float matrices quantized into it at load; HR_DTYPE_COUNT: none */
    uint32_t weight_types;      /* bit d: some weight is stored in dtype d */
    char weight_types_str[96];  /* the same as names, hr_model_weight_types */
    hr_device *dev;
    hr_checkpoint *ckpt;
    char prefix[64];            /* of the text decoder's names: "model.", "language_model.model.", ... */
    hr_tensor *embed;           /* [vocab, hidden] */
    hr_tensor *final_norm;      /* [hidden] */
    hr_tensor *lm_head;         /* [vocab, hidden], the embedding's alias when tied */
    hr_tensor **layer_w;        /* [n_layers * arch->n_layer_weights]; NULL where absent */
    hr_tensor **model_w;        /* [arch->n_model_weights]; NULL where absent */
    /* The experts implementation MoE layers run (hr_model_set_experts_implementation):
     * "grouped" (the default) or "eager", transformers' per-expert loop's rounding. */
    bool experts_per_expert;
    int64_t experts_impl;       /* 0, or a hub kernel's implementation id (hr_kernel_info.impl_id) */
    char experts_name[160];     /* the kernel's name, when experts_impl is set */
    float *inv_freq[HR_LAYER_KINDS]; /* [rot/2] for rope types that do not depend on the length */
    double attn_scaling[HR_LAYER_KINDS];
    hr_tp tp;                   /* this rank's share; tp.size 1: the whole model */
    hr_scratch scratch;         /* the eager forward's activations */
    /* The compiled forward (forward_compiled.c): one jit returning every
     * position's logits, one the last position's; plans per input shape. */
    hr_jit *jit[2];
    hr_kv_cache *jit_cache;     /* the cache of the call being captured */
};

/* Layer il's weight `idx` of its architecture's table, or NULL. */
static inline const hr_tensor *hr_layer_w(const hr_model *m, int64_t il, int idx) {
    return m->layer_w[il * m->arch->n_layer_weights + idx];
}

/* The architecture's model-level weight `idx` (hr_arch.model_weights), or NULL. */
static inline const hr_tensor *hr_model_w(const hr_model *m, int idx) { return m->model_w ? m->model_w[idx] : NULL; }

static inline hr_layer_kind hr_model_layer_kind(const hr_model *m, int64_t il) {
    return (hr_layer_kind)m->cfg.layer_kind[il];
}

/* ---- experts weights in the Hub's MXFP4 form (weights_mxfp4.c) ----------- */

/* Whether weight `name` is held as NAME_blocks and NAME_scales instead. */
bool hr_mxfp4_held(const hr_model *m, const char *name);
/* quantization_config (root's) into cfg->quant; methods and schemes hubrt
 * does not read refused naming the field. */
hr_status hr_config_quant(const char *dir, hr_json_obj root, hr_model_config *cfg);
/* The Hub's FP8 weights (weights_fp8.c): whether weight `name` is stored
 * in F8_E4M3 under an FP8 quantization_config; its codes and scales
 * checked against [rows, cols] from the index alone; loaded as FP8 blocks
 * (`blocks`, and its columns divide into them) or dequantized into the
 * model dtype on the host. */
bool hr_fp8_held(const hr_model *m, const char *name);
hr_status hr_fp8_check(const hr_model *m, const char *name, int64_t rows, int64_t cols);
hr_status hr_fp8_load(hr_model *m, const char *name, int64_t rows, int64_t cols, bool blocks, hr_tensor **out);
/* The same for elements [first, first + len) of dim `axis` (0: rows, 1:
 * columns; -1: all) of the weight: a tensor-parallel slice (rows and cols
 * then come from the checkpoint, the whole weight's). */
hr_status hr_fp8_load_part(hr_model *m, const char *name, int64_t rows, int64_t cols, int axis, int64_t first,
                           int64_t len, bool blocks, hr_tensor **out);
/* Checks their dtypes and shapes for a [experts, rows, cols] matrix. */
hr_status hr_mxfp4_check(const hr_model *m, const char *name, int64_t experts, int64_t rows, int64_t cols);
/* The matrix dequantized into the model dtype on the host; `interleaved`:
 * rows 2i, 2i + 1 are gate and up row i, put as gate rows then up rows. */
hr_status hr_mxfp4_load(hr_model *m, const char *name, int64_t experts, int64_t rows, int64_t cols, bool interleaved,
                        hr_tensor **out);

/* ---- config (config.c) -------------------------------------------------- */

/* Reads config.json (or the config a GGUF file's metadata gives) and
 * generation_config.json from dir: the common fields, then the
 * architecture's (configure). The arch is found by name. */
hr_status hr_model_config_load(const char *dir, hr_model_config *cfg, const hr_arch **arch, void **arch_cfg);
/* The same from config.json's text alone (`label` names it in errors):
 * what the config fuzz target drives. */
hr_status hr_model_config_parse(const char *label, const char *text, size_t len, hr_model_config *cfg,
                                const hr_arch **arch, void **arch_cfg);
void hr_model_config_free(hr_model_config *cfg);
/* A rope config from a rope_parameters-style object `rp` (rope_type or
 * type, rope_theta, factor, ...; may be absent), rope_theta from `root`
 * or `theta` when neither has one; for head_dim and the context of cfg.
 * longrope's factors are stored in cfg. */
hr_status hr_config_rope(hr_json_obj root, hr_json_obj rp, double theta, hr_model_config *cfg, hr_rope_config *out);
/* The same for heads of head_dim (a layer kind's own, hr_model_config.kind_head_dim). */
hr_status hr_config_rope_dim(hr_json_obj root, hr_json_obj rp, double theta, int64_t head_dim, hr_model_config *cfg,
                             hr_rope_config *out);
/* layer_types, when the config lists them, into cfg->layer_kind
 * ("sliding_attention" or "full_attention"; errors name `arch`); *listed
 * says whether it did. */
hr_status hr_config_layer_types(hr_json_obj root, hr_model_config *cfg, const char *arch, bool *listed);
/* config[key] = v, replacing what it held: a GGUF file's config.json
 * built from its metadata (hr_arch.gguf_config). */
hr_status hr_config_json_set_num(struct cJSON *o, const char *key, double v);
/* sliding_window (def when absent) into cfg, checked to lie in 1 ..
 * max_position_embeddings. */
hr_status hr_config_window(hr_json_obj root, int64_t def, hr_model_config *cfg);
/* Checks hidden_act is `want` (errors name the field and the value). */
hr_status hr_config_require_act(const hr_model_config *cfg, const char *want);

/* ---- weights (weights.c) ------------------------------------------------- */

/* Every weight: the embedding, final norm and head, then each layer's by
 * its architecture's table; then the device prepares them. */
/* The checkpoint's weights against the config (presence, shape, layer
 * count), from its index alone: errors name the tensor and the config
 * fields. Runs before anything sized by the config is allocated. */
hr_status hr_model_check_weights(hr_model *m);
/* Loads every weight the check passed (it found the names' prefix). */
hr_status hr_model_load_weights(hr_model *m);
void hr_model_free_weights(hr_model *m);
/* The weight named `name`, or NULL (the compile cache's constants). */
const hr_tensor *hr_model_find_weight(const hr_model *m, const char *name);
/* The size `d` stands for in layer il (-1: outside the layers, where the
 * attention dims are the full layers'). */
int64_t hr_model_dim(const hr_model *m, hr_dim d, int64_t il);

/* ---- forward (forward.c, forward_compiled.c) ----------------------------- */

/* The forward on host arrays: ids and pos [b, s], mask [b, past + s] or
 * NULL. Writes the tokens into the cache and logits [b, s | 1, vocab] into
 * *logits: reused when it has that shape and dtype, else (re)allocated.
 * The logits are f32 (bf16 or f16 values for such a model, as transformers
 * casts its head's output), or with f32_logits false the head's output in
 * the model's dtype, the same values before widening. exact: attention
 * through sdpa's batch-invariant path (hr_step_args.batch_invariant). */
hr_status hr_model_forward_host(hr_model *m, const int64_t *ids, const int64_t *mask, const int64_t *pos,
                                int64_t b, int64_t s, hr_kv_cache *cache, bool last_only, bool f32_logits,
                                hr_tensor **logits, bool exact);
/* The forward with static shapes, compiled once per [b, s, capacity] and
 * replayed; the contract of hr_model_forward_host with f32_logits false,
 * but *logits always receives a new tensor. */
hr_status hr_model_forward_compiled(hr_model *m, const int64_t *ids, const int64_t *mask, const int64_t *pos,
                                    int64_t b, int64_t s, hr_kv_cache *cache, bool last_only,
                                    hr_tensor **logits);
hr_status hr_model_check_forward(const hr_model *m, const int64_t *ids, int64_t b, int64_t s,
                                 const hr_kv_cache *cache);
/* Replaces a host tensor by its copy on the model's device (no-op there). */
hr_status hr_model_to_device(const hr_model *m, hr_tensor **t);

#endif
