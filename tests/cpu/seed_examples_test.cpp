// The seed lesson's worked examples, run through the real code: the shared online-softmax state
// (src/core/softmax_state.h) step by step, and the public forward and merge_states end to end.
//
// Worked example: scores x = (ln 2, 0, ln 8, ln 4) (so e^x = 2, 1, 8, 4), values v = (1, 2, 3, 4).
// Processed in two blocks of two: after block 1, l = 1.5 and o~ = 2; after block 2 (rescale 1/4),
// l = 1.875 and o~ = 5.5; output 5.5 / 1.875 = 44/15, logsumexp ln 15.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/softmax_state.h"
#include "flashattn/flashattn.hpp"
#include "test_util.h"

namespace {

using fa_test::HostTensor;
using flashattn::DType;
using flashattn::core::kLog2e;
using flashattn::core::SoftmaxState;

const double kLn2 = std::log(2.0), kLn4 = std::log(4.0), kLn8 = std::log(8.0);

// Online softmax of one row with a running o~, as the engines do it: scores arrive in natural units
// and enter the state in the exp2 domain (multiplied by log2 e).
struct Row {
  SoftmaxState<double> st;
  double o = 0;  // o~, kept relative to the running max

  void block(const std::vector<double>& scores, const std::vector<double>& values) {
    double block_max = -std::numeric_limits<double>::infinity();
    for (double s : scores) block_max = std::max(block_max, s * kLog2e);
    double f = st.update_max(block_max);
    o *= f;
    for (size_t j = 0; j < scores.size(); ++j) {
      double p = std::exp2(scores[j] * kLog2e - st.base());
      st.l += p;
      o += p * values[j];
    }
  }
};

TEST(SeedExamples, OnlineSoftmaxTwoBlocksOfTwo) {
  Row r;
  r.block({kLn2, 0.0}, {1, 2});
  EXPECT_NEAR(r.st.m / kLog2e, kLn2, 1e-15);  // m1 = ln 2
  EXPECT_NEAR(r.st.l, 1.5, 1e-15);
  EXPECT_NEAR(r.o, 2.0, 1e-15);

  Row before = r;
  r.block({kLn8, kLn4}, {3, 4});
  EXPECT_NEAR(r.st.m / kLog2e, kLn8, 1e-14);
  EXPECT_NEAR(flashattn::core::rescale_factor(before.st.m, r.st.m), 0.25, 1e-15);
  EXPECT_NEAR(r.st.l, 1.875, 1e-14);
  EXPECT_NEAR(r.o, 5.5, 1e-14);
  EXPECT_NEAR(r.o * r.st.out_scale(), 44.0 / 15.0, 1e-14);
  EXPECT_NEAR(r.st.lse(), std::log(15.0), 1e-14);
}

TEST(SeedExamples, CheckYourselfOneMoreBlock) {
  // State m = 3, l = 2, o~ = 5, then block scores (5, 3) with values (1, 0).
  Row r;
  r.st.m = 3 * kLog2e;
  r.st.l = 2;
  r.o = 5;
  r.block({5, 3}, {1, 0});
  const double e2 = std::exp(-2.0);
  EXPECT_NEAR(r.st.m / kLog2e, 5.0, 1e-14);
  EXPECT_NEAR(r.st.l, 1 + 3 * e2, 1e-14);  // ~1.406
  EXPECT_NEAR(r.o, 1 + 5 * e2, 1e-14);     // ~1.677
  EXPECT_NEAR(r.o / r.st.l, 1.193, 5e-4);
  EXPECT_NEAR(r.o / r.st.l, (1 + 5 * e2) / (1 + 3 * e2), 1e-14);
}

TEST(SeedExamples, EmptyStateFinalizesToZeroAndMinusInf) {
  SoftmaxState<double> st;
  EXPECT_EQ(st.out_scale(), 0.0);
  EXPECT_EQ(st.lse(), -std::numeric_limits<double>::infinity());
  // A fully masked block (max -inf) leaves the empty state empty, never NaN.
  EXPECT_EQ(st.update_max(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(st.base(), 0.0);
}

// q = e_0, k_j = x_j e_0, v_j = v_j e_0 with softmax_scale 1: the scores are exactly x, and every
// output component but the first is a weighted sum of zeros.
void forward_worked_example(DType dtype, double tol) {
  const int64_t d = 32;
  const double scores[4] = {kLn2, 0.0, kLn8, kLn4};
  const double values[4] = {1, 2, 3, 4};
  HostTensor q(dtype, {1, 1, 1, d}), k(dtype, {1, 4, 1, d}), v(dtype, {1, 4, 1, d});
  HostTensor out(dtype, {1, 1, 1, d});
  HostTensor lse(dtype == DType::f64 ? DType::f64 : DType::f32, {1, 1, 1});
  for (int64_t x = 0; x < d; ++x) q.set(x, x == 0 ? 1.0 : 0.0);
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t x = 0; x < d; ++x) {
      k.set(j * d + x, x == 0 ? scores[j] : 0.0);
      v.set(j * d + x, x == 0 ? values[j] : 0.0);
    }
  out.poison();
  lse.poison();
  flashattn::ForwardArgs a;
  a.q = q.view;
  a.k = k.view;
  a.v = v.view;
  a.out = out.view;
  a.lse = lse.view;
  a.options.softmax_scale = 1.f;
  flashattn::forward(a);
  EXPECT_NEAR(out.get(0), 44.0 / 15.0, tol);
  for (int64_t x = 1; x < d; ++x) EXPECT_EQ(out.get(x), 0.0) << "component " << x;
  EXPECT_NEAR(lse.get(0), std::log(15.0), tol);
}

TEST(SeedExamples, ForwardF64) { forward_worked_example(DType::f64, 1e-12); }
TEST(SeedExamples, ForwardF32) { forward_worked_example(DType::f32, 4e-6); }

// Merge (o_A, lse_A) = (1, ln 2) with (o_B, lse_B) = (4, ln 6): lse = ln 8, weights 2/8 and 6/8,
// o = 3.25. A third, empty part (lse = -inf) weighs nothing.
void merge_worked_example(DType dtype, double tol) {
  const int64_t d = 32;
  const DType lse_t = dtype == DType::f64 ? DType::f64 : DType::f32;
  const double inf = std::numeric_limits<double>::infinity();
  HostTensor o_parts(dtype, {3, 1, 1, d}), lse_parts(lse_t, {3, 1, 1});
  HostTensor out(dtype, {1, 1, d}), lse(lse_t, {1, 1});
  for (int64_t x = 0; x < d; ++x) {
    o_parts.set(x, 1.0);
    o_parts.set(d + x, 4.0);
    o_parts.set(2 * d + x, 0.0);
  }
  lse_parts.set(0, std::log(2.0));
  lse_parts.set(1, std::log(6.0));
  lse_parts.set(2, -inf);
  out.poison();
  lse.poison();
  flashattn::MergeArgs a;
  a.o_parts = o_parts.view;
  a.lse_parts = lse_parts.view;
  a.out = out.view;
  a.lse = lse.view;
  flashattn::merge_states(a);
  for (int64_t x = 0; x < d; ++x) EXPECT_NEAR(out.get(x), 3.25, tol) << "component " << x;
  EXPECT_NEAR(lse.get(0), std::log(8.0), tol);

  // Every part empty: out = 0 and lse = -inf, never NaN.
  for (int64_t p = 0; p < 3; ++p) lse_parts.set(p, -inf);
  out.poison();
  lse.poison();
  flashattn::merge_states(a);
  for (int64_t x = 0; x < d; ++x) EXPECT_EQ(out.get(x), 0.0) << "component " << x;
  EXPECT_EQ(lse.get(0), -inf);
}

TEST(SeedExamples, MergeF64) { merge_worked_example(DType::f64, 1e-12); }
TEST(SeedExamples, MergeF32) { merge_worked_example(DType::f32, 4e-6); }

TEST(SeedExamples, MergeStateDirectly) {
  flashattn::core::MergeState<double> m;
  const double lse[2] = {std::log(2.0), std::log(6.0)}, o[2] = {1, 4};
  for (double l : lse) m.see(l);
  double acc = 0;
  for (int i = 0; i < 2; ++i) acc += m.add_weight(lse[i]) * o[i];
  EXPECT_NEAR(acc * m.out_scale(), 3.25, 1e-15);
  EXPECT_NEAR(m.lse(), std::log(8.0), 1e-15);
}

}  // namespace
