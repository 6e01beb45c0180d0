// The shared-memory tile layout of the Hopper kernels: 128-byte swizzled column blocks, what TMA's
// SWIZZLE_128B writes and what wgmma descriptors with the 128-byte swizzle read.
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm90 {

// Byte offset of element (row, col) of a 16-bit tile stored as 128-byte swizzled column blocks of
// `kRows` rows each (64 columns per block): the 16-byte chunk index is XORed with row % 8.
template <int kRows>
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col) {
  int block = col / 64, byte = (col % 64) * 2;
  return uint32_t(block * kRows * 128 + row * 128 + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15)));
}

}  // namespace flashattn::cuda::sm90
