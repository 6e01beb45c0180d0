// The CPU backward against the fp64 reference (accuracy rule, factor 3), finite differences of the
// documented forward, the option matrix, masked-row semantics and determinism.
//
// The out and lse the backward reads come from reference::forward (rounded to the input dtype), so
// these tests do not depend on the CPU forward; one test runs the real forward first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "amx_tiles.h"
#include "cpu/simd.h"
#include "flashattn/flashattn.hpp"
#include "reference/reference.h"
#include "test_util.h"

namespace {

using flashattn::BackwardArgs;
using flashattn::DType;
using flashattn::ForwardArgs;
using fa_test::HostTensor;
namespace reference = flashattn::reference;

struct Case {
  std::string name;
  DType dtype = DType::f32;
  // Several tiles each way (the CPU backward's are 128 rows and keys), none of them full.
  int64_t batch = 2, sq = 150, sk = 270, hq = 4, hkv = 2, d = 64;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  float softcap = 0.f;
  std::vector<int32_t> cu_q, cu_k;  // varlen when set (batch is then cu_q.size() - 1)
  int64_t pad = 0;                  // extra elements per row: non-contiguous tensors
  double q_std = 1.0;               // spread of q, hence of the scores
  int threads = 0;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }  // gtest names a failing case by it

// A backward problem: random q, k, v, dout; out and lse from the fp64 reference forward.
struct Problem {
  HostTensor q, k, v, out, dout, lse, dq, dk, dv, cu_q, cu_k;
  flashattn::AttnOptions opts;

  explicit Problem(const Case& c, uint32_t seed = 1) {
    const bool varlen = !c.cu_q.empty();
    const DType lse_t = c.dtype == DType::f64 ? DType::f64 : DType::f32;
    if (varlen) {
      const int64_t tq = c.cu_q.back(), tk = c.cu_k.back();
      q = HostTensor(c.dtype, {tq, c.hq, c.d}, c.pad);
      k = HostTensor(c.dtype, {tk, c.hkv, c.d}, c.pad);
      lse = HostTensor(lse_t, {c.hq, tq}, c.pad);
      cu_q = fa_test::int_tensor(c.cu_q);
      cu_k = fa_test::int_tensor(c.cu_k);
    } else {
      q = HostTensor(c.dtype, {c.batch, c.sq, c.hq, c.d}, c.pad);
      k = HostTensor(c.dtype, {c.batch, c.sk, c.hkv, c.d}, c.pad);
      lse = HostTensor(lse_t, {c.batch, c.hq, c.sq}, c.pad);
    }
    auto like = [&](const HostTensor& t) {
      std::vector<int64_t> shape(t.view.shape, t.view.shape + t.view.rank);
      return HostTensor(c.dtype, shape, c.pad);
    };
    v = like(k);
    out = like(q);
    dout = like(q);
    dq = like(q);
    dk = like(k);
    dv = like(k);
    std::mt19937 rng(seed);
    q.fill_normal(rng, c.q_std);
    k.fill_normal(rng);
    v.fill_normal(rng);
    dout.fill_normal(rng);
    opts.causal = c.causal;
    opts.window_left = c.wl;
    opts.window_right = c.wr;
    opts.softcap = c.softcap;
    opts.num_threads = c.threads;
    reference::Output ref = reference::forward(forward_args());
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, ref.out[size_t(i)]);
    for (int64_t i = 0; i < lse.numel(); ++i) lse.set(i, ref.lse[size_t(i)]);
  }

  ForwardArgs forward_args() {
    ForwardArgs a;
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    a.out = out.view;
    a.lse = lse.view;
    a.cu_seqlens_q = cu_q.view;
    a.cu_seqlens_k = cu_k.view;
    a.options = opts;
    return a;
  }

  BackwardArgs args() {
    BackwardArgs a;
    a.dout = dout.view;
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    a.out = out.view;
    a.lse = lse.view;
    a.dq = dq.view;
    a.dk = dk.view;
    a.dv = dv.view;
    a.cu_seqlens_q = cu_q.view;
    a.cu_seqlens_k = cu_k.view;
    a.options = opts;
    return a;
  }

  // Poisons the gradients, so an element the kernel misses shows as NaN, and runs the backward.
  void run() {
    dq.poison();
    dk.poison();
    dv.poison();
    flashattn::backward(args());
  }
};

