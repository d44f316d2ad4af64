/* The kernel hub: kernels as packages in Hugging Face's `kernels`
 * repository layout, found in the Hugging Face cache (or a folder), checked,
 * then loaded (docs/kernels.md).
 *
 * A repository (or folder) holds build/<variant>/ folders; hubrt takes the
 * variant `hubrt1-cpu-<arch>-linux` (its ABI, the CPU, this machine) and
 * says why it rejected each other one. Before anything is loaded:
 * metadata.json parses and names this ABI and the cpu backend; every file
 * it lists has its sha256; the publisher (the repository's owner) is on
 * the local trusted list, unless trust_remote_code; and a lock file, when
 * one is in use, pins this revision, variant and these digests. The
 * library is then loaded from the very bytes that were hashed (a private
 * copy),
 * its ABI struct checked, and its implementation registered. Loaded
 * kernels stay loaded until the process ends. */
#ifndef HUBRT_KERNELS_H
#define HUBRT_KERNELS_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_kernel_options {
    int64_t version;          /* > 0: the branch "v<version>"; 0: `revision` */
    const char *revision;     /* branch, tag or commit; NULL: "main" */
    bool trust_remote_code;   /* load from publishers not on the trusted list */
    /* A lock file (hr_kernel_lock) the kernel must match; NULL:
     * $HUBRT_KERNELS_LOCK when set; "": none. */
    const char *lock_file;
    const char *cache_dir;    /* NULL: HF_HUB_CACHE, HF_HOME/hub, ... as for models */
} hr_kernel_options;

/* What checking a kernel found (hr_kernel_verify), and a loaded kernel's
 * identity. */
typedef struct hr_kernel_info {
    char repo[128];          /* "org/name", or the folder */
    char publisher[64];      /* the repository's owner ("local" for a folder) */
    char revision[64];       /* the snapshot's commit ("local" for a folder) */
    char variant[96];
    char name[64];           /* the op it implements (metadata.json "name") */
    int64_t version;         /* metadata.json "version" */
    char library[1024];      /* the library's path */
    char digest[65];         /* the library's sha256 */
    char rejected[1024];     /* the other variants, each "name: reason; " */
    int64_t impl_id;         /* the id a model's experts op names it by (once loaded) */
} hr_kernel_info;

/* Checks a kernel as loading would, without loading it. `repo` is "org/name"
 * (the Hugging Face cache; fetched into it when missing and the network is
 * allowed) or a folder path (its publisher "local", trusted: the caller
 * named the files). Errors name the cause: no variant for this machine
 * (listing each rejected one with its reason), metadata.json field, digest
 * mismatch, ABI version, untrusted publisher, lock mismatch. */
HR_API hr_status hr_kernel_verify(const char *repo, const hr_kernel_options *o, hr_kernel_info *info);

/* Verifies, then loads: the library read once, hashed, and dlopened from
 * those bytes; its HR_KERNEL_ABI_SYMBOL checked (ABI version, size, op
 * name) and its implementation registered under info->impl_id. Loading the
 * same kernel again returns the same id. */
HR_API hr_status hr_kernel_load(const char *repo, const hr_kernel_options *o, hr_kernel_info *info);

/* Writes (or updates) the entry of `repo` in the lock file at `path`: the
 * revision, variant and every file's sha256 of what hr_kernel_verify
 * accepts (the lock in the options is not consulted). */
HR_API hr_status hr_kernel_lock(const char *repo, const hr_kernel_options *o, const char *path);

/* Kernels loaded so far in this process. */
HR_API int hr_kernels_loaded(void);

/* The kernel repositories in the cache (o->cache_dir or the environment's):
 * fn(ctx, "org/name", revision, variants) for every snapshot holding a
 * build/ folder, variants comma-separated. */
HR_API hr_status hr_kernel_list(const hr_kernel_options *o,
                                void (*fn)(void *ctx, const char *repo, const char *revision, const char *variants),
                                void *ctx);

#ifdef __cplusplus
}
#endif

#endif
