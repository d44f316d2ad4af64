/* Models by Hub id (include/hubrt/hub.h): huggingface_hub's cache, read
 * and written as its file_download.py does (2.x):
 *
 *   <cache>/models--org--name/refs/<revision>          the commit, no newline
 *   <cache>/models--org--name/blobs/<etag>             the bytes
 *   <cache>/models--org--name/snapshots/<commit>/<f>   -> ../../blobs/<etag>
 *   <cache>/models--org--name/.no_exist/<commit>/<f>   the repository lacks f
 *   <cache>/.locks/models--org--name/<etag>.lock       held while <etag> is fetched
 *
 * A blob is fetched into blobs/<etag>.<random>.incomplete and renamed into
 * place only once its size checks out, so no reader ever sees a partial
 * file; a dropped transfer is resumed with a Range request. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "hubrt/hub.h"
#include "io/hub_internal.h"

#define PATH_CAP 4096

/* snprintf for paths: a path that does not fit comes out empty, so that
 * nothing is ever done to a truncated one (ctx_init bounds the parts so
 * that none is expected). */
static bool pathf(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool pathf(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < cap) return true;
    out[0] = '\0';
    return false;
}

/* A name no other writer picks: this process's id and a counter. */
static unsigned unique_suffix(void) {
    static _Atomic unsigned counter;
    return ((unsigned)getpid() << 12) ^ (counter++ * 2654435761u);
}

static const char CACHEDIR_TAG[] = "Signature: 8a477f597d28d172789f06886806bc55\n"
                                   "# This file is a cache directory tag created by huggingface_hub.\n"
                                   "# For information about cache directory tags, see:\n"
                                   "#\thttps://bford.info/cachedir/\n";

typedef struct hub_ctx {
    char repo_id[128];
    char revision[256];
    char root[PATH_CAP];     /* the cache */
    char repo_dir[PATH_CAP]; /* <root>/models--org--name */
    char endpoint[1024];
    char *token;
    bool offline;
    hub_http http;
} hub_ctx;

/* ---- names and the environment ---------------------------------------- */

static bool truthy(const char *v) {
    return v && (!strcasecmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") || !strcasecmp(v, "true"));
}

static bool name_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.'; }

/* huggingface_hub's validate_repo_id: [org/]name of [A-Za-z0-9_.-], no
 * "--" or "..", not starting or ending with '-' or '.', 96 at most. */
static bool valid_repo_id(const char *id) {
    size_t n = strlen(id), slashes = 0;
    if (!n || n > 96 || strstr(id, "--") || strstr(id, "..")) return false;
    for (size_t i = 0; i < n; i++) {
        if (id[i] == '/') {
            if (++slashes > 1 || i == 0 || i == n - 1) return false;
            continue;
        }
        if (!name_char(id[i])) return false;
        bool edge = i == 0 || i == n - 1 || id[i - 1] == '/' || id[i + 1] == '/';
        if (edge && (id[i] == '-' || id[i] == '.')) return false;
    }
    return true;
}

/* A file's name in a repository: relative, no "." or ".." segment, no
 * empty segment: it must stay inside the snapshot folder. */
static bool valid_repo_path(const char *f) {
    if (!*f || *f == '/' || strlen(f) > 1024 || strchr(f, '\\')) return false;
    for (const char *seg = f; *seg;) {
        const char *end = strchr(seg, '/');
        size_t n = end ? (size_t)(end - seg) : strlen(seg);
        if (!n || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.')) return false;
        if (!end) break;
        seg = end + 1;
        if (!*seg) return false;
    }
    return true;
}

static bool is_commit_hash(const char *r) {
    size_t n = strlen(r);
    if (n != 40) return false;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)r[i]) && !(r[i] >= 'a' && r[i] <= 'f')) return false;
    return true;
}

static void expand_home(const char *in, char *out, size_t cap) {
    const char *home = getenv("HOME");
    if (in[0] == '~' && (in[1] == '/' || !in[1]) && home) pathf(out, cap, "%s%s", home, in + 1);
    else pathf(out, cap, "%s", in);
}

