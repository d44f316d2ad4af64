/* The GNU build ID of the binary that holds this code (libhubrt.so, or the
 * executable hubrt is linked into): a hash the linker computes over the
 * whole output, so any change to the code, the model code included,
 * changes it. Compiled plans on disk are keyed by it, not only by the
 * version string, which stays the same across development builds. */
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "hubrt/runtime.h"

static char g_build_id[2 * 64 + 1];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Copies the NT_GNU_BUILD_ID of one PT_NOTE segment, in hex; true when found. */
static bool read_note(const char *p, size_t size, size_t align) {
    size_t at = 0;
    while (at + sizeof(ElfW(Nhdr)) <= size) {
        const ElfW(Nhdr) *n = (const ElfW(Nhdr) *)(const void *)(p + at);
        size_t name = at + sizeof *n, desc = name + align_up(n->n_namesz, align);
        size_t next = desc + align_up(n->n_descsz, align);
        if (next > size || next <= at) return false;
        if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && !memcmp(p + name, "GNU", 4) && n->n_descsz > 0 &&
            n->n_descsz <= 64) {
            static const char hex[] = "0123456789abcdef";
            const unsigned char *d = (const unsigned char *)p + desc;
            for (size_t i = 0; i < n->n_descsz; i++) {
                g_build_id[2 * i] = hex[d[i] >> 4];
                g_build_id[2 * i + 1] = hex[d[i] & 15];
            }
            g_build_id[2 * n->n_descsz] = '\0';
            return true;
        }
        at = next;
    }
    return false;
}

/* dl_iterate_phdr callback: in the object whose loaded segments hold
 * `arg` (an address of this file's code), reads the build ID; stops there. */
static int visit(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    uintptr_t addr = (uintptr_t)arg;
    bool mine = false;
    for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        mine = ph->p_type == PT_LOAD && addr >= lo && addr - lo < ph->p_memsz;
    }
    if (!mine) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_NOTE &&
            read_note((const char *)(info->dlpi_addr + ph->p_vaddr), ph->p_filesz, ph->p_align == 8 ? 8 : 4))
            break;
    }
    return 1;
}

static void find_build_id(void) { dl_iterate_phdr(visit, (void *)(uintptr_t)&find_build_id); }

const char *hr_build_id(void) {
    pthread_once(&g_once, find_build_id);
    return g_build_id;
}
