/* HUBRT_PROFILE=1: time per op kind, for eager dispatch and compiled
 * replay alike, printed to stderr at exit (most expensive first). */
#ifndef HR_OPS_PROFILE_H
#define HR_OPS_PROFILE_H

#include <stdbool.h>

#include "hubrt/ops.h"

bool hr_profile_enabled(void);
double hr_profile_now(void);
/* Adds one call of `op` that took `seconds`. */
void hr_profile_add(hr_op op, double seconds);
/* Adds the time one eager op spent in dispatch around its kernel
 * (validation, inference, output allocation, capture hooks). */
void hr_profile_add_dispatch(double seconds);

#endif
