// The CPU forward pass against the fp64 reference, under the accuracy rule of test_util.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "amx_tiles.h"
#include "cpu/simd.h"
#include "flashattn/flashattn.hpp"
#include "test_util.h"

namespace {

using fa_test::HostTensor;
using flashattn::DType;
namespace ref = flashattn::reference;

struct Shape {
  DType dtype = DType::f32;
  int64_t batch = 1, sq = 64, sk = 64, hq = 2, hkv = 1, d = 64;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  float softcap = 0.f, scale = 0.f;
  bool with_lse = true;
  int64_t pad = 0;  // extra stride: non-contiguous q, k, v, out, lse
  int threads = 0;
  std::vector<int32_t> cu_q, cu_k;  // varlen when set
};

struct Problem {
  HostTensor q, k, v, out, lse, cu_q, cu_k;
  flashattn::ForwardArgs args;
};

Problem make_problem(const Shape& s, uint32_t seed) {
  Problem p;
  std::mt19937 rng(seed);
  bool varlen = !s.cu_q.empty();
  DType lse_type = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  if (varlen) {
    int64_t tq = s.cu_q.back(), tk = s.cu_k.back();
    p.q = HostTensor(s.dtype, {tq, s.hq, s.d}, s.pad);
    p.k = HostTensor(s.dtype, {tk, s.hkv, s.d}, s.pad);
    p.v = HostTensor(s.dtype, {tk, s.hkv, s.d}, s.pad);
    p.out = HostTensor(s.dtype, {tq, s.hq, s.d}, s.pad);
    p.lse = HostTensor(lse_type, {s.hq, tq}, s.pad);
    p.cu_q = fa_test::int_tensor(s.cu_q);
    p.cu_k = fa_test::int_tensor(s.cu_k);
    p.args.cu_seqlens_q = p.cu_q.view;
    p.args.cu_seqlens_k = p.cu_k.view;
  } else {
    p.q = HostTensor(s.dtype, {s.batch, s.sq, s.hq, s.d}, s.pad);
    p.k = HostTensor(s.dtype, {s.batch, s.sk, s.hkv, s.d}, s.pad);
    p.v = HostTensor(s.dtype, {s.batch, s.sk, s.hkv, s.d}, s.pad);
    p.out = HostTensor(s.dtype, {s.batch, s.sq, s.hq, s.d}, s.pad);
    p.lse = HostTensor(lse_type, {s.batch, s.hq, s.sq}, s.pad);
  }
  p.q.fill_normal(rng);
  p.k.fill_normal(rng);
  p.v.fill_uniform(rng);
  p.out.poison();
  p.lse.poison();
  p.args.q = p.q.view;
  p.args.k = p.k.view;
  p.args.v = p.v.view;
  p.args.out = p.out.view;
  if (s.with_lse) p.args.lse = p.lse.view;
  p.args.options.causal = s.causal;
  p.args.options.window_left = s.wl;
  p.args.options.window_right = s.wr;
  p.args.options.softcap = s.softcap;
  p.args.options.softmax_scale = s.scale;
  p.args.options.num_threads = s.threads;
  return p;
}

// out (and lse) of the engine against the fp64 reference, with the plain same-precision
// implementation as the yardstick; f64 must also agree to 1e-12.
::testing::AssertionResult matches_reference(const Problem& p) {
  ref::Output exact = ref::forward(p.args, ref::Precision::f64);
  ref::Output plain = ref::forward(p.args, ref::Precision::same_as_input);
  DType t = p.q.view.dtype;
  std::vector<double> out = p.out.values();
  auto r = fa_test::within_rule(out, exact.out, plain.out, t, 2.0, "out");
  if (!r) return r;
  if (t == DType::f64 && fa_test::max_abs_diff(out, exact.out) > 1e-12)
    return ::testing::AssertionFailure() << "f64 out differs by " << fa_test::max_abs_diff(out, exact.out);
  if (p.args.lse.defined()) {
    std::vector<double> lse = p.lse.values();
    r = fa_test::within_rule(lse, exact.lse, plain.lse, t, 2.0, "lse");
    if (!r) return r;
    if (t == DType::f64 && fa_test::max_abs_diff(lse, exact.lse) > 1e-12)
      return ::testing::AssertionFailure() << "f64 lse differs by " << fa_test::max_abs_diff(lse, exact.lse);
  }
  return ::testing::AssertionSuccess();
}

std::string describe(const Shape& s) {
  std::string r = std::string(flashattn::dtype_name(s.dtype)) + " b" + std::to_string(s.batch) + " sq" +
                  std::to_string(s.sq) + " sk" + std::to_string(s.sk) + " hq" + std::to_string(s.hq) + " hkv" +
                  std::to_string(s.hkv) + " d" + std::to_string(s.d);
  if (s.causal) r += " causal";
  if (s.wl >= 0 || s.wr >= 0) r += " window(" + std::to_string(s.wl) + "," + std::to_string(s.wr) + ")";
  if (s.softcap > 0) r += " softcap";
  if (s.pad) r += " strided";
  if (!s.with_lse) r += " no-lse";
  if (!s.cu_q.empty()) r += " varlen";
  return r;
}

// Masks, sizes and layouts every dtype must get right. Sizes are awkward on purpose: not multiples
// of the query tile (48 to 384 rows) or of the 64-key tile, seqlen_q != seqlen_k both ways, and
// single rows.
std::vector<Shape> coverage_shapes(DType t) {
  std::vector<Shape> v;
  auto add = [&](Shape s) {
    s.dtype = t;
    v.push_back(s);
  };
  add({.sq = 130, .sk = 130});
  add({.batch = 2, .sq = 200, .sk = 200, .causal = true});
  add({.sq = 50, .sk = 300, .causal = true});
  add({.sq = 300, .sk = 70, .hq = 1, .causal = true});  // the first 230 rows see no key
  add({.sq = 150, .sk = 170, .wl = 37});
  add({.sq = 150, .sk = 120, .wr = 20});
  add({.sq = 161, .sk = 161, .wl = 50, .wr = 10});
  add({.sq = 140, .sk = 100, .causal = true, .wl = 30});
  add({.sq = 97, .sk = 129, .softcap = 5.f, .scale = 1.f});
  add({.sq = 100, .sk = 90, .hq = 8, .hkv = 2, .d = 32, .causal = true});
  add({.sq = 1, .sk = 1});
  add({.sq = 0, .sk = 10});  // nothing to do
  add({.sq = 5, .sk = 0});   // rows that see no key
  add({.sq = 1, .sk = 257, .hq = 4, .hkv = 4});
  add({.sq = 70, .sk = 65, .d = 40, .pad = 3});
  add({.sq = 33, .sk = 47, .d = 256, .with_lse = false});
  add({.sq = 64, .sk = 64, .hq = 4, .hkv = 1, .d = 128, .causal = true, .softcap = 20.f});
  // Several query tiles (192 rows at d = 256, 384 at d = 32).
  add({.sq = 450, .sk = 420, .hq = 1, .d = 256, .causal = true});
  add({.sq = 800, .sk = 790, .hq = 1, .d = 32, .wl = 100, .wr = 30});
  return v;
}

class ForwardCoverage : public ::testing::TestWithParam<DType> {};

TEST_P(ForwardCoverage, MatchesReference) {
  uint32_t seed = 1;
  for (const Shape& s : coverage_shapes(GetParam())) {
    SCOPED_TRACE(describe(s));
    Problem p = make_problem(s, seed++);
    flashattn::forward(p.args);
    EXPECT_TRUE(matches_reference(p));
  }
}

TEST_P(ForwardCoverage, VarlenWithEmptySequences) {
  // Sequence 0 has no queries, 1 has queries but no keys (out 0, lse -inf), 2 a single query.
  for (bool causal : {false, true}) {
    Shape s{.dtype = GetParam(), .hq = 4, .hkv = 2, .d = 48, .causal = causal};
    s.cu_q = {0, 0, 70, 71, 200, 260};
    s.cu_k = {0, 13, 13, 150, 300, 301};
    SCOPED_TRACE(describe(s) + (causal ? " causal" : ""));
    Problem p = make_problem(s, 7);
    flashattn::forward(p.args);
    EXPECT_TRUE(matches_reference(p));
    for (int64_t i = 0; i < 70 * 4 * 48; ++i) ASSERT_EQ(p.out.get(i), 0.0) << "row without keys";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ForwardCoverage, ::testing::Values(DType::f32, DType::f16, DType::bf16, DType::f64),
                         [](const auto& info) { return std::string(flashattn::dtype_name(info.param)); });

TEST(Forward, RowsThatSeeNothingAreZeroWithNegInfLse) {
  Shape s{.sq = 150, .sk = 40, .hq = 2, .causal = true};
  Problem p = make_problem(s, 3);
  flashattn::forward(p.args);
  // Bottom-right: row i sees keys j <= i - 110, so rows 0..109 see nothing.
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 150; ++i) {
      double lse = p.lse.get(h * 150 + i);
      if (i < 110) {
        ASSERT_EQ(lse, -std::numeric_limits<double>::infinity()) << "row " << i;
        for (int64_t x = 0; x < 64; ++x) ASSERT_EQ(p.out.get((i * 2 + h) * 64 + x), 0.0);
      } else {
        ASSERT_TRUE(std::isfinite(lse)) << "row " << i;
      }
    }
  EXPECT_TRUE(matches_reference(p));
}

TEST(Forward, NanInAnInputStaysInItsRows) {
  for (DType t : {DType::f32, DType::bf16}) {  // bf16 runs the AMX tiles where the CPU has them
    SCOPED_TRACE(flashattn::dtype_name(t));
    Shape s{.dtype = t, .sq = 120, .sk = 100, .hq = 1, .causal = true};
    Problem p = make_problem(s, 11);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    p.q.set(37 * 64 + 5, nan);  // query row 37
    p.k.set(90 * 64 + 2, nan);  // key 90: seen by rows >= 110
    flashattn::forward(p.args);
    for (int64_t i = 0; i < 120; ++i) {
      bool poisoned = i == 37 || i >= 110;
      for (int64_t x = 0; x < 64; ++x) ASSERT_EQ(std::isnan(p.out.get(i * 64 + x)), poisoned) << "row " << i;
      ASSERT_EQ(std::isnan(p.lse.get(i)), poisoned) << "row " << i;
    }
    EXPECT_TRUE(matches_reference(p));
  }
}

TEST(Forward, HugeScoresDoNotOverflow) {
  // q.k around 1e4 with scale 1: exp of the raw scores would overflow any float format. Integer
  // entries make q.k exact in fp32, so the comparison measures the softmax path, not the rounding
  // of a long dot product (which no fp32 kernel can make as exact as the reference's double one).
  Shape s{.sq = 90, .sk = 130, .hq = 1, .d = 64, .scale = 1.f};
  Problem p = make_problem(s, 5);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-1, 1);
  for (int64_t i = 0; i < p.q.numel(); ++i) p.q.set(i, i % 64 == 0 ? 100.0 : double(small(rng)));
  for (int64_t i = 0; i < p.k.numel(); ++i) p.k.set(i, i % 64 == 0 ? 100.0 : double(small(rng)));
  flashattn::forward(p.args);
  EXPECT_TRUE(matches_reference(p));
  for (double lse : p.lse.values()) ASSERT_GT(lse, 9900.0);
}

