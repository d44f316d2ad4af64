/* hubrt file formats: safetensors, config.json (public API). */
#ifndef HUBRT_IO_H
#define HUBRT_IO_H

#include "tensor.h"

#endif
