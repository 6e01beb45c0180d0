// merge_states on the CPU: the seed's worked examples, associativity, the -inf rules, and a real
// attention problem split into key chunks and merged back.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "reference/reference.h"
#include "test_util.h"

namespace {

using flashattn::DType;
using fa_test::HostTensor;
namespace reference = flashattn::reference;

constexpr double kInf = std::numeric_limits<double>::infinity();

DType lse_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// Relative rounding of one element of dtype t (half an ulp at 1).
double eps_of(DType t) {
  switch (t) {
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::f32: return std::ldexp(1.0, -24);
    default: return std::ldexp(1.0, -53);
  }
}

// Partial states [parts, tokens, heads, d] and their lse, merged into out [tokens, heads, d].
struct Parts {
  int64_t parts, tokens, heads, d;
  HostTensor o, lse, out, out_lse;

  Parts(DType t, int64_t parts_, int64_t tokens_, int64_t heads_, int64_t d_, int64_t pad = 0)
      : parts(parts_), tokens(tokens_), heads(heads_), d(d_),
        o(t, {parts_, tokens_, heads_, d_}, pad), lse(lse_dtype(t), {parts_, tokens_, heads_}, pad),
        out(t, {tokens_, heads_, d_}, pad), out_lse(lse_dtype(t), {tokens_, heads_}, pad) {}

  void set_part(int64_t part, int64_t row, double lse_value, const std::vector<double>& values) {
    lse.set(part * tokens * heads + row, lse_value);
    for (int64_t x = 0; x < d; ++x) o.set((part * tokens * heads + row) * d + x, values[size_t(x)]);
  }

