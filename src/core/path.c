/* Files named inside a model folder must stay inside it: a symlink or a
 * name in an index that resolves elsewhere (/etc/passwd, another user's
 * files, /dev/zero) is refused before it is opened. The one layout where
 * links leave the folder by design is the Hugging Face cache's: a snapshot
 * (<repo>/snapshots/<revision>/) links its files into <repo>/blobs/, and
 * that folder is allowed too. A user who links files in on purpose (one
 * tokenizer shared by several folders, weights on another disk) sets
 * HUBRT_ALLOW_OUTSIDE_LINKS=1. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/path.h"

static bool under(const char *path, const char *root) {
    size_t n = strlen(root);
    return !strncmp(path, root, n) && (path[n] == '/' || (n == 1 && root[0] == '/'));
}

/* <repo>/blobs for a snapshot folder <repo>/snapshots/<revision>; "" otherwise. */
static void cache_blobs(const char *real_dir, char *out, size_t cap) {
    out[0] = '\0';
    const char *rev = strrchr(real_dir, '/');
    if (!rev || rev == real_dir) return;
    size_t snap_end = (size_t)(rev - real_dir);
    static const char snaps[] = "/snapshots";
    size_t sl = sizeof snaps - 1;
    if (snap_end < sl + 1 || strncmp(real_dir + snap_end - sl, snaps, sl)) return;
    size_t repo_len = snap_end - sl;
    if (repo_len + sizeof "/blobs" > cap) return;
    memcpy(out, real_dir, repo_len);
    memcpy(out + repo_len, "/blobs", sizeof "/blobs");
}

hr_status hr_path_check_inside(const char *dir, const char *path) {
    char real_dir[PATH_MAX], real_path[PATH_MAX], blobs[PATH_MAX];
    if (!realpath(dir, real_dir)) return HR_OK; /* the opener names what is missing */
    if (!realpath(path, real_path)) {
        if (errno == ENOENT) return HR_OK;
        return hr_error(HR_ERR_IO, "%s: cannot resolve: %s", path, strerror(errno));
    }
    if (under(real_path, real_dir)) return HR_OK;
    const char *allow = getenv("HUBRT_ALLOW_OUTSIDE_LINKS");
    if (allow && !strcmp(allow, "1")) return HR_OK;
    cache_blobs(real_dir, blobs, sizeof blobs);
    if (blobs[0] && under(real_path, blobs)) return HR_OK;
    return hr_error(HR_ERR_FORMAT, "%s: resolves to '%s', outside the model folder '%s'%s (links made on purpose: "
                    "HUBRT_ALLOW_OUTSIDE_LINKS=1)", path, real_path, real_dir,
                    blobs[0] ? " and its Hugging Face cache blobs" : "");
}

bool hr_path_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