static void hf_home(char *out, size_t cap) {
    const char *h = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME");
    char tmp[PATH_CAP];
    if (h) pathf(tmp, sizeof tmp, "%s", h);
    else if (xdg) pathf(tmp, sizeof tmp, "%s/huggingface", xdg);
    else pathf(tmp, sizeof tmp, "~/.cache/huggingface");
    expand_home(tmp, out, cap);
}

static void cache_root(const hr_hub_options *o, char *out, size_t cap) {
    const char *c = o && o->cache_dir ? o->cache_dir : getenv("HF_HUB_CACHE");
    if (!c) c = getenv("HUGGINGFACE_HUB_CACHE");
    char home[PATH_CAP];
    if (c) {
        expand_home(c, out, cap);
        return;
    }
    hf_home(home, sizeof home);
    pathf(out, cap, "%s/hub", home);
}

static char *trimmed_dup(const char *s, size_t n) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    return n ? strndup(s, n) : NULL;
}

/* HF_TOKEN, HUGGING_FACE_HUB_TOKEN, then the token file (HF_TOKEN_PATH or
 * HF_HOME/token); none under HF_HUB_DISABLE_IMPLICIT_TOKEN. */
static char *find_token(const hr_hub_options *o) {
    if (o && o->token) return trimmed_dup(o->token, strlen(o->token));
    if (truthy(getenv("HF_HUB_DISABLE_IMPLICIT_TOKEN"))) return NULL;
    const char *e = getenv("HF_TOKEN");
    if (!e || !*e) e = getenv("HUGGING_FACE_HUB_TOKEN");
    if (e && *e) return trimmed_dup(e, strlen(e));
    char path[PATH_CAP], home[PATH_CAP];
    const char *tp = getenv("HF_TOKEN_PATH");
    if (tp) expand_home(tp, path, sizeof path);
    else {
        hf_home(home, sizeof home);
        pathf(path, sizeof path, "%s/token", home);
    }
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return trimmed_dup(buf, n);
}

static hr_status ctx_init(hub_ctx *c, const char *repo_id, const hr_hub_options *o) {
    memset(c, 0, sizeof *c);
    if (!valid_repo_id(repo_id))
        return hr_error(HR_ERR_INVALID_ARG, "'%s' is neither a path nor a Hub repository id (org/name)", repo_id);
    snprintf(c->repo_id, sizeof c->repo_id, "%s", repo_id);
    const char *rev = o && o->revision ? o->revision : "main";
    if (!*rev || strlen(rev) >= sizeof c->revision || !valid_repo_path(rev))
        return hr_error(HR_ERR_INVALID_ARG, "revision '%s' is not a valid branch, tag or commit", rev);
    snprintf(c->revision, sizeof c->revision, "%s", rev);
    cache_root(o, c->root, sizeof c->root);
    if (!c->root[0] || strlen(c->root) > 2048)
        return hr_error(HR_ERR_INVALID_ARG, "the Hugging Face cache path is empty or over 2048 bytes");
    int n = snprintf(c->repo_dir, sizeof c->repo_dir, "%s/models--", c->root);
    for (const char *p = repo_id; *p && n < (int)sizeof c->repo_dir - 3; p++) {
        if (*p == '/') n += snprintf(c->repo_dir + n, sizeof c->repo_dir - (size_t)n, "--");
        else c->repo_dir[n++] = *p;
    }
    c->repo_dir[n] = '\0';
    const char *ep = o && o->endpoint ? o->endpoint : getenv("HF_ENDPOINT");
    snprintf(c->endpoint, sizeof c->endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    for (size_t k = strlen(c->endpoint); k && c->endpoint[k - 1] == '/';) c->endpoint[--k] = '\0';
    c->offline = o && o->offline >= 0 ? o->offline != 0 : truthy(getenv("HF_HUB_OFFLINE"));
    c->token = find_token(o);
    c->http = (hub_http){.endpoint = c->endpoint, .token = c->token,
                         .progress = o && o->progress >= 0 ? o->progress != 0 : isatty(STDERR_FILENO)};
    return HR_OK;
}

/* ---- the cache on disk ------------------------------------------------- */

static hr_status mkdirs(const char *path) {
    char tmp[PATH_CAP];
    pathf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0777) && errno != EEXIST) return hr_error(HR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
            *p = '/';
        }
    if (mkdir(tmp, 0777) && errno != EEXIST) return hr_error(HR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    return HR_OK;
}