  void merge(int threads = 0) {
    out.poison();
    out_lse.poison();
    flashattn::MergeArgs a;
    a.o_parts = o.view;
    a.lse_parts = lse.view;
    a.out = out.view;
    a.lse = out_lse.view;
    a.options.num_threads = threads;
    flashattn::merge_states(a);
  }
};

class MergeDtype : public ::testing::TestWithParam<DType> {};

// The seed's example (b): set A = keys {1, 2} gives (4/3, ln 3), set B = keys {3, 4} gives
// (10/3, ln 12); the merge is 44/15 with lse ln 15 (weights 0.2 and 0.8, not the plain average).
// And "Check yourself" 2: (1, ln 2) with (4, ln 6) gives 3.25 and lse ln 8.
TEST_P(MergeDtype, SeedWorkedExamples) {
  const DType t = GetParam();
  const int64_t d = 8;
  Parts p(t, 2, 2, 1, d);
  p.set_part(0, 0, std::log(3.0), std::vector<double>(d, 4.0 / 3.0));
  p.set_part(1, 0, std::log(12.0), std::vector<double>(d, 10.0 / 3.0));
  p.set_part(0, 1, std::log(2.0), std::vector<double>(d, 1.0));
  p.set_part(1, 1, std::log(6.0), std::vector<double>(d, 4.0));
  p.merge();
  // Inputs are rounded to t; the result may carry that rounding twice plus the output's own.
  const double tol = 4 * eps_of(t) * 4.0, lse_tol = 4 * eps_of(lse_dtype(t)) * 3.0;
  for (int64_t x = 0; x < d; ++x) {
    EXPECT_NEAR(p.out.get(x), 44.0 / 15.0, tol);
    EXPECT_NEAR(p.out.get(d + x), 3.25, tol);
  }
  EXPECT_NEAR(p.out_lse.get(0), std::log(15.0), lse_tol);
  EXPECT_NEAR(p.out_lse.get(1), std::log(8.0), lse_tol);
}

// Merging is associative: all parts at once, in reverse order, or as a merge of two merges agree
// within rounding. Parts have lse values far apart (the stable weights must not overflow).
TEST_P(MergeDtype, AnyOrderAndGrouping) {
  const DType t = GetParam();
  const int64_t n = 5, tokens = 37, heads = 3, d = 40;
  std::mt19937 rng(3);
  std::normal_distribution<double> val(0.0, 1.0);
  const double span = 20;  // lse in [-span, span]: weights down to e^-40, far from 1
  std::uniform_real_distribution<double> lse_val(-span, span);
  std::vector<std::vector<double>> o(n * tokens * heads, std::vector<double>(d));
  std::vector<double> l(n * tokens * heads);
  for (size_t i = 0; i < o.size(); ++i) {
    for (double& x : o[i]) x = val(rng);
    l[i] = lse_val(rng);
  }
  const int64_t rows = tokens * heads;
  // Merges parts `which` (in that order) and returns (out, lse) as doubles.
  auto merge_of = [&](const std::vector<int64_t>& which) {
    Parts p(t, int64_t(which.size()), tokens, heads, d, 1);
    for (size_t k = 0; k < which.size(); ++k)
      for (int64_t r = 0; r < rows; ++r) p.set_part(int64_t(k), r, l[size_t(which[k] * rows + r)], o[size_t(which[k] * rows + r)]);
    p.merge();
    return std::pair{p.out.values(), p.out_lse.values()};
  };
  auto [all_out, all_lse] = merge_of({0, 1, 2, 3, 4});
  auto [rev_out, rev_lse] = merge_of({4, 3, 2, 1, 0});
  auto [a_out, a_lse] = merge_of({0, 3});
  auto [b_out, b_lse] = merge_of({4, 1, 2});
  Parts nested(t, 2, tokens, heads, d);
  for (int64_t r = 0; r < rows; ++r) {
    nested.set_part(0, r, a_lse[size_t(r)], std::vector<double>(a_out.begin() + r * d, a_out.begin() + (r + 1) * d));
    nested.set_part(1, r, b_lse[size_t(r)], std::vector<double>(b_out.begin() + r * d, b_out.begin() + (r + 1) * d));
  }
  nested.merge();
  // The merge of merges rounds its inputs once more than the direct merge; a rounded lse of size
  // `span` moves a weight by span * eps relative. Values are within about 4 in magnitude.
  const double tol = 8 * eps_of(t) * 4.0 * (1 + span), lse_tol = 8 * eps_of(lse_dtype(t)) * span;
  EXPECT_LE(fa_test::max_abs_diff(all_out, rev_out), tol);
  EXPECT_LE(fa_test::max_abs_diff(all_out, nested.out.values()), tol);
  EXPECT_LE(fa_test::max_abs_diff(all_lse, rev_lse), lse_tol);
  EXPECT_LE(fa_test::max_abs_diff(all_lse, nested.out_lse.values()), lse_tol);
}

// A part with lse = -inf is an empty key set: it weighs 0 whatever its o holds (here NaN), and the
// result equals the merge without it. If every part is empty: out = 0, lse = -inf, never NaN.
TEST_P(MergeDtype, EmptyPartsWeighNothing) {
  const DType t = GetParam();
  const int64_t d = 16;
  Parts with(t, 3, 2, 1, d), without(t, 2, 2, 1, d);
  std::vector<double> a(d), b(d), nan(d, std::numeric_limits<double>::quiet_NaN());
  for (int64_t x = 0; x < d; ++x) a[size_t(x)] = 0.5 + x, b[size_t(x)] = -1.0 + 0.25 * x;
  with.set_part(0, 0, 1.0, a);
  with.set_part(1, 0, -kInf, nan);
  with.set_part(2, 0, 2.5, b);
  without.set_part(0, 0, 1.0, a);
  without.set_part(1, 0, 2.5, b);
  for (int64_t part = 0; part < 3; ++part) with.set_part(part, 1, -kInf, nan);
  without.set_part(0, 1, -kInf, nan);
  without.set_part(1, 1, -kInf, nan);
  with.merge();
  without.merge();
  for (int64_t x = 0; x < d; ++x) {
    EXPECT_EQ(with.out.get(x), without.out.get(x));
    EXPECT_EQ(with.out.get(d + x), 0.0);
    EXPECT_EQ(without.out.get(d + x), 0.0);
  }
  EXPECT_EQ(with.out_lse.get(0), without.out_lse.get(0));
  EXPECT_EQ(with.out_lse.get(1), -kInf);
  EXPECT_EQ(without.out_lse.get(1), -kInf);
}

// Split-KV for real: attention over all keys equals the merge of attention over key chunks (of
// uneven sizes), each computed by the reference on a slice of the keys. Many rows, several threads.
TEST_P(MergeDtype, KeyChunksMergeToFullAttention) {
  const DType t = GetParam();
  const int64_t sq = 45, sk = 150, hq = 4, hkv = 2, d = 32;
  const std::vector<int64_t> cuts = {0, 17, 64, 65, 150};  // a one-key chunk included
  std::mt19937 rng(11);
  HostTensor q(t, {1, sq, hq, d}), k(t, {1, sk, hkv, d}), v(t, {1, sk, hkv, d});
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  flashattn::AttnOptions opts;
  opts.softcap = 3.f;
  auto forward = [&](const flashattn::TensorView& kk, const flashattn::TensorView& vv, reference::Precision prec) {
    HostTensor out(t, {1, sq, hq, d}), lse(lse_dtype(t), {1, hq, sq});
    flashattn::ForwardArgs a;
    a.q = q.view, a.k = kk, a.v = vv, a.out = out.view, a.lse = lse.view, a.options = opts;
    return reference::forward(a, prec);
  };
  const int64_t n = int64_t(cuts.size()) - 1;
  Parts p(t, n, sq, hq, d);
  for (int64_t c = 0; c < n; ++c) {
    const int64_t k0 = cuts[size_t(c)], keys = cuts[size_t(c) + 1] - k0;
    flashattn::TensorView ks = k.view, vs = v.view;  // a slice: same strides, fewer keys
    ks.shape[1] = vs.shape[1] = keys;
    ks.data = static_cast<unsigned char*>(k.view.data) + k0 * k.view.stride[1] * flashattn::dtype_size(t);
    vs.data = static_cast<unsigned char*>(v.view.data) + k0 * v.view.stride[1] * flashattn::dtype_size(t);
    reference::Output part = forward(ks, vs, reference::Precision::f64);
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t h = 0; h < hq; ++h) {
        std::vector<double> o(part.out.begin() + (i * hq + h) * d, part.out.begin() + (i * hq + h + 1) * d);
        p.set_part(c, i * hq + h, part.lse[size_t(h * sq + i)], o);
      }
  }
  p.merge(2);
  reference::Output full = forward(k.view, v.view, reference::Precision::f64);
  reference::Output plain = forward(k.view, v.view, reference::Precision::same_as_input);
  EXPECT_TRUE(fa_test::within_rule(p.out.values(), full.out, plain.out, t, 2.0, "out"));
  std::vector<double> lse_full(size_t(sq * hq));  // [heads, tokens] -> [tokens, heads]
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t h = 0; h < hq; ++h) lse_full[size_t(i * hq + h)] = full.lse[size_t(h * sq + i)];
  EXPECT_LE(fa_test::max_abs_diff(p.out_lse.values(), lse_full), 8 * eps_of(lse_dtype(t)) * 10);
}