void expect_matches_reference(Problem& pr, DType dtype) {
  pr.run();
  reference::Grads ref = reference::backward(pr.args());
  reference::Grads plain = reference::backward(pr.args(), reference::Precision::same_as_input);
  EXPECT_TRUE(fa_test::within_rule(pr.dq.values(), ref.dq, plain.dq, dtype, 3.0, "dq"));
  EXPECT_TRUE(fa_test::within_rule(pr.dk.values(), ref.dk, plain.dk, dtype, 3.0, "dk"));
  EXPECT_TRUE(fa_test::within_rule(pr.dv.values(), ref.dv, plain.dv, dtype, 3.0, "dv"));
}

// ---- accuracy per dtype -----------------------------------------------------------------------

class BackwardDtype : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(BackwardDtype, MatchesReference) {
  Case c;
  c.dtype = std::get<0>(GetParam());
  c.causal = std::get<1>(GetParam());
  Problem pr(c);
  expect_matches_reference(pr, c.dtype);
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardDtype,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16, DType::f16, DType::f64),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(flashattn::dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_causal" : "_full");
                         });

// ---- the option matrix ------------------------------------------------------------------------

Case make(std::string name, DType dtype = DType::f32) {
  Case c;
  c.name = std::move(name);
  c.dtype = dtype;
  return c;
}

std::vector<Case> option_cases() {
  std::vector<Case> v;
  Case c = make("window");
  c.wl = 9, c.wr = 4;
  v.push_back(c);
  c = make("window_left_only_bf16", DType::bf16);
  c.wl = 20;
  v.push_back(c);
  c = make("causal_window_f16", DType::f16);
  c.causal = true, c.wl = 30;
  v.push_back(c);
  c = make("softcap");
  c.softcap = 1.5f;
  v.push_back(c);
  c = make("softcap_causal_bf16", DType::bf16);
  c.softcap = 2.f, c.causal = true;
  v.push_back(c);
  for (int64_t hkv : {4, 2, 1}) {
    c = make("gqa_group" + std::to_string(4 / hkv));
    c.hkv = hkv, c.causal = true;
    v.push_back(c);
  }
  c = make("varlen_with_empty_sequences");
  c.cu_q = {0, 5, 5, 80, 81, 81, 150};
  c.cu_k = {0, 0, 37, 100, 229, 240, 240};
  v.push_back(c);
  c = make("varlen_causal_window_bf16", DType::bf16);
  c.cu_q = {0, 70, 70, 71, 200};
  c.cu_k = {0, 65, 66, 66, 130};
  c.causal = true, c.wl = 17;
  v.push_back(c);
  // Scores of +-50: most P underflow (exp2 arguments below -126). 16-bit inputs only: in f32 the
  // rounding of the f32 lse input alone already costs about 3x the plain baseline's error (whose
  // matmuls are exact before one rounding; measured at this shape: dv 5.9e-6 against 1.8e-6), and
  // float sums of scores that large add as much again, so the rule has no margin left for f32.
  c = make("large_scores_f16", DType::f16);
  c.q_std = 10.0, c.causal = true;
  v.push_back(c);
  c = make("large_scores_softcap_bf16", DType::bf16);  // tanh saturates: the derivative vanishes
  c.q_std = 10.0, c.softcap = 5.f;
  v.push_back(c);
  c = make("seqlen_one");
  c.sq = 1, c.sk = 1;
  v.push_back(c);
  c = make("one_query_many_keys_causal");
  c.sq = 1, c.sk = 200, c.causal = true;
  v.push_back(c);
  c = make("more_queries_than_keys_causal");
  c.sq = 150, c.sk = 41, c.causal = true;
  v.push_back(c);
  c = make("tile_plus_minus_one");  // d = 64 works on 128 x 128 tiles
  c.sq = 129, c.sk = 127, c.causal = true;
  v.push_back(c);
  c = make("tile_plus_minus_one_d72");  // d = 72 works on 64 x 64 tiles
  c.sq = 63, c.sk = 65, c.d = 72, c.causal = true;
  v.push_back(c);
  c = make("strided_f16", DType::f16);
  c.pad = 3, c.causal = true, c.hkv = 1;
  v.push_back(c);
  c = make("strided_f32");
  c.pad = 5, c.wl = 100, c.hkv = 1;
  v.push_back(c);
  c = make("head_dim_32");
  c.d = 32, c.sq = 100, c.sk = 100;
  v.push_back(c);
  c = make("head_dim_72");  // not a multiple of the AVX2 register block
  c.d = 72, c.causal = true;
  v.push_back(c);
  c = make("head_dim_256_bf16", DType::bf16);  // the narrower tiles of wide heads
  c.d = 256, c.sq = 45, c.sk = 90, c.hq = 2, c.hkv = 1, c.batch = 1, c.wl = 40, c.wr = 10;
  v.push_back(c);
  c = make("f64_everything", DType::f64);
  c.causal = true, c.softcap = 3.f, c.wl = 25, c.pad = 2;
  v.push_back(c);
  return v;
}