// A long causal sequence in f32: each row's sum l grows to thousands of terms, so how P's row sums
// join it decides the precision (adding every p straight to l once cost a factor of 5 and broke
// the rule at this size).
TEST(Forward, LongSequencesKeepTheirPrecision) {
  Shape s{.sq = 4096, .sk = 4096, .hq = 1, .d = 64, .causal = true};
  Problem p = make_problem(s, 4096);
  std::mt19937 rng(4097);
  p.v.fill_normal(rng);
  flashattn::forward(p.args);
  EXPECT_TRUE(matches_reference(p));
}

// Every SIMD level this CPU has (capped through FLASHATTN_CPU_KERNEL) is within the rule.
TEST(Forward, EverySimdLevelIsAccurate) {
  using flashattn::cpu::KernelLevel;
  for (KernelLevel level : {KernelLevel::portable, KernelLevel::avx2, KernelLevel::avx512, KernelLevel::amx}) {
    if (int(level) > int(flashattn::cpu::detected_level())) continue;
    setenv("FLASHATTN_CPU_KERNEL", flashattn::cpu::level_name(level), 1);
    EXPECT_EQ(flashattn::build_info().cpu_kernel, flashattn::cpu::level_name(level));
    uint32_t seed = 100;
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      for (Shape s : {Shape{.sq = 150, .sk = 211, .hq = 4, .hkv = 2, .d = 72, .causal = true, .softcap = 8.f},
                      Shape{.sq = 5, .sk = 100, .hq = 1, .d = 32, .wl = 20, .wr = 3, .pad = 2},
                      Shape{.sq = 99, .sk = 140, .hq = 2, .d = 128, .causal = true, .softcap = 8.f}}) {
        s.dtype = t;
        SCOPED_TRACE(std::string(flashattn::cpu::level_name(level)) + " " + describe(s));
        Problem p = make_problem(s, seed++);
        flashattn::forward(p.args);
        EXPECT_TRUE(matches_reference(p));
      }
    }
  }
  unsetenv("FLASHATTN_CPU_KERNEL");
}