static hr_status mkdirs_parent(const char *path) {
    char tmp[PATH_CAP];
    pathf(tmp, sizeof tmp, "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash) return HR_OK;
    *slash = '\0';
    return mkdirs(tmp);
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0; /* a dangling link is missing */
}

/* Writes `text` to `path` through a temporary file and a rename. */
static hr_status write_atomic(const char *path, const char *text, size_t n) {
    char tmp[PATH_CAP + 32];
    pathf(tmp, sizeof tmp, "%s.%08x.tmp", path, unique_suffix());
    FILE *f = fopen(tmp, "wb");
    if (!f) return hr_error(HR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    bool ok = fwrite(text, 1, n, f) == n;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path)) {
        unlink(tmp);
        return hr_error(HR_ERR_IO, "%s: cannot write", path);
    }
    return HR_OK;
}

static bool read_small(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return true;
}

/* refs/<revision> holds the commit, written only when it differs and only
 * for a revision that is not the commit itself. */
static hr_status write_refs(const hub_ctx *c, const char *commit) {
    if (!strcmp(c->revision, commit)) return HR_OK;
    char path[PATH_CAP], old[128];
    pathf(path, sizeof path, "%s/refs/%s", c->repo_dir, c->revision);
    if (read_small(path, old, sizeof old) && !strcmp(old, commit)) return HR_OK;
    HR_TRY(mkdirs_parent(path));
    return write_atomic(path, commit, strlen(commit));
}

/* The commit a revision names in the cache: itself when it is a hash. */
static bool cached_commit(const hub_ctx *c, char *commit, size_t cap) {
    if (is_commit_hash(c->revision)) {
        snprintf(commit, cap, "%s", c->revision);
        return true;
    }
    char path[PATH_CAP];
    pathf(path, sizeof path, "%s/refs/%s", c->repo_dir, c->revision);
    /* a refs file names a folder: only a commit hash is taken */
    return read_small(path, commit, cap) && is_commit_hash(commit);
}

static hr_status cachedir_tag(const hub_ctx *c) {
    char path[PATH_CAP];
    pathf(path, sizeof path, "%s/CACHEDIR.TAG", c->root);
    if (exists(path)) return HR_OK;
    return write_atomic(path, CACHEDIR_TAG, sizeof CACHEDIR_TAG - 1);
}

static void snapshot_path(const hub_ctx *c, const char *commit, const char *file, char *out, size_t cap) {
    pathf(out, cap, "%s/snapshots/%s/%s", c->repo_dir, commit, file);
}

/* snapshots/<commit>/<file> -> ../../blobs/<etag>, one more "../" for each
 * folder in the file's name. */
static hr_status link_snapshot(const hub_ctx *c, const char *commit, const char *file, const char *etag) {
    char link[PATH_CAP], target[PATH_CAP];
    snapshot_path(c, commit, file, link, sizeof link);
    HR_TRY(mkdirs_parent(link));
    size_t n = 0;
    for (int k = 0; k < 2; k++) n += (size_t)snprintf(target + n, sizeof target - n, "../");
    for (const char *p = file; *p; p++)
        if (*p == '/') n += (size_t)snprintf(target + n, sizeof target - n, "../");
    snprintf(target + n, sizeof target - n, "blobs/%s", etag);
    unlink(link);
    if (symlink(target, link)) return hr_error(HR_ERR_IO, "%s: cannot link: %s", link, strerror(errno));
    return HR_OK;
}

