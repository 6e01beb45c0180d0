// Host launcher of the Hopper backward for one (head dim, dtype): tensor maps, workspace in the
// tiled layout (src/cuda/bwd_common.cuh), preprocess, main and convert kernels on the caller's
// stream. Included only by the generated instantiation files (src/cuda/instantiations/bwd_hopper_*).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/backward.h"
#include "cuda/common.cuh"
#include "cuda/sm90/bwd_convert.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_wide_kernel.cuh"
#include "cuda/sm90/tma.h"
#include "cuda/tile_size.h"

namespace flashattn::cuda {

// The kernel traits of one mode's tiles (hopper_bwd_tile). d <= 128: keys split between the
// consumer warpgroups; wider: columns (bwd_wide_kernel.cuh).
template <int kTileDim, class Element, bool kDeterministic>
struct HopperBwdTraits {
  static constexpr HopperBwdTile tile = hopper_bwd_tile(kTileDim, kDeterministic);
  using type = std::conditional_t<
      (kTileDim > 128),
      sm90::WideBwdTraits<kTileDim, Element>,
      sm90::BwdTraits<kTileDim, Element, tile.block_m, tile.stages, tile.dq_buffers, tile.dq_alternate>>;
  static_assert(type::kBlockM == tile.block_m && type::kStages == tile.stages,
                "the tile table and the kernel agree on the query tile and the stages");
};

// One mode's launch: kOrdered, the deterministic mode (p.deterministic; it may take other tiles
// than the default, hopper_bwd_tile), or the default mode.
template <int kHeadDim, class T, bool kOrdered>
bool launch_backward_hopper(const core::BackwardParams& p, cudaStream_t stream) {
  constexpr int kTileDim = T::kHeadDim;
  constexpr bool kWide = kTileDim > 128;
  constexpr int BM = T::kBlockM;

  // Maps first: if the driver rejects a layout, nothing has run and the portable path takes over.
  sm90::BwdParams P{};
  P.p = p;
  auto view = [&](const void* base, const core::Strides& s, int64_t heads, bool keys) {
    return sm90::tma_view(p, base, s, heads, kHeadDim, keys);
  };
  if (!sm90::encode_tma_sw128(&P.tq, view(p.q, p.q_s, p.heads_q, false), BM) ||
      !sm90::encode_tma_sw128(&P.tdo, view(p.dout, p.do_s, p.heads_q, false), BM) ||
      !sm90::encode_tma_sw128(&P.tk, view(p.k, p.k_s, p.heads_kv, true), T::kBlockN) ||
      !sm90::encode_tma_sw128(&P.tv, view(p.v, p.v_s, p.heads_kv, true), T::kBlockN))
    return false;

  const int sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
  const int64_t n_blocks = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  // Work tile indices are int (the dynamic draws run up to a grid past the last): beyond that the
  // portable path takes the call.
  if (n_blocks * p.heads_kv * p.batch > int64_t(INT32_MAX) - sms) return false;
  BwdWorkspace& ws = P.ws;
  ws.tile_m = BM;
  ws.tiles_per_head = tiles_per_head(p, BM);
  // Deterministic mode: one CTA per work tile; the key tiles that visit a query tile add their dQ
  // into it one after another, each waiting for its turn, in the order hopper_turn_order picks
  // (bwd_layout.h says which and why). At d = 256 a key tile takes two CTAs (one per column half,
  // each with turns of its own), so half as many key tiles fit on the GPU at once.
  const TurnOrder turns = kOrdered ? hopper_turn_order(p.window_left, p.window_right, T::kHeadDim, n_blocks,
                                                       (p.seqlen_q + BM - 1) / BM, kWide ? sms / 2 : sms)
                                   : TurnOrder::down;
  const int64_t rows = p.heads_q * ws.tiles_per_head * BM;
  const size_t accum_bytes = size_t(rows) * kTileDim * 4;
  // The turn counters follow the dQ accumulator and are zeroed with it.
  const size_t turn_bytes = kOrdered ? size_t(p.heads_q * ws.tiles_per_head) * (kWide ? 2 : 1) * 4 : 0;
  // The schedule (bwd_schedule.cuh). Work tiles in index order: longest first under a right bound,
  // heads in sections whose Q, dO (16-bit) and dQ accumulator (fp32) fill at most half the L2, so
  // the CTAs running at once share a few heads' query-side data.
  //   * default mode, d <= 128: a persistent grid, one CTA per SM, each drawing its next tile from
  //     a counter. Against one CTA per tile (H200, bf16, 16k tokens, hidden 2048, main kernel's
  //     device time, bench/kernel_times.py; bench/results/h200_bwd_persistent_2026-12-01.txt): d=128
  //     causal 2k 913 -> 859 us, d=64 causal 2k 1220 -> 1206 us.
  //   * the ordered deterministic mode: one CTA per tile, in index order (the order the hardware
  //     starts CTAs in), key tiles descending in the `up` order, else ascending; which CTAs a tile
  //     may wait for, and why that always finishes, is hopper_turn_order's comment (bwd_layout.h).
  //   * d = 256 (bwd_wide_kernel.cuh): two CTAs per key tile (one per half of the head dim) on
  //     the grid (2 x key tiles, KV heads, batch), read from blockIdx; it takes no schedule.
  sm90::BwdSchedule& sched = P.sched;
  sched.turns = turns;
  TileScheduler& order = sched.order;
  order = make_key_tile_order(p, n_blocks, kTileDim, kOrdered, current_device_attribute(cudaDevAttrL2CacheSize));
  // d = 256: the grid (2 x key tiles, KV heads, batch); else a 1-D grid over `order`.
  const int64_t tiles = kWide ? n_blocks : int64_t(order.num_tiles());
  const bool persistent = !kWide && !kOrdered;
  const bool dynamic = persistent && tiles > sms;
  const size_t counter_bytes = dynamic ? 16 : 0;
  const WorkspaceMemory memory(workspace_bytes(rows, accum_bytes + turn_bytes + counter_bytes), stream);
  start_backward<typename T::Element>(p, ws, memory, rows, accum_bytes + turn_bytes + counter_bytes, stream);
  unsigned char* after_accum = reinterpret_cast<unsigned char*>(ws.dq_accum) + accum_bytes;
  if (kOrdered) ws.dq_turn = reinterpret_cast<int*>(after_accum);
  if (dynamic) sched.counter = reinterpret_cast<int*>(after_accum + turn_bytes);
  const unsigned hq = unsigned(p.heads_q), batch = unsigned(p.batch);

  // The ordered deterministic mode is its own instantiation: its turn-taking code would otherwise
  // change the default kernel's register allocation.
  auto pick = [&](auto softcap) {
    if constexpr (kWide)
      return sm90::backward_wide_kernel<T, decltype(softcap)::value, kOrdered>;
    else
      return sm90::backward_kernel<T, decltype(softcap)::value, kOrdered>;
  };
  auto kernel = p.softcap > 0.f ? pick(std::true_type{}) : pick(std::false_type{});
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
        "cudaFuncSetAttribute(backward, shared memory)");
  const dim3 grid = kWide ? dim3(unsigned(2 * n_blocks), unsigned(p.heads_kv), batch)
                          : dim3(unsigned(persistent ? std::min<int64_t>(tiles, sms) : tiles));
  if (tiles > 0) {
    kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(P);
    check_launch("flashattn backward kernel (Hopper path)");
  }

