// The portable kernels' shared-tile helpers (src/cuda/sm80/smem_tile.cuh). Host code in the GPU
// suite's program (the header needs the CUDA toolkit to compile), so it runs without a GPU too.
#include <gtest/gtest.h>

#include "cuda/sm80/smem_tile.cuh"

namespace fa_test {
namespace {

// LaneRows' address of a constant (row_hi, chunk) step, a lane base plus a constant plus one XOR,
// equals the swizzle itself for every lane row and chunk bit.
template <int kChunks>
void expect_lane_rows_match_swizzle() {
  using Sw = flashattn::cuda::sm80::Swizzle<kChunks>;
  for (int row = 0; row < 64; ++row)
    for (int bit = 0; bit < 2; ++bit) {
      const flashattn::cuda::sm80::LaneRows<kChunks> lane(row, bit);
      for (int row_hi = 0; row_hi < 64; row_hi += 8)
        for (int chunk = 0; chunk < kChunks; chunk += 2)
          ASSERT_EQ(lane.at(row_hi, chunk), Sw::offset(row + row_hi, chunk + bit))
              << "chunks " << kChunks << " row " << row << " bit " << bit << " row_hi " << row_hi << " chunk " << chunk;
    }
}

TEST(SmemTile, LaneRowsMatchTheSwizzle) {
  expect_lane_rows_match_swizzle<4>();   // d = 32
  expect_lane_rows_match_swizzle<8>();   // d = 64
  expect_lane_rows_match_swizzle<12>();  // d = 96
  expect_lane_rows_match_swizzle<16>();  // d = 128
  expect_lane_rows_match_swizzle<24>();  // d = 192
  expect_lane_rows_match_swizzle<32>();  // d = 256
}

}  // namespace
}  // namespace fa_test
