// The CPU decode pass (KV cache, paged or contiguous, append, split-KV) against the fp64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/simd.h"
#include "flashattn/flashattn.hpp"
#include "test_util.h"

namespace {

using fa_test::HostTensor;
using flashattn::DType;
namespace ref = flashattn::reference;

struct Case {
  DType dtype = DType::f32;
  std::vector<int32_t> lens = {10};  // cache_seqlens, one per sequence
  int64_t sn = 1, hq = 4, hkv = 1, d = 64;
  int64_t page_size = 16;  // 0 = contiguous cache
  bool append = true;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  float softcap = 0.f;
  int32_t splits = 0;
  bool with_lse = true;
  int threads = 0;
  int64_t pad = 0;
};

struct Problem {
  HostTensor q, k_cache, v_cache, table, lens, k_new, v_new, out, lse;
  flashattn::DecodeArgs args;
};

// Cache slots that hold no token are NaN, so a read past a sequence's length poisons its rows.
Problem make_problem(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  const int64_t batch = int64_t(c.lens.size());
  const int64_t extra = c.append ? c.sn : 0;
  int64_t longest = 0;
  for (int32_t l : c.lens) longest = std::max<int64_t>(longest, l + extra);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<int64_t> cache_shape;
  if (c.page_size > 0) {
    int64_t per_seq = std::max<int64_t>(1, (longest + c.page_size - 1) / c.page_size + 1);
    int64_t num_pages = batch * per_seq + 2;  // two pages no sequence uses
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> table(ids.begin(), ids.begin() + batch * per_seq);
    p.table = fa_test::int_tensor(table);
    p.table.view.rank = 2;
    p.table.view.shape[0] = batch;
    p.table.view.shape[1] = per_seq;
    p.table.view.stride[0] = per_seq;
    p.table.view.stride[1] = 1;
    cache_shape = {num_pages, c.page_size, c.hkv, c.d};
  } else {
    cache_shape = {batch, longest + 3, c.hkv, c.d};
  }
  p.k_cache = HostTensor(c.dtype, cache_shape, c.pad);
  p.v_cache = HostTensor(c.dtype, cache_shape, c.pad);
  p.k_cache.fill_normal(rng);
  p.v_cache.fill_uniform(rng);
  // Poison every slot past each sequence's cached tokens (including the ones append will write).
  std::vector<bool> used(size_t(cache_shape[0] * cache_shape[1]), false);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < c.lens[size_t(b)]; ++t) {
      int64_t slot = c.page_size > 0 ? int64_t(reinterpret_cast<const int32_t*>(p.table.storage.data())
                                                   [b * p.table.view.shape[1] + t / c.page_size]) * c.page_size +
                                           t % c.page_size
                                     : b * cache_shape[1] + t;
      used[size_t(slot)] = true;
    }
  const int64_t row = c.hkv * c.d;
  for (int64_t s = 0; s < int64_t(used.size()); ++s)
    if (!used[size_t(s)])
      for (int64_t e = 0; e < row; ++e) {
        p.k_cache.set(s * row + e, nan);
        p.v_cache.set(s * row + e, nan);
      }

  p.q = HostTensor(c.dtype, {batch, c.sn, c.hq, c.d}, c.pad);
  p.q.fill_normal(rng);
  p.lens = fa_test::int_tensor(c.lens);
  p.out = HostTensor(c.dtype, {batch, c.sn, c.hq, c.d}, c.pad);
  p.out.poison();
  p.lse = HostTensor(c.dtype == DType::f64 ? DType::f64 : DType::f32, {batch, c.hq, c.sn}, c.pad);
  p.lse.poison();
  if (c.append) {
    p.k_new = HostTensor(c.dtype, {batch, c.sn, c.hkv, c.d}, c.pad);
    p.v_new = HostTensor(c.dtype, {batch, c.sn, c.hkv, c.d}, c.pad);
    p.k_new.fill_normal(rng);
    p.v_new.fill_uniform(rng);
    p.args.k_new = p.k_new.view;
    p.args.v_new = p.v_new.view;
  }
  p.args.q = p.q.view;
  p.args.k_cache = p.k_cache.view;
  p.args.v_cache = p.v_cache.view;
  if (c.page_size > 0) p.args.block_table = p.table.view;
  p.args.cache_seqlens = p.lens.view;
  p.args.out = p.out.view;
  if (c.with_lse) p.args.lse = p.lse.view;
  p.args.num_splits = c.splits;
  p.args.options.causal = c.causal;
  p.args.options.window_left = c.wl;
  p.args.options.window_right = c.wr;
  p.args.options.softcap = c.softcap;
  p.args.options.num_threads = c.threads;
  return p;
}

