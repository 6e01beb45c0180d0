// The shared-memory tile layout of the Hopper kernels: 128-byte swizzled column blocks, what TMA's
// SWIZZLE_128B writes and what wgmma descriptors with the 128-byte swizzle read.
#pragma once

#include <cstdint>

#include "cuda/ptx/sm90.cuh"

namespace flashattn::cuda::sm90 {

// Byte offset of element (row, col) of a 16-bit tile stored as 128-byte swizzled column blocks of
// `kRows` rows each (64 columns per block): the 16-byte chunk index is XORed with row % 8.
template <int kRows>
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col) {
  int block = col / 64, byte = (col % 64) * 2;
  return uint32_t(block * kRows * 128 + row * 128 + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15)));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Loads a tile of kRows rows (from `row` of head `head`, batch entry `batch`) by TMA into this
// layout, one 64-column box per column block, all completing on `bar`.
template <int kRows, int kColBlocks>
__device__ __forceinline__ void thread_tma_load_tile(unsigned char* smem, const void* tmap, uint64_t* bar, int row,
                                                     int head, int batch) {
#pragma unroll
  for (int c = 0; c < kColBlocks; ++c) ptx::thread_tma_load_4d(smem + c * kRows * 128, tmap, bar, 64 * c, row, head, batch);
}

// The same tile shared by a pair of CTAs in a cluster: this CTA (rank `rank`) loads its half of the
// rows (the map's box holds kRows / 2) into both CTAs' shared memory at the same offsets, each
// half completing on each CTA's own `bar`. Together the two give each CTA the whole tile.
template <int kRows, int kColBlocks>
__device__ __forceinline__ void thread_tma_load_tile_pair(unsigned char* smem, const void* tmap, uint64_t* bar, int row,
                                                          int head, int batch, int rank) {
  constexpr int kHalf = kRows / 2;
  static_assert(kHalf % 8 == 0, "a half starts on a whole swizzle pattern (8 rows)");
#pragma unroll
  for (int c = 0; c < kColBlocks; ++c)
    ptx::thread_tma_load_4d_multicast(smem + c * kRows * 128 + rank * kHalf * 128, tmap, bar, 64 * c,
                                      row + rank * kHalf, head, batch, uint16_t(0x3));
}
#endif

}  // namespace flashattn::cuda::sm90
