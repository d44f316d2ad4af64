/* Experts implementations from outside the library (kernel libraries the
 * kernel hub loaded: src/kernels/), by id: the experts op's attr `impl`
 * names one, and the device's kernel calls it. Ids are the kernel's
 * identity hashed (hr_kernel), so a compiled plan on disk that names one
 * finds it again in another process that loaded the same kernel. */
#ifndef HR_OPS_EXPERTS_IMPL_H
#define HR_OPS_EXPERTS_IMPL_H

#include "hubrt/kernel_abi.h"
#include "hubrt/ops.h"

typedef int (*hr_experts_fn)(const hr_kernel_experts_args *a);

/* Registers fn as implementation `id` (nonzero; the same id again keeps
 * the first registration). At most 64. */
hr_status hr_experts_impl_register(int64_t id, const char *name, hr_experts_fn fn);
/* The implementation registered as id (and its name), or NULL. */
hr_experts_fn hr_experts_impl_find(int64_t id, const char **name);

#endif
