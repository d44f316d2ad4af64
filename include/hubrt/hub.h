/* Models by Hugging Face Hub id: the cache that huggingface_hub keeps
 * (HF_HUB_CACHE or HF_HOME/hub: models--org--name/{blobs,snapshots,refs}),
 * read as it reads it and filled as it fills it, with libcurl, from the
 * Hub's resolve endpoint (HF_ENDPOINT). */
#ifndef HUBRT_HUB_H
#define HUBRT_HUB_H

#include <stdbool.h>

#include "hubrt/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every field may be NULL (or -1): the environment decides, as it does for
 * huggingface_hub. */
typedef struct hr_hub_options {
    const char *revision;  /* branch, tag or commit; NULL: "main" */
    const char *cache_dir; /* NULL: HF_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/... */
    const char *endpoint;  /* NULL: HF_ENDPOINT, else https://huggingface.co */
    const char *token;     /* NULL: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, then the token file */
    int offline;           /* -1: HF_HUB_OFFLINE; 1: never ask the network */
    int progress;          /* -1: a progress line when stderr is a terminal */
} hr_hub_options;

/* Whether `ref` names a Hub repository ("org/name") rather than a path: no
 * file or folder of that name exists and it is a valid repository id. */
HR_API bool hr_hub_is_repo_id(const char *ref);
/* Whether `id` is a valid repository id (huggingface_hub's rules), whatever
 * the file system holds. */
HR_API bool hr_hub_valid_repo_id(const char *id);

/* The local folder of a model: `ref` itself when it is a path; for a
 * repository id, its snapshot folder in the cache, after fetching what is
 * missing of the files hubrt reads (config.json; generation_config.json,
 * tokenizer.json, tokenizer_config.json, special_tokens_map.json and
 * chat_template.jinja where the repository has them; model.safetensors or
 * model.safetensors.index.json and its shards). Offline, the cache alone
 * answers. *dir is malloc'd. */
HR_API hr_status hr_hub_model_dir(const char *ref, const hr_hub_options *opts, char **dir);

/* The cache folder the options and the environment choose (as
 * huggingface_hub picks it), into out[cap]. */
HR_API void hr_hub_cache_root(const hr_hub_options *opts, char *out, size_t cap);
/* The snapshot folder of a repository's revision (opts->revision, "main"
 * when NULL) in the cache alone, no network: *dir malloc'd and its commit
 * into commit[cap]; HR_ERR_NOT_FOUND when the cache has no such snapshot. */
HR_API hr_status hr_hub_cached_snapshot(const char *repo_id, const hr_hub_options *opts, char **dir, char *commit,
                                        size_t cap);

/* One file of a repository, in the cache (fetched when missing): its path
 * in the snapshot folder. HR_ERR_NOT_FOUND when the repository does not
 * have it (remembered in .no_exist/, as huggingface_hub does). */
HR_API hr_status hr_hub_file(const char *repo_id, const char *filename, const hr_hub_options *opts, char **path);

#ifdef __cplusplus
}
#endif

#endif
