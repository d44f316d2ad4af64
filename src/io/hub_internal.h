/* The Hub client's HTTP side (io/hub_http.c), for io/hub.c. */
#ifndef HR_IO_HUB_INTERNAL_H
#define HR_IO_HUB_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "hubrt/base.h"

/* What a HEAD of a resolve URL says, as huggingface_hub reads it. */
typedef struct hub_meta {
    long status;        /* the last response's */
    char commit[96];    /* X-Repo-Commit */
    char etag[160];     /* X-Linked-Etag or ETag, without W/ and quotes */
    int64_t size;       /* X-Linked-Size, else Content-Length of a non-redirect; -1 unknown */
    char location[2048];/* where the bytes are: Location of a redirect it did not follow, else the URL */
    char error_code[64];/* X-Error-Code (EntryNotFound, RepoNotFound, RevisionNotFound, GatedRepo) */
    char error_message[256];
} hub_meta;

typedef struct hub_http {
    const char *endpoint; /* the Hub's origin: redirects there (and to huggingface.co, hf.co) are followed */
    const char *token;    /* sent as a Bearer token to the Hub's origins only */
    bool progress;
} hub_http;

/* HEAD `url`, following redirects within the Hub's origins (20 at most);
 * a redirect elsewhere (a CDN) is answered from the redirect itself.
 * Statuses >= 400 are not errors here (m->status says); HR_ERR_IO when no
 * response came. */
hr_status hub_http_head(const hub_http *h, const char *url, hub_meta *m);

/* GET `url` into `path` (created), resuming a dropped transfer with a
 * Range request (5 tries; a server that answers 200 to it is read again
 * from the start); HR_ERR_FORMAT when the bytes are not `size` (when
 * known). `label` names the file in errors and the progress line. */
hr_status hub_http_get(const hub_http *h, const char *url, const char *path, int64_t size, const char *label);

/* "scheme://host:port" of an absolute URL (default ports filled in);
 * false when it does not parse. */
bool hub_origin(const char *url, char *out, size_t cap);

#endif