static hr_status mark_no_exist(const hub_ctx *c, const char *commit, const char *file) {
    char path[PATH_CAP];
    pathf(path, sizeof path, "%s/.no_exist/%s/%s", c->repo_dir, commit, file);
    HR_TRY(mkdirs_parent(path));
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return hr_error(HR_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    close(fd);
    return HR_OK;
}

/* The file from the cache alone; `why` says why the network was not asked. */
static hr_status from_cache(const hub_ctx *c, const char *file, const char *why, char **out) {
    char commit[128], path[PATH_CAP];
    if (cached_commit(c, commit, sizeof commit)) {
        snapshot_path(c, commit, file, path, sizeof path);
        if (exists(path)) return (*out = strdup(path)) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
        pathf(path, sizeof path, "%s/.no_exist/%s/%s", c->repo_dir, commit, file);
        if (exists(path))
            return hr_error(HR_ERR_NOT_FOUND, "%s has no '%s' (at %s, from the cache)", c->repo_id, file, commit);
    }
    return hr_error(HR_ERR_NOT_FOUND, "%s: '%s' at revision '%s' is not in the cache %s (%s)", c->repo_id, file,
                    c->revision, c->root, why);
}

/* ---- one file ---------------------------------------------------------- */

static void resolve_url(const hub_ctx *c, const char *file, char *out, size_t cap) {
    /* the revision quoted whole ('/' too), the file name segment by segment */
    size_t n = (size_t)snprintf(out, cap, "%s/%s/resolve/", c->endpoint, c->repo_id);
    static const char keep[] = "-_.~";
    for (const char *p = c->revision; *p && n + 4 < cap; p++)
        n += isalnum((unsigned char)*p) || strchr(keep, *p) ? (size_t)snprintf(out + n, cap - n, "%c", *p)
                                                           : (size_t)snprintf(out + n, cap - n, "%%%02X", (unsigned char)*p);
    n += (size_t)snprintf(out + n, cap - n, "/");
    for (const char *p = file; *p && n + 4 < cap; p++)
        n += isalnum((unsigned char)*p) || strchr(keep, *p) || *p == '/'
                 ? (size_t)snprintf(out + n, cap - n, "%c", *p)
                 : (size_t)snprintf(out + n, cap - n, "%%%02X", (unsigned char)*p);
}

static hr_status download_blob(hub_ctx *c, const hub_meta *m, const char *file) {
    char blob[PATH_CAP], lock[PATH_CAP], part[PATH_CAP + 32];
    pathf(blob, sizeof blob, "%s/blobs/%s", c->repo_dir, m->etag);
    const char *folder = strrchr(c->repo_dir, '/') + 1;
    pathf(lock, sizeof lock, "%s/.locks/%s/%s.lock", c->root, folder, m->etag);
    HR_TRY(mkdirs_parent(lock));
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0664);
    if (fd < 0) return hr_error(HR_ERR_IO, "%s: cannot create: %s", lock, strerror(errno));
    /* another process fetching the same blob finishes first; the lock file stays, as huggingface_hub leaves it */
    if (flock(fd, LOCK_EX)) {
        close(fd);
        return hr_error(HR_ERR_IO, "%s: cannot lock: %s", lock, strerror(errno));
    }
    hr_status st = HR_OK;
    if (!exists(blob)) {
        pathf(part, sizeof part, "%s.%08x.incomplete", blob, unique_suffix());
        char label[1200];
        pathf(label, sizeof label, "%s/%s", c->repo_id, file);
        st = hub_http_get(&c->http, m->location, part, m->size, label);
        if (st == HR_OK && rename(part, blob)) st = hr_error(HR_ERR_IO, "%s: cannot rename: %s", part, strerror(errno));
        if (st != HR_OK) unlink(part);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return st;
}

static hr_status fetch(hub_ctx *c, const char *file, char **out) {
    *out = NULL;
    if (!valid_repo_path(file))
        return hr_error(HR_ERR_FORMAT, "%s: '%s' is not a file name inside a repository", c->repo_id, file);
    char path[PATH_CAP];
    if (is_commit_hash(c->revision)) { /* pinned, and present or known absent: no request */
        snapshot_path(c, c->revision, file, path, sizeof path);
        if (exists(path)) return (*out = strdup(path)) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
        pathf(path, sizeof path, "%s/.no_exist/%s/%s", c->repo_dir, c->revision, file);
        if (exists(path)) return hr_error(HR_ERR_NOT_FOUND, "%s has no '%s' (at %s)", c->repo_id, file, c->revision);
    }
    if (c->offline) return from_cache(c, file, "HF_HUB_OFFLINE is set", out);
    char url[PATH_CAP];
    resolve_url(c, file, url, sizeof url);
    hub_meta m;
    hr_status st = hub_http_head(&c->http, url, &m);
    if (st != HR_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", hr_last_error());
        return from_cache(c, file, why, out);
    }
    if (m.status >= 400) {
        if (!strcmp(m.error_code, "EntryNotFound") && m.commit[0]) {
            HR_TRY(mark_no_exist(c, m.commit, file));
            HR_TRY(write_refs(c, m.commit));
            return hr_error(HR_ERR_NOT_FOUND, "%s has no '%s' (at %s)", c->repo_id, file, m.commit);
        }
        if (!strcmp(m.error_code, "RevisionNotFound"))
            return hr_error(HR_ERR_NOT_FOUND, "%s has no revision '%s'", c->repo_id, c->revision);
        char why[512];
        if (!strcmp(m.error_code, "RepoNotFound") || !strcmp(m.error_code, "GatedRepo") || m.status == 401)
            snprintf(why, sizeof why, "the Hub answered %ld for the repository: it does not exist, or it is private "
                     "or gated and needs HF_TOKEN", m.status);
        else snprintf(why, sizeof why, "the Hub answered HTTP %ld for %.300s%s%.150s", m.status, url,
                      m.error_message[0] ? ": " : "", m.error_message);
        return from_cache(c, file, why, out);
    }
    if (!m.commit[0] || !m.etag[0] || !is_commit_hash(m.commit) || !valid_repo_path(m.etag) || strchr(m.etag, '/'))
        return from_cache(c, file, "the Hub's answer lacks a valid X-Repo-Commit or ETag", out);
    snapshot_path(c, m.commit, file, path, sizeof path);
    if (exists(path)) {
        HR_TRY(write_refs(c, m.commit));
        return (*out = strdup(path)) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
    }
    char blobs[PATH_CAP];
    pathf(blobs, sizeof blobs, "%s/blobs", c->repo_dir);
    HR_TRY(mkdirs(blobs));
    HR_TRY(cachedir_tag(c));
    HR_TRY(write_refs(c, m.commit));
    HR_TRY(download_blob(c, &m, file));
    HR_TRY(link_snapshot(c, m.commit, file, m.etag));
    return (*out = strdup(path)) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
}

hr_status hr_hub_file(const char *repo_id, const char *filename, const hr_hub_options *opts, char **path) {
    if (!repo_id || !filename || !path) return hr_error(HR_ERR_INVALID_ARG, "hr_hub_file: NULL argument");
    hub_ctx c;
    hr_status st = ctx_init(&c, repo_id, opts);
    if (st == HR_OK) st = fetch(&c, filename, path);
    free(c.token);
    return st;
}

void hr_hub_cache_root(const hr_hub_options *opts, char *out, size_t cap) { cache_root(opts, out, cap); }

hr_status hr_hub_cached_snapshot(const char *repo_id, const hr_hub_options *opts, char **dir, char *commit,
                                 size_t cap) {
    if (!repo_id || !dir || !commit) return hr_error(HR_ERR_INVALID_ARG, "hr_hub_cached_snapshot: NULL argument");
    *dir = NULL;
    hub_ctx c;
    hr_status st = ctx_init(&c, repo_id, opts);
    free(c.token);
    HR_TRY(st);
    char path[PATH_CAP];
    if (!cached_commit(&c, commit, cap))
        return hr_error(HR_ERR_NOT_FOUND, "%s: revision '%s' is not in the cache %s", repo_id, c.revision, c.root);
    pathf(path, sizeof path, "%s/snapshots/%s", c.repo_dir, commit);
    if (!exists(path))
        return hr_error(HR_ERR_NOT_FOUND, "%s: the cache %s has no snapshot %s", repo_id, c.root, commit);
    return (*dir = strdup(path)) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
}

/* ---- a model's files --------------------------------------------------- */

bool hr_hub_valid_repo_id(const char *id) { return id && valid_repo_id(id); }

bool hr_hub_is_repo_id(const char *ref) {
    struct stat sb;
    return ref && lstat(ref, &sb) != 0 && valid_repo_id(ref);
}

static const char *const OPTIONAL_FILES[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                             "special_tokens_map.json", "chat_template.jinja"};

/* The shards an index names, each once. */
static hr_status fetch_shards(hub_ctx *c, const char *index) {
    FILE *f = fopen(index, "rb");
    if (!f) return hr_error(HR_ERR_IO, "%s: cannot open: %s", index, strerror(errno));
    char *text = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    hr_status st = HR_OK;
    if (n < 0 || n > (256L << 20) || fseek(f, 0, SEEK_SET)) st = hr_error(HR_ERR_FORMAT, "%s: unreadable or over 256 MB", index);
    else if (!(text = malloc((size_t)n + 1))) st = hr_error(HR_ERR_OOM, "out of memory");
    else if (fread(text, 1, (size_t)n, f) != (size_t)n) st = hr_error(HR_ERR_IO, "%s: short read", index);
    fclose(f);
    cJSON *root = st == HR_OK ? cJSON_ParseWithLength(text, (size_t)n) : NULL;
    free(text);
    if (st != HR_OK) return st;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) st = hr_error(HR_ERR_FORMAT, "%s: no 'weight_map' object", index);
    for (const cJSON *it = map ? map->child : NULL; st == HR_OK && it; it = it->next) {
        if (!cJSON_IsString(it)) {
            st = hr_error(HR_ERR_FORMAT, "%s: weight_map: value for '%s' is not a file name", index, it->string);
            break;
        }
        bool seen = false;
        for (const cJSON *p = map->child; p != it && !seen; p = p->next)
            seen = cJSON_IsString(p) && !strcmp(p->valuestring, it->valuestring);
        if (seen) continue;
        char *path = NULL;
        st = fetch(c, it->valuestring, &path);
        free(path);
    }
    cJSON_Delete(root);
    return st;
}