std::string describe(const Case& c) {
  std::string r = std::string(flashattn::dtype_name(c.dtype)) + " lens{";
  for (int32_t l : c.lens) r += std::to_string(l) + ",";
  r += "} sn" + std::to_string(c.sn) + " hq" + std::to_string(c.hq) + " hkv" + std::to_string(c.hkv) + " d" +
       std::to_string(c.d) + (c.page_size ? " page" + std::to_string(c.page_size) : " contiguous");
  if (c.append) r += " append";
  if (c.causal) r += " causal";
  if (c.wl >= 0 || c.wr >= 0) r += " window(" + std::to_string(c.wl) + "," + std::to_string(c.wr) + ")";
  if (c.softcap > 0) r += " softcap";
  r += " splits" + std::to_string(c.splits);
  return r;
}

// Runs decode and checks out / lse against the reference, and that append wrote exactly the
// slots [len, len + sn) of each sequence with k_new / v_new and left every other byte alone.
void run_and_check(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  Problem p = make_problem(c, seed);
  ref::Output exact = ref::decode(p.args, ref::Precision::f64);
  ref::Output plain = ref::decode(p.args, ref::Precision::same_as_input);
  std::vector<unsigned char> k_before = p.k_cache.storage, v_before = p.v_cache.storage;
  flashattn::decode(p.args);

  std::vector<double> out = p.out.values();
  EXPECT_TRUE(fa_test::within_rule(out, exact.out, plain.out, c.dtype, 2.0, "out"));
  if (c.dtype == DType::f64) EXPECT_LE(fa_test::max_abs_diff(out, exact.out), 1e-12);
  if (c.with_lse) {
    std::vector<double> lse = p.lse.values();
    EXPECT_TRUE(fa_test::within_rule(lse, exact.lse, plain.lse, c.dtype, 2.0, "lse"));
    if (c.dtype == DType::f64) EXPECT_LE(fa_test::max_abs_diff(lse, exact.lse), 1e-12);
  }

  // The expected cache: the old bytes, with each appended row copied in.
  std::vector<unsigned char> k_want = k_before, v_want = v_before;
  if (c.append) {
    const int64_t es = flashattn::dtype_size(c.dtype);
    const flashattn::TensorView& kc = p.k_cache.view;
    for (int64_t b = 0; b < int64_t(c.lens.size()); ++b)
      for (int64_t t = 0; t < c.sn; ++t) {
        int64_t pos = c.lens[size_t(b)] + t, page = b, slot = pos;
        if (c.page_size > 0) {
          page = reinterpret_cast<const int32_t*>(p.table.storage.data())[b * p.table.view.shape[1] + pos / c.page_size];
          slot = pos % c.page_size;
        }
        for (int64_t h = 0; h < c.hkv; ++h) {
          int64_t dst = (page * kc.stride[0] + slot * kc.stride[1] + h * kc.stride[2]) * es;
          int64_t src = (b * p.k_new.view.stride[0] + t * p.k_new.view.stride[1] + h * p.k_new.view.stride[2]) * es;
          std::copy_n(p.k_new.storage.begin() + src, c.d * es, k_want.begin() + dst);
          std::copy_n(p.v_new.storage.begin() + src, c.d * es, v_want.begin() + dst);
        }
      }
  }
  EXPECT_TRUE(p.k_cache.storage == k_want) << "k_cache differs from the old cache plus the appended rows";
  EXPECT_TRUE(p.v_cache.storage == v_want) << "v_cache differs from the old cache plus the appended rows";
}

class DecodeCoverage : public ::testing::TestWithParam<DType> {};

