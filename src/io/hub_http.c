/* HTTP for the Hub client, on libcurl: the HEAD that finds a file's
 * commit, etag and size, and the GET that fetches its bytes, as
 * huggingface_hub's file_download.py sends them (no automatic redirects:
 * Hub-origin redirects are followed by hand, a CDN's are not, and the
 * token goes to the Hub's origins only). */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "core/error.h"
#include "io/hub_internal.h"

#define MAX_REDIRECTS 20
#define GET_TRIES 5

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

bool hub_origin(const char *url, char *out, size_t cap) {
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL;
    bool ok = u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK;
    if (ok) {
        for (char *c = host; *c; c++) *c = (char)tolower((unsigned char)*c);
        ok = (size_t)snprintf(out, cap, "%s://%s:%s", scheme, host, port) < cap;
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return ok;
}

/* The Hub's own origins: the endpoint's, huggingface.co's and hf.co's. */
static bool hub_owned(const hub_http *h, const char *url) {
    char o[512], e[512];
    if (!hub_origin(url, o, sizeof o)) return false;
    if (h->endpoint && hub_origin(h->endpoint, e, sizeof e) && !strcmp(o, e)) return true;
    return !strcmp(o, "https://huggingface.co:443") || !strcmp(o, "https://hf.co:443") ||
           !strcmp(o, "https://hub-ci.huggingface.co:443");
}

/* `loc` (absolute or relative) against `base`, into out. */
static bool join_url(const char *base, const char *loc, char *out, size_t cap) {
    CURLU *u = curl_url();
    char *s = NULL;
    bool ok = u && curl_url_set(u, CURLUPART_URL, base, 0) == CURLUE_OK &&
              curl_url_set(u, CURLUPART_URL, loc, 0) == CURLUE_OK && curl_url_get(u, CURLUPART_URL, &s, 0) == CURLUE_OK &&
              strlen(s) < cap;
    if (ok) memcpy(out, s, strlen(s) + 1);
    curl_free(s);
    curl_url_cleanup(u);
    return ok;
}

/* ---- HEAD -------------------------------------------------------------- */

typedef struct {
    hub_meta *m;
    char location[2048];
    int64_t content_length, linked_size;
    char etag[160], linked_etag[160];
} head_state;

static void copy_value(char *dst, size_t cap, const char *v, size_t n) {
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
    while (n && *v == ' ') v++, n--;
    if (n >= cap) n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

/* huggingface_hub's _normalize_etag: .lstrip("W/").strip('"') (it strips
 * any leading 'W' and '/' characters, not only the prefix). */
static void normalize_etag(char *e) {
    size_t i = 0;
    while (e[i] == 'W' || e[i] == '/') i++;
    memmove(e, e + i, strlen(e + i) + 1);
    size_t n = strlen(e), a = 0;
    while (a < n && e[a] == '"') a++;
    while (n > a && e[n - 1] == '"') n--;
    memmove(e, e + a, n - a);
    e[n - a] = '\0';
}

static bool header_is(const char *line, size_t n, const char *name, const char **value, size_t *vlen) {
    size_t k = strlen(name);
    if (n <= k || line[k] != ':' || strncasecmp(line, name, k)) return false;
    *value = line + k + 1;
    *vlen = n - k - 1;
    return true;
}

static size_t on_head_header(char *line, size_t size, size_t count, void *ctx) {
    head_state *s = ctx;
    size_t n = size * count;
    const char *v;
    size_t vl;
    char num[32];
    if (n >= 5 && !strncmp(line, "HTTP/", 5)) { /* a new response: forget the last one's */
        s->m->commit[0] = s->m->error_code[0] = s->m->error_message[0] = s->location[0] = '\0';
        s->etag[0] = s->linked_etag[0] = '\0';
        s->content_length = s->linked_size = -1;
    } else if (header_is(line, n, "X-Repo-Commit", &v, &vl)) {
        copy_value(s->m->commit, sizeof s->m->commit, v, vl);
    } else if (header_is(line, n, "X-Linked-Etag", &v, &vl)) {
        copy_value(s->linked_etag, sizeof s->linked_etag, v, vl);
    } else if (header_is(line, n, "ETag", &v, &vl)) {
        copy_value(s->etag, sizeof s->etag, v, vl);
    } else if (header_is(line, n, "X-Linked-Size", &v, &vl)) {
        copy_value(num, sizeof num, v, vl);
        s->linked_size = strtoll(num, NULL, 10);
    } else if (header_is(line, n, "Content-Length", &v, &vl)) {
        copy_value(num, sizeof num, v, vl);
        s->content_length = strtoll(num, NULL, 10);
    } else if (header_is(line, n, "Location", &v, &vl)) {
        copy_value(s->location, sizeof s->location, v, vl);
    } else if (header_is(line, n, "X-Error-Code", &v, &vl)) {
        copy_value(s->m->error_code, sizeof s->m->error_code, v, vl);
    } else if (header_is(line, n, "X-Error-Message", &v, &vl)) {
        copy_value(s->m->error_message, sizeof s->m->error_message, v, vl);
    }
    return n;
}

static struct curl_slist *base_headers(const hub_http *h, const char *url, bool identity) {
    struct curl_slist *l = NULL;
    char auth[1200];
    if (h->token && *h->token && hub_owned(h, url) && (size_t)snprintf(auth, sizeof auth, "Authorization: Bearer %s",
                                                                       h->token) < sizeof auth)
        l = curl_slist_append(l, auth);
    if (identity) l = curl_slist_append(l, "Accept-Encoding: identity");
    return l;
}

static void common_options(CURL *c, const char *url) {
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "hubrt/" HUBRT_VERSION_STRING " (libcurl)");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    /* a transfer that delivers under 1 byte/s for 30 s is dropped (and resumed) */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
}

hr_status hub_http_head(const hub_http *h, const char *url, hub_meta *m) {
    pthread_once(&g_curl_once, curl_init);
    memset(m, 0, sizeof *m);
    m->size = -1;
    char cur[2048];
    if (strlen(url) >= sizeof cur) return hr_error(HR_ERR_INVALID_ARG, "%s: URL too long", url);
    memcpy(cur, url, strlen(url) + 1);
    CURL *c = curl_easy_init();
    if (!c) return hr_error(HR_ERR_OOM, "libcurl: cannot make a handle");
    hr_status st = HR_OK;
    for (int hop = 0;; hop++) {
        head_state s = {.m = m, .content_length = -1, .linked_size = -1};
        struct curl_slist *hdr = base_headers(h, cur, true);
        curl_easy_reset(c);
        common_options(c, cur);
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_head_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &s);
        CURLcode rc = curl_easy_perform(c);
        curl_slist_free_all(hdr);
        if (rc != CURLE_OK) {
            st = hr_error(HR_ERR_IO, "HEAD %s: %s", cur, curl_easy_strerror(rc));
            break;
        }
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &m->status);
        snprintf(m->etag, sizeof m->etag, "%s", s.linked_etag[0] ? s.linked_etag : s.etag);
        normalize_etag(m->etag);
        bool redirect = m->status >= 300 && m->status < 400 && s.location[0];
        m->size = s.linked_size >= 0 ? s.linked_size : redirect ? -1 : s.content_length;
        if (!redirect) {
            snprintf(m->location, sizeof m->location, "%s", cur);
            break;
        }
        char next[2048];
        if (!join_url(cur, s.location, next, sizeof next)) {
            st = hr_error(HR_ERR_FORMAT, "HEAD %s: redirect to an unreadable location", cur);
            break;
        }
        if (!hub_owned(h, next)) { /* a CDN: its URL is where the bytes are */
            snprintf(m->location, sizeof m->location, "%s", next);
            break;
        }
        if (hop == MAX_REDIRECTS) {
            st = hr_error(HR_ERR_FORMAT, "HEAD %s: more than %d redirects", url, MAX_REDIRECTS);
            break;
        }
        memcpy(cur, next, strlen(next) + 1);
    }
    curl_easy_cleanup(c);
    return st;
}

