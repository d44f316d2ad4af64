/* A kernel package's metadata.json (docs/kernels.md): its identity, ABI,
 * backend and each file's sha256. The fuzz target fuzz_kernel_meta drives
 * the parser. */
#ifndef HR_KERNELS_KERNEL_META_H
#define HR_KERNELS_KERNEL_META_H

#include <stddef.h>

#include "hubrt/base.h"

#define HR_KMETA_MAX_FILES 32

typedef struct hr_kernel_meta {
    char id[128], name[64], license[64], backend[32];
    int64_t version, abi;
    int n_files;
    struct {
        char name[256];  /* a file of the variant folder: no '/', not hidden */
        char sha256[65]; /* 64 lowercase hex digits */
    } files[HR_KMETA_MAX_FILES];
} hr_kernel_meta;

/* Parses text[len]; errors start with `label` and name the field. */
hr_status hr_kernel_meta_parse(const char *label, const char *text, size_t len, hr_kernel_meta *out);

#endif
