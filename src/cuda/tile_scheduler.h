// The order of the forward's work tiles (query tile, head, batch), shared by both GPU paths (the
// Hopper backward orders its key tiles with the same struct, bwd_launch.cuh): the
// Hopper forward's persistent CTAs walk the tile indices (a static stride, or drawn from a
// counter), and the portable forward launches one CTA per tile index (the hardware starts CTAs
// in index order).
//
// Order of the tiles:
//   * no right bound (non-causal): every tile costs the same; tiles of one head are adjacent (the
//     query tile varies fastest), so the CTAs running at once share a few heads' K/V in L2.
//   * right bound (causal, windows): the longest tiles first, so the short ones fill the tail;
//     heads are taken in sections whose K/V fit in half the L2, and within a section the query
//     tile varies slowest (longest first) and the head fastest.
// Heads vary fastest within a batch entry, so query heads that share a KV head (GQA) are adjacent.
#pragma once

#include "core/params.h"
#include "core/softmax_state.h"  // FA_HD

namespace flashattn::cuda {

struct TileScheduler {
  int num_m_blocks = 0;  // query tiles per (head, batch entry)
  int heads = 0, batch = 0;
  int section = 1;  // (head, batch) pairs per L2 section (longest-first order only)
  bool longest_first = false;

  FA_HD int num_tiles() const { return num_m_blocks * heads * batch; }

  FA_HD void tile(int idx, int* m_block, int* h, int* b) const {
    int hb;
    if (!longest_first) {
      *m_block = idx % num_m_blocks;
      hb = idx / num_m_blocks;
    } else {
      const int per_section = section * num_m_blocks;
      const int sec = idx / per_section, within = idx % per_section;
      const int pairs = heads * batch;
      const int width = pairs - sec * section < section ? pairs - sec * section : section;
      *m_block = num_m_blocks - 1 - within / width;
      hb = sec * section + within % width;
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

}  // namespace flashattn::cuda