TEST_P(DecodeCoverage, MatchesReference) {
  const DType t = GetParam();
  uint32_t seed = 20;
  // Cache lengths 0, 1, page - 1, page, page + 1 and long; 1..16 new tokens; GQA 1, 4 and 8.
  std::vector<Case> cases = {
      {.lens = {0, 1, 15, 16, 17, 300}, .sn = 1, .hq = 8, .hkv = 2},
      {.lens = {5, 0, 33}, .sn = 3, .hq = 8, .hkv = 1, .page_size = 1, .causal = true},
      {.lens = {255, 256, 257, 700}, .sn = 16, .hq = 4, .hkv = 4, .d = 32, .page_size = 256, .causal = true, .wl = 100},
      {.lens = {0, 70, 129}, .sn = 5, .hq = 2, .hkv = 1, .page_size = 0, .append = false, .softcap = 6.f},
      {.lens = {40, 90}, .sn = 4, .hq = 6, .hkv = 3, .d = 40, .wl = 10, .wr = 2, .with_lse = false, .pad = 3},
      {.lens = {2, 9}, .sn = 4, .hq = 4, .hkv = 1, .append = false, .causal = true},  // rows that see no key
      {.lens = {513}, .sn = 2, .hq = 16, .hkv = 2, .d = 128, .page_size = 16, .splits = 5},
  };
  for (Case c : cases) {
    c.dtype = t;
    run_and_check(c, seed++);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DecodeCoverage, ::testing::Values(DType::f32, DType::f16, DType::bf16, DType::f64),
                         [](const auto& info) { return std::string(flashattn::dtype_name(info.param)); });

// Tiles of at most half a vector of rows take the few-rows kernels (head dim in the lanes; decode.cpp's
// uses_rows_kernels): at every SIMD level this CPU has, 1, 4 and 8 rows (MHA, GQA 4, GQA 4 with two new
// tokens), head dims with a tail past the last whole AVX-512 vector (40, 72), masks, softcap, key
// counts around the 256-key tile, paged and contiguous caches, and every cache dtype (16-bit rows
// widened as they load; bf16 takes these kernels at the amx level too).
TEST(Decode, FewRowsKernelsAtEverySimdLevel) {
  using flashattn::cpu::KernelLevel;
  for (KernelLevel level : {KernelLevel::portable, KernelLevel::avx2, KernelLevel::avx512, KernelLevel::amx}) {
    if (int(level) > int(flashattn::cpu::detected_level())) continue;
    setenv("FLASHATTN_CPU_KERNEL", flashattn::cpu::level_name(level), 1);
    uint32_t seed = 300;
    for (DType t : {DType::f32, DType::f16, DType::bf16})
      for (Case c : {Case{.lens = {0, 1, 255, 256, 257, 600}, .sn = 1, .hq = 8, .hkv = 2, .d = 40},
                     Case{.lens = {70, 513}, .sn = 2, .hq = 8, .hkv = 2, .d = 72, .page_size = 0, .causal = true,
                          .wl = 300, .softcap = 5.f, .pad = 2},
                     Case{.lens = {1000}, .sn = 1, .hq = 3, .hkv = 3, .d = 128, .splits = 3},
                     Case{.lens = {9, 300}, .sn = 1, .hq = 4, .hkv = 1, .d = 256, .page_size = 64, .wl = 100,
                          .wr = 0}}) {
        c.dtype = t;
        SCOPED_TRACE(flashattn::cpu::level_name(level));
        run_and_check(c, seed++);
      }
  }
  unsetenv("FLASHATTN_CPU_KERNEL");
}

TEST(Decode, SplitCountsAgree) {
  for (DType t : {DType::f32, DType::bf16}) {
    Case c{.dtype = t, .lens = {700, 37}, .sn = 2, .hq = 8, .hkv = 2, .page_size = 16, .causal = true};
    c.splits = 1;
    Problem first = make_problem(c, 5);
    flashattn::decode(first.args);
    std::vector<double> base = first.out.values(), base_lse = first.lse.values();
    for (int32_t s = 0; s <= 16; ++s) {  // 0 = the automatic choice
      c.splits = s;
      if (s % 5 == 0 || s == 16) run_and_check(c, 5);  // a few against the reference (it is slow)
      Problem p = make_problem(c, 5);
      flashattn::decode(p.args);
      // Different split points only regroup sums of positive terms: rounding-level differences.
      EXPECT_LE(fa_test::max_abs_diff(p.out.values(), base), t == DType::f32 ? 2e-6 : 1e-2) << "splits " << s;
      EXPECT_LE(fa_test::max_abs_diff(p.lse.values(), base_lse), 2e-5) << "splits " << s;
    }
  }
}

// A task takes one split of the keys for a group of KV heads, tile by tile across the group (the
// heads' rows of a key lie side by side). The group size follows from the (sequence, split) count
// against decode.cpp's 64 tasks: with 6 KV heads, one sequence gives groups of one head, four
// sequences in 5 splits groups of two, sixteen in 4 splits one group of all six.
TEST(Decode, HeadGroupsCoverEveryHead) {
  std::vector<int32_t> sixteen;
  for (int32_t i = 0; i < 16; ++i) sixteen.push_back(100 + 67 * i);
  for (DType t : {DType::f32, DType::bf16})
    for (const auto& [lens, splits] : std::vector<std::pair<std::vector<int32_t>, int32_t>>{
             {{1100}, 0}, {{1100}, 1}, {{600, 1100, 300, 900}, 5}, {sixteen, 4}}) {
      Case c{.dtype = t, .lens = lens, .sn = 2, .hq = 24, .hkv = 6, .causal = true, .splits = splits};
      run_and_check(c, 31);
    }
}

TEST(Decode, RowsThatSeeNothingAreZeroWithNegInfLse) {
  // No append and causal: with 2 cached keys and 4 new queries, queries 0 and 1 see no key.
  Case c{.lens = {2, 0}, .sn = 4, .hq = 2, .append = false, .causal = true};
  Problem p = make_problem(c, 8);
  flashattn::decode(p.args);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 4; ++t) {
        bool empty = b == 1 || t < 2;
        double lse = p.lse.get((b * 2 + h) * 4 + t);
        if (!empty) {
          EXPECT_TRUE(std::isfinite(lse));
          continue;
        }
        EXPECT_EQ(lse, -std::numeric_limits<double>::infinity());
        for (int64_t x = 0; x < 64; ++x) EXPECT_EQ(p.out.get(((b * 4 + t) * 2 + h) * 64 + x), 0.0);
      }
}

