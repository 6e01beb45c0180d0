// Host launcher of the Hopper forward kernel for one (head dim, dtype). Included only by the
// generated instantiation files (src/cuda/instantiations/fwd_hopper_*), built for sm_90a.
#pragma once

#include "cuda/common.cuh"
#include "cuda/forward.h"
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/sm90/tma.h"
#include "cuda/tile_size.h"

namespace flashattn::cuda {

template <int kHeadDim, class Element, int kArch>
bool run_forward_hopper(const core::ForwardParams& p, cudaStream_t stream) {
  static_assert(kArch == 90, "the Hopper path is built for sm_90a only");
  constexpr HopperFwdTile tile = hopper_fwd_tile(kHeadDim);
  using T = sm90::FwdTraits<kHeadDim, Element, tile.block_n, tile.consumer_wgs, tile.stages>;
  sm90::FwdParams P{};
  P.p = p;
  // Varlen tensors are packed [total, heads, d]: one sequence of all rows (batch 1).
  const bool varlen = p.cu_seqlens_q != nullptr;
  auto view = [&](const void* base, const core::Strides& s, int64_t rows, int64_t heads) {
    sm90::TmaTensor t;
    t.base = base;
    t.head_dim = kHeadDim;
    t.rows = rows;
    t.heads = heads;
    t.batch = varlen ? 1 : p.batch;
    t.row_stride = s.row;
    t.head_stride = s.head;
    t.batch_stride = varlen ? 0 : s.batch;
    return t;
  };
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  if (!sm90::encode_tma_sw128(&P.tq, view(p.q, p.q_s, rows_q, p.heads_q), T::kBlockM) ||
      !sm90::encode_tma_sw128(&P.tk, view(p.k, p.k_s, rows_k, p.heads_kv), T::kBlockN) ||
      !sm90::encode_tma_sw128(&P.tv, view(p.v, p.v_s, rows_k, p.heads_kv), T::kBlockN))
    return false;  // the driver rejected a layout: the caller runs the portable path
  auto kernel = p.softcap > 0.f ? sm90::forward_kernel<T, true> : sm90::forward_kernel<T, false>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
        "cudaFuncSetAttribute(forward, shared memory)");
  dim3 grid(unsigned((p.seqlen_q + T::kBlockM - 1) / T::kBlockM), unsigned(p.heads_q), unsigned(p.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return true;
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(P);
  check_launch("flashattn forward kernel (Hopper path)");
  return true;
}

}  // namespace flashattn::cuda
