// The Hopper backward's last kernel: dq from the fp32 dQ accumulator that the main kernels
// (bwd_kernel.cuh, bwd_wide_kernel.cuh) add into in their fragment order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"
#include "cuda/bwd_common.cuh"
#include "cuda/ptx/sm80.cuh"

namespace flashattn::cuda::sm90 {

// dq = the softmax scale times the fp32 dQ accumulator, un-permuted from fragment order: one CTA
// of 256 threads per (query tile, head, batch). A thread's item is 8 columns of a pair of rows (r,
// r + 8): the float4s c of the 4 threads t of one quad (g) of a warp, which lie side by side in
// fragment order, so it reads 64 contiguous bytes and writes two 16-byte rows. Neighbouring
// threads take neighbouring column chunks, so a warp writes whole rows (full sectors).
// Transposed dQ (T::kDqTransposed): float4 c of thread (warp, g, t) of warpgroup part holds query
// rows 8c + 2t (x, z) and 8c + 2t + 1 (y, w) at head-dim columns 64 part + 16 warp + g (x, y) and
// + 8 (z, w). An item is those two rows at 16 columns: the float4s c of the quads' lanes t (8 of
// them, 64 bytes apart), x and z across g making the 16-byte pieces. A warp takes 8 rows whole.
// rows_16b: dq rows start on 16 bytes (else the row is written as 4-byte pairs).
template <class T>
__global__ void __launch_bounds__(256) backward_convert_dq_kernel(const __grid_constant__ core::BackwardParams p,
                                                                  BwdWorkspace ws, bool rows_16b) {
  using E = typename T::Element;
  constexpr int BM = T::kBlockM, D = T::kHeadDim, kChunks = D / 8;
  const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int64_t q0, sq;
  query_rows(p, b, &q0, &sq);
  if (int64_t(m) * BM >= sq) return;
  const float* acc = ws.dq_accum + (int64_t(h) * ws.tiles_per_head + tile_base(p, BM, b) + m) * BM * D;
  E* dq = static_cast<E*>(p.dq);
  auto store16 = [&](int64_t r, int col, const uint32_t (&w)[4]) {
    E* row = dq + p.dq_s.offset(b, q0 + r, h) + col;
    if (rows_16b) {
      *reinterpret_cast<uint4*>(row) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) reinterpret_cast<uint32_t*>(row)[i] = w[i];
    }
  };
  if constexpr (T::kDqTransposed) {
    constexpr int kItems = BM / 8 * 4 * 8;  // (c, t) x (part, warp)
    static_assert(kItems % 32 == 0, "whole warps");
    for (int item = int(threadIdx.x); item < kItems; item += 256) {
      const int cols = item % 8, part = cols / 4, warp = cols % 4, t = (item / 8) % 4, c = item / 32;
      const float* src = acc + ((c * 2 + part) * 128 + 32 * warp + t) * 4;
      float4 f[8];
#pragma unroll
      for (int g = 0; g < 8; ++g) f[g] = *reinterpret_cast<const float4*>(src + 16 * g);
      const int64_t r = int64_t(m) * BM + 8 * c + 2 * t;
      const int col = 64 * part + 16 * warp;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (r + half >= sq) break;
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          if (col + 8 * hi >= p.head_dim) continue;
          uint32_t w[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float4 a = f[2 * i], bb = f[2 * i + 1];
            const float x = half == 0 ? (hi == 0 ? a.x : a.z) : (hi == 0 ? a.y : a.w);
            const float y = half == 0 ? (hi == 0 ? bb.x : bb.z) : (hi == 0 ? bb.y : bb.w);
            w[i] = ptx::thread_pack2<E>(x * p.scale, y * p.scale);
          }
          store16(r + half, col + 8 * hi, w);
        }
      }
    }
  } else {
    constexpr int kItems = BM / 2 * kChunks;
    static_assert(kItems % 256 == 0, "whole passes of the CTA");
#pragma unroll
    for (int pass = 0; pass < kItems / 256; ++pass) {
      const int item = pass * 256 + int(threadIdx.x);
      const int cc = item % kChunks, rp = item / kChunks;  // column chunk, row pair
      // Row pair rp: warpgroup part (split rows), warp, quad g; chunk cc: part (split columns, 64
      // each; a warpgroup that computed them all stored them so, T::kDqAlternate), c.
      const int part = T::kDqSplitRows ? rp / 32 : cc / (D / 16);
      const int c = T::kDqSplitRows ? cc : cc % (D / 16);
      const int warp = (rp / 8) % 4, g = rp % 8;
      const float* src = acc + ((c * 2 + part) * 128 + 32 * warp + 4 * g) * 4;
      float4 f[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) f[t] = *reinterpret_cast<const float4*>(src + 4 * t);
      const int col = 8 * cc;
      if (col >= p.head_dim) continue;
      const int64_t r = int64_t(m) * BM + (T::kDqSplitRows ? 64 * part : 0) + 16 * warp + g;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (r + 8 * half >= sq) break;
        uint32_t w[4];
#pragma unroll
        for (int t = 0; t < 4; ++t)
          w[t] = half == 0 ? ptx::thread_pack2<E>(f[t].x * p.scale, f[t].y * p.scale)
                           : ptx::thread_pack2<E>(f[t].z * p.scale, f[t].w * p.scale);
        store16(r + 8 * half, col, w);
      }
    }
  }
}

}  // namespace flashattn::cuda::sm90
