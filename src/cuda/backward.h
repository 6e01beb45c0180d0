// The backward variants the build compiled and the dispatcher that picks one at run time.
#pragma once

#include <cuda_runtime.h>

#include "core/params.h"

namespace flashattn::cuda {

template <int kHeadDim, class Element, int kArch>
void run_backward_portable(const core::BackwardParams& p, cudaStream_t stream);

// The sm90a path (TMA + wgmma); false when the driver rejects a tensor layout (nothing has run).
template <int kHeadDim, class Element, int kArch>
bool run_backward_hopper(const core::BackwardParams& p, cudaStream_t stream);

// dK = dV = 0 over every sequence's key rows, for a call with no query rows (bwd_no_queries.cu).
void zero_key_gradients(const core::BackwardParams& p, cudaStream_t stream);

void dispatch_backward(const core::BackwardParams& p, int cc, cudaStream_t stream);

}  // namespace flashattn::cuda