INSTANTIATE_TEST_SUITE_P(Cpu, MergeDtype, ::testing::Values(DType::f16, DType::bf16, DType::f32, DType::f64),
                         [](const auto& info) { return std::string(flashattn::dtype_name(info.param)); });

// Thread count never changes the result: every (token, head) row is merged by one task.
TEST(Merge, SameBitsForAnyThreadCount) {
  const int64_t n = 3, tokens = 300, heads = 2, d = 24;
  Parts p(DType::f32, n, tokens, heads, d);
  std::mt19937 rng(5);
  p.o.fill_normal(rng);
  p.lse.fill_uniform(rng, -5.0, 5.0);
  p.merge(1);
  const std::vector<unsigned char> one = p.out.storage;
  p.merge(2);
  EXPECT_TRUE(one == p.out.storage);
}

// Merging no parts at all is merging empty sets: out = 0 and lse = -inf, and the part tensors,
// being empty, may have null data (found by tests/fuzz: the row's lse pointer was formed from it).
TEST(Merge, NoPartsGiveZeroAndMinusInfinity) {
  std::vector<float> out(2 * 3 * 8, std::numeric_limits<float>::quiet_NaN()), lse(2 * 3, 0.f);
  flashattn::MergeArgs a;
  a.o_parts = flashattn::TensorView::contiguous(nullptr, flashattn::DType::f32, {0, 2, 3, 8});
  a.lse_parts = flashattn::TensorView::contiguous(nullptr, flashattn::DType::f32, {0, 2, 3});
  // Strides of tensors with no elements address nothing, so any are accepted; none may reach an
  // offset computation (a row's base offset would overflow with these).
  a.o_parts.stride[1] = a.lse_parts.stride[1] = std::numeric_limits<int64_t>::max() / 2;
  a.out = flashattn::TensorView::contiguous(out.data(), flashattn::DType::f32, {2, 3, 8});
  a.lse = flashattn::TensorView::contiguous(lse.data(), flashattn::DType::f32, {2, 3});
  flashattn::merge_states(a);
  for (float x : out) EXPECT_EQ(x, 0.f);
  for (float x : lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

}  // namespace

