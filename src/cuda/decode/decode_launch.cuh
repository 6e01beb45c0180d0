// Host launcher of the decode kernel for one (head dim, dtype, target arch). Included only by the
// generated instantiation files (src/cuda/instantiations/decode_*.cu), one variant per file; each
// holds the three warp layouts (16, 32 or 64 rows per CTA).
#pragma once

#include <algorithm>
#include <string>

#include "cuda/common.cuh"
#include "cuda/decode/decode.h"
#include "cuda/decode/decode_kernel.cuh"
#include "cuda/sm90/tma.h"

namespace flashattn::cuda {
namespace decode {

template <int kHeadDim, class Element, int kArch, int kWarpsM>
using Traits = DecodeTraits<kHeadDim, Element, kWarpsM, kArch>;

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
    if constexpr (T::kBulk) {
      DecodeLaunch tl = L;
      tl.box_rows = p.paged ? int32_t(std::min<int64_t>(16, p.page_size & -p.page_size)) : 16;
      auto cache = [&](const void* base, int64_t page, int64_t row, int64_t head) {
        sm90::TmaTensor t;
        t.base = base;
        t.head_dim = p.head_dim;
        t.rows = p.paged ? p.page_size : L.capacity;
        t.heads = p.heads_kv;
        t.batch = p.paged ? p.num_pages : p.batch;
        t.row_stride = row;
        t.head_stride = head;
        t.batch_stride = page;
        return t;
      };
      // The rows are 16-byte aligned (checked by the caller), all TMA needs of a strided tensor.
      // One copy per box instead of one per 64-column block where the box is a whole 16-row group
      // of the slot layout (decode_kernel.cuh, KvSlot).
      const bool blocks = tl.box_rows == 16 && p.head_dim % 64 == 0 && p.head_dim > 64;
      tl.box_blocks = blocks ? int32_t(p.head_dim / 64) : 1;
      auto encode = blocks ? sm90::encode_tma_sw128_blocks : sm90::encode_tma_sw128;
      if (!encode(&tl.k_map, cache(p.k_cache, p.kc_page, p.kc_row, p.kc_head), tl.box_rows) ||
          !encode(&tl.v_map, cache(p.v_cache, p.vc_page, p.vc_row, p.vc_head), tl.box_rows))
        throw Error(Status::unsupported,
                    "decode: the K/V cache cannot be loaded as a TMA tensor on this GPU path (a stride of 0 over "
                    "more than one row, head or page, or a layout the driver rejects)");
      kernel<<<unsigned(ctas), T::kThreads, T::kSmemBytes, stream>>>(tl);
    } else {
      kernel<<<unsigned(ctas), T::kThreads, T::kSmemBytes, stream>>>(L);
    }
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
