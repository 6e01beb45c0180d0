// The portable kernels' shared-tile helpers (src/cuda/sm80/smem_tile.cuh). Host code in the GPU
// suite's program (the header needs the CUDA toolkit to compile), so it runs without a GPU too.
#include <gtest/gtest.h>

#include <vector>

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

// StagedRows (the backward's staged dQ): a permutation of each warp block's floats, four columns
// from a multiple of 4 contiguous, and both access patterns at their fewest shared-memory
// wavefronts: an mma C fragment's 8-byte stores (8 rows x 4 lanes) at most 2 per bank, a warp's
// 16-byte row reads at most 4.
template <int kCols>
void expect_staged_rows_spread() {
  using S = flashattn::cuda::sm80::StagedRows<kCols>;
  constexpr int kRows = 64;
  std::vector<int> seen(kRows * kCols, 0);
  for (int row = 0; row < kRows; ++row)
    for (int col = 0; col < kCols; ++col) {
      const int o = S::offset(row, col);
      ASSERT_GE(o, 0);
      ASSERT_LT(o, kRows * kCols);
      ++seen[o];
      ASSERT_EQ(o, S::offset(row, col & ~3) + (col & 3)) << "row " << row << " col " << col;
    }
  for (int n : seen) ASSERT_EQ(n, 1);
  for (int row0 = 0; row0 < kRows; row0 += 8)
    for (int j = 0; j < kCols / 8; ++j) {
      int bank[32] = {};
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 2; ++e) ++bank[(S::offset(row0 + lane / 4, 8 * j + 2 * (lane % 4)) + e) % 32];
      for (int b = 0; b < 32; ++b) ASSERT_LE(bank[b], 2) << "store rows " << row0 << " tile " << j;
    }
  for (int row0 = 0; row0 < kRows; row0 += S::kRowsPerPass) {
    int bank[32] = {};
    for (int lane = 0; lane < 32; ++lane)
      for (int e = 0; e < 4; ++e)
        ++bank[(S::offset(row0 + lane / S::kLanesPerRow, 4 * (lane % S::kLanesPerRow)) + e) % 32];
    for (int b = 0; b < 32; ++b) ASSERT_LE(bank[b], 4) << "read rows " << row0;
  }
}

// StagedRows' lane plans (a per-lane base plus a constant) give offset() for every lane and step.
template <int kCols>
void expect_staged_lane_plans_match() {
  using S = flashattn::cuda::sm80::StagedRows<kCols>;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const typename S::FragmentStores stores(g, t);
    for (int row8 = 0; row8 < 64; row8 += 8)
      for (int j = 0; j < kCols / 8; ++j)
        ASSERT_EQ(stores.at(row8, j), S::offset(row8 + g, 8 * j + 2 * t))
            << "lane " << lane << " row8 " << row8 << " j " << j;
    const typename S::RowReads reads(lane);
    for (int k = 0; k < 64 / S::kRowsPerPass; ++k)
      ASSERT_EQ(reads.at(k), S::offset(k * S::kRowsPerPass + lane / S::kLanesPerRow, 4 * (lane % S::kLanesPerRow)))
          << "lane " << lane << " pass " << k;
  }
}

TEST(SmemTile, StagedRowsLanePlansMatchTheLayout) {
  expect_staged_lane_plans_match<32>();
  expect_staged_lane_plans_match<64>();
}

TEST(SmemTile, StagedRowsPermuteAndSpreadBanks) {
  expect_staged_rows_spread<32>();  // d = 128: 4 warps along the head dim
  expect_staged_rows_spread<64>();  // d = 256
}

}  // namespace
}  // namespace fa_test
