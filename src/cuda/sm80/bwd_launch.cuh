// Host launcher of the portable backward for one (head dim, dtype, target arch): workspace,
// preprocess, main and convert kernels on the caller's stream. Included only by the generated
// instantiation files (src/cuda/instantiations/) and the tile sweep (bench/bwd_tile_sweep.cu).
#pragma once

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>

#include "cuda/backward.h"
#include "cuda/bwd_layout.h"
#include "cuda/common.cuh"
#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/tile_scheduler.h"
#include "cuda/tile_size.h"

namespace flashattn::cuda {

// The whole backward with the kernel shape T (sm80::BwdTraits).
template <class T>
void launch_backward_portable(const core::BackwardParams& p, cudaStream_t stream) {
  using Element = typename T::Element;
  const int smem_optin = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  const int sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
  if (smem_optin < T::kSmemBytes)
    throw Error(Status::unsupported, "backward: head_dim " + std::to_string(p.head_dim) + " needs " +
                                         std::to_string(T::kSmemBytes / 1024) + " KB of shared memory per block, this GPU offers " +
                                         std::to_string(smem_optin / 1024) + " KB");

  // The kernel counts a key tile's steps (query tiles x grouped heads) and offsets dQ rows within
  // a query tile in 32 bits (bwd_kernel.cuh).
  if ((p.seqlen_q + T::kBlockM - 1) / T::kBlockM * p.group() > INT32_MAX ||
      p.heads_q * p.head_dim * T::kBlockM > INT32_MAX)
    throw Error(Status::unsupported, "backward: seqlen_q " + std::to_string(p.seqlen_q) + " with " +
                                         std::to_string(p.heads_q) + " query heads exceeds the portable kernel's 32-bit step counts");

  auto pick = [&](auto softcap) {
    constexpr bool kSoftcap = decltype(softcap)::value;
    return p.deterministic ? sm80::backward_kernel<T, kSoftcap, true> : sm80::backward_kernel<T, kSoftcap, false>;
  };
  auto kernel = p.softcap > 0.f ? pick(std::true_type{}) : pick(std::false_type{});
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
        "cudaFuncSetAttribute(backward, shared memory)");
  const int64_t n_blocks = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  const int64_t query_tiles = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  // Deterministic mode: the key tiles visiting a query tile take turns adding into it, in the order
  // turn_order picks for this grid (bwd_layout.h says which and why); `around` only where a
  // sequence's key tiles fit twice over in the CTAs the GPU holds at once.
  BwdWorkspace ws;
  ws.tiles_per_head = tiles_per_head(p, T::kBlockM);
  // The CTAs the GPU holds at once (for the turn order, and the default mode's cut tail below).
  auto resident_ctas = [&] {
    int per_sm = 1;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, T::kThreads, T::kSmemBytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return int64_t(sms) * std::max(per_sm, 1);
  };
  TurnOrder turns = TurnOrder::down;
  if (p.deterministic) turns = turn_order(p.window_left, p.window_right, n_blocks, query_tiles, resident_ctas());
  const int64_t rows = p.total_q * p.heads_q;
  // The accumulator in fragment order where the table says, whole blocks per query tile
  // (sm80::FragmentDq); else dQ's rows.
  const size_t accum_bytes = T::kFragmentDq ? size_t(p.heads_q * ws.tiles_per_head) * T::kBlockM * T::kHeadDim * 4
                                            : size_t(rows * p.head_dim) * 4;
  const int64_t key_tiles = n_blocks * p.heads_kv * p.batch;
  // The cut tail (tile_scheduler.h, plan_tail_pieces) within 64 MB of partial dK and dV.
  const int64_t piece_bytes = int64_t(2) * T::kBlockN * T::kHeadDim * 4;  // a piece's fp32 dK and dV
  TailPieces tail;
  if (!p.deterministic && p.window_left < 0 && p.window_right < 0 && p.cu_seqlens_q == nullptr)
    tail = plan_tail_pieces(key_tiles, query_tiles, resident_ctas(), piece_bytes, int64_t(64) << 20);
  // The turn counters (deterministic mode) follow the dQ accumulator and are zeroed with it; the
  // cut tiles' partial dK and dV (default mode) take their place, not zeroed.
  const size_t turn_bytes = p.deterministic ? size_t(p.heads_q * ws.tiles_per_head) * 4 : 0;
  const size_t tail_bytes = size_t(tail.tiles * tail.parts * piece_bytes);
  const WorkspaceMemory memory(workspace_bytes(rows, accum_bytes + turn_bytes + tail_bytes), stream);
  start_backward<Element>(p, ws, memory, rows, accum_bytes + turn_bytes, stream);
  unsigned char* after_accum = reinterpret_cast<unsigned char*>(ws.dq_accum) + accum_bytes;
  if (p.deterministic) ws.dq_turn = reinterpret_cast<int*>(after_accum);
  if (tail.parts > 0) {
    ws.tail_dp_tiles = int(key_tiles - tail.tiles);
    ws.tail_parts = tail.parts;
    ws.tail_partial = reinterpret_cast<float*>(after_accum);
  }
  const unsigned hq = unsigned(p.heads_q), batch = unsigned(p.batch);
  // The default mode's key tiles under a right bound: longest first in L2 sections, as on the
  // Hopper path (bwd_kernel.cuh says why).
  const TileScheduler order =
      make_key_tile_order(p, n_blocks, p.head_dim, p.deterministic, current_device_attribute(cudaDevAttrL2CacheSize));

