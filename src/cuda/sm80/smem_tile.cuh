// Shared-memory tiles of the portable (sm80+) kernels: the swizzled [rows][head_dim] layout, lane
// address plans for ldmatrix sweeps, the cp.async tile copy in, and the tile store out (the
// forward's staged O). Used by the forward and backward.
#pragma once

#include <cstdint>

#include "cuda/ptx/sm80.cuh"

namespace flashattn::cuda::sm80 {

// Shared tiles are [rows][kChunks * 8] elements, stored in 16-byte chunks whose index is
// XOR-swizzled so that the 8 rows an ldmatrix reads (same logical chunk) hit 8 different 16-byte
// bank groups: rows of a 128-byte multiple XOR the low 3 chunk bits with row % 8; rows of 64 B mod
// 128 (head dims 32, 96) pair up rows, so they XOR the low 2 chunk bits with (row / 2) % 4.
template <int kChunks>
struct Swizzle {
  static_assert(kChunks % 4 == 0, "head dim must be a multiple of 32");
  static constexpr int kMask = kChunks % 8 == 0 ? 7 : 3;
  __host__ __device__ __forceinline__ static int row_bits(int row) { return kMask == 7 ? (row & 7) : ((row >> 1) & 3); }
  // Element offset of (row, chunk).
  __host__ __device__ __forceinline__ static int offset(int row, int chunk) {
    return row * kChunks * 8 + ((chunk & ~kMask) | ((chunk & kMask) ^ row_bits(row))) * 8;
  }
};

// The rows one lane addresses in an ldmatrix sweep: row `row + row_hi` and chunk `chunk + bit`,
// where row_hi (a multiple of 8) and the even chunk are compile-time constants of unrolled loops
// and row / bit are the lane's own. Since row_hi keeps the row's swizzle bits and bit only touches
// chunk bit 0, the address is a per-lane base plus a constant plus one XOR, instead of a full
// swizzle evaluation per ldmatrix (which dominated the instruction count).
template <int kChunks>
struct LaneRows {
  using Sw = Swizzle<kChunks>;
  int base, x;
  __host__ __device__ __forceinline__ LaneRows(int row, int bit) : base(row * kChunks * 8), x(Sw::row_bits(row) ^ bit) {}
  __host__ __device__ __forceinline__ int at(int row_hi, int chunk) const {
    return base + row_hi * kChunks * 8 + ((chunk & ~Sw::kMask) | ((chunk & Sw::kMask) ^ x)) * 8;
  }
};

// All threads: copy rows [0, kRows) x chunks of a global tile into shared memory; rows past
// `rows_valid` and chunks past `chunks_valid` (head dims below the kernel's) are zero-filled, so
// they add 0 to every dot product and nothing is read past the tensor. Each thread keeps one chunk
// column and walks its rows with one running pointer: precomputing every row's address would be
// hoisted out of the K/V loop by the compiler and cost tens of registers.
// T provides Element, kChunks (16-byte chunks per row) and kThreads.
template <class T, int kRows>
__device__ __forceinline__ void block_load_tile(typename T::Element* smem, const typename T::Element* gmem,
                                                int64_t row_stride, int rows_valid, int chunks_valid) {
  constexpr int kTotal = kRows * T::kChunks;
  static_assert(kTotal % T::kThreads == 0, "every thread copies the same number of chunks");
  if constexpr (T::kThreads % T::kChunks == 0) {
    constexpr int kRowsPerStep = T::kThreads / T::kChunks;
    const int chunk = int(threadIdx.x) % T::kChunks, row0 = int(threadIdx.x) / T::kChunks;
    const bool chunk_ok = chunk < chunks_valid;
    const typename T::Element* src = gmem + row0 * row_stride + chunk * 8;
#pragma unroll
    for (int step = 0; step < kRows / kRowsPerStep; ++step) {
      int row = row0 + step * kRowsPerStep;
      bool valid = chunk_ok && row < rows_valid;
      ptx::thread_cp_async_16(smem + Swizzle<T::kChunks>::offset(row, chunk), valid ? src : gmem, valid);
      src += kRowsPerStep * row_stride;
    }
  } else {  // head dim 96: 12 chunks per row do not divide the thread count
#pragma unroll
    for (int step = 0; step < kTotal / T::kThreads; ++step) {
      int i = int(threadIdx.x) + step * T::kThreads;
      int row = i / T::kChunks, chunk = i % T::kChunks;
      bool valid = row < rows_valid && chunk < chunks_valid;
      const typename T::Element* src = valid ? gmem + row * row_stride + chunk * 8 : gmem;
      ptx::thread_cp_async_16(smem + Swizzle<T::kChunks>::offset(row, chunk), src, valid);
    }
  }
}

// All threads: copy rows [0, rows_valid) x chunks [0, chunks_valid) of a swizzled shared tile to
// global memory, 16 bytes per store where the destination's rows are 16-byte aligned (`vec`), else
// as four 4-byte stores (rows of element pairs, as the callers otherwise store). The caller has
// synchronized the block after filling the tile.
template <class T, int kRows>
__device__ __forceinline__ void block_store_tile(typename T::Element* gmem, int64_t row_stride,
                                                 const typename T::Element* smem, int rows_valid, int chunks_valid,
                                                 bool vec) {
  constexpr int kTotal = kRows * T::kChunks;
  static_assert(kTotal % T::kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int step = 0; step < kTotal / T::kThreads; ++step) {
    const int i = int(threadIdx.x) + step * T::kThreads;
    const int row = i / T::kChunks, chunk = i % T::kChunks;
    if (row >= rows_valid || chunk >= chunks_valid) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(smem + Swizzle<T::kChunks>::offset(row, chunk));
    typename T::Element* dst = gmem + row * row_stride + chunk * 8;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      uint32_t* d4 = reinterpret_cast<uint32_t*>(dst);
      d4[0] = v.x, d4[1] = v.y, d4[2] = v.z, d4[3] = v.w;
    }
  }
}

}  // namespace flashattn::cuda::sm80
