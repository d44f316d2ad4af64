/* Checkpoints as the Hub lays them out: one model.safetensors, or shards
 * named by model.safetensors.index.json's weight_map. Every shard is opened
 * (and its header validated) up front, so a missing shard or a tensor absent
 * from its shard fails at open, naming both. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/path.h"
#include "hubrt/ops.h"
#include "io/gguf.h"
#include "io/st_internal.h"

#define CK_SINGLE "model.safetensors"
#define CK_INDEX "model.safetensors.index.json"
/* Index files list names and file names only; a few MB at most. */
#define CK_INDEX_MAX ((size_t)256 << 20)

typedef struct ck_entry {
    char *name;
    size_t shard;       /* for a GGUF file: the tensor's index in it */
    int64_t perm_heads; /* GGUF q/k: heads whose row permutation to undo */
} ck_entry;

struct hr_checkpoint {
    char *path;              /* as opened, for messages */
    hr_safetensors **shards; /* [n_shards] */
    char **shard_paths;      /* [n_shards] */
    size_t n_shards;
    ck_entry *entries;       /* [n], sorted by name */
    size_t n;
    hr_gguf *gguf;           /* instead of shards for a GGUF file */
    bool ranged;             /* shards opened by ranges (hr_checkpoint_open_ranged) */
};

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static char *path_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const ck_entry *)a)->name, ((const ck_entry *)b)->name);
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static hr_status ck_add_shard(hr_checkpoint *ck, const char *path) {
    hr_safetensors **s = realloc(ck->shards, (ck->n_shards + 1) * sizeof *s);
    if (s) ck->shards = s;
    char **p = realloc(ck->shard_paths, (ck->n_shards + 1) * sizeof *p);
    if (p) ck->shard_paths = p;
    char *copy = strdup(path);
    if (!s || !p || !copy) {
        free(copy);
        return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    }
    ck->shards[ck->n_shards] = NULL;
    ck->shard_paths[ck->n_shards++] = copy;
    hr_safetensors **slot = &ck->shards[ck->n_shards - 1];
    return ck->ranged ? hr_safetensors_open_ranged(path, slot) : hr_safetensors_open(path, slot);
}

static hr_status ck_open_single(hr_checkpoint *ck, const char *path) {
    HR_TRY(ck_add_shard(ck, path));
    const hr_safetensors *st = ck->shards[0];
    size_t n = hr_safetensors_count(st);
    ck->entries = calloc(n ? n : 1, sizeof *ck->entries);
    if (!ck->entries) return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) {
        if (!(ck->entries[i].name = strdup(hr_safetensors_name(st, i))))
            return hr_error(HR_ERR_OOM, "%s: out of memory", path);
        ck->n++;
    }
    return HR_OK;
}

/* A shard file name must stay inside the model folder. */
static hr_status ck_check_shard_name(const char *index, const char *tensor, const char *file) {
    bool bad = !file[0] || file[0] == '/' || !strcmp(file, "..") || !strncmp(file, "../", 3) ||
               strstr(file, "/../") || ends_with(file, "/..");
    if (bad)
        return hr_error(HR_ERR_FORMAT,
                        "%s: weight_map: shard '%s' for tensor '%s' is not a file name inside "
                        "the model folder",
                        index, file, tensor);
    return HR_OK;
}

/* Opens each distinct shard once, in file-name order. */
static hr_status ck_open_shards(hr_checkpoint *ck, const char *index, const char *dir,
                                const cJSON *map) {
    size_t n = (size_t)cJSON_GetArraySize(map), k = 0;
    const char **files = calloc(n ? n : 1, sizeof *files);
    if (!files) return hr_error(HR_ERR_OOM, "%s: out of memory", index);
    for (const cJSON *it = map->child; it; it = it->next) files[k++] = it->valuestring;
    qsort(files, n, sizeof *files, str_cmp);
    hr_status s = HR_OK;
    for (size_t i = 0; i < n && s == HR_OK; i++) {
        if (i && !strcmp(files[i], files[i - 1])) continue;
        char *p = path_join(dir, files[i]);
        s = p ? hr_path_check_inside(dir, p) : hr_error(HR_ERR_OOM, "%s: out of memory", index);
        if (s == HR_OK) s = ck_add_shard(ck, p);
        if (s != HR_OK && p)
            s = hr_error_context(s, "%s: shard '%s' of the weight_map", index, files[i]);
        free(p);
    }
    free(files);
    return s;
}