// The bf16 and fp16 forward on AMX tiles (src/cpu/amx.h; fp16 as hi and lo bf16 halves) over the
// shapes its blocking has edges at: every
// head dim it takes (multiples of 32), key counts that leave a last tile of 1-63 keys (16-key and
// 32-key steps in the products), query tiles of a few rows up to several tiles (16- and 32-row
// steps), masks that give diagonal tiles and rows that see nothing, softcap, GQA, strides, varlen
// with empty sequences, and a head too large to pack whole (packed a key tile at a time).
TEST(Forward, AmxTilesAreAccurate) {
  using flashattn::cpu::KernelLevel;
  if (flashattn::cpu::detected_level() != KernelLevel::amx) GTEST_SKIP() << "this CPU (or OS) offers no AMX-BF16";
  std::vector<Shape> shapes;
  for (int64_t d : {32, 64, 96, 128, 192, 256}) {
    shapes.push_back({.sq = 150, .sk = 211, .hq = 4, .hkv = 2, .d = d, .causal = true});
    shapes.push_back({.sq = 17, .sk = 65, .hq = 1, .d = d, .softcap = 6.f, .pad = 2});
  }
  shapes.push_back({.batch = 2, .sq = 1, .sk = 1000, .hq = 8, .hkv = 1, .d = 128});
  shapes.push_back({.sq = 300, .sk = 33, .hq = 2, .d = 64, .causal = true});  // rows 0-266 see nothing
  shapes.push_back({.sq = 500, .sk = 520, .hq = 1, .d = 64, .wl = 70, .wr = 5});
  shapes.push_back({.sq = 777, .sk = 777, .hq = 1, .d = 128, .causal = true});
  shapes.push_back({.sq = 3, .sk = 17000, .hq = 1, .d = 256});  // K and V^T past 16 MiB: per-tile packing
  Shape varlen{.hq = 4, .hkv = 2, .d = 64, .causal = true};
  varlen.cu_q = {0, 0, 70, 71, 200, 260};
  varlen.cu_k = {0, 13, 13, 150, 300, 301};
  shapes.push_back(varlen);
  uint32_t seed = 500;
  for (DType t : {DType::bf16, DType::f16})
    for (Shape s : shapes) {
      s.dtype = t;
      SCOPED_TRACE(describe(s));
      Problem p = make_problem(s, seed++);
      flashattn::forward(p.args);
      EXPECT_TRUE(matches_reference(p));
    }
}

