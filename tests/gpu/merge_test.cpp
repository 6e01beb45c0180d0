// merge_states on the GPU (the kernel the decode combine uses): the seed's worked examples, empty
// parts (lse = -inf, o NaN) weigh nothing, all parts empty give 0 and -inf, merging is associative,
// and the result agrees with the CPU merge on random strided inputs of several head dims.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.h"

namespace fa_test {
namespace {

using flashattn::DType;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Relative rounding of one element of dtype t (half an ulp at 1).
double eps_of(DType t) {
  switch (t) {
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

// Partial states [parts, tokens, heads, d] and their lse, merged into out [tokens, heads, d] on the
// GPU (or on the CPU, for comparison).
struct Parts {
  int64_t parts, tokens, heads, d;
  HostTensor o, lse, out, out_lse;

  Parts(DType t, int64_t parts_, int64_t tokens_, int64_t heads_, int64_t d_, int64_t pad = 0)
      : parts(parts_), tokens(tokens_), heads(heads_), d(d_),
        o(t, {parts_, tokens_, heads_, d_}, pad), lse(DType::f32, {parts_, tokens_, heads_}, pad),
        out(t, {tokens_, heads_, d_}, pad), out_lse(DType::f32, {tokens_, heads_}, pad) {}

  void set_part(int64_t part, int64_t row, double lse_value, const std::vector<double>& values) {
    lse.set(part * tokens * heads + row, lse_value);
    for (int64_t x = 0; x < d; ++x) o.set((part * tokens * heads + row) * d + x, values[size_t(x)]);
  }

  void merge_gpu() {
    DeviceTensor d_o(o), d_lse(lse), d_out(out), d_out_lse(out_lse);
    d_out.poison();
    d_out_lse.poison();
    flashattn::MergeArgs a;
    a.o_parts = d_o.view;
    a.lse_parts = d_lse.view;
    a.out = d_out.view;
    a.lse = d_out_lse.view;
    flashattn::merge_states(a);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    d_out.copy_to(out);
    d_out_lse.copy_to(out_lse);
  }

  void merge_cpu() {
    out.poison();
    out_lse.poison();
    flashattn::MergeArgs a;
    a.o_parts = o.view;
    a.lse_parts = lse.view;
    a.out = out.view;
    a.lse = out_lse.view;
    flashattn::merge_states(a);
  }
};

class GpuMerge : public GpuTest, public ::testing::WithParamInterface<DType> {};

// Seed example (b): (4/3, ln 3) with (10/3, ln 12) gives 44/15 and ln 15 (weights 0.2 and 0.8, not
// the plain average); "Check yourself" 2: (1, ln 2) with (4, ln 6) gives 3.25 and ln 8.
TEST_P(GpuMerge, SeedWorkedExamples) {
  const DType t = GetParam();
  const int64_t d = 8;
  Parts p(t, 2, 2, 1, d);
  p.set_part(0, 0, std::log(3.0), std::vector<double>(d, 4.0 / 3.0));
  p.set_part(1, 0, std::log(12.0), std::vector<double>(d, 10.0 / 3.0));
  p.set_part(0, 1, std::log(2.0), std::vector<double>(d, 1.0));
  p.set_part(1, 1, std::log(6.0), std::vector<double>(d, 4.0));
  p.merge_gpu();
  // Inputs are rounded to t; the result may carry that rounding twice plus the output's own.
  const double tol = 4 * eps_of(t) * 4.0, lse_tol = 4 * eps_of(DType::f32) * 3.0;
  for (int64_t x = 0; x < d; ++x) {
    EXPECT_NEAR(p.out.get(x), 44.0 / 15.0, tol);
    EXPECT_NEAR(p.out.get(d + x), 3.25, tol);
  }
  EXPECT_NEAR(p.out_lse.get(0), std::log(15.0), lse_tol);
  EXPECT_NEAR(p.out_lse.get(1), std::log(8.0), lse_tol);
}

// A part with lse = -inf is an empty key set: it weighs 0 whatever its o holds (here NaN), and the
// result equals the merge without it. If every part is empty, or there are none: out = 0, lse = -inf.
TEST_P(GpuMerge, EmptyPartsWeighNothing) {
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
  with.merge_gpu();
  without.merge_gpu();
  for (int64_t x = 0; x < d; ++x) {
    EXPECT_EQ(with.out.get(x), without.out.get(x));
    EXPECT_EQ(with.out.get(d + x), 0.0);
    EXPECT_EQ(without.out.get(d + x), 0.0);
  }
  EXPECT_EQ(with.out_lse.get(0), without.out_lse.get(0));
  EXPECT_EQ(with.out_lse.get(1), -kInf);
  EXPECT_EQ(without.out_lse.get(1), -kInf);

  Parts none(t, 0, 3, 2, d);  // no parts at all: every row is empty
  none.merge_gpu();
  for (double x : none.out.values()) EXPECT_EQ(x, 0.0);
  for (double x : none.out_lse.values()) EXPECT_EQ(x, -kInf);

  Parts no_tokens(t, 2, 0, 2, d);  // no rows: nothing to write (was a launch of zero blocks)
  no_tokens.merge_gpu();
}

// Merging is associative: all parts at once, in reverse order, or as a merge of two merges agree
// within rounding. lse values lie far apart (the stable weights must not overflow).
TEST_P(GpuMerge, AnyOrderAndGrouping) {
  const DType t = GetParam();
  const int64_t n = 5, tokens = 37, heads = 3, d = 40;
  std::mt19937 rng(3);
  std::normal_distribution<double> val(0.0, 1.0);
  const double span = 20;  // lse in [-span, span]: weights down to e^-40
  std::uniform_real_distribution<double> lse_val(-span, span);
  const int64_t rows = tokens * heads;
  std::vector<std::vector<double>> o(size_t(n * rows), std::vector<double>(d));
  std::vector<double> l(size_t(n * rows));
  for (size_t i = 0; i < o.size(); ++i) {
    for (double& x : o[i]) x = val(rng);
    l[i] = lse_val(rng);
  }
  auto merge_of = [&](const std::vector<int64_t>& which) {
    Parts p(t, int64_t(which.size()), tokens, heads, d, 8);
    for (size_t k = 0; k < which.size(); ++k)
      for (int64_t r = 0; r < rows; ++r) p.set_part(int64_t(k), r, l[size_t(which[k] * rows + r)], o[size_t(which[k] * rows + r)]);
    p.merge_gpu();
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
  nested.merge_gpu();
  // The merge of merges rounds its inputs once more; a rounded lse of size `span` moves a weight by
  // span * eps relative. Values are within about 4 in magnitude.
  const double tol = 8 * eps_of(t) * 4.0 * (1 + span), lse_tol = 8 * eps_of(DType::f32) * span;
  EXPECT_LE(max_abs_diff(all_out, rev_out), tol);
  EXPECT_LE(max_abs_diff(all_out, nested.out.values()), tol);
  EXPECT_LE(max_abs_diff(all_lse, rev_lse), lse_tol);
  EXPECT_LE(max_abs_diff(all_lse, nested.out_lse.values()), lse_tol);
}

// The GPU and CPU merges compute the same weights (core::MergeState) in fp32: they agree within
// one rounding of the output, for head dims below, at and past one 128-column pass, with padded
// strides and some empty parts.
TEST_P(GpuMerge, AgreesWithCpuMerge) {
  const DType t = GetParam();
  uint32_t seed = 40;
  for (int64_t d : {8, 40, 128, 200, 256})
    for (int64_t parts : {1, 3, 17}) {
      SCOPED_TRACE("d " + std::to_string(d) + " parts " + std::to_string(parts));
      std::mt19937 rng(seed++);
      Parts p(t, parts, 11, 4, d, d % 16 == 0 ? 8 : 0);
      p.o.fill_normal(rng);
      p.lse.fill_uniform(rng, -6.0, 6.0);
      for (int64_t i = 0; i < p.lse.numel(); i += 5) p.lse.set(i, -kInf);  // some empty parts
      p.merge_gpu();
      const std::vector<double> gpu_out = p.out.values(), gpu_lse = p.out_lse.values();
      p.merge_cpu();
      double peak = 0;
      for (double x : p.out.values()) peak = std::max(peak, std::fabs(x));
      EXPECT_LE(max_abs_diff(gpu_out, p.out.values()), 2 * eps_of(t) * peak + 1e-6);
      EXPECT_LE(max_abs_diff(gpu_lse, p.out_lse.values()), 1e-5);
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMerge, ::testing::Values(DType::f16, DType::bf16, DType::f32),
                         [](const auto& info) { return std::string(flashattn::dtype_name(info.param)); });

}  // namespace
}  // namespace fa_test
