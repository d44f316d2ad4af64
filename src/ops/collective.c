/* The installed process group (collective.h). */
#include "ops/collective.h"

#include <stdatomic.h>

static _Atomic(const hr_collectives *) g_group;

void hr_collectives_install(const hr_collectives *c) { atomic_store(&g_group, c); }

const hr_collectives *hr_collectives_current(void) { return atomic_load(&g_group); }