class BackwardOptions : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardOptions, MatchesReference) {
  Problem pr(GetParam());
  expect_matches_reference(pr, GetParam().dtype);
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardOptions, ::testing::ValuesIn(option_cases()),
                         [](const auto& info) { return info.param.name; });

// Every SIMD level this CPU has (capped through FLASHATTN_CPU_KERNEL, read at each call) runs its
// own build of the tile arithmetic; each must satisfy the rule, f64 included.
TEST(BackwardLevels, EveryLevelMatchesReference) {
  using flashattn::cpu::KernelLevel;
  const KernelLevel top = flashattn::cpu::detected_level();
  for (KernelLevel level : {KernelLevel::portable, KernelLevel::avx2, KernelLevel::avx512, KernelLevel::amx}) {
    if (int(level) > int(top)) break;
    setenv("FLASHATTN_CPU_KERNEL", flashattn::cpu::level_name(level), 1);
    for (DType dtype : {DType::f32, DType::bf16, DType::f64})
      for (int64_t d : {40, 64}) {  // d = 40: a half-width register block; d = 64: the AMX products
        SCOPED_TRACE(std::string(flashattn::cpu::level_name(level)) + " " + flashattn::dtype_name(dtype) + " d" +
                     std::to_string(d));
        Case c = make("levels", dtype);
        c.cu_q = {0, 70, 70, 171};
        c.cu_k = {0, 65, 130, 200};
        c.causal = true, c.softcap = 3.f, c.d = d;
        Problem pr(c);
        expect_matches_reference(pr, dtype);
      }
  }
  unsetenv("FLASHATTN_CPU_KERNEL");
}

// The bf16 and fp16 products on AMX tiles (backward_amx.cpp; fp16 as hi and lo bf16 halves) at
// every head dim they take, on tiles of 32 to 128 (the longest sequence rounded up to 32), through
// both schedules: one worker runs the one-pass tasks, several the two passes.
TEST(BackwardLevels, AmxProductsAtEveryHeadDim) {
  if (flashattn::cpu::detected_level() != flashattn::cpu::KernelLevel::amx)
    GTEST_SKIP() << "this CPU (or OS) offers no AMX-BF16";
  for (DType dtype : {DType::bf16, DType::f16})
    for (int64_t d : {32, 96, 128, 192})
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(flashattn::dtype_name(dtype)) + " d" + std::to_string(d) + " threads " +
                     std::to_string(threads));
        Case c = make("amx", dtype);
        c.d = d, c.threads = threads, c.causal = d % 64 == 0, c.softcap = d == 96 ? 4.f : 0.f;
        c.sq = d == 192 ? 30 : 150, c.sk = d == 192 ? 41 : 270;
        Problem pr(c);
        expect_matches_reference(pr, dtype);
      }
}

#if defined(__x86_64__)
// As Forward.AmxLeavesTheThreadsTileConfiguration, for the backward's products (both schedules run
// in the calling thread with one worker).
TEST(BackwardLevels, AmxLeavesTheThreadsTileConfiguration) {
  if (flashattn::cpu::detected_level() != flashattn::cpu::KernelLevel::amx)
    GTEST_SKIP() << "this CPU (or OS) offers no AMX-BF16";
  Case c = make("amx_state", DType::bf16);
  c.threads = 1;
  Problem pr(c);
  const fa_test::TileConfig mine = fa_test::foreign_tile_config();
  fa_test::load_tile_config(mine);
  pr.run();
  const fa_test::TileConfig after = fa_test::current_tile_config();
  fa_test::release_tiles();
  EXPECT_EQ(std::memcmp(mine.bytes, after.bytes, 64), 0);
  expect_matches_reference(pr, DType::bf16);
  EXPECT_EQ(fa_test::current_tile_config().bytes[0], 0) << "tiles left configured";
}
#endif

// ---- semantics of rows and keys that see nothing ------------------------------------------------

