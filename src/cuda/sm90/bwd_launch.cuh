// Host launcher of the Hopper backward for one (head dim, dtype): tensor maps, workspace in the
// tiled layout (src/cuda/bwd_common.cuh), preprocess, main and convert kernels on the caller's
// stream. Included only by the generated instantiation files (src/cuda/instantiations/bwd_hopper_*).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/backward.h"
#include "cuda/common.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_wide_kernel.cuh"
#include "cuda/sm90/tma.h"
#include "cuda/tile_size.h"

namespace flashattn::cuda {

template <int kHeadDim, class Element, int kArch>
bool run_backward_hopper(const core::BackwardParams& p, cudaStream_t stream) {
  static_assert(kArch == 90, "the Hopper path is built for sm_90a only");
  // Head dims between multiples of 64 (96) run in the next kernel width: the TMA maps carry the
  // real d, so loads zero-fill the extra columns (which then add nothing to any product), and the
  // stores of dk, dv and dq stop at d.
  constexpr int kTileDim = (kHeadDim + 63) / 64 * 64;
  constexpr HopperBwdTile tile = hopper_bwd_tile(kTileDim);
  // d <= 128: keys split between the consumer warpgroups; wider: columns (bwd_wide_kernel.cuh).
  constexpr bool kWide = kTileDim > 128;
  using T = std::conditional_t<kWide, sm90::WideBwdTraits<kTileDim, Element, tile.stages>,
                               sm90::BwdTraits<kTileDim, Element, tile.block_m, tile.stages, tile.dq_buffers>>;
  static_assert(T::kBlockM == tile.block_m, "the tile table and the kernel agree on the query tile");
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
  BwdWorkspace& ws = P.ws;
  ws.tile_m = BM;
  ws.tiles_per_head = tiles_per_head(p, BM);
  // Deterministic mode, in one of two orders (the kernels' headers explain both):
  //   ordered: the default grid; the key tiles that visit a query tile add their dQ into it one
  //     after another, in key-tile order, each waiting for its turn;
  //   slices: `splits` CTAs per (KV head, batch), each with its own dQ slice, summed by the
  //     convert kernel.
  // Slices for causal (right-bounded) masks at d <= 64, ordered elsewhere: the faster of the two
  // on the H200 (bf16, 16k tokens, hidden 2048; deterministic / default at 2k and 8k): causal d=64
  // slices 0.88 / 0.87 against ordered 0.85 / 0.82; non-causal d=64 0.83 / 0.84 against 0.88 / 0.92;
  // d=128 causal 0.84 / 0.76 against 0.90 / 0.92, non-causal 0.74 / 0.78 against 0.88 / 0.94;
  // d=256 0.51-0.61 against 0.60-0.77 (bench/results/h200_bwd_deterministic_2026-11-29.txt).
  const bool sliced = p.deterministic && T::kHeadDim <= 64 && p.window_right >= 0;
  const bool ordered = p.deterministic && !sliced;
  ws.splits = sliced ? deterministic_splits(p.heads_kv * p.batch, sms, n_blocks) : 1;
  const int64_t rows = p.heads_q * ws.tiles_per_head * BM;
  const size_t accum_bytes = size_t(ws.splits) * size_t(rows) * kTileDim * 4;
  // The turn counters follow the dQ accumulator and are zeroed with it.
  const size_t turn_bytes = ordered ? size_t(p.heads_q * ws.tiles_per_head) * (kWide ? 2 : 1) * 4 : 0;
  const WorkspaceMemory memory(size_t(rows) * 8 + accum_bytes + turn_bytes, stream);
  start_backward<Element>(p, ws, memory, rows, accum_bytes + turn_bytes, stream);
  if (ordered) ws.dq_turn = reinterpret_cast<int*>(reinterpret_cast<unsigned char*>(ws.dq_accum) + accum_bytes);
  const unsigned hq = unsigned(p.heads_q), batch = unsigned(p.batch);

  // The ordered deterministic mode is its own instantiation: its turn-taking code would otherwise
  // change the default kernel's register allocation.
  auto pick = [&](auto softcap, auto ordered) {
    if constexpr (kWide)
      return sm90::backward_wide_kernel<T, decltype(softcap)::value, decltype(ordered)::value>;
    else
      return sm90::backward_kernel<T, decltype(softcap)::value, decltype(ordered)::value>;
  };
  using Yes = std::true_type;
  using No = std::false_type;
  auto kernel = p.softcap > 0.f ? (ordered ? pick(Yes{}, Yes{}) : pick(Yes{}, No{}))
                                : (ordered ? pick(No{}, Yes{}) : pick(No{}, No{}));
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
        "cudaFuncSetAttribute(backward, shared memory)");
  const unsigned grid_x = unsigned(sliced ? ws.splits : n_blocks);
  if (grid_x > 0) {
    kernel<<<dim3(grid_x, unsigned(p.heads_kv), batch), T::kThreads, T::kSmemBytes, stream>>>(P);
    check_launch("flashattn backward kernel (Hopper path)");
  }

  sm90::backward_convert_dq_kernel<T><<<dim3(unsigned((p.seqlen_q + BM - 1) / BM), hq, batch), 256, 0, stream>>>(p, ws);
  check_launch("flashattn backward dq conversion kernel");
  return true;
}

}  // namespace flashattn::cuda
