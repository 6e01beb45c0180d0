// The float kernels' 16-bit conversions (TileKernels::widen and narrow), which load the backward's
// tiles and store its gradients, against the scalar conversions of core/numeric.h, at every SIMD
// level this CPU has: the same bits for every value but NaN payloads. And their transposition
// (TileKernels::transpose), which turns query tiles and outputs between rows and columns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cpu/simd.h"

namespace {

using flashattn::DType;
using flashattn::cpu::KernelLevel;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Values where rounding has edges: ties to even either way (in both formats), fp16 subnormals and
// the values that round into and out of them, the largest fp16 and the first that rounds to inf,
// zeros, infinities, NaN, then random values over many binades. 8 * 51 of them: the vector loops
// see full vectors and an 8-value tail.
std::vector<float> edge_values() {
  std::vector<float> v = {0.f, -0.f, 1.f, -1.f, 65504.f, 65519.f, 65520.f, -65520.f, 1e30f, -1e-30f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), std::ldexp(1.f, -24), std::ldexp(1.f, -25),
                          std::ldexp(3.f, -26), std::ldexp(1.f, -14), std::ldexp(1023.f, -24),
                          std::ldexp(2047.f, -25), std::ldexp(1.f, -126), std::ldexp(1.f, -140)};
  for (uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0x1000u, 0x0fffu, 0x1001u, 0x3000u})
    for (uint32_t high : {0x3f80u, 0x3f81u, 0xbf81u, 0x4700u, 0x0001u})
      v.push_back(from_bits((high << 16) | low));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(-2.f, 2.f);
  std::uniform_int_distribution<int> expo(-30, 18);
  while (v.size() < 8 * 51) v.push_back(std::ldexp(mant(rng), expo(rng)));
  return v;
}

class Conversion : public ::testing::TestWithParam<KernelLevel> {
 protected:
  void SetUp() override {
    if (int(GetParam()) > int(flashattn::cpu::detected_level())) GTEST_SKIP() << "this CPU lacks the level";
    setenv("FLASHATTN_CPU_KERNEL", flashattn::cpu::level_name(GetParam()), 1);
  }
  void TearDown() override { unsetenv("FLASHATTN_CPU_KERNEL"); }
};

TEST_P(Conversion, NarrowRoundsAsTheScalarConversions) {
  const auto& kern = flashattn::cpu::float_kernels();
  const std::vector<float> x = edge_values();
  for (float mul : {1.f, 0.125f, 3.f})
    for (DType t : {DType::f16, DType::bf16}) {
      std::vector<uint16_t> got(x.size() + 8, 0xabcd);
      kern.narrow(x.data(), mul, t, got.data(), int64_t(x.size()));
      for (size_t i = 0; i < x.size(); ++i) {
        const float v = x[i] * mul;
        const uint16_t want = t == DType::f16 ? flashattn::core::to_half(v).bits : flashattn::core::to_bf16(v).bits;
        SCOPED_TRACE(std::string(flashattn::dtype_name(t)) + " value " + std::to_string(v));
        if (std::isnan(v)) {
          const float back = t == DType::f16 ? flashattn::core::to_float(flashattn::core::half_t{got[i]})
                                             : flashattn::core::to_float(flashattn::core::bfloat16_t{got[i]});
          EXPECT_TRUE(std::isnan(back));
        } else {
          EXPECT_EQ(got[i], want);
        }
      }
      for (size_t i = x.size(); i < got.size(); ++i) EXPECT_EQ(got[i], 0xabcd) << "written past n";
    }
}

TEST_P(Conversion, WidenIsExact) {
  const auto& kern = flashattn::cpu::float_kernels();
  std::vector<uint16_t> bits(8 * 41);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = uint16_t(i * 211 + 7);  // every exponent, both signs
  for (DType t : {DType::f16, DType::bf16}) {
    std::vector<float> got(bits.size());
    kern.widen(bits.data(), t, got.data(), int64_t(bits.size()));
    for (size_t i = 0; i < bits.size(); ++i) {
      const float want = t == DType::f16 ? flashattn::core::to_float(flashattn::core::half_t{bits[i]})
                                         : flashattn::core::to_float(flashattn::core::bfloat16_t{bits[i]});
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(got[i]));
      else EXPECT_EQ(got[i], want) << flashattn::dtype_name(t) << " bits " << bits[i];
    }
  }
}

// Every element lands where it belongs and nothing else is written: whole blocks, edges of every
// width, single rows and columns, strides wider than the rows.
template <class T>
void expect_transposes(const flashattn::cpu::TileKernels<T>& kern) {
  const int64_t shapes[][2] = {{16, 16}, {8, 8}, {64, 40}, {37, 23}, {256, 16}, {16, 3}, {1, 17}, {19, 1}, {48, 200}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], cols = shape[1], lds = cols + 5, ldd = rows + 3;
    std::vector<T> src(size_t(rows * lds)), dst(size_t(cols * ldd), T(-1));
    for (size_t i = 0; i < src.size(); ++i) src[i] = T(i);
    kern.transpose(src.data(), lds, dst.data(), ldd, rows, cols);
    int64_t wrong = 0;
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < ldd; ++r)
        wrong += dst[size_t(c * ldd + r)] != (r < rows ? src[size_t(r * lds + c)] : T(-1));
    EXPECT_EQ(wrong, 0) << rows << " x " << cols;
  }
}

TEST_P(Conversion, TransposeMovesEveryElement) { expect_transposes(flashattn::cpu::float_kernels()); }

TEST(Transpose, DoubleKernelsMoveEveryElement) { expect_transposes(flashattn::cpu::double_kernels()); }

INSTANTIATE_TEST_SUITE_P(Levels, Conversion,
                         ::testing::Values(KernelLevel::portable, KernelLevel::avx2, KernelLevel::avx512),
                         [](const auto& info) { return std::string(flashattn::cpu::level_name(info.param)); });

}  // namespace
