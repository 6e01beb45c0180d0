// The persistent tile scheduler of the Hopper forward: a grid of one CTA per SM walks the work
// tiles (query tile, head, batch) with a static stride, so a CTA's producer loads the next tile's
// K/V (and Q) while its consumers finish the current one, and no CTA pays a launch per tile.
//
// Order of the tiles:
//   * no right bound (non-causal): every tile costs the same; tiles of one head are adjacent (the
//     query tile varies fastest), so the CTAs running at once share a few heads' K/V in L2.
//   * right bound (causal, windows): the longest tiles first, so the short ones fill the tail;
//     heads are taken in sections whose K/V fit in half the L2, and within a section the query
//     tile varies slowest (longest first) and the head fastest.
// Heads vary fastest within a batch entry, so query heads that share a KV head (GQA) are adjacent.
#pragma once

#include "core/softmax_state.h"  // FA_HD

namespace flashattn::cuda::sm90 {

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

}  // namespace flashattn::cuda::sm90