/* ---- GET --------------------------------------------------------------- */

typedef struct {
    FILE *f;
    int64_t written, total;
    long status;
    bool restart; /* a 200 to a Range request: the bytes start over */
    bool checked;
    CURL *c;
    const char *label;
    bool progress;
    int last_pct;
} get_state;

static size_t on_body(char *p, size_t size, size_t count, void *ctx) {
    get_state *s = ctx;
    size_t n = size * count;
    if (!s->checked) {
        s->checked = true;
        curl_easy_getinfo(s->c, CURLINFO_RESPONSE_CODE, &s->status);
        if (s->status >= 300) return 0; /* an error page is not the file */
        if (s->status == 200 && s->written > 0) {
            s->restart = true;
            if (fflush(s->f) || ftruncate(fileno(s->f), 0) || fseek(s->f, 0, SEEK_SET)) return 0;
            s->written = 0;
        }
    }
    if (fwrite(p, 1, n, s->f) != n) return 0;
    s->written += (int64_t)n;
    if (s->progress && s->total > 0) {
        int pct = (int)(s->written * 100 / s->total);
        if (pct != s->last_pct) {
            s->last_pct = pct;
            fprintf(stderr, "\r%s: %3d%% of %.1f MB", s->label, pct, (double)s->total / 1e6);
        }
    }
    return n;
}

