// The GPU forward's tile order (src/cuda/tile_scheduler.h) is plain host/device code: its
// promises are checked here, where CI runs. Every index maps to a distinct (query tile, head,
// batch); without a right bound a head's query tiles are adjacent; with one, tiles come longest
// first within each L2 section of heads, and sections cover the heads in order; a section's K and
// V fit in half the L2; the backward's key-tile order; the stream-K tail's units; the stride's CTA
// pairs on adjacent query tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include "cuda/tile_scheduler.h"

namespace fa_test {
namespace {

using flashattn::cuda::TileScheduler;
using flashattn::cuda::WorkUnit;

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
  // 10 (head, batch) pairs, at most 4 per section: three sections, of 4, 3 and 3 pairs (not 4, 4
  // and 2, whose last would run its longest tiles alone at the end).
  const int m = 6, heads = 5, batch = 2, section = 4;
  TileScheduler s{m, heads, batch, section, true};
  const int first_pair[] = {0, 4, 7, 10};
  auto section_of = [&](int pair) { return int(std::upper_bound(first_pair, first_pair + 4, pair) - first_pair) - 1; };
  std::vector<int> tiles_per_section(3, 0);
  int prev_m = m, prev_section = 0;
  for (int i = 0; i < s.num_tiles(); ++i) {
    int mb, h, b;
    s.tile(i, &mb, &h, &b);
    const int sec = section_of(h + heads * b);
    ++tiles_per_section[sec];
    ASSERT_GE(sec, prev_section) << i;
    if (sec != prev_section) {
      ASSERT_EQ(mb, m - 1) << "tile " << i << ": a section starts with its longest tiles";
      prev_section = sec;
    } else {
      ASSERT_LE(mb, prev_m) << "tile " << i << " is longer than the one before it";
    }
    prev_m = mb;
  }
  EXPECT_EQ(tiles_per_section, (std::vector<int>{4 * m, 3 * m, 3 * m}));
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

TEST(TileScheduler, BackwardKeyTilesLongestFirstUnderARightBound) {
  using flashattn::cuda::make_key_tile_order;
  const int l2 = 50 << 20;
  // 2k queries at d=128: Q, dO and the dQ accumulator take 8 x 2048 x 128 bytes = 2 MB per (KV
  // head, batch) pair, so 12 pairs per section; 4 query heads per KV head take four times that.
  TileScheduler s = make_key_tile_order(shape(2048, 2048, 16, 16, 8, 0, 128), 16, 128, false, l2);
  EXPECT_TRUE(s.longest_first);
  EXPECT_EQ(s.num_m_blocks, 16);
  EXPECT_EQ(s.heads * s.batch, 128);
  EXPECT_EQ(s.section, 12);
  EXPECT_EQ(make_key_tile_order(shape(2048, 2048, 32, 8, 8, 0, 128), 16, 128, false, l2).section, 3);
  // No right bound, or the deterministic mode's own order, or more key tiles than an int counts:
  // the grid's order.
  EXPECT_FALSE(make_key_tile_order(shape(2048, 2048, 16, 16, 8, -1, 128), 16, 128, false, l2).longest_first);
  EXPECT_FALSE(make_key_tile_order(shape(2048, 2048, 16, 16, 8, 0, 128), 16, 128, true, l2).longest_first);
  EXPECT_FALSE(make_key_tile_order(shape(2048, 2048, 16, 16, 8, 0, 128), int64_t(1) << 28, 128, false, l2).longest_first);
}

// The stream-K tail: every key tile of every work tile is computed exactly once; the whole waves
// go by the stride; a tile is cut at most once, its two units naming the same merge slot (below
// the grid, one slot per cut); and no CTA gets more key tiles than the span.
TEST(TileScheduler, StreamKUnitsCoverEveryKeyTileOnce) {
  struct Shape {
    int m, h, b, grid, iters;
  };
  for (const Shape& sh : {Shape{16, 16, 8, 132, 16}, Shape{16, 16, 8, 132, 128}, Shape{11, 20, 1, 132, 12},
                          Shape{7, 20, 1, 132, 4}, Shape{5, 3, 2, 7, 9}, Shape{3, 5, 1, 4, 1000}}) {
    TileScheduler s{sh.m, sh.h, sh.b, 1, false};
    ASSERT_TRUE(flashattn::cuda::cut_tail(s, sh.grid, sh.iters)) << sh.m * sh.h * sh.b << " tiles on " << sh.grid;
    ASSERT_GT(s.sk_span, 0);
    const int n = s.num_tiles();
    EXPECT_EQ(s.dp_tiles % sh.grid, 0);
    EXPECT_EQ(n - s.dp_tiles, sh.grid + n % sh.grid) << "the last whole wave and the partial one are cut";
    std::vector<int> seen(size_t(n) * sh.iters, 0);
    std::vector<std::vector<int>> slots_of_tile(n);
    std::set<int> slots;
    for (int cta = 0; cta < sh.grid; ++cta) {
      int sk_iters = 0;
      WorkUnit u;
      for (int j = 0; s.unit(cta, sh.grid, j, &u); ++j) {
        ASSERT_TRUE(u.idx >= 0 && u.idx < n) << cta << " " << j;
        const int end = u.it_end > sh.iters ? sh.iters : u.it_end;
        ASSERT_TRUE(u.it_begin >= 0 && u.it_begin < end) << cta << " " << j;
        if (u.idx < s.dp_tiles) {
          EXPECT_EQ(u.idx % sh.grid, cta) << "whole tiles by the stride";
          EXPECT_EQ(u.split, -1);
          EXPECT_EQ(u.it_begin, 0);
        } else {
          sk_iters += end - u.it_begin;
          const bool whole = u.it_begin == 0 && end == sh.iters;
          EXPECT_EQ(u.split >= 0, !whole) << "tile " << u.idx;
          if (!whole) {
            ASSERT_TRUE(u.split > 0 && u.split < sh.grid) << u.split;
            slots_of_tile[u.idx].push_back(u.split);
          }
        }
        for (int i = u.it_begin; i < end; ++i) ++seen[size_t(u.idx) * sh.iters + i];
      }
      EXPECT_LE(sk_iters, s.sk_span) << "CTA " << cta;
    }
    for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "tile " << i / sh.iters << " key tile " << i % sh.iters;
    for (int t = 0; t < n; ++t) {
      const auto& v = slots_of_tile[t];
      ASSERT_TRUE(v.empty() || (v.size() == 2 && v[0] == v[1])) << "tile " << t << " in " << v.size() << " parts";
      if (!v.empty()) EXPECT_TRUE(slots.insert(v[0]).second) << "slot " << v[0] << " serves two tiles";
    }
  }
}

// The plan: on for few waves of long enough tiles (tests/gpu/forward_test.cpp's
// TilesCutAcrossCtasInTheLastWave shapes, and the measured d=64 and d=128 shapes of 288 tiles); off
// without a partial wave, with fewer tiles than CTAs, past two whole waves (the anchors' 2048
// tiles), and where tiles are too short for the cut's extra units to pay (tests/gpu/
// forward_test.cpp's ManyTilesPerCtaWithPingPong shape).
TEST(TileScheduler, StreamKOnlyWhereItPays) {
  auto planned = [](int tiles_m, int heads, int grid, int iters) {
    TileScheduler s{tiles_m, heads, 1, 1, false};
    flashattn::cuda::plan_stream_k(s, grid, iters);
    return s.sk_span > 0;
  };
  EXPECT_TRUE(planned(7, 20, 132, 8));      // 140 tiles of 8 key tiles
  EXPECT_TRUE(planned(7, 20, 132, 9));      // and of 9 (tests/gpu/forward_test.cpp's last cut shape)
  EXPECT_TRUE(planned(12, 24, 132, 12));    // d=128, s=1536, 24 heads
  EXPECT_TRUE(planned(6, 48, 132, 8));      // d=64, s=1024, 48 heads
  EXPECT_FALSE(planned(12, 11, 132, 16));   // 132 tiles: one whole wave
  EXPECT_FALSE(planned(10, 13, 132, 16));   // 130 tiles: one partial wave
  EXPECT_FALSE(planned(40, 16, 132, 32));   // 640 tiles: 4.8 waves
  EXPECT_FALSE(planned(16, 128, 132, 16));  // 2048 tiles: 15.5 waves
  EXPECT_FALSE(planned(71, 4, 132, 2));     // 284 tiles of 2 key tiles
  EXPECT_FALSE(planned(7, 20, 132, 0));     // no keys
  TileScheduler off{16, 128, 1, 1, false};
  flashattn::cuda::plan_stream_k(off, 132, 16);
  WorkUnit u;
  for (int j = 0; off.unit(5, 132, j, &u); ++j) EXPECT_EQ(u.idx, 5 + 132 * j);
}

// The portable backward's cut tail (src/cuda/sm80/bwd_launch.cuh): only a partial last wave is
// cut, into pieces that finish it sooner than one whole key tile would, within the partials' memory.
TEST(TileScheduler, TailPiecesOnlyWhereTheyPay) {
  using flashattn::cuda::plan_tail_pieces;
  constexpr int64_t kPiece = 2 * 64 * 256 * 4, kMax = int64_t(64) << 20;  // d=256: 64 keys' dK, dV
  // d=256 at 16k tokens on 132 SMs: 2048 key tiles of 256 query tiles, 15 waves and 68 tiles.
  const auto anchors = plan_tail_pieces(2048, 256, 132, kPiece, kMax);
  EXPECT_EQ(anchors.tiles, 68);
  EXPECT_EQ(anchors.parts, 7);  // 8 would pass 64 MB of partials
  EXPECT_EQ(plan_tail_pieces(2048, 256, 132, kPiece, 68 * 3 * kPiece).parts, 3);
  EXPECT_EQ(plan_tail_pieces(264, 256, 132, kPiece, kMax).parts, 0);  // whole waves
  EXPECT_EQ(plan_tail_pieces(100, 256, 132, kPiece, kMax).parts, 0);  // one partial wave only
  EXPECT_EQ(plan_tail_pieces(263, 4, 132, kPiece, kMax).parts, 0);    // 131 short tiles: no gain
  EXPECT_EQ(plan_tail_pieces(2048, 1, 132, kPiece, kMax).parts, 0);   // one query tile
  EXPECT_EQ(plan_tail_pieces(2048, 256, 0, kPiece, kMax).parts, 0);   // no resident CTA
  for (int64_t key_tiles = 133; key_tiles < 800; key_tiles += 37)
    for (int64_t query_tiles : {2, 5, 16, 64, 257}) {
      const auto t = plan_tail_pieces(key_tiles, query_tiles, 132, kPiece, kMax);
      if (t.parts == 0) continue;
      EXPECT_EQ(t.tiles, key_tiles % 132);
      EXPECT_LE(t.parts, 16);
      EXPECT_LE(t.tiles * t.parts * kPiece, kMax);
      const int64_t cut = (t.tiles * t.parts + 131) / 132 * ((query_tiles + t.parts - 1) / t.parts + 1);
      EXPECT_LT(cut, query_tiles) << key_tiles << " key tiles of " << query_tiles;
    }
}

// The Hopper forward's CTA pairs (src/cuda/sm90/fwd_launch.cuh) rest on the plain stride: with an
// even grid and an even number of query tiles per head, CTAs 2c and 2c + 1 take, at every step,
// query tiles 2i and 2i + 1 of one (head, batch), and both run out of tiles at the same step (the
// multicast halves of one CTA would otherwise never reach its partner).
TEST(TileScheduler, PairsOfCtasTakeAdjacentQueryTilesOfOneHead) {
  for (auto [m, h, b, grid] : {std::tuple{16, 16, 8, 132}, std::tuple{2, 5, 3, 132}, std::tuple{8, 7, 1, 132},
                               std::tuple{6, 13, 2, 10}, std::tuple{4, 1, 1, 2}}) {
    const TileScheduler s{m, h, b, 1, false};
    const int launched = std::min(grid, s.num_tiles());
    ASSERT_EQ(launched % 2, 0);
    for (int c = 0; c < launched / 2; ++c) {
      WorkUnit u0, u1;
      int j = 0;
      for (;; ++j) {
        const bool more0 = s.unit(2 * c, launched, j, &u0), more1 = s.unit(2 * c + 1, launched, j, &u1);
        ASSERT_EQ(more0, more1) << "pair " << c << " step " << j;
        if (!more0) break;
        int m0, h0, b0, m1, h1, b1;
        s.tile(u0.idx, &m0, &h0, &b0);
        s.tile(u1.idx, &m1, &h1, &b1);
        EXPECT_TRUE(m0 % 2 == 0 && m1 == m0 + 1 && h1 == h0 && b1 == b0) << "pair " << c << " step " << j;
      }
      EXPECT_GT(j, 0);
    }
  }
}

}  // namespace
}  // namespace fa_test
