/* hubrt: run Hugging Face models natively, in C. The whole public API. */
#ifndef HUBRT_H
#define HUBRT_H

#include "hubrt/base.h"
#include "hubrt/tensor.h"
#include "hubrt/ops.h"
#include "hubrt/runtime.h"
#include "hubrt/graph.h"
#include "hubrt/io.h"
#include "hubrt/hub.h"
#include "hubrt/tokenizer.h"
#include "hubrt/chat.h"
#include "hubrt/dist.h"
#include "hubrt/model.h"
#include "hubrt/image_models.h"
#include "hubrt/diffusion.h"
#include "hubrt/kernel_abi.h"
#include "hubrt/kernels.h"

#endif
