// The order of the forward's work tiles (query tile, head, batch), shared by both GPU paths (both
// backwards order their key tiles with the same struct under a right bound, make_key_tile_order):
// the Hopper forward's persistent CTAs walk the tile indices (a static stride, or drawn from a
// counter), and the portable forward launches one CTA per tile index (the hardware starts CTAs in
// index order).
//
// Order of the tiles:
//   * no right bound (non-causal): every tile costs the same; tiles of one head are adjacent (the
//     query tile varies fastest), so the CTAs running at once share a few heads' K/V in L2.
//   * right bound (causal, windows): the longest tiles first, so the short ones fill the tail;
//     heads are taken in sections whose K/V fit in half the L2, and within a section the query
//     tile varies slowest (longest first) and the head fastest. The sections are the fewest that
//     respect `section` and as equal as they can be (widths differ by at most one pair): a last
//     section of a few pairs would start its longest tiles when the others are nearly done and
//     run the tail on a few SMs.
// Heads vary fastest within a batch entry, so query heads that share a KV head (GQA) are adjacent.
//
// Stream-K tail (Hopper forward, equal tiles only): 288 tiles on 132 SMs are 2.2 waves, so by the
// static stride most SMs idle through the third. With sk_span set, the CTAs take tiles
// [0, dp_tiles) whole by the stride (whole waves) and then cut the rest, as one run of key tiles,
// into a span of sk_span key tiles each: every CTA ends at the same time, give or take one key
// tile. A span is at least one tile long, so a tile is cut at most once, into two units on two
// CTAs; the kernel merges their states (fwd_kernel.cuh). Units count key tiles in the kernel's
// visiting order (from the last key tile down).
#pragma once

#include <climits>
#include <cstdint>

#include "core/params.h"
#include "core/softmax_state.h"  // FA_HD

namespace flashattn::cuda {

// A persistent CTA's piece of work: key tiles [it_begin, it_end) (visiting order) of work tile
// idx; split >= 0 names the stream-K cut that halved the tile (the CTA index whose span starts
// there), whose two units meet in merge slot `split`; -1 for a whole tile.
struct WorkUnit {
  int idx = 0;
  int it_begin = 0, it_end = INT_MAX;
  int split = -1;
};

struct TileScheduler {
  int num_m_blocks = 0;  // query tiles per (head, batch entry)
  int heads = 0, batch = 0;
  int section = 1;  // at most this many (head, batch) pairs per L2 section (longest-first order only)
  bool longest_first = false;
  // Stream-K tail (sk_span = 0: off): tiles [0, dp_tiles) whole by the static stride (a multiple
  // of the grid), the rest in spans of sk_span key tiles; every tile has tile_iters key tiles.
  int dp_tiles = 0;
  int tile_iters = 0;
  int sk_span = 0;

  FA_HD int num_tiles() const { return num_m_blocks * heads * batch; }

  // The j-th unit of CTA `cta` of `grid` under the static order; false when the CTA is done.
  // Integer arithmetic in 32 bits (cut_tail keeps the stream-K key tiles below INT_MAX): a
  // 64-bit division is a call, and the producer thread runs on 24 registers. A kernel built
  // without the tail (kTail = false) compiles the plain stride alone.
  template <bool kTail = true>
  FA_HD bool unit(int cta, int grid, int j, WorkUnit* u) const {
    const int dp_waves = !kTail || sk_span == 0 ? INT_MAX : dp_tiles / grid;
    if (j < dp_waves) {
      u->idx = cta + j * grid;
      u->it_begin = 0;
      u->it_end = INT_MAX;
      u->split = -1;
      return u->idx < num_tiles();
    }
    const int total = (num_tiles() - dp_tiles) * tile_iters;
    const int s = cta * sk_span;
    const int e = total - s < sk_span ? total : s + sk_span;
    const int k = j - dp_waves;
    const int start = k == 0 ? s : (s / tile_iters + k) * tile_iters;
    if (start >= e) return false;
    const int t = start / tile_iters;
    const int tile_end = (t + 1) * tile_iters;
    u->idx = dp_tiles + t;
    u->it_begin = start - t * tile_iters;
    u->it_end = (e < tile_end ? e : tile_end) - t * tile_iters;
    u->split = u->it_begin > 0 ? cta : (u->it_end < tile_iters ? cta + 1 : -1);
    return true;
  }

