/* The kernels lock file: per repository the revision, variant and every
 * file's sha256 that were accepted (hr_kernel_lock writes it), so a later
 * load takes those bytes or nothing (docs/kernels.md). JSON:
 * {"kernels": {"org/name": {"revision": ..., "variant": ..., "files":
 * {"name": "sha256", ...}}}}. */
#ifndef HR_KERNELS_KERNEL_LOCK_H
#define HR_KERNELS_KERNEL_LOCK_H

#include "hubrt/kernels.h"
#include "kernels/kernel_meta.h"

/* The entry of info->repo in the lock at path against what was found:
 * errors name the file and what differs. */
hr_status hr_kernel_lock_check(const char *path, const hr_kernel_info *info, const hr_kernel_meta *m);
/* Sets the entry of info->repo (the file written whole through a rename). */
hr_status hr_kernel_lock_write(const char *path, const hr_kernel_info *info, const hr_kernel_meta *m);

#endif