// Causal with more queries than keys: with bottom-right alignment the first sq - sk rows see no
// key, so their lse is -inf and their dq must be exactly 0. A left window of 2 with more keys than
// queries leaves the first keys unseen by every row: their dk and dv must be exactly 0.
TEST(BackwardMasked, EmptyRowsAndUnseenKeysGetZeroGradients) {
  for (bool more_queries : {true, false}) {
    Case c;
    c.batch = 1;
    c.hq = 2, c.hkv = 1;
    c.causal = true;
    if (more_queries) {
      c.sq = 90, c.sk = 20;
    } else {
      c.sq = 20, c.sk = 90, c.wl = 2;
    }
    Problem pr(c);
    expect_matches_reference(pr, c.dtype);
    const int64_t row = c.hq * c.d;
    if (more_queries) {
      const int64_t empty_rows = c.sq - c.sk;
      for (int64_t i = 0; i < empty_rows * row; ++i) ASSERT_EQ(pr.dq.get(i), 0.0) << "dq element " << i;
    } else {
      const int64_t unseen_keys = c.sk - c.sq - c.wl;  // row 0 sees keys [sk - sq - wl, sk - sq]
      for (int64_t i = 0; i < unseen_keys * c.hkv * c.d; ++i) {
        ASSERT_EQ(pr.dk.get(i), 0.0) << "dk element " << i;
        ASSERT_EQ(pr.dv.get(i), 0.0) << "dv element " << i;
      }
    }
  }
}

// lse = -inf is the contract for "this row saw nothing": such a row must contribute nothing and
// never turn into NaN (exp(s - (-inf)) would be inf, and 0 * inf NaN), even when its out holds
// garbage (here NaN), which must not leak through D = rowsum(dO o O).
TEST(BackwardMasked, RowWithInfiniteLseContributesNothing) {
  Case c;
  c.batch = 1, c.sq = 60, c.sk = 50;  // rows 0..9 sit on diagonals before key 0
  c.wl = 0, c.wr = 0, c.hq = c.hkv = 1;  // each row sees exactly its diagonal key
  Problem pr(c);
  for (int64_t i = 0; i < 10 * c.d; ++i) pr.out.set(i, std::numeric_limits<double>::quiet_NaN());
  pr.run();
  for (int64_t i = 0; i < 10 * c.d; ++i) ASSERT_EQ(pr.dq.get(i), 0.0);
  for (int64_t i = 0; i < pr.dk.numel(); ++i) {
    ASSERT_FALSE(std::isnan(pr.dk.get(i)));
    ASSERT_FALSE(std::isnan(pr.dv.get(i)));
  }
  expect_matches_reference(pr, c.dtype);
}

// ---- finite differences ---------------------------------------------------------------------------

// L(q, k, v) = sum(dout o out(q, k, v)), so dL/dx is what the backward returns. Central differences
// of the fp64 reference forward on random elements check the backward against the documented
// forward itself (scale, softcap, bottom-right causal, GQA sums), not against a second backward.
TEST(BackwardFiniteDifferences, MatchCausalSoftcapGqa) {
  Case c;
  c.dtype = DType::f64;
  c.batch = 1, c.sq = 23, c.sk = 37, c.hq = 4, c.hkv = 2, c.d = 32;
  c.causal = true, c.softcap = 2.5f;
  Problem pr(c);
  pr.run();
  auto loss = [&]() {
    reference::Output o = reference::forward(pr.forward_args());
    std::vector<double> dout = pr.dout.values();
    double l = 0;
    for (size_t i = 0; i < o.out.size(); ++i) l += dout[i] * o.out[i];
    return l;
  };
  std::mt19937 rng(7);
  const double h = 1e-5;
  struct Wrt {
    HostTensor* x;
    HostTensor* grad;
    const char* name;
  };
  for (Wrt w : {Wrt{&pr.q, &pr.dq, "q"}, Wrt{&pr.k, &pr.dk, "k"}, Wrt{&pr.v, &pr.dv, "v"}}) {
    std::uniform_int_distribution<int64_t> pick(0, w.x->numel() - 1);
    for (int trial = 0; trial < 6; ++trial) {
      const int64_t i = pick(rng);
      const double x0 = w.x->get(i);
      w.x->set(i, x0 + h);
      const double lp = loss();
      w.x->set(i, x0 - h);
      const double lm = loss();
      w.x->set(i, x0);
      const double fd = (lp - lm) / (2 * h), g = w.grad->get(i);
      EXPECT_NEAR(g, fd, 1e-6 * std::max(1.0, std::fabs(g))) << "d" << w.name << " element " << i;
    }
  }
}