  FA_HD void tile(int idx, int* m_block, int* h, int* b) const {
    int hb;
    if (!longest_first) {
      *m_block = idx % num_m_blocks;
      hb = idx / num_m_blocks;
    } else {
      // ceil(pairs / section) sections: the first `wide` of them q + 1 pairs wide, the rest q.
      const int pairs = heads * batch;
      const int sections = (pairs + section - 1) / section;
      const int q = pairs / sections, wide = pairs % sections;
      const int wide_tiles = wide * (q + 1) * num_m_blocks;
      const bool in_wide = idx < wide_tiles;
      const int width = in_wide ? q + 1 : q;
      const int rest = in_wide ? idx : idx - wide_tiles;
      const int sec = rest / (width * num_m_blocks), within = rest % (width * num_m_blocks);
      *m_block = num_m_blocks - 1 - within / width;
      hb = (in_wide ? 0 : wide * (q + 1)) + sec * width + within % width;
    }
    *h = hb % heads;
    *b = hb / heads;
  }
};

// (head, batch) pairs per L2 section: as many as fit half the L2 (l2_bytes) when each pair's
// shared data takes bytes_per_pair, at least 1 and at most all `pairs`.
inline int l2_section(double bytes_per_pair, double pairs, int l2_bytes) {
  const double fit = 0.5 * double(l2_bytes) / (bytes_per_pair > 1.0 ? bytes_per_pair : 1.0);
  return int(fit < 1.0 ? 1.0 : (fit > pairs ? pairs : fit));
}

// The schedule of a forward call with query tiles of block_m rows: longest first under a right
// bound, heads in sections whose K and V (shared by a GQA group; 16-bit elements, the GPU paths'
// dtypes) fill at most half the L2, so the CTAs running at once still find their K/V there.
inline TileScheduler make_tile_scheduler(const core::ForwardParams& p, int block_m, int l2_bytes) {
  TileScheduler s;
  s.num_m_blocks = int((p.seqlen_q + block_m - 1) / block_m);
  s.heads = int(p.heads_q);
  s.batch = int(p.batch);
  s.longest_first = p.window_right >= 0;
  const double kv_bytes_per_head = 2.0 * double(p.seqlen_k) * double(p.head_dim) * 2 / double(p.group());
  s.section = l2_section(kv_bytes_per_head, double(p.heads_q) * double(p.batch), l2_bytes);
  return s;
}

// The order of a backward call's key tiles (n_blocks per (KV head, batch) pair; both paths): under
// a right bound and outside the deterministic mode (`ordered`, whose turns fix the launch order
// themselves) longest first, the lowest key tile being the longest, with the pairs in sections
// whose query-side data (Q and dO in 16 bits, the fp32 dQ accumulator, of tile_dim columns for
// every query head of the group) fill at most half the L2, so the CTAs running at once find it
// there. Tile indices are int: a call with more key tiles keeps the grid's own order.
inline TileScheduler make_key_tile_order(const core::ForwardParams& p, int64_t n_blocks, int64_t tile_dim, bool ordered,
                                         int l2_bytes) {
  TileScheduler s;
  s.num_m_blocks = int(n_blocks < INT_MAX ? n_blocks : INT_MAX);
  s.heads = int(p.heads_kv);
  s.batch = int(p.batch);
  s.longest_first = !ordered && p.window_right >= 0 && n_blocks * p.heads_kv * p.batch <= INT_MAX;
  s.section = l2_section(8.0 * double(p.seqlen_q) * double(tile_dim) * double(p.group()),
                         double(p.heads_kv) * double(p.batch), l2_bytes);
  return s;
}

// Cuts the tail for `grid` persistent CTAs, every tile having tile_iters key tiles: the last whole
// wave and the partial one (grid + r tiles) go in equal spans. False (and the plain stride,
// sk_span = 0) when there is no partial wave or no whole one, or unit()'s 32-bit sums could overflow.
inline bool cut_tail(TileScheduler& s, int grid, int64_t tile_iters) {
  s.sk_span = 0;
  const int64_t n = s.num_tiles(), waves = grid > 0 ? n / grid : 0, r = grid > 0 ? n % grid : 0;
  if (waves < 1 || r == 0 || tile_iters < 1) return false;
  const int64_t sk_tiles = grid + r;
  if (sk_tiles * tile_iters + 2 * tile_iters + grid >= int64_t(INT_MAX)) return false;
  s.dp_tiles = int(n - sk_tiles);
  s.tile_iters = int(tile_iters);
  s.sk_span = int((sk_tiles * tile_iters + grid - 1) / grid);
  return true;
}

// The stream-K tail where it pays (the caller knows every tile has tile_iters key tiles: no mask,
// no varlen). Costs in key tiles: a unit's setup and epilogue about one (2 us per work tile at
// d=128 by a clock64 timeline, a key tile's GEMMs 1.8 us), up to three units per CTA, a merge one,
// and two for the call's zeroing of the flags (a memset before the kernel). Only up to two whole
// waves: beyond, the partial last wave cost less than its share on the H200 (the SMs it leaves
// idle let the others run faster), and the cut measured 0.97-1.02 of the stride at 5 and 15.5
// waves (bench/results/h200_session26_2026-12-03.txt).
inline void plan_stream_k(TileScheduler& s, int grid, int64_t tile_iters) {
  if (!cut_tail(s, grid, tile_iters)) return;
  const int64_t waves = s.num_tiles() / grid;
  constexpr int64_t kUnit = 1, kMerge = 1, kZero = 2;
  const int64_t whole = (waves + 1) * (tile_iters + kUnit);
  const int64_t cut = (waves - 1) * (tile_iters + kUnit) + s.sk_span + 3 * kUnit + kMerge + kZero;
  if (waves > 2 || cut >= whole) s.sk_span = 0;
}

// The portable backward's cut tail (default mode, no mask, fixed lengths: every key tile walks the
// same query_tiles query tiles). When key_tiles fill whole waves of `slots` resident CTAs and part
// of one more, the last, partial wave's r tiles go in `parts` pieces, each an equal share of the
// query tiles on a CTA of its own, so that the tail's work spreads over the GPU instead of leaving
// most SMs idle for a whole tile's time; sm80/bwd_kernel.cuh's merge kernel then adds each cut
// tile's pieces up. A piece costs about one query tile more than its share (its K and V loads, its
// fp32 dK and dV out and back). `parts` minimizes the tail's time in query tiles, ceil(r parts /
// slots) (ceil(query tiles / parts) + 1), against one whole tile's, at most 16 and within
// max_bytes of partials (piece_bytes each). {0, 0}: the plain grid. H200 (session 49, bench/results/
// h200_session49_2026-12-06.txt, call 3): 1.02-1.03x at d=128 and 256, 4k-16k.
struct TailPieces {
  int64_t tiles = 0;  // the cut key tiles: the last `tiles` of the grid's order
  int parts = 0;      // pieces per cut tile
};

inline TailPieces plan_tail_pieces(int64_t key_tiles, int64_t query_tiles, int64_t slots, int64_t piece_bytes,
                                   int64_t max_bytes) {
  TailPieces t;
  const int64_t r = slots > 0 ? key_tiles % slots : 0;
  // Tile and piece indices are int, and so is a piece's bound on the query tiles, part * count.
  if (r == 0 || key_tiles < slots || key_tiles > INT_MAX / 16 || query_tiles < 2 || query_tiles > INT_MAX / 16)
    return t;
  int64_t best = query_tiles;
  for (int k = 2; k <= 16 && k <= query_tiles && r * k * piece_bytes <= max_bytes; ++k) {
    const int64_t cost = (r * k + slots - 1) / slots * ((query_tiles + k - 1) / k + 1);
    if (cost < best) {
      best = cost;
      t.parts = k;
    }
  }
  if (t.parts > 0) t.tiles = r;
  return t;
}

}  // namespace flashattn::cuda
