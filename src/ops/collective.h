/* The process group the collective ops (all_reduce, all_gather) run over.
 *
 * dist/ joins the group (MPI) and installs its exchange here; the devices'
 * collective kernels call it. The interface lives in ops/ because devices
 * and dist/ are siblings that know nothing of each other (src/layers.txt).
 * Without an installed group a process is a group of one. */
#ifndef HR_OPS_COLLECTIVE_H
#define HR_OPS_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "hubrt/base.h"

typedef struct hr_collectives {
    int rank, size;
    /* out receives counts[r] bytes of rank r at byte displs[r], for every
     * rank; this rank's `bytes` bytes of in are its own count. Errors
     * (a deadline missed, a transport failure) name the exchange. */
    hr_status (*all_gather)(const void *in, size_t bytes, void *out, const size_t *counts, const size_t *displs);
    /* buf's `bytes` bytes from rank root into every rank's buf */
    hr_status (*broadcast)(void *buf, size_t bytes, int root);
} hr_collectives;

/* Installs c (NULL: back to a group of one); c must outlive its use. */
void hr_collectives_install(const hr_collectives *c);
/* The installed group, or NULL for a group of one. */
const hr_collectives *hr_collectives_current(void);

/* Part r of `total` split over `parts` as evenly as can be: rows
 * [total r / parts, total (r + 1) / parts). Tensor-parallel slices and
 * all_gather's parts agree through it. */
static inline void hr_split_part(int64_t total, int64_t parts, int64_t r, int64_t *first, int64_t *len) {
    int64_t a = total * r / parts, b = total * (r + 1) / parts;
    *first = a;
    *len = b - a;
}

#endif