#if defined(__x86_64__)
// A tile configuration the calling thread had loaded is loaded again after a forward that ran on
// the tiles in that thread (one thread: the caller runs the task); none loaded stays none.
TEST(Forward, AmxLeavesTheThreadsTileConfiguration) {
  if (flashattn::cpu::detected_level() != flashattn::cpu::KernelLevel::amx)
    GTEST_SKIP() << "this CPU (or OS) offers no AMX-BF16";
  Shape s{.dtype = DType::bf16, .sq = 100, .sk = 130, .hq = 2, .d = 64, .causal = true, .threads = 1};
  Problem p = make_problem(s, 77);
  const fa_test::TileConfig mine = fa_test::foreign_tile_config();
  fa_test::load_tile_config(mine);
  flashattn::forward(p.args);
  const fa_test::TileConfig after = fa_test::current_tile_config();
  fa_test::release_tiles();
  EXPECT_EQ(std::memcmp(mine.bytes, after.bytes, 64), 0);
  flashattn::forward(p.args);
  EXPECT_EQ(fa_test::current_tile_config().bytes[0], 0) << "tiles left configured";
  EXPECT_TRUE(matches_reference(p));
}
#endif

TEST(Forward, UnknownKernelLevelIsAnError) {
  setenv("FLASHATTN_CPU_KERNEL", "sse9", 1);
  Problem p = make_problem(Shape{}, 1);
  try {
    flashattn::forward(p.args);
    ADD_FAILURE() << "an unknown FLASHATTN_CPU_KERNEL was accepted";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.status(), flashattn::Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("sse9"), std::string::npos);
  }
  unsetenv("FLASHATTN_CPU_KERNEL");
}

