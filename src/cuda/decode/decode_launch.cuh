// Host launcher of the decode kernel for one (head dim, dtype, target arch). Included only by the
// generated instantiation files (src/cuda/instantiations/decode_*.cu), one variant per file; each
// holds the three warp layouts (16, 32 or 64 rows per CTA).
#pragma once

#include <string>

#include "cuda/common.cuh"
#include "cuda/decode/decode.h"
#include "cuda/decode/decode_kernel.cuh"

namespace flashattn::cuda {
namespace decode {

template <int kHeadDim, class Element, int kArch, int kWarpsM>
using Traits = DecodeTraits<kHeadDim, Element, kWarpsM, decode_kv_slots<kArch>(kHeadDim)>;

// Calls f(kernel, traits) for the layout that serves `rows_per_cta` rows.
template <int kHeadDim, class Element, int kArch, class F>
void with_layout(int rows_per_cta, F&& f) {
  if (rows_per_cta <= 16) {
    using T = Traits<kHeadDim, Element, kArch, 1>;
    f(decode_kernel<T>, T{});
  } else if (rows_per_cta <= 32) {
    using T = Traits<kHeadDim, Element, kArch, 2>;
    f(decode_kernel<T>, T{});
  } else {
    using T = Traits<kHeadDim, Element, kArch, 4>;
    f(decode_kernel<T>, T{});
  }
}

}  // namespace decode

template <int kHeadDim, class Element, int kArch>
void run_decode(const DecodeLaunch& L, cudaStream_t stream) {
  const core::DecodeParams& p = L.p;
  const int rows_per_cta = decode_rows_per_cta(p.heads_q / p.heads_kv * p.seqlen_new);
  decode::with_layout<kHeadDim, Element, kArch>(rows_per_cta, [&](auto kernel, auto traits) {
    using T = decltype(traits);
    // Above 48 KB a kernel must opt in to its dynamic shared memory.
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
          "cudaFuncSetAttribute(decode, shared memory)");
    const int64_t ctas = p.batch * p.heads_kv * L.splits * L.row_tiles;
    if (ctas == 0) return;
    if (ctas > int64_t(0x7fffffff))
      throw Error(Status::unsupported, "decode: " + std::to_string(ctas) + " CTAs exceed one GPU launch");
    // The kernel's row and block-index arithmetic is 32-bit.
    if (p.heads_q * p.seqlen_new > int64_t(1) << 30 || p.head_dim * p.seqlen_new > int64_t(1) << 30)
      throw Error(Status::unsupported, "decode: heads_q * seqlen_new = " + std::to_string(p.heads_q * p.seqlen_new) +
                                           " query rows per sequence exceed the GPU kernel's 32-bit row index");
    kernel<<<unsigned(ctas), T::kThreads, T::kSmemBytes, stream>>>(L);
    check_launch("flashattn decode kernel");
  });
}

template <int kHeadDim, class Element, int kArch>
int decode_ctas_per_sm(int rows_per_cta) {
  int ctas = 0;
  decode::with_layout<kHeadDim, Element, kArch>(rows_per_cta, [&](auto kernel, auto traits) {
    using T = decltype(traits);
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
          "cudaFuncSetAttribute(decode, shared memory)");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, T::kThreads, T::kSmemBytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor(decode)");
  });
  return ctas;
}

}  // namespace flashattn::cuda
