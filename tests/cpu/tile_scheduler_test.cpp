// The GPU forward's tile order (src/cuda/tile_scheduler.h) is plain host/device code: its
// promises are checked here, where CI runs. Every index maps to a distinct (query tile, head,
// batch); without a right bound a head's query tiles are adjacent; with one, tiles come longest
// first within each L2 section of heads, and sections cover the heads in order; a section's K and
// V fit in half the L2.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "cuda/tile_scheduler.h"

namespace fa_test {
namespace {

using flashattn::cuda::TileScheduler;

TEST(TileScheduler, EveryTileExactlyOnce) {
  for (bool longest_first : {false, true})
    for (int section : {1, 3, 7, 64})
      for (auto [m, h, b] : {std::tuple{1, 1, 1}, std::tuple{5, 3, 2}, std::tuple{16, 16, 8}, std::tuple{7, 1, 9}}) {
        TileScheduler s{m, h, b, section, longest_first};
        std::set<std::tuple<int, int, int>> seen;
        for (int i = 0; i < s.num_tiles(); ++i) {
          int mb, hh, bb;
          s.tile(i, &mb, &hh, &bb);
          ASSERT_TRUE(mb >= 0 && mb < m && hh >= 0 && hh < h && bb >= 0 && bb < b) << i;
          ASSERT_TRUE(seen.insert({mb, hh, bb}).second) << "tile " << i << " repeats";
        }
        EXPECT_EQ(int(seen.size()), m * h * b);
      }
}

TEST(TileScheduler, StaticOrderKeepsAHeadsTilesTogether) {
  TileScheduler s{4, 3, 2, 1, false};
  for (int i = 0; i < s.num_tiles(); ++i) {
    int m, h, b;
    s.tile(i, &m, &h, &b);
    EXPECT_EQ(m, i % 4);
    EXPECT_EQ(h + 3 * b, i / 4);  // heads fastest within a batch entry (GQA groups adjacent)
  }
}

TEST(TileScheduler, CausalOrderIsLongestFirstWithinSections) {
  const int m = 6, heads = 5, batch = 2, section = 4;  // 10 (head, batch) pairs: sections of 4, 4, 2
  TileScheduler s{m, heads, batch, section, true};
  int prev_m = m, prev_section = 0;
  for (int i = 0; i < s.num_tiles(); ++i) {
    int mb, h, b;
    s.tile(i, &mb, &h, &b);
    const int sec = (h + heads * b) / section;
    ASSERT_GE(sec, prev_section) << i;
    if (sec != prev_section) {
      ASSERT_EQ(mb, m - 1) << "tile " << i << ": a section starts with its longest tiles";
      prev_section = sec;
    } else {
      ASSERT_LE(mb, prev_m) << "tile " << i << " is longer than the one before it";
    }
    prev_m = mb;
  }
}

// A forward call's shape, as the builder reads it.
flashattn::core::ForwardParams shape(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t batch, int64_t window_right,
                                     int64_t d) {
  flashattn::core::ForwardParams p;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.batch = batch;
  p.window_right = window_right;
  p.head_dim = d;
  return p;
}

TEST(TileScheduler, SectionsFitHalfTheL2) {
  using flashattn::cuda::make_tile_scheduler;
  const int l2 = 50 << 20;
  // 2k keys at d=128 in bf16: 1 MB of K and V per head, so 25 heads per section.
  TileScheduler s = make_tile_scheduler(shape(2048, 2048, 16, 16, 8, 0, 128), 128, l2);
  EXPECT_EQ(s.num_m_blocks, 16);
  EXPECT_TRUE(s.longest_first);
  EXPECT_EQ(s.section, 25);
  // GQA: 4 query heads share each KV head's megabyte, so four times as many query heads fit.
  EXPECT_EQ(make_tile_scheduler(shape(2048, 2048, 32, 8, 8, 0, 128), 128, l2).section, 100);
  // Never more than the (head, batch) pairs, never fewer than one, even when one head overflows.
  EXPECT_EQ(make_tile_scheduler(shape(2048, 2048, 4, 4, 2, 0, 128), 128, l2).section, 8);
  EXPECT_EQ(make_tile_scheduler(shape(1 << 20, 1 << 20, 4, 4, 1, 0, 256), 128, l2).section, 1);
  // No right bound: the static order, one query tile past a partial end.
  s = make_tile_scheduler(shape(1000, 3000, 8, 8, 2, -1, 64), 128, l2);
  EXPECT_FALSE(s.longest_first);
  EXPECT_EQ(s.num_m_blocks, 8);
  EXPECT_EQ(s.num_tiles(), 8 * 8 * 2);
}

}  // namespace
}  // namespace fa_test