// Large enough (2.7M elements of K and V) that every thread count asked for is used: decode.cpp gives
// a worker to each 256K elements it reads.
TEST(Decode, DeterministicAcrossThreadCounts) {
  Case c{.lens = {8000, 3, 2600}, .sn = 3, .hq = 8, .hkv = 2, .causal = true};
  c.threads = 1;
  Problem first = make_problem(c, 13);
  flashattn::decode(first.args);
  for (int threads : {1, 2, 3, 0}) {
    c.threads = threads;
    Problem p = make_problem(c, 13);
    flashattn::decode(p.args);
    EXPECT_EQ(p.out.storage, first.out.storage) << "threads " << threads;
    EXPECT_EQ(p.lse.storage, first.lse.storage) << "threads " << threads;
  }
}

// A call keeps its scratch for the next (scratch_cache.h): a call after one of another
// shape (dtype, head dim, heads per group, split count) must not see its leftovers, and calls from
// several threads at once each take their own.
TEST(Decode, ScratchKeptBetweenCallsOfOtherShapes) {
  const std::vector<Case> cases = {
      {.lens = {3000}, .sn = 1, .hq = 8, .hkv = 2, .d = 128, .page_size = 0},  // automatic splits > 1
      {.dtype = DType::bf16, .lens = {5, 900, 40}, .sn = 2, .hq = 12, .hkv = 6, .causal = true},
      {.lens = {70}, .sn = 1, .hq = 4, .hkv = 4, .d = 256, .splits = 1},
      {.dtype = DType::f16, .lens = {1500, 700}, .sn = 4, .hq = 8, .hkv = 1, .d = 96, .splits = 7},
  };
  fa_test::expect_bitwise_repeats(
      cases.size(),
      [&](size_t i, bool first) {
        if (first) run_and_check(cases[i], 40 + uint32_t(i));
        Problem p = make_problem(cases[i], 40 + uint32_t(i));
        flashattn::decode(p.args);
        return fa_test::joined(p.out.storage, p.lse.storage);
      },
      [&](size_t i) { return describe(cases[i]); });
}

}  // namespace