hr_status hub_http_get(const hub_http *h, const char *url, const char *path, int64_t size, const char *label) {
    pthread_once(&g_curl_once, curl_init);
    FILE *f = fopen(path, "wb");
    if (!f) return hr_error(HR_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    CURL *c = curl_easy_init();
    if (!c) {
        fclose(f);
        return hr_error(HR_ERR_OOM, "libcurl: cannot make a handle");
    }
    get_state s = {.f = f, .total = size, .c = c, .label = label, .progress = h->progress, .last_pct = -1};
    hr_status st = HR_OK;
    for (int attempt = 1;; attempt++) {
        struct curl_slist *hdr = base_headers(h, url, false);
        char range[64];
        if (s.written > 0) {
            snprintf(range, sizeof range, "Range: bytes=%lld-", (long long)s.written);
            hdr = curl_slist_append(hdr, range);
        }
        curl_easy_reset(c);
        common_options(c, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
        /* the bytes may sit behind more redirects (a CDN signing its URLs), followed as
         * huggingface_hub's GET follows them; libcurl drops our Authorization header when
         * a redirect leaves the host */
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(c, CURLOPT_MAXREDIRS, 20L);
        curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
        s.checked = false;
        s.status = 0;
        CURLcode rc = curl_easy_perform(c);
        curl_slist_free_all(hdr);
        long status = s.status;
        if (!s.checked) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (rc == CURLE_OK && status >= 200 && status < 300) break;
        bool transient = rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR || rc == CURLE_OPERATION_TIMEDOUT ||
                         rc == CURLE_COULDNT_CONNECT || rc == CURLE_GOT_NOTHING || rc == CURLE_SEND_ERROR ||
                         (rc == CURLE_WRITE_ERROR && status >= 500) || status == 408 || status == 429 ||
                         status >= 500;
        if (!transient || attempt == GET_TRIES) {
            st = status >= 400 ? hr_error(HR_ERR_IO, "GET %s: HTTP %ld", label, status)
                               : hr_error(HR_ERR_IO, "GET %s: %s (after %d tries)", label, curl_easy_strerror(rc),
                                          attempt);
            break;
        }
        if (fflush(f)) {
            st = hr_error(HR_ERR_IO, "%s: write failed", path);
            break;
        }
        sleep(1);
    }
    if (s.progress && s.last_pct >= 0) fputc('\n', stderr);
    curl_easy_cleanup(c);
    if (fclose(f) && st == HR_OK) st = hr_error(HR_ERR_IO, "%s: write failed", path);
    if (st == HR_OK && size >= 0 && s.written != size)
        st = hr_error(HR_ERR_FORMAT, "%s: consistency check failed: the file should be %lld bytes but has %lld", label,
                      (long long)size, (long long)s.written);
    return st;
}
