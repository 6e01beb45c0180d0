// The GPU decode's split plan (src/cuda/decode/split_plan.h) is host code: checked here, where CI
// runs. The anchor rows get the split counts the H200 measurements chose (forcing others was
// slower, bench/results/h200_session32_2026-12-04.txt, call 4); a forced count is kept; the count
// stays within its bounds; a sliding window plans for the keys it reaches, not for the cache.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda/decode/split_plan.h"

namespace fa_test {
namespace {

using flashattn::cuda::choose_decode_splits;

// 32 query heads over 8 KV heads, d = 128, one new token: the anchors' decode rows.
flashattn::core::DecodeParams anchor(int64_t batch) {
  flashattn::core::DecodeParams p;
  p.batch = batch;
  p.heads_q = 32;
  p.heads_kv = 8;
  p.head_dim = 128;
  p.seqlen_new = 1;
  return p;
}

constexpr int64_t kSms = 132;      // H100 / H200
constexpr int64_t kCtasPerSm = 2;  // the d = 128 kernel with 16 rows per CTA

TEST(DecodeSplitPlan, AnchorRowsGetTheMeasuredCounts) {
  // b=1: one CTA per SM while the cache is short (8k: 16 splits, 128 CTAs), every slot from 32k on.
  EXPECT_EQ(choose_decode_splits(anchor(1), 8192, kSms, kCtasPerSm), 16);
  EXPECT_EQ(choose_decode_splits(anchor(1), 32768, kSms, kCtasPerSm), 32);
  EXPECT_EQ(choose_decode_splits(anchor(1), 131072, kSms, kCtasPerSm), 32);
  // Batches fill the GPU themselves: 4 splits (256 CTAs) at b=8 32k, none at b=64 4k.
  EXPECT_EQ(choose_decode_splits(anchor(8), 32768, kSms, kCtasPerSm), 4);
  EXPECT_EQ(choose_decode_splits(anchor(64), 4096, kSms, kCtasPerSm), 1);
}

TEST(DecodeSplitPlan, EvictFirstOnlyWhereSplitsAreShort) {
  using flashattn::cuda::decode_evict_first;
  // The anchor rows with their planned splits: 8 and 16 tiles a split take the policy, 64 and 128 do not;
  // the measured rows either side of the line: 25 tiles take it, 32 do not.
  EXPECT_TRUE(decode_evict_first(anchor(1), 8192, 16));
  EXPECT_TRUE(decode_evict_first(anchor(1), 32768, 32));
  EXPECT_TRUE(decode_evict_first(anchor(1), 49152, 31));
  EXPECT_FALSE(decode_evict_first(anchor(1), 65536, 32));
  EXPECT_FALSE(decode_evict_first(anchor(2), 32768, 16));
  EXPECT_FALSE(decode_evict_first(anchor(1), 131072, 32));
  EXPECT_FALSE(decode_evict_first(anchor(8), 32768, 4));
  EXPECT_FALSE(decode_evict_first(anchor(64), 4096, 1));
  // Short caches too, and a window counts the keys it reaches, not the cache.
  EXPECT_TRUE(decode_evict_first(anchor(64), 512, 1));
  flashattn::core::DecodeParams w = anchor(1);
  w.window_left = 511;
  w.window_right = 0;
  EXPECT_TRUE(decode_evict_first(w, 131072, 1));
}

TEST(DecodeSplitPlan, ForcedCountAndDegenerateProblems) {
  auto p = anchor(1);
  p.num_splits = 7;
  EXPECT_EQ(choose_decode_splits(p, 131072, kSms, kCtasPerSm), 7);
  EXPECT_EQ(choose_decode_splits(anchor(0), 131072, kSms, kCtasPerSm), 1);  // no sequences
  EXPECT_EQ(choose_decode_splits(anchor(1), 0, kSms, kCtasPerSm), 1);       // an empty cache
  EXPECT_EQ(choose_decode_splits(anchor(1), 100, kSms, kCtasPerSm), 1);     // two tiles: one split
}

TEST(DecodeSplitPlan, StaysWithinItsBounds) {
  for (int64_t batch : {1, 2, 3, 8, 64, 200})
    for (int64_t keys : {1, 63, 64, 65, 1000, 8192, 100000, 1 << 20})
      for (int64_t sms : {1, 46, 132})
        for (int64_t per_sm : {1, 2}) {
          const int32_t s = choose_decode_splits(anchor(batch), keys, sms, per_sm);
          const int64_t tiles = (keys + 63) / 64;
          // At least two tiles per split (its pipeline fill must pay), at most kMaxSplits.
          EXPECT_GE(s, 1);
          EXPECT_LE(s, std::max<int64_t>(1, std::min<int64_t>(tiles / 2, flashattn::kMaxSplits)))
              << "batch " << batch << " keys " << keys << " sms " << sms;
        }
}

TEST(DecodeSplitPlan, WindowPlansForTheKeysItReaches) {
  // A left window of 4095 tokens over a 131k cache (causal: no keys right of the token) reaches
  // 4096 keys, which may straddle one more tile: it plans as a 65-tile cache, not a 2048-tile one.
  auto windowed = anchor(1);
  windowed.window_left = 4095;
  windowed.window_right = 0;
  EXPECT_EQ(choose_decode_splits(windowed, 131072, kSms, kCtasPerSm),
            choose_decode_splits(anchor(1), 65 * 64, kSms, kCtasPerSm));
  EXPECT_LT(choose_decode_splits(windowed, 131072, kSms, kCtasPerSm),
            choose_decode_splits(anchor(1), 131072, kSms, kCtasPerSm));
}

}  // namespace
}  // namespace fa_test
