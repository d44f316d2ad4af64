/* The kernel hub (hubrt/kernels.h): a repository snapshot found, its
 * variant for this machine picked (the others rejected with a reason),
 * metadata.json, the digests, the publisher and the lock checked, and only
 * then the library loaded, from the bytes that were hashed. */
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "core/error.h"
#include "core/hash.h"
#include "hubrt/hub.h"
#include "hubrt/kernel_abi.h"
#include "hubrt/kernels.h"
#include "kernels/kernel_lock.h"
#include "kernels/kernel_meta.h"
#include "ops/experts_impl.h"

#define LIB_MAX ((size_t)1 << 30)
#define META_MAX ((size_t)1 << 20)

/* ---- files ----------------------------------------------------------------- */

/* The whole file (at most `cap` bytes) into a malloc'd buffer. */
static hr_status read_file(const char *path, size_t cap, unsigned char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO in a folder never blocks us */
    if (fd < 0) return hr_error(errno == ENOENT ? HR_ERR_NOT_FOUND : HR_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > cap) {
        close(fd);
        return hr_error(HR_ERR_FORMAT, "%s: not a regular file of at most %zu bytes", path, cap);
    }
    unsigned char *buf = malloc((size_t)sb.st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)sb.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)sb.st_size - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    if (!buf) return hr_error(HR_ERR_OOM, "%s: out of memory", path);
    if (got != (size_t)sb.st_size) {
        free(buf);
        return hr_error(HR_ERR_IO, "%s: short read", path);
    }
    buf[got] = 0;
    *out = buf;
    *len = got;
    return HR_OK;
}

