/* safetensors internals shared by the reader, the writer, the checkpoint
 * loader and the fuzz target (which parses headers straight from memory). */
#ifndef HR_IO_ST_INTERNAL_H
#define HR_IO_ST_INTERNAL_H

#include "hubrt/io.h"

/* The reference implementation refuses headers over 100 MB. */
#define HR_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct st_entry {
    char *name;                 /* valid UTF-8, NUL-free */
    hr_dtype dtype;
    int ndim;
    int64_t shape[HR_MAX_DIMS];
    uint64_t begin, end;        /* byte range in the data section */
} st_entry;

/* A validated header. */
typedef struct st_header {
    st_entry *entries;          /* [n], sorted by name */
    size_t n;
    hr_kv *meta;                /* [n_meta], sorted by key; strings owned */
    size_t n_meta;
    uint64_t data_start;        /* 8 + header length: file offset of the data */
    uint64_t data_size;         /* bytes after data_start */
} st_header;

/* Parses and validates the header of a safetensors image of `size` bytes at
 * `buf` (only the first 8 + header-length bytes are read; `size` bounds the
 * data section). `label` (the file name) starts every message. On failure
 * *out is left empty. */
hr_status hr_st_parse(const char *label, const uint8_t *buf, size_t size, st_header *out);
void hr_st_header_free(st_header *h);
/* Index of `name` in h->entries, or -1. */
long hr_st_find(const st_header *h, const char *name);

/* When [p, p + n) lies in the file map of `st` (of a shard of `ck`), drops
 * the pages it touches from this process (MADV_DONTNEED: a page read again
 * comes back from the file; one written through the private map loses
 * that write) and returns true; otherwise does nothing and returns false.
 * n == 0 only asks. For a loader that copied those bytes elsewhere. */
bool hr_safetensors_drop_pages(const hr_safetensors *st, const void *p, size_t n);
bool hr_checkpoint_drop_pages(const hr_checkpoint *ck, const void *p, size_t n);
/* Drops the pages of tensor `name`'s stored bytes (as
 * hr_safetensors_drop_pages; in a GGUF file, hr_gguf_drop_tensor; nothing
 * for an unknown name): for the loader, once the tensor was cast or
 * dequantized and nothing reads the file's bytes of it again. */
void hr_safetensors_drop_tensor(const hr_safetensors *st, const char *name);
void hr_checkpoint_drop_tensor(const hr_checkpoint *ck, const char *name);
/* hr_checkpoint_drop_tensor for every tensor: for a model whose weights all
 * went to a device, so that pages the kernel mapped back around later reads
 * (fault-around) go too. */
void hr_checkpoint_drop_all(const hr_checkpoint *ck);
/* Bytes tensor `name` takes in its file (a GGUF tensor's quantized blocks,
 * where hr_checkpoint_info gives its size dequantized to f32); 0 when
 * there is none of that name. */
size_t hr_checkpoint_stored_bytes(const hr_checkpoint *ck, const char *name);

/* A whole file mapped private and writable (a write to a tensor viewing it
 * copies that page, never reaching the file), counted: its opener holds
 * one reference, each tensor viewing its bytes another, and the last
 * hr_io_map_release unmaps it. An empty file has no mapping (addr NULL). */
typedef struct hr_io_map {
    _Atomic int refs;
    void *addr;
    size_t len;
    const void *owner; /* a range map's reader (hr_io_map_range), for hr_io_range_owned */
} hr_io_map;

/* Opens regular file `path` for reading into *fd and its size (errors
 * name it: missing, a folder, unreadable). */
hr_status hr_io_open_regular(const char *path, int *fd, uint64_t *size);
/* Maps bytes [offset, offset + len) of the open file fd (`path` names it
 * in errors), from the page that holds offset: *data points at offset.
 * The map is counted as a whole-file one is, and known as `owner`'s
 * while it lives. */
hr_status hr_io_map_range(int fd, const char *path, uint64_t offset, size_t len, const void *owner, hr_io_map **out,
                          void **data);
/* len bytes of anonymous memory counted and known as owner's as a range
 * map is: a slice copied out of a file (hr_safetensors_rows), which the
 * loader then treats as the file's bytes (packs or copies it, and drops
 * its pages: a dropped page reads back as zeros, not as the file, so only
 * bytes nothing reads again are dropped). */
hr_status hr_io_map_anon(size_t len, const void *owner, const char *what, hr_io_map **out);
/* Whether [p, p + n) lies in a live range map of `owner` (a loader asking
 * whether a weight views a file, whose pages it may drop). */
bool hr_io_range_owned(const void *owner, const void *p, size_t n);
/* owner's range maps are no longer its (it closed; they live on in the
 * tensors over them). */
void hr_io_range_disown(const void *owner);
/* Reads len bytes at offset of fd into dst (a short file is an error). */
hr_status hr_io_pread(int fd, const char *path, uint64_t offset, void *dst, size_t len);

/* A safetensors file opened by ranges: its header read, nothing mapped;
 * each tensor asked for maps its own bytes alone. For a process that
 * holds slices of a checkpoint (a tensor-parallel rank), whose address
 * space then holds its slices only. */
hr_status hr_safetensors_open_ranged(const char *path, hr_safetensors **out);
/* Rows [first, first + len) of dim `dim` of tensor `name`: for dim 0 a
 * view of those bytes alone (mapped by range in a ranged file); for a
 * later dim a host copy read segment by segment, nothing else read. */
hr_status hr_safetensors_rows(const hr_safetensors *st, const char *name, int dim, int64_t first, int64_t len,
                              hr_tensor **out);
/* A checkpoint whose safetensors shards are opened by ranges. */
hr_status hr_checkpoint_open_ranged(const char *path, hr_checkpoint **out);
/* hr_safetensors_rows on the shard that holds `name` (safetensors only). */
hr_status hr_checkpoint_rows(const hr_checkpoint *ck, const char *name, int dim, int64_t first, int64_t len,
                             hr_tensor **out);

/* Maps regular file `path` (errors name it: missing, a folder, unmappable). */
hr_status hr_io_map_file(const char *path, hr_io_map **out);
void hr_io_map_retain(hr_io_map *m);
/* Drops one reference (a tensor release callback: ctx is the map). */
void hr_io_map_release(void *ctx);

/* madvise(advice) on the pages [p, p + n) touches (nothing when n is 0):
 * readahead, or dropping pages of a file map nothing reads again. */
void hr_io_advise(const void *p, size_t n, int advice);

/* Reads a whole file of at most `max` bytes into a NUL-terminated malloc'd
 * buffer (*len excludes the NUL). */
hr_status hr_io_read_file(const char *path, size_t max, char **out, size_t *len);

/* True when `s[0..n)` is well-formed UTF-8 (no overlongs, surrogates or
 * code points past U+10FFFF). */
bool hr_utf8_valid(const uint8_t *s, size_t n);
/* Copies `s` into buf for a message, bytes outside printable ASCII as \xNN,
 * cut at n-1 characters. Returns buf. */
char *hr_str_escape(const char *s, size_t len, char *buf, size_t n);

#endif
