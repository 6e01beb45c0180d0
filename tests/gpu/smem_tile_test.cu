// The portable kernels' shared-tile helpers (src/cuda/sm80/smem_tile.cuh) and the backward's dQ
// accumulator layout. Host code in the GPU suite's program (the headers need the CUDA toolkit to
// compile), so it runs without a GPU too.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/sm80/smem_tile.cuh"
#include "cuda/tile_size.h"

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

// FragmentDq (the portable backward's dQ accumulator in fragment order) for each table entry that
// uses it (sm90; sm80's entries for 160+ KB parts, whose scalar reductions interleave each float4):
// the floats a thread adds for (m16 tile i, n8 tile j) are those the convert kernel reads as the
// float4 place() puts at that thread's fragment (rows 16 i + g and + 8, columns 8 j + 2t and + 1 of
// its warp's part), a warp's 32 lanes add 32 consecutive float4s (sm90) or 32 consecutive floats
// per reduction (sm80), and the block's floats cover every element of the kBlockM x kHeadDim tile
// exactly once.
template <int kArch, int kHeadDim>
void expect_fragment_dq_covers_the_tile() {
  namespace cu = flashattn::cuda;
  constexpr cu::PortableBwdTile tile = cu::portable_bwd_tile<kArch>(kHeadDim, /*large_smem=*/true);
  using T = cu::sm80::BwdTraits<kHeadDim, __nv_bfloat16, tile.block_n, tile.warps, tile.stages, tile.key_warps_s,
                                tile.key_warps_kv, tile.row_warps_q, tile.min_ctas, tile.block_m, tile.fragment_dq,
                                tile.stmatrix_ps>;
  using F = cu::sm80::FragmentDq<T>;
  constexpr bool kScalar = kArch < 90;
  SCOPED_TRACE("sm" + std::to_string(kArch) + " d = " + std::to_string(kHeadDim));
  ASSERT_TRUE(T::kFragmentDq);
  std::vector<int> element(T::kBlockM * T::kHeadDim, 0), added(F::kBlockFloats, 0);
  for (int warp = 0; warp < T::kWarps; ++warp)
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < T::kTilesQ; ++i)
        for (int j = 0; j < T::kColsQ / 8; ++j) {
          // The kernel's addresses of this group's four floats (bwd_kernel.cuh, phase 3).
          const int group = warp * F::kWarpFloats + 128 * (i * (T::kColsQ / 8) + j);
          for (int e = 0; e < 4; ++e) ++added[kScalar ? group + 32 * e + lane : group + 4 * lane + e];
          // The float4 the convert kernel reads them as, and where it writes it.
          const int f = group / 4 + lane;
          ASSERT_EQ(kScalar ? 4 * f - 3 * (f % 32) : 4 * f, kScalar ? group + lane : group + 4 * lane);
          int row, col;
          F::place(f, &row, &col);
          ASSERT_EQ(row, T::kRowsQ * (warp % T::kRowWarpsQ) + 16 * i + lane / 4) << "f " << f;
          ASSERT_EQ(col, T::kColsQ * (warp / T::kRowWarpsQ) + 8 * j + 2 * (lane % 4)) << "f " << f;
          for (int rr = 0; rr < 2; ++rr)
            for (int c = 0; c < 2; ++c) ++element[(row + 8 * rr) * T::kHeadDim + col + c];
        }
  for (int n : element) ASSERT_EQ(n, 1);
  for (int n : added) ASSERT_EQ(n, 1);
}

template <int kArch, int... kHeadDims>
void expect_fragment_dq_covers_every_tile() {
  (expect_fragment_dq_covers_the_tile<kArch, kHeadDims>(), ...);
}

TEST(SmemTile, FragmentDqCoversTheTileOnce) {
  expect_fragment_dq_covers_every_tile<90, 32, 64, 96, 128, 192, 256>();
  expect_fragment_dq_covers_every_tile<80, 32, 64, 96, 128, 192, 256>();
}

}  // namespace
}  // namespace fa_test