TEST(Forward, DeterministicAcrossRunsAndThreadCounts) {
  for (DType t : {DType::f32, DType::bf16}) {
    Shape s{.dtype = t, .batch = 2, .sq = 300, .sk = 280, .hq = 3, .causal = true, .softcap = 10.f};
    s.threads = 1;
    Problem first = make_problem(s, 9);
    flashattn::forward(first.args);
    for (int threads : {1, 2, 3, 0}) {
      s.threads = threads;
      Problem again = make_problem(s, 9);
      flashattn::forward(again.args);
      EXPECT_EQ(again.out.storage, first.out.storage) << "threads " << threads;
      EXPECT_EQ(again.lse.storage, first.lse.storage) << "threads " << threads;
    }
  }
}

// A call keeps its per-worker scratch for the next (forward.cpp's ForwardScratch): a call with the
// same shapes but other K and V must pack them afresh (the packs remember which head they hold),
// one of other shapes must not see leftovers, and calls from several threads at once each take
// their own.
TEST(Forward, ScratchKeptBetweenCalls) {
  const std::vector<Shape> shapes = {
      {.sq = 40, .sk = 70, .hq = 4, .hkv = 2, .causal = true},
      {.dtype = DType::bf16, .sq = 90, .sk = 90, .hq = 2, .hkv = 1, .d = 128},
      {.sq = 40, .sk = 70, .hq = 4, .hkv = 2, .causal = true},  // the first shape again, other values
      {.dtype = DType::bf16, .sq = 90, .sk = 90, .hq = 2, .hkv = 1, .d = 128},
      {.dtype = DType::f16, .sq = 17, .sk = 300, .hq = 3, .hkv = 3, .d = 96, .wl = 40},
      {.dtype = DType::f64, .sq = 33, .sk = 20, .hq = 2, .hkv = 2, .d = 32, .softcap = 3.f},
  };
  fa_test::expect_bitwise_repeats(
      shapes.size(),
      [&](size_t i, bool first) {
        Problem p = make_problem(shapes[i], 60 + uint32_t(i));
        flashattn::forward(p.args);
        if (first) EXPECT_TRUE(matches_reference(p)) << describe(shapes[i]);
        return fa_test::joined(p.out.storage, p.lse.storage);
      },
      [&](size_t i) { return describe(shapes[i]); });
}

TEST(CpuInfo, ReportsFeaturesAndLevel) {
  flashattn::BuildInfo info = flashattn::build_info();
  std::string level = info.cpu_kernel;
  EXPECT_TRUE(level == "portable" || level == "avx2" || level == "avx512" || level == "amx") << level;
  EXPECT_EQ(level, flashattn::cpu::level_name(flashattn::cpu::detected_level()));
  if (level != "portable") {
    EXPECT_NE(info.cpu_features.find("avx2"), std::string::npos) << info.cpu_features;
    EXPECT_NE(info.cpu_features.find("fma"), std::string::npos) << info.cpu_features;
  }
  if (level == "amx")
    for (const char* f : {"avx512bf16", "amx-tile", "amx-bf16"})
      EXPECT_NE(info.cpu_features.find(f), std::string::npos) << info.cpu_features;
#if defined(__x86_64__)
  EXPECT_EQ(__builtin_cpu_supports("avx2") != 0, info.cpu_features.find("avx2") != std::string::npos);
#endif
}

}  // namespace
