/* safetensors header parsing and validation, from memory.
 *
 * Layout: u64 little-endian header length N, N bytes of UTF-8 JSON (an
 * object; the reference writer pads it with spaces to 8 bytes), then the
 * data section. Each entry is {"dtype", "shape", "data_offsets": [begin,
 * end]} with offsets relative to the data section. Nothing here trusts the
 * file: every size is checked before it is used, and every failure names the
 * file and the tensor or field. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/mem_budget.h"
#include "io/st_internal.h"

/* Largest integer a JSON number (a double in cJSON) carries exactly. */
#define ST_MAX_EXACT 9007199254740992.0

bool hr_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return false;
        if (n - i < len) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

char *hr_str_escape(const char *s, size_t len, char *buf, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 5 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
    }
    if (n) buf[o < n ? o : n - 1] = '\0';
    return buf;
}

static hr_status st_dtype(const char *label, const char *name, const cJSON *v, hr_dtype *out) {
    if (!cJSON_IsString(v))
        return hr_error(HR_ERR_FORMAT, "%s: tensor '%s': field 'dtype' must be a string", label,
                        name);
    for (int i = 0; i < HR_DTYPE_COUNT; i++) {
        /* block types have no safetensors spelling */
        if (!hr_dtype_is_quantized((hr_dtype)i) && !strcmp(v->valuestring, hr_dtype_safetensors_name((hr_dtype)i))) {
            *out = (hr_dtype)i;
            return HR_OK;
        }
    }
    char esc[64];
    return hr_error(HR_ERR_UNSUPPORTED,
                    "%s: tensor '%s': unsupported dtype '%s' (hubrt reads F32, BF16, F16, F64, "
                    "I64, I32, I16, I8, U8, BOOL, F8_E4M3)",
                    label, name, hr_str_escape(v->valuestring, strlen(v->valuestring), esc, sizeof esc));
}

/* A JSON number that is an exact non-negative integer. */
static bool st_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0) || d > ST_MAX_EXACT || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

static hr_status st_shape(const char *label, st_entry *e, const cJSON *v) {
    if (!cJSON_IsArray(v))
        return hr_error(HR_ERR_FORMAT, "%s: tensor '%s': field 'shape' must be a list of sizes",
                        label, e->name);
    int rank = cJSON_GetArraySize(v);
    if (rank > HR_MAX_DIMS)
        return hr_error(HR_ERR_UNSUPPORTED, "%s: tensor '%s': rank %d exceeds hubrt's maximum %d",
                        label, e->name, rank, HR_MAX_DIMS);
    int i = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        uint64_t s;
        if (!st_uint(d, &s))
            return hr_error(HR_ERR_FORMAT,
                            "%s: tensor '%s': shape[%d] must be an integer in 0..2^53 (the JSON numbers "
                            "hubrt reads exactly)", label,
                            e->name, i);
        e->shape[i] = (int64_t)s;
    }
    e->ndim = rank;
    return HR_OK;
}

static hr_status st_offsets(const char *label, st_entry *e, const cJSON *v, uint64_t data_size) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !st_uint(v->child, &e->begin) ||
        !st_uint(v->child->next, &e->end))
        return hr_error(HR_ERR_FORMAT,
                        "%s: tensor '%s': field 'data_offsets' must be [begin, end] with "
                        "integers in 0..2^53",
                        label, e->name);
    if (e->begin > e->end)
        return hr_error(HR_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before begin",
                        label, e->name, (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > data_size)
        return hr_error(HR_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] outside the data section of "
                        "%llu bytes (file truncated?)",
                        label, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)data_size);
    /* numel * itemsize must equal the range; the product is checked for
     * overflow (sizes go up to 2^53 each) and any zero size makes it 0. */
    uint64_t want = hr_dtype_size(e->dtype), range = e->end - e->begin;
    bool empty = false, overflow = false;
    for (int i = 0; i < e->ndim; i++) empty |= e->shape[i] == 0;
    for (int i = 0; i < e->ndim && !empty && !overflow; i++)
        overflow = __builtin_mul_overflow(want, (uint64_t)e->shape[i], &want);
    if (empty) want = 0;
    if (want != range) {
        char s[200], w[32];
        if (overflow) snprintf(w, sizeof w, "more than 2^64");
        else snprintf(w, sizeof w, "%llu", (unsigned long long)want);
        return hr_error(HR_ERR_FORMAT,
                        "%s: tensor '%s': shape %s of %s needs %s bytes but data_offsets [%llu, "
                        "%llu] hold %llu",
                        label, e->name, hr_shape_str(e->ndim, e->shape, s, sizeof s),
                        hr_dtype_safetensors_name(e->dtype), w, (unsigned long long)e->begin,
                        (unsigned long long)e->end, (unsigned long long)range);
    }
    return HR_OK;
}

