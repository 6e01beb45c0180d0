// Host launcher of the portable forward kernel for one (head dim, dtype, target arch). Included
// only by the generated instantiation files (src/cuda/instantiations/), one variant per file.
#pragma once

#include <cstdint>
#include <string>

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
  const TileScheduler sched = make_tile_scheduler(p, T::kBlockM, current_device_attribute(cudaDevAttrL2CacheSize));
  const int64_t tiles = int64_t(sched.num_m_blocks) * sched.heads * sched.batch;
  if (tiles == 0) return;
  // Tile indices are int (one CTA each); reaching this needs about 2^38 query rows.
  if (tiles > int64_t(INT32_MAX))
    throw Error(Status::unsupported, "forward: " + std::to_string(tiles) + " query tiles of " +
                                         std::to_string(T::kBlockM) + " rows exceed the portable kernel's 2^31 - 1");
  kernel<<<unsigned(tiles), T::kThreads, T::kSmemBytes, stream>>>(p, sched);
  check_launch("flashattn forward kernel (portable path)");
}

}  // namespace flashattn::cuda