static hr_status fetch_model(hub_ctx *c, char **dir) {
    char *path = NULL;
    HR_TRY(fetch(c, "config.json", &path));
    /* every other file from the same commit as config.json's */
    char *snap = strdup(path);
    free(path);
    if (!snap) return hr_error(HR_ERR_OOM, "out of memory");
    *strrchr(snap, '/') = '\0';
    snprintf(c->revision, sizeof c->revision, "%s", strrchr(snap, '/') + 1);
    hr_status st = HR_OK;
    for (size_t i = 0; st == HR_OK && i < sizeof OPTIONAL_FILES / sizeof *OPTIONAL_FILES; i++) {
        st = fetch(c, OPTIONAL_FILES[i], &path);
        free(path);
        if (st == HR_ERR_NOT_FOUND) {
            hr_clear_error();
            st = HR_OK;
        }
    }
    if (st == HR_OK) {
        st = fetch(c, "model.safetensors", &path);
        free(path);
        if (st == HR_ERR_NOT_FOUND) {
            hr_clear_error();
            st = fetch(c, "model.safetensors.index.json", &path);
            if (st == HR_ERR_NOT_FOUND)
                st = hr_error(HR_ERR_NOT_FOUND, "%s has neither model.safetensors nor model.safetensors.index.json "
                              "(hubrt reads safetensors checkpoints; a GGUF repository: download its .gguf file)",
                              c->repo_id);
            if (st == HR_OK) st = fetch_shards(c, path);
            free(path);
        }
    }
    if (st != HR_OK) {
        free(snap);
        return st;
    }
    *dir = snap;
    return HR_OK;
}

hr_status hr_hub_model_dir(const char *ref, const hr_hub_options *opts, char **dir) {
    if (!ref || !dir) return hr_error(HR_ERR_INVALID_ARG, "hr_hub_model_dir: NULL argument");
    *dir = NULL;
    if (!hr_hub_is_repo_id(ref)) return (*dir = strdup(ref)) ? HR_OK : hr_error(HR_ERR_OOM, "out of memory");
    hub_ctx c;
    hr_status st = ctx_init(&c, ref, opts);
    if (st == HR_OK) st = fetch_model(&c, dir);
    free(c.token);
    return st;
}
