// The backward's work and workspace arithmetic is plain host/device code, checked here where CI
// runs: the query tiles a key tile visits (core::query_tiles_seeing, both GPU backwards) are
// exactly those holding a row that sees one of its keys; the boundary steps' 32-bit mask
// (core::MaskBand) agrees with MaskSpec; in the tiled workspace layout
// (src/cuda/bwd_layout.h) every sequence's query tiles are consecutive, no two sequences share a
// tile, and all tiles fit in tiles_per_head; the deterministic mode's turn orders keep every wait
// pointed at a CTA that runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/block_range.h"
#include "cuda/bwd_layout.h"

namespace fa_test {
namespace {

using flashattn::cuda::tile_base;
using flashattn::cuda::tiles_per_head;

TEST(BackwardLayout, KeyTilesVisitExactlyTheQueryTilesThatSeeThem) {
  using flashattn::core::MaskSpec;
  const int64_t block_m = 64, block_n = 128;
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {100, 300}, {300, 100}, {257, 257}, {64, 500}})
    for (auto [wl, wr] : {std::pair<int64_t, int64_t>{-1, -1}, {-1, 0}, {10, 0}, {37, 11}, {0, 0}, {-1, 5}}) {
      const MaskSpec mask{sq, sk, wl, wr};
      for (int64_t c0 = 0; c0 < sk; c0 += block_n) {
        const int64_t c1 = std::min(sk, c0 + block_n);
        const auto t = flashattn::core::query_tiles_seeing(mask, c0, c1, block_m);
        ASSERT_LE(t.m_begin, t.m_end);
        for (int64_t m = 0; m * block_m < sq; ++m) {
          bool sees = false;
          for (int64_t r = m * block_m; r < std::min(sq, (m + 1) * block_m) && !sees; ++r)
            for (int64_t j = c0; j < c1 && !sees; ++j) sees = mask.visible(r, j);
          EXPECT_EQ(sees, m >= t.m_begin && m < t.m_end)
              << "sq " << sq << " sk " << sk << " window (" << wl << ", " << wr << ") keys [" << c0 << ", " << c1
              << ") query tile " << m;
        }
      }
    }
}

// core::query_tiles_unmasked is tile_range's no-mask test solved for the query tile: a full query
// tile is in it exactly when tile_range over its rows says the key tile needs no mask, for every
// mask shape, full and partial key tiles, and query tiles past the keys' reach.
TEST(BackwardLayout, UnmaskedQueryTilesAgreeWithTileRange) {
  using flashattn::core::MaskSpec;
  for (auto [block_m, block_n] : {std::pair<int64_t, int64_t>{64, 128}, {128, 128}, {64, 64}, {128, 64}})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {100, 300}, {300, 100}, {257, 257}, {64, 500}, {700, 700}, {900, 130}, {5, 900}, {1024, 1024}})
      for (auto [wl, wr] : {std::pair<int64_t, int64_t>{-1, -1}, {-1, 0}, {10, 0}, {37, 11}, {0, 0}, {-1, 5}, {3, -1}, {-1, 200}, {5, 300}, {400, -1}}) {
        const MaskSpec mask{sq, sk, wl, wr};
        for (int64_t n = 0; n * block_n < sk; ++n) {
          const auto u = flashattn::core::query_tiles_unmasked(mask, n * block_n, block_n, block_m);
          for (int64_t m = 0; m * block_m < sq; ++m) {
            const int64_t r0 = m * block_m, r1 = std::min(sq, r0 + block_m);
            const auto tr = flashattn::core::tile_range(mask, r0, r1, block_n);
            // Only key tiles the query tile visits are asked about (the backward's steps).
            if (n < tr.n_begin || n >= tr.n_end) continue;
            const bool unmasked = r1 - r0 == block_m && !tr.needs_mask(n);
            EXPECT_EQ(m >= u.m_begin && m < u.m_end, unmasked)
                << "sq " << sq << " sk " << sk << " window (" << wl << ", " << wr << ") tiles " << block_m << " x "
                << block_n << ", key tile " << n << ", query tile " << m;
          }
        }
      }
}