  if (tail.parts > 0) {
    kernel<<<unsigned(ws.tail_dp_tiles + tail.tiles * tail.parts), T::kThreads, T::kSmemBytes, stream>>>(p, ws, turns, order);
    check_launch("flashattn backward kernel (portable path)");
    const dim3 merge_grid(unsigned(tail.tiles), unsigned(sm80::tail_merge_chunks<T>()));
    sm80::backward_tail_merge_kernel<T><<<merge_grid, sm80::kMergeThreads, 0, stream>>>(p, ws, order);
    check_launch("flashattn backward tail merge kernel (portable path)");
  } else if (n_blocks > 0) {
    kernel<<<dim3(unsigned(n_blocks), unsigned(p.heads_kv), batch), T::kThreads, T::kSmemBytes, stream>>>(p, ws, turns,
                                                                                                         order);
    check_launch("flashattn backward kernel (portable path)");
  }

  if constexpr (T::kFragmentDq) {
    sm80::backward_convert_dq_fragment_kernel<T>
        <<<dim3(unsigned(query_tiles), hq, batch), 128, 0, stream>>>(p, ws);
  } else {
    const int64_t chunks = p.head_dim / 8;
    sm80::backward_convert_dq_kernel<Element>
        <<<dim3(unsigned((p.seqlen_q * chunks + 127) / 128), hq, batch), 128, 0, stream>>>(p, ws);
  }
  check_launch("flashattn backward dq conversion kernel");
}

// The kernel shape of the tile table's entry (portable_bwd_tile).
template <int kHeadDim, class Element, int kArch, bool kLargeSmem>
struct PortableBwdShape {
  static constexpr PortableBwdTile tile = portable_bwd_tile<kArch>(kHeadDim, kLargeSmem);
  using Traits = sm80::BwdTraits<kHeadDim, Element, tile.block_n, tile.warps, tile.stages, tile.key_warps_s,
                                 tile.key_warps_kv, tile.row_warps_q, tile.min_ctas, tile.block_m, tile.fragment_dq,
                                 tile.stmatrix_ps>;
};

template <int kHeadDim, class Element, int kArch>
void run_backward_portable(const core::BackwardParams& p, cudaStream_t stream) {
  using Small = typename PortableBwdShape<kHeadDim, Element, kArch, false>::Traits;
  if constexpr (kArch < 90) {
    // sm80 builds: the large entry where this GPU gives a block the shared memory it needs.
    using Large = typename PortableBwdShape<kHeadDim, Element, kArch, true>::Traits;
    if constexpr (!std::is_same_v<Large, Small>)
      if (takes_large_entry(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin), Large::kSmemBytes))
        return launch_backward_portable<Large>(p, stream);
  }
  launch_backward_portable<Small>(p, stream);
}

}  // namespace flashattn::cuda
