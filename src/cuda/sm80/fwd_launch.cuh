// Host launcher of the portable forward kernel for one (head dim, dtype, target arch). Included
// only by the generated instantiation files (src/cuda/instantiations/), one variant per file.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/forward.h"
#include "cuda/sm80/fwd_kernel.cuh"

namespace flashattn::cuda {

template <class T>
void launch_forward_portable(const core::ForwardParams& p, cudaStream_t stream) {
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

// The kernel shape of the tile table's entry (portable_fwd_tile).
template <int kHeadDim, class Element, int kArch, bool kRightBound, bool kLargeSmem>
struct PortableFwdShape {
  static constexpr PortableFwdTile t = portable_fwd_tile<kArch>(kHeadDim, kRightBound, kLargeSmem);
  using Traits = sm80::FwdTraits<kHeadDim, Element, t.block_n, t.warps, t.m_tiles, t.stages, t.q_in_regs, 1, t.d_split,
                                     t.stage_o>;
};

template <int kHeadDim, class Element, int kArch>
void run_forward_portable(const core::ForwardParams& p, cudaStream_t stream) {
  // A right bound (causal, windows) has its own tile where the table gives one (tile_size.h); sm80
  // builds take the large entry where this GPU gives a block the shared memory it needs.
  auto run = [&](auto right_bound) {
    constexpr bool kBound = decltype(right_bound)::value;
    using Small = typename PortableFwdShape<kHeadDim, Element, kArch, kBound, false>::Traits;
    if constexpr (kArch < 90) {
      using Large = typename PortableFwdShape<kHeadDim, Element, kArch, kBound, true>::Traits;
      if constexpr (!std::is_same_v<Large, Small>)
        if (takes_large_entry(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin), Large::kSmemBytes))
          return launch_forward_portable<Large>(p, stream);
    }
    launch_forward_portable<Small>(p, stream);
  };
  if (p.window_right >= 0)
    run(std::true_type{});
  else
    run(std::false_type{});
}

}  // namespace flashattn::cuda