// The deterministic backward's orders: the key tiles that visit a query tile are consecutive,
// first_key_tile_seeing is the first of them and, under a right bound, last_key_tile_seeing the
// last. Walking their query tiles downward, key tile n reaches query tile m after m_end(n) - 1 - m
// steps, so later key tiles (later turns) never arrive earlier: m_end is nondecreasing over the
// visitors. Walking upward (right bounds: turns from the last key tile down), key tile n reaches m
// after m - m_begin(n) steps, so earlier turns (later key tiles) never arrive later: m_begin is
// nondecreasing too.
TEST(BackwardLayout, KeyTilesVisitingAQueryTileAreConsecutive) {
  using flashattn::core::MaskSpec;
  for (auto [block_m, block_n] : {std::pair<int64_t, int64_t>{64, 128}, {128, 128}, {64, 64}})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {100, 300}, {300, 100}, {257, 257}, {64, 500}, {700, 700}, {900, 130}, {5, 900}})
      for (auto [wl, wr] : {std::pair<int64_t, int64_t>{-1, -1}, {-1, 0}, {10, 0}, {37, 11}, {0, 0}, {-1, 5}, {3, -1}, {-1, 200}, {5, 300}}) {
        const MaskSpec mask{sq, sk, wl, wr};
        const int64_t n_blocks = (sk + block_n - 1) / block_n;
        for (int64_t m = 0; m * block_m < sq; ++m) {
          std::vector<int64_t> visitors, m_begins, m_ends;
          for (int64_t n = 0; n < n_blocks; ++n) {
            const auto t = flashattn::core::query_tiles_seeing(mask, n * block_n, std::min(sk, (n + 1) * block_n), block_m);
            if (m >= t.m_begin && m < t.m_end) {
              visitors.push_back(n);
              m_begins.push_back(t.m_begin);
              m_ends.push_back(t.m_end);
            }
          }
          for (size_t i = 0; i < visitors.size(); ++i) {
            ASSERT_EQ(visitors[i], visitors[0] + int64_t(i)) << "sq " << sq << " sk " << sk << " window (" << wl << ", "
                                                               << wr << ") query tile " << m;
            EXPECT_EQ(flashattn::core::first_key_tile_seeing(mask, m, block_m, block_n), visitors[0]);
            if (wr >= 0)
              EXPECT_EQ(flashattn::core::last_key_tile_seeing(mask, m, block_m, block_n), visitors.back())
                  << "sq " << sq << " sk " << sk << " window (" << wl << ", " << wr << ") query tile " << m;
            if (i > 0) EXPECT_GE(m_ends[i], m_ends[i - 1]) << "key tile " << visitors[i] << ", query tile " << m;
            if (i > 0) EXPECT_GE(m_begins[i], m_begins[i - 1]) << "key tile " << visitors[i] << ", query tile " << m;
          }
        }
      }
}

