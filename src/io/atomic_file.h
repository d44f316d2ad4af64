/* A file written whole or not at all: the bytes go to "<path>.tmp.<pid>",
 * which is fsynced and renamed over `path` (then the folder fsynced, so
 * the rename itself is durable); on any failure the temporary file is
 * removed and an existing `path` is left as it was. Used by the
 * safetensors and GGUF writers. */
#ifndef HR_IO_ATOMIC_FILE_H
#define HR_IO_ATOMIC_FILE_H

#include <stddef.h>

#include "hubrt/base.h"

typedef struct hr_atomic_file {
    const char *path; /* the caller's, kept until commit or abort */
    char *tmp;
    int fd;
} hr_atomic_file;

/* Creates the temporary file (O_NOFOLLOW: never through a link). */
hr_status hr_atomic_open(hr_atomic_file *f, const char *path);
/* All n bytes, retried through short writes and EINTR. */
hr_status hr_atomic_write(hr_atomic_file *f, const void *p, size_t n);
/* n zero bytes. */
hr_status hr_atomic_zeros(hr_atomic_file *f, size_t n);
/* fsync, close, rename over path; on failure, as hr_atomic_abort. */
hr_status hr_atomic_commit(hr_atomic_file *f);
/* Closes and removes the temporary file (no-op after commit). */
void hr_atomic_abort(hr_atomic_file *f);

#endif
