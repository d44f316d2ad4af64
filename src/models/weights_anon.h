/* Model weights moved out of the checkpoint's file map into anonymous
 * memory with transparent huge pages (weights_anon.c). */
#ifndef HR_MODELS_WEIGHTS_ANON_H
#define HR_MODELS_WEIGHTS_ANON_H

#include "models/model_impl.h"

/* Copies every weight of `m` that is a view of its checkpoint's files into
 * one anonymous mapping, unless HUBRT_WEIGHTS=mmap; CPU models only. */
hr_status hr_model_weights_to_anon(hr_model *m);

#endif