// The deterministic backward's order without a mask (core::around_turn): at every query tile the
// key tiles' turns are 0..n_tiles-1 once each, a key tile whose turn comes earlier reaches the tile
// no later (its step, (m - first) mod m_tiles, is no larger), and ties go to the higher key tile at
// every query tile, so no two key tiles ever wait for each other. When n_tiles divides m_tiles (the
// square self-attention case among them) no two key tiles reach a query tile in the same step.
TEST(BackwardLayout, AroundTurnsFollowTheArrivals) {
  using flashattn::core::around_first_query_tile;
  using flashattn::core::around_turn;
  for (int64_t n_tiles = 1; n_tiles <= 40; ++n_tiles)
    for (int64_t m_tiles = 1; m_tiles <= 90; ++m_tiles)
      for (int64_t m = 0; m < m_tiles; ++m) {
        std::vector<int64_t> by_turn(size_t(n_tiles), -1);
        for (int64_t n = 0; n < n_tiles; ++n) {
          const int turn = around_turn(n, m, n_tiles, m_tiles);
          ASSERT_TRUE(turn >= 0 && turn < n_tiles) << n_tiles << " x " << m_tiles << ", key tile " << n << " at " << m;
          ASSERT_EQ(by_turn[size_t(turn)], -1) << n_tiles << " x " << m_tiles << ": turn " << turn << " twice at " << m;
          by_turn[size_t(turn)] = n;
        }
        auto step = [&](int64_t n) { return (m - around_first_query_tile(n, n_tiles, m_tiles) + m_tiles) % m_tiles; };
        for (size_t i = 1; i < by_turn.size(); ++i) {
          const int64_t before = by_turn[i - 1], after = by_turn[i];
          ASSERT_LE(step(before), step(after)) << n_tiles << " x " << m_tiles << " at " << m;
          if (step(before) == step(after)) {
            ASSERT_GT(before, after) << n_tiles << " x " << m_tiles << " at " << m;
            ASSERT_NE(m_tiles % n_tiles, 0) << n_tiles << " x " << m_tiles << " at " << m;
          }
        }
      }
}

// The Hopper backward's deterministic turn order: `up` under a right bound (at head dim 128 only up
// to 64 key tiles), `around` without a mask only while a sequence's key tiles fit the GPU twice
// over (a key tile then may wait for a later-launched one, which must find an SM) and within
// core::around_turn's 32 bits, else `down` (whose waits only ever point at earlier launches).
TEST(BackwardLayout, HopperTurnOrderKeepsAroundWithinTheGpu) {
  using flashattn::cuda::hopper_turn_order;
  using flashattn::cuda::TurnOrder;
  // Causal and windows with a right bound.
  EXPECT_EQ(hopper_turn_order(-1, 0, 64, 1000, 2000, 132), TurnOrder::up);
  EXPECT_EQ(hopper_turn_order(-1, 0, 256, 375, 375, 132), TurnOrder::up);
  EXPECT_EQ(hopper_turn_order(-1, 0, 128, 64, 128, 132), TurnOrder::up);
  EXPECT_EQ(hopper_turn_order(-1, 0, 128, 65, 130, 132), TurnOrder::down);
  EXPECT_EQ(hopper_turn_order(10, 5, 96, 200, 400, 132), TurnOrder::up);
  // No mask: around up to half the SMs' worth of key tiles.
  EXPECT_EQ(hopper_turn_order(-1, -1, 64, 66, 66, 132), TurnOrder::around);
  EXPECT_EQ(hopper_turn_order(-1, -1, 64, 67, 67, 132), TurnOrder::down);
  EXPECT_EQ(hopper_turn_order(-1, -1, 128, 1, 1, 132), TurnOrder::around);
  EXPECT_EQ(hopper_turn_order(-1, -1, 256, 50, 100, 100), TurnOrder::around);
  EXPECT_EQ(hopper_turn_order(-1, -1, 256, 51, 100, 100), TurnOrder::down);
  EXPECT_EQ(hopper_turn_order(-1, -1, 128, 16, 32, 16), TurnOrder::down);
  // Past core::around_turn's 32-bit products, and with only a left window: down.
  EXPECT_EQ(hopper_turn_order(-1, -1, 64, 60, int64_t(1) << 27, 132), TurnOrder::down);
  EXPECT_EQ(hopper_turn_order(300, -1, 64, 8, 8, 132), TurnOrder::down);
}

