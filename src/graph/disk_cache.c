/* The disk tier of the compile cache: a plan serialized with a header
 * (magic, format, key, length, checksum), written to a temp file and
 * renamed into place, and read back only after every index, size and
 * extent in it has been checked. */
#include "core/bytes.h"
#include "graph/disk_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/hash.h"
#include "device/device_impl.h"

#define MAGIC "HRPLAN\0\1"
#define FORMAT 1
#define HEADER_SIZE 40 /* magic 8, format 4, pad 4, key 8, length 8, checksum 8 */

bool hr_disk_cache_enabled(void) {
    const char *s = getenv("HUBRT_CACHE");
    return !(s && !strcmp(s, "0"));
}

bool hr_disk_cache_dir(char *buf, size_t n) {
    const char *dir = getenv("HUBRT_CACHE_DIR");
    if (dir && *dir) return (size_t)snprintf(buf, n, "%s", dir) < n;
    const char *home = getenv("HOME");
    if (!home || !*home) return false;
    return (size_t)snprintf(buf, n, "%s/.cache/hubrt", home) < n;
}

/* ---- byte writer / reader -------------------------------------------- */

typedef hr_bytes writer;

static void put(writer *w, const void *src, size_t n) { hr_bytes_put(w, src, n); }

static void put_i64(writer *w, int64_t v) { put(w, &v, 8); }

static void put_str(writer *w, const char *s) {
    int64_t n = (int64_t)strlen(s);
    put_i64(w, n);
    put(w, s, (size_t)n);
}

typedef struct {
    const unsigned char *p;
    size_t len, pos;
    bool bad;
} reader;

static void get(reader *r, void *dst, size_t n) {
    if (r->bad || n > r->len - r->pos) {
        r->bad = true;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
}

static int64_t get_i64(reader *r) {
    int64_t v;
    get(r, &v, 8);
    return v;
}

static void get_str(reader *r, char *dst, size_t cap) {
    int64_t n = get_i64(r);
    if (n < 0 || (size_t)n >= cap) {
        r->bad = true;
        dst[0] = '\0';
        return;
    }
    get(r, dst, (size_t)n);
    dst[r->bad ? 0 : n] = '\0';
}

/* ---- serialize -------------------------------------------------------- */

static void put_tensor(writer *w, const hr_tensor *t, int value) {
    put_i64(w, t->dtype);
    put_i64(w, t->ndim);
    for (int d = 0; d < HR_MAX_DIMS; d++) put_i64(w, t->shape[d]);
    for (int d = 0; d < HR_MAX_DIMS; d++) put_i64(w, t->strides[d]);
    put_i64(w, t->offset);
    put_i64(w, value);
}

hr_status hr_plan_serialize(const hr_plan *p, uint64_t key, hr_jit_resolve_fn resolve, void *ctx,
                            unsigned char **data, size_t *len) {
    writer w = {0};
    unsigned char header[HEADER_SIZE] = {0};
    put(&w, header, sizeof header);
    put_i64(&w, p->n_in);
    put_i64(&w, p->n_out);
    put_i64(&w, p->n_values);
    for (int v = 0; v < p->n_values; v++) {
        const hr_plan_value *pv = &p->values[v];
        int64_t name_offset = 0;
        if (pv->kind == HR_VALUE_CONST) {
            /* A constant travels by name: it must be the buffer the name
             * resolves to in this process. */
            const hr_tensor *t = pv->name[0] && resolve ? resolve(ctx, pv->name) : NULL;
            if (!t || t->buf != pv->constant) {
                free(w.p);
                return hr_error(HR_ERR_UNSUPPORTED, "plan constant %d ('%s') cannot be resolved by name", v,
                                pv->name);
            }
            name_offset = t->offset;
        }
        put_i64(&w, pv->kind);
        put_i64(&w, pv->index);
        put_i64(&w, (int64_t)pv->nbytes);
        put_i64(&w, pv->base_offset);
        put_i64(&w, pv->base_dtype);
        put_i64(&w, name_offset);
        put_str(&w, pv->name);
    }
    put_i64(&w, p->n_tensors);
    for (int i = 0; i < p->n_tensors; i++) put_tensor(&w, &p->tensors[i], hr_plan_value_index(p, &p->tensors[i]));
    put_i64(&w, p->n_nodes);
    for (int i = 0; i < p->n_nodes; i++) {
        const hr_plan_node *n = &p->nodes[i];
        put_str(&w, hr_op_name(n->op));
        put_i64(&w, n->n_in);
        put_i64(&w, n->n_out);
        put_i64(&w, n->first_tensor);
        put_i64(&w, (int64_t)n->attrs_size);
        put(&w, n->attrs, n->attrs_size);
    }
    for (int i = 0; i < p->n_out; i++) put_tensor(&w, &p->outputs[i], p->output_value[i]);
    put_i64(&w, (int64_t)p->structure_hash);
    if (w.oom) {
        free(w.p);
        return hr_error(HR_ERR_OOM, "plan: out of memory serializing");
    }
    uint64_t payload = w.len - HEADER_SIZE, sum = hr_fnv1a(HR_FNV_OFFSET, w.p + HEADER_SIZE, payload);
    uint32_t format = FORMAT;
    memcpy(w.p, MAGIC, 8);
    memcpy(w.p + 8, &format, 4);
    memcpy(w.p + 16, &key, 8);
    memcpy(w.p + 24, &payload, 8);
    memcpy(w.p + 32, &sum, 8);
    *data = w.p;
    *len = w.len;
    return HR_OK;
}

/* ---- deserialize ------------------------------------------------------ */

static hr_status bad(const char *what) {
    return hr_error(HR_ERR_FORMAT, "compile cache entry rejected: %s", what);
}

static bool get_tensor(reader *r, hr_cap_tensor *t, int n_values) {
    t->dtype = (hr_dtype)get_i64(r);
    t->ndim = (int)get_i64(r);
    for (int d = 0; d < HR_MAX_DIMS; d++) t->shape[d] = get_i64(r);
    for (int d = 0; d < HR_MAX_DIMS; d++) t->strides[d] = get_i64(r);
    t->offset = get_i64(r);
    t->value = (int)get_i64(r);
    if (r->bad || (unsigned)t->dtype >= HR_DTYPE_COUNT || t->ndim < 0 || t->ndim > HR_MAX_DIMS ||
        t->value < 0 || t->value >= n_values || t->offset < 0)
        return false;
    return true;
}

/* Every element a tensor can reach lies inside its value's bytes. */
static bool tensor_fits(const hr_cap_tensor *t, size_t nbytes) {
    int64_t last = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || t->strides[d] < 0 || t->shape[d] > (int64_t)1 << 40) return false;
        if (t->shape[d] == 0) return true;
        last += (t->shape[d] - 1) * t->strides[d];
    }
    return hr_dtype_nbytes(t->dtype, last + 1) <= nbytes;
}

