// Host launcher of the Hopper forward kernel for one (head dim, dtype). Included only by the
// generated instantiation files (src/cuda/instantiations/fwd_hopper_*), built for sm_90a.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/forward.h"
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/sm90/tma.h"
#include "cuda/tile_size.h"

namespace flashattn::cuda {

// The kernel of traits X for this call: with or without the softcap's tanh.
template <class X>
auto forward_kernel_for(const core::ForwardParams& p) {
  return p.softcap > 0.f ? sm90::forward_kernel<X, true> : sm90::forward_kernel<X, false>;
}

// Launches the kernel of traits T (bench/hopper_tile_sweep.cu calls this with candidate shapes):
// one CTA per SM walking the tiles, by static stride (with a stream-K tail where T has it, tiles
// are equal and it pays, tile_scheduler.h) or (dynamic) drawing them from a counter. kPairKV: the
// tile table lets equal tiles in pairs share K and V (FwdTraits::Paired) where the stride takes
// them two by two.
template <class T, bool kPairKV = false>
bool launch_forward_hopper(const core::ForwardParams& p, cudaStream_t stream, bool dynamic) {
  constexpr int kHeadDim = T::kHeadDim;
  sm90::FwdParams P{};
  P.p = p;
  const bool varlen = p.cu_seqlens_q != nullptr;
  auto view = [&](const void* base, const core::Strides& s, int64_t heads, bool keys) {
    return sm90::tma_view(p, base, s, heads, kHeadDim, keys);
  };
  if (!sm90::encode_tma_sw128(&P.tq, view(p.q, p.q_s, p.heads_q, false), T::kBlockM) ||
      !sm90::encode_tma_sw128(&P.tk, view(p.k, p.k_s, p.heads_kv, true), T::kBlockN) ||
      !sm90::encode_tma_sw128(&P.tv, view(p.v, p.v_s, p.heads_kv, true), T::kBlockN))
    return false;  // the driver rejected a layout: the caller runs the portable path
  // O leaves by TMA store where rows past a sequence fall outside the map (not for packed varlen
  // tensors, whose next sequence follows); one 64-row box per consumer warpgroup.
  P.tma_store = !varlen && sm90::encode_tma_sw128(&P.to, view(p.out, p.o_s, p.heads_q, false), 64);

  const int num_sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
  TileScheduler& s = P.sched =
      make_tile_scheduler(p, T::kBlockM, current_device_attribute(cudaDevAttrL2CacheSize));
  const int64_t tiles = int64_t(s.num_m_blocks) * s.heads * s.batch;
  if (tiles == 0) return true;
  if (tiles > int64_t(INT32_MAX)) return false;  // tile indices are int: the portable path takes it
  unsigned grid = unsigned(std::min<int64_t>(tiles, num_sms));
  // The counter and the stream-K merge slots are stream-ordered memory (no host synchronization;
  // capturable in a graph). A device without stream-ordered allocation gets the plain static
  // stride instead (slower on uneven causal tiles and in the last wave, same result).
  P.tile_counter = nullptr;
  P.sk_state = nullptr;
  P.sk_flags = nullptr;
  void* scratch = nullptr;
  auto alloc = [&](size_t bytes) {
    if (cudaMallocAsync(&scratch, bytes, stream) == cudaSuccess) return true;
    cudaGetLastError();
    scratch = nullptr;
    return false;
  };
  if (dynamic && tiles > grid) {
    if (alloc(sizeof(int))) {
      P.tile_counter = static_cast<int*>(scratch);
      check(cudaMemsetAsync(P.tile_counter, 0, sizeof(int), stream), "cudaMemsetAsync(forward tile counter)");
    }
  } else if (T::kStreamK && !dynamic && !varlen && p.window_left < 0 && p.window_right < 0) {
    // Every tile visits all ceil(seqlen_k / block_n) key tiles.
    plan_stream_k(s, int(grid), (p.seqlen_k + T::kBlockN - 1) / T::kBlockN);
    const size_t flag_bytes = (size_t(grid) * T::kConsumerWGs * 2 * sizeof(int) + 255) / 256 * 256;
    const size_t state_bytes = size_t(grid) * T::kConsumerWGs * T::kSkVecs * 128 * sizeof(float4);
    if (s.sk_span > 0 && alloc(flag_bytes + state_bytes)) {
      P.sk_flags = static_cast<int*>(scratch);
      P.sk_state = reinterpret_cast<float4*>(static_cast<unsigned char*>(scratch) + flag_bytes);
      check(cudaMemsetAsync(P.sk_flags, 0, flag_bytes, stream), "cudaMemsetAsync(forward stream-K flags)");
    } else {
      s.sk_span = 0;  // the plain stride: not planned, or no memory for the slots
    }
  }
  auto kernel = forward_kernel_for<T>(p);
  if constexpr (T::kStreamK) {
    using U = typename T::Unsplit;
    static_assert(U::kSmemBytes == T::kSmemBytes && U::kThreads == T::kThreads, "one launch shape");
    if (s.sk_span == 0) kernel = forward_kernel_for<U>(p);
  }
  // Pairs: CTAs 2c and 2c + 1 of the stride take tiles 2i and 2i + 1, query tiles m and m + 1 of
  // one head when a head's query tiles are even in number (m fastest, not longest-first), and
  // every tile visits all key tiles (no mask, so both walk the same key tiles in step).
  bool paired = false;
  if constexpr (kPairKV) {
    using PK = typename T::Paired;
    static_assert(PK::kSmemBytes == T::kSmemBytes && PK::kThreads == T::kThreads, "one launch shape");
    if (!dynamic && !varlen && p.window_left < 0 && p.window_right < 0 && s.sk_span == 0 && !s.longest_first &&
        s.num_m_blocks % 2 == 0) {
      auto pk = forward_kernel_for<PK>(p);
      check(cudaFuncSetAttribute(pk, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
            "cudaFuncSetAttribute(forward, shared memory)");
      const unsigned pair_grid = std::min(grid, 2u * unsigned(resident_pairs(pk, T::kThreads, T::kSmemBytes))) & ~1u;
      // Each CTA loads half of every K and V tile: the maps' boxes hold kBlockN / 2 rows (if the
      // driver rejects those, the whole-tile maps are restored and the CTAs run unpaired).
      auto encode_kv = [&](int rows) {
        return sm90::encode_tma_sw128(&P.tk, view(p.k, p.k_s, p.heads_kv, true), rows) &&
               sm90::encode_tma_sw128(&P.tv, view(p.v, p.v_s, p.heads_kv, true), rows);
      };
      if (pair_grid > 0) {
        paired = encode_kv(T::kBlockN / 2);
        if (!paired && !encode_kv(T::kBlockN)) return false;
      }
      if (paired) {
        grid = pair_grid;
        kernel = pk;
      }
    }
  }
  cudaError_t launched = cudaSuccess;
  if (paired) {
    const PairLaunch launch(grid, T::kThreads, T::kSmemBytes, stream);
    launched = cudaLaunchKernelEx(&launch.config, kernel, P);
  } else {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
          "cudaFuncSetAttribute(forward, shared memory)");
    kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(P);
    launched = cudaGetLastError();
  }
  if (scratch != nullptr) check(cudaFreeAsync(scratch, stream), "cudaFreeAsync(forward scratch)");
  check(launched, "flashattn forward kernel (Hopper path)");
  return true;
}

template <int kHeadDim, class Element, int kArch>
bool run_forward_hopper(const core::ForwardParams& p, cudaStream_t stream) {
  static_assert(kArch == 90, "the Hopper path is built for sm_90a only");
  // Causal and windowed problems (a right bound) have their own entries: see tile_size.h.
  constexpr HopperFwdTile a = hopper_fwd_tile(kHeadDim, false), c = hopper_fwd_tile(kHeadDim, true);
  using Causal = sm90::FwdTraits<kHeadDim, Element, c.block_n, c.consumer_wgs, c.stages, c.ping_pong, c.q_stages,
                                 c.own_tiles, c.stage_o, c.stream_k, false, c.softmax_under_pv>;
  using Plain = sm90::FwdTraits<kHeadDim, Element, a.block_n, a.consumer_wgs, a.stages, a.ping_pong, a.q_stages,
                                a.own_tiles, a.stage_o, a.stream_k, false, a.softmax_under_pv>;
  if (p.window_right >= 0) return launch_forward_hopper<Causal>(p, stream, c.dynamic);
  return launch_forward_hopper<Plain, a.pair_kv>(p, stream, a.dynamic);
}

}  // namespace flashattn::cuda