static size_t ck_shard_of(const hr_checkpoint *ck, const char *dir, const char *file) {
    size_t dl = strlen(dir);
    for (size_t i = 0; i < ck->n_shards; i++)
        if (!strcmp(ck->shard_paths[i] + dl + 1, file)) return i;
    return ck->n_shards;
}

static hr_status ck_parse_index(hr_checkpoint *ck, const char *index, const char *dir,
                                const cJSON *root) {
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(map))
        return hr_error(HR_ERR_FORMAT, "%s: field 'weight_map' must be an object", index);
    for (const cJSON *it = map->child; it; it = it->next) {
        if (!cJSON_IsString(it))
            return hr_error(HR_ERR_FORMAT, "%s: weight_map: value for tensor '%s' must be a file name",
                            index, it->string);
        HR_TRY(ck_check_shard_name(index, it->string, it->valuestring));
    }
    HR_TRY(ck_open_shards(ck, index, dir, map));
    size_t n = (size_t)cJSON_GetArraySize(map);
    ck->entries = calloc(n ? n : 1, sizeof *ck->entries);
    if (!ck->entries) return hr_error(HR_ERR_OOM, "%s: out of memory", index);
    for (const cJSON *it = map->child; it; it = it->next) {
        size_t sh = ck_shard_of(ck, dir, it->valuestring);
        hr_tensor_info info;
        if (sh == ck->n_shards || hr_safetensors_info(ck->shards[sh], it->string, &info) != HR_OK)
            return hr_error(HR_ERR_NOT_FOUND,
                            "%s: tensor '%s' is missing from its shard '%s'", index, it->string,
                            it->valuestring);
        ck_entry *e = &ck->entries[ck->n];
        if (!(e->name = strdup(it->string))) return hr_error(HR_ERR_OOM, "%s: out of memory", index);
        e->shard = sh;
        ck->n++;
    }
    qsort(ck->entries, ck->n, sizeof *ck->entries, entry_cmp);
    for (size_t i = 1; i < ck->n; i++)
        if (!strcmp(ck->entries[i].name, ck->entries[i - 1].name))
            return hr_error(HR_ERR_FORMAT, "%s: weight_map lists tensor '%s' twice", index,
                            ck->entries[i].name);
    return HR_OK;
}

static hr_status ck_open_index(hr_checkpoint *ck, const char *index) {
    char *text = NULL;
    size_t len = 0;
    HR_TRY(hr_io_read_file(index, CK_INDEX_MAX, &text, &len));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    hr_status s;
    if (!root) {
        s = hr_error(HR_ERR_FORMAT, "%s: not valid JSON (near byte %zu)", index,
                     end ? (size_t)(end - text) : 0);
    } else {
        char *dir = path_dir(index);
        s = dir ? ck_parse_index(ck, index, dir, root) : hr_error(HR_ERR_OOM, "out of memory");
        free(dir);
    }
    cJSON_Delete(root);
    free(text);
    return s;
}

/* A GGUF file's tensors under their HF names; tensors without one (such
 * as llama.cpp's rope_freqs) are left out. */
static hr_status ck_open_gguf(hr_checkpoint *ck, const char *path) {
    HR_TRY(hr_gguf_open(path, &ck->gguf));
    const hr_gguf *g = ck->gguf;
    ck->entries = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *ck->entries);
    if (!ck->entries) return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    for (size_t i = 0; i < g->n_tensors; i++) {
        char name[256];
        int64_t perm = 0;
        if (!hr_gguf_hf_name(g, g->tensors[i].name, name, sizeof name, &perm)) continue;
        ck_entry *e = &ck->entries[ck->n];
        if (!(e->name = strdup(name))) return hr_error(HR_ERR_OOM, "%s: out of memory", path);
        e->shard = i;
        e->perm_heads = perm;
        ck->n++;
    }
    qsort(ck->entries, ck->n, sizeof *ck->entries, entry_cmp);
    return HR_OK;
}

/* A folder holds model.safetensors (preferred, as in transformers) or the
 * index of its shards. */
static hr_status ck_open_folder(hr_checkpoint *ck, const char *dir) {
    struct stat sb;
    char *single = path_join(dir, CK_SINGLE), *index = path_join(dir, CK_INDEX);
    hr_status s;
    if (!single || !index) s = hr_error(HR_ERR_OOM, "out of memory");
    else if (stat(single, &sb) == 0)
        s = hr_path_check_inside(dir, single) == HR_OK ? ck_open_single(ck, single) : HR_ERR_FORMAT;
    else if (stat(index, &sb) == 0)
        s = hr_path_check_inside(dir, index) == HR_OK ? ck_open_index(ck, index) : HR_ERR_FORMAT;
    else
        s = hr_error(HR_ERR_NOT_FOUND, "%s: no %s or %s in this folder", dir, CK_SINGLE, CK_INDEX);
    free(single);
    free(index);
    return s;
}