// ---- determinism ----------------------------------------------------------------------------------

std::vector<unsigned char> grads_bytes(const Problem& pr) {
  std::vector<unsigned char> b = pr.dq.storage;
  b.insert(b.end(), pr.dk.storage.begin(), pr.dk.storage.end());
  b.insert(b.end(), pr.dv.storage.begin(), pr.dv.storage.end());
  return b;
}

// The gradients' bytes (padding included) of one run on `threads` threads.
std::vector<unsigned char> run_on(Problem& pr, int threads) {
  pr.opts.num_threads = threads;
  pr.run();
  return grads_bytes(pr);
}

TEST(BackwardDeterminism, BitwiseEqualAcrossRunsAndThreadCounts) {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    Case c;
    c.dtype = dtype;
    c.sq = 200, c.sk = 170, c.hq = 4, c.hkv = 1, c.causal = true;
    Problem pr(c);
    const std::vector<unsigned char> one = run_on(pr, 1), two = run_on(pr, 2);
    EXPECT_TRUE(one == two) << "1 vs 2 threads differ (" << flashattn::dtype_name(dtype) << ")";
    EXPECT_TRUE(two == run_on(pr, 2)) << "two runs differ (" << flashattn::dtype_name(dtype) << ")";
  }
}

// One thread runs the one-pass schedule ((batch, KV head) tasks own dQ too); 64 threads over at
// most 6 pairs run the two passes. Both sum every gradient in the same order, so they must agree
// bit for bit: empty and partial sequences, every mask and softcap, each dtype, GQA.
TEST(BackwardDeterminism, OnePassAndTwoPassSchedulesAgreeBitwise) {
  std::vector<Case> cases;
  for (DType dtype : {DType::f16, DType::bf16, DType::f32, DType::f64}) {
    Case c;
    c.dtype = dtype;
    c.sq = 150, c.sk = 270, c.hq = 6, c.hkv = 3, c.causal = true, c.softcap = 4.f;
    cases.push_back(c);
  }
  Case w;
  w.wl = 40, w.wr = 7, w.d = 128, w.hq = 2, w.hkv = 1;
  cases.push_back(w);
  Case v;
  v.cu_q = {0, 37, 37, 190, 191}, v.cu_k = {0, 0, 64, 300, 420}, v.causal = true, v.hq = 3, v.hkv = 1;
  cases.push_back(v);
  for (const Case& c : cases) {
    Problem pr(c);
    EXPECT_TRUE(run_on(pr, 1) == run_on(pr, 64))
        << flashattn::dtype_name(c.dtype) << " d " << c.d << (c.cu_q.empty() ? "" : " varlen")
        << ": the one-pass and two-pass schedules differ";
  }
}

// A call keeps its workers' scratch for the next (backward.cpp's BackwardScratch): a call whose
// tiles are partial after one whose tiles were full, of the same tile size, must not see the
// earlier rows in its padding; concurrent calls take their own scratch.
TEST(BackwardDeterminism, ScratchKeptBetweenCalls) {
  std::vector<Case> cases;
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case full;
    full.dtype = dtype, full.batch = 1, full.sq = 128, full.sk = 128, full.hq = 2, full.hkv = 1;
    Case partial = full;
    partial.sq = 100, partial.sk = 120, partial.causal = true;
    cases.push_back(full);
    cases.push_back(partial);
  }
  fa_test::expect_bitwise_repeats(
      cases.size(),
      [&](size_t i, bool first) {
        Problem pr(cases[i], 80 + uint32_t(i));
        if (first)
          expect_matches_reference(pr, cases[i].dtype);
        else
          pr.run();
        return grads_bytes(pr);
      },
      [&](size_t i) { return "case " + std::to_string(i) + " (" + flashattn::dtype_name(cases[i].dtype) + ")"; });
}

// ---- with the engine's own forward ------------------------------------------------------------------

TEST(BackwardWithForward, GradientsOfTheCpuForward) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case c;
    c.dtype = dtype;
    c.causal = true, c.softcap = 4.f;
    Problem pr(c);
    pr.out.poison();
    pr.lse.poison();
    flashattn::forward(pr.forward_args());
    expect_matches_reference(pr, dtype);
  }
}

}  // namespace
