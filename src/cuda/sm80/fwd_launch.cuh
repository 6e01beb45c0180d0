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
  using T = sm80::FwdTraits<kHeadDim, Element, tile.block_n, tile.warps, tile.m_tiles, tile.stages, tile.q_in_regs,
                            tile.min_ctas>;
  auto kernel = p.softcap > 0.f ? sm80::forward_kernel<T, true> : sm80::forward_kernel<T, false>;
  // Above 48 KB a kernel must opt in to its dynamic shared memory.
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
        "cudaFuncSetAttribute(forward, shared memory)");
  int device = 0, l2_bytes = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
  const TileScheduler sched = make_tile_scheduler(p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.batch,
                                                  p.window_right, T::kBlockM, kHeadDim, int(sizeof(Element)), l2_bytes);
  const int64_t tiles = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM * p.heads_q * p.batch;
  if (tiles == 0) return;
  // Tile indices are int (one CTA each); reaching this needs about 2^38 query rows.
  if (tiles > int64_t(INT32_MAX))
    throw Error(Status::unsupported, "forward: " + std::to_string(tiles) + " query tiles of " +
                                         std::to_string(T::kBlockM) + " rows exceed the portable kernel's 2^31 - 1");
  kernel<<<unsigned(tiles), T::kThreads, T::kSmemBytes, stream>>>(p, sched);
  check_launch("flashattn forward kernel (portable path)");
}

}  // namespace flashattn::cuda
