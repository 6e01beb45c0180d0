// The GPU decode's split plan: how many KV splits a plan takes, from the problem, the longest cache
// it must serve and the GPU's SMs. Host code without CUDA types, so the CPU suite checks it
// (tests/cpu/decode_split_plan_test.cpp); decode.cpp calls it when planning on a device.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/params.h"
#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {

// Query rows per CTA for `rows` = group * seqlen_new query rows per KV head: 16, 32 or 64 (one
// m16 tile per warp row; more rows per CTA means fewer re-reads of K/V, see decode_kernel.cuh).
constexpr int decode_rows_per_cta(int64_t rows) { return rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }

namespace split_plan {

constexpr int64_t kBlockN = 64;  // keys per tile (decode_kernel.cuh)
// A split shorter than this many tiles spends more on its pipeline fill and partial write than
// it saves (each split pays about one load latency up front).
constexpr int64_t kMinTilesPerSplit = 2;
// Among the split counts whose estimated time is within this factor of the best, the fewest win:
// fewer splits mean a smaller workspace and less combine traffic. Measured on the H200 (bf16, 32/8
// heads, d=128, graph replay): 0.95 instead of 0.85 filled 256 rather than 224 CTA slots at b=1
// kv=131072 (3258 -> 3439 GB/s); other anchor rows unchanged.
constexpr double kNearBest = 0.95;
// Whether to plan for one CTA per SM or for every resident slot (two per SM at d = 128). One CTA
// (four warps, one per scheduler, so its own latencies are exposed) streamed a 64-key tile in about
// 1.34 us on the H200, with about 17.5 us per step on top; two per SM streamed a tile per ~1.0 us
// per SM, but the part that does not grow with the cache was ~28 us. Measured at b=1 (bf16, 32/8
// heads, d=128, graph replay; bench/results/h200_decode_splits_2026-11-29.txt and
// h200_decode_2026-11-29.txt), one per SM against two, in GB/s:
//   kv=8192   (8 tiles per SM):  contiguous 1198 vs 957, pages of 16: 1066 vs 932;
//   kv=32768  (32 tiles per SM): contiguous 2210 vs 2147, pages of 16: 1862 vs 2055, of 256: 2050 vs 2112;
//   kv=131072 (128 tiles per SM): contiguous 2848 vs 3460.
// Paged caches need the second CTA sooner (its work hides the block-table lookups), so the line is
// drawn below 32 tiles per SM.
constexpr int64_t kTwoPerSmTiles = 16;
// sm90: K/V boxes load with an L2 evict_first policy when each split streams at most this many
// tiles. The policy on every plan against the default, on an H100 (bf16, 32/8 heads, d=128, graph
// replay; bench/results/h100_session54_2026-12-06.txt, calls 1-2), by tiles a split: 4-8 (b=1 4k,
// 8k) 0.91-0.97x the time, 16 (b=1 16k and 32k, b=2 16k, b=4 8k) 0.89-0.97x, 25 (b=1 49k)
// 0.98-0.99x, 32 (b=1 65k, b=2 32k, b=8 8k) 1.00-1.02x, 64-128 (b=1 131k, b=8 32k, b=64 4k)
// 1.03-1.05x. The line sits between 25 and 32. Its gain and its loss both go with the first
// 64-column block's load (the policy on the last block only: neither).
constexpr int64_t kEvictFirstMaxTiles = 28;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace split_plan

// CTAs per (sequence, KV head, split) along the query rows.
inline int64_t decode_row_tiles(const core::DecodeParams& p) {
  const int64_t rows = p.heads_q / p.heads_kv * p.seqlen_new;
  return split_plan::ceil_div(rows, decode_rows_per_cta(rows));
}

// Key tiles one CTA may visit for caches of up to max_cache_seqlen tokens: all of a sequence's, or
// with a left window the window's reach plus the new tokens (and a right window, or the rest).
inline int64_t decode_plan_tiles(const core::DecodeParams& p, int64_t max_cache_seqlen) {
  using namespace split_plan;
  const int64_t keys = max_cache_seqlen + (p.append ? p.seqlen_new : 0);
  int64_t span = keys;
  if (p.window_left >= 0)
    span = std::min(keys, p.window_left + p.seqlen_new + (p.window_right >= 0 ? p.window_right : keys));
  return std::max<int64_t>(1, ceil_div(span, kBlockN) + (p.window_left >= 0 ? 1 : 0));
}

// Whether a plan's K/V boxes load with the L2 evict_first policy (split_plan::kEvictFirstMaxTiles).
inline bool decode_evict_first(const core::DecodeParams& p, int64_t max_cache_seqlen, int32_t splits) {
  return split_plan::ceil_div(decode_plan_tiles(p, max_cache_seqlen), std::max(splits, 1)) <=
         split_plan::kEvictFirstMaxTiles;
}

// The split count for a plan: p.num_splits when set, else the fewest splits whose grid fills the
// GPU nearly as well as any split count could: one CTA per SM for short caches, every resident
// slot (SMs x ctas_per_sm) for long ones (kTwoPerSmTiles says where the line is and why).
inline int32_t choose_decode_splits(const core::DecodeParams& p, int64_t max_cache_seqlen, int64_t num_sms,
                                    int64_t ctas_per_sm) {
  using namespace split_plan;
  if (p.num_splits > 0) return p.num_splits;
  const int64_t units = p.batch * p.heads_kv * decode_row_tiles(p);
  if (units == 0 || num_sms <= 0 || ctas_per_sm <= 0) return 1;
  const int64_t tiles = decode_plan_tiles(p, max_cache_seqlen);
  const int64_t max_splits = std::clamp<int64_t>(tiles / kMinTilesPerSplit, 1, kMaxSplits);
  // The tiles each SM would stream with the work spread evenly decide how many CTAs it should hold.
  const int64_t slots = ceil_div(units * tiles, num_sms) > kTwoPerSmTiles ? num_sms * ctas_per_sm : num_sms;
  // Time model: each CTA streams `per` tiles; CTAs run in waves of `slots`. Time ~ waves * per.
  auto time_of = [&](int64_t s) {
    const int64_t per = ceil_div(tiles, s), busy = ceil_div(tiles, per);
    return double(ceil_div(units * busy, slots) * per);
  };
  double best = time_of(1);
  for (int64_t s = 2; s <= max_splits; ++s) best = std::min(best, time_of(s));
  for (int64_t s = 1; s <= max_splits; ++s)
    if (best >= kNearBest * time_of(s)) return int32_t(s);
  return 1;
}

}  // namespace flashattn::cuda
