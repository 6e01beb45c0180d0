// Plain host/device arithmetic of the backward's workspace layout and of the deterministic mode's
// split count (no CUDA headers, so tests/cpu/bwd_layout_test.cpp checks it on any machine).
//
// Tiled rows (the Hopper path): lse2, delta and the dQ accumulator are [heads_q][tiles][tile_m
// rows], a sequence's query tiles consecutive from tile_base(b), so one query tile's values are one
// aligned, contiguous block the copy engine moves in a single bulk operation. Varlen sequences
// start at tile floor(cu_seqlens_q[b] / tile_m) + b: sequence b needs ceil(len / tile_m) tiles and
// floor(c1 / m) - floor(c0 / m) + 1 >= ceil((c1 - c0) / m), so sequences never share a tile, and
// tiles_per_head = total_q / tile_m + batch + 1 covers them all.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "core/softmax_state.h"  // FA_HD

namespace flashattn::cuda {

// First tile of sequence b in the tiled layout.
FA_HD int64_t tile_base(const core::AttnShape& p, int tile_m, int64_t b) {
  return p.cu_seqlens_q != nullptr ? int64_t(p.cu_seqlens_q[b]) / tile_m + b
                                   : b * ((p.seqlen_q + tile_m - 1) / tile_m);
}

// Tiles per query head in the tiled layout.
inline int64_t tiles_per_head(const core::AttnShape& p, int tile_m) {
  return p.cu_seqlens_q != nullptr ? p.total_q / tile_m + p.batch + 1 : p.batch * ((p.seqlen_q + tile_m - 1) / tile_m);
}

// Deterministic mode: CTAs per (KV head, batch entry), each with its own dQ slice. The fewest
// splits whose waves are filled within 5% as well as the best count up to four waves: a poorly
// filled last wave was what cost most on the H200 (2.2 waves ran at 0.66-0.86 of the default
// mode; d=96 with 168 CTAs in 1.3 waves at 0.57-0.72), and each split adds a dQ slice of memory.
inline int deterministic_splits(int64_t ctas, int64_t sms, int64_t n_blocks) {
  if (ctas < 1) ctas = 1;
  if (sms < 1) sms = 1;
  int64_t most = 4 * sms / ctas;
  if (most > n_blocks) most = n_blocks;
  if (most < 1) most = 1;
  auto fill = [&](int64_t s) { return double(ctas * s) / double((ctas * s + sms - 1) / sms * sms); };
  double best = 0;
  for (int64_t s = 1; s <= most; ++s) best = fill(s) > best ? fill(s) : best;
  int splits = 1;
  while (fill(splits) < best - 0.05) ++splits;
  return splits;
}

}  // namespace flashattn::cuda
