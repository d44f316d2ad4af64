/* For fuzz targets whose input is a folder of files: the input is the
 * files' bytes separated by a line "\n--\n", written under fixed names into
 * one scratch folder that goes with the process. */
#ifndef HR_FUZZ_FOLDER_H
#define HR_FUZZ_FOLDER_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[64];
static const char *const *fuzz_names;
static int fuzz_n_names;

static void fuzz_folder_cleanup(void) {
    char path[160];
    for (int i = 0; i < fuzz_n_names; i++) {
        snprintf(path, sizeof path, "%s/%s", fuzz_dir, fuzz_names[i]);
        unlink(path);
    }
    rmdir(fuzz_dir);
}

/* The folder (made on the first call; `names` also lists any file the
 * target itself writes there, so that it is removed too) with the parts of
 * data written to the first n_inputs names. */
static const char *fuzz_folder(const uint8_t *data, size_t size, const char *const *names, int n_names, int n_inputs) {
    if (!fuzz_dir[0]) {
        snprintf(fuzz_dir, sizeof fuzz_dir, "/tmp/hubrt-fuzz-XXXXXX");
        if (!mkdtemp(fuzz_dir)) abort();
        fuzz_names = names, fuzz_n_names = n_names;
        atexit(fuzz_folder_cleanup);
    }
    static const char sep[] = "\n--\n";
    const char *p = (const char *)data, *end = p + size;
    for (int i = 0; i < n_inputs; i++) {
        const char *hit = memmem(p, (size_t)(end - p), sep, sizeof sep - 1);
        size_t n = hit ? (size_t)(hit - p) : (size_t)(end - p);
        char path[160];
        snprintf(path, sizeof path, "%s/%s", fuzz_dir, names[i]);
        FILE *f = fopen(path, "wb");
        if (!f) abort();
        if (n && fwrite(p, 1, n, f) != n) abort();
        fclose(f);
        p = hit ? hit + sizeof sep - 1 : end;
    }
    return fuzz_dir;
}

#endif