static hr_status sha256_hex(const unsigned char *p, size_t n, char out[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
        return hr_error(HR_ERR_INTERNAL, "kernel: sha256 failed (OpenSSL)");
    for (unsigned i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    return HR_OK;
}

/* ---- the snapshot and its variant --------------------------------------------- */

static void wanted_variant(char *out, size_t cap) {
    struct utsname u;
    snprintf(out, cap, "hubrt%d-cpu-%s-linux", HR_KERNEL_ABI_VERSION, uname(&u) == 0 ? u.machine : "unknown");
}

/* Why `name` (a folder name from the repository: untrusted) is not this
 * machine's variant ("" when it is). */
static void variant_reason(const char *name, const char *want, char *out, size_t cap) {
    out[0] = 0;
    if (!strcmp(name, want)) return;
    /* "hubrt" then 1 to 6 digits */
    size_t digits = 0;
    while (digits < 7 && name[5 + digits] >= '0' && name[5 + digits] <= '9' && !strncmp(name, "hubrt", 5)) digits++;
    const char *rest = name + 5 + digits;
    const char *want_rest = strchr(want, '-'); /* "-cpu-<arch>-linux" */
    if (strncmp(name, "hubrt", 5) || digits == 0 || digits > 6 || (*rest && *rest != '-')) {
        snprintf(out, cap, "not a hubrt variant (a build for another runtime)");
    } else if (atoi(name + 5) != HR_KERNEL_ABI_VERSION) {
        snprintf(out, cap, "ABI hubrt%d; this hubrt loads hubrt%d", atoi(name + 5), HR_KERNEL_ABI_VERSION);
    } else if (!strncmp(rest, "-pjrt", 5)) {
        snprintf(out, cap, "StableHLO for PJRT devices, which hubrt does not load yet");
    } else if (strncmp(rest, "-cpu-", 5)) {
        snprintf(out, cap, "not for the cpu device");
    } else {
        snprintf(out, cap, "built for %.60s; this machine takes %s", rest + 5, want_rest ? want_rest + 5 : want);
    }
}

/* Picks info->variant among snapshot/build/'s folders, listing the others
 * with their reasons in info->rejected. */
static hr_status pick_variant(const char *snapshot, hr_kernel_info *info) {
    char want[96], path[PATH_MAX];
    wanted_variant(want, sizeof want);
    snprintf(path, sizeof path, "%s/build", snapshot);
    DIR *d = opendir(path);
    if (!d) return hr_error(HR_ERR_NOT_FOUND, "kernel %s: no build/ folder in %s", info->repo, snapshot);
    bool found = false;
    size_t used = 0;
    info->rejected[0] = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char reason[192];
        variant_reason(e->d_name, want, reason, sizeof reason);
        if (!reason[0]) {
            found = true;
            continue;
        }
        int n = snprintf(info->rejected + used, sizeof info->rejected - used, "%s: %s; ", e->d_name, reason);
        if (n > 0 && used + (size_t)n < sizeof info->rejected) used += (size_t)n;
    }
    closedir(d);
    if (!found)
        return hr_error(HR_ERR_NOT_FOUND, "kernel %s: no variant for this machine (%s) in %s/build: %s", info->repo,
                        want, snapshot, info->rejected[0] ? info->rejected : "the folder is empty");
    snprintf(info->variant, sizeof info->variant, "%s", want);
    return HR_OK;
}

/* Where a kernel comes from: a folder the caller named by path (trusted:
 * the caller chose the files), or a Hub repository at a revision. */
typedef struct kernel_src {
    bool folder;
    char rev[64];
    hr_hub_options ho;
} kernel_src;

/* A folder only when named as a path ("/...", "./...", "../..."): a
 * relative folder that happens to be named like "org/name" is not taken
 * for that repository. */
static bool names_a_folder(const char *repo) {
    return repo[0] == '/' || !strncmp(repo, "./", 2) || !strncmp(repo, "../", 3);
}

/* The snapshot folder of repo (malloc'd), with info's repo, publisher and
 * revision: a folder as it is, a repository id from the cache (its
 * metadata fetched when missing and the network is allowed). */
static hr_status find_snapshot(const char *repo, const hr_kernel_options *o, hr_kernel_info *info, kernel_src *src,
                               char **dir) {
    *dir = NULL;
    if (strlen(repo) >= sizeof info->repo)
        return hr_error(HR_ERR_INVALID_ARG, "kernel '%.64s...': the name is over %zu bytes", repo, sizeof info->repo - 1);
    snprintf(info->repo, sizeof info->repo, "%s", repo);
    src->folder = names_a_folder(repo);
    if (src->folder) {
        snprintf(info->publisher, sizeof info->publisher, "local");
        snprintf(info->revision, sizeof info->revision, "local");
        *dir = realpath(repo, NULL);
        struct stat sb;
        if (*dir && (stat(*dir, &sb) || !S_ISDIR(sb.st_mode))) {
            free(*dir);
            *dir = NULL;
            errno = ENOTDIR;
        }
        return *dir ? HR_OK : hr_error(HR_ERR_NOT_FOUND, "kernel folder %s: %s", repo, strerror(errno));
    }
    const char *slash = strchr(repo, '/');
    if (!slash || !hr_hub_valid_repo_id(repo))
        return hr_error(HR_ERR_INVALID_ARG, "kernel '%s' is neither a folder path (/..., ./...) nor a Hub repository "
                        "id (org/name)", repo);
    snprintf(info->publisher, sizeof info->publisher, "%.*s", (int)(slash - repo), repo);
    char want[96], file[160];
    if (o && o->version > 0) snprintf(src->rev, sizeof src->rev, "v%lld", (long long)o->version);
    else snprintf(src->rev, sizeof src->rev, "%s", o && o->revision ? o->revision : "main");
    src->ho = (hr_hub_options){.revision = src->rev, .cache_dir = o ? o->cache_dir : NULL, .offline = -1,
                               .progress = -1};
    wanted_variant(want, sizeof want);
    snprintf(file, sizeof file, "build/%s/metadata.json", want);
    char *meta = NULL;
    hr_status s = hr_hub_file(repo, file, &src->ho, &meta);
    free(meta);
    if (s != HR_OK && s != HR_ERR_NOT_FOUND) return hr_error_context(s, "kernel %s", repo);
    /* the snapshot's other variants explain a missing one */
    hr_status c = hr_hub_cached_snapshot(repo, &src->ho, dir, info->revision, sizeof info->revision);
    if (c != HR_OK) return hr_error_context(c, "kernel %s at %s", repo, src->rev);
    return HR_OK;
}

/* The files metadata.json lists, fetched into the cache where missing (a
 * repository's; a folder has them or not). */
static hr_status fetch_files(const char *repo, kernel_src *src, const hr_kernel_info *info, const hr_kernel_meta *m) {
    for (int i = 0; !src->folder && i < m->n_files; i++) {
        char file[512], *path = NULL;
        snprintf(file, sizeof file, "build/%s/%s", info->variant, m->files[i].name);
        hr_status s = hr_hub_file(repo, file, &src->ho, &path);
        free(path);
        if (s != HR_OK) return hr_error_context(s, "kernel %s", repo);
    }
    return HR_OK;
}

/* ---- the checks ------------------------------------------------------------------ */

static hr_status read_meta(const char *vdir, const hr_kernel_info *info, hr_kernel_meta *m) {
    char path[PATH_MAX + 232];
    snprintf(path, sizeof path, "%s/metadata.json", vdir);
    unsigned char *text;
    size_t len;
    HR_TRY(read_file(path, META_MAX, &text, &len));
    hr_status s = hr_kernel_meta_parse(path, (const char *)text, len, m);
    free(text);
    HR_TRY(s);
    if (m->abi != HR_KERNEL_ABI_VERSION)
        return hr_error(HR_ERR_UNSUPPORTED, "kernel %s: ABI mismatch: %s says ABI %lld; this hubrt loads ABI %d",
                        info->repo, path, (long long)m->abi, HR_KERNEL_ABI_VERSION);
    if (strcmp(m->backend, "cpu"))
        return hr_error(HR_ERR_UNSUPPORTED, "kernel %s: %s says backend '%s'; this variant must be 'cpu'", info->repo,
                        path, m->backend);
    return HR_OK;
}

/* The library among the files: the one shared object. */
static int library_of(const hr_kernel_meta *m) {
    int lib = -1;
    for (int i = 0; i < m->n_files; i++) {
        size_t n = strlen(m->files[i].name);
        if (n > 3 && !strcmp(m->files[i].name + n - 3, ".so")) {
            if (lib >= 0) return -2;
            lib = i;
        }
    }
    return lib;
}

/* Every file against its digest; the library's bytes kept in *lib. */
static hr_status check_digests(const char *vdir, const hr_kernel_meta *m, hr_kernel_info *info, unsigned char **lib,
                               size_t *lib_len) {
    *lib = NULL;
    int li = library_of(m);
    if (li < 0)
        return hr_error(HR_ERR_FORMAT, "kernel %s: %s/metadata.json lists %s", info->repo, vdir,
                        li == -1 ? "no shared library (*.so)" : "more than one shared library");
    for (int i = 0; i < m->n_files; i++) {
        char path[PATH_MAX + 300], got[65];
        snprintf(path, sizeof path, "%s/%s", vdir, m->files[i].name);
        unsigned char *bytes;
        size_t len;
        hr_status s = read_file(path, LIB_MAX, &bytes, &len);
        if (s != HR_OK) return hr_error_context(s, "kernel %s", info->repo);
        s = sha256_hex(bytes, len, got);
        if (s != HR_OK) {
            free(bytes);
            return s;
        }
        if (strcmp(got, m->files[i].sha256)) {
            free(bytes);
            return hr_error(HR_ERR_FORMAT, "kernel %s: digest mismatch: %s has sha256 %s, metadata.json says %s",
                            info->repo, path, got, m->files[i].sha256);
        }
        if (i != li) {
            free(bytes);
            continue;
        }
        if (strlen(path) >= sizeof info->library) {
            free(bytes);
            return hr_error(HR_ERR_INVALID_ARG, "kernel %s: the library's path is over %zu bytes", info->repo,
                            sizeof info->library - 1);
        }
        memcpy(info->library, path, strlen(path) + 1);
        snprintf(info->digest, sizeof info->digest, "%s", got);
        *lib = bytes;
        *lib_len = len;
    }
    return HR_OK;
}

/* The trusted publishers: "hubrt" (this project's), and the lines of
 * $HUBRT_KERNELS_TRUSTED, else ~/.config/hubrt/kernels-trusted.txt. */
static hr_status check_trust(const hr_kernel_info *info, const kernel_src *src, const hr_kernel_options *o) {
    if ((o && o->trust_remote_code) || src->folder || !strcmp(info->publisher, "hubrt")) return HR_OK;
    char path[PATH_MAX] = "";
    const char *env = getenv("HUBRT_KERNELS_TRUSTED"), *home = getenv("HOME");
    if (env) snprintf(path, sizeof path, "%s", env);
    else if (home && *home) snprintf(path, sizeof path, "%s/.config/hubrt/kernels-trusted.txt", home);
    FILE *f = path[0] ? fopen(path, "r") : NULL;
    /* one publisher per line; a line longer than the buffer is skipped whole */
    for (char line[512]; f && fgets(line, sizeof line, f);) {
        size_t n = strlen(line);
        if (n && line[n - 1] != '\n' && !feof(f)) {
            for (int c; (c = fgetc(f)) != EOF && c != '\n';) {
            }
            continue;
        }
        char *p = line, *end;
        while (*p == ' ' || *p == '\t') p++;
        for (end = p + strlen(p); end > p && strchr("\n\r \t", end[-1]);) *--end = 0;
        if (*p && *p != '#' && !strcmp(p, info->publisher)) {
            fclose(f);
            return HR_OK;
        }
    }
    if (f) fclose(f);
    return hr_error(HR_ERR_PERMISSION, "kernel %s: untrusted publisher '%s': not on the trusted list (%s); add it "
                    "there, or pass trust_remote_code=True to load it anyway", info->repo, info->publisher, path);
}

static const char *lock_path(const hr_kernel_options *o) {
    const char *p = o && o->lock_file ? o->lock_file : getenv("HUBRT_KERNELS_LOCK");
    return p && *p ? p : NULL;
}

/* Everything but the load: info filled, the library's bytes in *lib. */
static hr_status verify(const char *repo, const hr_kernel_options *o, bool use_lock, hr_kernel_info *info,
                        hr_kernel_meta *m, unsigned char **lib, size_t *lib_len) {
    if (!repo || !info) return hr_error(HR_ERR_INVALID_ARG, "kernel: NULL argument");
    memset(info, 0, sizeof *info);
    *lib = NULL;
    char *snap = NULL, vdir[PATH_MAX + 200];
    kernel_src src = {0};
    hr_status s = find_snapshot(repo, o, info, &src, &snap);
    if (s == HR_OK) s = pick_variant(snap, info);
    if (s == HR_OK) {
        snprintf(vdir, sizeof vdir, "%s/build/%s", snap, info->variant);
        s = read_meta(vdir, info, m);
    }
    free(snap);
    if (s == HR_OK) {
        snprintf(info->name, sizeof info->name, "%s", m->name);
        info->version = m->version;
        s = check_trust(info, &src, o);
    }
    if (s == HR_OK) s = fetch_files(repo, &src, info, m);
    if (s == HR_OK) s = check_digests(vdir, m, info, lib, lib_len);
    if (s == HR_OK && use_lock && lock_path(o)) s = hr_kernel_lock_check(lock_path(o), info, m);
    if (s != HR_OK) {
        free(*lib);
        *lib = NULL;
    }
    return s;
}

hr_status hr_kernel_verify(const char *repo, const hr_kernel_options *o, hr_kernel_info *info) {
    hr_kernel_meta m;
    unsigned char *lib;
    size_t len;
    HR_TRY(verify(repo, o, true, info, &m, &lib, &len));
    free(lib);
    return HR_OK;
}

hr_status hr_kernel_lock(const char *repo, const hr_kernel_options *o, const char *path) {
    if (!path || !*path) return hr_error(HR_ERR_INVALID_ARG, "kernel lock: no lock file path");
    hr_kernel_info info;
    hr_kernel_meta m;
    unsigned char *lib;
    size_t len;
    HR_TRY(verify(repo, o, false, &info, &m, &lib, &len));
    free(lib);
    return hr_kernel_lock_write(path, &info, &m);
}

/* ---- loading ------------------------------------------------------------------- */

#define MAX_LOADED 64

static struct {
    int64_t id;
    void *handle;
} g_loaded[MAX_LOADED];
static int g_n_loaded;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

int hr_kernels_loaded(void) {
    pthread_mutex_lock(&g_lock);
    int n = g_n_loaded;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* The kernel's identity hashed: the same in every process that loads it. */
static int64_t impl_id_of(const hr_kernel_info *info) {
    uint64_t h = hr_fnv1a(HR_FNV_OFFSET, info->repo, strlen(info->repo));
    h = hr_fnv1a(h, info->revision, strlen(info->revision));
    h = hr_fnv1a(h, info->variant, strlen(info->variant));
    h = hr_fnv1a(h, info->digest, strlen(info->digest));
    int64_t id = (int64_t)(h & (uint64_t)INT64_MAX);
    return id ? id : 1;
}

/* Section `i`'s header, or NULL when it lies outside the file. */
static const unsigned char *section(const unsigned char *p, size_t n, const Elf64_Ehdr *eh, unsigned i,
                                    Elf64_Shdr *out) {
    if (!eh->e_shoff || i >= eh->e_shnum) return NULL;
    memcpy(out, p + eh->e_shoff + (size_t)i * sizeof *out, sizeof *out);
    if (out->sh_type == SHT_NOBITS || out->sh_offset > n || n - out->sh_offset < out->sh_size) return NULL;
    return p + out->sh_offset;
}

/* A NUL-terminated name at offset `off` of a string table of `size`
 * bytes, or NULL. */
static const char *str_at(const unsigned char *tab, uint64_t size, uint64_t off) {
    if (off >= size || !memchr(tab + off, 0, size - off)) return NULL;
    return (const char *)tab + off;
}

/* What the loader would act on before hubrt sees the ABI struct: the
 * dynamic section (only libc, libm and the loader needed; no RPATH or
 * RUNPATH, which could pull a library from beside the private copy; not
 * NODELETE, so a refused library unloads) and the dynamic symbols (the ABI
 * symbol defined). NULL when fine, else why not. */
static const char *check_dynamic(const unsigned char *p, size_t n, const Elf64_Ehdr *eh) {
    static const char *const allowed[] = {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libpthread.so.0",
                                          "libdl.so.2", "ld-linux-aarch64.so.1"};
    bool dynamic = false, symbol = false;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        Elf64_Shdr sh, link;
        const unsigned char *body = section(p, n, eh, i, &sh);
        if (!body || (sh.sh_type != SHT_DYNAMIC && sh.sh_type != SHT_DYNSYM)) continue;
        const unsigned char *strtab = section(p, n, eh, sh.sh_link, &link);
        if (!strtab || link.sh_type != SHT_STRTAB) return "a dynamic section without its string table";
        if (sh.sh_type == SHT_DYNAMIC) {
            dynamic = true;
            for (uint64_t off = 0; off + sizeof(Elf64_Dyn) <= sh.sh_size; off += sizeof(Elf64_Dyn)) {
                Elf64_Dyn d;
                memcpy(&d, body + off, sizeof d);
                if (d.d_tag == DT_NULL) break;
                if (d.d_tag == DT_RPATH || d.d_tag == DT_RUNPATH) return "it names a library search path (RPATH)";
                if (d.d_tag == DT_FLAGS_1 && (d.d_un.d_val & DF_1_NODELETE)) return "it asks never to be unloaded";
                if (d.d_tag != DT_NEEDED) continue;
                const char *need = str_at(strtab, link.sh_size, d.d_un.d_val);
                /* and the sanitizer runtimes a sanitized build's kernel needs (already in such a process) */
                bool ok = need && (!strncmp(need, "libasan.so", 10) || !strncmp(need, "libubsan.so", 11));
                for (size_t a = 0; need && a < sizeof allowed / sizeof allowed[0]; a++) ok |= !strcmp(need, allowed[a]);
                if (!ok) return "it needs a library other than libc and libm";
            }
        } else {
            for (uint64_t off = sizeof(Elf64_Sym); off + sizeof(Elf64_Sym) <= sh.sh_size; off += sizeof(Elf64_Sym)) {
                Elf64_Sym sym;
                memcpy(&sym, body + off, sizeof sym);
                const char *name = str_at(strtab, link.sh_size, sym.st_name);
                symbol |= name && sym.st_shndx != SHN_UNDEF && !strcmp(name, HR_KERNEL_ABI_SYMBOL);
            }
        }
    }
    if (!dynamic) return "no dynamic section: not a shared library";
    if (!symbol) return "it has no symbol '" HR_KERNEL_ABI_SYMBOL "'";
    return NULL;
}

/* The library's ELF headers against its length, before the loader maps
 * it: a truncated file (every segment and the section table must lie in
 * it) or one for another machine is refused by name, where the loader
 * would map pages past the end of the file and fault on first touch. */
static hr_status check_elf(const hr_kernel_info *info, const unsigned char *p, size_t n) {
    const char *why = NULL;
    Elf64_Ehdr eh;
    if (n < sizeof eh) why = "shorter than an ELF header";
    if (!why) {
        memcpy(&eh, p, sizeof eh);
        if (memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
            eh.e_ident[EI_DATA] != ELFDATA2LSB)
            why = "not a 64-bit little-endian ELF file";
        else if (eh.e_type != ET_DYN)
            why = "not a shared library";
#if defined(__x86_64__)
        else if (eh.e_machine != EM_X86_64)
            why = "built for another machine";
#elif defined(__aarch64__)
        else if (eh.e_machine != EM_AARCH64)
            why = "built for another machine";
#endif
        else if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phoff > n ||
                 (n - eh.e_phoff) / sizeof(Elf64_Phdr) < eh.e_phnum)
            why = "truncated: its program headers end past the file";
        else if (eh.e_shoff && (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > n ||
                                (n - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum))
            why = "truncated: its section headers end past the file";
    }
    for (unsigned i = 0; !why && i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        memcpy(&ph, p + eh.e_phoff + i * sizeof ph, sizeof ph);
        if ((ph.p_type == PT_LOAD || ph.p_type == PT_DYNAMIC) && (ph.p_offset > n || n - ph.p_offset < ph.p_filesz))
            why = "truncated: a segment ends past the file";
    }
    if (!why) why = check_dynamic(p, n, &eh);
    if (why) return hr_error(HR_ERR_FORMAT, "kernel %s: %s does not load: %s", info->repo, info->library, why);
    return HR_OK;
}

/* dlopen of the bytes that were hashed, from a private copy (0600, a
 * unique name, unlinked once loaded): what runs is what was checked,
 * whatever happens to the cache's file meanwhile. The name is unique
 * because the loader takes a name it has seen for the library it loaded
 * under it (a memfd's /proc/self/fd/N recurs). */
static hr_status open_bytes(const hr_kernel_info *info, const unsigned char *lib, size_t len, void **handle) {
    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX], path[PATH_MAX + 32];
    HR_TRY(check_elf(info, lib, len));
    snprintf(dir, sizeof dir, "%s/hubrt-kernel-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) /* 0700: nobody else can swap the copy */
        return hr_error(HR_ERR_IO, "kernel %s: cannot make a private folder in %s: %s", info->repo,
                        tmp && *tmp ? tmp : "/tmp", strerror(errno));
    snprintf(path, sizeof path, "%s/kernel.so", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        rmdir(dir);
        return hr_error(HR_ERR_IO, "kernel %s: cannot stage the library in %s: %s", info->repo, dir, strerror(errno));
    }
    size_t put = 0;
    while (put < len) {
        ssize_t n = write(fd, lib + put, len - put);
        if (n <= 0) break;
        put += (size_t)n;
    }
    close(fd);
    *handle = put == len ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    const char *e = put == len ? dlerror() : "cannot write the private copy";
    unlink(path);
    rmdir(dir);
    if (!*handle)
        return hr_error(HR_ERR_FORMAT, "kernel %s: %s does not load: %s", info->repo, info->library,
                        e ? e : "unknown error");
    return HR_OK;
}

/* The exported struct against the ABI and the metadata. */
static hr_status check_abi(void *handle, const hr_kernel_info *info, const hr_kernel_abi **abi) {
    *abi = dlsym(handle, HR_KERNEL_ABI_SYMBOL);
    if (!*abi)
        return hr_error(HR_ERR_FORMAT, "kernel %s: %s has no symbol '%s'", info->repo, info->library,
                        HR_KERNEL_ABI_SYMBOL);
    const hr_kernel_abi *a = *abi;
    if (a->abi_version != HR_KERNEL_ABI_VERSION || a->struct_size < sizeof *a)
        return hr_error(HR_ERR_UNSUPPORTED, "kernel %s: ABI mismatch: %s exports ABI %u (struct of %u bytes); this "
                        "hubrt loads ABI %d (%zu bytes)", info->repo, info->library, a->abi_version, a->struct_size,
                        HR_KERNEL_ABI_VERSION, sizeof *a);
    if (!a->name || strcmp(a->name, info->name) || strcmp(a->name, "experts") || !a->experts)
        return hr_error(HR_ERR_UNSUPPORTED, "kernel %s: %s implements '%s' (metadata.json: '%s'); hubrt loads "
                        "'experts' kernels", info->repo, info->library, a->name ? a->name : "(null)", info->name);
    return HR_OK;
}

hr_status hr_kernel_load(const char *repo, const hr_kernel_options *o, hr_kernel_info *info) {
    hr_kernel_meta m;
    unsigned char *lib;
    size_t len;
    HR_TRY(verify(repo, o, true, info, &m, &lib, &len));
    info->impl_id = impl_id_of(info);
    pthread_mutex_lock(&g_lock);
    hr_status s = HR_OK;
    bool have = false;
    for (int i = 0; i < g_n_loaded && !have; i++) have = g_loaded[i].id == info->impl_id;
    void *handle = NULL;
    const hr_kernel_abi *abi = NULL;
    if (!have && g_n_loaded == MAX_LOADED)
        s = hr_error(HR_ERR_UNSUPPORTED, "kernel %s: %d kernels are loaded already", repo, MAX_LOADED);
    if (!have && s == HR_OK) s = open_bytes(info, lib, len, &handle);
    if (!have && s == HR_OK) s = check_abi(handle, info, &abi);
    if (!have && s == HR_OK) {
        char name[256];
        snprintf(name, sizeof name, "%s@%.12s", info->repo, info->revision);
        s = hr_experts_impl_register(info->impl_id, name, abi->experts);
    }
    if (!have && s == HR_OK) {
        g_loaded[g_n_loaded].id = info->impl_id;
        g_loaded[g_n_loaded].handle = handle;
        g_n_loaded++;
    } else if (handle) {
        dlclose(handle);
    }
    pthread_mutex_unlock(&g_lock);
    free(lib);
    if (s != HR_OK) info->impl_id = 0;
    return s;
}

/* ---- the cache's kernels ----------------------------------------------------------- */

hr_status hr_kernel_list(const hr_kernel_options *o,
                         void (*fn)(void *ctx, const char *repo, const char *revision, const char *variants),
                         void *ctx) {
    char root[PATH_MAX];
    hr_hub_options ho = {.cache_dir = o ? o->cache_dir : NULL, .offline = 1, .progress = 0};
    hr_hub_cache_root(&ho, root, sizeof root);
    DIR *d = opendir(root);
    if (!d) return HR_OK; /* no cache: no kernels */
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, "models--", 8)) continue;
        char repo[256], snaps[PATH_MAX + 300];
        snprintf(repo, sizeof repo, "%s", e->d_name + 8);
        char *sep = strstr(repo, "--");
        if (sep) memmove(sep + 1, sep + 2, strlen(sep + 2) + 1), *sep = '/';
        snprintf(snaps, sizeof snaps, "%s/%s/snapshots", root, e->d_name);
        DIR *s = opendir(snaps);
        for (struct dirent *r; s && (r = readdir(s));) {
            if (r->d_name[0] == '.') continue;
            char build[PATH_MAX + 600], variants[1024] = "";
            snprintf(build, sizeof build, "%s/%s/build", snaps, r->d_name);
            DIR *b = opendir(build);
            size_t used = 0;
            for (struct dirent *v; b && (v = readdir(b));) {
                if (v->d_name[0] == '.') continue;
                int n = snprintf(variants + used, sizeof variants - used, "%s%s", used ? "," : "", v->d_name);
                if (n > 0 && used + (size_t)n < sizeof variants) used += (size_t)n;
            }
            if (b) {
                closedir(b);
                fn(ctx, repo, r->d_name, variants);
            }
        }
        if (s) closedir(s);
    }
    closedir(d);
    return HR_OK;
}
