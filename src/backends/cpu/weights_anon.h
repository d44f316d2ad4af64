/* The CPU device's weight preparation (prepare_weights): weights copied
 * out of the checkpoint's file map into anonymous huge-page memory, linear
 * ones packed for the panel kernels (weights_anon.c). */
#ifndef HR_BACKENDS_CPU_WEIGHTS_ANON_H
#define HR_BACKENDS_CPU_WEIGHTS_ANON_H

#include "device/device_impl.h"

/* Unless HUBRT_WEIGHTS=mmap: every weight that views the files goes to one
 * anonymous mapping (packed when linear, HUBRT_PACK_WEIGHTS=0 aside), and
 * weights the loader made get packed copies where they fit. A tied head
 * aliasing a moved embedding is the caller's to redo. */
hr_status hr_cpu_prepare_weights(hr_device *dev, hr_weight_ref *w, size_t n, const hr_weight_source *src);

#endif