  // Measured and not kept: this kernel as the main kernel's programmatic dependent, each CTA waiting
  // on a per-head count of key tiles whose dQ additions completed, so that it runs on the SMs the
  // main kernel's last wave frees. The tiles still left when the main kernel ends converted more
  // slowly than this kernel converts them all: B/A 0.98-1.02 at d=128, 0.95-0.98 at d=64 causal
  // (H200, bench/results/h200_session29_2026-12-04.txt, calls 3-7).
  const bool dq_rows_16b = reinterpret_cast<uintptr_t>(p.dq) % 16 == 0 && p.dq_s.batch % 8 == 0 &&
                           p.dq_s.row % 8 == 0 && p.dq_s.head % 8 == 0;
  sm90::backward_convert_dq_kernel<T>
      <<<dim3(unsigned((p.seqlen_q + BM - 1) / BM), hq, batch), 256, 0, stream>>>(p, ws, dq_rows_16b);
  check_launch("flashattn backward dq conversion kernel");
  return true;
}

template <int kHeadDim, class Element, int kArch>
bool run_backward_hopper(const core::BackwardParams& p, cudaStream_t stream) {
  static_assert(kArch == 90, "the Hopper path is built for sm_90a only");
  // Head dims between multiples of 64 (96) run in the next kernel width: the TMA maps carry the
  // real d, so loads zero-fill the extra columns (which then add nothing to any product), and the
  // stores of dk, dv and dq stop at d.
  constexpr int kTileDim = (kHeadDim + 63) / 64 * 64;
  using Default = typename HopperBwdTraits<kTileDim, Element, false>::type;
  using Ordered = typename HopperBwdTraits<kTileDim, Element, true>::type;
  return p.deterministic ? launch_backward_hopper<kHeadDim, Ordered, true>(p, stream)
                         : launch_backward_hopper<kHeadDim, Default, false>(p, stream);
}

}  // namespace flashattn::cuda
