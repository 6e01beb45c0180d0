// Host launcher of the portable forward kernel for one (head dim, dtype, target arch). Included
// only by the generated instantiation files (src/cuda/instantiations/), one variant per file.
#pragma once

#include "cuda/common.cuh"
#include "cuda/forward.h"
#include "cuda/sm80/fwd_kernel.cuh"

namespace flashattn::cuda {

template <int kHeadDim, class Element, int kArch>
void run_forward_portable(const core::ForwardParams& p, cudaStream_t stream) {
  constexpr PortableFwdTile tile = portable_fwd_tile<kArch>(kHeadDim);
  using T = sm80::FwdTraits<kHeadDim, Element, tile.block_n, tile.warps, tile.m_tiles, tile.stages, tile.q_in_regs>;
  auto kernel = p.softcap > 0.f ? sm80::forward_kernel<T, true> : sm80::forward_kernel<T, false>;
  // Above 48 KB a kernel must opt in to its dynamic shared memory.
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
        "cudaFuncSetAttribute(forward, shared memory)");
  dim3 grid(unsigned((p.seqlen_q + T::kBlockM - 1) / T::kBlockM), unsigned(p.heads_q), unsigned(p.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
  check_launch("flashattn forward kernel (portable path)");
}

}  // namespace flashattn::cuda