// core::MaskBand (the Hopper backward's boundary-step mask, 32-bit offsets from one element) agrees
// with MaskSpec element by element over a tile's offsets, for random sequence lengths, windows
// (none, zero, small, far past the sequence) and pairs anywhere in or past the sequences.
TEST(BackwardLayout, MaskBandAgreesWithMaskSpec) {
  using flashattn::core::MaskSpec;
  std::mt19937_64 rng(11);
  auto window = [&]() -> int64_t {
    switch (rng() % 4) {
      case 0: return -1;
      case 1: return 0;
      case 2: return int64_t(rng() % 300);
      default: return int64_t(1) << 40;
    }
  };
  for (int trial = 0; trial < 4000; ++trial) {
    const MaskSpec mask{int64_t(1 + rng() % 5000), int64_t(1 + rng() % 5000), window(), window()};
    const int64_t q0 = int64_t(rng() % (mask.seqlen_q + 64)), k0 = int64_t(rng() % (mask.seqlen_k + 64));
    const auto band = flashattn::core::mask_band(mask, q0, k0);
    for (int dq = 0; dq < 130; dq += 1 + int(rng() % 3))
      for (int dk = 0; dk < 130; dk += 1 + int(rng() % 3)) {
        const int64_t q = q0 + dq, k = k0 + dk;
        const bool want = q < mask.seqlen_q && k < mask.seqlen_k && mask.visible(q, k);
        ASSERT_EQ(band.visible(dq, dk), want) << "sq " << mask.seqlen_q << " sk " << mask.seqlen_k << " window ("
                                              << mask.window_left << ", " << mask.window_right << ") query " << q
                                              << " key " << k;
      }
  }
}

TEST(BackwardLayout, VarlenSequencesNeverShareATile) {
  std::mt19937 rng(7);
  for (int tile_m : {64, 128})
    for (int trial = 0; trial < 200; ++trial) {
      const int batch = 1 + int(rng() % 12);
      std::vector<int32_t> cu(batch + 1, 0);
      for (int b = 0; b < batch; ++b) {
        // Empty, short, tile-sized and long sequences, at every offset modulo the tile.
        const int kinds[] = {0, 1, tile_m - 1, tile_m, tile_m + 1, int(rng() % 1000)};
        cu[b + 1] = cu[b] + kinds[rng() % 6];
      }
      flashattn::core::AttnShape p;
      p.batch = batch;
      p.total_q = cu[batch];
      p.cu_seqlens_q = cu.data();
      const int64_t tiles = tiles_per_head(p, tile_m);
      int64_t next_free = 0;
      for (int b = 0; b < batch; ++b) {
        const int64_t len = cu[b + 1] - cu[b], first = tile_base(p, tile_m, b);
        const int64_t used = (len + tile_m - 1) / tile_m;
        ASSERT_GE(first, next_free) << "sequence " << b << " overlaps the previous one";
        next_free = first + used;
        ASSERT_LE(next_free, tiles) << "sequence " << b << " runs past tiles_per_head";
      }
    }
}

TEST(BackwardLayout, FixedLengthTilesArePacked) {
  flashattn::core::AttnShape p;
  p.batch = 3;
  p.seqlen_q = 130;
  EXPECT_EQ(tiles_per_head(p, 64), 9);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(tile_base(p, 64, b), 3 * b);
}

// The portable backward's turns (one CTA per key tile, `resident` CTAs at once): the same orders
// without the Hopper kernels' d=128 exception.
TEST(BackwardLayout, PortableTurnOrderKeepsAroundWithinTheGpu) {
  using flashattn::cuda::turn_order;
  using flashattn::cuda::TurnOrder;
  EXPECT_EQ(turn_order(-1, 0, 188, 376, 132), TurnOrder::up);
  EXPECT_EQ(turn_order(37, 11, 5, 10, 132), TurnOrder::up);
  EXPECT_EQ(turn_order(-1, -1, 66, 132, 132), TurnOrder::around);
  EXPECT_EQ(turn_order(-1, -1, 67, 134, 132), TurnOrder::down);
  EXPECT_EQ(turn_order(-1, -1, 67, 134, 264), TurnOrder::around);  // two CTAs per SM
  EXPECT_EQ(turn_order(-1, -1, 60, int64_t(1) << 27, 132), TurnOrder::down);
  EXPECT_EQ(turn_order(300, -1, 8, 8, 132), TurnOrder::down);
}

}  // namespace
}  // namespace fa_test