static hr_status ck_open(const char *path, bool ranged, hr_checkpoint **out) {
    if (!path || !out) return hr_error(HR_ERR_INVALID_ARG, "hr_checkpoint_open: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return hr_error(errno == ENOENT ? HR_ERR_NOT_FOUND : HR_ERR_IO, "%s: %s", path,
                        strerror(errno));
    hr_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->path = strdup(path))) {
        free(ck);
        return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    }
    ck->ranged = ranged;
    char *gguf = NULL;
    hr_status s = hr_gguf_resolve(path, &gguf);
    if (s != HR_OK) {
        hr_checkpoint_close(ck);
        return s;
    }
    if (gguf) s = ck_open_gguf(ck, gguf);
    else if (S_ISDIR(sb.st_mode)) s = ck_open_folder(ck, path);
    else if (ends_with(path, ".json")) s = ck_open_index(ck, path);
    else s = ck_open_single(ck, path);
    free(gguf);
    if (s != HR_OK) {
        hr_checkpoint_close(ck);
        return s;
    }
    *out = ck;
    return HR_OK;
}

hr_status hr_checkpoint_open(const char *path, hr_checkpoint **out) { return ck_open(path, false, out); }

hr_status hr_checkpoint_open_ranged(const char *path, hr_checkpoint **out) { return ck_open(path, true, out); }

void hr_checkpoint_close(hr_checkpoint *ck) {
    if (!ck) return;
    for (size_t i = 0; i < ck->n_shards; i++) {
        hr_safetensors_close(ck->shards[i]);
        free(ck->shard_paths[i]);
    }
    for (size_t i = 0; i < ck->n; i++) free(ck->entries[i].name);
    free(ck->shards);
    free(ck->shard_paths);
    free(ck->entries);
    hr_gguf_close(ck->gguf);
    free(ck->path);
    free(ck);
}

size_t hr_checkpoint_count(const hr_checkpoint *ck) { return ck->n; }

const char *hr_checkpoint_name(const hr_checkpoint *ck, size_t i) {
    return i < ck->n ? ck->entries[i].name : NULL;
}

static const ck_entry *ck_find(const hr_checkpoint *ck, const char *name) {
    if (!name) return NULL;
    ck_entry key = {.name = (char *)name};
    return bsearch(&key, ck->entries, ck->n, sizeof key, entry_cmp);
}

bool hr_checkpoint_has(const hr_checkpoint *ck, const char *name) { return ck_find(ck, name); }

static hr_status ck_missing(const hr_checkpoint *ck, const char *name) {
    return hr_error(HR_ERR_NOT_FOUND, "%s: no tensor named '%s'", ck->path,
                    name ? name : "(null)");
}

/* GGUF tensors come as f16 or bf16 when stored so, else f32 (dequantized). */
static hr_status gguf_info(const gguf_tensor *t, hr_tensor_info *out) {
    hr_dtype stored = hr_gguf_stored_dtype(t);
    out->dtype = stored == HR_DTYPE_COUNT || hr_dtype_is_quantized(stored) ? HR_F32 : stored;
    out->ndim = t->ndim;
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) numel *= out->shape[i] = t->ne[t->ndim - 1 - i];
    out->nbytes = (size_t)numel * hr_dtype_size(out->dtype);
    return HR_OK;
}

hr_status hr_checkpoint_info(const hr_checkpoint *ck, const char *name, hr_tensor_info *out) {
    const ck_entry *e = ck_find(ck, name);
    if (!e) return ck_missing(ck, name);
    if (ck->gguf) return gguf_info(&ck->gguf->tensors[e->shard], out);
    return hr_safetensors_info(ck->shards[e->shard], name, out);
}

hr_status hr_checkpoint_tensor(const hr_checkpoint *ck, const char *name, hr_tensor **out) {
    hr_tensor_info info;
    HR_TRY(hr_checkpoint_info(ck, name, &info));
    return hr_checkpoint_tensor_as(ck, name, info.dtype, out);
}