hr_status hr_plan_deserialize(const unsigned char *data, size_t len, uint64_t key, hr_jit_resolve_fn resolve,
                              void *ctx, bool fold_constants, const hr_tensor *const *inputs, int n_in, int n_out,
                              hr_plan **out) {
    *out = NULL;
    if (len < HEADER_SIZE || memcmp(data, MAGIC, 8)) return bad("not a hubrt plan (bad magic or truncated)");
    uint32_t format;
    uint64_t fkey, payload, sum;
    memcpy(&format, data + 8, 4);
    memcpy(&fkey, data + 16, 8);
    memcpy(&payload, data + 24, 8);
    memcpy(&sum, data + 32, 8);
    if (format != FORMAT) return bad("written by another format version");
    if (fkey != key) return bad("key mismatch");
    if (payload != len - HEADER_SIZE) return bad("truncated or padded");
    if (hr_fnv1a(HR_FNV_OFFSET, data + HEADER_SIZE, payload) != sum) return bad("checksum mismatch");
    reader r = {data + HEADER_SIZE, payload, 0, false};
    hr_capture cap;
    memset(&cap, 0, sizeof cap);
    hr_tensor *outs_meta = NULL, **out_ptrs = NULL;
    hr_buffer *out_bufs = NULL;
    hr_status s = HR_OK;
    /* Counts are bounded by the bytes that must follow them (a value takes
     * at least 7 numbers, a tensor 20, a node 4 and a name's length): a
     * small entry cannot make this allocate by the counts it states. */
    int64_t fin = get_i64(&r), fout = get_i64(&r), nv = get_i64(&r);
    if (r.bad || fin != n_in || fout != n_out || nv < 0 || nv > (int64_t)(payload / (7 * 8))) {
        s = bad("header counts do not match the call");
        goto done;
    }
    cap.values = calloc((size_t)(nv ? nv : 1), sizeof *cap.values);
    if (!cap.values) {
        s = hr_error(HR_ERR_OOM, "out of memory");
        goto done;
    }
    cap.n_values = (int)nv;
    cap.device = n_in ? inputs[0]->buf->device : hr_device_cpu();
    for (int v = 0; v < nv && s == HR_OK; v++) {
        hr_cap_value *cv = &cap.values[v];
        cv->seq = (uint64_t)v + 1;
        cv->kind = (hr_value_kind)get_i64(&r);
        cv->index = (int)get_i64(&r);
        int64_t nbytes = get_i64(&r);
        cv->base_offset = get_i64(&r);
        cv->base_dtype = (hr_dtype)get_i64(&r);
        int64_t name_offset = get_i64(&r);
        get_str(&r, cv->name, sizeof cv->name);
        if (r.bad || nbytes < 0 || (unsigned)cv->kind > HR_VALUE_OUTPUT || (unsigned)cv->base_dtype >= HR_DTYPE_COUNT) {
            s = bad("malformed value");
            break;
        }
        cv->nbytes = (size_t)nbytes;
        if (cv->kind == HR_VALUE_CONST) {
            const hr_tensor *t = resolve ? resolve(ctx, cv->name) : NULL;
            if (!t || t->offset != name_offset || t->buf->nbytes != cv->nbytes || t->buf->device != cap.device) {
                s = bad("a constant no longer matches its tensor");
                break;
            }
            cv->buf = hr_buffer_retain(t->buf);
        } else if (cv->kind == HR_VALUE_INPUT) {
            if (cv->index < 0 || cv->index >= n_in || cv->base_offset < 0 ||
                inputs[cv->index]->dtype != cv->base_dtype) {
                s = bad("input value out of range");
                break;
            }
            /* Replay shifts the input's buffer by (offset now - base_offset):
             * node tensors may reach only what the input tensor itself spans. */
            const hr_tensor *in = inputs[cv->index];
            int64_t span = 1;
            for (int d = 0; d < in->ndim; d++) span += (in->shape[d] - 1) * in->strides[d];
            if (hr_shape_numel(in->ndim, in->shape) == 0) span = 0;
            cv->nbytes = hr_dtype_nbytes(cv->base_dtype, cv->base_offset + span);
        } else if (cv->kind == HR_VALUE_OUTPUT && (cv->index < 0 || cv->index >= n_out)) {
            s = bad("output value out of range");
            break;
        }
    }
    if (s != HR_OK) goto done;
    int64_t nt = get_i64(&r);
    if (r.bad || nt < 0 || nt > (int64_t)(payload / (20 * 8))) {
        s = bad("malformed tensor count");
        goto done;
    }
    cap.tensors = calloc((size_t)(nt ? nt : 1), sizeof *cap.tensors);
    if (!cap.tensors) {
        s = hr_error(HR_ERR_OOM, "out of memory");
        goto done;
    }
    cap.n_tensors = (int)nt;
    for (int i = 0; i < nt; i++)
        if (!get_tensor(&r, &cap.tensors[i], cap.n_values) ||
            !tensor_fits(&cap.tensors[i], cap.values[cap.tensors[i].value].nbytes) ||
            (cap.values[cap.tensors[i].value].kind == HR_VALUE_INPUT &&
             cap.tensors[i].offset < cap.values[cap.tensors[i].value].base_offset)) {
            s = bad("a tensor reaches outside its buffer");
            goto done;
        }
    int64_t nn = get_i64(&r);
    if (r.bad || nn < 0 || nn > (int64_t)(payload / (5 * 8))) {
        s = bad("malformed node count");
        goto done;
    }
    cap.nodes = calloc((size_t)(nn ? nn : 1), sizeof *cap.nodes);
    if (!cap.nodes) {
        s = hr_error(HR_ERR_OOM, "out of memory");
        goto done;
    }
    cap.n_nodes = (int)nn;
    for (int i = 0; i < nn; i++) {
        hr_cap_node *n = &cap.nodes[i];
        char opname[64];
        get_str(&r, opname, sizeof opname);
        n->n_in = (int)get_i64(&r);
        n->n_out = (int)get_i64(&r);
        n->first_tensor = (int)get_i64(&r);
        int64_t asize = get_i64(&r);
        if (r.bad || hr_op_find(opname, &n->op) != HR_OK || n->n_in < hr_op_min_inputs(n->op) ||
            n->n_in > hr_op_max_inputs(n->op) || n->n_out < 1 || n->n_out > hr_op_num_outputs(n->op) || n->first_tensor < 0 ||
            (int64_t)n->first_tensor + n->n_in + n->n_out > nt || asize != (int64_t)hr_op_attrs_size(n->op)) {
            s = bad("malformed node");
            goto done;
        }
        n->attrs_size = (size_t)asize;
        get(&r, n->attrs, n->attrs_size);
        if (r.bad || n->n_out != hr_op_outputs_for(n->op, n->attrs_size ? n->attrs : NULL)) {
            s = bad("malformed node");
            goto done;
        }
    }
    outs_meta = calloc((size_t)n_out, sizeof *outs_meta);
    out_ptrs = calloc((size_t)n_out, sizeof *out_ptrs);
    out_bufs = calloc((size_t)n_out, sizeof *out_bufs);
    if (!outs_meta || !out_ptrs || !out_bufs) {
        s = hr_error(HR_ERR_OOM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_out; i++) {
        hr_cap_tensor ct;
        if (!get_tensor(&r, &ct, cap.n_values) || cap.values[ct.value].kind != HR_VALUE_OUTPUT ||
            !tensor_fits(&ct, cap.values[ct.value].nbytes)) {
            s = bad("malformed output");
            goto done;
        }
        hr_tensor *o = &outs_meta[i];
        o->dtype = ct.dtype;
        o->ndim = ct.ndim;
        memcpy(o->shape, ct.shape, sizeof o->shape);
        memcpy(o->strides, ct.strides, sizeof o->strides);
        o->offset = ct.offset;
        out_bufs[i].seq = cap.values[ct.value].seq;
        o->buf = &out_bufs[i];
        out_ptrs[i] = o;
    }
    uint64_t shash = (uint64_t)get_i64(&r);
    if (r.bad || r.pos != r.len) {
        s = bad("trailing or missing bytes");
        goto done;
    }
    hr_plan *plan = NULL;
    s = hr_plan_build(&cap, out_ptrs, n_in, n_out, fold_constants, &plan);
    if (s == HR_OK && plan->structure_hash != shash) {
        hr_plan_free(plan);
        s = bad("structure hash mismatch");
    } else if (s == HR_OK) {
        *out = plan;
    }
done:
    free(outs_meta);
    free(out_ptrs);
    free(out_bufs);
    hr_capture_free(&cap);
    return s;
}

/* ---- files ------------------------------------------------------------ */

static void entry_path(char *buf, size_t n, const char *dir, const char *name, uint64_t key) {
    char safe[64];
    size_t i = 0;
    for (; name[i] && i < sizeof safe - 1; i++) {
        char c = name[i];
        safe[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ? c : '_';
    }
    safe[i] = '\0';
    snprintf(buf, n, "%s/%s-%016llx.hrplan", dir, safe, (unsigned long long)key);
}

static int mkdirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

hr_status hr_disk_cache_load(uint64_t key, const char *name, hr_jit_resolve_fn resolve, void *ctx,
                             bool fold_constants, const hr_tensor *const *inputs, int n_in, int n_out,
                             hr_plan **out) {
    char dir[900], path[1024];
    if (!hr_disk_cache_dir(dir, sizeof dir)) return HR_ERR_NOT_FOUND;
    entry_path(path, sizeof path, dir, name, key);
    FILE *f = fopen(path, "rb");
    if (!f) return HR_ERR_NOT_FOUND;
    hr_status s = HR_ERR_IO;
    unsigned char *data = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size > 0 && st.st_size < (off_t)1 << 32 &&
        (data = malloc((size_t)st.st_size)) && fread(data, 1, (size_t)st.st_size, f) == (size_t)st.st_size)
        s = hr_plan_deserialize(data, (size_t)st.st_size, key, resolve, ctx, fold_constants, inputs, n_in, n_out,
                                out);
    else
        s = hr_error(HR_ERR_IO, "cannot read %s", path);
    fclose(f);
    free(data);
    if (s != HR_OK) {
        hr_log(HR_LOG_WARN, "%s: %s; rebuilding it", path, hr_last_error());
        hr_compile_stats_note_reject();
    }
    return s;
}

void hr_disk_cache_store(uint64_t key, const char *name, const hr_plan *plan, hr_jit_resolve_fn resolve,
                         void *ctx) {
    char dir[900], path[1024], tmp[1100];
    if (!hr_disk_cache_dir(dir, sizeof dir)) return;
    unsigned char *data = NULL;
    size_t len = 0;
    if (hr_plan_serialize(plan, key, resolve, ctx, &data, &len) != HR_OK) {
        hr_log(HR_LOG_DEBUG, "compile cache: '%s' stays in memory: %s", name, hr_last_error());
        return;
    }
    entry_path(path, sizeof path, dir, name, key);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%p", path, (int)getpid(), (void *)data);
    int fd = -1;
    bool ok = mkdirs(dir) == 0 && (fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644)) >= 0;
    for (size_t done = 0; ok && done < len;) {
        ssize_t w = write(fd, data + done, len - done);
        if (w <= 0) ok = false;
        else done += (size_t)w;
    }
    if (fd >= 0) {
        ok = ok && fsync(fd) == 0;
        ok = close(fd) == 0 && ok;
    }
    /* rename is atomic: readers see the old entry or the whole new one. */
    ok = ok && rename(tmp, path) == 0;
    if (!ok) {
        hr_log(HR_LOG_WARN, "compile cache: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(data);
}