static hr_status st_entry_parse(const char *label, const cJSON *item, uint64_t data_size,
                                st_entry *e) {
    if (!cJSON_IsObject(item))
        return hr_error(HR_ERR_FORMAT, "%s: tensor '%s': entry must be an object", label, e->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    const char *missing = !dt ? "dtype" : !sh ? "shape" : !off ? "data_offsets" : NULL;
    if (missing)
        return hr_error(HR_ERR_FORMAT, "%s: tensor '%s': missing field '%s'", label, e->name,
                        missing);
    HR_TRY(st_dtype(label, e->name, dt, &e->dtype));
    HR_TRY(st_shape(label, e, sh));
    return st_offsets(label, e, off, data_size);
}

static hr_status st_metadata(const char *label, const cJSON *m, st_header *h) {
    if (cJSON_IsNull(m)) return HR_OK;
    if (!cJSON_IsObject(m))
        return hr_error(HR_ERR_FORMAT, "%s: '__metadata__' must be an object of strings", label);
    size_t n = (size_t)cJSON_GetArraySize(m);
    h->meta = calloc(n ? n : 1, sizeof *h->meta);
    if (!h->meta) return hr_error(HR_ERR_OOM, "%s: out of memory reading '__metadata__'", label);
    for (const cJSON *kv = m->child; kv; kv = kv->next) {
        char esc[96];
        if (!cJSON_IsString(kv))
            return hr_error(HR_ERR_FORMAT, "%s: '__metadata__': value of '%s' must be a string",
                            label, hr_str_escape(kv->string, strlen(kv->string), esc, sizeof esc));
        char *k = strdup(kv->string), *v = strdup(kv->valuestring);
        if (!k || !v) {
            free(k), free(v);
            return hr_error(HR_ERR_OOM, "%s: out of memory reading '__metadata__'", label);
        }
        h->meta[h->n_meta++] = (hr_kv){k, v};
    }
    return HR_OK;
}

static int entry_by_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int entry_by_offset(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int kv_by_key(const void *a, const void *b) {
    return strcmp(((const hr_kv *)a)->key, ((const hr_kv *)b)->key);
}

/* Names sorted; now duplicates are neighbours, and overlaps are neighbours
 * once sorted by offset. */
static hr_status st_check_layout(const char *label, st_header *h) {
    for (size_t i = 1; i < h->n; i++)
        if (!strcmp(h->entries[i - 1].name, h->entries[i].name))
            return hr_error(HR_ERR_FORMAT, "%s: duplicate tensor name '%s'", label,
                            h->entries[i].name);
    for (size_t i = 1; i < h->n_meta; i++)
        if (!strcmp(h->meta[i - 1].key, h->meta[i].key))
            return hr_error(HR_ERR_FORMAT, "%s: '__metadata__': duplicate key '%s'", label,
                            h->meta[i].key);
    if (h->n < 2) return HR_OK;
    st_entry **order = malloc(h->n * sizeof *order);
    if (!order) return hr_error(HR_ERR_OOM, "%s: out of memory checking offsets", label);
    for (size_t i = 0; i < h->n; i++) order[i] = &h->entries[i];
    qsort(order, h->n, sizeof *order, entry_by_offset);
    hr_status s = HR_OK;
    for (size_t i = 1; i < h->n && s == HR_OK; i++) {
        const st_entry *a = order[i - 1], *b = order[i];
        if (b->begin < a->end)
            s = hr_error(HR_ERR_FORMAT,
                         "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", label,
                         a->name, (unsigned long long)a->begin, (unsigned long long)a->end,
                         b->name, (unsigned long long)b->begin, (unsigned long long)b->end);
    }
    free(order);
    return s;
}

static hr_status st_name(const char *label, const cJSON *item, size_t index, char **out) {
    size_t len = strlen(item->string);
    if (!hr_utf8_valid((const uint8_t *)item->string, len)) {
        char esc[96];
        return hr_error(HR_ERR_FORMAT, "%s: tensor name #%zu \"%s\" is not valid UTF-8", label,
                        index, hr_str_escape(item->string, len, esc, sizeof esc));
    }
    *out = strdup(item->string);
    return *out ? HR_OK : hr_error(HR_ERR_OOM, "%s: out of memory", label);
}

static hr_status st_parse_json(const char *label, const cJSON *root, st_header *h) {
    if (!cJSON_IsObject(root))
        return hr_error(HR_ERR_FORMAT, "%s: header must be a JSON object", label);
    size_t n = (size_t)cJSON_GetArraySize(root);
    HR_TRY(hr_mem_check((size_t)n * sizeof *h->entries, label));
    h->entries = calloc(n ? n : 1, sizeof *h->entries);
    if (!h->entries) return hr_error(HR_ERR_OOM, "%s: out of memory for %zu entries", label, n);
    size_t index = 0;
    for (const cJSON *item = root->child; item; item = item->next, index++) {
        if (!strcmp(item->string, "__metadata__")) {
            if (h->meta)
                return hr_error(HR_ERR_FORMAT, "%s: duplicate '__metadata__'", label);
            HR_TRY(st_metadata(label, item, h));
            continue;
        }
        st_entry *e = &h->entries[h->n];
        HR_TRY(st_name(label, item, index, &e->name));
        h->n++;
        HR_TRY(st_entry_parse(label, item, h->data_size, e));
    }
    qsort(h->entries, h->n, sizeof *h->entries, entry_by_name);
    if (h->n_meta) qsort(h->meta, h->n_meta, sizeof *h->meta, kv_by_key);
    return st_check_layout(label, h);
}

hr_status hr_st_parse(const char *label, const uint8_t *buf, size_t size, st_header *out) {
    memset(out, 0, sizeof *out);
    if (size < 8)
        return hr_error(HR_ERR_FORMAT,
                        "%s: %zu bytes is too short for a safetensors file (8-byte header "
                        "length missing)",
                        label, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > size - 8)
        return hr_error(HR_ERR_FORMAT,
                        "%s: header length %llu exceeds the %zu bytes that follow it (truncated "
                        "or not a safetensors file)",
                        label, (unsigned long long)hlen, size - 8);
    if (hlen > HR_ST_MAX_HEADER)
        return hr_error(HR_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit", label,
                        (unsigned long long)hlen);
    if (hlen < 2 || buf[8] != '{')
        return hr_error(HR_ERR_FORMAT, "%s: header does not start with '{' (not a safetensors file)",
                        label);
    out->data_start = 8 + hlen;
    out->data_size = size - out->data_start;
    const char *text = (const char *)buf + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - text) : 0;
        return hr_error(HR_ERR_FORMAT, "%s: header is not valid JSON (near byte %zu of %llu)", label,
                        at, (unsigned long long)hlen);
    }
    /* Only the writer's space padding may follow the object. */
    for (const char *p = end; p < text + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return hr_error(HR_ERR_FORMAT, "%s: header has trailing bytes after the JSON object",
                            label);
        }
    }
    hr_status s = st_parse_json(label, root, out);
    /* Names were checked one by one; this catches bad bytes elsewhere
     * (dtype strings, metadata). */
    if (s == HR_OK && !hr_utf8_valid((const uint8_t *)text, (size_t)hlen))
        s = hr_error(HR_ERR_FORMAT, "%s: header is not valid UTF-8", label);
    cJSON_Delete(root);
    if (s != HR_OK) hr_st_header_free(out);
    return s;
}

void hr_st_header_free(st_header *h) {
    for (size_t i = 0; i < h->n; i++) free(h->entries[i].name);
    for (size_t i = 0; i < h->n_meta; i++) {
        free((char *)h->meta[i].key);
        free((char *)h->meta[i].value);
    }
    free(h->entries);
    free(h->meta);
    memset(h, 0, sizeof *h);
}

long hr_st_find(const st_header *h, const char *name) {
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(h->entries[mid].name, name);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}