hr_status hr_checkpoint_tensor_as(const hr_checkpoint *ck, const char *name, hr_dtype dt, hr_tensor **out) {
    if (out) *out = NULL;
    const ck_entry *e = ck_find(ck, name);
    if (!e) return ck_missing(ck, name);
    if (ck->gguf) {
        /* stored as asked and in HF order: a view of the file, as a
         * safetensors tensor is (the loader then packs it as one) */
        const gguf_tensor *t = &ck->gguf->tensors[e->shard];
        if (hr_gguf_stored_dtype(t) == dt && e->perm_heads == 0 && hr_gguf_view(ck->gguf, t, out) == HR_OK) {
            hr_tensor_set_name(*out, name);
            return HR_OK;
        }
        if (hr_dtype_is_quantized(dt)) {
            /* blocks are read as stored, never converted to another type */
            if (hr_gguf_stored_dtype(t) != dt)
                return hr_error(HR_ERR_DTYPE, "%s: tensor '%s' is stored as %s, not %s", ck->path, name,
                                hr_dtype_name(hr_gguf_stored_dtype(t)), hr_dtype_name(dt));
            HR_TRY(hr_gguf_rows_permuted(ck->gguf, t, e->perm_heads, out));
            hr_tensor_set_name(*out, name);
            return HR_OK;
        }
        HR_TRY(hr_gguf_dequant(ck->gguf, t, dt, e->perm_heads, out));
        hr_tensor_set_name(*out, name);
        return HR_OK;
    }
    hr_tensor *t = NULL;
    HR_TRY(hr_safetensors_tensor(ck->shards[e->shard], name, &t));
    if (hr_tensor_dtype(t) == dt) {
        *out = t;
        return HR_OK;
    }
    hr_status s = hr_cast(t, dt, out);
    hr_tensor_free(t);
    if (s != HR_OK) return hr_error_context(s, "%s: casting '%s' to %s", ck->path, name, hr_dtype_name(dt));
    hr_tensor_set_name(*out, name);
    return HR_OK;
}

hr_status hr_checkpoint_rows(const hr_checkpoint *ck, const char *name, int dim, int64_t first, int64_t len,
                             hr_tensor **out) {
    const ck_entry *e = ck_find(ck, name);
    if (!e) return ck_missing(ck, name);
    if (ck->gguf) return hr_error(HR_ERR_UNSUPPORTED, "%s: slices of GGUF tensors are not read yet", ck->path);
    return hr_safetensors_rows(ck->shards[e->shard], name, dim, first, len, out);
}

hr_dtype hr_checkpoint_stored_dtype(const hr_checkpoint *ck, const char *name) {
    const ck_entry *e = ck_find(ck, name);
    if (!e) return HR_DTYPE_COUNT;
    if (ck->gguf) return hr_gguf_stored_dtype(&ck->gguf->tensors[e->shard]);
    hr_tensor_info info;
    return hr_safetensors_info(ck->shards[e->shard], name, &info) == HR_OK ? info.dtype : HR_DTYPE_COUNT;
}

size_t hr_checkpoint_stored_bytes(const hr_checkpoint *ck, const char *name) {
    const ck_entry *e = ck_find(ck, name);
    if (!e) return 0;
    if (ck->gguf) return (size_t)ck->gguf->tensors[e->shard].nbytes;
    hr_tensor_info info;
    return hr_safetensors_info(ck->shards[e->shard], name, &info) == HR_OK ? info.nbytes : 0;
}

void hr_checkpoint_drop_tensor(const hr_checkpoint *ck, const char *name) {
    const ck_entry *e = ck_find(ck, name);
    if (!e) return;
    if (ck->gguf)
        hr_gguf_drop_tensor(ck->gguf, &ck->gguf->tensors[e->shard]);
    else
        hr_safetensors_drop_tensor(ck->shards[e->shard], name);
}

void hr_checkpoint_drop_all(const hr_checkpoint *ck) {
    for (size_t i = 0; i < ck->n; i++) hr_checkpoint_drop_tensor(ck, ck->entries[i].name);
}

bool hr_checkpoint_drop_pages(const hr_checkpoint *ck, const void *p, size_t n) {
    if (ck->gguf) return hr_gguf_drop_pages(ck->gguf, p, n);
    for (size_t i = 0; i < ck->n_shards; i++)
        if (hr_safetensors_drop_pages(ck->shards[i], p, n)) return true;
    return false;
}

size_t hr_checkpoint_shard_count(const hr_checkpoint *ck) { return ck->n_shards; }

const hr_safetensors *hr_checkpoint_shard(const hr_checkpoint *ck, size_t i) {
    return i < ck->n_shards ? ck->shards[i] : NULL;
}

const char *hr_checkpoint_shard_path(const hr_checkpoint *ck, size_t i) {
    return i < ck->n_shards ? ck->shard_paths[i] : NULL;
}

const char *hr_checkpoint_metadata_get(const hr_checkpoint *ck, const char *key) {
    return ck->n_shards ? hr_safetensors_metadata_get(ck->shards[0], key) : NULL;
}
