// The forward variants the build compiled (one explicit instantiation per generated file) and the
// dispatcher that picks one at run time.
#pragma once

#include <cuda_runtime.h>

#include "core/params.h"

namespace flashattn::cuda {

template <int kHeadDim, class Element, int kArch>
void run_forward_portable(const core::ForwardParams& p, cudaStream_t stream);

// The sm90a path; returns false (launching nothing) when the driver rejects a TMA map.
template <int kHeadDim, class Element, int kArch>
bool run_forward_hopper(const core::ForwardParams& p, cudaStream_t stream);

// Picks the kernel for p on the current device (compute capability `cc`, e.g. 90) and launches it.
void dispatch_forward(const core::ForwardParams& p, int cc, cudaStream_t stream);

}  // namespace flashattn::cuda
